#!/usr/bin/env python3
"""A large allocator snapshot without a GPU or torch, for timing `vramctl snapshot` (issue 17):

    python3 scripts/snapshot-synthetic.py SRC OUT N

Loads SRC (a `_dump_snapshot()` pickle, e.g. testdata/h200/snapshots/snap.pickle) and
replicates its device_traces[0] entries to N entries: fresh entry dicts and fresh frame
lists of fresh frame dicts (the worst case for a reader: nothing shared but the strings,
which stay shared as torch's are), then `pickle.dump`s it (default protocol). 330,000
entries give ~212 MB. Real torch files share frame lists between entries (1M entries were
154 MiB on the H200), so they have fewer opcodes per entry than this one.
"""
import pickle
import sys

src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = pickle.load(open(src, "rb"))
t = d["device_traces"][0]
new = []
for i in range(n):
    e = t[i % len(t)]
    f = dict(e)
    if "frames" in e:
        f["frames"] = [dict(fr) for fr in e["frames"]]
    new.append(f)
d["device_traces"][0] = new
with open(out, "wb") as fh:
    pickle.dump(d, fh)
