#!/usr/bin/env python3
"""The OOM verdict's stages on the CPU (issue 33, docs/benchmarks.md): the agent's pickling of
a snapshot of the shape `torch.cuda.memory._snapshot()` returns (the real `pickle` module on
a real snapshot's dict), its write, and vramctl's reading, parsing and classifying of the
file (`oom_verdict_stages`, the code `vramctl run` runs), before the agent's trace bound
(the whole trace) and after it (the newest `_oom.MAX_OOM_TRACE_ENTRIES` per device).

    cargo build --release -p vramctl-snapshot --example oom_verdict_stages
    python3 scripts/oom-stage-bench.py SNAPSHOT.pickle [OUT_DIR]

Prints `figure <variant> <stage> <seconds>` lines.
"""

import copy
import os
import pickle
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

from vramctl_agent import _oom  # noqa: E402

EXAMPLE = os.path.join(REPO, "target", "release", "examples", "oom_verdict_stages")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: oom-stage-bench.py SNAPSHOT.pickle [OUT_DIR]")
    out = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="oom-stage-bench-")
    os.makedirs(out, exist_ok=True)
    with open(sys.argv[1], "rb") as f:
        snapshot = pickle.load(f)
    variants = [("whole", snapshot)]
    bounded = copy.copy(snapshot)
    bounded["device_traces"] = list(snapshot.get("device_traces") or [])
    started = time.perf_counter()
    kept, dropped = _oom._bound_traces(bounded)
    print(f"figure bounded bound_s {time.perf_counter() - started:.3f} ({kept} kept, {dropped} dropped)", flush=True)
    variants.append(("bounded", bounded))
    for name, snap in variants:
        entries = sum(len(t) for t in snap.get("device_traces") or [])
        started = time.perf_counter()
        data = pickle.dumps(snap, protocol=4)
        pickled = time.perf_counter()
        path = os.path.join(out, f"{name}.pickle")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        written = time.perf_counter()
        print(f"figure {name} trace_entries {entries}", flush=True)
        print(f"figure {name} bytes {len(data)}", flush=True)
        print(f"figure {name} agent_pickle_s {pickled - started:.3f}", flush=True)
        print(f"figure {name} agent_write_s {written - pickled:.3f}", flush=True)
        if os.access(EXAMPLE, os.X_OK):
            done = subprocess.run([EXAMPLE, path], capture_output=True, text=True, timeout=600)
            for line in done.stdout.splitlines():
                if line.startswith("figure "):
                    print(f"figure {name} vramctl_{line[len('figure '):]}", flush=True)
                else:
                    print(f"  {line}", flush=True)
        else:
            print(f"(no {EXAMPLE}: build it for vramctl's stages)", flush=True)


if __name__ == "__main__":
    main()
