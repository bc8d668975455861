"""PyTorch's out-of-memory observer: at the process's first CUDA OOM, keep an allocator
snapshot and the allocator's settings and limits, for `vramctl run` (and any client of the
`oom` op) to explain the OOM with (docs/agent.md, "Out-of-memory errors").

What it costs before an OOM: nothing on the GPU and nothing per step. The observer is
attached through `torch.cuda._lazy_call`, i.e. when the program itself initializes CUDA
(`_cuda_attach_out_of_memory_observer` initializes CUDA when called earlier: a context of
~0.5 GiB the program may never have wanted). It is a Python function that the caching
allocator calls only on its OOM path, after it has released its lock
(c10/cuda/CUDACachingAllocator.cpp: `lock.unlock(); for (obs : observers_local) obs(device,
alloc_size, set_fraction ? allowed_memory_maximum : device_total, device_free)`), so taking
`torch.cuda.memory._snapshot()` there is safe. No allocation history is recorded unless
`VRAMCTL_OOM_HISTORY=1` asks for it (then `_record_memory_history` from the same moment,
with its cost: stacks gathered on every allocation).

What it writes at an OOM: one snapshot per process (later OOMs are counted, not kept),
pickled (protocol 4) to `oom-<pid>.pickle`, 0600, created with O_EXCL|O_NOFOLLOW in the
agent's own 0700 socket directory, or, under `vramctl run`, in the run's report directory
beside `<pid>.oom.json` (the record below). A pickle over MAX_OOM_SNAPSHOT_BYTES is not
written; the record says so.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import threading
import time

from . import _protocol as proto

log = logging.getLogger("vramctl_agent")

HISTORY_ENV = "VRAMCTL_OOM_HISTORY"
# Limits set outside torch that the record keeps as the process saw them: which GPUs it
# sees, and an MPS client's memory limit and share.
LIMIT_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
RUN_REPORT_ENV = "VRAMCTL_RUN_REPORT_DIR"

# The most trace entries per device an OOM snapshot keeps (the newest): as many as the
# observer's own history records.
MAX_OOM_TRACE_ENTRIES = proto.DEFAULT_HISTORY_ENTRIES

_lock = threading.Lock()
_attached_pid: int | None = None
_queued_pid: int | None = None
_record: dict | None = None  # the first OOM's record, once one happened in this process
_snapshot_file: str | None = None  # where its snapshot is
_ooms = 0  # observer calls in this process
_history_started = False  # the observer's own allocation history (VRAMCTL_OOM_HISTORY=1) runs
_agent_dir: str | None = None  # the agent's own socket directory (set_directory)


def set_directory(directory: str | None) -> None:
    """Where snapshots go outside `vramctl run`: the agent's socket directory, 0700 and its
    own (the agent sets it when it starts)."""
    global _agent_dir
    _agent_dir = directory


def reset_after_fork() -> None:
    """A forked child has neither the parent's observer nor its OOM."""
    global _lock, _record, _snapshot_file, _ooms
    _lock = threading.Lock()
    _record, _snapshot_file, _ooms = None, None, 0


def arm(torch=None) -> bool:
    """Attaches the observer once CUDA is initialized (now if it is, else queued on torch's
    lazy initialization). True if it is attached or queued."""
    global _queued_pid
    torch = torch if torch is not None else sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is None or getattr(getattr(torch, "_C", None), "_cuda_attach_out_of_memory_observer", None) is None:
        return False
    if _attached_pid == os.getpid() or _queued_pid == os.getpid():
        return True
    try:
        if cuda.is_initialized():
            return _attach(torch)
    except Exception:
        return False
    lazy_call = getattr(cuda, "_lazy_call", None)
    if lazy_call is None:
        return False
    _queued_pid = os.getpid()
    lazy_call(lambda: _attach(torch))
    return True


def _attach(torch) -> bool:
    global _attached_pid
    if _attached_pid == os.getpid():
        return True
    try:
        torch._C._cuda_attach_out_of_memory_observer(_on_oom)
    except Exception as err:
        log.info("vramctl agent: the OOM observer was not attached: %s", err)
        return False
    _attached_pid = os.getpid()
    from . import _alloc_trace

    # Under `vramctl fit`, the trial's trace (its recording serves the OOM history too).
    if _alloc_trace.start(torch):
        warm_frame_symbolizer()
        return True
    if os.environ.get(HISTORY_ENV) == "1":
        try:
            # Python frames only: the verdict needs the first user frame, and torch's
            # default (`stacks="all"`) symbolizes every C++ frame when the snapshot is taken,
            # which is the likely part of the 5.6 s the H200 measured from the failing
            # request to run's verdict with history (docs/benchmarks.md, issue 33).
            torch.cuda.memory._record_memory_history(
                max_entries=proto.DEFAULT_HISTORY_ENTRIES, stacks="python"
            )
            global _history_started
            _history_started = True
            warm_frame_symbolizer()
        except Exception as err:
            log.warning("vramctl agent: %s=1 but history could not be recorded: %s", HISTORY_ENV, err)
    return True


# The module torch's snapshot imports the first time it symbolizes a Python frame
# (torch/csrc/profiler/python/combined_traceback.cpp looks up
# `PyCodeCache.stack_frames_for_code` there, for frames of inductor-generated code). Its
# import pulls in dynamo, FSDP and sympy: 5.2-5.9 s on the H100 of 2026-12-05 (no .pyc
# caches there), the whole of the history case's delay from the failing request to run's
# verdict (scripts/oom-history-probe.py, docs/benchmarks.md); once imported, a snapshot
# takes 0.3 ms.
SYMBOLIZER_MODULE = "torch._inductor.codecache"
_warming: threading.Thread | None = None


def warm_frame_symbolizer() -> None:
    """Imports SYMBOLIZER_MODULE on a thread of its own, once, when a recording with
    Python frames starts: the OOM's snapshot (and fit's trial trace at exit) would
    otherwise pay the import at the moment it matters. It costs the program CPU time
    while it starts (the interpreter's lock, shared with its own start-up), nothing on
    the GPU. A program that already imported it (torch.compile) pays nothing."""
    global _warming
    if _warming is not None or SYMBOLIZER_MODULE in sys.modules:
        return

    def run() -> None:
        try:
            __import__(SYMBOLIZER_MODULE)
        except Exception as err:  # an older torch, or one without inductor: nothing to warm
            log.info("vramctl agent: %s not imported ahead: %s", SYMBOLIZER_MODULE, err)

    _warming = threading.Thread(target=run, name="vramctl-agent-warm", daemon=True)
    _warming.start()
    # A fork (a DataLoader worker) in the middle of the import would leave the child with
    # half-imported modules whose import locks belong to a thread it does not have: a child
    # that imports one of them would wait forever. The fork waits for the import instead
    # (bounded: a fork made while the forking thread holds a lock the import needs must not
    # wait forever either).
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_finish_warm_up_before_fork)


# How long a fork waits for the warm-up's import (it takes 5-6 s on the H100 of 2026-12-05).
FORK_WAIT_S = 30.0


def _finish_warm_up_before_fork() -> None:
    warming = _warming
    if warming is not None and warming.is_alive() and warming is not threading.current_thread():
        warming.join(FORK_WAIT_S)


def wait_for_warm_up(timeout_s: float) -> bool:
    """Waits up to `timeout_s` for the warm-up's import to end; whether one ran and ended
    (for tests and probes)."""
    if _warming is None:
        return False
    _warming.join(timeout_s)
    return not _warming.is_alive()


def records_history() -> bool:
    """Whether the allocator's history recording is the observer's (VRAMCTL_OOM_HISTORY=1, or
    fit's trace): a `snapshot` request must neither restart nor stop it (leaks --where
    would otherwise end the history an OOM verdict needs)."""
    return (_history_started and _attached_pid == os.getpid()) or _alloc_trace_recording()


def _alloc_trace_recording() -> bool:
    from . import _alloc_trace

    return _alloc_trace.recording()


def _on_oom(device: int, segment_bytes: int, allowed_bytes: int, device_free_bytes: int) -> None:
    """Called by the caching allocator before it raises OutOfMemoryError. Never raises: an
    exception here would replace the program's OutOfMemoryError with ours."""
    global _record, _snapshot_file, _ooms
    try:
        with _lock:
            _ooms += 1
            if _record is not None:
                _record["ooms"] = _ooms
                _rewrite_run_record()
                return
            _record, _snapshot_file = _keep(device, segment_bytes, allowed_bytes, device_free_bytes)
            _rewrite_run_record()
    except Exception as err:
        try:
            log.warning("vramctl agent: the OOM could not be recorded: %s", err)
        except Exception:
            pass


def _int(value) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _keep(device: int, segment_bytes: int, allowed_bytes: int, device_free_bytes: int) -> tuple[dict, str | None]:
    torch = sys.modules.get("torch")
    cuda = torch.cuda
    record: dict = {
        "pid": os.getpid(),
        "unix_ms": int(time.time() * 1000),
        "device": _int(device),
        # What the allocator asked the driver for (a segment, or expandable pages), not the
        # request: the observer is not told the request.
        "segment_bytes": _int(segment_bytes),
        # The per-process limit (set_per_process_memory_fraction) where one is set, else
        # the device's total: the allocator passes one or the other.
        "allowed_bytes": _int(allowed_bytes),
        "device_free_bytes": _int(device_free_bytes),
        "device_total_bytes": None,
        "memory_fraction": None,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "limits_env": {k: os.environ[k][: proto.MAX_STRING_CHARS] for k in LIMIT_ENV if k in os.environ},
        "allocator_backend": None,
        "history_recorded": os.environ.get(HISTORY_ENV) == "1" or _alloc_trace_recording(),
        "ooms": _ooms,
        "snapshot": None,
        "snapshot_error": None,
    }
    try:
        record["allocator_backend"] = cuda.get_allocator_backend()
    except Exception:
        pass
    try:
        total = _int(getattr(cuda.get_device_properties(device), "total_memory", None))
        record["device_total_bytes"] = total
    except Exception:
        total = None
    getter = getattr(cuda, "get_per_process_memory_fraction", None)  # torch 2.8+
    if getter is not None:
        try:
            record["memory_fraction"] = float(getter(device))
        except Exception:
            pass
    if record["memory_fraction"] is None and total and isinstance(allowed_bytes, int) and allowed_bytes < total:
        record["memory_fraction"] = allowed_bytes / total
    started = time.monotonic()
    try:
        snapshot = cuda.memory._snapshot()
    except Exception as err:
        record["snapshot_error"] = f"torch.cuda.memory._snapshot failed: {str(err)[:300]}"
        return record, None
    taken = time.monotonic()
    entries, dropped = _bound_traces(snapshot)
    try:
        data = pickle.dumps(snapshot, protocol=4)
    except Exception as err:
        record["snapshot_error"] = f"the snapshot could not be pickled: {str(err)[:300]}"
        return record, None
    pickled = time.monotonic()
    if len(data) > proto.MAX_OOM_SNAPSHOT_BYTES:
        record["snapshot_error"] = f"the snapshot is {len(data)} bytes, over the {proto.MAX_OOM_SNAPSHOT_BYTES} kept"
        return record, None
    path = os.path.join(_directory(), f"{os.getpid()}.oom.pickle" if _run_dir() else f"oom-{os.getpid()}.pickle")
    try:
        _write_new(path, data)
    except OSError as err:
        record["snapshot_error"] = f"cannot write '{path}': {err.strerror or err}"
        return record, None
    written = time.monotonic()
    # Each stage's seconds, so that a slow verdict says where its time went (issue 33:
    # scripts/oom-live-h200.py prints them as `figure` lines).
    record["snapshot"] = {
        "path": path,
        "size_bytes": len(data),
        "taken_s": round(written - started, 6),
        "snapshot_s": round(taken - started, 6),
        "pickle_s": round(pickled - taken, 6),
        "write_s": round(written - pickled, 6),
        "trace_entries": entries,
        "trace_entries_dropped": dropped,
    }
    return record, path


def _bound_traces(snapshot) -> tuple[int, int]:
    """Keeps the newest MAX_OOM_TRACE_ENTRIES entries of each device's trace (the entries
    kept and dropped, over all devices). The observer's own history (VRAMCTL_OOM_HISTORY=1)
    never holds more: torch's ring buffer is that size. Under `vramctl fit` the recording
    keeps up to 10x more for fit's trace (written at exit from its own snapshot, not this
    one), and pickling and reading those would cost seconds at every OOM of a trial
    (docs/benchmarks.md, issue 33). The newest entries are the ones the verdict reads:
    vramctl rebuilds the state before the first kept entry from the segments, so a
    replay from there is one the observer's own history would have given."""
    kept = dropped = 0
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    if not isinstance(traces, list):
        return 0, 0
    for i, trace in enumerate(traces):
        if not isinstance(trace, list):
            continue
        if len(trace) > MAX_OOM_TRACE_ENTRIES:
            dropped += len(trace) - MAX_OOM_TRACE_ENTRIES
            traces[i] = trace = trace[-MAX_OOM_TRACE_ENTRIES:]
        kept += len(trace)
    return kept, dropped


def _run_dir() -> str | None:
    directory = os.environ.get(RUN_REPORT_ENV)
    return directory if directory and os.path.isabs(directory) else None


def _directory() -> str:
    run = _run_dir()
    if run is not None:
        return run
    if _agent_dir is None:
        raise OSError("no agent directory")
    return _agent_dir


def _write_new(path: str, data: bytes) -> None:
    """Creates `path` 0600; never follows a symlink or reuses a file already there."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise


def _rewrite_run_record() -> None:
    """Under `vramctl run`: `<pid>.oom.json`, replaced whole, so the supervisor reads the
    record even when the process dies right after (or is killed later)."""
    run = _run_dir()
    if run is None or _record is None:
        return
    final = os.path.join(run, f"{os.getpid()}.oom.json")
    partial = os.path.join(run, f".{os.getpid()}.oom.json.partial")
    try:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        _write_new(partial, json.dumps(_record).encode("utf-8"))
        os.replace(partial, final)
    except OSError as err:
        log.warning("vramctl agent: could not write the OOM record %s: %s", final, err)


def record() -> dict | None:
    """The first OOM's record (a copy), or None."""
    with _lock:
        return dict(_record) if _record is not None else None


def attached() -> bool:
    return _attached_pid == os.getpid()


def read_snapshot(offset: int, max_bytes: int) -> tuple[bytes, int]:
    """Up to `max_bytes` of the kept snapshot from `offset`, and its size."""
    path = _snapshot_file
    if path is None:
        raise FileNotFoundError("no OOM snapshot was kept")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, max_bytes, offset), size
    finally:
        os.close(fd)
