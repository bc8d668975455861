#!/usr/bin/env bash
# Record the labeled leak workloads (scripts/workloads/*.py) side by side on one GPU, the
# ground truth for `vramctl leaks` (issue 4), and score the analysis on them.
#
#   scripts/record-leak-traces.sh [path/to/vramctl] [output-dir] [duration-s]
#
# Writes into the output directory:
#   status.ndjson   `vramctl status --json --watch 0.1` for the whole run (schema 1)
#   labels.jsonl    one line per workload event: {"t", "pid", "role", "event"}
#   cpu.jsonl       CPU time of every labeled PID once a second: {"t", "pid", "cpu_time_ms"}
#   evaluation.txt  precision, recall and detection delay (when cargo is available)
# Keep status.ndjson, labels.jsonl and cpu.jsonl (gzip them) as test data under
# crates/vramctl-leaks/tests/data/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="${1:-$here/../target/release/vramctl}"
out="${2:-$(mktemp -d)}"
duration="${3:-300}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
: > "$out/labels.jsonl"
: > "$out/cpu.jsonl"

"$vramctl" status --json --watch 0.1 > "$out/status.ndjson" &
recorder=$!

# CPU time of the labeled PIDs: the idle holder's evidence when the GPU is shared.
python3 - "$out" <<'PY' &
import json, os, sys, time
out = sys.argv[1]
tick = os.sysconf("SC_CLK_TCK")
while True:
    pids = set()
    with open(os.path.join(out, "labels.jsonl")) as f:
        for line in f:
            if line.strip():
                pids.add(json.loads(line)["pid"])
    now = time.time()
    with open(os.path.join(out, "cpu.jsonl"), "a") as f:
        for pid in sorted(pids):
            try:
                with open(f"/proc/{pid}/stat") as s:
                    fields = s.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ms = (int(fields[11]) + int(fields[12])) * 1000 // tick
            f.write(json.dumps({"t": now, "pid": pid, "cpu_time_ms": ms}) + "\n")
    time.sleep(1.0)
PY
cpu_sampler=$!
trap 'kill $recorder $cpu_sampler 2>/dev/null || true' EXIT

sleep 2
pids=()
for w in leak_graph leak_staircase leak_fast dyn_shapes sawtooth_infer steady_train idle_holder; do
  (cd "$here/workloads" && LABELS="$out/labels.jsonl" DURATION="$duration" \
    exec python3 "$w.py" 2> "$out/$w.log") &
  pids+=($!)
done
wait "${pids[@]}"
sleep 2
kill $recorder $cpu_sampler 2>/dev/null || true
wait $recorder 2>/dev/null || true

if command -v cargo >/dev/null; then
  (cd "$here/.." && cargo run --release -q -p vramctl-leaks --example evaluate_leaks -- \
    --idle-for 60 "status:$out/status.ndjson:$out/labels.jsonl:$out/cpu.jsonl") \
    | tee "$out/evaluation.txt"
fi
echo "traces in $out"
