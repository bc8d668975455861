#!/usr/bin/env bash
# Compare `vramctl status --json` and `vramctl info --json` with nvidia-smi and pynvml on a
# machine with an NVIDIA GPU, while a PyTorch process holds a few GiB. Exit 0 when memory,
# PIDs, hardware facts and NVLink states (`nvidia-smi nvlink -s`) agree (MiB rounding aside).
#
#   scripts/check-real-gpu.sh [path/to/vramctl] [output-dir]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vramctl="${1:-$here/../target/release/vramctl}"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"

# A holder of 4 GiB that stays until we are done.
python3 - <<'PY' &
import time, torch
x = torch.ones(4 * 1024**3 // 4, device="cuda")
torch.cuda.synchronize()
open("/tmp/vramctl-check.ready", "w").close()
time.sleep(120)
PY
holder=$!
trap 'kill $holder 2>/dev/null || true; rm -f /tmp/vramctl-check.ready' EXIT
for _ in $(seq 1 600); do [ -e /tmp/vramctl-check.ready ] && break; sleep 0.1; done
sleep 0.5

# All readings back to back so the GPU has no time to change between them.
"$vramctl" status --json > "$out/status.json"
"$vramctl" info --json > "$out/info.json"
nvidia-smi --query-gpu=index,uuid,name,serial,vbios_version,pci.bus_id,memory.total,memory.reserved,memory.used,memory.free,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,ecc.mode.current,persistence_mode,compute_mode,mig.mode.current,power.limit,driver_version \
  --format=csv,noheader,nounits > "$out/smi-gpu.csv"
nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits > "$out/smi-apps.csv"
# info's NVLinks against nvidia-smi's (an H200 SXM has 18 even alone; an NVL or PCIe card
# may list none): scripts/two_gpu/checks.py's comparison.
nvidia-smi nvlink -s > "$out/nvlink.txt" 2>&1 || true
python3 "$here/check-real-gpu.py" "$out" "$holder"
