"""Under `vramctl run` and `vramctl fit` (`VRAMCTL_RUN_REPORT_DIR` in the environment): at
exit, the framework's counters — their peaks included — go to `DIR/<pid>.json`.

The supervisor asks the agent's socket for `stats` while the process runs, but the last
allocations (the step that ran out of memory, the final optimizer step) can come after its
last question; the peak counters are exact only when read after them. So the process says
them itself, on its way out (and, under `vramctl fit`, the allocator's trace:
`_alloc_trace`). Nothing is written on SIGKILL or `os._exit`; the supervisor
then keeps what it last polled.
"""

from __future__ import annotations

import atexit
import json
import logging
import os

ENV = "VRAMCTL_RUN_REPORT_DIR"

log = logging.getLogger("vramctl_agent")
_armed_pid: int | None = None


def arm() -> None:
    """Registers the exit report once per process (called when the agent starts from the
    environment, i.e. once torch, jax or tensorflow has been imported: atexit runs handlers
    last-in first-out, so ours runs before the ones the framework registered on import)."""
    global _armed_pid
    if not os.environ.get(ENV) or _armed_pid == os.getpid():
        return
    _armed_pid = os.getpid()
    atexit.register(_write)


def _write() -> None:
    # A forked child (a DataLoader worker) inherits the registration; its counters are not
    # the job's.
    if _armed_pid != os.getpid():
        return
    directory = os.environ.get(ENV)
    if not directory:
        return
    from . import _ops

    pid = os.getpid()
    final = os.path.join(directory, f"{pid}.json")
    partial = os.path.join(directory, f".{pid}.json.partial")
    try:
        payload = {"pid": pid, **_ops.current_stats()}
        with open(partial, "w", encoding="utf-8") as out:
            json.dump(payload, out)
        os.replace(partial, final)
    except Exception as err:  # never turn a job's exit into a traceback of ours
        log.warning("vramctl agent: could not write the run report %s: %s", final, err)
    try:
        from . import _alloc_trace

        _alloc_trace.write(directory, pid)
    except Exception as err:
        log.warning("vramctl agent: could not write the allocator's trace: %s", err)
