#!/usr/bin/env python3
"""Issue 17's truth and speed check, for the GPU session (not run yet).

Trains a small MLP long enough under _record_memory_history(max_entries=1_000_000) that
the dumped snapshot is >= 200 MB, and records torch.cuda.memory_stats() in the same moment
(no allocation between the two), so `vramctl snapshot FILE --json` can be compared with
PyTorch's own numbers: allocated/reserved/active/requested/inactive_split bytes
(`<name>.all.current`) and `segment.all.current`.

    python3 scripts/snapshot-h200.py /tmp/big.pickle      # writes big.pickle + big.stats.json
    # then, on the same machine (torch installed):
    /usr/bin/time -v python -m torch.cuda._memory_viz stats /tmp/big.pickle > /tmp/viz.txt
    /usr/bin/time -v target/release/vramctl snapshot /tmp/big.pickle --json > /tmp/ours.json
    python3 scripts/snapshot-h200.py --compare /tmp/big.stats.json /tmp/ours.json

Keep big.pickle out of git (it is hundreds of MB); keep the stats JSON and the timings
(docs/benchmarks.md).
"""
import json
import sys
import time

KEYS = ["reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
        "inactive_split_bytes"]


def compare(stats_path, ours_path):
    stats = json.load(open(stats_path))
    ours = json.load(open(ours_path))
    dev = next(d for d in ours["devices"] if d["device"] == stats["device"])
    bad = 0
    for k in KEYS:
        want = stats["memory_stats"][f"{k}.all.current"]
        got = dev[k]
        print(f"{k:24} memory_stats {want:>16} vramctl {got:>16} {'ok' if want == got else 'DIFF'}")
        bad += want != got
    want = stats["memory_stats"]["segment.all.current"]
    print(f"{'segments':24} memory_stats {want:>16} vramctl {dev['segments']:>16}")
    bad += want != dev["segments"]
    sys.exit(1 if bad else 0)


def main(out):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    dev = torch.device("cuda:0")
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    # Varying batch sizes make the allocator split and cache blocks of many sizes, the
    # fragmentation the summary is about; ~60 events per step, so 1e6 entries ≈ 17k steps.
    t0 = time.time()
    for step in range(20_000):
        x = torch.randn(64 + (step * 37) % 512, 2048, device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    print(f"trained in {time.time() - t0:.1f} s", file=sys.stderr)
    # The same moment: memory_stats first (it allocates nothing), then the snapshot.
    stats = torch.cuda.memory_stats(dev)
    t0 = time.time()
    torch.cuda.memory._dump_snapshot(out)
    dump_s = time.time() - t0
    torch.cuda.memory._record_memory_history(enabled=None)
    base = out.rsplit(".", 1)[0]
    with open(f"{base}.stats.json", "w") as f:
        json.dump({"device": 0, "torch": torch.__version__, "dump_s": dump_s,
                   "memory_stats": stats}, f, indent=1)
    import os
    print(f"{out}: {os.path.getsize(out)} bytes, dumped in {dump_s:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "--compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
