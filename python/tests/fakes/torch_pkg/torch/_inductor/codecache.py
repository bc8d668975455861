"""Stand-in for torch._inductor.codecache, the module real torch's snapshot imports the
first time it symbolizes a Python frame (`PyCodeCache.stack_frames_for_code`). Importing
it here only leaves it in sys.modules, which is what the agent's warm-up is checked by;
FAKE_CODECACHE_IMPORT_S makes the import take that long (the real one takes seconds), with
the module in sys.modules but not yet holding PyCodeCache meanwhile, as a real half-done
import is."""
import os
import time

time.sleep(float(os.environ.get("FAKE_CODECACHE_IMPORT_S", "0")))


class PyCodeCache:
    @staticmethod
    def stack_frames_for_code(filename, line):
        return None
