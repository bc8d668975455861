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
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cases import CASES, estimate_args  # noqa: E402

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


def main():
    binary = sys.argv[1]
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
