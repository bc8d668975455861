#!/usr/bin/env python3
"""CPU of a running process in consecutive windows, as a share of one core.

    python3 scripts/cpu-windows.py PID [WINDOWS] [SECONDS]

Reads utime + stime of /proc/PID/stat at the start and end of each window (default 4
windows of 40 s) and prints one line per window. Used for `serve`'s CPU over time:
    target/release/vramctl serve --listen 127.0.0.1:19301 --interval 1 &   # with
    # VRAMCTL_NVML_LIB=target/release/libfake_nvml.so
    # FAKE_NVML_SCENARIO=examples/scenarios/eight-gpus-30-procs.toml
    sleep 5; python3 scripts/cpu-windows.py $! 4 40
"""
import os
import sys
import time


def cpu_ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main():
    pid = int(sys.argv[1])
    windows = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 40.0
    hz = os.sysconf("SC_CLK_TCK")
    for n in range(windows):
        a, t = cpu_ticks(pid), time.time()
        time.sleep(seconds)
        b, dt = cpu_ticks(pid), time.time() - t
        print(f"window {n}: {100 * (b - a) / hz / dt:.2f} % of a core", flush=True)


if __name__ == "__main__":
    main()
