#!/usr/bin/env bash
# One nvidia-smi reading for scripts/two_gpu/checks.py: PREFIX.smi-PHASE-gpu.csv and
# PREFIX.smi-PHASE-apps.csv (the fields checks.py's GPU_FIELDS and read_smi_apps expect).
#
#   scripts/two_gpu/smi-read.sh PREFIX PHASE      (PHASE: before, after, ...)
set -u
prefix=${1:?usage: smi-read.sh PREFIX PHASE}
phase=${2:?usage: smi-read.sh PREFIX PHASE}
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,pcie.link.gen.max,pcie.link.width.max \
  --format=csv,noheader,nounits > "$prefix.smi-$phase-gpu.csv" 2>&1
nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits \
  > "$prefix.smi-$phase-apps.csv" 2>&1
