"""A running PyTorch process's OOM, live (issue 33: `top`, the web view, `ps`): a process
with the agent (history recorded) keeps 100 GiB, asks for 60 GiB more (an OOM on an H200,
cause `shortage`), catches it and keeps running. On another GPU both sizes scale with its
memory (sizes()): 57 + 34 GiB on an H100 80GB, where 100 GiB alone did not fit. Checks, in
the same run:

- `vramctl serve --process-details proc`, started before the OOM (so its agent poll, every
  10 s, has to notice it), gives the process's `/api/now` entry a cause within 15 s of it;
- `vramctl ps --json`, asked from the OOM on, does too;
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
import threading
import time
import urllib.request

GiB = 1 << 30
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The job; KEEP_GIB and MORE_GIB come from sizes() through its environment.
PROCESS = """
import json, os, sys, time, torch, vramctl_agent
from vramctl_agent import _oom
vramctl_agent.start()
GiB = 1 << 30
keep = torch.empty(int(os.environ['KEEP_GIB']) * GiB, dtype=torch.uint8, device='cuda')
torch.cuda.synchronize()
print(json.dumps({"ready": True}), flush=True)
sys.stdin.readline()  # the go: serve is watching by now
at = time.time()
try:
    more = torch.empty(int(os.environ['MORE_GIB']) * GiB, dtype=torch.uint8, device='cuda')
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
# The H200 this was written for: nvidia-smi's memory.total, MiB.
H200_TOTAL_MIB = 143771


def sizes(total_mib):
    """(keep, more) in GiB for a GPU of `total_mib`: the H200's 100 + 60 GiB, scaled by the
    GPU's memory against the H200's (so exactly 100 + 60 there). keep alone fits (0.71 of
    the GPU), keep + more do not (1.14 of it): the OOM stays a `shortage` on any GPU. An
    H100 80GB (81559 MiB) gets 57 + 34 GiB; its first run would have failed at the 100 GiB
    keep, before any OOM of the case."""
    scale = total_mib / H200_TOTAL_MIB
    return round(100 * scale), round(60 * scale)


def device_total_mib():
    """GPU 0's memory as nvidia-smi reports it, in MiB."""
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return int(out.split()[0])


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
    try:
        total_mib = device_total_mib()
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as err:
        print(f"FAIL the check could not run: nvidia-smi gave no memory.total: {err}", flush=True)
        return 1
    keep_gib, more_gib = sizes(total_mib)
    print(f"GPU 0: {total_mib} MiB; the job keeps {keep_gib} GiB and asks for {more_gib} GiB more", flush=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), VRAMCTL_OOM_HISTORY="1",
               KEEP_GIB=str(keep_gib), MORE_GIB=str(more_gib))
    proc = subprocess.Popen([sys.executable, "-c", PROCESS], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    serve = None
    try:
        assert json.loads(proc.stdout.readline())["ready"]
        pid = proc.pid
        serve = subprocess.Popen([args.bin, "serve", "--listen", "127.0.0.1:0", "--interval", "1s",
                                  "--process-details", "proc"], stderr=subprocess.PIPE, text=True)
        addr = None
        for text in serve.stderr:
            m = re.search(r"serving https?://([0-9.:]+)", text)
            if m:
                addr = m.group(1)
                break
        # Its log keeps coming: drained, so serve never blocks on the pipe.
        threading.Thread(target=lambda: [None for _ in serve.stderr], daemon=True).start()
        # serve has polled the agent (no OOM yet) before the OOM happens.
        started = time.time()
        while addr and time.time() - started < 30:
            try:
                now = json.load(urllib.request.urlopen(f"http://{addr}/api/now", timeout=5))
                if any(p["pid"] == pid for g in now["gpus"] for p in g["processes"]):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        time.sleep(2)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        told = json.loads(proc.stdout.readline())
        oom_at = told["oom_at"]
        found = {}

        def watch_ps():
            while time.time() - oom_at < 60:
                ps_oom, ps_entry = oom_of_ps(args.bin, pid)
                if ps_oom and ps_oom.get("state") == "classified":
                    found["ps"] = (ps_oom, ps_entry, time.time() - oom_at)
                    return
                time.sleep(0.5)

        def watch_serve():
            while addr and time.time() - oom_at < 60:
                try:
                    now = json.load(urllib.request.urlopen(f"http://{addr}/api/now", timeout=5))
                except OSError:
                    now = {"gpus": []}
                entry = next((p for g in now["gpus"] for p in g["processes"] if p["pid"] == pid), None)
                if entry and (entry.get("oom") or {}).get("state") == "classified":
                    found["serve"] = (entry["oom"], time.time() - oom_at)
                    return
                time.sleep(0.25)

        threads = [threading.Thread(target=watch_ps), threading.Thread(target=watch_serve)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ps_oom, ps_entry, ps_after = found.get("ps", (None, None, None))
        now_oom, now_after = found.get("serve", (None, None))
        with open(os.path.join(args.out, "live-oom.json"), "w") as f:
            json.dump({"ps": {"oom": ps_oom, "after_s": ps_after}, "serve": {"oom": now_oom, "after_s": now_after}}, f, indent=1)
        line(now_after is not None and now_after <= LIMIT_S,
             f"serve /api/now: cause {now_oom and now_oom.get('cause')} {now_after if now_after is None else round(now_after, 2)} s after the OOM (limit {LIMIT_S} s)", results)
        line(ps_after is not None and ps_after <= LIMIT_S,
             f"ps --json: cause {ps_oom and ps_oom.get('cause')} {ps_after if ps_after is None else round(ps_after, 2)} s after the OOM (limit {LIMIT_S} s)", results)

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
    except (OSError, ValueError, KeyError, AssertionError, subprocess.SubprocessError) as err:
        line(False, f"the check could not run: {type(err).__name__}: {err}", results)
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
