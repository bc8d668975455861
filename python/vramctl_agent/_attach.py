"""`vramctl reclaim --attach PID`: the agent's `reclaim`, run once in a Python 3.14+ process
that has no agent, through `sys.remote_exec` (PEP 768).

vramctl writes this package (under a private name, so that it never meets an installed
`vramctl_agent`), a bootstrap script and a request file into a directory the process can
read, and asks a helper interpreter of the same version to `sys.remote_exec(PID, script)`.
The process's main thread runs the script at its next safe evaluation point (as it runs a
signal handler): the bootstrap imports this module and calls `run`, which answers what the
agent's `reclaim` would answer, into a result file vramctl waits for with a deadline.

Run on the main thread, `torch.cuda.is_current_stream_capturing()` sees the capture the
main thread may be doing, so `empty_cache` is refused during one as the agent refuses it.
"""

from __future__ import annotations

import json
import os
import time

from . import _ops
from . import _protocol as proto
from ._protocol import ProtocolViolation

# The request's and the result's bound: a reclaim answer stays under the protocol's.
MAX_REQUEST_BYTES = proto.MAX_REQUEST_BYTES


def _answer(request: dict) -> dict:
    run_gc = request.get("gc") is True
    deep = request.get("deep") is True
    dry_run = request.get("dry_run") is True
    if dry_run and (run_gc or deep):
        raise ProtocolViolation(proto.BAD_REQUEST, "'dry_run' changes nothing, so it cannot be combined with 'gc' or 'deep'")
    return _ops._reclaim(run_gc, deep, dry_run)


def run(request_path: str) -> str:
    """Answers the request in `request_path` (JSON: `gc`, `deep`, `dry_run`, `result`, the
    path to write, and `deadline`, Unix seconds) into its `result` file: `{"ok": true,
    "answer": {...}}` or `{"ok": false, "error": {"code", "message", ...}}`, written to a
    temporary name and renamed, so that vramctl never reads half of it. Past the deadline
    (vramctl stopped waiting and told its user nothing happened) it does nothing but say
    so. Returns the result's path."""
    with open(request_path, "rb") as f:
        request = json.loads(f.read(MAX_REQUEST_BYTES))
    result_path = request["result"]
    deadline = request.get("deadline")
    if isinstance(deadline, (int, float)) and time.time() > deadline:
        body = {"ok": False, "error": {"code": "too_late", "message": "the script ran after vramctl stopped waiting; nothing was done"}}
    else:
        try:
            body = {"ok": True, "answer": _answer(request)}
        except ProtocolViolation as err:
            body = {"ok": False, "error": {"code": err.code, "message": err.message, **err.extra}}
        except Exception as err:  # report, never raise into the process's main thread
            body = {"ok": False, "error": {"code": proto.FRAMEWORK_ERROR, "message": f"{type(err).__name__}: {str(err)[:300]}"}}
    body["pid"] = os.getpid()
    tmp = f"{result_path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(body))
    os.replace(tmp, result_path)
    return result_path
