#!/usr/bin/env bash
# The in-process agent (python/vramctl_agent, docs/agent.md) on a real GPU, beside nvidia-smi.
#
#   scripts/agent-h200.sh OUTDIR
#
# Five PyTorch processes on GPU 0 (scripts/workloads/agent_target.py), each with the agent:
#   cached   20 GiB allocated and freed (PyTorch keeps it cached): `vramctl ps` (its
#            CACHED column, --json's agent.cached_bytes) and the agent's stats show it cached; `vramctl reclaim PID` must return it, its NVML
#            figures before and after must equal nvidia-smi's, and nvidia-smi's figure for
#            the PID must drop by what the framework says it released; a second reclaim
#            finds nothing (exit 1);
#   keeps    4 GiB kept: `vramctl reclaim` must say there was nothing cached, free nothing,
#            exit 1;
#   pinned   8 GiB freed, then a 4 MiB tensor that lands inside the cached 8 GiB segment,
#            with allocation history recorded through the agent (`snapshot --record start`):
#            `vramctl reclaim` frees nothing and names the pinned segment and the 4 MiB
#            block's stack; then a snapshot is written (size and time reported) and
#            recording stopped;
#   capture  inside a CUDA graph capture on its main thread: `reclaim` must be refused
#            (`capturing`) and the capture must still replay correctly; after it, reclaim works;
#   ipython  an IPython shell with `%load_ext vramctl_agent` holding 1 GiB in its output cache
#            and 2 GiB in the last traceback's frame: `reclaim` frees them only with `deep`
#            (skipped, and said so, if IPython is not installed).
# `vramctl` is .dist/vramctl (VRAMCTL_BIN overrides), its audit log a temporary database;
# the other cases use the shipped Python client (vramctl_agent.client). Timings: the
# request's round trip (vramctl's whole run for its cases), the agent's own empty_cache
# time, and request -> NVML showing the drop (pynvml, 5 ms polls; Python-client cases).
#
# Writes 3 files: OUTDIR/summary.md (the figures and a PASS/FAIL per check),
# OUTDIR/agent-h200.json (every answer, vramctl output and reading), OUTDIR/workloads.log.
# Under 120 s. Needs python3 with torch, nvidia-smi; pynvml for the drop latency (else it
# says so).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(realpath -m "${1:?usage: agent-h200.sh OUTDIR}")"
mkdir -p "$out"
export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export PYTHONDONTWRITEBYTECODE=1
export VRAMCTL_BIN="${VRAMCTL_BIN:-$here/../.dist/vramctl}"
exec timeout -k 2 115 python3 - "$here/workloads/agent_target.py" "$out" <<'PY'
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from vramctl_agent import client

workload, out = sys.argv[1], sys.argv[2]
T0 = time.monotonic()
GiB, MiB = 1 << 30, 1 << 20
MODES = ["cached", "keeps", "pinned", "capture", "ipython"]
control = tempfile.mkdtemp(prefix="agent-h200-")
log = open(os.path.join(out, "workloads.log"), "w")
results = {"started_at": time.time(), "cases": {}, "checks": [], "errors": []}
procs = {
    m: subprocess.Popen([sys.executable, workload, m, control], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    for m in MODES
}


def elapsed():
    return round(time.monotonic() - T0, 3)


def check(name, ok, detail):
    results["checks"].append({"check": name, "ok": bool(ok), "detail": detail})


def touch(name):
    open(os.path.join(control, name), "w").close()


def wait_file(name, timeout_s):
    deadline = time.monotonic() + timeout_s
    path = os.path.join(control, name)
    while True:
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def in_time(case):
    """Leaves the rest out (and says so) past 95 s, so that the summary is written well
    inside the 115 s limit."""
    if elapsed() > 95:
        results["errors"].append(f"out of time before the {case} case")
        return False
    return True


def smi_apps():
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError) as err:
        results["errors"].append(f"nvidia-smi: {err}")
        return {}
    apps = {}
    for line in done.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            apps[int(parts[0])] = int(parts[1])
    return apps


def smi_uuid():
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
        return dict(tuple(p.strip() for p in line.split(",", 1)) for line in done.stdout.splitlines() if "," in line)
    except (OSError, subprocess.SubprocessError):
        return {}


try:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]))

    def nvml_used(pid):
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid:
                return p.usedGpuMemory
        return None
except Exception as err:  # noqa: BLE001
    results["errors"].append(f"pynvml unavailable, no drop latency: {err}")
    nvml_used = None


def reclaim(mode, pid, **fields):
    """One reclaim, with nvidia-smi before and after and the time until NVML shows it."""
    case = {"pid": pid, "fields": fields}
    case["smi_before_mib"] = smi_apps().get(pid)
    case["stats_before"] = client.request(pid, "stats", check=False)
    nvml_before = nvml_used(pid) if nvml_used else None
    started = time.monotonic()
    answer = client.request(pid, "reclaim", check=False, **fields)
    case["round_trip_s"] = round(time.monotonic() - started, 4)
    case["answer"] = answer
    case["answer_bytes"] = len(json.dumps(answer, separators=(",", ":")))
    if nvml_used and answer.get("ok") and answer.get("released_bytes", 0) > 0 and nvml_before is not None:
        goal = nvml_before - 0.9 * answer["released_bytes"]
        while time.monotonic() - started < 5:
            used = nvml_used(pid)
            if used is not None and used <= goal:
                case["nvml_drop_after_s"] = round(time.monotonic() - started, 4)
                break
            time.sleep(0.005)
    time.sleep(0.3)  # let nvidia-smi's view settle
    case["smi_after_mib"] = smi_apps().get(pid)
    results["cases"].setdefault(mode, []).append(case)
    return case


VRAMCTL = os.environ["VRAMCTL_BIN"]
AUDIT_DB = os.path.join(control, "audit.db")


def vramctl(*args, timeout=70):
    """One vramctl run: exit code, output, wall time."""
    started = time.monotonic()
    try:
        done = subprocess.run([VRAMCTL, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, "VRAMCTL_DB": AUDIT_DB})
        run = {"exit": done.returncode, "stdout": done.stdout[-200000:], "stderr": done.stderr[-4000:]}
    except (OSError, subprocess.SubprocessError) as err:
        run = {"exit": None, "stdout": "", "stderr": str(err)}
        results["errors"].append(f"vramctl {' '.join(args)}: {err}")
    run["args"] = list(args)
    run["s"] = round(time.monotonic() - started, 4)
    return run


def reclaim_cli(mode, pid, *flags):
    """`vramctl reclaim PID --json`, with nvidia-smi before and after."""
    case = {"pid": pid, "fields": {"vramctl": True, **{f.lstrip("-"): True for f in flags}}}
    case["smi_before_mib"] = smi_apps().get(pid)
    case["stats_before"] = client.request(pid, "stats", check=False)
    run = vramctl("reclaim", str(pid), "--json", *flags)
    case["vramctl"] = run
    try:
        doc = json.loads(run["stdout"])
    except ValueError:
        doc = {}
    report = (doc.get("processes") or [{}])[0]
    case["report"] = report
    case["answer"] = report.get("agent") or {"error": report.get("error")}
    case["round_trip_s"] = run["s"]
    case["answer_bytes"] = len(json.dumps(case["answer"], separators=(",", ":")))
    time.sleep(0.3)  # let nvidia-smi's view settle
    case["smi_after_mib"] = smi_apps().get(pid)
    results["cases"].setdefault(mode, []).append(case)
    return case


def nvml_matches_smi(case):
    """vramctl's NVML figures before and after (MiB) against nvidia-smi's, ±2 MiB."""
    r = case.get("report") or {}
    b, a = r.get("nvml_before_bytes"), r.get("nvml_after_bytes")
    ok = None not in (b, a, case["smi_before_mib"], case["smi_after_mib"]) and abs(b / MiB - case["smi_before_mib"]) <= 2 and abs(a / MiB - case["smi_after_mib"]) <= 2
    return ok, f"vramctl NVML {None if b is None else round(b / MiB)} -> {None if a is None else round(a / MiB)} MiB, nvidia-smi {case['smi_before_mib']} -> {case['smi_after_mib']} MiB"


def smi_dropped_mib(case):
    if case["smi_before_mib"] is None or case["smi_after_mib"] is None:
        return None
    return case["smi_before_mib"] - case["smi_after_mib"]


try:
    ready = {}
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and len(ready) < len(MODES):
        for m in MODES:
            if m not in ready:
                info = wait_file(f"{m}.ready", 0)
                if info is not None:
                    ready[m] = info
                elif procs[m].poll() is not None:
                    ready[m] = {"exited": procs[m].returncode}
                    results["errors"].append(f"{m} exited with {procs[m].returncode} before it was ready (workloads.log)")
        time.sleep(0.05)
    results["ready"] = ready
    results["ready_after_s"] = elapsed()
    for m in MODES:
        if m not in ready:
            results["errors"].append(f"{m} was not ready within 40 s (workloads.log)")

    # hello from every agent before anything else (and before the capture begins).
    for m, info in ready.items():
        if "pid" in info and "socket" in info and info.get("socket"):
            results.setdefault("hello", {})[m] = client.request(info["pid"], "hello", check=False)
    uuids = smi_uuid()
    hello = results.get("hello", {}).get("cached")
    if hello and hello.get("ok") and hello.get("devices"):
        torch_uuid = hello["devices"][0]["uuid"]
        smi = uuids.get("0")
        check("hello: torch's device uuid is NVML's without its prefix", smi is not None and smi.endswith(str(torch_uuid)), f"torch {torch_uuid}, nvidia-smi {smi}")

    # cached: vramctl ps and the agent see the cache; vramctl reclaim returns it all.
    if "pid" in ready.get("cached", {}) and in_time("cached"):
        pid = ready["cached"]["pid"]
        ps = vramctl("ps", "--json", timeout=20)
        results["cached_ps"] = ps
        try:
            row = next((p for p in json.loads(ps["stdout"]).get("processes", []) if p.get("pid") == pid), None)
        except ValueError:
            row = None
        check("cached: vramctl ps lists the process", row is not None, row)
        agent = (row or {}).get("agent") or {}
        check("cached: vramctl ps shows ~20 GiB cached beside NVML's figure", (agent.get("cached_bytes") or 0) >= 20 * GiB, f"NVML {(row or {}).get('used_bytes')}, allocated {agent.get('allocated_bytes')}, cached {agent.get('cached_bytes')}")
        results["cached_ps_text"] = vramctl("ps", timeout=20)
        case = reclaim_cli("cached", pid)
        stats = (case["stats_before"].get("devices") or [{}])[0]
        check("cached: the agent's stats show ~20 GiB cached, none allocated", (stats.get("cached_bytes") or 0) >= 20 * GiB and (stats.get("allocated_bytes") or 0) < 64 * MiB, f"allocated {stats.get('allocated_bytes')}, cached {stats.get('cached_bytes')}")
        a, r = case["answer"], case["report"]
        dropped = smi_dropped_mib(case)
        released_mib = (a.get("released_bytes") or 0) / MiB
        check("cached: vramctl reclaim released the 20 GiB cache, exit 0", case["vramctl"]["exit"] == 0 and (a.get("released_bytes") or 0) >= 20 * GiB and a.get("outcome") == "released_all", f"exit {case['vramctl']['exit']}, released {a.get('released_bytes')} B, outcome {a.get('outcome')}, in {case['round_trip_s']} s; {case['vramctl']['stderr'][-300:]}")
        check("cached: nvidia-smi's drop equals what the framework released (±8 MiB)", dropped is not None and abs(dropped - released_mib) <= 8, f"nvidia-smi {case['smi_before_mib']} -> {case['smi_after_mib']} MiB (-{dropped}), framework {released_mib:.0f} MiB")
        check("cached: vramctl's NVML before and after equal nvidia-smi's", *nvml_matches_smi(case))
        check("cached: vramctl's NVML returned equals nvidia-smi's drop (±8 MiB)", r.get("nvml_returned_bytes") is not None and dropped is not None and abs(r["nvml_returned_bytes"] / MiB - dropped) <= 8, f"vramctl {r.get('nvml_returned_bytes')} B, nvidia-smi -{dropped} MiB")
        again = reclaim_cli("cached", pid)
        check("cached: a second reclaim finds nothing cached, exit 1", again["answer"].get("outcome") == "nothing_cached" and again["vramctl"]["exit"] == 1, f"{again['answer'].get('outcome')}, exit {again['vramctl']['exit']}")
        results["cached_text"] = vramctl("reclaim", str(pid), "--dry-run")

    # keeps: nothing to reclaim, said so.
    if "pid" in ready.get("keeps", {}) and in_time("keeps"):
        case = reclaim_cli("keeps", ready["keeps"]["pid"])
        a = case["answer"]
        check("keeps: nothing cached, nothing released, exit 1", a.get("outcome") == "nothing_cached" and a.get("released_bytes") == 0 and case["vramctl"]["exit"] == 1, f"outcome {a.get('outcome')}, released {a.get('released_bytes')}, exit {case['vramctl']['exit']}")
        check("keeps: vramctl's NVML before and after equal nvidia-smi's", *nvml_matches_smi(case))
        check("keeps: nvidia-smi unchanged (±2 MiB)", smi_dropped_mib(case) is not None and abs(smi_dropped_mib(case)) <= 2, f"{case['smi_before_mib']} -> {case['smi_after_mib']} MiB")

    # pinned: a 4 MiB tensor in the cached 8 GiB segment; history recorded through the agent.
    if "pid" in ready.get("pinned", {}) and in_time("pinned"):
        pid = ready["pinned"]["pid"]
        started = client.request(pid, "snapshot", check=False, record="start", max_entries=10000)
        results["pinned_record_start"] = started
        touch("pinned.go")
        done = wait_file("pinned.done", 10)
        results["pinned_done"] = done
        case = reclaim_cli("pinned", pid)
        results["pinned_text"] = vramctl("reclaim", str(pid))
        a = case["answer"]
        device = (a.get("devices") or [{}])[0]
        segments = device.get("pinned_segments") or []
        seg = segments[0] if segments else {}
        block = (seg.get("blocks") or [{}])[0]
        frames = block.get("frames") or []
        check("pinned: the 4 MiB tensor landed in the cached 8 GiB segment", bool(done and done.get("small_in_big_segment")), done)
        check("pinned: vramctl reclaim released nothing (exit 1) and said why", case["vramctl"]["exit"] == 1 and a.get("outcome") == "nothing_released" and seg.get("total_bytes") == 8 * GiB and block.get("size_bytes") == 4 * MiB, f"outcome {a.get('outcome')}, segment {seg.get('total_bytes')} B with {seg.get('live_bytes')} B live, block {block.get('size_bytes')} B")
        check("pinned: the pinning block's stack names the allocating line", any(f.get("name") == "load_batch" and f.get("filename", "").endswith("agent_target.py") for f in frames), frames[:3])
        check("pinned: nvidia-smi unchanged (±2 MiB)", smi_dropped_mib(case) is not None and abs(smi_dropped_mib(case)) <= 2, f"{case['smi_before_mib']} -> {case['smi_after_mib']} MiB")
        check("pinned: the answer is within the protocol's 1 MiB", case["answer_bytes"] < 1 << 20, f"{case['answer_bytes']} bytes")
        snap_path = os.path.join(control, "pinned-snapshot.pickle")
        t = time.monotonic()
        snap = client.request(pid, "snapshot", check=False, path=snap_path, record="stop")
        results["pinned_snapshot"] = {"answer": snap, "round_trip_s": round(time.monotonic() - t, 4)}
        written = (snap.get("written") or {}) if snap.get("ok") else {}
        check("pinned: snapshot written and recording stopped", snap.get("ok") and written.get("size_bytes", 0) > 0 and not snap["history"]["recording"], f"{written.get('size_bytes')} B, {written.get('trace_entries')} trace entries, snapshot {written.get('snapshot_s')} s + write {written.get('write_s')} s")

    # capture: refused during the capture, which must survive; allowed after.
    if "pid" in ready.get("capture", {}) and in_time("capture"):
        pid = ready["capture"]["pid"]
        touch("capture.arm")
        capturing = wait_file("capture.capturing", 10)
        during = {}
        if capturing:
            during["stats"] = client.request(pid, "stats", check=False)
            during["reclaim"] = client.request(pid, "reclaim", check=False)
        touch("capture.go")
        done = wait_file("capture.done", 10)
        results["capture"] = {"during": during, "done": done}
        code = (during.get("reclaim") or {}).get("error", {}).get("code")
        check("capture: reclaim refused while the main thread captures", code == "capturing", (during.get("reclaim") or {}).get("error"))
        check("capture: stats answered during the capture", (during.get("stats") or {}).get("ok") is True, (during.get("stats") or {}).get("error"))
        check("capture: the capture survived and replays correctly", bool(done) and done.get("capture_error") is None and done.get("replay_ok") is True, done)
        if done:
            case = reclaim("capture", pid)
            check("capture: after it, reclaim returns the 1 GiB cache", case["answer"].get("released_bytes", 0) >= GiB, f"released {case['answer'].get('released_bytes')} B, outcome {case['answer'].get('outcome')}")

    # ipython: the output cache and the last traceback, freed only by deep.
    info = ready.get("ipython", {})
    if info.get("skipped"):
        check("ipython: skipped", True, info["skipped"])
    elif info.get("socket") and in_time("ipython"):
        plain = reclaim("ipython", info["pid"], gc=True)
        deep = reclaim("ipython", info["pid"], deep=True)
        dropped = {d.get("what") for d in (deep["answer"].get("deep") or {}).get("dropped", [])}
        check("ipython: gc alone frees neither", plain["answer"].get("released_bytes", 0) < GiB, f"released {plain['answer'].get('released_bytes')} B")
        check("ipython: deep drops the traceback and the output cache, 3 GiB back", deep["answer"].get("released_bytes", 0) >= 3 * GiB and dropped >= {"last_exception", "output_cache"}, f"released {deep['answer'].get('released_bytes')} B, dropped {sorted(dropped)}, nvidia-smi {deep['smi_before_mib']} -> {deep['smi_after_mib']} MiB")
    elif info:
        check("ipython: started", False, info)
finally:
    touch("stop")
    for p in procs.values():
        try:
            p.wait(timeout=3)
        except subprocess.TimeoutExpired:
            p.kill()
    results["workload_exits"] = {m: p.poll() for m, p in procs.items()}
    results["audit"] = vramctl("history", "--audit", "--json", timeout=20)
    shutil.rmtree(control, ignore_errors=True)
    results["elapsed_s"] = elapsed()
    with open(os.path.join(out, "agent-h200.json"), "w") as f:
        json.dump(results, f, indent=1)

# The summary.
lines = ["# vramctl agent on a real GPU", ""]
hello = results.get("hello", {}).get("cached") or {}
fw = {f["name"]: f for f in hello.get("frameworks", [])}
dev = (hello.get("devices") or [{}])[0]
lines.append(f"torch {fw.get('torch', {}).get('version')} (CUDA {fw.get('torch', {}).get('cuda')}), Python {hello.get('python', {}).get('version')}, {dev.get('name')}; script took {results['elapsed_s']} s (workloads ready after {results.get('ready_after_s')} s)")
lines.append("")
lines.append("| case | request | PID | nvidia-smi MiB before → after | agent reserved before → after (MiB) | released (MiB) | outcome | round trip | empty_cache | NVML drop after |")
lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for mode, cases in results["cases"].items():
    for c in cases:
        a = c["answer"]
        d = (a.get("devices") or [{}])[0]
        fields = " ".join(k for k, v in c["fields"].items() if v) or "-"
        lines.append(
            f"| {mode} | reclaim {fields} | {c['pid']} | {c['smi_before_mib']} → {c['smi_after_mib']} | "
            f"{d.get('reserved_before_bytes', 0) / MiB:.0f} → {d.get('reserved_after_bytes', 0) / MiB:.0f} | "
            f"{a.get('released_bytes', 0) / MiB:.0f} | {a.get('outcome') or (a.get('error') or {}).get('code')} | "
            f"{c['round_trip_s']} s | {a.get('empty_cache_s')} s | {c.get('nvml_drop_after_s', '-')} s |"
        )
lines.append("")
for c in results["checks"]:
    lines.append(f"- {'PASS' if c['ok'] else 'FAIL'} {c['check']}: {c['detail']}")
for e in results["errors"]:
    lines.append(f"- ERROR {e}")
failed = [c for c in results["checks"] if not c["ok"]] or results["errors"]
lines.append("")
lines.append("FAIL: see agent-h200.json and workloads.log" if failed else "PASS: every check held")
with open(os.path.join(out, "summary.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if failed else 0)
PY
