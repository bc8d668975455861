#!/usr/bin/env bash
# The real recording for examples/ (issue 3, item 6), to run on the H200 machine:
#
#   scripts/record-example-h200.sh path/to/vramctl OUTDIR
#
# `vramctl record --interval 500ms` samples the GPU into OUTDIR/h200-recording.db while a
# realistic mix of PyTorch jobs runs for DURATION seconds (default 240), side by side:
#
#   steady_train     a training loop whose memory is flat after the first step (not a leak)
#   leak_staircase   an evaluation cache that grows 256 MiB every 8 s after a 30 s warm-up
#   idle_holder      12 GiB held by a kernel that computed once and then sleeps
#   sawtooth_infer   an inference server that builds a 4 GiB cache per request and frees it
#
# Each workload appends its ground truth to OUTDIR/labels.jsonl (start, leak_start,
# idle_start, end, with wall time and PID). The recorder starts before the jobs and stops
# (SIGINT: it flushes and exits 0) a few seconds after they end, so the recording shows the
# memory taken and given back. Then the script checks the database (integrity, samples,
# processes), prints its size, and writes what newcomers will run against it:
#
#   OUTDIR/h200-recording.db      the recording (copy it to examples/)
#   OUTDIR/labels.jsonl           ground truth per process
#   OUTDIR/history.txt            `vramctl history --since all` on it
#   OUTDIR/h200-recording.ndjson.gz   only if the database is over 4 MB (it should be far
#                                 smaller: change-only frames, ~2 B per process-sample)
#   OUTDIR/record.log, OUTDIR/<workload>.log, OUTDIR/gpu.csv (nvidia-smi's view of the GPU)
#
# Needs python3 with torch and a CUDA GPU (PYTHON=... picks another interpreter) and
# nvidia-smi (optional: only for gpu.csv). Set DURATION to shorten the run.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 path/to/vramctl OUTDIR" >&2
  exit 2
fi
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
PYTHON=$(command -v "${PYTHON:-python3}")
export DURATION=${DURATION:-240}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
DB="$OUT/h200-recording.db"
export LABELS="$OUT/labels.jsonl"

if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "$PYTHON cannot use a CUDA GPU through torch; run this on the GPU machine" >&2
  exit 1
fi
if [ -e "$DB" ]; then
  echo "$DB exists; remove it or choose another OUTDIR" >&2
  exit 2
fi
: > "$LABELS"

rec=""
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$rec" ]; then kill -INT "$rec" 2>/dev/null || true; fi
}
trap cleanup EXIT

if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,memory.reserved \
    --format=csv > "$OUT/gpu.csv" 2>&1 || true
fi

echo "== recording every 500 ms into $DB"
"$VRAMCTL" --db "$DB" record --interval 500ms --log-file "$OUT/record.log" &
rec=$!
sleep 3  # an idle baseline before the jobs start

echo "== running the mix for ${DURATION} s"
for w in steady_train leak_staircase idle_holder sawtooth_infer; do
  (cd scripts/workloads && exec "$PYTHON" "$w.py") > "$OUT/$w.log" 2>&1 &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
pids=()
sleep 5  # the memory given back, on record

echo "== stopping the recorder (SIGINT)"
kill -INT "$rec"
if wait "$rec"; then rc=0; else rc=$?; fi
rec=""
if [ "$rc" -ne 0 ]; then
  echo "vramctl record exited $rc; see $OUT/record.log" >&2
  exit 1
fi
if [ "$failed" -ne 0 ]; then
  echo "a workload failed; see $OUT/*.log (the recording is kept)" >&2
fi

echo "== checking the recording"
"$VRAMCTL" --db "$DB" history --since all --tz UTC > "$OUT/history.txt"
"$VRAMCTL" --db "$DB" history --since all --format json > "$OUT/history.json"
"$PYTHON" - "$OUT/history.json" "$LABELS" <<'PY'
import json, sys
h = json.load(open(sys.argv[1]))
labels = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
devices = h["devices"]
samples = max((len(d["samples"]) for d in devices), default=0)
print(f"devices {len(devices)}, samples per device {samples}, processes {len(h['processes'])}, gaps {len(h['gaps'])}")
recorded = {p["pid"] for p in h["processes"]}
for pid, role in sorted({(l["pid"], l["role"]) for l in labels}):
    print(f"  {role:15} pid {pid}: {'recorded' if pid in recorded else 'NOT RECORDED'}")
missing = {l["pid"] for l in labels} - recorded
sys.exit(1 if missing or samples == 0 else 0)
PY
size=$(stat -c %s "$DB")
if [ -s "$DB-wal" ]; then
  echo "warning: $DB-wal is not empty (the recorder did not checkpoint)" >&2
fi
rm -f "$DB.lock" "$DB-wal" "$DB-shm"
echo "h200-recording.db: $size bytes ($((size / 1024)) KiB)"
if [ "$size" -gt 4000000 ]; then
  "$VRAMCTL" --db "$DB" export | gzip -9 > "$OUT/h200-recording.ndjson.gz"
  echo "over 4 MB: also exported h200-recording.ndjson.gz ($(stat -c %s "$OUT/h200-recording.ndjson.gz") bytes)"
fi
echo "done: $OUT"
