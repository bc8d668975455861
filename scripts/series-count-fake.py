#!/usr/bin/env python3
"""Series count of `vramctl serve` with and without the owner series, on the fake NVML.

    python3 scripts/series-count-fake.py [BINARY]   # default target/debug/vramctl

8 H200-like GPUs, 30 real processes (`sleep`) on each (240), in 10 Slurm jobs (their
environment, as slurmstepd sets it): process i holds memory on GPU i // 30 and belongs to job
1000 + i % 10, so every job is on every GPU (the worst case for the per-GPU job series).
They are announced through FAKE_NVML_PROCESS_DIR (docs/scenarios.md); the fake library is
target/debug/deps/libfake_nvml.so (built by `cargo test`). Scrapes `serve` once with
`--process-details proc` (owner series) and once with `nvml` (the same series without them)
and prints the samples per family and the difference.
"""
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
import urllib.request

here = os.path.dirname(os.path.abspath(__file__))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "target", "debug", "vramctl")
fake = os.path.join(here, "..", "target", "debug", "deps", "libfake_nvml.so")
GPUS, PER_GPU, JOBS = 8, 30, 10


def scrape(env, details):
    serve = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--interval", "3600", "--peak-window",
         "3600", "--process-details", details],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        address = None
        for line in serve.stderr:
            found = re.match(r"vramctl: serving (?:https?://)?(\S+?)(?:/metrics)?$", line.strip())
            if found:
                address = found.group(1)
            if line.startswith("vramctl: the first collection is served"):
                break
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as answer:
            return answer.read().decode()
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait()


def families(text):
    counts = collections.Counter()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            counts[re.match(r"[a-z_]+", line).group(0)] += 1
    return counts


with tempfile.TemporaryDirectory() as tmp:
    scenario = os.path.join(tmp, "scenario.toml")
    with open(scenario, "w") as f:
        for gpu in range(GPUS):
            f.write(f'[[gpu]]\nname = "NVIDIA H200"\nuuid = "GPU-0000000{gpu}-1111-2222-3333-444444444444"\n'
                    'memory_total = "140 GiB"\n')
    procs = os.path.join(tmp, "procs")
    os.mkdir(procs)
    sleepers = []
    try:
        for i in range(GPUS * PER_GPU):
            job = 1000 + i % JOBS
            env = dict(os.environ, SLURM_JOB_ID=str(job), SLURM_STEP_ID="0",
                       SLURM_JOB_USER=f"user{job}", SLURM_JOB_PARTITION="gpu")
            sleeper = subprocess.Popen(["sleep", "600"], env=env)
            sleepers.append(sleeper)
            with open(os.path.join(procs, str(sleeper.pid)), "w") as f:
                f.write(f"{i // PER_GPU} {(1 + i % 7) << 28}\n")
        runtime = os.path.join(tmp, "runtime")
        os.mkdir(runtime, 0o700)
        env = {"PATH": os.environ["PATH"], "VRAMCTL_NVML_LIB": fake, "FAKE_NVML_SCENARIO": scenario,
               "FAKE_NVML_TIME": "0", "FAKE_NVML_PROCESS_DIR": procs, "VRAMCTL_RUNTIME_DIR": runtime,
               "VRAMCTL_DRM_ROOT": os.path.join(tmp, "no-drm")}
        with_owners = families(scrape(env, "proc"))
        without = families(scrape(env, "nvml"))
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
print(f"{GPUS} GPUs x {PER_GPU} processes x {JOBS} jobs (default --max-process-series 20)")
for name in sorted(set(with_owners) | set(without)):
    print(f"  {name:45} {without[name]:5} -> {with_owners[name]:5}")
total_with, total_without = sum(with_owners.values()), sum(without.values())
print(f"  {'total':45} {total_without:5} -> {total_with:5} (+{total_with - total_without})")
