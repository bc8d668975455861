"""The fake torch.cuda: see torch/__init__.py."""

import os
import threading
import time
import traceback

from . import graphs, memory  # noqa: F401
from .graphs import CUDAGraph, graph, is_current_stream_capturing  # noqa: F401

MiB = 1 << 20
GiB = 1 << 30
K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB
# An H200 as NVML reports it: 143,771 MiB.
H200_TOTAL = 143771 * MiB


class OutOfMemoryError(RuntimeError):
    pass


class _Props:
    def __init__(self, index, total):
        self.name = "NVIDIA H200"
        self.total_memory = total
        self.uuid = f"8cca1523-521a-59dd-48fa-95c44bc1b1{index:02d}"
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132


class _Block:
    __slots__ = ("segment", "size", "requested", "state", "frames")

    def __init__(self, segment, size):
        self.segment, self.size, self.requested, self.state, self.frames = segment, size, 0, "inactive", []


class _Segment:
    def __init__(self, device, address, size, small, frames):
        self.device, self.address, self.size, self.small = device, address, size, small
        self.pool_id = (0, 0)
        self.blocks = [_Block(self, size)]
        self.frames = frames


class _Device:
    def __init__(self, index, capacity):
        self.index, self.capacity = index, capacity
        self.segments = []
        self.peaks = {}
        self.retries = self.ooms = self.device_allocs = self.device_frees = 0
        self.allocs = self.frees = 0
        self.traces = []


class _Fake:
    """The model's state; tests read and steer it."""

    def __init__(self):
        self.lock = threading.RLock()  # the allocator's mutex
        self.initialized = False
        self.init_threads = []  # threads that initialized CUDA (lazily, by a call)
        count = int(os.environ.get("FAKE_TORCH_DEVICES", "1"))
        capacity = int(os.environ.get("FAKE_TORCH_CAPACITY", str(H200_TOTAL)))
        self.devices = [_Device(i, capacity) for i in range(count)]
        self.next_address = 0x7F0000000000
        self.empty_cache_calls = 0
        self.empty_cache_threads = []
        self.captures_invalidated = 0
        # Set to a threading.Event to make empty_cache wait for it (cudaFree waiting for a
        # running kernel).
        self.empty_cache_gate = None
        self.recording = None  # {"max_entries", "stacks", "context"} while recording
        self.device_props_calls = 0
        self.queued_calls = []  # torch.cuda._lazy_call's queue
        # Memory other processes hold on each device (FAKE_TORCH_OTHERS_BYTES): less free.
        self.others_bytes = int(os.environ.get("FAKE_TORCH_OTHERS_BYTES", "0"))
        self.oom_observers = []  # torch._C._cuda_attach_out_of_memory_observer's list

    def init(self):
        if not self.initialized:
            self.initialized = True
            self.init_threads.append(threading.current_thread().name)
            # As torch.cuda._lazy_init: the queued calls run once CUDA is initialized.
            queued, self.queued_calls = self.queued_calls, []
            for call in queued:
                call()


_fake = _Fake()


# What torch's `_record_memory_history(stacks="all")` (its default) puts before the Python
# frames, innermost first: C++ frames without debug info, more of them than the agent keeps.
_CPP_FRAMES = [
    {"filename": "??", "line": 0, "name": name}
    for name in (
        "torch::unwind::unwind()",
        "torch::CapturedTraceback::gather(bool, bool, bool)",
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(...)",
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(...)",
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)",
        "at::TensorBase at::detail::_empty_generic<long>(...)",
        "at::detail::empty_generic(...)",
        "at::detail::empty_cuda(...)",
        "at::native::empty_cuda(...)",
        "at::(anonymous namespace)::wrapper_CUDA_memory_format_empty(...)",
        "c10::impl::wrap_kernel_functor_unboxed_<...>::call(...)",
        "at::_ops::empty_memory_format::redispatch(...)",
        "torch::autograd::THPVariable_empty(_object*, _object*, _object*)",
        "_PyEval_EvalFrameDefault",
    )
]


def _stack():
    frames = list(_CPP_FRAMES) if (_fake.recording or {}).get("stacks") == "all" else []
    for entry in reversed(traceback.extract_stack()[:-1]):
        if "/torch_pkg/torch/" in (entry.filename or ""):
            continue
        frames.append({"filename": entry.filename, "line": entry.lineno, "name": entry.name})
    return frames


def _trace(device, action, addr, size, device_free=None):
    rec = _fake.recording
    if rec is None:
        return
    entry = {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": int(time.time() * 1e6),
        "compile_context": "N/A",
        "user_metadata": "",
        "frames": _stack() if action in ("alloc", "segment_alloc") else [],
    }
    if action == "oom":
        # torch writes the free bytes in place of the address for an oom entry.
        del entry["addr"]
        entry["device_free"] = device_free
    device.traces.append(entry)
    if len(device.traces) > rec["max_entries"]:
        del device.traces[: len(device.traces) - rec["max_entries"]]


def _round(size):
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    return (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK


def _segment_size(size):
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


def _totals(device):
    t = {"allocated": 0, "reserved": 0, "active": 0, "inactive_split": 0, "requested": 0, "segment": 0}
    for seg in device.segments:
        t["reserved"] += seg.size
        t["segment"] += 1
        for b in seg.blocks:
            if b.state != "inactive":
                t["allocated"] += b.size
                t["active"] += b.size
                t["requested"] += b.requested
            elif len(seg.blocks) > 1:
                t["inactive_split"] += b.size
    return t


def _update_peaks(device):
    for key, value in _totals(device).items():
        if value > device.peaks.get(key, 0):
            device.peaks[key] = value


def _release_free_segments(device):
    kept, released = [], 0
    for seg in device.segments:
        if seg.pool_id == (0, 0) and len(seg.blocks) == 1 and seg.blocks[0].state == "inactive":
            released += seg.size
            device.device_frees += 1
            _trace(device, "segment_free", seg.address, seg.size)
        else:
            kept.append(seg)
    device.segments = kept
    return released


def _malloc(index, nbytes):
    _fake.init()
    device = _fake.devices[index]
    failed = _malloc_locked(index, device, nbytes)
    if isinstance(failed, _Block):
        return failed
    # As CUDACachingAllocator.cpp: the observers are called with the allocator's lock
    # released, with (device, the segment size wanted, the allowed or total memory, the
    # driver's free memory), before OutOfMemoryError is raised.
    seg_size, device_free = failed
    for observer in list(_fake.oom_observers):
        observer(index, seg_size, device.capacity, device_free)
    raise OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {nbytes / GiB:.2f} GiB. GPU {index} has a total "
        f"capacity of {device.capacity / GiB:.2f} GiB of which {device_free / GiB:.2f} GiB is free."
    )


def _malloc_locked(index, device, nbytes):
    """The block, or (segment size, free device memory) when it ran out."""
    with _fake.lock:
        size = _round(nbytes)
        small = size <= K_SMALL_SIZE
        best = None
        for seg in device.segments:
            if seg.small != small or seg.pool_id != (0, 0):
                continue
            for b in seg.blocks:
                if b.state == "inactive" and b.size >= size and (best is None or b.size < best.size):
                    best = b
        if best is None:
            seg_size = _segment_size(size)
            used = sum(s.size for s in device.segments)
            if used + seg_size + _fake.others_bytes > device.capacity:
                device.retries += 1
                _release_free_segments(device)
                used = sum(s.size for s in device.segments)
                if used + seg_size + _fake.others_bytes > device.capacity:
                    device.ooms += 1
                    device_free = device.capacity - used - _fake.others_bytes
                    _trace(device, "oom", None, size, device_free=device_free)
                    return seg_size, device_free
            seg = _Segment(index, _fake.next_address, seg_size, small, _stack() if _fake.recording else [])
            _fake.next_address += seg_size + 2 * MiB
            device.segments.append(seg)
            device.segments.sort(key=lambda s: s.address)
            device.device_allocs += 1
            _trace(device, "segment_alloc", seg.address, seg_size)
            best = seg.blocks[0]
        seg = best.segment
        remaining = best.size - size
        if (small and remaining >= K_MIN_BLOCK) or (not small and remaining > K_SMALL_SIZE):
            rest = _Block(seg, remaining)
            best.size = size
            seg.blocks.insert(seg.blocks.index(best) + 1, rest)
        best.state = "active_allocated"
        best.requested = nbytes
        best.frames = _stack() if _fake.recording else []
        device.allocs += 1
        _trace(device, "alloc", _address(best), best.size)
        _update_peaks(device)
        return best


def _address(block):
    seg = block.segment
    offset = 0
    for b in seg.blocks:
        if b is block:
            break
        offset += b.size
    return seg.address + offset


def _free(block):
    device = _fake.devices[block.segment.device]
    with _fake.lock:
        seg = block.segment
        _trace(device, "free_requested", _address(block), block.size)
        _trace(device, "free_completed", _address(block), block.size)
        block.state = "inactive"
        block.frames = []
        block.requested = 0
        device.frees += 1
        i = seg.blocks.index(block)
        # Coalesce with free neighbours.
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            block.size += seg.blocks.pop(i + 1).size
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            prev = seg.blocks[i - 1]
            prev.size += seg.blocks.pop(i).size


# --- the public surface the agent uses -------------------------------------------------


def is_available():
    return True


def is_initialized():
    return _fake.initialized


def _lazy_call(callable, **kwargs):
    """As torch.cuda._lazy_call: now when CUDA is initialized, else at its initialization."""
    if _fake.initialized:
        callable()
    else:
        _fake.queued_calls.append(callable)


def init():
    _fake.init()


def device_count():
    return len(_fake.devices)


def current_device():
    return 0


def get_device_properties(device):
    _fake.init()  # as torch: _lazy_init()
    _fake.device_props_calls += 1
    index = device if isinstance(device, int) else 0
    return _Props(index, _fake.devices[index].capacity)


def get_allocator_backend():
    return "native"


def _device_index(device):
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    text = str(device)
    return int(text.split(":", 1)[1]) if ":" in text else 0


def memory_stats(device=None):
    if not _fake.initialized:
        return {}
    d = _fake.devices[_device_index(device)]
    with _fake.lock:
        t = _totals(d)
        out = {}
        for key, name in (
            ("allocated", "allocated_bytes"),
            ("reserved", "reserved_bytes"),
            ("active", "active_bytes"),
            ("inactive_split", "inactive_split_bytes"),
            ("requested", "requested_bytes"),
            ("segment", "segment"),
        ):
            out[f"{name}.all.current"] = t[key]
            out[f"{name}.all.peak"] = d.peaks.get(key, 0)
        out.update(
            {
                "num_alloc_retries": d.retries,
                "num_ooms": d.ooms,
                "num_device_alloc": d.device_allocs,
                "num_device_free": d.device_frees,
                "allocation.all.allocated": d.allocs,
                "allocation.all.freed": d.frees,
                "num_sync_all_streams": 0,
            }
        )
        return dict(sorted(out.items()))


def memory_allocated(device=None):
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def memory_reserved(device=None):
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def reset_peak_memory_stats(device=None):
    d = _fake.devices[_device_index(device)]
    with _fake.lock:
        d.peaks = dict(_totals(d))


def empty_cache():
    if not _fake.initialized:
        return
    with _fake.lock:
        _fake.empty_cache_calls += 1
        _fake.empty_cache_threads.append(threading.current_thread().name)
        if graphs._capturing:
            # cudaFree during a global-mode capture: CUDA invalidates the capture.
            _fake.captures_invalidated += 1
            for g in graphs._capturing:
                g._invalidated = True
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        gate = _fake.empty_cache_gate
        if gate is not None:
            gate.wait()
        for d in _fake.devices:
            _release_free_segments(d)


def _segment_dict(seg):
    blocks, offset = [], 0
    for b in seg.blocks:
        blocks.append(
            {
                "address": seg.address + offset,
                "size": b.size,
                "requested_size": b.requested,
                "state": b.state,
                "frames": list(b.frames),
            }
        )
        offset += b.size
    active = sum(b.size for b in seg.blocks if b.state != "inactive")
    return {
        "device": seg.device,
        "address": seg.address,
        "total_size": seg.size,
        "allocated_size": active,
        "active_size": active,
        "requested_size": sum(b.requested for b in seg.blocks if b.state != "inactive"),
        "stream": 0,
        "segment_type": "small" if seg.small else "large",
        "segment_pool_id": seg.pool_id,
        "is_expandable": False,
        "frames": list(seg.frames),
        "blocks": blocks,
    }


def synchronize(device=None):
    pass


class Stream:
    def wait_stream(self, other):
        pass


_default_stream = Stream()


def current_stream(device=None):
    return _default_stream


class stream:
    def __init__(self, s):
        self.s = s

    def __enter__(self):
        return self.s

    def __exit__(self, *exc):
        pass


def memory_snapshot(mempool_id=None, include_traces=True):
    with _fake.lock:
        return [_segment_dict(s) for d in _fake.devices for s in d.segments]
