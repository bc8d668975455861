#!/usr/bin/env bash
# Peak RSS and time of `vramctl import` on a generated pair of nvidia-smi logs (issue 29,
# item 10). Usage: scripts/bench-import.sh VRAMCTL OUT_DIR [SECONDS]
#
# The logs: 8 GPUs and 24 processes (3 per GPU) logged every second for SECONDS seconds
# (default 57000, about 16 h: 201 MB of logs), in nvidia-smi's own format. Prints the
# logs' size, then /usr/bin/time -v's elapsed time and maximum resident set size.
set -euo pipefail
vramctl=$1
out=$2
seconds=${3:-57000}
mkdir -p "$out"
gpu="$out/gpu.csv"
apps="$out/apps.csv"
if [ ! -s "$apps" ]; then
    python3 - "$gpu" "$apps" "$seconds" <<'PY'
import sys, datetime
gpu_path, apps_path, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = datetime.datetime(2026, 11, 1)
uuids = [f"GPU-{i:08x}-1111-2222-3333-444444444444" for i in range(8)]
with open(gpu_path, "w") as gpu, open(apps_path, "w") as apps:
    gpu.write("timestamp, index, uuid, name, memory.total [MiB], memory.used [MiB], "
              "memory.free [MiB], utilization.gpu [%], temperature.gpu, power.draw [W]\n")
    apps.write("timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n")
    for s in range(seconds):
        stamp = (t0 + datetime.timedelta(seconds=s)).strftime("%Y/%m/%d %H:%M:%S.000")
        for i, u in enumerate(uuids):
            used = 1000 + (s * 7 + i * 131) % 50000
            gpu.write(f"{stamp}, {i}, {u}, NVIDIA H200, 143771 MiB, {used} MiB, "
                      f"{143771 - used} MiB, {s % 101} %, {40 + s % 30}, {100 + s % 500}.25 W\n")
            for p in range(3):
                apps.write(f"{stamp}, {u}, {1000 + i * 3 + p}, python worker_{p}.py, "
                           f"{used // 4 + p} MiB\n")
PY
fi
du -b "$gpu" "$apps"
rm -f "$out/bench.db" "$out/bench.db-wal" "$out/bench.db-shm" "$out/bench.db.lock"
/usr/bin/time -v "$vramctl" --db "$out/bench.db" import --tz UTC "$gpu" "$apps" 2>"$out/time.txt" || {
    cat "$out/time.txt"
    exit 1
}
grep -E "imported|Elapsed|Maximum resident" "$out/time.txt"
