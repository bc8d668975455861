#!/usr/bin/env bash
# Real-GPU measurements for issue 3 (the recorder), to run on the H200 machine:
#
#   scripts/record-h200.sh path/to/vramctl OUTDIR
#
# 1. Recorder CPU at 100 ms against `nvidia-smi --query-gpu=... -lms 100` running beside
#    it over the same minute: both started together, CPU time (utime+stime from
#    /proc/PID/stat) read at the start and the end of the same 60 s window.
#    -> OUTDIR/cpu-100ms.txt
# 2. nvidia-smi CSV captures for import fixtures, -lms 500 for 30 s, both query kinds, while
#    a small PyTorch mix runs (an idle holder, a leak, a steady job: scripts/workloads/):
#    -> OUTDIR/smi-gpu-lms500.csv, OUTDIR/smi-apps-lms500.csv, plus the same time window
#       recorded by vramctl (OUTDIR/record.db) and its exports for comparison.
# 3. The recorder's database size per process-sample on that mix -> OUTDIR/bytes.txt
#
# Needs: nvidia-smi, python3 with torch (for the mix; without it only 1 and 3 on an idle GPU).
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
clk=$(getconf CLK_TCK)

echo "== 1. CPU at 100 ms: vramctl record vs nvidia-smi -lms 100 (60 s)"
rm -f "$OUT"/cpu.db*
"$VRAMCTL" --db "$OUT/cpu.db" record --interval 100ms --log-file "$OUT/record-cpu.log" &
rec=$!
nvidia-smi --query-gpu=timestamp,index,uuid,memory.total,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw \
  --format=csv -lms 100 > "$OUT/smi-100ms.csv" &
smi=$!
sleep 5  # both past start-up (NVML init ~93 ms; nvidia-smi's first query)
r0=$(ticks $rec); s0=$(ticks $smi); t0=$(date +%s.%N)
sleep 60
r1=$(ticks $rec); s1=$(ticks $smi); t1=$(date +%s.%N)
rss=$(awk '/VmHWM/ { print $2 " " $3 }' /proc/$rec/status)
kill -TERM $rec $smi; wait $rec || true; wait $smi || true
{
  echo "window_s $(echo "$t1 - $t0" | bc)"
  echo "vramctl_record_cpu_s $(echo "scale=3; ($r1 - $r0) / $clk" | bc)"
  echo "nvidia_smi_cpu_s $(echo "scale=3; ($s1 - $s0) / $clk" | bc)"
  echo "vramctl_record_cpu_percent $(echo "scale=2; 100 * ($r1 - $r0) / $clk / 60" | bc)"
  echo "nvidia_smi_cpu_percent $(echo "scale=2; 100 * ($s1 - $s0) / $clk / 60" | bc)"
  echo "vramctl_record_peak_rss $rss"
} | tee "$OUT/cpu-100ms.txt"

echo "== 2. nvidia-smi captures at -lms 500 with a workload mix (30 s)"
pids=()
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  for w in idle_holder leak_staircase steady_train; do
    (cd scripts/workloads && DURATION=60 exec python3 "$w.py") > "$OUT/$w.log" 2>&1 & pids+=($!)
  done
  sleep 8
fi
rm -f "$OUT"/record.db*
"$VRAMCTL" --db "$OUT/record.db" record --interval 500ms --duration 30s --log-file "$OUT/record.log" &
rec=$!
nvidia-smi --query-gpu=timestamp,index,name,uuid,pci.bus_id,memory.total,memory.reserved,memory.used,memory.free,utilization.gpu,utilization.memory,temperature.gpu,power.draw \
  --format=csv -lms 500 > "$OUT/smi-gpu-lms500.csv" &
g=$!
nvidia-smi --query-compute-apps=timestamp,gpu_name,gpu_bus_id,gpu_uuid,pid,process_name,used_gpu_memory \
  --format=csv -lms 500 > "$OUT/smi-apps-lms500.csv" &
a=$!
sleep 30
kill -INT $g $a || true
wait $rec || true
for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
"$VRAMCTL" --db "$OUT/record.db" export > "$OUT/record.ndjson"
"$VRAMCTL" --db "$OUT/record.db" history --since all --format csv > "$OUT/record-history.csv"
# Round trip of the real captures: import, export with the same columns, compare.
rm -f "$OUT"/import.db*
"$VRAMCTL" --db "$OUT/import.db" import "$OUT/smi-gpu-lms500.csv" "$OUT/smi-apps-lms500.csv" 2> "$OUT/import.log" || true
"$VRAMCTL" --db "$OUT/import.db" export --format smi-gpu --query "$(head -1 "$OUT/smi-gpu-lms500.csv")" > "$OUT/smi-gpu-roundtrip.csv" || true
"$VRAMCTL" --db "$OUT/import.db" export --format smi-apps --query "$(head -1 "$OUT/smi-apps-lms500.csv")" > "$OUT/smi-apps-roundtrip.csv" || true
{ diff "$OUT/smi-gpu-lms500.csv" "$OUT/smi-gpu-roundtrip.csv" && echo "gpu round trip: identical"; } > "$OUT/roundtrip.txt" 2>&1 || true
{ diff "$OUT/smi-apps-lms500.csv" "$OUT/smi-apps-roundtrip.csv" && echo "apps round trip: identical"; } >> "$OUT/roundtrip.txt" 2>&1 || true

echo "== 3. bytes per process-sample"
python3 - "$OUT/record.db" <<'PY' | tee "$OUT/bytes.txt"
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
size = c.execute("pragma page_count").fetchone()[0] * c.execute("pragma page_size").fetchone()[0]
frames = c.execute("select count(*) from frame").fetchone()[0]
blob = c.execute("select sum(length(data)) from frame").fetchone()[0] or 0
print(f"db_bytes {size}\nframes {frames}\nframe_payload_bytes {blob}")
PY
echo "done: $OUT"
