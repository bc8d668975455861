"""The fake torch.cuda.memory: _record_memory_history and _snapshot."""

import sys


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None, **kwargs):
    from . import _fake

    if enabled is None:
        _fake.recording = None
        for d in _fake.devices:
            d.traces = []
        return
    if enabled not in ("all", "state"):
        raise ValueError(f"bad enabled {enabled!r}")
    _fake.recording = {"max_entries": max_entries, "stacks": stacks, "context": context}


def _snapshot(device=None):
    from . import _fake, memory_snapshot

    with _fake.lock:
        return {
            "segments": memory_snapshot(),
            "device_traces": [list(d.traces) for d in _fake.devices],
            "allocator_settings": {
                "PYTORCH_CUDA_ALLOC_CONF": "",
                "max_split_size": -1,
                "garbage_collection_threshold": 0.0,
                "expandable_segments": False,
            },
            "external_annotations": [],
        }


def _dump_snapshot(filename="dump_snapshot.pickle"):
    import pickle

    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)
