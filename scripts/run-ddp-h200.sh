#!/usr/bin/env bash
# `vramctl run` of a two-rank DDP job on the 2-GPU machine, beside nvidia-smi (issue 15).
#
#   scripts/run-ddp-h200.sh BINARY OUTDIR
#
# Runs BINARY run --json --report OUTDIR/ddp-run.json -- torchrun --nproc_per_node 2 scripts/fit/ddp.py --batch 8
# (scripts/fit/ddp.py: rank 0 about 8 GiB, rank 1 about 20 GiB by estimate, each on its own
# GPU, held 3 s after the steps) while nvidia-smi --query-compute-apps samples every 200 ms
# (started before, stopped after). What it checks: that run follows both ranks (grandchildren
# of run, through torchrun) and puts each one's memory on its own GPU, the larger on rank 1's,
# against nvidia-smi's per-PID figures and the ranks' own PyTorch counters.
#
# Writes to OUTDIR: ddp-run.json (run's report), ddp-run.stdout (the ranks' `ok` lines, with
# their GPU UUIDs, and run's own output), ddp-run.log (stderr), ddp-smi.csv (pid, gpu_uuid,
# used_memory samples), gpus.csv (index, uuid, name) and ddp-summary.md (peak per GPU and PID
# from nvidia-smi, the ranks' figures, every 'peak' field of run's report). Under a minute.
# Nothing here changes a GPU setting.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="$(realpath "${1:?usage: run-ddp-h200.sh BINARY OUTDIR}")"
out="$(realpath -m "${2:?usage: run-ddp-h200.sh BINARY OUTDIR}")"
mkdir -p "$out"
cd "$here/.."
export PYTHONDONTWRITEBYTECODE=1
# NVLink multicast off (the device machines' rule; ddp.py sets them again in case `run`'s
# child does not inherit this environment).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

nvidia-smi --query-gpu=index,uuid,name --format=csv > "$out/gpus.csv" 2>&1
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv -lms 200 > "$out/ddp-smi.csv" 2>&1 &
smi=$!
sleep 1  # nvidia-smi's first sample is under way before the job starts

timeout -k 10 300 "$bin" run --json --report "$out/ddp-run.json" -- \
  torchrun --nproc_per_node 2 scripts/fit/ddp.py --batch 8 > "$out/ddp-run.stdout" 2> "$out/ddp-run.log"
rc=$?
echo "run exit $rc" >&2

sleep 1  # one more sample after the job is gone
kill -TERM "$smi" 2>/dev/null
wait "$smi" 2>/dev/null

python3 scripts/fit/summarize.py ddp "$out" || echo "summarize.py failed" >&2
cat "$out/ddp-summary.md"
exit "$rc"
