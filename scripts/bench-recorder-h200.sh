#!/usr/bin/env bash
# The recorder's CPU beside many PyTorch processes on a real GPU (issue 11), against
# nvidia-smi doing the same job. To run on the H200 machine:
#
#   scripts/bench-recorder-h200.sh path/to/vramctl OUTDIR [N] [SECONDS]
#
# N (default 30) small PyTorch processes (scripts/workloads/small_holder.py: 512 MiB each,
# a small kernel every 2 s) are started and left running; once the driver lists all of
# them, three windows of SECONDS (default 45, at least 30) each follow, 3 s after their
# processes started:
#
#   1. vramctl record --interval 100ms                      (alone beside the holders)
#   2. vramctl record --interval 1s                         (alone beside the holders)
#   3. nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 100 and -lms 1000,
#      side by side, and during the first 20 s a recorder at 100 ms with every NVML call
#      timed (VRAMCTL_LOG=vramctl_gpu::backend::nvml=trace), to say where the time goes.
#      nvidia-smi's figures are for comparison, not a goal, so they share their window.
#
# CPU is utime and stime of each process from /proc/PID/stat (fields 14 and 15, user and
# kernel apart: on the H200 the recorder's time was nearly all kernel time, the driver's
# ioctls), read at the start and the end of its window, as a share of one core; for the
# 100 ms recorder per thread too. The counters move in 10 ms ticks: over 45 s one tick is
# 0.022 % of a core, fine enough for goals of 1 % and 0.2 %. With N = 30 the whole script
# takes about 200 s, most of it the holders' start-up and the three windows (it prints
# its time at the end). Set VRAMCTL_BASELINE=path/to/older/vramctl to measure that binary
# too: it runs beside the new one in windows 1 and 2 (same machine, same moment).
#
# Needs nvidia-smi, python3 with a CUDA build of torch, awk, coreutils; no strace, perf or
# bc. Paths without spaces. Writes three files to OUTDIR: summary.txt (one `name value` per line, goals beside
# the figures: <= 1 % of a core at 100 ms, <= 0.2 % at 1 s with 30 processes),
# nvml-calls-100ms.txt (calls per second and per tick, mean µs and µs per second of each
# NVML function in the traced run) and raw.tar.gz (every run's raw counters, logs and
# database, the driver's process list before and after, the holders' logs).
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
N=${3:-30}
SECS=${4:-45}
BASELINE=${VRAMCTL_BASELINE:+$(realpath "$VRAMCTL_BASELINE")}
TRACE_S=20
SETTLE_S=3
if (( SECS < 30 )); then
  echo "SECONDS must be at least 30 (CPU time moves in 10 ms ticks)" >&2
  exit 2
fi
command -v nvidia-smi > /dev/null || { echo "needs nvidia-smi" >&2; exit 2; }
python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null \
  || { echo "needs python3 with a CUDA build of torch" >&2; exit 2; }
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/nvml-calls-100ms.txt" "$OUT/raw.tar.gz"
WORK=$(mktemp -d "$OUT/.raw.XXXXXX")
cd "$(dirname "$0")/.."
clk=$(python3 -c 'import os; print(os.sysconf("SC_CLK_TCK"))')
# utime stime of a /proc stat file (fields 14 and 15, counted after the last ')': comm may
# hold spaces).
cpu_of() { sed 's/.*) //' "$1" | awk '{ print $12, $13 }'; }
now() { date +%s.%N; }

holders=()
running=()
finish() {
  for p in "${running[@]}" "${holders[@]}"; do kill "$p" 2> /dev/null || true; done
  for p in "${running[@]}" "${holders[@]}"; do wait "$p" 2> /dev/null || true; done
  # Everything but the two summaries goes into one archive.
  python3 - "$WORK" "$OUT/raw.tar.gz" << 'EOF' || true
import sys, tarfile
with tarfile.open(sys.argv[2], "w:gz") as tar:
    tar.add(sys.argv[1], arcname="raw")
EOF
  rm -rf "$WORK"
}
trap finish EXIT

summary() { tee -a "$OUT/summary.txt"; }
{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "vramctl_version $("$VRAMCTL" --version 2> /dev/null | head -1)"
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
  echo "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  echo "gpu $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
} | summary

echo "== starting $N PyTorch holders"
for i in $(seq "$N"); do
  (cd scripts/workloads && LABELS="$WORK/labels.jsonl" DURATION=100000 HOLD_MIB=512 \
    exec python3 small_holder.py) > "$WORK/holder-$i.log" 2>&1 &
  holders+=($!)
done
listed=0
for _ in $(seq 150); do
  listed=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . || true)
  (( listed >= N )) && break
  sleep 1
done
if (( listed < N )); then
  echo "only $listed of $N holders are on the GPU after 150 s; see the holders' logs in $OUT/raw.tar.gz" >&2
  exit 2
fi
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$WORK/apps-before.csv"
echo "processes_on_gpu $listed" | summary
echo "holders_ready_after_s $SECONDS" | summary

# stop PID: SIGTERM (vramctl flushes and exits 0), SIGKILL after 10 s; reaps it.
stop() {
  kill -TERM "$1" 2> /dev/null || true
  for _ in $(seq 100); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2> /dev/null || true
  wait "$1" 2> /dev/null || true
}

# window NAME=COMMAND... : starts every command (each `name|command words`), waits
# SETTLE_S, reads their CPU, waits SECS, reads again, stops them, prints the shares.
# During the window the function `during` (if set) runs in the foreground first.
window() {
  local names=() pids=() u0=() s0=() t0 t1 i
  for spec in "$@"; do
    local name=${spec%%|*} cmd=${spec#*|}
    # shellcheck disable=SC2086 # the command's words
    $cmd > "$WORK/$name.out" 2> "$WORK/$name.err" &
    names+=("$name")
    pids+=($!)
    running+=($!)
  done
  sleep "$SETTLE_S"
  for i in "${!pids[@]}"; do
    read -r u s < <(cpu_of "/proc/${pids[$i]}/stat")
    u0+=("$u")
    s0+=("$s")
    for task in /proc/"${pids[$i]}"/task/*; do
      echo "${names[$i]} start $(cat "$task/comm") $(cpu_of "$task/stat")"
    done >> "$WORK/threads.txt"
  done
  t0=$(now)
  if declare -F during > /dev/null; then during; fi
  local left
  left=$(awk -v t0="$t0" -v t="$(now)" -v w="$SECS" 'BEGIN { d = w - (t - t0); print (d > 0 ? d : 0) }')
  sleep "$left"
  t1=$(now)
  for i in "${!pids[@]}"; do
    local pid=${pids[$i]} name=${names[$i]} u1 s1 rss
    read -r u1 s1 < <(cpu_of "/proc/$pid/stat")
    rss=$(awk '/VmHWM/ { print $2 }' "/proc/$pid/status")
    for task in /proc/"$pid"/task/*; do
      echo "$name end $(cat "$task/comm") $(cpu_of "$task/stat")"
    done >> "$WORK/threads.txt"
    echo "$name pid=$pid utime=${u0[$i]}..$u1 stime=${s0[$i]}..$s1 window=$t0..$t1 clk=$clk" \
      >> "$WORK/runs.txt"
    awk -v n="$name" -v u0="${u0[$i]}" -v u1="$u1" -v s0="${s0[$i]}" -v s1="$s1" \
        -v t0="$t0" -v t1="$t1" -v clk="$clk" -v rss="$rss" 'BEGIN {
      w = t1 - t0; u = (u1 - u0) / clk; s = (s1 - s0) / clk
      printf "%s_cpu_percent %.3f\n%s_user_percent %.3f\n%s_kernel_percent %.3f\n%s_peak_rss_kib %s\n",
        n, 100 * (u + s) / w, n, 100 * u / w, n, 100 * s / w, n, rss }' | summary
  done
  for pid in "${pids[@]}"; do stop "$pid"; done
  running=()
  unset -f during
}

# The 100 ms recorder's time per thread (sampler, writer, ...), from threads.txt.
per_thread() {
  awk -v n="$1" -v w="$SECS" -v clk="$clk" '
    $1 == n && $2 == "start" { u[$3] = $4; s[$3] = $5 }
    $1 == n && $2 == "end" && ($3 in u) {
      printf "%s_thread %s user_percent %.3f kernel_percent %.3f\n", n, $3,
        100 * ($4 - u[$3]) / clk / w, 100 * ($5 - s[$3]) / clk / w
    }' "$WORK/threads.txt" | summary
}

record_cmd() { # BIN INTERVAL NAME
  echo "$3|$1 --db $WORK/$3.db record --interval $2 --log-file $WORK/$3.log"
}

echo "== CPU over $SECS s per window, beside $listed processes"
specs=("$(record_cmd "$VRAMCTL" 100ms vramctl_record_100ms)")
[[ -n "$BASELINE" ]] && specs+=("$(record_cmd "$BASELINE" 100ms baseline_record_100ms)")
window "${specs[@]}"
per_thread vramctl_record_100ms

specs=("$(record_cmd "$VRAMCTL" 1s vramctl_record_1s)")
[[ -n "$BASELINE" ]] && specs+=("$(record_cmd "$BASELINE" 1s baseline_record_1s)")
window "${specs[@]}"

# The traced recorder runs in nvidia-smi's window, in the foreground, for TRACE_S.
during() {
  VRAMCTL_LOG=vramctl_gpu::backend::nvml=trace timeout -s TERM $((TRACE_S + 5)) \
    "$VRAMCTL" --db "$WORK/trace.db" record --interval 100ms --duration "${TRACE_S}s" \
    --log-file "$WORK/trace.log" > /dev/null 2>&1 || true
}
window "nvidia_smi_apps_lms100|nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 100" \
  "nvidia_smi_apps_lms1000|nvidia-smi --query-compute-apps=pid,used_memory --format=csv -lms 1000"

{
  echo "window_s $SECS"
  echo "goal_record_100ms_cpu_percent 1.0"
  echo "goal_record_1s_cpu_percent 0.2"
} | summary
awk '
  $1 == "vramctl_record_100ms_cpu_percent" { printf "record_100ms_meets_goal %s\n", ($2 <= 1.0 ? "yes" : "no") }
  $1 == "vramctl_record_1s_cpu_percent" { printf "record_1s_meets_goal %s\n", ($2 <= 0.2 ? "yes" : "no") }
' "$OUT/summary.txt" | summary

echo "== where the time goes (the traced ${TRACE_S} s at 100 ms)"
sed 's/\x1b\[[0-9;]*m//g' "$WORK/trace.log" > "$WORK/trace.plain.log"
# Ticks: one device count per tick (plus one at start-up).
ticks=$(grep -c 'call="nvmlDeviceGetCount_v2"' "$WORK/trace.plain.log" || true)
awk -v secs="$TRACE_S" -v ticks="$ticks" '
  /NVML call\./ {
    call = ""; us = ""
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^call=/) { call = substr($i, 6); gsub(/"/, "", call) }
      if ($i ~ /^us=/) { us = substr($i, 4) }
    }
    if (call != "") { n[call]++; total[call] += us }
  }
  END {
    for (c in n)
      printf "%-45s %10.2f %10.3f %10.1f %12.1f\n", c, n[c] / secs, n[c] / (ticks > 0 ? ticks : 1),
        total[c] / n[c], total[c] / secs
  }' "$WORK/trace.plain.log" | sort -k5 -n -r > "$WORK/nvml-calls.tmp"
{
  printf "%-45s %10s %10s %10s %12s\n" call calls/s calls/tick mean_us us_per_s
  cat "$WORK/nvml-calls.tmp"
} > "$OUT/nvml-calls-100ms.txt"
cat "$OUT/nvml-calls-100ms.txt"
{
  echo "trace_ticks $ticks"
  # Why the lists were read when they were (the rest of the ticks reused them).
  grep 'Reading the process lists\.' "$WORK/trace.plain.log" | grep -o 'why="[^"]*"' \
    | sed 's/^why="//; s/"$//; s/ /_/g' | sort | uniq -c \
    | awk '{ print "trace_list_reads_" $2, $1 }' || true
  awk '{ s += $5 } END { printf "trace_nvml_us_per_s %.1f\n", s }' "$WORK/nvml-calls.tmp"
} | summary
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$WORK/apps-after.csv"
echo "elapsed_s $SECONDS" | summary
echo "== summary ($OUT/summary.txt; raw data in $OUT/raw.tar.gz)"
