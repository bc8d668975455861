#!/usr/bin/env bash
# The families estimate reads since issue 34 against transformers on a real H200:
# (a) parameter count and (b) KV cache bytes exact (PASS/FAIL), (c) a training step's
# peak as a % error figure (held out). scripts/estimate-families-h200.py says how.
#
#   OUT=/some/dir scripts/estimate-families-h200.sh      (binary: $VRAMCTL or .dist/vramctl)
#
# No network is needed: models are built with random weights from the configs in
# testdata/model/configs/. About 2–3 minutes on an H200; stopped at 300 s.
set -uo pipefail
cd "$(dirname "$0")/.."
VRAMCTL=$(readlink -f "${VRAMCTL:-.dist/vramctl}")
export VRAMCTL
export OUT=${OUT:?set OUT}
mkdir -p "$OUT"
[ -x "$VRAMCTL" ] || { echo "FAIL no vramctl binary at $VRAMCTL"; exit 1; }
timeout 300 python3 scripts/estimate-families-h200.py
