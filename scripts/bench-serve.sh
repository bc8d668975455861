#!/usr/bin/env bash
# Benchmark of `vramctl serve` (issue 7) on the fake NVML: 8 GPUs x 30 processes.
#
#   scripts/bench-serve.sh target/release/vramctl target/release/libfake_nvml.so OUTDIR
#
# Measures, writing every raw figure into OUTDIR:
#   1. scrape latency at ~200 requests/s (wrk, 4 connections each pausing 20 ms between
#      requests: wrk's latency excludes the pause) for 30 s: p50/p99, errors;
#   2. the same at saturation (wrk as fast as it can, 2 connections) for comparison;
#   3. daemon CPU over 60 s at --interval 1 with one scrape per second (utime+stime from
#      /proc/PID/stat), and with no scrapes;
#   4. RSS (VmRSS, VmHWM) at the end.
# SERVE_ARGS adds flags to `vramctl serve`, e.g. SERVE_ARGS="--record OUTDIR/history.db"
# to measure the daemon recording history too.
# Needs wrk (Debian: apt-get install wrk) and curl. Loopback only; stops by itself.
set -euo pipefail
vramctl=$(realpath "$1"); fake=$(realpath "$2"); out=$3
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
export VRAMCTL_NVML_LIB="$fake"
export FAKE_NVML_SCENARIO="$here/examples/scenarios/eight-gpus-30-procs.toml"
command -v wrk >/dev/null || { echo "wrk is missing: apt-get install wrk" >&2; exit 2; }

# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$vramctl" serve --listen 127.0.0.1:0 --interval 1 ${SERVE_ARGS:-} 2> "$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q serving "$out/serve.log" 2>/dev/null && break; sleep 0.1; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$out/serve.log" | head -1)
url="http://$addr/metrics"
curl -s "$url" > "$out/metrics.txt"
echo "series: $(grep -vc '^#' "$out/metrics.txt"), bytes: $(wc -c < "$out/metrics.txt")" | tee "$out/summary.txt"

cat > "$out/rate.lua" <<'LUA'
-- Each connection waits 20 ms between requests: 4 connections ~ 200 requests/s.
function delay() return 20 end
LUA
wrk -t2 -c4 -d30s --latency -s "$out/rate.lua" "$url" > "$out/wrk-200rps.txt"
wrk -t1 -c2 -d10s --latency "$url" > "$out/wrk-saturated.txt"
{
  echo "--- ~200 req/s (wrk -t2 -c4 -d30s --latency, 20 ms delay per connection)"
  grep -E "Requests/sec|50%|99%|Non-2xx|Socket errors|requests in" "$out/wrk-200rps.txt"
  echo "--- saturated (wrk -t1 -c2 -d10s --latency)"
  grep -E "Requests/sec|50%|99%|Non-2xx|Socket errors|requests in" "$out/wrk-saturated.txt"
} | tee -a "$out/summary.txt"

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
measure() { # $1 label, $2 seconds, $3 scrape every second (1/0)
  local t0 c0 c1 t1
  t0=$(date +%s.%N); c0=$(cpu)
  for _ in $(seq "$2"); do
    [ "$3" = 1 ] && curl -s -o /dev/null "$url"
    sleep 1
  done
  t1=$(date +%s.%N); c1=$(cpu)
  awk -v a="$c0" -v b="$c1" -v s="$t0" -v e="$t1" -v hz="$ticks" -v l="$1" \
    'BEGIN { printf "cpu %s: %.3f%% of a core (%d ticks in %.1f s)\n", l, 100*(b-a)/hz/(e-s), b-a, e-s }'
}
measure "1 s interval, 1 scrape/s" 60 1 | tee -a "$out/summary.txt"
measure "1 s interval, no scrapes" 60 0 | tee -a "$out/summary.txt"
grep -E "VmRSS|VmHWM" "/proc/$pid/status" | tee -a "$out/summary.txt"
echo "serve flags: --interval 1 ${SERVE_ARGS:-}" >> "$out/summary.txt"
