"""Issue 34's goal, per held-out case, from what scripts/fit-h200.sh check wrote to OUTDIR:

    python3 scripts/fit/check34.py OUTDIR CASE...

For each case: the truth (the bisection run in OUTDIR as <case>-bisect.json, else the truth
recorded on the same H200 in testdata/h200/fit/, only when OUTDIR/reuse.txt says the machine
and torch are the recorded ones), and <case>-fit.json (the default search, trace predictor).
Prints one PASS/FAIL line per criterion and case:
  trials     fit's trials <= 4
  within     the answer is at most 2 % under the truth
  never-above  the answer is at most the truth
  time       fit's wall_s <= 0.40 x bisection's wall_s
  predictor  the trace predictor was used (else the fallback's reason is printed)
and an informative line with the trace prediction's error against the truth.
Exit status 1 when any line is FAIL, 2 when a case's files are missing.
"""
from __future__ import annotations

import json
import math
import os
import sys

# Truths recorded on the H200 of 2026-12-02 (docs/fit.md; torch 2.11+cu130, 143,771 MiB),
# for the same jobs as fit-h200.sh's cases, range 1..4096, --margin 0.
RECORDED = {
    "resnet": {
        "truth": 3296,
        "bisect_s": 170.34,
        "source": "bisection, testdata/h200/fit/resnet-bisect.json (14 trials)",
    },
    "llama": {
        "truth": 22,
        "bisect_s": None,
        "source": "fit's 22 ok / 23 OOM, testdata/h200/fit/llama-fit.json (its bisection was cut short)",
    },
    # 94 ok, 96 OOM recorded; 95 is settled in OUTDIR/llama-ckpt-settle.txt by one trial.
    "llama-ckpt": {
        "truth": None,
        "bisect_s": None,
        "source": "fit's 94 ok / 96 OOM, testdata/h200/fit/llama-ckpt-fit.json, and one trial at 95 now",
    },
}
RANGE = {"gpt2-seq": (8, 1024), "qwen2-seq": (1, 512)}
DEFAULT_RANGE = (1, 4096)


def bisect_trials(low: int, high: int, truth: int) -> int:
    """Trials `fit --strategy bisect --tolerance 0` makes when `truth` is the edge: low,
    high, then midpoints until the bracket is 1 wide (fit_search's Bisect)."""
    if truth < low:
        return 1
    if truth >= high:
        return 2
    ok, bad, n = low, high, 2
    while bad - ok > 1:
        mid = ok + (bad - ok) // 2
        n += 1
        if mid <= truth:
            ok = mid
        else:
            bad = mid
    return n


def load(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main() -> int:
    out, cases = sys.argv[1], sys.argv[2:]
    reuse = False
    try:
        with open(os.path.join(out, "reuse.txt"), encoding="utf-8") as f:
            reuse = f.read().strip() == "yes"
    except OSError:
        pass
    failed, missing = False, False
    for case in cases:
        fit = load(os.path.join(out, f"{case}-fit.json"))
        if fit is None:
            print(f"FAIL {case}: no {case}-fit.json (see failures.log)")
            missing = True
            continue
        low, high = RANGE.get(case, DEFAULT_RANGE)
        fit_trials = len(fit["trials"])
        mean_trial_s = sum(t["wall_s"] for t in fit["trials"]) / max(fit_trials, 1)
        bisect = load(os.path.join(out, f"{case}-bisect.json"))
        if bisect is not None and bisect.get("answer") is not None:
            truth, bisect_s = bisect["answer"], bisect["wall_s"]
            source = f"bisection in this run ({len(bisect['trials'])} trials)"
        elif reuse and case in RECORDED:
            rec = RECORDED[case]
            truth, bisect_s, source = rec["truth"], rec["bisect_s"], rec["source"]
            if case == "llama-ckpt":
                try:
                    with open(os.path.join(out, "llama-ckpt-settle.txt"), encoding="utf-8") as f:
                        settled = f.read().strip()
                except OSError:
                    settled = ""
                truth = {"ok": 95, "oom": 94}.get(settled)
            if truth is not None and bisect_s is None:
                n = bisect_trials(low, high, truth)
                bisect_s = n * mean_trial_s
                source += f"; bisection's time estimated as {n} trials x this fit's mean trial {mean_trial_s:.1f} s"
        else:
            truth, bisect_s, source = None, None, "none"
        if truth is None:
            print(f"FAIL {case}: no truth (no bisection in {out}, and the recorded one does not apply: {source})")
            missing = True
            continue
        answer = fit.get("answer")
        pred = fit.get("predictor") or {}
        trace = pred.get("trace") or {}
        print(f"# {case}: truth {truth} ({source}); fit {answer} in {fit_trials} trials, {fit['wall_s']:.1f} s; "
              f"values {[t['value'] for t in fit['trials']]}")
        lines = [
            ("trials", fit_trials <= 4, f"{fit_trials} trials (goal <= 4)"),
            ("never-above", answer is not None and answer <= truth, f"answer {answer} vs truth {truth}"),
            (
                "within",
                answer is not None and abs(truth - answer) <= 0.02 * truth,
                f"answer {answer} is {100.0 * ((answer or 0) - truth) / truth:+.2f} % from {truth} (goal within 2 %)",
            ),
            (
                "time",
                bisect_s is not None and fit["wall_s"] <= 0.40 * bisect_s,
                f"fit {fit['wall_s']:.1f} s / bisection {bisect_s or math.nan:.1f} s = "
                f"{fit['wall_s'] / bisect_s if bisect_s else math.nan:.2f} (goal <= 0.40)",
            ),
            (
                "predictor",
                pred.get("used") == "trace",
                f"{pred.get('used')}" + (f" (fallback: {pred.get('fallback')})" if pred.get("fallback") else ""),
            ),
        ]
        for name, ok, what in lines:
            failed |= not ok
            print(f"{'PASS' if ok else 'FAIL'} {case} {name}: {what}")
        if trace.get("value"):
            print(f"# {case}: trace prediction {trace['value']} is {100.0 * (trace['value'] - truth) / truth:+.2f} % "
                  f"from the truth (fixed {trace.get('fixed')}, linear {trace.get('linear')}, quadratic "
                  f"{trace.get('quadratic')}, affine {trace.get('affine')}, unmatched {trace.get('unmatched')}, "
                  f"outside the pool {trace.get('other_bytes')} B)")
    return 2 if missing else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
