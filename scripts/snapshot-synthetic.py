#!/usr/bin/env python3
"""A large allocator snapshot without a GPU or torch, for timing `vramctl snapshot` (issue 17):

    python3 scripts/snapshot-synthetic.py [--fresh-frames] [--devices K] SRC OUT N

Loads SRC (a `_dump_snapshot()` pickle, e.g. testdata/h200/snapshots/snapshot-train.pickle)
and replicates its device_traces[0] entries to N entries, then `pickle.dump`s it (default
protocol), as `_dump_snapshot()` does.

By default the copy is shaped like torch's own files: a fresh dict and a fresh frame list
per entry, holding the *same* frame dicts and strings (torch caches the frame dicts it
builds, so the pickler writes each frame once and refers to it again with a memo GET).
On snapshot-train.pickle (torch 2.11, H200) this gives ~190 bytes per entry, against 154
in the H200's 1.3M-entry file: 1,100,000 entries give ~210 MB.

--devices K gives K device lists, each a copy (the parallel reading's tests use 2).

--fresh-frames makes fresh frame dicts as well (nothing shared but the strings): the worst
case for a reader, ~640 bytes per entry with snap.pickle (330,000 entries give ~212 MB).
"""
import pickle
import sys

args = sys.argv[1:]
fresh = "--fresh-frames" in args
args = [a for a in args if a != "--fresh-frames"]
devices = 1
if "--devices" in args:
    i = args.index("--devices")
    devices = int(args[i + 1])
    del args[i : i + 2]
if len(args) != 3:
    raise SystemExit(__doc__)
src, out, n = args[0], args[1], int(args[2])
d = pickle.load(open(src, "rb"))
t = d["device_traces"][0]
new = []
for i in range(n):
    e = t[i % len(t)]
    f = dict(e)
    if "frames" in e:
        f["frames"] = [dict(fr) for fr in e["frames"]] if fresh else list(e["frames"])
    new.append(f)
d["device_traces"] = [new] + [[dict(e) for e in new] for _ in range(devices - 1)]
with open(out, "wb") as fh:
    pickle.dump(d, fh)
