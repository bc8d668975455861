#!/usr/bin/env bash
# Record labeled GPU-memory traces on a GPU machine: the PyTorch workloads in
# scripts/workloads/ run side by side for DURATION seconds while vramctl samples every 100 ms
# (`status --json --watch 0.1`, vramctl's NDJSON) and nvidia-smi logs both CSV query kinds
# every 500 ms (fixtures for `vramctl import`). Each workload writes its ground truth to
# labels.jsonl (start, leak_start, idle_start, end, with wall time and PID).
#
#   scripts/record-labeled-traces.sh path/to/vramctl OUTDIR [DURATION]
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="$1"; out="$2"; export DURATION="${3:-300}"
mkdir -p "$out"
export LABELS="$out/labels.jsonl"
: > "$LABELS"

"$vramctl" status --json --watch 0.1 > "$out/trace.ndjson" 2> "$out/vramctl.err" &
rec=$!
nvidia-smi --query-gpu=timestamp,index,uuid,name,memory.total,memory.reserved,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw \
  --format=csv -lms 500 > "$out/smi-query-gpu.csv" 2>&1 &
smi1=$!
nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,process_name,used_memory \
  --format=csv -lms 500 > "$out/smi-query-compute-apps.csv" 2>&1 &
smi2=$!
sleep 2

cd "$here/workloads"
pids=()
for w in steady_train leak_graph leak_staircase leak_fast dyn_shapes sawtooth_infer idle_holder; do
  python3 "$w.py" 2> "$out/$w.log" &
  pids+=($!)
done
cd - > /dev/null

# Mid-run, compare vramctl with nvidia-smi and pynvml while all seven run.
sleep 100
"$here/check-real-gpu.sh" "$vramctl" "$out/check-busy" > "$out/check-busy.txt" 2>&1
echo "check-busy rc=$?" >> "$out/check-busy.txt"

for p in "${pids[@]}"; do wait "$p"; done
sleep 2
kill "$rec" "$smi1" "$smi2" 2>/dev/null
wait 2>/dev/null
echo "done: $(wc -l < "$out/trace.ndjson") samples"
