"""The process under test (tests/harness.py): runs each line's `exec` in one namespace and
answers with `eval`'s value, as JSON lines. Exits normally when stdin closes."""

import json
import os
import sys
import traceback

namespace = {"__name__": "workload"}
# Answers go to the original stdout; whatever the code under test prints goes to stderr.
answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def reply(obj):
    answers.write(json.dumps(obj) + "\n")
    answers.flush()


reply({"ready": True, "pid": os.getpid()})
for line in sys.stdin:
    command = json.loads(line)
    try:
        if command.get("exec"):
            # Named like a file, so that recorded allocation stacks point at "workload.py".
            exec(compile(command["exec"], "workload.py", "exec"), namespace)
        value = eval(command["eval"], namespace) if command.get("eval") else None
        reply({"ok": True, "value": value})
    except SystemExit:
        raise
    except BaseException as err:  # noqa: B902 - report everything to the test
        reply({"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
