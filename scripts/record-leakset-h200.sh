#!/usr/bin/env bash
# Records the second labeled leak set (issue 13) on a GPU machine, and measures the
# recorder's cost beside it (issue 11):
#
#   scripts/record-leakset-h200.sh path/to/vramctl OUTDIR [DURATION_S] [EXTRA_HOLDERS]
#
# The 31 workloads of scripts/workloads/leakset.py (15 "tune", 16 "holdout") run side by
# side for DURATION_S seconds (default 540), with EXTRA_HOLDERS (default 6) small idle
# holders beside them so that at least 30 processes hold GPU memory in the cost window.
# Recorded at once, from one start:
#   leakset-100ms.db   vramctl record --interval 100ms
#   leakset-10s.db     vramctl record --interval 10s
#   smi-apps.csv       nvidia-smi --query-compute-apps=... -l 1   (1 s, a real nvidia-smi log)
#   smi-gpu.csv        nvidia-smi --query-gpu=... -l 1
#   labels.jsonl       the ground truth each workload wrote (common.py's label())
# cost.txt: CPU time (utime+stime from /proc/PID/stat) of the 100 ms and the 1 s recorders
# and of `nvidia-smi --query-compute-apps -lms 100` / `-lms 1000` over the same 60 s window
# (from 30 s to 90 s after the workloads start), with the number of GPU processes then.
# OUTDIR gets gzip'd copies and logs.tar.gz (every workload's stderr, the recorders' logs).
#
# The set was sized for one H200 (143771 MiB), where it peaked at 111.7 GiB: on an H100 80GB
# it would run out of memory for real, and workloads that are no leak would crash. On a GPU
# smaller than that the set's own sizes (each leak's cap, the idle holders, the KV cache)
# scale so that its peak stays at 80 % of the GPU, as on the H200 (leakset.py's
# scale_for_gpu: 1 on an H200, 0.314 on an H100; LEAKSET_MEMORY_SCALE overrides); rates
# and timings stay, so a capped leak ends sooner (the fastest after ~7 s instead of ~20 s).
# memory-scale.txt and the `start` labels say the scale; a GPU under ~70 GiB is refused.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl=$(realpath "$1"); out=$(realpath -m "$2")
export DURATION="${3:-540}"
extra="${4:-6}"
mkdir -p "$out/logs"
total_mib=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1 | tr -d ' ')
if [ -z "${LEAKSET_MEMORY_SCALE:-}" ]; then
  LEAKSET_MEMORY_SCALE=$(cd "$here/workloads" && python3 leakset.py --scale-for-mib "$total_mib") || {
    echo "FAIL the leak set cannot run on this GPU (memory.total '$total_mib' MiB)"
    exit 2
  }
fi
export LEAKSET_MEMORY_SCALE
echo "figure leakset memory scale $LEAKSET_MEMORY_SCALE (GPU 0: $total_mib MiB; 1 = the H200 set's sizes)" |
  tee "$out/memory-scale.txt"
export LABELS="$out/labels.jsonl"
: > "$LABELS"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo NA; }
# utime and stime of each thread of PID, by thread name (comm may hold spaces).
threads() {
  for t in /proc/$1/task/*; do
    printf '%s:%s %s\n' "${t##*/}" "$(tr ' ' '_' < "$t/comm")" "$(sed 's/.*) //' "$t/stat" | awk '{ print $12, $13 }')"
  done
}
clk=$(getconf CLK_TCK)
apps_query=timestamp,gpu_uuid,pid,process_name,used_memory
gpu_query=timestamp,index,uuid,name,memory.total,memory.reserved,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw

"$vramctl" --db "$out/leakset-100ms.db" record --interval 100ms --log-file "$out/logs/record-100ms.log" &
rec100=$!
"$vramctl" --db "$out/leakset-10s.db" record --interval 10s --log-file "$out/logs/record-10s.log" &
rec10s=$!
"$vramctl" --db "$out/cost-1s.db" record --interval 1s --log-file "$out/logs/record-1s.log" &
rec1s=$!
nvidia-smi --query-compute-apps=$apps_query --format=csv -l 1 > "$out/smi-apps.csv" 2> "$out/logs/smi-apps.err" &
smi_apps=$!
nvidia-smi --query-gpu=$gpu_query --format=csv -l 1 > "$out/smi-gpu.csv" 2> "$out/logs/smi-gpu.err" &
smi_gpu=$!
# The baselines of the cost figures: nvidia-smi's own per-process logging at both cadences.
nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 100 > /dev/null 2>&1 &
smi100=$!
nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 1000 > /dev/null 2>&1 &
smi1000=$!
sleep 3

cd "$here/workloads"
names="total-loss kept-outputs detached-cache grad-history after-plateau staircase-eval
  dyn-lognormal grad-accum periodic-eval layer-loader cudnn-autotune idle-holder-tune
  retained-graph hook-activations kv-unbounded tiny-metrics dyn-and-leak late-hook
  dyn-pareto kv-fixed compile-warmup pinned-loader sawtooth-empty-cache lazy-optimizer
  rare-big-batch idle-then-exit fast-logits slow-norms ema-copies exception-frames batch-cache"
pids=()
for w in $names; do
  python3 leakset.py "$w" 2> "$out/logs/$w.log" &
  pids+=($!)
done
holders=()
for i in $(seq 1 "$extra"); do
  python3 -c 'import torch, time, os
x = torch.ones(64 * 2**20, device="cuda")  # 256 MiB
torch.cuda.synchronize()
time.sleep(float(os.environ["DURATION"]))' 2> "$out/logs/holder-$i.log" &
  holders+=($!)
done
cd - > /dev/null

sleep 30
gpu_procs0=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
a0=$(ticks $rec100); b0=$(ticks $rec1s); c0=$(ticks $smi100); d0=$(ticks $smi1000); t0=$(date +%s.%N)
threads $rec100 > "$out/logs/threads-100ms-start.txt"
sleep 5
# Where the 100 ms recorder's time goes: 20 s of a third recorder with every NVML call timed.
VRAMCTL_LOG=vramctl_gpu::backend::nvml=trace "$vramctl" --db "$out/trace.db" record \
  --interval 100ms --duration 20s --log-file "$out/logs/trace.log" &
sleep 55
a1=$(ticks $rec100); b1=$(ticks $rec1s); c1=$(ticks $smi100); d1=$(ticks $smi1000); t1=$(date +%s.%N)
threads $rec100 > "$out/logs/threads-100ms-end.txt"
gpu_procs1=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
rss100=$(awk '/VmHWM/ { print $2 " " $3 }' /proc/$rec100/status)
rss1s=$(awk '/VmHWM/ { print $2 " " $3 }' /proc/$rec1s/status)
kill $smi100 $smi1000 $rec1s 2>/dev/null
{
  echo "window_s $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
  echo "gpu_processes_at_start_and_end_of_window $gpu_procs0 $gpu_procs1"
  # (bc is not on every GPU machine.)
  pct() { awk -v a="$1" -v b="$2" -v c="$clk" -v t0="$t0" -v t1="$t1" 'BEGIN { printf "%.3f", 100 * (b - a) / c / (t1 - t0) }'; }
  echo "record_100ms_cpu_pct $(pct $a0 $a1)"
  echo "record_1s_cpu_pct $(pct $b0 $b1)"
  echo "smi_apps_lms100_cpu_pct $(pct $c0 $c1)"
  echo "smi_apps_lms1000_cpu_pct $(pct $d0 $d1)"
  echo "record_100ms_peak_rss $rss100"
  echo "record_1s_peak_rss $rss1s"
  # user and kernel time of each thread of the 100 ms recorder over the window
  join <(sort "$out/logs/threads-100ms-start.txt") <(sort "$out/logs/threads-100ms-end.txt") |
    awk -v c="$clk" -v t0="$t0" -v t1="$t1" '{ printf "record_100ms_thread %s user_pct %.3f kernel_pct %.3f\n", $1, 100 * ($4 - $2) / c / (t1 - t0), 100 * ($5 - $3) / c / (t1 - t0) }'
  # NVML calls of the traced recorder: calls per second and mean microseconds
  sed 's/\x1b\[[0-9;]*m//g' "$out/logs/trace.log" | awk '/NVML call\./ {
      call = ""; us = ""
      for (i = 1; i <= NF; i++) {
        if ($i ~ /^call=/) { call = substr($i, 6); gsub(/"/, "", call) }
        if ($i ~ /^us=/) { us = substr($i, 4) }
      }
      if (call != "") { n[call]++; total[call] += us }
    }
    END { for (c in n) printf "nvml_call %s calls_per_s %.1f mean_us %.1f us_per_s %.1f\n", c, n[c] / 20, total[c] / n[c], total[c] / 20 }'
} > "$out/cost.txt"
cat "$out/cost.txt"

for p in "${pids[@]}"; do wait "$p"; done
kill "${holders[@]}" 2>/dev/null
sleep 3
kill -TERM $rec100 $rec10s $smi_apps $smi_gpu 2>/dev/null
wait 2>/dev/null
echo "workloads done; labels: $(wc -l < "$LABELS")"
grep -h '"end"' "$LABELS" | python3 -c 'import json,sys
for l in sys.stdin:
    r = json.loads(l); print(r["role"], r.get("reason"))'
cd "$out"
# Whatever a recorder left in its write-ahead log goes into the file that travels.
for f in leakset-100ms.db leakset-10s.db; do
  python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("pragma wal_checkpoint(truncate)")' "$f"
done
for f in leakset-100ms.db leakset-10s.db smi-apps.csv smi-gpu.csv; do gzip -9 -f "$f"; done
rm -f cost-1s.db* trace.db* ./*.lock
tar czf logs.tar.gz logs && rm -rf logs
ls -la "$out"
