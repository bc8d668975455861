#!/usr/bin/env python3
"""Does the driver answer NVML's slow per-device queries in parallel? (issue 30)

`status` spends ~1.9 ms on an H100 in queries nvidia-smi's memory query does not make
(utilization 0.89 ms, power 0.56 ms, MIG mode 0.2 ms, the process lists; docs/benchmarks.md).
Asking them at once would hide that only if the driver serves them concurrently. This measures
it with pynvml (its ctypes calls release the GIL): per round, the queries one after another and
then each on its own thread, interleaved, on GPU 0, after warm-up.

    python3 scripts/nvml-parallel-probe.py [ROUNDS]     (default 101; prints PASS/FAIL-free figures)

Prints the median round time of each way and their ratio; changes no GPU setting.

The first run (H200, driver 580, 2026-12-05: testdata/h200/round4/nvml30.log) answered only
for warm queries: after the first call each costs microseconds (utilization 2 us, power 2 us,
MIG mode 161 us, process lists 10 us) and threads made a round 2.04x slower. But `status`
is a fresh process and pays each query's *first* call (0.89 ms for utilization in the H100
trace). So it then measures the cold case too: ROUNDS/4 fresh processes each (init, first
handle, then the five first calls one after another or on threads, alternating), timing only
the first calls.
"""
import json
import os
import subprocess
import statistics
import sys
import threading
import time

import pynvml

QUERIES = {
    "utilization": pynvml.nvmlDeviceGetUtilizationRates,
    "power": pynvml.nvmlDeviceGetPowerUsage,
    "mig_mode": pynvml.nvmlDeviceGetMigMode,
    "compute_processes": pynvml.nvmlDeviceGetComputeRunningProcesses,
    "graphics_processes": pynvml.nvmlDeviceGetGraphicsRunningProcesses,
}


def call(fn, handle):
    try:
        fn(handle)
    except pynvml.NVMLError:
        pass  # not supported here: still a round trip


def serial(handle):
    t = time.perf_counter()
    for fn in QUERIES.values():
        call(fn, handle)
    return time.perf_counter() - t


def parallel(handle):
    threads = [threading.Thread(target=call, args=(fn, handle)) for fn in QUERIES.values()]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


def cold_once(way):
    """In a fresh process: NVML's first calls, one after another or at once; prints seconds."""
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    elapsed = serial(handle) if way == "serial" else parallel(handle)
    print(json.dumps(elapsed))


def cold(rounds):
    got = {"serial": [], "parallel": []}
    for i in range(rounds):
        for way in (("serial", "parallel") if i % 2 == 0 else ("parallel", "serial")):
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--cold-once", way],
                                 capture_output=True, text=True, timeout=60)
            if out.returncode == 0 and out.stdout.strip():
                got[way].append(json.loads(out.stdout.strip().splitlines()[-1]))
    if got["serial"] and got["parallel"]:
        ms = lambda xs: statistics.median(xs) * 1000
        print(f"figure cold serial median_ms {ms(got['serial']):.3f} ({len(got['serial'])} processes)")
        print(f"figure cold parallel median_ms {ms(got['parallel']):.3f} ({len(got['parallel'])} processes)")
        print(f"figure cold ratio parallel/serial {ms(got['parallel']) / ms(got['serial']):.2f}")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--cold-once":
        cold_once(sys.argv[2])
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 101
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    each = {}
    for name, fn in QUERIES.items():
        samples = []
        for _ in range(21):
            t = time.perf_counter()
            call(fn, handle)
            samples.append(time.perf_counter() - t)
        each[name] = statistics.median(samples)
    for _ in range(5):
        serial(handle), parallel(handle)
    s, p = [], []
    for _ in range(rounds):
        s.append(serial(handle))
        p.append(parallel(handle))
    # Threads cost their own start: the same round with no-op work says how much.
    empty = []
    for _ in range(rounds):
        threads = [threading.Thread(target=lambda: None) for _ in QUERIES]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        empty.append(time.perf_counter() - t)
    for name, v in each.items():
        print(f"query {name} median_us {v * 1e6:.0f}")
    ms = lambda xs: statistics.median(xs) * 1000
    print(f"figure serial median_ms {ms(s):.3f}")
    print(f"figure parallel median_ms {ms(p):.3f} (threads alone {ms(empty):.3f})")
    print(f"figure ratio parallel/serial {ms(p) / ms(s):.2f}")
    pynvml.nvmlShutdown()
    cold(max(4, rounds // 4))


if __name__ == "__main__":
    main()
