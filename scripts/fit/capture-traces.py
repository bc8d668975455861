"""Keeps the allocator traces fit's trace predictor reads, for study on a machine without a
GPU: each (model, batch) runs `scripts/fit/train.py` with the agent armed as `vramctl fit`
arms a calibration trial (a private PYTHONPATH with the package and `_run_site.py` as
sitecustomize, VRAMCTL_AGENT=1, VRAMCTL_FIT_TRACE=1, VRAMCTL_RUN_REPORT_DIR), and its
directory keeps `<pid>.trace.json` (the trace), `<pid>.json` (torch's counters at exit) and
the job's stdout/stderr, gzipped into DIR/<model>-<batch>.tar.gz.

    python3 scripts/fit/capture-traces.py --out DIR convnext:8,37,1282 vit:8,30,1113

Prints one line per run: `trace <model> <batch> exit=N peak_reserved=B peak_allocated=B
events=N wall_s=S`. Needs torch with CUDA (torchvision for the image models).
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def capture(out, model, batch):
    work = tempfile.mkdtemp(prefix=f"trace-{model}-{batch}-")
    site = os.path.join(work, "python")
    reports = os.path.join(work, "reports")
    os.makedirs(reports, mode=0o700)
    shutil.copytree(os.path.join(REPO, "python", "vramctl_agent"), os.path.join(site, "vramctl_agent"))
    shutil.copy(os.path.join(REPO, "python", "vramctl_agent", "_run_site.py"), os.path.join(site, "sitecustomize.py"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p),
               VRAMCTL_AGENT="1", VRAMCTL_FIT_TRACE="1", VRAMCTL_RUN_REPORT_DIR=reports)
    t0 = time.time()
    done = subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--model", model, "--batch", str(batch)],
                          env=env, capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    for name, text in (("stdout.txt", done.stdout), ("stderr.txt", done.stderr)):
        with open(os.path.join(reports, name), "w") as f:
            f.write(text)
    events, reserved, allocated = None, None, None
    for path in glob.glob(os.path.join(reports, "*.trace.json")):
        with open(path) as f:
            trace = json.load(f)
        devices = trace.get("devices") or []
        events = sum(len(d.get("events") or []) for d in devices if isinstance(d, dict))
    for word in done.stdout.split():
        if word.startswith("peak_reserved="):
            reserved = word.split("=", 1)[1]
        if word.startswith("peak_allocated="):
            allocated = word.split("=", 1)[1]
    with tarfile.open(os.path.join(out, f"{model}-{batch}.tar.gz"), "w:gz") as tar:
        tar.add(reports, arcname=f"{model}-{batch}")
    shutil.rmtree(work, ignore_errors=True)
    print(f"trace {model} {batch} exit={done.returncode} peak_reserved={reserved} peak_allocated={allocated} "
          f"events={events} wall_s={wall:.1f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+", help="model:batch,batch,...")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for spec in args.runs:
        model, values = spec.split(":", 1)
        for v in values.split(","):
            capture(args.out, model, int(v))


if __name__ == "__main__":
    main()
