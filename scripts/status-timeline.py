#!/usr/bin/env python3
"""Where a one-shot `vramctl status --json` spends its time outside NVML (issue 30).

    python3 scripts/status-timeline.py BINARY [RUNS] [--nvml-lib PATH]

RUNS (default 21) fresh `status --json` with VRAMCTL_LOG=trace and no daemon (an empty
runtime directory), each timed on the log's clock (the wall clock) from the spawn to the
first log line (exec, loader, clap, zone, logging, the daemon socket checks), between the
first and the last log line (NVML's calls are in there), and from the last log line to the
exit (printing, the libraries' exit handlers, the kernel's release of the device files).
Prints the median, min and max of each span. With --nvml-lib (and FAKE_NVML_SCENARIO for
the fake library, target/debug/deps/libfake_nvml.so) it measures without a GPU;
scripts/bench-status-vs-smi-h200.sh runs it on the real driver.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime


def main():
    args = sys.argv[1:]
    lib = []
    if "--nvml-lib" in args:
        i = args.index("--nvml-lib")
        lib = ["--nvml-lib", os.path.abspath(args[i + 1])]
        del args[i:i + 2]
    if not args:
        raise SystemExit("usage: status-timeline.py BINARY [RUNS] [--nvml-lib PATH]")
    binary, runs = args[0], int(args[1]) if len(args) > 1 else 21
    pre, inside, post, wall = [], [], [], []
    with tempfile.TemporaryDirectory() as empty:
        env = dict(os.environ, VRAMCTL_RUNTIME_DIR=empty, VRAMCTL_LOG="trace")
        for _ in range(runs):
            t0 = time.time()
            p = subprocess.run([binary, *lib, "status", "--json"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            t1 = time.time()
            stamps = [datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()
                      for line in p.stderr.decode(errors="replace").splitlines() if line[:4].isdigit()]
            if p.returncode != 0 or len(stamps) < 2:
                print(f"# exit {p.returncode}, {len(stamps)} log lines")
                continue
            pre.append(stamps[0] - t0)
            inside.append(stamps[-1] - stamps[0])
            post.append(t1 - stamps[-1])
            wall.append(t1 - t0)
    for name, v in (("spawn->first log line", pre), ("first->last log line", inside),
                    ("last log line->exit", post), ("wall (traced)", wall)):
        if v:
            print(f"{name}: median {statistics.median(v) * 1e3:.2f} ms, min {min(v) * 1e3:.2f}, "
                  f"max {max(v) * 1e3:.2f}, runs {len(v)}")


if __name__ == "__main__":
    main()
