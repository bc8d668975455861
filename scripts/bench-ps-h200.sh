#!/usr/bin/env bash
# `vramctl ps` against `vramctl status` on a real GPU while a PyTorch process holds memory
# (issue 30: ps waited for a 200 ms CPU window as soon as any GPU process existed).
#
#   scripts/bench-ps-h200.sh .dist/vramctl [RUNS]
#
# Prints, per command, the median and min-max wall time of RUNS runs (default 21), each the
# whole process timed from python3, and the PIDs each listed beside nvidia-smi's. Needs python3 with torch.
set -euo pipefail
bin=$(realpath "${1:?usage: bench-ps-h200.sh BINARY [RUNS]}")
runs=${2:-21}
ready=$(mktemp -u)
python3 -c "import time,torch; x=torch.empty(1<<30,dtype=torch.uint8,device='cuda'); torch.cuda.synchronize(); open('$ready','w').close(); time.sleep(300)" &
holder=$!
trap 'kill $holder 2>/dev/null; rm -f "$ready"' EXIT
for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
sleep 1
echo "nvidia-smi PIDs: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr '\n' ' ')"
echo "ps --json PIDs: $("$bin" ps --json | python3 -c 'import json,sys; print([p["pid"] for p in json.load(sys.stdin)["processes"]])')"
time_of() { # the median and range of RUNS wall times of "$@" (each a whole process)
  python3 - "$runs" "$@" <<'PY'
import statistics, subprocess, sys, time
runs, cmd = int(sys.argv[1]), sys.argv[2:]
t = []
for _ in range(runs):
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    t.append(time.perf_counter() - start)
print(f"{' '.join(cmd[1:]):<36} median {statistics.median(t):.3f} s  min {min(t):.3f}  max {max(t):.3f}  ({runs} runs)")
PY
}
time_of "$bin" status --json
time_of "$bin" ps --json
time_of "$bin" ps
time_of "$bin" ps --json --cpu-interval 200ms
