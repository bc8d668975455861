"""Put `vramctl estimate` beside the H200 truth set (issue 16) and write the regression table.

    python3 scripts/estimate/compare.py BINARY [--write]

Reads the measured cases from testdata/h200/estimate/ (MEASURED, in order; a case measured
twice keeps its first line, so a case keeps the measurement it was first reported with),
runs `BINARY estimate ... --json` for each case of cases.py, and prints per case: its set
(tuning, seen, held back), NVML's measured peak, the estimate and its error, accelerate's
estimate-memory figure and the formula-only estimate (the same terms without CUDA context,
allocator overhead and allocator-resident buffers) with their errors; then the error per
set. --write also writes testdata/h200/estimate/truth.jsonl, which the Rust regression
test reads (estimate args, measured NVML peak, set).

    python3 scripts/estimate/compare.py BINARY --sharded RAW.jsonl [--report FILE.md]

(issue 36) puts `BINARY estimate ... --gpus N [--fsdp] --json`, a per-GPU figure, beside each
sharded case's line in RAW.jsonl (runner.py --sharded): every rank's own NVML per-process
peak and the max over ranks, each with its error. A row is within 10 % when every rank is
(so the max is too); a rank whose NVML figure is missing (NVML did not list its PID) takes
`vramctl run`'s per-process peak for its PID, and the line says so. One line per case:
`PASS`/`FAIL` for held-back rows (FAIL also for a case that did not run), `TUNE` for tuning
rows (reported, not judged: they may correct the derived terms); then one SUMMARY line per
set. Exit 1 when a held-back row fails. --report writes the same as Markdown tables, tuning
and held-back rows apart, with torch's peaks per rank and the estimate's sharding terms.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases import CASES, SHARDED, estimate_args  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "testdata/h200/estimate")
NOT_FORMULA = {"CUDA context", "allocator overhead", "allocator-resident buffers"}
# Round 1: the first measurement, then the tuning-only extras with phases. Round 2: the
# phase run of scripts/estimate-phases-h200.sh (tuning and seen cases only).
MEASURED = ("truth-raw.jsonl", "truth-phases.jsonl", "truth-phases-round2.jsonl",
            "truth-heldback.jsonl")
ENV_FILES = ("env.txt", "env-round2.txt")
SET_LABEL = {"tuning": "tune", "seen": "seen", "held_back": "held"}


def measured():
    out = {}
    for name in MEASURED:
        path = os.path.join(DATA, name)
        if os.path.exists(path):
            for line in open(path):
                r = json.loads(line)
                if r.get("exit_code") == 0 and r.get("nvml_peak_bytes"):
                    out.setdefault(r["case"], r)
    return out


def accelerate_figures():
    figs = {}
    for name in ENV_FILES:
        path = os.path.join(DATA, name)
        if not os.path.exists(path):
            continue
        for line in open(path):
            if line.startswith("{"):
                row = json.loads(line)
                figs.setdefault(row["config"], row)
    return figs


def peak_allocated(torch_line):
    """The run's peak allocated bytes: the line's own, unless round 1's phase profile reset
    the peak between phases (then unknown); round 2's records give the run's peak."""
    if torch_line.get("run_peak_allocated_bytes") is not None:
        return torch_line["run_peak_allocated_bytes"]
    return None if torch_line.get("phases") else torch_line["peak_allocated_bytes"]


def accelerate_of(c, figs):
    row = figs.get(c["config"])
    if row is None:
        return None
    if c["mode"] == "infer":
        return row["infer_fp16"] if c["precision"] != "fp32" else row["total_size_fp32"]
    if c["lora"]:
        return None  # accelerate has no LoRA figure
    return row["train_fp16"] if c["precision"] == "bf16" else row["train_fp32"]


TOLERANCE = 0.10
# The estimate's terms that sharding adds or divides, shown beside the measurement.
SHARDING_TERMS = ("weights", "gradients", "optimizer states", "DDP gradient buckets", "gathered parameters",
                  "NCCL communicator")
GIB = 2 ** 30


def rank_peaks(row):
    """[(rank, bytes or None, source)] of a sharded line: each rank's own NVML peak, else
    `vramctl run`'s per-process peak for the rank's PID on its GPU."""
    by_pid = {(p.get("pid"), p.get("uuid")): p.get("peak_bytes") for p in row.get("run_processes") or []}
    out = []
    for r in row.get("ranks") or []:
        if r.get("nvml_peak_bytes"):
            out.append((r["rank"], r["nvml_peak_bytes"], "rank"))
        elif by_pid.get((r.get("pid"), r.get("gpu_uuid"))):
            out.append((r["rank"], by_pid[(r.get("pid"), r.get("gpu_uuid"))], "run"))
        else:
            out.append((r["rank"], None, "none"))
    return out


def judge_sharded(c, row, estimate_bytes, tolerance=TOLERANCE):
    """The verdict on one sharded case: {"ok", "problem", "ranks": [(rank, bytes, error,
    within, source)], "max_bytes", "max_error"}; ok needs every rank within tolerance."""
    verdict = {"ok": False, "problem": None, "ranks": [], "max_bytes": None, "max_error": None}
    if row is None:
        verdict["problem"] = "not measured (no line)"
        return verdict
    if row.get("exit_code") != 0 or row.get("timed_out"):
        verdict["problem"] = (f"did not run: exit {row.get('exit_code')}"
                              f"{', timed out' if row.get('timed_out') else ''}")
        return verdict
    if (row.get("torch") or {}).get("smoke"):
        verdict["problem"] = "a smoke run (TRUTH_SMOKE=1) measures nothing"
        return verdict
    peaks = rank_peaks(row)
    if len(peaks) != c["gpus"]:
        verdict["problem"] = f"{len(peaks)} rank records for {c['gpus']} GPUs"
        return verdict
    missing = [r for r, b, _ in peaks if not b]
    if missing:
        verdict["problem"] = f"no NVML figure for rank(s) {', '.join(map(str, missing))}"
        return verdict
    for rank, b, source in peaks:
        err = (estimate_bytes - b) / b
        verdict["ranks"].append((rank, b, err, abs(err) <= tolerance, source))
    verdict["max_bytes"] = max(b for _, b, _, _, _ in verdict["ranks"])
    verdict["max_error"] = (estimate_bytes - verdict["max_bytes"]) / verdict["max_bytes"]
    verdict["ok"] = all(w for _, _, _, w, _ in verdict["ranks"])
    return verdict


def sharded_line(c, v, estimate_bytes):
    label = "TUNE" if c["set"] == "tuning" else ("PASS" if v["ok"] else "FAIL")
    head = f"{label} {c['name']} ({c['set'].replace('_', ' ')}, {c['sharding']} on {c['gpus']} GPUs): "
    if v["problem"]:
        return head + f"estimate {estimate_bytes / GIB:.2f} GiB per GPU; {v['problem']}"
    ranks = "; ".join(f"rank {r} {b / GIB:.2f} GiB {100 * e:+.1f} %{'' if w else ' (outside 10 %)'}"
                      f"{' (run' + chr(39) + 's per-PID figure)' if src == 'run' else ''}"
                      for r, b, e, w, src in v["ranks"])
    within = "every rank within 10 %" if v["ok"] else "not every rank within 10 %"
    return head + (f"estimate {estimate_bytes / GIB:.2f} GiB per GPU, NVML max over ranks "
                   f"{v['max_bytes'] / GIB:.2f} GiB ({100 * v['max_error']:+.1f} %); {ranks}; {within}")


def sharded_report(rows_by_set):
    md = ["# Sharded training: `vramctl estimate --gpus N [--fsdp]` against each rank's NVML peak", ""]
    for name in ("tuning", "held_back"):
        rows = rows_by_set.get(name) or []
        if not rows:
            continue
        md += [f"## {name.replace('_', ' ')} ({len(rows)} cases)", "",
               "| case | sharding | estimate GiB | NVML max GiB | error | per rank NVML GiB (error) | "
               "torch reserved per rank GiB | within 10 % | sharding terms GiB |",
               "| --- | --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
        for c, v, est, row in rows:
            terms = ", ".join(f"{t['name']} {t['bytes'] / GIB:.2f}" for t in est["terms"]
                              if t["name"] in SHARDING_TERMS and t["at_peak"])
            if v["problem"]:
                md.append(f"| {c['name']} | {c['sharding']} | {est['total_bytes'] / GIB:.2f} | - | - | "
                          f"{v['problem']} | - | no | {terms} |")
                continue
            per_rank = ", ".join(f"{b / GIB:.2f} ({100 * e:+.1f} %)" for _, b, e, _, _ in v["ranks"])
            reserved = ", ".join("-" if r.get("peak_reserved_bytes") is None
                                 else f"{r['peak_reserved_bytes'] / GIB:.2f}" for r in row.get("ranks") or [])
            md.append(f"| {c['name']} | {c['sharding']} | {est['total_bytes'] / GIB:.2f} | "
                      f"{v['max_bytes'] / GIB:.2f} | {100 * v['max_error']:+.1f} % | {per_rank} | {reserved} | "
                      f"{'yes' if v['ok'] else 'no'} | {terms} |")
        md.append("")
    return "\n".join(md)


def first_lines(path):
    """Each case's first line in a runner --sharded file (a case measured twice keeps the
    measurement it was first reported with, as measured() does)."""
    out = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                out.setdefault(r["case"], r)
    return out


def main_sharded(args, binary):
    usage = "usage: compare.py BINARY --sharded RAW.jsonl [--report FILE.md]"
    try:
        raw = args[args.index("--sharded") + 1]
        report = args[args.index("--report") + 1] if "--report" in args else None
    except IndexError:
        raise SystemExit(usage) from None
    try:
        lines = first_lines(raw)
    except (OSError, ValueError) as e:
        print(f"FAIL: cannot read the sharded measurements '{raw}': {e}")
        return 1
    rows_by_set = {}
    failed = 0
    for c in SHARDED:
        done = subprocess.run([binary, "estimate", *estimate_args(c), "--json"], capture_output=True, text=True,
                              cwd=ROOT)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            print(f"FAIL: vramctl estimate failed for {c['name']}: {why}")
            return 1
        est = json.loads(done.stdout)
        v = judge_sharded(c, lines.get(c["name"]), est["total_bytes"])
        print(sharded_line(c, v, est["total_bytes"]))
        failed += c["set"] == "held_back" and not v["ok"]
        rows_by_set.setdefault(c["set"], []).append((c, v, est, lines.get(c["name"]) or {}))
    for name in ("tuning", "held_back"):
        rows = rows_by_set.get(name) or []
        errs = sorted(abs(v["max_error"]) for _, v, _, _ in rows if v["max_error"] is not None)
        print(f"SUMMARY {name}: {len(rows)} cases, {len(errs)} measured, "
              f"{sum(v['ok'] for _, v, _, _ in rows)} with every rank within 10 %"
              + (f", max |error| of the max over ranks {100 * errs[-1]:.1f} %" if errs else ""))
    if report:
        with open(report, "w") as f:
            f.write(sharded_report(rows_by_set) + "\n")
    if failed:
        print(f"FAIL: {failed} held-back sharded case(s) not within 10 % on every rank, or not measured")
    return 1 if failed else 0


def main():
    binary = sys.argv[1]
    if "--sharded" in sys.argv:
        sys.exit(main_sharded(sys.argv[2:], binary))
    write = "--write" in sys.argv
    truth = measured()
    figs = accelerate_figures()
    rows = []
    gib = 2 ** 30
    print(f"{'case':36} {'set':5} {'NVML':>7} {'est':>7} {'err':>7} {'accel':>7} {'err':>7} {'formula':>7} {'err':>7}")
    for c in CASES:
        r = truth.get(c["name"])
        if r is None:
            continue
        args = estimate_args(c)
        est = json.loads(subprocess.run([binary, "estimate", *args, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        nvml = r["nvml_peak_bytes"]
        total = est["total_bytes"]
        formula = sum(t["bytes"] for t in est["terms"] if t["at_peak"] and t["name"] not in NOT_FORMULA)
        acc = accelerate_of(c, figs)
        err = lambda x: None if x is None else (x - nvml) / nvml  # noqa: E731
        fmt = lambda x: "-" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
        print(f"{c['name']:36} {SET_LABEL[c['set']]:5} {nvml / gib:7.2f} {total / gib:7.2f} "
              f"{fmt(err(total)):>7} {'-' if acc is None else f'{acc / gib:7.2f}':>7} {fmt(err(acc)):>7} "
              f"{formula / gib:7.2f} {fmt(err(formula)):>7}")
        rows.append({"case": c["name"], "set": c["set"], "args": args[1:],
                     "config": c["config"], "nvml_peak_bytes": nvml,
                     "peak_reserved_bytes": r["torch"]["peak_reserved_bytes"],
                     "peak_allocated_bytes": peak_allocated(r["torch"]),
                     "estimate_bytes": total, "accelerate_bytes": acc, "formula_bytes": formula})
    for name in ("tuning", "seen", "held_back"):
        errs = [abs(x["estimate_bytes"] - x["nvml_peak_bytes"]) / x["nvml_peak_bytes"] for x in rows if x["set"] == name]
        if errs:
            print(f"{name.replace('_', ' ')}: {len(errs)} cases, max |error| {100 * max(errs):.1f}%, "
                  f"mean {100 * sum(errs) / len(errs):.1f}%, within 10%: {sum(e <= 0.10 for e in errs)}")
    if write:
        with open(os.path.join(DATA, "truth.jsonl"), "w") as f:
            for x in rows:
                f.write(json.dumps(x) + "\n")


if __name__ == "__main__":
    main()
