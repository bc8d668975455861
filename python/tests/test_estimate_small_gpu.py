"""The estimate truth set on a GPU smaller than the H200 it was chosen for (an H100 80GB),
without a GPU: runner.py skips a case whose estimate is above the GPU's whole memory and
says so, and scripts/estimate34b-h200.sh counts such a case, and one that ran out of memory
where its estimate + 10 % does not fit the GPU, as not run: neither a pass nor a failure.
The binary and nvidia-smi are stand-ins (a script each, on PATH or as VRAMCTL)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from harness import PYTHON_DIR

REPO = os.path.dirname(PYTHON_DIR)
ESTIMATE = os.path.join(REPO, "scripts", "estimate")
sys.path.insert(0, ESTIMATE)

import cases  # noqa: E402
import runner  # noqa: E402

GiB = 1 << 30
H100_MIB = 81559  # nvidia-smi's memory.total on an H100 80GB HBM3

# A `vramctl` that answers `estimate ... --json` from FAKE_ESTIMATES ({arguments: bytes}) and
# runs `run --json --report R ... -- python3 scripts/estimate/truth.py CASE` as FAKE_OUTCOMES
# says: "fit" (its NVML peak is its estimate) or "oom" (exit 1 with PyTorch's error).
FAKE_VRAMCTL = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    args = sys.argv[1:]
    if args[0] == "estimate":
        key = " ".join(a for a in args[1:] if a != "--json")
        sizes = json.load(open(os.environ["FAKE_ESTIMATES"]))
        print(json.dumps({"total_bytes": sizes.get(key, 1 << 30),
                          "terms": [{"name": "CUDA context", "bytes": 500 << 20, "at_peak": True}]}))
        sys.exit(0)
    if args[0] == "run":
        report = args[args.index("--report") + 1]
        case = args[-1]
        outcome = json.load(open(os.environ["FAKE_OUTCOMES"])).get(case, "fit")
        peak = json.load(open(os.environ["FAKE_PEAKS"]))[case]
        if outcome == "oom":
            json.dump({"devices": [{"peak_bytes": peak}], "oom": {"cause": "shortage"}}, open(report, "w"))
            print("torch.OutOfMemoryError: CUDA out of memory.", file=sys.stderr)
            sys.exit(1)
        json.dump({"devices": [{"peak_bytes": peak}], "oom": None}, open(report, "w"))
        print(json.dumps({"case": case, "peak_reserved_bytes": peak - (500 << 20)}))
        sys.exit(0)
    sys.exit(2)
    """)

FAKE_SMI = textwrap.dedent(f"""\
    #!/bin/sh
    case "$*" in
      *memory.total*--format=csv,noheader,nounits*) echo {H100_MIB} ;;
      *) echo "NVIDIA H100 80GB HBM3, 580.159.04, {H100_MIB} MiB" ;;
    esac
    """)


def write_exe(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


class TooLargeTest(unittest.TestCase):
    def test_only_a_case_above_the_whole_gpu_is_skipped_and_the_line_says_both_sizes(self) -> None:
        sizes = {"a": 75 * GiB, "b": 81 * GiB, "c": 10 * GiB}
        skipped = runner.too_large(["a", "b", "c"], sizes, H100_MIB << 20)
        self.assertEqual(skipped, {"b": "skip b: needs 81.0 GiB, this GPU has 79.6"})

    def test_without_a_gpu_size_nothing_is_skipped(self) -> None:
        self.assertEqual(runner.too_large(["a"], {"a": 500 * GiB}, None), {})

    def test_a_skipped_line_is_no_measurement_of_a_held_back_case(self) -> None:
        name = next(c["name"] for c in cases.CASES if c["set"] == "held_back")
        saved = runner.lines_of
        try:
            runner.lines_of = lambda _f: [{"case": name, "exit_code": None, "skipped": "skip"}]
            self.assertIn(name, runner.held_back())
            runner.lines_of = lambda _f: [{"case": name, "exit_code": 1}]
            with self.assertRaises(SystemExit):
                runner.held_back()
        finally:
            runner.lines_of = saved


class SmallGpuRunTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        bindir = os.path.join(self.tmp, "bin")
        os.mkdir(bindir)
        self.vramctl = os.path.join(bindir, "vramctl")
        write_exe(self.vramctl, FAKE_VRAMCTL)
        write_exe(os.path.join(bindir, "nvidia-smi"), FAKE_SMI)
        self.env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")

    def fake(self, sizes_gib: dict, outcomes: dict) -> None:
        estimates = {" ".join(cases.estimate_args(cases.BY_NAME[n])): int(g * GiB) for n, g in sizes_gib.items()}
        peaks = {n: int(g * GiB) for n, g in sizes_gib.items()}
        for name, doc in (("FAKE_ESTIMATES", estimates), ("FAKE_OUTCOMES", outcomes), ("FAKE_PEAKS", peaks)):
            path = os.path.join(self.tmp, name)
            with open(path, "w") as f:
                json.dump(doc, f)
            self.env[name] = path

    def test_the_runner_records_a_case_too_large_for_the_gpu_as_skipped_and_runs_the_rest(self) -> None:
        big, small = cases.ROUND4[0], cases.ROUND4[1]
        self.fake({big: 90, small: 8}, {})
        out = os.path.join(self.tmp, "out")
        done = subprocess.run([sys.executable, os.path.join(ESTIMATE, "runner.py"), self.vramctl, out,
                               "--jobs", "2", big, small], capture_output=True, text=True, env=self.env, timeout=120)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn(f"skip {big}: needs 90.0 GiB, this GPU has 79.6", done.stderr)
        with open(os.path.join(out, "truth-raw.jsonl")) as f:
            rows = {r["case"]: r for r in map(json.loads, f)}
        self.assertIsNone(rows[big]["exit_code"])
        self.assertEqual(rows[big]["skipped"], f"skip {big}: needs 90.0 GiB, this GPU has 79.6")
        self.assertFalse(os.path.exists(os.path.join(out, "runs", f"{big}.json")), "a skipped case never runs")
        self.assertEqual(rows[small]["exit_code"], 0)
        self.assertEqual(rows[small]["nvml_peak_bytes"], 8 * GiB)

    def test_round4_on_an_h100_counts_the_cases_that_cannot_be_judged_there_as_not_run(self) -> None:
        sizes = {n: 8 for n in cases.ROUND4}
        too_big, near, fails = cases.ROUND4[0], cases.ROUND4[1], cases.ROUND4[2]
        sizes[too_big] = 85    # above the GPU's 79.6 GiB: not run at all
        sizes[near] = 75       # runs, out of memory; 75 + 10 % = 82.5 GiB > 79.6: cannot be judged
        self.fake(sizes, {near: "oom", fails: "oom"})  # fails: 8 GiB out of memory is a failure
        out = os.path.join(self.tmp, "out")
        done = subprocess.run(["bash", os.path.join(REPO, "scripts", "estimate34b-h200.sh")], capture_output=True,
                              text=True, env=dict(self.env, OUT=out, VRAMCTL=self.vramctl), timeout=280)
        lines = done.stdout.splitlines()
        self.assertIn(f"GPU 0: {H100_MIB} MiB; estimates summed within 68 GB", lines)
        skips = [x for x in lines if x.startswith("skip ")]
        self.assertEqual(len(skips), 2, done.stdout)
        self.assertTrue(skips[0].startswith(f"skip {too_big}: needs 85.0 GiB, this GPU has 79.6"), skips)
        self.assertTrue(skips[1].startswith(f"skip {near}: needs up to 82.5 GiB (estimate + 10 %), "
                                            "this GPU has 79.6: it ran out of memory here"), skips)
        self.assertEqual([x.split()[1] for x in lines if x.startswith("FAIL ")][:1], [fails], done.stdout)
        self.assertEqual(sum(x.startswith("PASS ") and "inverse" not in x for x in lines), len(cases.ROUND4) - 3)
        self.assertIn("SUMMARY not run: 2 of 14 case(s) too large for this GPU (79.6 GiB): neither passed nor "
                      "failed; an H200 runs them", lines)


if __name__ == "__main__":
    unittest.main()
