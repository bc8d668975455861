"""Every measured case of every round beside one or more `vramctl estimate` builds (issue 34).

    python3 scripts/estimate/all_rounds.py BINARY [BINARY...] [--mode train|infer]

compare.py judges rounds 1-3 (testdata/h200/estimate/); the later rounds were measured by
scripts/estimate34b-h200.sh into their own directories. This reads the NVML per-process
peak of each case from all of them (the first measurement of a case wins, in the order of
TRUTH_FILES), runs `BINARY estimate ... --json` for it with each binary (runner.py's estimate_bytes: a
failed estimate stops with its error), and prints one line
per case: its name, where it was measured, its set in cases.py, and each binary's error
against NVML. Use it to see which measured rows a change moves (two builds side by side).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import cases  # noqa: E402
from runner import estimate_bytes  # noqa: E402

TRUTH_FILES = [
    "testdata/h200/estimate/truth-raw.jsonl",
    "testdata/h200/estimate/truth-heldback.jsonl",
    "testdata/h200/round4/estimate34b/cases/truth-raw.jsonl",
    "testdata/h200/round5/call3/parts/est5train/cases/truth-raw.jsonl",
    "testdata/h100/round6/call1/parts/est5infer/cases/truth-raw.jsonl",
    "testdata/h100/round6/call1/parts/est6/cases/truth-raw.jsonl",
    "testdata/h100/round7/call1/parts/est7/cases/truth-raw.jsonl",
    "testdata/h100/round7/call2/parts/est8/cases/truth-raw.jsonl",
    "testdata/h100/round8/call1/parts/est9/cases/truth-raw.jsonl",
]


def measured(mode):
    rows = {}
    for rel in TRUTH_FILES:
        with open(os.path.join(ROOT, rel)) as f:
            for line in f:
                r = json.loads(line)
                c = cases.BY_NAME.get(r.get("case"))
                if c is None or r["case"] in rows or not r.get("nvml_peak_bytes"):
                    continue
                if mode and c["mode"] != mode:
                    continue
                rows[r["case"]] = (r["nvml_peak_bytes"], os.path.dirname(rel))
    return rows


def main():
    args = sys.argv[1:]
    mode = None
    if "--mode" in args:
        i = args.index("--mode")
        if i + 1 >= len(args) or args[i + 1] not in ("train", "infer"):
            raise SystemExit("error: --mode takes 'train' or 'infer'")
        mode = args[i + 1]
        del args[i:i + 2]
    if not args:
        raise SystemExit("usage: " + __doc__.strip().splitlines()[2].strip())
    for name, (nvml, where) in measured(mode).items():
        errors = []
        for binary in args:
            total = estimate_bytes(binary, cases.BY_NAME[name])
            errors.append(f"{100 * (total - nvml) / nvml:+7.1f}%")
        print(f"{name:42} {where:48} {cases.BY_NAME[name]['set']:10} {' '.join(errors)}")


if __name__ == "__main__":
    main()
