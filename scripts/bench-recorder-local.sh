#!/usr/bin/env bash
# The recorder's CPU beside N real processes, on the fake NVML library (no GPU needed):
#
#   scripts/bench-recorder-local.sh VRAMCTL LIBFAKE OUTDIR [N] [SECONDS] [REAL]
#
# Starts N `sleep` processes, writes a fake-NVML scenario with one H200-like GPU on which
# each of them holds 1 GiB (`real = REAL`, default true: the fake reads /proc/PID/stat of
# each at every process-list and memory call, as it must to notice an exit; `false` keeps
# the fake off /proc, so only vramctl's own /proc reads remain), and runs
# `vramctl record --interval 100ms` and `--interval 1s` beside them, one after the other.
# For each: utime + stime of the recorder from /proc/PID/stat (fields 14 and 15) at 5 s
# after start and SECONDS later, as a share of one core; then the same run for 10 s under
# `strace -c -f`, for the syscall counts. Results: OUTDIR/summary.txt (one line per
# interval) and OUTDIR/strace-<interval>.txt.
#
# Several VRAMCTL binaries (before/after) may be given separated by commas; they run at the
# same time beside the same processes, so they see the same machine.
#
# First, what each binary asks the driver per tick (no CPU figure, so it runs on any
# machine in seconds): `record --ticks 600 --simulated-clock` at 100 ms and at 1 s on the
# same GPU with N constant processes (`real = false`), busy (utilization 40 %) and with
# per-process utilization answering NOT_FOUND as on the H200, then answering samples; the
# fake counts every call (FAKE_NVML_CALL_COUNTS). Results: OUTDIR/calls-per-tick.txt (one
# line per binary, interval, mode and NVML function: calls per tick). Set CALLS_ONLY=1 to
# stop there.
set -euo pipefail
IFS=, read -r -a BINS <<< "$1"
LIB=$(realpath "$2")
OUT=$(realpath -m "$3")
N=${4:-30}
SECS=${5:-60}
REAL=${6:-true}
mkdir -p "$OUT"

# calls-per-tick: the fake's counts over TICKS ticks, divided by TICKS.
TICKS=600
: > "$OUT/calls-per-tick.txt"
for mode in not_found report; do
  calls_scenario="$OUT/calls-$mode.toml"
  {
    echo 'driver_version = "580.159.04"'
    echo '[[gpu]]'
    echo 'uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"'
    echo 'memory_total = 150754820096'
    echo 'utilization_gpu = 40'
    echo 'temperature_c = 40'
    echo 'power_mw = 300000'
    echo "process_utilization = \"$mode\""
    for i in $(seq "$N"); do
      printf '[[gpu.process]]\npid = %s\nmemory = "1 GiB"\nsm_util = 5\n' "$((40000 + i))"
    done
  } > "$calls_scenario"
  for interval in 100ms 1s; do
    for bin in "${BINS[@]}"; do
      rm -f "$OUT/calls.db"* "$OUT/calls.txt"
      FAKE_NVML_SCENARIO="$calls_scenario" VRAMCTL_NVML_LIB="$LIB" \
        FAKE_NVML_CALL_COUNTS="$OUT/calls.txt" \
        "$bin" --db "$OUT/calls.db" record --interval "$interval" --ticks "$TICKS" \
        --simulated-clock 1795984291000 2> /dev/null
      awk -v b="$bin" -v iv="$interval" -v m="$mode" -v n="$TICKS" '
        $1 ~ /^nvmlDevice(GetCount_v2|GetHandleByIndex_v2|GetMemoryInfo_v2|GetUtilizationRates|GetTemperature|GetPowerUsage|Get.*RunningProcesses_v3|GetProcessUtilization)$/ {
          total += $2; printf "%s interval=%s activity=%s %s %.3f\n", b, iv, m, $1, $2 / n
        }
        END { printf "%s interval=%s activity=%s all_per_tick %.3f\n", b, iv, m, total / n }
      ' "$OUT/calls.txt" | tee -a "$OUT/calls-per-tick.txt"
    done
  done
done
rm -f "$OUT/calls.db"* "$OUT/calls.txt"
if [[ -n "${CALLS_ONLY:-}" ]]; then
  echo "done: $OUT"
  exit 0
fi

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
trap cleanup EXIT
for _ in $(seq "$N"); do sleep 100000 & pids+=($!); done

scenario="$OUT/scenario.toml"
{
  echo 'driver_version = "580.159.04"'
  echo '[[gpu]]'
  echo 'uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"'
  echo 'name = "NVIDIA H200"'
  echo 'memory_total = 150754820096'
  echo 'utilization_gpu = 40'
  echo 'temperature_c = 40'
  echo 'power_mw = 300000'
  for p in "${pids[@]}"; do
    printf '[[gpu.process]]\npid = %s\nreal = %s\nmemory = "1 GiB"\n' "$p" "$REAL"
  done
} > "$scenario"

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
clk=$(getconf CLK_TCK)

: > "$OUT/summary.txt"
for interval in 100ms 1s; do
  recs=()
  for i in "${!BINS[@]}"; do
    rm -f "$OUT/rec$i-$interval.db"*
    FAKE_NVML_SCENARIO="$scenario" VRAMCTL_NVML_LIB="$LIB" \
      "${BINS[$i]}" --db "$OUT/rec$i-$interval.db" record --interval "$interval" \
      --log-file "$OUT/rec$i-$interval.log" &
    recs+=($!)
  done
  sleep 5
  t0=$(date +%s.%N); c0=(); for r in "${recs[@]}"; do c0+=("$(ticks "$r")"); done
  sleep "$SECS"
  t1=$(date +%s.%N); c1=(); for r in "${recs[@]}"; do c1+=("$(ticks "$r")"); done
  kill -TERM "${recs[@]}"; for r in "${recs[@]}"; do wait "$r" || true; done
  for i in "${!BINS[@]}"; do
    awk -v b="${BINS[$i]}" -v iv="$interval" -v n="$N" -v real="$REAL" -v d0="${c0[$i]}" \
        -v d1="${c1[$i]}" -v t0="$t0" -v t1="$t1" -v clk="$clk" 'BEGIN {
      cpu = (d1 - d0) / clk; wall = t1 - t0
      printf "%s interval=%s processes=%d real=%s window_s=%.1f cpu_s=%.2f cpu_percent=%.3f\n",
        b, iv, n, real, wall, cpu, 100 * cpu / wall }' | tee -a "$OUT/summary.txt"
    if command -v strace > /dev/null; then
      rm -f "$OUT/st$i-$interval.db"*
      FAKE_NVML_SCENARIO="$scenario" VRAMCTL_NVML_LIB="$LIB" timeout -s INT 12 \
        strace -f -c -o "$OUT/strace$i-$interval.txt" \
        "${BINS[$i]}" --db "$OUT/st$i-$interval.db" record --interval "$interval" \
        --duration 10s --log-file "$OUT/st$i-$interval.log" || true
    fi
  done
done
echo "done: $OUT"
