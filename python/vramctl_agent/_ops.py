"""The requests: validation and the answer to each (docs/agent.md, "Requests")."""

from __future__ import annotations

import base64
import errno
import gc
import json
import math
import os
import platform
import sys
import threading
import time

from . import _frameworks as fw
from . import _ipython, _oom, _torch
from . import _protocol as proto
from ._protocol import ProtocolViolation

AGENT_VERSION = "0.1.0"

# Requests that change the process (free memory, write a file, reset counters) run one at
# a time; a second one meanwhile is answered `busy` rather than queued, so that no client
# waits behind a slow empty_cache it did not ask for. Reads (hello, stats) never wait.
_act_lock = threading.Lock()

# What the agent itself started, for hello/snapshot answers.
_history: dict = {"recording": False, "max_entries": None, "stacks": None}


def reset_after_fork() -> None:
    """In a forked child: a lock held by a parent's thread at the fork stays locked forever."""
    global _act_lock
    _act_lock = threading.Lock()


class Peer:
    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    def may_act(self) -> bool:
        """Only the process's owner or root may make it release memory or write a file."""
        return self.uid in (0, os.geteuid())


# --- request fields --------------------------------------------------------------------


def _bool(request: dict, name: str) -> bool:
    value = request.get(name, False)
    if not isinstance(value, bool):
        raise ProtocolViolation(proto.BAD_REQUEST, f"'{name}' must be true or false, not {_show(value)}")
    return value


def _show(value: object) -> str:
    """The client's value, quoted, for an error message."""
    text = value if isinstance(value, str) else json.dumps(value)
    return f"'{text[:60]}'"


def _start_time_ticks() -> int | None:
    """Field 22 of /proc/self/stat: with the PID, an identity that survives PID reuse."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
        return int(text[text.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def frameworks() -> list[dict]:
    return [f for f in (_torch.info(), fw.jax_info(), fw.tf_info()) if f is not None]


# --- the ops ---------------------------------------------------------------------------


def hello(request: dict, peer: Peer, agent) -> dict:
    return {
        "agent_version": AGENT_VERSION,
        "pid": os.getpid(),
        "uid": os.geteuid(),
        "start_time_ticks": _start_time_ticks(),
        "pid_namespace": _pid_namespace(),
        "python": {
            "version": platform.python_version(),
            "implementation": sys.implementation.name,
            "executable": sys.executable,
        },
        "frameworks": frameworks(),
        "devices": _torch.device_identities(),
        "ipython": _ipython.current_shell() is not None,
        "started_by": agent.started_by,
        "started_at": agent.started_at,
        "socket": agent.path,
        "ops": list(proto.OPS),
        "limits": {
            "max_request_bytes": proto.MAX_REQUEST_BYTES,
            "max_response_bytes": proto.MAX_RESPONSE_BYTES,
            "request_timeout_s": agent.request_timeout_s,
            "max_connections": agent.max_connections,
            "max_history_entries": proto.MAX_HISTORY_ENTRIES,
            "max_oom_snapshot_bytes": proto.MAX_OOM_SNAPSHOT_BYTES,
            "max_oom_chunk_bytes": proto.MAX_OOM_CHUNK_BYTES,
        },
        "history": _history_now(),
    }


def _history_now() -> dict:
    """What the allocator records: `_history` as the `snapshot` op set it, or the OOM
    observer's own recording (`owner: "observer"`), which no request changes."""
    if _oom.records_history():
        return {"recording": True, "max_entries": None, "stacks": "python", "owner": "observer"}
    return dict(_history, owner="request" if _history["recording"] else None)


def current_stats() -> dict:
    """The `stats` answer: every framework's counters per device (also the run report's)."""
    return {
        "taken_at": time.time(),
        "frameworks": frameworks(),
        "devices": _torch.device_stats() + fw.jax_device_stats() + fw.tf_device_stats(),
    }


def stats(request: dict, peer: Peer, agent) -> dict:
    return current_stats()


def _unsupported_reclaim() -> list[dict]:
    out = []
    if fw.imported("jax") is not None:
        out.append({"framework": "jax", "reason": "jax has no call that returns its allocator's pool to the driver"})
    if fw.imported("tensorflow") is not None:
        out.append({"framework": "tensorflow", "reason": "tensorflow has no call that releases its allocator's memory"})
    return out


def _acting(peer: Peer, what: str) -> None:
    if not peer.may_act():
        raise ProtocolViolation(
            proto.PERMISSION_DENIED, f"only the process's owner (uid {os.geteuid()}) or root may {what}"
        )
    if not _act_lock.acquire(blocking=False):
        raise ProtocolViolation(
            proto.BUSY, "another reclaim, snapshot or reset-peak is running in this process; retry", retry_after_s=1.0
        )


def reclaim(request: dict, peer: Peer, agent) -> dict:
    run_gc, deep, dry_run = _bool(request, "gc"), _bool(request, "deep"), _bool(request, "dry_run")
    if dry_run and (run_gc or deep):
        raise ProtocolViolation(proto.BAD_REQUEST, "'dry_run' changes nothing, so it cannot be combined with 'gc' or 'deep'")
    _acting(peer, "release memory")
    try:
        return _reclaim(run_gc, deep, dry_run)
    finally:
        _act_lock.release()


def _reclaim(run_gc: bool, deep: bool, dry_run: bool) -> dict:
    started = time.monotonic()
    response: dict = {"dry_run": dry_run, "deep": None, "gc": None}
    if deep:
        response["deep"] = _ipython.deep_clean()
    if run_gc or deep:
        # Frames cleared by `deep` free most tensors at once; cycles (an exception that
        # refers to its own traceback, a model graph) need the collector.
        gc_started = time.monotonic()
        collected = gc.collect()
        response["gc"] = {"collected": collected, "duration_s": round(time.monotonic() - gc_started, 6)}
    response["unsupported"] = _unsupported_reclaim()
    if not _torch.cuda_initialized():
        response.update(
            devices=[],
            released_bytes=0,
            cached_before_bytes=0,
            cached_after_bytes=0,
            pinned_bytes=0,
            empty_cache_s=None,
            outcome="no_gpu_allocator",
        )
        response["elapsed_s"] = round(time.monotonic() - started, 6)
        return response
    try:
        result = _torch.reclaim(dry_run)
    except _torch.Capturing as err:
        raise ProtocolViolation(
            proto.CAPTURING,
            f"{err}; empty_cache now would invalidate the capture, retry when it ends",
            retry_after_s=1.0,
        )
    except Exception as err:
        raise ProtocolViolation(proto.FRAMEWORK_ERROR, f"torch: {str(err)[:300]}")
    devices = result["devices"]
    released = sum(d["released_bytes"] for d in devices)
    cached_before = sum(d["cached_before_bytes"] for d in devices)
    cached_after = sum(d["cached_after_bytes"] for d in devices)
    if cached_before == 0 and released == 0:
        outcome = "nothing_cached"
    elif released == 0:
        outcome = "nothing_released"
    elif cached_after > 0:
        outcome = "released_some"
    else:
        outcome = "released_all"
    response.update(
        devices=devices,
        released_bytes=released,
        cached_before_bytes=cached_before,
        cached_after_bytes=cached_after,
        pinned_bytes=sum(d["pinned_bytes"] for d in devices),
        empty_cache_s=result["empty_cache_s"],
        outcome=outcome,
    )
    response["elapsed_s"] = round(time.monotonic() - started, 6)
    return response


def _snapshot_path(request: dict) -> str | None:
    path = request.get("path")
    if path is None:
        return None
    if not isinstance(path, str) or not path:
        raise ProtocolViolation(proto.BAD_REQUEST, f"'path' must be a non-empty string, not {_show(path)}")
    if "\0" in path or len(os.fsencode(path)) > 4096:
        raise ProtocolViolation(proto.BAD_REQUEST, "'path' must be at most 4096 bytes without NUL")
    if not os.path.isabs(path):
        # The agent's working directory is not the client's.
        raise ProtocolViolation(proto.BAD_REQUEST, f"'path' must be absolute, not '{path}'")
    return path


def snapshot(request: dict, peer: Peer, agent) -> dict:
    path = _snapshot_path(request)
    overwrite = _bool(request, "overwrite")
    record = request.get("record")
    if record not in (None, "start", "stop"):
        raise ProtocolViolation(proto.BAD_REQUEST, f"'record' must be \"start\" or \"stop\", not {_show(record)}")
    max_entries = request.get("max_entries", proto.DEFAULT_HISTORY_ENTRIES)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or not 1 <= max_entries <= proto.MAX_HISTORY_ENTRIES:
        raise ProtocolViolation(
            proto.BAD_REQUEST, f"'max_entries' must be an integer from 1 to {proto.MAX_HISTORY_ENTRIES}, not {_show(max_entries)}"
        )
    stacks = request.get("stacks", "python")
    if stacks not in ("python", "all"):
        raise ProtocolViolation(proto.BAD_REQUEST, f"'stacks' must be \"python\" or \"all\", not {_show(stacks)}")
    if path is None and record is None:
        raise ProtocolViolation(proto.BAD_REQUEST, "'snapshot' needs 'path' (write one) or 'record' (\"start\" or \"stop\")")
    _acting(peer, "write a snapshot or change what the allocator records")
    try:
        if fw.imported("torch") is None:
            raise ProtocolViolation(proto.NO_FRAMEWORK, "torch is not imported in this process: no allocator to snapshot")
        if not _torch.cuda_initialized():
            raise ProtocolViolation(proto.NO_FRAMEWORK, "torch has not initialized CUDA in this process: nothing allocated yet")
        response: dict = {"written": None}
        if path is not None:
            try:
                response["written"] = _torch.write_snapshot(path, overwrite)
            except FileExistsError:
                raise ProtocolViolation(proto.IO_ERROR, f"'{path}' exists; ask with 'overwrite': true to replace it", errno="EEXIST")
            except OSError as err:
                name = errno.errorcode.get(err.errno or 0, "EIO")
                raise ProtocolViolation(proto.IO_ERROR, f"cannot write '{path}': {err.strerror}", errno=name)
            except Exception as err:
                raise ProtocolViolation(proto.FRAMEWORK_ERROR, f"torch: {str(err)[:300]}")
        try:
            # The observer's recording is left as it is: a start would reset its settings,
            # a stop would end the history its OOM verdict needs.
            if record == "start" and not _oom.records_history():
                _torch.start_history(max_entries, stacks)
                _history.update(recording=True, max_entries=max_entries, stacks=stacks)
            elif record == "stop" and not _oom.records_history():
                _torch.stop_history()
                _history.update(recording=False, max_entries=None, stacks=None)
        except Exception as err:
            raise ProtocolViolation(proto.FRAMEWORK_ERROR, f"torch: _record_memory_history failed: {str(err)[:300]}")
        response["history"] = _history_now()
        return response
    finally:
        _act_lock.release()


def reset_peak(request: dict, peer: Peer, agent) -> dict:
    _acting(peer, "reset its peak counters")
    try:
        devices = _torch.reset_peak() + fw.tf_reset_peak()
    finally:
        _act_lock.release()
    unsupported = []
    if fw.imported("jax") is not None:
        unsupported.append({"framework": "jax", "reason": "jax has no call that resets its peak counter"})
    return {"devices": devices, "unsupported": unsupported}


def oom(request: dict, peer: Peer, agent) -> dict:
    """The first CUDA OOM of this process (`_oom.py`): its record, and with `offset` a
    chunk of its snapshot's bytes (base64), so that a client never opens a path an agent
    names."""
    response = {"observer_attached": _oom.attached(), "oom": _oom.record()}
    offset = request.get("offset")
    if offset is None:
        return response
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ProtocolViolation(proto.BAD_REQUEST, f"'offset' must be a non-negative integer, not {_show(offset)}")
    max_bytes = request.get("max_bytes", proto.MAX_OOM_CHUNK_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or not 1 <= max_bytes <= proto.MAX_OOM_CHUNK_BYTES:
        raise ProtocolViolation(
            proto.BAD_REQUEST, f"'max_bytes' must be an integer from 1 to {proto.MAX_OOM_CHUNK_BYTES}, not {_show(max_bytes)}"
        )
    try:
        data, size = _oom.read_snapshot(offset, max_bytes)
    except OSError as err:
        raise ProtocolViolation(proto.IO_ERROR, f"the OOM snapshot cannot be read: {err.strerror or err}")
    response["chunk"] = {
        "offset": offset,
        "size_bytes": size,
        "data_base64": base64.b64encode(data).decode("ascii"),
        "eof": offset + len(data) >= size,
    }
    return response


HANDLERS = {"hello": hello, "stats": stats, "reclaim": reclaim, "snapshot": snapshot, "reset-peak": reset_peak, "oom": oom}


def answer(request: object, peer: Peer, agent) -> dict:
    """The response to one decoded request line (errors included)."""
    if not isinstance(request, dict):
        return proto.error_response(proto.BAD_REQUEST, f"a request is a JSON object, not {type(request).__name__}")
    request_id = request.get("id")
    op = request.get("op")
    if isinstance(request_id, float) and not math.isfinite(request_id):
        # A number beyond a double's range (1e400, -1e400) parses as infinity, which no JSON
        # answer can carry; echoing the digits would give clients that parse numbers as
        # doubles (serde_json) a line they cannot read. The answer says so with `"id": null`,
        # as docs/agent.md promises, rather than dying on the way out and never answering.
        response = proto.error_response(
            proto.BAD_REQUEST,
            "'id' is a number beyond the range of a double and cannot be echoed; use a string or a smaller number",
            op if isinstance(op, str) else None,
        )
        response["id"] = None
        return response
    if request_id is not None and (not isinstance(request_id, (str, int, float, bool)) or len(str(request_id)) > 256):
        return proto.error_response(proto.BAD_REQUEST, "'id' must be a string or number of at most 256 characters")
    version = request.get("protocol", proto.PROTOCOL)
    if isinstance(version, bool) or not isinstance(version, int):
        return proto.error_response(proto.BAD_REQUEST, f"'protocol' must be an integer, not {_show(version)}", op, request_id)
    if version > proto.PROTOCOL or version < 1:
        return proto.error_response(
            proto.UNSUPPORTED_PROTOCOL,
            f"this agent speaks protocol {proto.PROTOCOL}, not {version}",
            op,
            request_id,
            supported=[proto.PROTOCOL],
        )
    if not isinstance(op, str):
        return proto.error_response(proto.BAD_REQUEST, "a request needs 'op', a string", None, request_id)
    handler = HANDLERS.get(op)
    if handler is None:
        return proto.error_response(
            proto.UNKNOWN_OP, f"unknown op '{op[:60]}'; this agent knows {', '.join(proto.OPS)}", op, request_id, ops=list(proto.OPS)
        )
    try:
        body = handler(request, peer, agent)
    except ProtocolViolation as err:
        return proto.error_response(err.code, err.message, op, request_id, **err.extra)
    response = {"protocol": proto.PROTOCOL, "ok": True, "op": op}
    if request_id is not None:
        response["id"] = request_id
    response.update(body)
    return response
