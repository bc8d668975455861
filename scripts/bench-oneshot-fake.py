#!/usr/bin/env python3
"""One-shot `status --json` wall time of two vramctl builds on the fake NVML, interleaved.

    FAKE_NVML_SCENARIO=examples/scenarios/h200-training.toml \
      python3 scripts/bench-oneshot-fake.py OLD_BINARY NEW_BINARY [RUNS]

Each run is a fresh process with no daemon (an empty runtime directory); prints the median of
RUNS (default 41) per binary. The fake library is target/debug/deps/libfake_nvml.so (built by
`cargo test`). For start-up costs outside NVML; the real-GPU figure is
scripts/bench-status-vs-smi-h200.sh.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))
fake = os.path.join(here, "..", "target", "debug", "deps", "libfake_nvml.so")
old, new = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 41
with tempfile.TemporaryDirectory() as empty:
    env = dict(os.environ, VRAMCTL_RUNTIME_DIR=empty)
    times = {old: [], new: []}
    for _ in range(runs):
        for binary in (old, new):
            start = time.perf_counter()
            subprocess.run([binary, "--nvml-lib", fake, "status", "--json"], env=env,
                           stdout=subprocess.DEVNULL, check=True)
            times[binary].append(time.perf_counter() - start)
for label, binary in (("old", old), ("new", new)):
    print(f"{label} {binary}: median {statistics.median(times[binary]) * 1e3:.2f} ms ({runs} runs)")
