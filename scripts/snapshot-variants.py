#!/usr/bin/env python3
"""Writes the format variants of an H200 snapshot fixture that the reader must accept
(research-pytorch-memory.md §1.2, §1.5), from snap.pickle, with Python's own pickle:

- snap-proto2.pickle: protocol 2 (BINPUT/LONG_BINPUT, no FRAME/MEMOIZE), as the C++
  TorchScript pickler and old Pythons write
- snap-proto5.pickle: protocol 5 (Python 3.14's default)
- snap.pickle.gz: gzip'd
- segments-only.pickle: torch.cuda.memory_snapshot()'s list of segments
- legacy-2.0.pickle: the <= 2.0 shape: blocks with history=[{addr, real_size, frames}]
  instead of address/requested_size/frames, no stream, no allocator_settings, trace action
  'free' instead of free_requested/free_completed
- ordered-dict.pickle: segments as collections.OrderedDict (GLOBAL + REDUCE)

    python3 scripts/snapshot-variants.py testdata/h200/snapshots
"""
import collections
import gzip
import pickle
import sys

d = sys.argv[1]
with open(f"{d}/snap.pickle", "rb") as f:
    snap = pickle.load(f)
with open(f"{d}/snap-proto2.pickle", "wb") as f:
    pickle.dump(snap, f, protocol=2)
with open(f"{d}/snap-proto5.pickle", "wb") as f:
    pickle.dump(snap, f, protocol=5)
with gzip.GzipFile(f"{d}/snap.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snap, f, protocol=4)
with open(f"{d}/segments-only.pickle", "wb") as f:
    pickle.dump(snap["segments"], f, protocol=4)

legacy_segments = []
for s in snap["segments"]:
    blocks = []
    for b in s["blocks"]:
        blocks.append({"size": b["size"], "state": b["state"],
                       "history": [{"addr": b["address"], "real_size": b["requested_size"],
                                    "frames": b["frames"]}]})
    legacy_segments.append({k: s[k] for k in ("device", "address", "total_size",
                                              "allocated_size", "active_size",
                                              "segment_type")} | {"blocks": blocks})
legacy_traces = [[{k: v for k, v in e.items() if k not in ("time_us", "compile_context",
                                                          "user_metadata")}
                  | ({"action": "free"} if e["action"] == "free_completed" else {})
                  for e in t if e["action"] != "free_requested"]
                 for t in snap["device_traces"]]
with open(f"{d}/legacy-2.0.pickle", "wb") as f:
    pickle.dump({"segments": legacy_segments, "device_traces": legacy_traces}, f, protocol=4)

with open(f"{d}/ordered-dict.pickle", "wb") as f:
    pickle.dump({"segments": [collections.OrderedDict(s) for s in snap["segments"]]}, f,
                protocol=4)
