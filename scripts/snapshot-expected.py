#!/usr/bin/env python3
"""Sums of the snapshot fixtures computed with Python's own pickle (an independent reader),
the way torch/cuda/_memory_viz.py's segsum and memory_stats() define them. The Rust tests
(crates/vramctl-snapshot/tests/fixtures.rs) compare the summary against this file.

    python3 scripts/snapshot-expected.py testdata/h200/snapshots/*.pickle \
        > testdata/h200/snapshots/expected.json
"""
import json
import pickle
import sys

out = {}
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        data = pickle.load(f)
    segments = data if isinstance(data, list) else data["segments"]
    traces = [] if isinstance(data, list) else data.get("device_traces", [])
    d = dict(reserved_bytes=0, allocated_bytes=0, active_bytes=0, requested_bytes=0,
             inactive_split_bytes=0, internal_waste_bytes=0, free_bytes=0,
             largest_free_block_bytes=0, segments=0, blocks=0, releasable_bytes=0)
    for s in segments:
        d["segments"] += 1
        d["reserved_bytes"] += s["total_size"]
        blocks = s["blocks"]
        any_active = False
        for b in blocks:
            d["blocks"] += 1
            if b["state"] == "active_allocated":
                d["allocated_bytes"] += b["size"]
            if b["state"] in ("active_allocated", "active_pending_free"):
                any_active = True
                d["active_bytes"] += b["size"]
                d["requested_bytes"] += b["requested_size"]
                d["internal_waste_bytes"] += b["size"] - b["requested_size"]
            if b["state"] == "inactive":
                d["free_bytes"] += b["size"]
                d["largest_free_block_bytes"] = max(d["largest_free_block_bytes"], b["size"])
                # memory_stats() leaves expandable segments out of inactive_split
                # (CUDACachingAllocator.cpp, free_block: `if (!block->expandable_segment_)`).
                if len(blocks) > 1 and not s.get("is_expandable", False):
                    d["inactive_split_bytes"] += b["size"]
        # An expandable segment is not freed whole: empty_cache() unmaps its free pages.
        if not any_active and not s.get("is_expandable", False):
            d["releasable_bytes"] += s["total_size"]
    d["trace_entries"] = sum(len(t) for t in traces)
    d["oom_requested_bytes"] = [e["size"] for t in traces for e in t if e["action"] == "oom"]
    d["oom_device_free_bytes"] = [e["device_free"] for t in traces for e in t if e["action"] == "oom"]
    out[path.rsplit("/", 1)[-1]] = d
json.dump(out, sys.stdout, indent=1, sort_keys=True)
print()
