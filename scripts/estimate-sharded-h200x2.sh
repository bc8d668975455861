#!/usr/bin/env bash
# Issue 36, item 1: `vramctl estimate`'s sharded training (`--gpus 2`, `--gpus 2 --fsdp`)
# against each rank's own NVML peak, on the 2-GPU machine (nvidia-h200-x2). One call:
#
#   OUT=DIR [VRAMCTL=.dist/vramctl] scripts/estimate-sharded-h200x2.sh [--dry-run]
#
# Runs the 8 cases of scripts/estimate/cases.py's SHARDED (2 tuning, 6 held back, committed
# before anything of them was measured) one after the other, held-back ones first, through
# scripts/estimate/runner.py --sharded: each is
#   vramctl run --json --report ... --interval 20ms -- python3 -m torch.distributed.run
#       --standalone --nproc_per_node 2 scripts/estimate/truth.py CASE
# one rank per GPU over NCCL (DDP with its default buckets, or FSDP2 fully_shard per block);
# every rank samples NVML's per-process figure for its own PID every 20 ms beside torch's
# max_memory_allocated/reserved, and rank 0 prints one line with every rank's figures.
# Then scripts/estimate/compare.py --sharded prints one line per case: PASS/FAIL for a
# held-back case (PASS: every rank's NVML peak within 10 % of the per-GPU estimate; FAIL
# also when it did not run), TUNE for a tuning case (reported, not judged), a SUMMARY line
# per set. Exit status: 0 when every held-back case passed, 1 when one failed or did not
# run (a last line says which), 2 on bad usage or no vramctl binary, 3 when fewer than 2 GPUs
# are visible (one line, nothing run).
#
# About 4-6 minutes on two H200s, model building included (cases stop after 150 s each and
# none starts after 420 s; the whole is killed at 500 s). --dry-run prints the plan and runs
# nothing (no GPU needed). Leaves in OUT (at most 8 files): truth-sharded.jsonl (one line per
# case), verdict.txt (the lines printed), report.md (tuning and held-back tables, per-rank
# figures, the estimate's sharding terms), env.txt (GPUs, topology, versions), plan.txt,
# cases.log, runs.tar.gz (each case's run report and the ranks' output), failures.log (only
# when a case failed). Nothing here changes a GPU setting. NVLink multicast stays off
# (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1, which
# truth.py sets again in every rank).
set -uo pipefail
usage="usage: OUT=DIR [VRAMCTL=BINARY] estimate-sharded-h200x2.sh [--dry-run]"
dry=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=(--dry-run) ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "error: unknown argument '$arg'" >&2; echo "$usage" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.." || exit 2
if [ -z "${OUT:-}" ]; then
  echo "error: set OUT to a directory for the results ($usage)" >&2
  exit 2
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error \
  TOKENIZERS_PARALLELISM=false

if [ "${#dry[@]}" -eq 0 ]; then
  # The GPUs this job may use: what nvidia-smi lists, fewer when CUDA_VISIBLE_DEVICES names fewer.
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .)
  if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    named=$(printf '%s' "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
    [ "$named" -lt "$gpus" ] && gpus=$named
  fi
  if [ "$gpus" -lt 2 ]; then
    echo "REFUSED: the sharded estimate set needs 2 GPUs and $gpus are visible (run it on nvidia-h200-x2); nothing was run" >&2
    exit 3
  fi
fi

# shellcheck source=scripts/lib-vramctl-bin.sh
. scripts/lib-vramctl-bin.sh
mkdir -p "$OUT" || exit 2
OUT="$(realpath "$OUT")"

if [ "${#dry[@]}" -gt 0 ]; then
  python3 scripts/estimate/runner.py "$bin" "$OUT" --sharded --dry-run --deadline-s 420
  exit $?
fi

{
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
  nvidia-smi topo -m
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())), "transformers", transformers.__version__, "GPUs", torch.cuda.device_count())'
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM|CUDA_VISIBLE)' | sort
} > "$OUT/env.txt" 2>&1

t0=$(date +%s)
timeout -k 20 500 python3 scripts/estimate/runner.py "$bin" "$OUT" --sharded --case-timeout-s 150 \
  --deadline-s 420 > "$OUT/cases.log" 2>&1
rc_runner=$?
echo "cases: $(( $(date +%s) - t0 )) s, runner exit $rc_runner (log $OUT/cases.log)"

python3 scripts/estimate/compare.py "$bin" --sharded "$OUT/truth-sharded.jsonl" --report "$OUT/report.md" \
  | tee "$OUT/verdict.txt"
rc_compare=${PIPESTATUS[0]}

if [ -d "$OUT/runs" ]; then
  tar -czf "$OUT/runs.tar.gz" -C "$OUT" runs && rm -rf "$OUT/runs"
fi
if [ "$rc_compare" != 0 ]; then
  echo "FAIL: the sharded estimate set failed (compare exit $rc_compare, runner exit $rc_runner; see $OUT/verdict.txt, $OUT/failures.log)"
  exit 1
fi
if [ "$rc_runner" != 0 ]; then
  echo "FAIL: a tuning case did not run (runner exit $rc_runner; see $OUT/failures.log)"
  exit 1
fi
echo "PASS: every held-back sharded case within 10 % of NVML's peak on every rank"
