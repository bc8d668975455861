#!/usr/bin/env bash
# One GPU-machine call for issues 17, 18 and 20 (session of 2026-12-02):
#
#   scripts/check-issues-17-20-h200.sh BIN OUTDIR
#
# 1. doctor (scripts/doctor-h200.sh) on the idle GPU, then `doctor` again while a matmul
#    loop keeps the GPU busy (the PCIe link is judged only under load);
# 2. the DRM backend beside NVML: which DRM drivers the host has, `status --backend all`
#    against `--backend nvml` (the same GPUs, nothing more), `--backend drm` (exit 3 with
#    its hint on a host without AMD/Intel GPUs);
# 3. scripts/snapshot-h200.py (the >= 200 MB snapshot, memory_stats() truth, speed against
#    torch's _memory_viz).
# Writes OUTDIR/{doctor/,drm-check.txt,snapshot/,*.log}. Changes no GPU setting.
set -uo pipefail
bin="$(realpath "${1:?usage: BIN OUTDIR}")"
out="$(realpath -m "${2:?usage: BIN OUTDIR}")"
cd "$(dirname "$0")/.."
mkdir -p "$out"
scripts/doctor-h200.sh "$bin" "$out/doctor" > "$out/doctor-run.log" 2>&1
python3 - > "$out/busy-load.log" 2>&1 <<'PY' &
import time, torch
x = torch.randn(8192, 8192, device="cuda")
t = time.time()
while time.time() - t < 10:
    y = x @ x
torch.cuda.synchronize()
PY
load=$!
sleep 5
{ nvidia-smi --query-gpu=utilization.gpu,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current --format=csv
  timeout 60 "$bin" doctor; echo "exit $?"; } > "$out/doctor/doctor-busy.txt" 2>&1
wait "$load"
{
  echo '$ ls -l /sys/class/drm/*/device/driver'; ls -l /sys/class/drm/*/device/driver 2>&1
  echo '$ status --backend all --no-daemon'; "$bin" status --backend all --no-daemon; echo "exit $?"
  "$bin" status --backend all --json --no-daemon > /tmp/all.json
  "$bin" status --backend nvml --json --no-daemon > /tmp/nvml.json
  python3 -c 'import json,sys
a,n=(json.load(open(f)) for f in ("/tmp/all.json","/tmp/nvml.json"))
ids=lambda d:[(x["index"],x["uuid"]) for x in d["devices"]]
print("all :", ids(a)); print("nvml:", ids(n)); print("SAME" if ids(a)==ids(n) else "DIFFERENT")'
  echo '$ status --backend drm'; "$bin" status --backend drm; echo "exit $?"
} > "$out/drm-check.txt" 2>&1
timeout 420 python3 scripts/snapshot-h200.py --bin "$bin" --out "$out/snapshot" > "$out/snapshot-run.log" 2>&1
echo "snapshot exit $?" >> "$out/snapshot-run.log"
