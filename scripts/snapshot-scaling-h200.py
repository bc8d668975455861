#!/usr/bin/env python3
"""Issue 17's parallel reading on the GPU machine's host (one command, < 1 minute):

    python3 scripts/snapshot-scaling-h200.py --bin .dist/vramctl --out $OUT/scaling

Decompresses the real 206 MB H200 snapshot kept in testdata
(testdata/h200/snapshot-run/real-206MB.pickle.xz, 1,300,000 trace entries) into a temporary
directory, then times `BIN snapshot FILE --json` on 16, 8, 4, 2 and 1 cores (taskset; the
reading uses the cores it may run on) three times each, and `python -m
torch.cuda._memory_viz stats FILE` twice, with wall time and the peak RSS of each command
(measured as scripts/snapshot-h200.py does); the figure of a repeated command is its
fastest run, every run is kept. Checks that every core count gives the same JSON, byte for
byte. Writes results.json and results.md into OUTDIR. Exit 0 when the outputs agree, 1 when
they differ, 2 when a step failed.
"""
import argparse
import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from importlib import import_module

measure = import_module("snapshot-h200").measure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "..", "testdata", "h200", "snapshot-run", "real-206MB.pickle.xz")
    cores_here = len(os.sched_getaffinity(0))
    runs, digests = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        big = os.path.join(tmp, "real.pickle")
        with lzma.open(src) as f, open(big, "wb") as out:
            shutil.copyfileobj(f, out)
        size = os.path.getsize(big)
        for cores in [16, 8, 4, 2, 1]:
            if cores > cores_here:
                continue
            name = f"vramctl snapshot --json, {cores} cores"
            out_path = os.path.join(tmp, f"out-{cores}.json")
            argv = ["taskset", "-c", f"0-{cores - 1}", a.bin, "snapshot", big, "--json"]
            runs[name] = [dict(zip(["rc", "wall_s", "max_rss_bytes"],
                                   measure(argv, out_path, 120))) for _ in range(3)]
            with open(out_path, "rb") as f:
                digests[cores] = hashlib.sha256(f.read()).hexdigest()
        viz = [sys.executable, "-m", "torch.cuda._memory_viz", "stats", big]
        runs["_memory_viz stats"] = [dict(zip(["rc", "wall_s", "max_rss_bytes"],
                                              measure(viz, os.devnull, 300))) for _ in range(2)]
    if any(r["rc"] != 0 for rs in runs.values() for r in rs):
        print(json.dumps(runs, indent=1))
        return 2
    best = {k: min(r["wall_s"] for r in rs) for k, rs in runs.items()}
    rss = {k: max(r["max_rss_bytes"] for r in rs) for k, rs in runs.items()}
    same = len(set(digests.values())) == 1
    results = {"snapshot_bytes": size, "cores_here": cores_here, "runs": runs,
               "best_wall_s": best, "peak_rss_bytes": rss, "json_sha256_by_cores": digests,
               "same_json_on_every_core_count": same}
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    viz_s = best["_memory_viz stats"]
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(f"file: {size} bytes; host: {cores_here} cores; same JSON on every core "
                f"count: {same}\n\n| command | wall (best) | peak RSS | vs _memory_viz stats |\n"
                "|---|---|---|---|\n")
        for k in best:
            f.write(f"| {k} | {best[k]:.3f} s | {rss[k] / 2**20:.0f} MiB "
                    f"({rss[k] / size:.2f}x file) | {viz_s / best[k]:.1f}x |\n")
    print(open(os.path.join(a.out, "results.md")).read())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
