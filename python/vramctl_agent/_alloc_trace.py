"""Under `vramctl fit` (`VRAMCTL_FIT_TRACE=1` beside `VRAMCTL_RUN_REPORT_DIR`): the caching
allocator's trace of the trial, for fit's trace predictor (docs/fit.md, issue 34).

Recording starts when the program initializes CUDA (the OOM observer's `_lazy_call`, so no
allocation of the program comes before it) with Python frames only (`stacks="python"`:
torch's default symbolizes every C++ frame, which costs seconds at the snapshot); at exit,
beside the counters' report, `<pid>.trace.json` holds per device the allocations and
completed frees in order — `[kind, size, stream, address, frame]`, kind 0 alloc, 1 free, 2
a segment released (`empty_cache`), 3 an allocation under torch's convolution module —
and each allocation's first Python frame outside torch (what fit matches allocations by
between two trials). A ring buffer that filled up (`truncated`) or a file over
MAX_TRACE_BYTES is reported as truncated with no events: fit then says why it fell back.
"""

from __future__ import annotations

import json
import logging
import os

ENV = "VRAMCTL_FIT_TRACE"
# Entries the recording keeps (torch's ring buffer): a trial of a few training steps makes
# 10^4-10^5 (an alloc and two frees' entries per tensor); more would cost host memory
# (~300 B an entry with its frames) for traces fit would refuse anyway.
MAX_ENTRIES = 1_000_000
# vramctl reads no larger trace (fit_trace::MAX_TRACE_BYTES).
MAX_TRACE_BYTES = 64 << 20

log = logging.getLogger("vramctl_agent")
_recording_pid: int | None = None


def wanted() -> bool:
    return os.environ.get(ENV) == "1" and bool(os.environ.get("VRAMCTL_RUN_REPORT_DIR"))


def start(torch) -> bool:
    """Starts the recording (called once CUDA is initialized). True if it started."""
    global _recording_pid
    if not wanted():
        return False
    try:
        # Stacks for allocations only (`context="alloc"`): fit matches allocations by
        # frame; a free's stack would only cost.
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES
        )
    except Exception as err:
        log.warning("vramctl agent: %s=1 but the allocator's trace could not be recorded: %s", ENV, err)
        return False
    _recording_pid = os.getpid()
    return True


def recording() -> bool:
    return _recording_pid == os.getpid()


def _first_frame(frames, torch_dir: str) -> str | None:
    """The innermost frame outside torch's package ("file:line function"), else the
    innermost one."""
    first = None
    for f in frames or ():
        if not isinstance(f, dict):
            continue
        name = f"{f.get('filename')}:{f.get('line')} {f.get('name')}"
        if first is None:
            first = name
        filename = str(f.get("filename") or "")
        if filename and filename != "??" and not (torch_dir and filename.startswith(torch_dir)):
            return name
    return first


def _in_convolution(frames) -> bool:
    """Whether the innermost Python frame is torch's convolution module (F.conv*d is
    called from there; its output and cuDNN's workspace are allocated below it)."""
    for f in frames or ():
        if isinstance(f, dict) and f.get("filename") not in (None, "??"):
            return str(f.get("filename")).replace(os.sep, "/").endswith("torch/nn/modules/conv.py")
    return False


def document(snapshot: dict, torch_dir: str, uuids: dict[int, str | None]) -> dict:
    """The trace file's content from a `torch.cuda.memory._snapshot()`."""
    devices = []
    for index, entries in enumerate(snapshot.get("device_traces") or []):
        frames: list[str] = []
        frame_ids: dict[str, int] = {}
        events = []
        for e in entries:
            action = e.get("action")
            kind = {"alloc": 0, "free_completed": 1, "segment_free": 2}.get(action)
            if kind is None:
                continue
            frame = -1
            if kind == 0 and _in_convolution(e.get("frames")):
                # cuDNN's workspace may be among these: fit lets it give way (fit_trace.rs).
                kind = 3
            if kind in (0, 3):
                name = _first_frame(e.get("frames"), torch_dir)
                if name is not None:
                    frame = frame_ids.setdefault(name, len(frames))
                    if frame == len(frames):
                        frames.append(name)
            events.append([kind, int(e.get("size") or 0), int(e.get("stream") or 0), int(e.get("addr") or 0), frame])
        if not events:
            continue
        devices.append(
            {
                "index": index,
                "uuid": uuids.get(index),
                "truncated": len(entries) >= MAX_ENTRIES,
                "frames": frames,
                "events": events,
            }
        )
    return {"version": 1, "devices": devices}


def write(directory: str, pid: int) -> None:
    """`<pid>.trace.json` in the run's report directory (created 0600, never through a
    symlink), replaced whole."""
    if not recording():
        return
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return
    from . import _torch
    from ._oom import _write_new

    snapshot = torch.cuda.memory._snapshot()
    torch_dir = os.path.dirname(getattr(torch, "__file__", "") or "")
    uuids = {}
    for index in range(len(snapshot.get("device_traces") or [])):
        try:
            uuids[index] = _torch._identity(index).get("uuid")
        except Exception:
            uuids[index] = None
    doc = document(snapshot, torch_dir + os.sep if torch_dir else "", uuids)
    data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_TRACE_BYTES:
        for d in doc["devices"]:
            d["truncated"], d["events"], d["frames"] = True, [], []
        data = json.dumps(doc).encode("utf-8")
    final = os.path.join(directory, f"{pid}.trace.json")
    partial = os.path.join(directory, f".{pid}.trace.json.partial")
    try:
        os.unlink(partial)
    except FileNotFoundError:
        pass
    _write_new(partial, data)
    os.replace(partial, final)
