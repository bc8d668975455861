#!/usr/bin/env bash
# `vramctl serve` against the real driver, checked against nvidia-smi (issue 7).
#
#   scripts/serve-h200.sh path/to/vramctl OUTDIR
#
# 1. Starts a PyTorch process holding 4 GiB (so there is a process to attribute).
# 2. Starts `vramctl serve` on loopback, scrapes /metrics, and reads nvidia-smi right after;
#    prints a comparison of total/used/free memory per GPU and of PIDs and their memory
#    (nvidia-smi rounds to MiB: a difference under 1 MiB is equal). Exit status 1 when they
#    disagree.
# 3. Measures the daemon's CPU over 60 s at --interval 1 with one scrape per second, and its
#    RSS; runs `promtool check metrics` on the scrape when promtool is installed.
# 4. Leak and idle verdicts from the daemon's live analysis (it runs with --idle-for 60s):
#    starts scripts/workloads/leak_fast.py (flat after a 60 s warm-up, then keeps 134 MB/s)
#    and idle_holder.py (12 GiB, then sleeps), scrapes every 5 s (up to 300 s) until
#    vramctl_process_leak is 1 for leak_fast and vramctl_process_idle_holder 1 for
#    idle_holder, and writes metrics-verdicts.txt (that scrape) and verdicts.txt: each
#    workload's verdict series, when each first showed, and whether the flat 4 GiB holder
#    stayed vramctl_process_leak 0. Exit status 1 when a verdict is missing or wrong.
# Everything lands in OUTDIR (metrics.txt, smi-*.csv, comparison.txt, summary.txt,
# metrics-verdicts.txt, verdicts.txt, labels.jsonl).
# Not -e: a disagreement (exit 1 of the comparison) must not skip the steps after it.
set -uo pipefail
vramctl=$(realpath "$1"); out=$2
mkdir -p "$out"

python3 - <<'PY' &
import time, torch
x = torch.ones(4 * 1024**3 // 4, device="cuda")
torch.cuda.synchronize()
open("/tmp/vramctl-serve-check.ready", "w").close()
time.sleep(900)
PY
holder=$!
"$vramctl" serve --listen 127.0.0.1:0 --interval 1 --idle-for 60s 2> "$out/serve.log" &
serve=$!
leak=; idle=
trap 'kill $holder $serve $leak $idle 2>/dev/null || true; rm -f /tmp/vramctl-serve-check.ready' EXIT
for _ in $(seq 600); do [ -e /tmp/vramctl-serve-check.ready ] && break; sleep 0.1; done
for _ in $(seq 100); do grep -q serving "$out/serve.log" && break; sleep 0.1; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$out/serve.log" | head -1)
# Let one more sample land after the holder's allocation.
sleep 2.5

curl -s "http://$addr/metrics" > "$out/metrics.txt"
nvidia-smi --query-gpu=index,uuid,memory.total,memory.reserved,memory.used,memory.free \
  --format=csv,noheader,nounits > "$out/smi-gpu.csv"
nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits \
  > "$out/smi-apps.csv"
if command -v promtool >/dev/null; then
  promtool check metrics < "$out/metrics.txt" > "$out/promtool.txt" 2>&1 \
    && echo "promtool check metrics: ok" | tee "$out/summary.txt" \
    || echo "promtool check metrics: FAILED (see promtool.txt)" | tee "$out/summary.txt"
fi

python3 - "$out" "$holder" <<'PY' | tee "$out/comparison.txt"
import re, sys
out, holder = sys.argv[1], sys.argv[2]
MiB = 1024 * 1024
series = {}
for line in open(f"{out}/metrics.txt"):
    m = re.match(r'^(\w+)\{([^}]*)\} (\S+)$', line.strip())
    if m:
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
        series.setdefault(m.group(1), []).append((labels, float(m.group(3))))
def value(name, **want):
    for labels, v in series.get(name, []):
        if all(labels.get(k) == w for k, w in want.items()):
            return v
    return None
ok = True
def check(what, ours_bytes, smi_mib):
    global ok
    same = ours_bytes is not None and abs(ours_bytes / MiB - smi_mib) < 1.0
    ok &= same
    ours = "absent" if ours_bytes is None else f"{ours_bytes / MiB:.1f} MiB"
    print(f"{'ok  ' if same else 'DIFF'} {what}: vramctl {ours}, nvidia-smi {smi_mib} MiB")
for row in open(f"{out}/smi-gpu.csv"):
    index, uuid, total, reserved, used, free = [c.strip() for c in row.split(",")]
    print(f"GPU {index} {uuid}")
    check("total", value("vramctl_device_memory_total_bytes", uuid=uuid), float(total))
    check("reserved", value("vramctl_device_memory_reserved_bytes", uuid=uuid), float(reserved))
    check("used", value("vramctl_device_memory_used_bytes", uuid=uuid), float(used))
    check("free", value("vramctl_device_memory_free_bytes", uuid=uuid), float(free))
    up = value("vramctl_device_up", uuid=uuid)
    print(f"{'ok  ' if up == 1 else 'DIFF'} vramctl_device_up = {up}")
    ok &= up == 1
smi_pids = set()
for row in open(f"{out}/smi-apps.csv"):
    if not row.strip():
        continue
    uuid, pid, used = [c.strip() for c in row.split(",")]
    smi_pids.add((uuid, pid))
    check(f"pid {pid} on {uuid}", value("vramctl_process_memory_used_bytes", uuid=uuid, pid=pid), float(used))
ours_pids = {(l["uuid"], l["pid"]) for l, _ in series.get("vramctl_process_memory_used_bytes", [])}
extra = ours_pids - smi_pids
if extra:
    ok = False
    print(f"DIFF vramctl lists pids nvidia-smi does not: {sorted(extra)}")
holder_seen = any(pid == holder for _, pid in ours_pids)
print(f"{'ok  ' if holder_seen else 'DIFF'} the 4 GiB PyTorch holder (pid {holder}) has a series")
ok &= holder_seen
for labels, _ in series.get("vramctl_process_memory_used_bytes", []):
    if labels["pid"] == holder:
        print(f"     labels: {labels}")
print("AGREE" if ok else "DISAGREE")
sys.exit(0 if ok else 1)
PY
status=${PIPESTATUS[0]}

pid=$serve
ticks=$(getconf CLK_TCK)
c0=$(awk '{print $14 + $15}' /proc/$pid/stat); t0=$(date +%s.%N)
for _ in $(seq 60); do curl -s -o /dev/null "http://$addr/metrics"; sleep 1; done
c1=$(awk '{print $14 + $15}' /proc/$pid/stat); t1=$(date +%s.%N)
awk -v a="$c0" -v b="$c1" -v s="$t0" -v e="$t1" -v hz="$ticks" \
  'BEGIN { printf "cpu: %.3f%% of a core over %.1f s at --interval 1 with 1 scrape/s\n", 100*(b-a)/hz/(e-s), e-s }' \
  | tee -a "$out/summary.txt"
grep -E "VmRSS|VmHWM" /proc/$pid/status | tee -a "$out/summary.txt"
grep -E "^vramctl_sample_duration_seconds " "$out/metrics.txt" | tee -a "$out/summary.txt"

# 4. Verdicts from the live analysis, on real leaking and idle PyTorch processes.
here=$(cd "$(dirname "$0")" && pwd)
export LABELS="$out/labels.jsonl" DURATION=420
cd "$here/workloads"
python3 leak_fast.py 2> "$out/leak_fast.log" &
leak=$!
python3 idle_holder.py 2> "$out/idle_holder.log" &
idle=$!
cd - > /dev/null
t0=$(date +%s)
found=0
for _ in $(seq 60); do
  sleep 5
  curl -s "http://$addr/metrics" > "$out/metrics-verdicts.txt"
  elapsed=$(( $(date +%s) - t0 ))
  grep -qE "^vramctl_process_leak\{[^}]*pid=\"$leak\"[^}]*\} 1$" "$out/metrics-verdicts.txt" \
    && [ -z "${leak_at:-}" ] && leak_at=$elapsed
  grep -qE "^vramctl_process_idle_holder\{[^}]*pid=\"$idle\"[^}]*\} 1$" "$out/metrics-verdicts.txt" \
    && [ -z "${idle_at:-}" ] && idle_at=$elapsed
  if [ -n "${leak_at:-}" ] && [ -n "${idle_at:-}" ]; then found=1; break; fi
done
{
  echo "leak_fast (pid $leak): vramctl_process_leak 1 after ${leak_at:-never} s (its leak starts at 60 s)"
  echo "idle_holder (pid $idle): vramctl_process_idle_holder 1 after ${idle_at:-never} s (--idle-for 60s)"
  for p in "$leak" "$idle" "$holder"; do
    grep -E "^vramctl_process_(leak|leak_slope_bytes_per_second|idle_holder|idle_seconds)\{[^}]*pid=\"$p\"" \
      "$out/metrics-verdicts.txt" || echo "(no verdict series for pid $p)"
  done
  if grep -qE "^vramctl_process_leak\{[^}]*pid=\"$holder\"[^}]*\} 0$" "$out/metrics-verdicts.txt"; then
    echo "ok   the flat 4 GiB holder (pid $holder): vramctl_process_leak 0"
  else
    echo "DIFF the flat 4 GiB holder (pid $holder): no vramctl_process_leak 0"; found=0
  fi
} | tee "$out/verdicts.txt"
[ "$found" = 1 ] || status=1
exit "$status"
