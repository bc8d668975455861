#!/usr/bin/env bash
# Round 2's phase run of the `vramctl estimate` truth set (issue 16), one call on the GPU
# machine, from the repository root:
#
#   bash scripts/estimate-phases-h200.sh [-j J] [--dry-run] BINARY OUTDIR
#
# Profiles phase by phase (TRUTH_PHASES=1: allocated and reserved bytes at every phase of
# every step, allocator counters, a census of the saved tensors) and records the caching
# allocator's history (--trace) of every training case that is not held back and has no
# phase profile in testdata/h200/estimate/ yet: the seven seen training rows, round 1's four
# misses among them, and round 2's tuning rows. Never a held-back case (runner.py's
# --unprofiled-training). Up to J cases at once (default 6), packed by the estimate within
# 120 GB (scripts/estimate-h200.sh, scripts/estimate/runner.py). --dry-run prints the cases,
# the packing and the expected time, and runs nothing.
#
# Leaves in OUTDIR, bundled so that few files come back:
#   truth-phases-round2.jsonl  one line per case (runner.py's format, truth.py's phases)
#   env-round2.txt             GPU, driver, versions, accelerate's figures
#   plan.txt                   the order and the packing
#   runs.tar.gz                runs/: each case's `vramctl run` report, stdout and stderr
#   traces-N.tar               runs/*.trace.json.gz, at most 15 MiB a file, at most 3 files
#   failures.log               only when a case failed
# Copy the .jsonl and env-round2.txt into testdata/h200/estimate/ (compare.py reads them).
set -uo pipefail
usage="usage: estimate-phases-h200.sh [-j J] [--dry-run] BINARY OUTDIR"
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
TRUTH_PHASES=1 ESTIMATE_RECORD=truth-phases-round2.jsonl ESTIMATE_ENV=env-round2.txt \
  bash "$here/estimate-h200.sh" -j "$jobs" --trace --unprofiled-training ${dry[@]+"${dry[@]}"} "$bin" "$out"
rc=$?
[ ${#dry[@]} -eq 0 ] || exit "$rc"
python3 - "$out" <<'PY'
import os, sys, tarfile
out = sys.argv[1]
runs = os.path.join(out, "runs")
names = sorted(os.listdir(runs)) if os.path.isdir(runs) else []
traces = sorted((n for n in names if n.endswith(".trace.json.gz")),
                key=lambda n: -os.path.getsize(os.path.join(runs, n)))
with tarfile.open(os.path.join(out, "runs.tar.gz"), "w:gz") as tar:
    for n in names:
        if n not in traces:
            tar.add(os.path.join(runs, n), arcname=f"runs/{n}")
limit, bins = 15 * 2**20, []
for n in traces:
    size = os.path.getsize(os.path.join(runs, n)) + 1024
    fit = next((b for b in bins if b[0] + size <= limit), None)
    if fit is None and len(bins) < 3 and size <= limit:
        fit = [0, []]
        bins.append(fit)
    if fit is None:
        print(f"left out (no room in 3 x 15 MiB): {n}", file=sys.stderr)
        continue
    fit[0] += size
    fit[1].append(n)
for i, (_, members) in enumerate(bins, 1):
    with tarfile.open(os.path.join(out, f"traces-{i}.tar"), "w") as tar:
        for n in members:
            tar.add(os.path.join(runs, n), arcname=f"runs/{n}")
for n in names:
    os.remove(os.path.join(runs, n))
os.rmdir(runs)
PY
echo "phase run: $(( $(date +%s) - t0 )) s, exit $rc; files in $out:" >&2
ls -l "$out" >&2
exit "$rc"
