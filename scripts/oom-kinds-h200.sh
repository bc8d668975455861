#!/usr/bin/env bash
# Issue 33's held-out OOM set on one H200 (scripts/oom-kinds-h200.py says what each case
# does and what is written): builds vramctl, then makes the eight kinds of OOM, re-runs each
# with its fix, and scores `vramctl snapshot FILE` and `vramctl explain-oom` against them.
#
#   scripts/oom-kinds-h200.sh [OUTDIR]      (default: $OUT/oom-kinds; binary: $VRAMCTL or .dist/vramctl)
#
# Needs python3 with torch (CUDA) and one free GPU; about 5 minutes. Nothing here changes a
# GPU setting (the per-process fraction is the process's own).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:?set OUT or give OUTDIR}/oom-kinds}"
mkdir -p "$out"
# $bin: $VRAMCTL, .dist/vramctl, or a release build where cargo exists.
. scripts/lib-vramctl-bin.sh
python3 -c 'import torch; assert torch.cuda.is_available(); print(torch.__version__, torch.version.cuda)' \
  > "$out/versions.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$out/versions.txt" || true
python3 scripts/oom-kinds-h200.py --bin "$bin" --out "$out"
