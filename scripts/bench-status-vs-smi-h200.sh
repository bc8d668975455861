#!/usr/bin/env bash
# Issue 30's figures on a real GPU: `vramctl status` without a daemon against
# `nvidia-smi --query-gpu=memory.used --format=csv` (and, for context, against nvidia-smi
# asked for the device facts `status` shows), `ps` against `status` while a PyTorch process
# holds memory, and both through a running `vramctl record` daemon.
#
#   scripts/bench-status-vs-smi-h200.sh path/to/vramctl OUTDIR [N]
#
# Fresh processes, interleaved (drift hits every command alike), N runs each (default 21)
# after 3 warm-up rounds; median and min-max of each, and the ratios. Then one traced
# `status --json` (VRAMCTL_LOG=trace: every NVML call timed) to say where the time goes.
# Writes OUTDIR/results.txt and OUTDIR/trace.txt. Needs python3 with torch, nvidia-smi.
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
N=${3:-21}
mkdir -p "$OUT"
work=$(mktemp -d)
holder="" daemon=""
cleanup() {
  for p in $daemon $holder; do kill -TERM "$p" 2> /dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -m 0700 "$work/none"
python3 -c "import time,torch; x=torch.empty(1<<30,dtype=torch.uint8,device='cuda'); torch.cuda.synchronize(); open('$work/ready','w').close(); time.sleep(600)" &
holder=$!
for _ in $(seq 600); do [ -e "$work/ready" ] && break; sleep 0.1; done
VRAMCTL_RUNTIME_DIR="$work/run" "$VRAMCTL" record --db "$work/history.db" --interval 1s \
  2> "$work/record.log" &
daemon=$!
for _ in $(seq 100); do ls "$work/run"/*.sock > /dev/null 2>&1 && break; sleep 0.1; done
sleep 2
python3 - "$N" "$VRAMCTL" "$work" > "$OUT/results.txt" <<'PY'
import os, statistics, subprocess, sys, time
n, vramctl, work = int(sys.argv[1]), sys.argv[2], sys.argv[3]
none = dict(os.environ, VRAMCTL_RUNTIME_DIR=f"{work}/none")
daemon = dict(os.environ, VRAMCTL_RUNTIME_DIR=f"{work}/run")
cmds = {
    "smi": (["nvidia-smi", "--query-gpu=memory.used", "--format=csv"], None),
    # The device facts `status` shows, asked of nvidia-smi (its first calls of utilization,
    # power, temperature and MIG mode pay what status's do): the same work, for context.
    "smi-facts": (["nvidia-smi", "--query-gpu=index,uuid,name,memory.used,memory.total,"
                   "utilization.gpu,power.draw,temperature.gpu,mig.mode.current", "--format=csv"], None),
    # The floor of any vramctl command: exec, relocations, clap (no NVML).
    "version": ([vramctl, "--version"], none),
    "smi-version": (["nvidia-smi", "--version"], None),
    "status": ([vramctl, "status", "--json"], none),
    "status-text": ([vramctl, "status"], none),
    "ps": ([vramctl, "ps", "--json"], none),
    "status-daemon": ([vramctl, "status", "--json"], daemon),
    "ps-daemon": ([vramctl, "ps", "--json"], daemon),
}
t = {k: [] for k in cmds}
for r in range(n + 3):
    for k, (argv, env) in cmds.items():
        s = time.perf_counter()
        p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        e = time.perf_counter() - s
        if p.returncode != 0:
            print(f"# {k} exit {p.returncode}: {p.stderr.decode()[:200]}")
        if r >= 3:
            t[k].append(e)
med = {k: statistics.median(v) for k, v in t.items()}
for k, v in t.items():
    print(f"{k} median_ms {med[k]*1e3:.1f} min_ms {min(v)*1e3:.1f} max_ms {max(v)*1e3:.1f} runs {len(v)}")
print(f"ratio status/smi {med['status']/med['smi']:.2f}")
print(f"ratio status-text/smi {med['status-text']/med['smi']:.2f}")
print(f"ratio status/smi-facts {med['status']/med['smi-facts']:.2f}")
print(f"ratio ps/status {med['ps']/med['status']:.2f}")
print(f"ratio status-daemon/smi {med['status-daemon']/med['smi']:.3f}")
print(f"ratio ps-daemon/smi {med['ps-daemon']/med['smi']:.3f}")
print(f"start-up floor: vramctl --version {med['version']*1e3:.1f} ms, nvidia-smi --version {med['smi-version']*1e3:.1f} ms; "
      f"status less its floor {(med['status']-med['version'])*1e3:.1f} ms, smi less its floor {(med['smi']-med['smi-version'])*1e3:.1f} ms")
PY
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >> "$OUT/results.txt"
VRAMCTL_RUNTIME_DIR="$work/none" VRAMCTL_LOG=trace "$VRAMCTL" status --json > /dev/null 2> "$OUT/trace.txt" || true
# Where that status's time went: every NVML call is logged with its time at trace level.
python3 - "$OUT/trace.txt" > "$OUT/trace-top.txt" <<'PY' || true
import re, sys
from datetime import datetime
calls, stamps = [], []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"(\S+Z) ", line)
    if m:
        stamps.append(datetime.fromisoformat(m.group(1).replace("Z", "+00:00")))
    c = re.search(r'call="([^"]+)" us=(\d+)', line)
    if c:
        calls.append((int(c.group(2)), c.group(1)))
total = sum(us for us, _ in calls)
span = (stamps[-1] - stamps[0]).total_seconds() * 1e6 if len(stamps) > 1 else 0
print(f"NVML calls: {len(calls)}, {total / 1e3:.2f} ms in all; first to last log line {span / 1e3:.2f} ms")
for us, name in sorted(calls, reverse=True)[:20]:
    print(f"{us:8d} us  {name}")
PY
echo "--- where status's time went (trace-top.txt):"; cat "$OUT/trace-top.txt"
# Where the time outside the log goes (spawn -> first log line, last log line -> exit).
python3 "$(dirname "$0")/status-timeline.py" "$VRAMCTL" 21 > "$OUT/timeline.txt" || true
echo "--- spawn/log/exit timeline (timeline.txt):"; cat "$OUT/timeline.txt"
cat "$OUT/results.txt"
