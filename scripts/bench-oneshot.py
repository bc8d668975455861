"""Wall time of one-shot commands on a GPU machine: vramctl status --json against
nvidia-smi's cheapest query, in the same run, median of N fresh processes each.

    python3 scripts/bench-oneshot.py path/to/vramctl [N]

Also times nvmlInit_v2 and nvmlInitWithFlags(NO_ATTACH) in fresh processes through ctypes,
to show how much of a one-shot command is NVML's own start-up.
"""
import statistics
import subprocess
import sys
import time

vramctl = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 21

commands = {
    "vramctl status --json": [vramctl, "status", "--json"],
    "vramctl status": [vramctl, "status"],
    "vramctl info --json": [vramctl, "info", "--json"],
    "nvidia-smi --query-gpu=memory.used,memory.total --format=csv":
        ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv"],
    "nvidia-smi": ["nvidia-smi"],
}

INIT = r'''
import ctypes, sys, time
lib = ctypes.CDLL("libnvidia-ml.so.1")
t = time.perf_counter()
rc = lib.nvmlInit_v2() if sys.argv[1] == "v2" else lib.nvmlInitWithFlags(2)
dt = time.perf_counter() - t
print(rc, dt * 1000)
'''


def run(cmd):
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - t) * 1000


for _ in range(3):  # warm caches (page cache, persistence)
    for cmd in commands.values():
        run(cmd)
results = {name: [] for name in commands}
for _ in range(n):
    for name, cmd in commands.items():  # interleaved so drift hits all alike
        results[name].append(run(cmd))
print(f"median of {n} runs each, interleaved (ms):")
for name, times in results.items():
    print(f"  {statistics.median(times):8.1f}  (min {min(times):6.1f}, max {max(times):6.1f})  {name}")

for variant in ["v2", "no_attach"]:
    samples = []
    for _ in range(7):
        out = subprocess.run([sys.executable, "-c", INIT, variant], capture_output=True, text=True, check=True)
        rc, ms = out.stdout.split()
        samples.append(float(ms))
    print(f"  {statistics.median(samples):8.1f}  nvmlInit {variant} in-process (rc {rc}), median of 7")
