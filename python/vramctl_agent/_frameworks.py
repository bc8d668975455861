"""What the process has imported, and the JAX and TensorFlow adapters (torch: _torch.py).

The agent never imports a framework: it reads `sys.modules`, and only a module whose import
has finished counts (one still executing in another thread is half-built). It never
initializes a device either: a framework whose GPU runtime has not started yet is reported
as such, because starting it would allocate memory (a CUDA context, JAX's preallocated pool)
in a process that did not ask for it, and would break a later `fork`.
"""

from __future__ import annotations

import sys
from types import ModuleType


def imported(name: str) -> ModuleType | None:
    """`sys.modules[name]` if its import has finished, else None."""
    module = sys.modules.get(name)
    if module is None:
        return None
    spec = getattr(module, "__spec__", None)
    if spec is not None and getattr(spec, "_initializing", False):
        return None
    return module


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


# Every device entry of `stats` has these fields, null where the framework cannot say
# (docs/agent.md, "What each number means"); extra fields may follow.
DEVICE_FIELDS = (
    "total_bytes",
    "allocated_bytes",
    "allocated_peak_bytes",
    "reserved_bytes",
    "reserved_peak_bytes",
    "active_bytes",
    "active_peak_bytes",
    "inactive_split_bytes",
    "inactive_split_peak_bytes",
    "requested_bytes",
    "requested_peak_bytes",
    "cached_bytes",
    "releasable_bytes",
    "segments",
    "alloc_retries",
    "ooms",
)


def blank_device(framework: str, index: int | None, name: str | None = None, uuid: str | None = None) -> dict:
    entry: dict = {"framework": framework, "index": index, "name": name, "uuid": uuid}
    entry.update(dict.fromkeys(DEVICE_FIELDS))
    return entry


# --- JAX -------------------------------------------------------------------------------

_JAX_GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def _jax_backends() -> list | None:
    """JAX's initialized backends, or None if none has started (asking jax.devices() would
    start one, and the GPU backend preallocates 75 % of the memory by default)."""
    bridge = imported("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None) if bridge is not None else None
    if not backends:
        return None
    return list(backends.values())


def jax_info() -> dict | None:
    jax = imported("jax")
    if jax is None:
        return None
    return {
        "name": "jax",
        "version": getattr(jax, "__version__", None),
        "initialized": _jax_backends() is not None,
    }


def _jax_gpu_devices() -> list:
    devices = []
    for backend in _jax_backends() or []:
        try:
            local = backend.local_devices()
        except Exception:
            continue
        devices.extend(d for d in local if getattr(d, "platform", None) in _JAX_GPU_PLATFORMS)
    return devices


def jax_device_stats() -> list[dict]:
    """Per GPU: JAX's own counters (`Device.memory_stats()`, XLA's allocator). `pool_bytes` is
    what the BFC allocator holds from the driver (reserved); it is absent with the platform
    allocator, and then reserved is unknown (null)."""
    out = []
    for device in _jax_gpu_devices():
        try:
            stats = device.memory_stats() or {}
        except Exception as err:
            entry = blank_device("jax", _int_or_none(getattr(device, "id", None)))
            entry["error"] = str(err)[:200]
            out.append(entry)
            continue
        allocated = _int_or_none(stats.get("bytes_in_use"))
        reserved = _int_or_none(stats.get("pool_bytes"))
        entry = blank_device("jax", _int_or_none(getattr(device, "id", None)), getattr(device, "device_kind", None))
        entry.update(
            {
                "total_bytes": _int_or_none(stats.get("bytes_limit")),
                "allocated_bytes": allocated,
                "allocated_peak_bytes": _int_or_none(stats.get("peak_bytes_in_use")),
                "reserved_bytes": reserved,
                "reserved_peak_bytes": _int_or_none(stats.get("peak_pool_bytes")),
                "cached_bytes": reserved - allocated if reserved is not None and allocated is not None else None,
                "largest_free_block_bytes": _int_or_none(stats.get("largest_free_block_bytes")),
                "allocations": _int_or_none(stats.get("num_allocs")),
            }
        )
        out.append(entry)
    return out


# --- TensorFlow ------------------------------------------------------------------------


def _tf_context():
    """TensorFlow's eager context if it has been initialized (its devices exist), else None:
    listing devices or reading memory info would initialize it, and TensorFlow maps most of
    each GPU's memory when it does."""
    context = imported("tensorflow.python.eager.context")
    if context is None:
        return None
    get = getattr(context, "context_safe", None)
    ctx = get() if get is not None else None
    if ctx is None:
        return None
    if getattr(ctx, "_initialized", False) or getattr(ctx, "_context_handle", None) is not None:
        return ctx
    return None


def tf_info() -> dict | None:
    tf = imported("tensorflow")
    if tf is None:
        return None
    return {"name": "tensorflow", "version": getattr(tf, "__version__", None), "initialized": _tf_context() is not None}


def _tf_gpus() -> list[str]:
    tf = imported("tensorflow")
    if tf is None or _tf_context() is None:
        return []
    try:
        return [d.name for d in tf.config.list_logical_devices("GPU")]
    except Exception:
        return []


def _tf_index(name: str) -> int | None:
    # "/device:GPU:0" -> 0
    tail = name.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def tf_device_stats() -> list[dict]:
    """Per GPU: `tf.config.experimental.get_memory_info` (`current`, `peak`: bytes in use by
    tensors). TensorFlow does not say how much its allocator holds: reserved is null."""
    tf = imported("tensorflow")
    out = []
    for name in _tf_gpus():
        index = _tf_index(name)
        entry = blank_device("tensorflow", index, name)
        try:
            # The documented form is "GPU:0"; the logical device name is "/device:GPU:0".
            info = tf.config.experimental.get_memory_info(f"GPU:{index}" if index is not None else name)
        except Exception as err:
            entry["error"] = str(err)[:200]
            out.append(entry)
            continue
        entry["allocated_bytes"] = _int_or_none(info.get("current"))
        entry["allocated_peak_bytes"] = _int_or_none(info.get("peak"))
        out.append(entry)
    return out


def tf_reset_peak() -> list[dict]:
    tf = imported("tensorflow")
    out = []
    for name in _tf_gpus():
        index = _tf_index(name)
        try:
            tf.config.experimental.reset_memory_stats(f"GPU:{index}" if index is not None else name)
            out.append({"framework": "tensorflow", "index": index, "reset": True})
        except Exception as err:
            out.append({"framework": "tensorflow", "index": index, "reset": False, "error": str(err)[:200]})
    return out
