#!/usr/bin/env bash
# `vramctl status --json` and `ps --json` against nvidia-smi's query, with and without a
# running `vramctl record` daemon, in one run (issue 12). On the H200 machine:
#
#   scripts/bench-status-h200.sh path/to/vramctl OUTDIR [N]
#
# Fresh processes, interleaved (so drift hits every command alike), N runs each
# (default 21, at least 15), after 3 warm-up rounds; median, min and max of:
#
#   smi            nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,
#                  memory.free,utilization.gpu,temperature.gpu,power.draw --format=csv
#   status         vramctl status --json, no daemon (an empty socket directory: what a
#                  machine without a daemon costs, the failed socket lookup included)
#   status-daemon  vramctl status --json, a `vramctl record --interval 1s` answering
#   ps             vramctl ps --json, no daemon
#   ps-daemon      vramctl ps --json, the daemon answering
#
# and the ratios to smi (goals: status <= 1.0x, status-daemon <= 0.2x). `ps` measures CPU %
# over 200 ms when a process is on the GPU, so with processes its ratio says little; the
# number of GPU processes at the run is in the results.
#
# Then, to say where the time goes (not part of the figures): one traced `status --json`
# without the daemon (every NVML call timed, VRAMCTL_LOG=trace), three through the daemon
# (the client's time to the answer, debug level), and NVML's own costs in one process
# through ctypes (init, first handle, the calls `status` makes, nvmlShutdown).
#
# Writes 3 files: OUTDIR/results.txt (one `name value` per line), OUTDIR/trace.txt,
# OUTDIR/nvml-ctypes.txt. Needs python3 and nvidia-smi; about 20 s at N = 21 without GPU
# processes, at most 60 s (the runs stop at 45 s and say how many they did).
set -euo pipefail
VRAMCTL=$(realpath "$1")
OUT=$(realpath -m "$2")
N=${3:-21}
if (( N < 15 )); then
  echo "N must be at least 15" >&2
  exit 2
fi
command -v nvidia-smi > /dev/null || { echo "needs nvidia-smi" >&2; exit 2; }
command -v python3 > /dev/null || { echo "needs python3" >&2; exit 2; }
mkdir -p "$OUT"
work=$(mktemp -d)
daemon=""
cleanup() {
  if [[ -n $daemon ]]; then
    kill -TERM "$daemon" 2> /dev/null || true
    wait "$daemon" 2> /dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# No daemon answers in here: an empty directory of sockets (a system daemon in
# /run/vramctl would otherwise answer the "no daemon" runs).
mkdir -m 0700 "$work/none"
# The daemon's own directory; it makes it.
run_dir="$work/run"

VRAMCTL_RUNTIME_DIR="$run_dir" "$VRAMCTL" record --db "$work/history.db" --interval 1s \
  2> "$work/record.log" &
daemon=$!
for _ in $(seq 200); do
  [[ -S $run_dir/daemon.sock ]] && break
  sleep 0.05
done
if [[ ! -S $run_dir/daemon.sock ]]; then
  echo "the recorder did not open its socket:" >&2
  cat "$work/record.log" >&2
  exit 1
fi

python3 - "$VRAMCTL" "$N" "$work/none" "$run_dir" "$OUT/results.txt" <<'EOF'
import os, statistics, subprocess, sys, time

vramctl, n, none_dir, run_dir, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
smi = ["nvidia-smi", "--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,"
       "utilization.gpu,temperature.gpu,power.draw", "--format=csv"]
def env(d):
    e = dict(os.environ)
    e["VRAMCTL_RUNTIME_DIR"] = d
    e.pop("VRAMCTL_LOG", None)
    return e
commands = {
    "smi": (smi, None),
    "status": ([vramctl, "status", "--json"], env(none_dir)),
    "status-daemon": ([vramctl, "status", "--json"], env(run_dir)),
    "ps": ([vramctl, "ps", "--json"], env(none_dir)),
    "ps-daemon": ([vramctl, "ps", "--json"], env(run_dir)),
}

def run(cmd, e):
    t = time.perf_counter()
    subprocess.run(cmd, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000

for _ in range(3):
    for cmd, e in commands.values():
        run(cmd, e)
results = {name: [] for name in commands}
started = time.monotonic()
done = 0
for _ in range(n):
    for name, (cmd, e) in commands.items():
        results[name].append(run(cmd, e))
    done += 1
    if time.monotonic() - started > 45:
        break

apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                      capture_output=True, text=True).stdout.split()
driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"],
                        capture_output=True, text=True).stdout.strip().replace("\n", "; ")
lines = [f"runs_each {done}", f"gpu_processes {len(apps)}", f"gpus_and_driver {driver}",
         f"vramctl {subprocess.run([vramctl, '--version'], capture_output=True, text=True).stdout.strip()}"]
med = {}
for name, times in results.items():
    med[name] = statistics.median(times)
    lines.append(f"{name}_median_ms {med[name]:.1f}")
    lines.append(f"{name}_min_max_ms {min(times):.1f} {max(times):.1f}")
for name in commands:
    if name != "smi":
        lines.append(f"{name}_over_smi {med[name] / med['smi']:.2f}")
lines.append("goal_status_over_smi 1.0")
lines.append("goal_status_daemon_over_smi 0.2")
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF

{
  echo "== status --json, no daemon, VRAMCTL_LOG=trace"
  VRAMCTL_RUNTIME_DIR="$work/none" VRAMCTL_LOG=trace "$VRAMCTL" status --json 2>&1 > /dev/null
  for i in 1 2 3; do
    echo "== status --json through the daemon ($i), VRAMCTL_LOG=debug"
    VRAMCTL_RUNTIME_DIR="$run_dir" VRAMCTL_LOG=debug "$VRAMCTL" status --json 2>&1 > /dev/null
  done
  echo "== the recorder's log"
  grep -v "Committed a tick" "$work/record.log" | tail -20
} > "$OUT/trace.txt"

python3 - > "$OUT/nvml-ctypes.txt" <<'EOF'
# NVML's own costs in one fresh process each, through ctypes: what any tool pays.
import ctypes, statistics, subprocess, sys
PROBE = r'''
import ctypes, time
lib = ctypes.CDLL("libnvidia-ml.so.1")
def t(f, *a):
    s = time.perf_counter(); rc = f(*a); return rc, (time.perf_counter() - s) * 1000
out = []
rc, ms = t(lib.nvmlInit_v2); out.append(("nvmlInit_v2", rc, ms))
h = ctypes.c_void_p()
rc, ms = t(lib.nvmlDeviceGetHandleByIndex_v2, 0, ctypes.byref(h)); out.append(("first_handle", rc, ms))
buf = ctypes.create_string_buffer(96)
rc, ms = t(lib.nvmlDeviceGetUUID, h, buf, 96); out.append(("uuid", rc, ms))
rc, ms = t(lib.nvmlDeviceGetName, h, buf, 96); out.append(("name", rc, ms))
mem_v2 = (2 << 24) | 40  # nvmlMemory_v2: its size and version 2
mem_struct = (ctypes.c_uint * 12)(); mem_struct[0] = mem_v2
rc, ms = t(lib.nvmlDeviceGetMemoryInfo_v2, h, ctypes.byref(mem_struct)); out.append(("memory_v2", rc, ms))
util = (ctypes.c_uint * 2)()
rc, ms = t(lib.nvmlDeviceGetUtilizationRates, h, ctypes.byref(util)); out.append(("utilization", rc, ms))
v = ctypes.c_uint()
rc, ms = t(lib.nvmlDeviceGetTemperature, h, 0, ctypes.byref(v)); out.append(("temperature", rc, ms))
rc, ms = t(lib.nvmlDeviceGetPowerUsage, h, ctypes.byref(v)); out.append(("power", rc, ms))
count = ctypes.c_uint(0)
rc, ms = t(lib.nvmlDeviceGetComputeRunningProcesses_v3, h, ctypes.byref(count), None); out.append(("compute_count_query", rc, ms))
count = ctypes.c_uint(0)
rc, ms = t(lib.nvmlDeviceGetGraphicsRunningProcesses_v3, h, ctypes.byref(count), None); out.append(("graphics_count_query", rc, ms))
rc, ms = t(lib.nvmlDeviceGetMigMode, h, ctypes.byref(v), ctypes.byref(ctypes.c_uint())); out.append(("mig_mode", rc, ms))
rc, ms = t(lib.nvmlShutdown); out.append(("nvmlShutdown", rc, ms))
for name, rc, ms in out:
    print(name, rc, f"{ms:.3f}")
'''
runs = {}
for _ in range(7):
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    for line in res.stdout.splitlines():
        name, rc, ms = line.split()
        runs.setdefault(name, []).append((int(rc), float(ms)))
print("call rc median_ms (7 fresh processes; rc 0 is success, 7 insufficient size = processes exist)")
for name, vals in runs.items():
    print(name, vals[0][0], f"{statistics.median(v for _, v in vals):.3f}")
EOF
cat "$OUT/nvml-ctypes.txt"
echo "wrote $OUT/results.txt $OUT/trace.txt $OUT/nvml-ctypes.txt"
