#!/usr/bin/env bash
# One GPU call for issues 16 and 17 (round 2), from the repository root:
#
#   bash scripts/check-issues-16-17-h200.sh BINARY OUTDIR
#
# 1. Issue 17: a real >= 200 MB `_dump_snapshot()` made on the GPU, `vramctl snapshot`
#    timed against `_memory_viz stats` and a bare `pickle.load` on it, its numbers compared
#    with memory_stats() (scripts/snapshot-h200.py; the snapshot itself stays in a
#    temporary directory). First, on a quiet machine, since it is timed.
# 2. Issue 16: the estimate's round-2 phase run on tuning rows only
#    (scripts/estimate-phases-h200.sh, never a held-back case).
#
# Leaves at most 8 files, as the GPU machine gives back: OUTDIR/snapshot.tar.gz (every
# result file of step 1 and its log) and OUTDIR/est/ (truth-phases-round2.jsonl,
# env-round2.txt, runs.tar.gz, traces-N.tar, meta.tar with the plan and any failures).
# Nothing here changes a GPU setting.
set -uo pipefail
bin="$(realpath "${1:?usage: check-issues-16-17-h200.sh BINARY OUTDIR}")"
out="$(realpath -m "${2:?usage: check-issues-16-17-h200.sh BINARY OUTDIR}")"
cd "$(dirname "$0")/.."
mkdir -p "$out/snapshot"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > "$out/snapshot/gpu.txt" 2>&1
lscpu > "$out/snapshot/cpu.txt" 2>&1
t0=$(date +%s)
PYTHONUNBUFFERED=1 timeout 270 python3 scripts/snapshot-h200.py --bin "$bin" --out "$out/snapshot" \
  --max-entries 1300000 --train-s 110 > "$out/snapshot/log.txt" 2>&1
echo "snapshot: exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$out/snapshot/log.txt"
tar czf "$out/snapshot.tar.gz" -C "$out" snapshot && rm -rf "$out/snapshot"
t1=$(date +%s)
timeout 290 bash scripts/estimate-phases-h200.sh -j 6 "$bin" "$out/est"
echo "estimate phases: exit $? in $(( $(date +%s) - t1 )) s"
meta=()
for f in plan.txt failures.log; do [ -e "$out/est/$f" ] && meta+=("$f"); done
if [ ${#meta[@]} -gt 0 ]; then
  tar cf "$out/est/meta.tar" -C "$out/est" "${meta[@]}" && (cd "$out/est" && rm -f "${meta[@]}")
fi
ls -lR "$out"
