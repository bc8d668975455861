#!/usr/bin/env bash
# The one evaluation run of the `vramctl estimate` truth set's held-back cases (issue 16),
# once the model is frozen: one call on the GPU machine, from the repository root:
#
#   bash scripts/estimate-heldback-h200.sh [-j J] [--dry-run] BINARY OUTDIR
#
# Measures every held-back case of scripts/estimate/cases.py (runner.py's --held-back: it
# refuses if testdata/h200/estimate/ holds a measurement of one already) as round 1 measured
# the others: `BINARY run --interval 20ms -- python3 scripts/estimate/truth.py CASE`, NVML's
# per-process peak beside torch's own peaks, no phase profile, no allocator trace. Up to J
# cases at once (default 6; H0 of round 2: running side by side changes no per-process
# figure), packed largest first by the estimate within 125 GB (scripts/estimate-h200.sh):
# 5 GB above round 2's 120 lets gemma2-9b-bf16-b1x2048 (105 GB) share the GPU with
# mixtral-small-bf16-ckpt-b8x2048 (19 GB), which keeps the run within 4 minutes if the cases
# never run take as long as the slowest measured one (34 s); the H200 has 150.7 GB.
# --dry-run prints the cases, the packing and the expected time, and runs nothing.
#
# Leaves in OUTDIR, bundled so that few files come back (at most 5):
#   truth-heldback.jsonl  one line per case (runner.py's format)
#   env-heldback.txt      GPU, driver, versions, accelerate's figures
#   plan.txt              the order and the packing
#   runs.tar.gz           runs/: each case's `vramctl run` report, stdout and stderr
#   failures.log          only when a case failed
# Copy the .jsonl into testdata/h200/estimate/ and add it to compare.py's MEASURED.
set -uo pipefail
usage="usage: estimate-heldback-h200.sh [-j J] [--dry-run] BINARY OUTDIR"
jobs=6
dry=()
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs="${2:?$usage}"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --dry-run) dry=(--dry-run); shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "error: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || { echo "$usage" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "$1")"
out="$(realpath -m "$2")"
t0=$(date +%s)
ESTIMATE_RECORD=truth-heldback.jsonl ESTIMATE_ENV=env-heldback.txt \
  bash "$here/estimate-h200.sh" -j "$jobs" --budget-gb 125 --held-back ${dry[@]+"${dry[@]}"} "$bin" "$out"
rc=$?
[ ${#dry[@]} -eq 0 ] || exit "$rc"
if [ -d "$out/runs" ]; then
  tar -C "$out" -czf "$out/runs.tar.gz" runs && rm -r "$out/runs"
fi
echo "held-back run: $(( $(date +%s) - t0 )) s, exit $rc; files in $out:" >&2
ls -l "$out" >&2
exit "$rc"
