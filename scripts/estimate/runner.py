"""Run cases of the `vramctl estimate` truth set under `vramctl run`, several at once (issue 16).

    python3 scripts/estimate/runner.py BINARY OUTDIR [--jobs J] [--budget-gb G]
        [--record NAME] [--trace] [--dry-run] [--gpu-total-bytes N]
        (CASE... | --unprofiled-training | --held-back)

Each case is a fresh `python3 scripts/estimate/truth.py CASE` under

    BINARY run --json --report OUTDIR/runs/CASE.json --interval 20ms -- python3 ...

as scripts/estimate-h200.sh always ran it, one process per case. NVML's per-process peak is
the process tree's own, so cases running at the same time do not see each other's memory;
what they share is the GPU's capacity. So cases start largest first (by `BINARY estimate`'s
total) while at most J run and the sum of their estimates stays within G GB (default 120,
of the H200's 141: the largest error of round 1 was 12 % under); a case above G runs alone.
A case whose estimate is above GPU 0's whole memory (nvidia-smi's memory.total, or
--gpu-total-bytes) is not run: it prints `skip CASE: needs N GiB, this GPU has M` and gets a
line with "skipped" and "exit_code": null (not run, neither a pass nor a failure). No case of
cases.py is that large for an H200; on an H100 80GB (79.6 GiB) some are.

Appends one JSON line per case to OUTDIR/NAME (default truth-raw.jsonl) as it ends, in the
format of round 1 ({"case", "exit_code", "wall_s", "nvml_peak_bytes", "run_device", "oom",
"torch"}) plus "estimate_bytes" (what it was packed by) and "alongside" (the cases whose
runs overlapped it); a failure gets its line too, and 15 lines of its stderr in
OUTDIR/failures.log. --trace sets TRUTH_TRACE=OUTDIR/runs/CASE.trace.json.gz (truth.py's
allocator history). --dry-run prints the plan (the order, the packing and its expected
wall time from round 1's durations, 20 s for a case never run) and runs nothing; the plan
is written to OUTDIR/plan.txt as well when it runs. --unprofiled-training takes every
training case that is not held back and has no phase profile in testdata/h200/estimate/
yet (round 2's phase run). --held-back takes every held-back case and refuses to run if
testdata/h200/estimate/ holds a measurement of one already (the one evaluation run).

--sharded (issue 36) takes the cases of cases.SHARDED instead (all of them, the CASEs named,
or with --held-back the held-back ones, refused once truth-sharded.jsonl in testdata holds
one), one at a time, each on all its GPUs:

    BINARY run --json --report OUTDIR/runs/CASE.json --interval 20ms --
        python3 -m torch.distributed.run --standalone --nproc_per_node GPUS scripts/estimate/truth.py CASE

(killed with its process group after --case-timeout-s, default 150, or when --deadline-s
from the start has passed: a case that cannot start before it gets a line that says so;
SIGTERM to the runner ends the case running with its ranks first). Held-back cases run
first, so that a run cut short has measured the judged ones. Its line in
OUTDIR/NAME (default truth-sharded.jsonl with --sharded): {"case", "set", "gpus",
"sharding", "exit_code", "timed_out", "wall_s", "estimate_bytes", "nvml_peak_bytes" (the
max over ranks of each rank's own NVML per-process peak), "ranks" (each rank's NVML and
torch figures, truth.py's record), "run_devices" and "run_processes" (`vramctl run`'s peaks
per GPU and per PID, a second view of the same processes), "torch" (rank 0's line)}.
--smoke runs them as truth.py's TRUTH_SMOKE=1 (2 blocks, batch 1 x 32) without `vramctl run`
(TRUTH_DEVICE=cpu in the environment: on the CPU over gloo): the path, not a measurement.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases import BY_NAME, CASES, SHARDED, estimate_args  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "testdata/h200/estimate")
# Files of testdata/h200/estimate whose lines have a phase profile.
PROFILED = ("truth-phases.jsonl", "truth-phases-round2.jsonl")
MEASURED = ("truth-raw.jsonl", "truth-phases.jsonl", "truth-phases-round2.jsonl")
MEASURED_SHARDED = ("truth-sharded.jsonl",)
ASSUMED_WALL_S = 20.0
CASE_TIMEOUT_S = 150.0
GB = 1e9
GiB = 1 << 30


def estimate_bytes(binary, c):
    done = subprocess.run([binary, "estimate", *estimate_args(c), "--json"], capture_output=True, text=True,
                          cwd=ROOT)
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise SystemExit(f"error: vramctl estimate failed for {c['name']}: {why}")
    return json.loads(done.stdout)["total_bytes"]


def device_total_bytes():
    """GPU 0's memory as nvidia-smi reports it (memory.total), or None where there is no
    nvidia-smi or it gives no number (then nothing is skipped for its size)."""
    try:
        done = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
        return int(done.stdout.split()[0]) << 20 if done.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def too_large(names, sizes, total_bytes):
    """{case: the line that says why it is not run} for the cases whose estimate is above
    the GPU's whole memory: such a case cannot fit, so its run would only measure the GPU."""
    if not total_bytes:
        return {}
    return {n: f"skip {n}: needs {sizes[n] / GiB:.1f} GiB, this GPU has {total_bytes / GiB:.1f}"
            for n in names if sizes[n] > total_bytes}


def record_skipped(out, name, c, why, estimate, total_bytes):
    """The line of a case not run for its size: no exit code, so no reader takes it for a
    measurement or a failure."""
    with open(os.path.join(out, name), "a") as f:
        f.write(json.dumps({"case": c, "exit_code": None, "skipped": why, "estimate_bytes": estimate,
                            "gpu_total_bytes": total_bytes}) + "\n")


def lines_of(name):
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def unprofiled_training():
    """Training cases, tuning or seen, that no phase profile in testdata covers."""
    profiled = {r["case"] for name in PROFILED for r in lines_of(name)
                if r.get("exit_code") == 0 and (r.get("torch") or {}).get("phases")}
    return [c["name"] for c in CASES
            if c["mode"] == "train" and c["set"] != "held_back" and c["name"] not in profiled]


def held_back(cases=CASES, measured=MEASURED):
    """Every held-back case; an error if one has a measurement in testdata already."""
    names = [c["name"] for c in cases if c["set"] == "held_back"]
    # A line of a case skipped for its size (too_large) is no measurement.
    seen = sorted({r["case"] for name in measured for r in lines_of(name) if not r.get("skipped")} & set(names))
    if seen:
        raise SystemExit(f"error: held-back case(s) measured already: {', '.join(seen)}")
    return names


def past_wall_s(names):
    """Each case's wall time when it last ran alone (round 1), for the dry run's timeline; a
    case never run takes the longest of a measured case of its config and mode."""
    walls = {}
    for name in MEASURED:
        for r in lines_of(name):
            if r.get("wall_s") and not r.get("alongside"):
                walls[r["case"]] = r["wall_s"]
    alike = {}
    for n in names:
        if n not in walls:
            c = BY_NAME[n]
            like = [w for m, w in walls.items()
                    if m in BY_NAME and (BY_NAME[m]["config"], BY_NAME[m]["mode"]) == (c["config"], c["mode"])]
            if like:
                alike[n] = max(like)
    return walls, alike


def pack(order, sizes, jobs, budget, duration):
    """The schedule the runner follows when each case takes duration(case) seconds:
    [(start_s, end_s, case)], largest first, a case starting when it fits."""
    pending = list(order)
    running = []  # (end_s, case)
    now = 0.0
    schedule = []
    while pending:
        used = sum(sizes[c] for _, c in running)
        pick = next((c for c in pending if len(running) < jobs and (not running or used + sizes[c] <= budget)),
                    None)
        if pick is None:
            running.sort()
            now, _ = running.pop(0)
            continue
        pending.remove(pick)
        running.append((now + duration(pick), pick))
        schedule.append((now, now + duration(pick), pick))
    return schedule


def plan_text(order, sizes, jobs, budget, walls_alike):
    walls, alike = walls_alike
    walls = {**alike, **walls}
    schedule = pack(order, sizes, jobs, budget, lambda c: walls.get(c, ASSUMED_WALL_S))
    lines = [f"plan: {len(order)} cases, at most {jobs} at once, estimates summed within {budget / GB:.0f} GB"]
    lines.append(f"{'start s':>8} {'end s':>7} {'estimate GB':>11}  case (its wall time alone, else the longest "
                 f"of its config and mode, else {ASSUMED_WALL_S:.0f} s)")
    for start, end, c in schedule:
        note = "  (like its config)" if c in alike else "" if c in walls else "  (assumed)"
        lines.append(f"{start:8.1f} {end:7.1f} {sizes[c] / GB:11.1f}  {c}{note}")
    total = max((end for _, end, _ in schedule), default=0.0)
    lines.append(f"expected wall time {total:.0f} s for the cases (one at a time: "
                 f"{sum(walls.get(c, ASSUMED_WALL_S) for c in order):.0f} s)")
    return "\n".join(lines)


def record(out, name, c, rc, t0, t1, estimate, alongside):
    rec = {"case": c, "exit_code": rc, "wall_s": round(t1 - t0, 2), "estimate_bytes": estimate,
           "alongside": sorted(alongside)}
    try:
        with open(f"{out}/runs/{c}.json") as f:
            run = json.load(f)
        dev = run["devices"][0] if run.get("devices") else {}
        rec["nvml_peak_bytes"] = dev.get("peak_bytes")
        rec["run_device"] = dev
        rec["oom"] = run.get("oom")
    except Exception as e:  # a failed case still gets its line
        rec["run_error"] = repr(e)
    with open(f"{out}/runs/{c}.out") as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    rec["torch"] = json.loads(lines[-1]) if lines else None
    if not lines:
        with open(f"{out}/runs/{c}.err") as f:
            rec["stderr_tail"] = f.read()[-1500:]
    with open(os.path.join(out, name), "a") as f:
        f.write(json.dumps(rec) + "\n")
    if rc != 0:
        with open(f"{out}/runs/{c}.err") as f:
            tail = f.read().splitlines()[-15:]
        with open(os.path.join(out, "failures.log"), "a") as f:
            f.write(f"{c} exit {rc}\n" + "\n".join(tail) + "\n")


def sharded_command(binary, out, c, smoke=False):
    """The command line of sharded case `c`: torchrun (as `python3 -m torch.distributed.run`,
    with this interpreter, the one that has torch) under `vramctl run`, or alone for --smoke."""
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", str(c["gpus"]), "scripts/estimate/truth.py", c["name"]]
    if smoke:
        return job
    return [binary, "run", "--json", "--report", f"{out}/runs/{c['name']}.json", "--interval", "20ms",
            "--", *job]


def record_sharded(out, name, c, rc, timed_out, wall_s, estimate):
    rec = {"case": c["name"], "set": c["set"], "gpus": c["gpus"], "sharding": c["sharding"],
           "exit_code": rc, "timed_out": timed_out, "wall_s": round(wall_s, 2), "estimate_bytes": estimate}
    try:
        with open(f"{out}/runs/{c['name']}.json") as f:
            run = json.load(f)
        rec["run_devices"] = [{k: d.get(k) for k in ("index", "uuid", "peak_bytes", "used_at_start_bytes")}
                              for d in run.get("devices") or []]
        rec["run_processes"] = [{k: p.get(k) for k in ("pid", "uuid", "peak_bytes", "command")}
                                for p in run.get("processes") or []]
        rec["oom"] = run.get("oom")
    except (OSError, ValueError) as e:  # --smoke, or a run that left no report: the line still comes
        rec["run_error"] = repr(e)
    with open(f"{out}/runs/{c['name']}.out") as f:
        lines = [line for line in f.read().splitlines() if line.startswith("{")]
    line = json.loads(lines[-1]) if lines else None
    rec["torch"] = line
    rec["nvml_peak_bytes"] = line.get("nvml_peak_bytes") if line else None
    rec["ranks"] = line.get("ranks") if line else None
    if not lines or rc != 0:
        with open(f"{out}/runs/{c['name']}.err") as f:
            tail = f.read().splitlines()[-15:]
        rec["stderr_tail"] = "\n".join(tail)[-1500:]
        with open(os.path.join(out, "failures.log"), "a") as f:
            f.write(f"{c['name']} exit {rc}{' (timed out)' if timed_out else ''}\n" + "\n".join(tail) + "\n")
    with open(os.path.join(out, name), "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def stop_group(proc):
    """SIGTERM to the case's process group (vramctl run, torchrun and every rank), SIGKILL
    10 s later; its exit status."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    except ProcessLookupError:
        return proc.wait()


def run_sharded(binary, out, names, record_name, sizes, smoke, timeout_s, dry_run, deadline_s=None):
    """The sharded cases one after the other (each takes every GPU it names), held-back
    ones first."""
    started = time.time()
    names = sorted(names, key=lambda n: BY_NAME[n]["set"] != "held_back")
    lines = [f"plan: {len(names)} sharded cases, one at a time, held back first, each killed after "
             f"{timeout_s:.0f} s" + (f", none started after {deadline_s:.0f} s" if deadline_s else "")]
    for n in names:
        c = BY_NAME[n]
        command = " ".join(sharded_command(binary, out, c, smoke))
        lines.append(f"{c['set']:9} {sizes[n] / GB:6.1f} GB per GPU  {command}")
    text = "\n".join(lines)
    print(text, file=sys.stderr, flush=True)
    if dry_run:
        return 0
    os.makedirs(f"{out}/runs", exist_ok=True)
    with open(os.path.join(out, "plan.txt"), "w") as f:
        f.write(text + "\n")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if smoke:
        env["TRUTH_SMOKE"] = "1"
    failed = 0
    running = []

    def terminate(signum, _frame):
        for proc in running:
            stop_group(proc)
        raise SystemExit(f"error: stopped by signal {signum} during {n}")

    signal.signal(signal.SIGTERM, terminate)
    for n in names:
        c = BY_NAME[n]
        t0 = time.time()
        left = timeout_s if not deadline_s else min(timeout_s, deadline_s - (t0 - started))
        if left <= 0:
            with open(os.path.join(out, record_name), "a") as f:
                f.write(json.dumps({"case": n, "set": c["set"], "gpus": c["gpus"], "sharding": c["sharding"],
                                    "exit_code": None, "skipped": f"the runner's deadline of {deadline_s:.0f} s "
                                    "had passed", "estimate_bytes": sizes[n]}) + "\n")
            print(f"{n} skipped: deadline", file=sys.stderr, flush=True)
            failed += 1
            continue
        with open(f"{out}/runs/{n}.out", "w") as so, open(f"{out}/runs/{n}.err", "w") as se:
            # A session of its own, so that a case past its time is killed with every rank.
            proc = subprocess.Popen(sharded_command(binary, out, c, smoke), stdout=so, stderr=se, cwd=ROOT,
                                    env=env, start_new_session=True)
            running.append(proc)
            timed_out = False
            try:
                rc = proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                timed_out = True
                rc = stop_group(proc)
            running.remove(proc)
        rec = record_sharded(out, record_name, c, rc, timed_out, time.time() - t0, sizes[n])
        ok = rc == 0 and rec["torch"] is not None
        failed += not ok
        print(f"{n} rc={rc}{' timed out' if timed_out else ''} {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("binary")
    ap.add_argument("outdir")
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--jobs", "-j", type=int, default=1)
    ap.add_argument("--budget-gb", type=float, default=120.0)
    ap.add_argument("--record", default="truth-raw.jsonl")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--unprofiled-training", action="store_true")
    ap.add_argument("--held-back", action="store_true")
    ap.add_argument("--sharded", action="store_true")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--case-timeout-s", type=float, default=CASE_TIMEOUT_S)
    ap.add_argument("--deadline-s", type=float, default=None)
    ap.add_argument("--gpu-total-bytes", type=int, default=None,
                    help="GPU 0's memory, for the size skip (default: nvidia-smi's, none with --dry-run)")
    a = ap.parse_intermixed_args()
    binary = os.path.realpath(a.binary)
    out = os.path.realpath(a.outdir)
    if a.sharded:
        if a.held_back:
            names = held_back(SHARDED, MEASURED_SHARDED)
        else:
            names = a.cases or [c["name"] for c in SHARDED]
        unknown = [n for n in names if n not in BY_NAME or BY_NAME[n].get("gpus", 1) == 1]
        if unknown:
            raise SystemExit(f"error: not sharded case(s) {', '.join(unknown)} (cases.SHARDED lists them)")
        record_name = a.record if a.record != "truth-raw.jsonl" else "truth-sharded.jsonl"
        sizes = {n: estimate_bytes(binary, BY_NAME[n]) for n in names}
        sys.exit(run_sharded(binary, out, names, record_name, sizes, a.smoke, a.case_timeout_s, a.dry_run,
                             a.deadline_s))
    if a.smoke:
        raise SystemExit("error: --smoke is for --sharded")
    if a.held_back:
        names = held_back()
    elif a.cases or not a.unprofiled_training:
        names = a.cases or [c["name"] for c in CASES]
    else:
        names = unprofiled_training()
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: unknown case(s) {', '.join(unknown)} (cases.py lists them)")
    sharded = [n for n in names if BY_NAME[n].get("gpus", 1) > 1]
    if sharded:
        raise SystemExit(f"error: sharded case(s) {', '.join(sharded)} run with --sharded")
    if a.jobs < 1:
        raise SystemExit(f"error: --jobs '{a.jobs}' must be at least 1")
    budget = a.budget_gb * GB
    sizes = {n: estimate_bytes(binary, BY_NAME[n]) for n in names}
    total = a.gpu_total_bytes if a.gpu_total_bytes is not None else None if a.dry_run else device_total_bytes()
    skipped = too_large(names, sizes, total)
    order = sorted((n for n in names if n not in skipped), key=lambda n: -sizes[n])
    text = "\n".join([*skipped.values(), plan_text(order, sizes, a.jobs, budget, past_wall_s(order))])
    print(text, file=sys.stderr, flush=True)
    if a.dry_run:
        return
    os.makedirs(f"{out}/runs", exist_ok=True)
    with open(os.path.join(out, "plan.txt"), "w") as f:
        f.write(text + "\n")
    for n, why in skipped.items():
        record_skipped(out, a.record, n, why, sizes[n], total)

    pending = list(order)
    running = {}  # case -> (process, t0, alongside)
    while pending or running:
        used = sum(sizes[c] for c in running)
        pick = next((c for c in pending if len(running) < a.jobs and (not running or used + sizes[c] <= budget)),
                    None)
        if pick is not None:
            pending.remove(pick)
            env = dict(os.environ)
            if a.trace:
                env["TRUTH_TRACE"] = f"{out}/runs/{pick}.trace.json.gz"
            with open(f"{out}/runs/{pick}.out", "w") as so, open(f"{out}/runs/{pick}.err", "w") as se:
                proc = subprocess.Popen(
                    [binary, "run", "--json", "--report", f"{out}/runs/{pick}.json", "--interval", "20ms", "--",
                     "python3", "scripts/estimate/truth.py", pick],
                    stdout=so, stderr=se, cwd=ROOT, env=env)
            for other in running.values():
                other[2].add(pick)
            running[pick] = (proc, time.time(), set(running))
            continue
        done = [c for c, (proc, _, _) in running.items() if proc.poll() is not None]
        if not done:
            time.sleep(0.2)
            continue
        for c in done:
            proc, t0, alongside = running.pop(c)
            t1 = time.time()
            record(out, a.record, c, proc.returncode, t0, t1, sizes[c], alongside)
            print(f"{c} rc={proc.returncode} {t1 - t0:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
