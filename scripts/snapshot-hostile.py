#!/usr/bin/env python3
"""Hostile allocator snapshots (issue 29), for timing `vramctl snapshot` on them:

    python3 scripts/snapshot-hostile.py KIND N OUT

KIND:
  segs       one segment of N blocks, listed N times (shared references: N x N blocks)
  blocklist  N segments sharing one list of N blocks
  block      one block listed N times in its segment
  frames     N blocks and N trace entries sharing one frame list of N frames (what torch
             shares, taken to the extreme: must be read, in linear time)
  oom        N oom trace entries against a segment of N blocks
  bomb       a gzip bomb: a pickle declaring an N MiB byte string of zeros, as N gzip
             members of 1 MiB each (about 1 KB each compressed)

The first three are refused by vramctl (torch writes a segment, block list or block once);
docs/benchmarks.md has the figures before and after.
"""
import gzip
import pickle
import sys

if len(sys.argv) != 4:
    raise SystemExit(__doc__)
kind, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
A = 0x7F0000000000


def blk(i, frames=None):
    d = {"address": A + i * 512, "size": 512, "requested_size": 500, "state": "active_allocated"}
    if frames is not None:
        d["frames"] = frames
    return d


if kind == "bomb":
    head = b"\x80\x04\x8e" + (n << 20).to_bytes(8, "little")
    member = gzip.compress(b"\0" * (1 << 20), 9)
    with open(out, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(n):
            f.write(member)
    raise SystemExit(0)
if kind == "segs":
    seg = {"device": 0, "address": A, "total_size": 512 * n, "stream": 0,
           "segment_type": "large", "blocks": [blk(i) for i in range(n)]}
    d = {"segments": [seg] * n, "device_traces": []}
elif kind == "blocklist":
    bl = [blk(i) for i in range(n)]
    d = {"segments": [{"device": 0, "address": A + (i << 32), "total_size": 512 * n, "blocks": bl}
                      for i in range(n)], "device_traces": []}
elif kind == "block":
    b = blk(0)
    d = {"segments": [{"device": 0, "address": A, "total_size": 512 * n, "blocks": [b] * n}],
         "device_traces": []}
elif kind == "frames":
    fr = [{"filename": "/home/u/train.py", "line": i, "name": "f"} for i in range(n)]
    d = {"segments": [{"device": 0, "address": A, "total_size": 512 * n,
                       "blocks": [blk(i, fr) for i in range(n)]}],
         "device_traces": [[{"action": "alloc", "addr": A + i * 512, "size": 512, "stream": 0,
                             "frames": fr} for i in range(n)]]}
elif kind == "oom":
    d = {"segments": [{"device": 0, "address": A, "total_size": 512 * n,
                       "blocks": [blk(i) for i in range(n)]}],
         "device_traces": [[{"action": "oom", "size": 1 << 40, "stream": 0, "device_free": 0}
                            for _ in range(n)]]}
else:
    raise SystemExit(__doc__)
with open(out, "wb") as f:
    pickle.dump(d, f)
