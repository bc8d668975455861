"""The PyTorch side: the caching allocator's counters, `empty_cache`, the segment map, the
allocator snapshot, and the guard that keeps `empty_cache` out of a CUDA graph capture.

Everything here reads `torch` from `sys.modules` and does nothing before CUDA is
initialized: `torch.cuda.memory_stats` answers {} then, but `get_device_properties` would
initialize it (a CUDA context, ~0.5 GiB, and a process that can no longer fork safely).
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import threading
import time
import weakref

from . import _protocol as proto
from ._frameworks import blank_device, imported

# --- the capture guard -----------------------------------------------------------------
#
# `torch.cuda.is_current_stream_capturing()` looks at the *calling thread's* current stream
# (current streams are thread-local), so from the agent's thread it is False while the main
# thread captures on its own stream. A `cudaFree` then (empty_cache) invalidates a
# "global"-mode capture, the default of `torch.cuda.graph`. So the agent wraps
# `CUDAGraph.capture_begin` / `capture_end` (torch.cuda.graph, make_graphed_callables,
# torch.compile's CUDA graph trees and vLLM all go through them) and keeps the set of graphs
# being captured. `_gate` makes "no capture underway" and `empty_cache` one step: a
# capture_begin that arrives meanwhile waits for empty_cache to finish, which it would do
# anyway on the allocator's own lock.

_gate = threading.Lock()
_capturing: "weakref.WeakKeyDictionary[object, str]" = weakref.WeakKeyDictionary()
_capturing_ids: dict[int, str] = {}  # graphs that cannot be weakly referenced
_WRAPPED = "__vramctl_agent_wrapped__"


def _mark(graph: object) -> None:
    name = threading.current_thread().name
    try:
        _capturing[graph] = name
    except TypeError:
        _capturing_ids[id(graph)] = name


def _unmark(graph: object) -> None:
    try:
        _capturing.pop(graph, None)
    except TypeError:
        pass
    _capturing_ids.pop(id(graph), None)


def reset_after_fork() -> None:
    """In a forked child: the gate may have been held by a parent's thread at the fork (it
    would stay locked forever), and the parent's captures are not the child's."""
    global _gate
    _gate = threading.Lock()
    _capturing.clear()
    _capturing_ids.clear()


def capturing_threads() -> list[str]:
    """Names of the threads with a capture underway (begun and not ended)."""
    return sorted(set(_capturing.values()) | set(_capturing_ids.values()))


def _wrap_begin(original):
    @functools.wraps(original)
    def capture_begin(self, *args, **kwargs):
        with _gate:
            result = original(self, *args, **kwargs)
            _mark(self)
        return result

    setattr(capture_begin, _WRAPPED, True)
    return capture_begin


def _wrap_end(original):
    @functools.wraps(original)
    def capture_end(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        finally:
            _unmark(self)

    setattr(capture_end, _WRAPPED, True)
    return capture_end


def install_capture_guard(torch=None) -> bool:
    """Wraps CUDAGraph's capture methods once; True if the guard is in place. `torch` is
    the module when called from the import hook, before its import has officially ended."""
    # sys.modules, not imported(): from the import hook or a start() inside torch's own
    # import, torch.cuda is complete while torch's import has not officially ended.
    torch = torch if torch is not None else sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    graph_class = getattr(cuda, "CUDAGraph", None) if cuda is not None else None
    if graph_class is None:
        return False
    begin = getattr(graph_class, "capture_begin", None)
    if begin is None:
        return False
    if not getattr(begin, _WRAPPED, False):
        graph_class.capture_begin = _wrap_begin(begin)
    # Newer torch ends a capture in capture_end_pre (capture_end calls it); unmarking is
    # idempotent, so wrapping both is safe.
    for name in ("capture_end", "capture_end_pre"):
        end = getattr(graph_class, name, None)
        if end is not None and not getattr(end, _WRAPPED, False):
            setattr(graph_class, name, _wrap_end(end))
    return True


# --- reading ---------------------------------------------------------------------------


def _cuda():
    torch = imported("torch")
    return getattr(torch, "cuda", None) if torch is not None else None


def cuda_initialized() -> bool:
    cuda = _cuda()
    if cuda is None:
        return False
    try:
        return bool(cuda.is_initialized())
    except Exception:
        return False


def info() -> dict | None:
    torch = imported("torch")
    if torch is None:
        return None
    version = getattr(torch, "version", None)
    entry = {
        "name": "torch",
        "version": getattr(torch, "__version__", None),
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "initialized": cuda_initialized(),
        "allocator": None,
        "capture_guard": install_capture_guard(),
    }
    if entry["initialized"]:
        try:
            entry["allocator"] = _cuda().get_allocator_backend()
        except Exception:
            pass
    return entry


def _device_count() -> int:
    try:
        return int(_cuda().device_count())
    except Exception:
        return 0


def _identity(index: int) -> dict:
    entry = blank_device("torch", index)
    try:
        props = _cuda().get_device_properties(index)
    except Exception:
        return entry
    entry["name"] = getattr(props, "name", None)
    uuid = getattr(props, "uuid", None)
    entry["uuid"] = str(uuid) if uuid is not None else None
    total = getattr(props, "total_memory", None)
    entry["total_bytes"] = int(total) if isinstance(total, int) else None
    return entry


def device_identities() -> list[dict]:
    if not cuda_initialized():
        return []
    return [
        {key: entry[key] for key in ("framework", "index", "name", "uuid", "total_bytes")}
        for entry in (_identity(i) for i in range(_device_count()))
    ]


def _stat(stats: dict, key: str) -> int | None:
    value = stats.get(key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _stats_of(index: int) -> dict:
    try:
        return _cuda().memory_stats(index) or {}
    except Exception:
        return {}


def device_stats() -> list[dict]:
    """Per visible device, the caching allocator's own counters (`torch.cuda.memory_stats`)."""
    if not cuda_initialized():
        return []
    out = []
    for index in range(_device_count()):
        entry = _identity(index)
        stats = _stats_of(index)
        for field, key in (
            ("allocated", "allocated_bytes.all"),
            ("reserved", "reserved_bytes.all"),
            ("active", "active_bytes.all"),
            ("inactive_split", "inactive_split_bytes.all"),
            ("requested", "requested_bytes.all"),
        ):
            entry[f"{field}_bytes"] = _stat(stats, f"{key}.current")
            entry[f"{field}_peak_bytes"] = _stat(stats, f"{key}.peak")
        allocated, reserved = entry["allocated_bytes"], entry["reserved_bytes"]
        active, split = entry["active_bytes"], entry["inactive_split_bytes"]
        if reserved is not None and allocated is not None:
            entry["cached_bytes"] = max(reserved - allocated, 0)
        if reserved is not None and active is not None and split is not None:
            # Free blocks in segments with no live block: what empty_cache returns with the
            # default allocator (a fully free segment is one unsplit block, since free
            # neighbours coalesce). An estimate with expandable segments.
            entry["releasable_bytes"] = max(reserved - active - split, 0)
        entry["segments"] = _stat(stats, "segment.all.current")
        entry["alloc_retries"] = _stat(stats, "num_alloc_retries")
        entry["ooms"] = _stat(stats, "num_ooms")
        entry["device_allocs"] = _stat(stats, "num_device_alloc")
        entry["device_frees"] = _stat(stats, "num_device_free")
        out.append(entry)
    return out


def _reserved_by_device() -> dict[int, tuple[int, int, int]]:
    """(reserved, allocated, active) per device, from the counters."""
    out = {}
    for index in range(_device_count()):
        stats = _stats_of(index)
        out[index] = (
            _stat(stats, "reserved_bytes.all.current") or 0,
            _stat(stats, "allocated_bytes.all.current") or 0,
            _stat(stats, "active_bytes.all.current") or 0,
        )
    return out


# --- the segment map -------------------------------------------------------------------


def _segments() -> list[dict]:
    """`torch.cuda.memory_snapshot()`: segments only, without the trace when this torch can
    leave it out (2.11+: include_traces=False), since only the segments are read here."""
    cuda = _cuda()
    try:
        return list(cuda.memory_snapshot(include_traces=False))
    except TypeError:
        return list(cuda.memory_snapshot())


def _clip(text: object) -> object:
    if isinstance(text, str) and len(text) > proto.MAX_STRING_CHARS:
        return text[: proto.MAX_STRING_CHARS - 1] + "…"
    return text


def _is_python_frame(frame: dict) -> bool:
    """A Python frame: a `.py` file, or code Python names in angle brackets (`<stdin>` for
    `python3 - <<EOF`, `<string>` for `python -c`, `<ipython-input-…>` for older notebook
    cells); frozen standard-library modules do not count. The same rule as vramctl's
    (`vramctl_snapshot::top::is_python_file`): with `.py` alone, a job run from stdin kept
    only C++ frames and its leak's site named no line (leak35 on the H200, 2026-12-05)."""
    filename = frame.get("filename")
    if not isinstance(filename, str):
        return False
    if filename.endswith(".py"):
        return True
    return filename.startswith("<") and filename.endswith(">") and not filename.startswith("<frozen ")


def _frames(block: dict) -> list[dict]:
    frames = block.get("frames")
    if frames is None:
        # torch <= 2.0 kept the allocation stack in history[0].
        history = block.get("history") or []
        frames = history[0].get("frames") if history and isinstance(history[0], dict) else None
    frames = [f for f in frames or [] if isinstance(f, dict)]
    # torch's default `_record_memory_history()` records C++ frames too, innermost first:
    # `torch::unwind::unwind()`, `CapturedTraceback::gather`, the dispatcher... fill the
    # first MAX_FRAMES_PER_BLOCK and the cap would keep no line of the user's code
    # (issue 33). The Python frames are what says which line allocated; keep them alone.
    python_frames = [f for f in frames if _is_python_frame(f)]
    if python_frames:
        frames = python_frames
    out = []
    for frame in frames:
        out.append(
            {
                "filename": _clip(frame.get("filename")),
                "line": frame.get("line") if isinstance(frame.get("line"), int) else None,
                "name": _clip(frame.get("name")),
            }
        )
    return out


def _pool(segment: dict) -> list[int] | None:
    pool = segment.get("segment_pool_id")
    if isinstance(pool, (list, tuple)) and len(pool) == 2:
        return [int(pool[0]), int(pool[1])]
    return None


def _segment_used(segment: dict) -> int:
    active = segment.get("active_size")
    if isinstance(active, int):
        return active
    return sum(b.get("size", 0) for b in segment.get("blocks", []) if str(b.get("state", "")).startswith("active"))


def pinned_segments(segments: list[dict]) -> dict[int, list[dict]]:
    """Per device, the segments that hold free (cached) bytes but cannot be returned because
    a live block sits in them, or because they belong to a private pool (a CUDA graph's or a
    MemPool's) that is still in use. Largest free space first."""
    by_device: dict[int, list[dict]] = {}
    for segment in segments:
        total = segment.get("total_size", 0)
        used = _segment_used(segment)
        free = total - used
        if free <= 0:
            continue
        pool = _pool(segment)
        private = pool is not None and pool != [0, 0]
        if used == 0 and not private:
            # A fully free default-pool segment: empty_cache returns it (dry run).
            continue
        live = [b for b in segment.get("blocks", []) if str(b.get("state", "")).startswith("active")]
        live.sort(key=lambda b: b.get("size", 0), reverse=True)
        blocks = []
        for block in live[: proto.MAX_BLOCKS_PER_SEGMENT]:
            frames = _frames(block)
            blocks.append(
                {
                    "address": block.get("address"),
                    "size_bytes": block.get("size"),
                    "requested_bytes": block.get("requested_size"),
                    "state": block.get("state"),
                    "frames": frames[: proto.MAX_FRAMES_PER_BLOCK],
                    "frames_omitted": max(len(frames) - proto.MAX_FRAMES_PER_BLOCK, 0),
                }
            )
        by_device.setdefault(int(segment.get("device", 0)), []).append(
            {
                "address": segment.get("address"),
                "total_bytes": total,
                "live_bytes": used,
                "free_bytes": free,
                "live_blocks": len(live),
                "reason": "private_pool" if private else "live_blocks",
                "pool": pool,
                "stream": segment.get("stream"),
                "segment_type": segment.get("segment_type"),
                "is_expandable": segment.get("is_expandable"),
                "blocks": blocks,
                "blocks_omitted": max(len(live) - len(blocks), 0),
                "stacks_recorded": any(b["frames"] or b["frames_omitted"] for b in blocks),
            }
        )
    for pinned in by_device.values():
        pinned.sort(key=lambda s: s["free_bytes"], reverse=True)
    return by_device


def releasable_from_map(segments: list[dict]) -> dict[int, int]:
    """Per device, the bytes of default-pool segments with no live block (a dry run)."""
    out: dict[int, int] = {}
    for segment in segments:
        pool = _pool(segment)
        if pool is not None and pool != [0, 0]:
            continue
        if _segment_used(segment) == 0:
            device = int(segment.get("device", 0))
            out[device] = out.get(device, 0) + segment.get("total_size", 0)
    return out


# --- acting ----------------------------------------------------------------------------


class Capturing(Exception):
    pass


def _check_not_capturing() -> None:
    threads = capturing_threads()
    if threads:
        raise Capturing(f"a CUDA graph is being captured (by thread {', '.join(repr(t) for t in threads)})")
    cuda = _cuda()
    try:
        if cuda.is_current_stream_capturing():
            raise Capturing("a CUDA graph is being captured on the agent thread's stream")
    except Capturing:
        raise
    except Exception:
        pass


def reclaim(dry_run: bool) -> dict:
    """empty_cache, with the counters before and after and the pinned segments when less
    than the whole cache came back. Raises Capturing during a capture."""
    install_capture_guard()  # in case torch arrived after start() in a way the hook missed
    with _gate:
        _check_not_capturing()
        before = _reserved_by_device()
        started = time.monotonic()
        segments_before = None
        if dry_run:
            segments_before = _segments()
        else:
            _cuda().empty_cache()
        duration = time.monotonic() - started
        after = _reserved_by_device()
    if dry_run:
        releasable = releasable_from_map(segments_before or [])
        after = {d: (r - releasable.get(d, 0), a, act) for d, (r, a, act) in before.items()}
    devices = []
    leftover = any(after[d][0] > after[d][1] for d in after)
    pinned = pinned_segments(segments_before if dry_run else _segments()) if leftover else {}
    budget = proto.MAX_PINNED_SEGMENTS
    for index in sorted(before):
        reserved_before, allocated_before, _ = before[index]
        reserved_after, allocated_after, _ = after.get(index, before[index])
        entry = {
            "framework": "torch",
            "index": index,
            "uuid": _identity(index)["uuid"],
            "reserved_before_bytes": reserved_before,
            "reserved_after_bytes": reserved_after,
            "allocated_before_bytes": allocated_before,
            "allocated_after_bytes": allocated_after,
            "cached_before_bytes": max(reserved_before - allocated_before, 0),
            "cached_after_bytes": max(reserved_after - allocated_after, 0),
            "released_bytes": max(reserved_before - reserved_after, 0),
        }
        segs = pinned.get(index, [])
        shown = segs[: max(budget, 0)]
        budget -= len(shown)
        entry["pinned_bytes"] = sum(s["free_bytes"] for s in segs)
        entry["pinned_segments"] = shown
        entry["pinned_segments_omitted"] = len(segs) - len(shown)
        devices.append(entry)
    return {"devices": devices, "empty_cache_s": None if dry_run else round(duration, 6)}


def reset_peak() -> list[dict]:
    if not cuda_initialized():
        return []
    out = []
    for index in range(_device_count()):
        try:
            _cuda().reset_peak_memory_stats(index)
            out.append({"framework": "torch", "index": index, "reset": True})
        except Exception as err:
            out.append({"framework": "torch", "index": index, "reset": False, "error": str(err)[:200]})
    return out


# --- snapshots -------------------------------------------------------------------------


def _memory_module():
    cuda = _cuda()
    return getattr(cuda, "memory", None) if cuda is not None else None


def start_history(max_entries: int, stacks: str) -> None:
    memory = _memory_module()
    memory._record_memory_history(enabled="all", context="all", stacks=stacks, max_entries=max_entries)


def stop_history() -> None:
    memory = _memory_module()
    memory._record_memory_history(enabled=None)


def write_snapshot(path: str, overwrite: bool) -> dict:
    """`torch.cuda.memory._snapshot()` pickled (protocol 4, which the memory_viz page reads;
    Python 3.14's default 5 it could not until PR #185420) to `path`, created 0600.

    Without `overwrite` the file must not exist (O_EXCL, which also refuses a symlink at the
    path rather than follow it); with it, the snapshot goes to a new temporary file beside
    it that replaces the old one (a symlink itself, never its target) once complete."""
    memory = _memory_module()
    started = time.monotonic()
    snapshot = memory._snapshot()
    taken = time.monotonic() - started
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    target = f"{path}.vramctl-{os.getpid()}.tmp" if overwrite else path
    fd = os.open(target, flags, 0o600)
    written = False
    try:
        with os.fdopen(fd, "wb") as out:
            pickle.dump(snapshot, out, protocol=4)
        if overwrite:
            os.replace(target, path)
        written = True
    finally:
        if not written:
            try:
                os.unlink(target)
            except OSError:
                pass
    segments = snapshot.get("segments", []) if isinstance(snapshot, dict) else snapshot
    traces = snapshot.get("device_traces", []) if isinstance(snapshot, dict) else []
    return {
        "path": path,
        "size_bytes": os.stat(path).st_size,
        "segments": len(segments),
        "trace_entries": sum(len(t) for t in traces),
        "snapshot_s": round(taken, 6),
        "write_s": round(time.monotonic() - started - taken, 6),
    }
