"""A running PyTorch process's OOM, live (issue 33: `top`, the web view, `ps`): a process
with the agent (history recorded) keeps 100 GiB, asks for 60 GiB more (an OOM on an H200,
cause `shortage`), catches it and keeps running. Checks, in the same run:

- `vramctl ps --json` gives the process an `oom` object with a cause within 15 s of the OOM;
- `vramctl serve --process-details proc`'s `/api/now` does too, within 15 s;
- that cause is the one `vramctl snapshot FILE --json` gives on the snapshot the agent kept
  (the same file, its allocator's own `oom` event), and the one the case makes (`shortage`);
- the process is the one nvidia-smi lists, and `ps`'s memory for it is nvidia-smi's.

    python3 scripts/oom-top-h200.py --bin .dist/vramctl --out DIR

Prints one PASS/FAIL line per check; writes DIR/results.json. Exit 1 on any FAIL.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

GiB = 1 << 30
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESS = """
import json, os, sys, time, torch, vramctl_agent
from vramctl_agent import _oom
vramctl_agent.start()
GiB = 1 << 30
keep = torch.empty(100 * GiB, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
at = time.time()
try:
    more = torch.empty(60 * GiB, dtype=torch.uint8, device='cuda')
except torch.cuda.OutOfMemoryError:
    pass
print(json.dumps({"oom_at": at, "snapshot": _oom._snapshot_file}), flush=True)
# Keeps running (and using the GPU) while it is looked at.
x = torch.randn(4096, 4096, device='cuda')
end = time.time() + 120
while time.time() < end:
    x = (x @ x).tanh_()
    torch.cuda.synchronize()
    time.sleep(0.05)
"""
LIMIT_S = 15.0


def line(ok, text, results):
    print(("PASS " if ok else "FAIL ") + text, flush=True)
    results.append({"ok": bool(ok), "check": text})


def oom_of_ps(binary, pid):
    done = subprocess.run([binary, "ps", "--json", "--no-daemon"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        return None, None
    for p in json.loads(done.stdout)["processes"]:
        if p["pid"] == pid:
            return p.get("oom"), p
    return None, None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), VRAMCTL_OOM_HISTORY="1")
    proc = subprocess.Popen([sys.executable, "-c", PROCESS], env=env, stdout=subprocess.PIPE, text=True)
    serve = None
    try:
        told = json.loads(proc.stdout.readline())
        oom_at = told["oom_at"]
        pid = proc.pid
        serve = subprocess.Popen([args.bin, "serve", "--listen", "127.0.0.1:0", "--interval", "1s",
                                  "--process-details", "proc"], stderr=subprocess.PIPE, text=True)
        addr = None
        for text in serve.stderr:
            m = re.search(r"serving https?://([0-9.:]+)", text)
            if m:
                addr = m.group(1)
                break

        # ps --json, asked until it names a cause.
        ps_oom, ps_entry, ps_after = None, None, None
        while time.time() - oom_at < 60:
            ps_oom, ps_entry = oom_of_ps(args.bin, pid)
            if ps_oom and ps_oom.get("state") == "classified":
                ps_after = time.time() - oom_at
                break
            time.sleep(0.5)
        with open(os.path.join(args.out, "ps-oom.json"), "w") as f:
            json.dump({"oom": ps_oom, "after_s": ps_after}, f, indent=1)
        line(ps_after is not None and ps_after <= LIMIT_S,
             f"ps --json: cause {ps_oom and ps_oom.get('cause')} {ps_after if ps_after is None else round(ps_after, 2)} s after the OOM (limit {LIMIT_S} s)", results)

        # serve's /api/now, asked until its entry names a cause.
        now_oom, now_after = None, None
        while addr and time.time() - oom_at < 60:
            try:
                now = json.load(urllib.request.urlopen(f"http://{addr}/api/now", timeout=5))
            except OSError:
                now = {"gpus": []}
            entry = next((p for g in now["gpus"] for p in g["processes"] if p["pid"] == pid), None)
            if entry and entry.get("oom", {}).get("state") == "classified":
                now_oom, now_after = entry["oom"], time.time() - oom_at
                break
            time.sleep(0.5)
        with open(os.path.join(args.out, "api-now-oom.json"), "w") as f:
            json.dump({"oom": now_oom, "after_s": now_after}, f, indent=1)
        line(now_after is not None and now_after <= LIMIT_S,
             f"serve /api/now: cause {now_oom and now_oom.get('cause')} {now_after if now_after is None else round(now_after, 2)} s after the OOM (limit {LIMIT_S} s)", results)

        # The same file through `vramctl snapshot`.
        file_cause = None
        if told.get("snapshot"):
            done = subprocess.run([args.bin, "snapshot", told["snapshot"], "--json"], capture_output=True, text=True, timeout=180)
            with open(os.path.join(args.out, "snapshot.json"), "w") as f:
                f.write(done.stdout)
            try:
                ooms = json.loads(done.stdout).get("oom") or []
                file_cause = ooms[-1]["cause"] if ooms else None
            except ValueError:
                pass
        line(file_cause is not None and ps_oom is not None and ps_oom.get("cause") == file_cause
             and now_oom is not None and now_oom.get("cause") == file_cause,
             f"live causes (ps {ps_oom and ps_oom.get('cause')}, serve {now_oom and now_oom.get('cause')}) = vramctl snapshot's on the kept file ({file_cause})", results)
        line(file_cause == "shortage", f"the cause is the one the case makes: shortage (got {file_cause})", results)
        line(ps_oom is not None and ps_oom.get("count") == 1, f"one OOM counted (got {ps_oom and ps_oom.get('count')})", results)

        # nvidia-smi in the same run: the process and its memory.
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
        apps = {int(l.split(",")[0]): int(l.split(",")[1]) for l in smi.splitlines() if l.strip()}
        ps_mib = (ps_entry or {}).get("used_bytes")
        ps_mib = ps_mib / 2**20 if ps_mib is not None else None
        want = apps.get(pid)
        line(want is not None and ps_mib is not None and abs(ps_mib - want) <= max(64, 0.01 * want),
             f"ps's memory for PID {pid}: {ps_mib if ps_mib is None else round(ps_mib)} MiB, nvidia-smi {want} MiB", results)
    finally:
        for p in (serve, proc):
            if p is not None:
                p.kill()
                p.wait()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
