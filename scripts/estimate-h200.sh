#!/usr/bin/env bash
# The `vramctl estimate` truth set on a real GPU (issue 16).
#
#   scripts/estimate-h200.sh [-j J] [--budget-gb G] [--trace] [--dry-run] [--held-back] BINARY OUTDIR [CASE...]
#
# CASE... defaults to every case of cases.py; --held-back takes the held-back ones (and
# refuses if one has been measured: scripts/estimate-heldback-h200.sh is their one run). Each case is a fresh
# `python3 scripts/estimate/truth.py CASE` under
#   BINARY run --json --report R --interval 20ms -- python3 ...
# so NVML's per-process peak is sampled every 20 ms (the tree's bytes as nvidia-smi counts
# them) beside torch's own max_memory_allocated/reserved (the script's stdout line; the
# agent's exit report in R as well). Up to J cases run at once (-j, else ESTIMATE_JOBS, else
# 1): a per-process peak does not see its neighbours, so only the sum of what runs together
# must fit the GPU; scripts/estimate/runner.py starts the largest first while the sum of
# their estimates stays within G GB (default 120). Appends one JSON line per case to
# OUTDIR/truth-raw.jsonl (ESTIMATE_RECORD names another file) ({"case", "nvml_peak_bytes",
# "exit_code", "run": {...run's device 0...}, "torch": {...}, "alongside": [...]}), writes
# OUTDIR/env.txt (ESTIMATE_ENV names another; GPU, driver, versions, and accelerate's own
# estimate figures when accelerate is installed: scripts/estimate/accelerate_figures.py,
# computed on the CPU while the cases run), OUTDIR/plan.txt and OUTDIR/failures.log.
# TRUTH_PHASES=1 in the environment profiles each training case phase by phase
# (scripts/estimate/truth.py); --trace records the allocator's history per case.
# --dry-run prints the plan and its packing and runs nothing (no GPU needed).
# Nothing here changes a GPU setting.
set -uo pipefail
usage="usage: estimate-h200.sh [-j J] [--budget-gb G] [--trace] [--dry-run] [--held-back] BINARY OUTDIR [CASE...]"
jobs="${ESTIMATE_JOBS:-1}"
budget=120
runner_flags=()
dry=
while [ $# -gt 0 ]; do
  case "$1" in
    -j) jobs="${2:?$usage}"; shift 2 ;;
    -j*) jobs="${1#-j}"; shift ;;
    --budget-gb) budget="${2:?$usage}"; shift 2 ;;
    --trace) runner_flags+=(--trace); shift ;;
    --dry-run) runner_flags+=(--dry-run); dry=1; shift ;;
    --unprofiled-training) runner_flags+=(--unprofiled-training); shift ;;
    --held-back) runner_flags+=(--held-back); shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "error: unknown option '$1'" >&2; echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?$usage}")"
out="$(realpath -m "${2:?$usage}")"
shift 2
cd "$here/.." || exit 2
export PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
env_file="$out/${ESTIMATE_ENV:-env.txt}"
env_pid=
if [ -z "$dry" ]; then
  mkdir -p "$out"
  if [ ! -s "$env_file" ]; then
    {
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
      nvidia-smi | sed -n 3p
      python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
      python3 -c 'import peft; print("peft", peft.__version__)' 2>&1 | tail -1
      python3 -c 'import accelerate; print("accelerate", accelerate.__version__)' 2>&1 | tail -1
      python3 -c 'import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)' 2>&1 | tail -1
      CUDA_VISIBLE_DEVICES="" python3 scripts/estimate/accelerate_figures.py 2>&1 | tail -40
    } > "$env_file" &
    env_pid=$!
  fi
fi
python3 scripts/estimate/runner.py "$bin" "$out" --jobs "$jobs" --budget-gb "$budget" \
  --record "${ESTIMATE_RECORD:-truth-raw.jsonl}" ${runner_flags[@]+"${runner_flags[@]}"} "$@"
rc=$?
if [ -n "$env_pid" ]; then wait "$env_pid"; fi
exit "$rc"
