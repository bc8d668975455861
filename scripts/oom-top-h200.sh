#!/usr/bin/env bash
# Issue 33's live view of a running process's OOM on one GPU (H200 or H100) with real PyTorch
# (scripts/oom-top-h200.py says what it checks): a process with the agent catches an OOM
# and keeps running; `vramctl ps --json` and `serve`'s /api/now give its cause within 15 s,
# the cause `vramctl snapshot` gives on the snapshot the agent kept.
#
#   scripts/oom-top-h200.sh [OUTDIR]      (default: $OUT/oom-top; binary: $VRAMCTL or .dist/vramctl)
#
# Needs python3 with torch (CUDA) and one free GPU (160 GiB asked of an H200's 141; sizes scale
# with the GPU's memory: 57 + 34 GiB on an H100 80GB); about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:?set OUT or give OUTDIR}/oom-top}"
mkdir -p "$out"
. scripts/lib-vramctl-bin.sh
python3 scripts/oom-top-h200.py --bin "$bin" --out "$out" 2>&1 | tee "$out/summary.txt"
