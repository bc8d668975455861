"""Run cases of the `vramctl estimate` truth set under `vramctl run`, several at once (issue 16).

    python3 scripts/estimate/runner.py BINARY OUTDIR [--jobs J] [--budget-gb G]
        [--record NAME] [--trace] [--dry-run] (CASE... | --unprofiled-training | --held-back)

Each case is a fresh `python3 scripts/estimate/truth.py CASE` under

    BINARY run --json --report OUTDIR/runs/CASE.json --interval 20ms -- python3 ...

as scripts/estimate-h200.sh always ran it, one process per case. NVML's per-process peak is
the process tree's own, so cases running at the same time do not see each other's memory;
what they share is the GPU's capacity. So cases start largest first (by `BINARY estimate`'s
total) while at most J run and the sum of their estimates stays within G GB (default 120,
of the H200's 141: the largest error of round 1 was 12 % under); a case above G runs alone.

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
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases import BY_NAME, CASES, estimate_args  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "testdata/h200/estimate")
# Files of testdata/h200/estimate whose lines have a phase profile.
PROFILED = ("truth-phases.jsonl", "truth-phases-round2.jsonl")
MEASURED = ("truth-raw.jsonl", "truth-phases.jsonl", "truth-phases-round2.jsonl")
ASSUMED_WALL_S = 20.0
GB = 1e9


def estimate_bytes(binary, c):
    out = subprocess.run([binary, "estimate", *estimate_args(c), "--json"], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out)["total_bytes"]


def lines_of(name):
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def unprofiled_training():
    """Training cases, tuning or seen, that no phase profile in testdata covers."""
    profiled = {r["case"] for name in PROFILED for r in lines_of(name)
                if r.get("exit_code") == 0 and (r.get("torch") or {}).get("phases")}
    return [c["name"] for c in CASES
            if c["mode"] == "train" and c["set"] != "held_back" and c["name"] not in profiled]


def held_back():
    """Every held-back case; an error if one has a measurement in testdata already."""
    names = [c["name"] for c in CASES if c["set"] == "held_back"]
    seen = sorted({r["case"] for name in MEASURED for r in lines_of(name)} & set(names))
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
    a = ap.parse_intermixed_args()
    binary = os.path.realpath(a.binary)
    out = os.path.realpath(a.outdir)
    if a.held_back:
        names = held_back()
    elif a.cases or not a.unprofiled_training:
        names = a.cases or [c["name"] for c in CASES]
    else:
        names = unprofiled_training()
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"error: unknown case(s) {', '.join(unknown)} (cases.py lists them)")
    if a.jobs < 1:
        raise SystemExit(f"error: --jobs '{a.jobs}' must be at least 1")
    budget = a.budget_gb * GB
    sizes = {n: estimate_bytes(binary, BY_NAME[n]) for n in names}
    order = sorted(names, key=lambda n: -sizes[n])
    text = plan_text(order, sizes, a.jobs, budget, past_wall_s(names))
    print(text, file=sys.stderr, flush=True)
    if a.dry_run:
        return
    os.makedirs(f"{out}/runs", exist_ok=True)
    with open(os.path.join(out, "plan.txt"), "w") as f:
        f.write(text + "\n")

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
