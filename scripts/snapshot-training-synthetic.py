#!/usr/bin/env python3
"""A large allocator snapshot whose trace replays exactly, for the snapshot viewer's figures
and pictures (issue 32), without a GPU or torch:

    python3 scripts/snapshot-training-synthetic.py SRC OUT N

scripts/snapshot-synthetic.py repeats a real trace, which does not replay (the copies
allocate addresses the final state does not have); this one simulates a training loop on
the allocator's rules instead, with the stacks of SRC (a `_dump_snapshot()` pickle, e.g.
testdata/h200/snapshots/snapshot-train.pickle): 24 segments of 64 MiB mapped first
(`segment_alloc`), 384 MiB of weights allocated once and live to the end, then steps that
allocate 40 to 76 activations of 2 to 10 MiB (bump allocation in the other segments) and
free them newest first (`free_requested`, `free_completed`), every 97th step an `oom` of a
4 GiB request at its peak, until the trace has at least N entries. The final `segments`
are the state this leaves, so undoing the trace from them ends with nothing: the viewer
shows it "replayed". Each entry is a fresh dict and frame list sharing SRC's frame dicts,
as torch's own files are (4,200,000 entries: ~1 GB).
"""
import pickle
import sys

if len(sys.argv) != 4:
    raise SystemExit(__doc__)
src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = pickle.load(open(src, "rb"))

# Distinct stacks of SRC's allocations (by their Python frames).
pool, seen = [], set()
for e in d["device_traces"][0]:
    if e["action"] != "alloc" or "frames" not in e:
        continue
    key = tuple((f["filename"], f["line"]) for f in e["frames"] if f["filename"].endswith(".py"))
    if key not in seen:
        seen.add(key)
        pool.append(e["frames"])
if not pool:
    raise SystemExit("SRC has no alloc entry with frames")

MIB = 1 << 20
SEG = 64 * MIB
NSEG = 24
WEIGHT_SEGS = 6
BASE = 0x7F0000000000
trace = []
clock = [1_700_000_000_000_000]


def entry(action, addr, size, frames, **extra):
    clock[0] += 10
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": clock[0],
         "frames": list(frames)}
    e.update(extra)
    if addr is None:
        del e["addr"]
    trace.append(e)


for i in range(NSEG):
    entry("segment_alloc", BASE + i * SEG, SEG, pool[0])
weights = []  # (address, size, frames)
for i in range(WEIGHT_SEGS):
    for k in range(8):
        frames = pool[(i * 8 + k) % len(pool)]
        addr = BASE + i * SEG + k * 8 * MIB
        entry("alloc", addr, 8 * MIB, frames)
        weights.append((addr, 8 * MIB, frames))

step = 0
while len(trace) < n:
    live = []
    seg, offset = WEIGHT_SEGS, 0
    for j in range(40 + (step % 13) * 3):
        size = (2 + (j * 7 + step) % 9) * MIB
        if offset + size > SEG:
            seg, offset = seg + 1, 0
        if seg >= NSEG:
            break
        addr = BASE + seg * SEG + offset
        frames = pool[(j + step) % len(pool)]
        entry("alloc", addr, size, frames)
        live.append((addr, size, frames))
        offset += size
    if step % 97 == 96:
        entry("oom", None, 4 << 30, pool[-1], device_free=1 << 30)
    for addr, size, frames in reversed(live):
        entry("free_requested", addr, size, frames)
        entry("free_completed", addr, size, frames)
    step += 1

segments = []
for i in range(NSEG):
    addr = BASE + i * SEG
    blocks = [{"address": a, "size": s, "requested_size": s, "state": "active_allocated",
               "frames": f} for a, s, f in weights if addr <= a < addr + SEG]
    used = sum(b["size"] for b in blocks)
    if used < SEG:
        blocks.append({"address": addr + used, "size": SEG - used, "requested_size": 0,
                       "state": "inactive", "frames": []})
    segments.append({"device": 0, "address": addr, "total_size": SEG, "allocated_size": used,
                     "active_size": used, "requested_size": used, "stream": 0,
                     "segment_type": "large", "segment_pool_id": (0, 0),
                     "is_expandable": False, "frames": pool[0], "blocks": blocks})
snapshot = {"segments": segments, "device_traces": [trace],
            "allocator_settings": d.get("allocator_settings", {})}
with open(out, "wb") as fh:
    pickle.dump(snapshot, fh)
print(f"{len(trace)} entries, {step} steps")
