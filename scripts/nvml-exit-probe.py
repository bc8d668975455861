#!/usr/bin/env python3
"""Issue 30: where a one-shot NVML program's last milliseconds go, on a real GPU.

    python3 scripts/nvml-exit-probe.py [N]          (NVML_LIB=path: another library, e.g. the fake)

`vramctl status` without a daemon spends ~2.5 ms on the H200 between its last log line and
its exit (bench30's timeline.txt), against ~0.5 ms with the fake NVML on a CPU machine.
This probe starts N (default 21) fresh processes per variant. Each loads libnvidia-ml.so.1,
runs nvmlInit_v2, takes GPU 0's handle and reads its memory (what every NVML program does),
then prints its clock and ends one of four ways:

  exit            C's exit(0) with NVML left running: the atexit handlers and the
                  libraries' destructors run (what vramctl's one-shot commands do today)
  shutdown+exit   nvmlShutdown(), then exit(0) (what a program that drops its handle does)
  _exit           _exit(0) with NVML left running: no handlers, no destructors; the kernel
                  closes the descriptors
  shutdown+_exit  nvmlShutdown(), then _exit(0)

The parent times from the child's printed clock to its reaped exit (the same clock), and
prints the median and range per variant, plus nvmlShutdown's own time inside the child.
Also, cold in each fresh process: the first nvmlDeviceGetPowerUsage against the first
nvmlDeviceGetFieldValues(NVML_FI_DEV_POWER_INSTANT) (whether power is cheaper asked that way),
one per process, alternating which goes first. Nothing here changes a GPU setting.
"""
import ctypes
import statistics
import subprocess
import sys
import time

CHILD = r'''
import ctypes, sys, time
how = sys.argv[1]
libc = ctypes.CDLL(None)
import os
nvml = ctypes.CDLL(os.environ.get("NVML_LIB", "libnvidia-ml.so.1"))
assert nvml.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
m = Mem()
assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
extra = ""
if how.startswith("power"):
    class Val(ctypes.Union):
        _fields_ = [("d", ctypes.c_double), ("ui", ctypes.c_uint), ("ul", ctypes.c_ulong),
                    ("ull", ctypes.c_ulonglong), ("sll", ctypes.c_longlong), ("si", ctypes.c_int)]
    class Field(ctypes.Structure):
        _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                    ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                    ("value", Val)]
    def usage():
        p = ctypes.c_uint()
        s = time.perf_counter(); r = nvml.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)); e = time.perf_counter() - s
        return e, r, p.value
    def field():
        f = (Field * 1)(); f[0].fieldId = 186  # NVML_FI_DEV_POWER_INSTANT
        s = time.perf_counter(); r = nvml.nvmlDeviceGetFieldValues(h, 1, f); e = time.perf_counter() - s
        return e, r, (f[0].nvmlReturn, f[0].value.ui)
    order = (usage, field) if how == "power-usage-first" else (field, usage)
    got = {fn.__name__: fn() for fn in order}
    extra = " ".join(f"{k}_us={v[0]*1e6:.0f} {k}_ret={v[1]} {k}_val={str(v[2]).replace(' ', '')}" for k, v in got.items())
shut_us = -1.0
if "shutdown" in how:
    s = time.perf_counter(); nvml.nvmlShutdown(); shut_us = (time.perf_counter() - s) * 1e6
sys.stdout.write(f"{time.time():.6f} {shut_us:.0f} {extra}\n"); sys.stdout.flush()
if how.endswith("_exit"):
    libc._exit(0)
libc.exit(0)
'''


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    variants = ["exit", "shutdown+exit", "_exit", "shutdown+_exit"]
    exit_ms = {v: [] for v in variants}
    shut_us = {v: [] for v in variants}
    for _ in range(n):
        for v in variants:
            p = subprocess.Popen([sys.executable, "-c", CHILD, v], stdout=subprocess.PIPE, text=True)
            line = p.stdout.readline()
            p.wait()
            end = time.time()
            parts = line.split()
            if p.returncode != 0 or len(parts) < 2:
                print(f"# {v}: exit {p.returncode}, '{line.strip()}'")
                continue
            exit_ms[v].append((end - float(parts[0])) * 1e3)
            if float(parts[1]) >= 0:
                shut_us[v].append(float(parts[1]))
    for v in variants:
        x = exit_ms[v]
        if not x:
            continue
        s = f", nvmlShutdown {statistics.median(shut_us[v]):.0f} us" if shut_us[v] else ""
        print(f"figure exit {v}: printed->reaped median {statistics.median(x):.2f} ms "
              f"(min {min(x):.2f}, max {max(x):.2f}, runs {len(x)}){s}")
    for first in ("power-usage-first", "power-field-first"):
        rows = []
        for _ in range(max(5, n // 2)):
            out = subprocess.run([sys.executable, "-c", CHILD, first], capture_output=True, text=True).stdout
            rows.append(dict(kv.split("=", 1) for kv in out.split()[2:]))
        for k in ("usage_us", "field_us"):
            vals = [float(r[k]) for r in rows if k in r]
            if vals:
                print(f"figure cold {first} {k}: median {statistics.median(vals):.0f} us "
                      f"(min {min(vals):.0f}, max {max(vals):.0f})")
        if rows:
            print(f"# {first} sample: {rows[0]}")


if __name__ == "__main__":
    main()
