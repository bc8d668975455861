#!/usr/bin/env bash
# The recorder's CPU beside many PyTorch processes on a real GPU (issue 11), against
# nvidia-smi doing the same job. To run on the H200 machine:
#
#   scripts/bench-recorder-h200.sh path/to/vramctl OUTDIR [N] [SECONDS]
#
# N (default 30) small PyTorch processes (scripts/workloads/small_holder.py: 512 MiB each,
# a small kernel every 2 s) are started and left running; once the driver lists all of
# them, each of these runs alone beside them for SECONDS (default 60, at least 60):
#
#   1. vramctl record --interval 100ms
#   2. nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 100
#   3. vramctl record --interval 1s
#   4. nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 1000
#
# CPU is utime and stime of the process from /proc/PID/stat (fields 14 and 15), read 5 s
# after it started and SECONDS later, as a share of one core (user and kernel apart,
# since the H200's 3.5 % at 11 processes was almost all kernel time). Set
# VRAMCTL_BASELINE=path/to/older/vramctl to measure that binary the same way (1 and 3).
#
# Then, to say where the time goes (not part of the figures):
#   5. 20 s of `record --interval 100ms` with NVML calls timed at trace level
#      (VRAMCTL_LOG=vramctl_core::backend::nvml=trace): mean µs and calls per second of
#      each NVML function -> OUTDIR/nvml-calls-100ms.txt
#   6. where strace is installed, 20 s of the same under `strace -c -f` (syscall counts
#      and times) -> OUTDIR/strace-100ms.txt, and the /proc files it opened, by kind ->
#      OUTDIR/proc-opens-100ms.txt
#
# Writes OUTDIR/summary.txt (one `name value` per line, goals beside the figures:
# <= 1 % of a core at 100 ms, <= 0.2 % at 1 s with 30 processes), OUTDIR/runs.txt (every
# run's raw ticks), the driver's process list before and after (apps-*.csv), each run's
# recorder log and database, and the holders' logs.
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
N=${3:-30}
SECS=${4:-60}
BASELINE=${VRAMCTL_BASELINE:+$(realpath "$VRAMCTL_BASELINE")}
if (( SECS < 60 )); then
  echo "SECONDS must be at least 60 (CPU time moves in 10 ms ticks)" >&2
  exit 2
fi
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
command -v nvidia-smi > /dev/null || { echo "needs nvidia-smi" >&2; exit 2; }
python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null \
  || { echo "needs python3 with a CUDA build of torch" >&2; exit 2; }

clk=$(getconf CLK_TCK)
# utime stime of PID (fields 14 and 15, counted after the last ')': comm may hold spaces).
cpu_of() { sed 's/.*) //' "/proc/$1/stat" | awk '{ print $12, $13 }'; }

holders=()
cleanup() {
  for p in "${holders[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${holders[@]}"; do wait "$p" 2> /dev/null || true; done
}
trap cleanup EXIT

echo "== starting $N PyTorch holders"
rm -f "$OUT/labels.jsonl"
for i in $(seq "$N"); do
  (cd scripts/workloads && LABELS="$OUT/labels.jsonl" DURATION=100000 HOLD_MIB=512 \
    exec python3 small_holder.py) > "$OUT/holder-$i.log" 2>&1 &
  holders+=($!)
done
listed=0
for _ in $(seq 300); do
  listed=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . || true)
  (( listed >= N )) && break
  sleep 1
done
if (( listed < N )); then
  echo "only $listed of $N holders are on the GPU after 300 s; see $OUT/holder-*.log" >&2
  exit 2
fi
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/apps-before.csv"
echo "   $listed processes on the GPU"

: > "$OUT/runs.txt"
: > "$OUT/summary.txt"
# stop PID: SIGTERM, then SIGKILL if it is still there after 10 s; reaps it.
stop() {
  kill -TERM "$1" 2> /dev/null || true
  for _ in $(seq 100); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
}

# measure NAME COMMAND...: runs COMMAND beside the holders, prints NAME's CPU shares.
measure() {
  local name=$1
  shift
  "$@" > "$OUT/$name.out" 2> "$OUT/$name.err" &
  local pid=$!
  sleep 5
  read -r u0 s0 < <(cpu_of "$pid")
  local t0
  t0=$(date +%s.%N)
  sleep "$SECS"
  read -r u1 s1 < <(cpu_of "$pid")
  local t1
  t1=$(date +%s.%N)
  local rss
  rss=$(awk '/VmHWM/ { print $2 }' "/proc/$pid/status")
  # TERM, not INT: a job started with `&` in a script ignores SIGINT unless it installs
  # a handler of its own. vramctl flushes and exits 0 on either.
  stop "$pid"
  echo "$name pid=$pid utime=$u0..$u1 stime=$s0..$s1 window=$t0..$t1 clk=$clk" >> "$OUT/runs.txt"
  awk -v n="$name" -v u0="$u0" -v u1="$u1" -v s0="$s0" -v s1="$s1" -v t0="$t0" -v t1="$t1" \
      -v clk="$clk" -v rss="$rss" 'BEGIN {
    w = t1 - t0; u = (u1 - u0) / clk; s = (s1 - s0) / clk
    printf "%s_cpu_percent %.3f\n%s_user_percent %.3f\n%s_kernel_percent %.3f\n%s_peak_rss_kib %s\n",
      n, 100 * (u + s) / w, n, 100 * u / w, n, 100 * s / w, n, rss }' | tee -a "$OUT/summary.txt"
}

record() {
  local bin=$1 interval=$2 name=$3
  rm -f "$OUT/$name.db"*
  measure "$name" "$bin" --db "$OUT/$name.db" record --interval "$interval" \
    --log-file "$OUT/$name.log"
}

echo "== CPU over $SECS s each, beside $N processes"
record "$VRAMCTL" 100ms vramctl_record_100ms
measure nvidia_smi_apps_lms100 \
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 100
record "$VRAMCTL" 1s vramctl_record_1s
measure nvidia_smi_apps_lms1000 \
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 1000
if [[ -n "$BASELINE" ]]; then
  record "$BASELINE" 100ms baseline_record_100ms
  record "$BASELINE" 1s baseline_record_1s
fi
{
  echo "processes_on_gpu $listed"
  echo "window_s $SECS"
  echo "goal_record_100ms_cpu_percent 1.0"
  echo "goal_record_1s_cpu_percent 0.2"
} | tee -a "$OUT/summary.txt"

echo "== where the time goes (20 s at 100 ms)"
rm -f "$OUT/trace.db"* "$OUT/trace.log"
VRAMCTL_LOG=vramctl_core::backend::nvml=trace timeout -s TERM 25 \
  "$VRAMCTL" --db "$OUT/trace.db" record --interval 100ms --duration 20s \
  --log-file "$OUT/trace.log" || true
sed 's/\x1b\[[0-9;]*m//g' "$OUT/trace.log" | awk -v secs=20 '
  /NVML call\./ {
    call = ""; us = ""
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^call=/) { call = substr($i, 6); gsub(/"/, "", call) }
      if ($i ~ /^us=/) { us = substr($i, 4) }
    }
    if (call != "") { n[call]++; total[call] += us }
  }
  END {
    for (c in n) printf "%-45s %10.1f %10.1f %12.1f\n", c, n[c] / secs, total[c] / n[c], total[c] / secs
  }' | sort -k4 -n -r > "$OUT/nvml-calls.tmp"
{
  printf "%-45s %10s %10s %12s\n" call calls/s mean_us us_per_s
  cat "$OUT/nvml-calls.tmp"
} > "$OUT/nvml-calls-100ms.txt"
rm -f "$OUT/nvml-calls.tmp"
cat "$OUT/nvml-calls-100ms.txt"
if command -v strace > /dev/null; then
  rm -f "$OUT/strace.db"*
  timeout -s TERM 25 strace -f -c -o "$OUT/strace-100ms.txt" \
    "$VRAMCTL" --db "$OUT/strace.db" record --interval 100ms --duration 20s \
    --log-file "$OUT/strace.log" || true
  rm -f "$OUT/strace2.db"*
  timeout -s TERM 25 strace -f -e trace=openat -o "$OUT/openat-100ms.trace" \
    "$VRAMCTL" --db "$OUT/strace2.db" record --interval 100ms --duration 20s \
    --log-file "$OUT/strace2.log" || true
  grep -o '"/proc/[^"]*"' "$OUT/openat-100ms.trace" | sed -E 's/[0-9]+/N/g' | sort | uniq -c \
    | sort -rn > "$OUT/proc-opens-100ms.txt" || true
  head -20 "$OUT/strace-100ms.txt"
fi
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$OUT/apps-after.csv"
echo "== summary ($OUT/summary.txt)"
cat "$OUT/summary.txt"
