#!/usr/bin/env bash
# Issue 29 item 7: do real scrapes of `vramctl serve` still answer while local clients
# attack it with slow and never-reading connections? Loopback only, bounded, stops by itself.
#
#   scripts/bench-serve-attack.sh target/release/vramctl target/release/libfake_nvml.so OUTDIR [SECONDS]
#
# Runs the exporter on the fake NVML (8 GPUs x 30 processes, as scripts/bench-serve.sh) on
# 127.0.0.1, then scripts/serve-attack.py four times, SECONDS each (default 20):
#   1. no attack (the baseline);
#   2. 300 slow clients (slowloris: a request head one line a second, never finished);
#   3. 260 clients that send 64 pipelined requests and never read;
#   4. both at once.
# Each run scrapes /metrics every 50 ms over a fresh connection and prints the scrapes,
# failures and p50/p90/p99/max (failures counted as the slowest). Raw latencies go into
# OUTDIR/<run>/. SERVE_ARGS adds flags to `vramctl serve`.
# Needs python3. Attacks nothing but 127.0.0.1; every client stops after SECONDS.
set -euo pipefail
vramctl=$(realpath "$1"); fake=$(realpath "$2"); out=$3; seconds=${4:-20}
mkdir -p "$out"
here=$(cd "$(dirname "$0")/.." && pwd)
export VRAMCTL_NVML_LIB="$fake"
export FAKE_NVML_SCENARIO="$here/examples/scenarios/eight-gpus-30-procs.toml"
# The attack holds 560 sockets: raise the soft open-file limit to the hard one.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$vramctl" serve --listen 127.0.0.1:0 --interval 1 ${SERVE_ARGS:-} 2> "$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "first collection" "$out/serve.log" 2>/dev/null && break; sleep 0.1; done
addr=$(grep -o '127.0.0.1:[0-9]*' "$out/serve.log" | head -1)
[ -n "$addr" ] || { echo "serve did not start:" >&2; cat "$out/serve.log" >&2; exit 1; }
echo "vramctl: $("$vramctl" --version); serve flags: --interval 1 ${SERVE_ARGS:-}" | tee "$out/summary.txt"

run() { # $1 name, $2 slow clients, $3 never-reading clients
  echo "--- $1" | tee -a "$out/summary.txt"
  timeout $((seconds + 90)) python3 "$here/scripts/serve-attack.py" "$addr" \
    --slow "$2" --never-read "$3" --seconds "$seconds" --out "$out/$1" \
    | tee -a "$out/summary.txt"
  kill -0 "$pid" || { echo "serve died" | tee -a "$out/summary.txt"; exit 1; }
  sleep 2 # let the last attack's connections close
}
run baseline 0 0
run slow-300 300 0
run never-read-260 0 260
run both 300 260
grep -E "VmRSS|VmHWM" "/proc/$pid/status" | tee -a "$out/summary.txt"
