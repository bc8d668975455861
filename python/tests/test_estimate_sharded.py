"""The sharded cases of the estimate truth set (issue 36) without GPUs: the case list, the
command line each case runs, the verdict compare.py gives a measured line, and the 2-GPU
script's refusal on a machine with fewer GPUs. (That `vramctl estimate` takes every sharded
case's arguments is the Rust integration test `every_sharded_truth_case_is_an_estimate_per_gpu`;
the torchrun path itself was run on the CPU over gloo, docs/estimate.md says how.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
import unittest

from harness import PYTHON_DIR

REPO = os.path.dirname(PYTHON_DIR)
ESTIMATE = os.path.join(REPO, "scripts", "estimate")
SCRIPT = os.path.join(REPO, "scripts", "estimate-sharded-h200x2.sh")
sys.path.insert(0, ESTIMATE)

import cases  # noqa: E402
import compare  # noqa: E402
import nvml_peak  # noqa: E402
import runner  # noqa: E402

GiB = 1 << 30


class ShardedCasesTest(unittest.TestCase):
    def test_every_sharded_case_is_two_gpus_of_ddp_or_fsdp_with_both_sets(self) -> None:
        self.assertTrue(cases.SHARDED)
        for c in cases.SHARDED:
            with self.subTest(case=c["name"]):
                self.assertEqual(c["gpus"], 2)
                self.assertIn(c["sharding"], ("ddp", "fsdp"))
                self.assertEqual(c["mode"], "train")
                self.assertNotIn(c["name"], {x["name"] for x in cases.CASES})
                self.assertIs(cases.BY_NAME[c["name"]], c)
        sets = [c["set"] for c in cases.SHARDED]
        self.assertGreaterEqual(sets.count("tuning"), 2)
        self.assertGreaterEqual(sets.count("held_back"), 6)
        self.assertNotIn("seen", sets, "no sharded case has been measured, so none is seen")
        for sharding in ("ddp", "fsdp"):
            self.assertIn(sharding, [c["sharding"] for c in cases.SHARDED if c["set"] == "held_back"])
        self.assertTrue(any(c["ckpt"] for c in cases.SHARDED if c["set"] == "held_back"))

    def test_single_gpu_cases_stay_single_gpu(self) -> None:
        # estimate-h200.sh, compare.py and the Rust regression test read CASES: a sharded
        # case there would run as one process on one GPU.
        for c in cases.CASES:
            self.assertEqual(c["gpus"], 1, c["name"])
            self.assertIsNone(c["sharding"], c["name"])
            self.assertNotIn("--gpus", cases.estimate_args(c), c["name"])
        self.assertFalse(set(runner.held_back()) & {c["name"] for c in cases.SHARDED})
        self.assertFalse(set(runner.unprofiled_training()) & {c["name"] for c in cases.SHARDED})

    def test_estimate_arguments_name_the_gpus_and_the_sharding(self) -> None:
        for c in cases.SHARDED:
            with self.subTest(case=c["name"]):
                args = cases.estimate_args(c)
                self.assertEqual(args[args.index("--gpus") + 1], "2")
                self.assertEqual("--fsdp" in args, c["sharding"] == "fsdp")
                self.assertNotIn("--zero", args)
                self.assertEqual("--checkpointing" in args, bool(c["ckpt"]))
                self.assertTrue(os.path.isfile(os.path.join(REPO, args[0])), args[0])

    def test_cases_that_are_not_one_job_with_their_estimate_are_refused(self) -> None:
        bad = [
            dict(gpus=2),  # no sharding
            dict(sharding="ddp"),  # one GPU
            dict(gpus=2, sharding="zero2"),
            dict(gpus=2, sharding="fsdp", precision="amp-bf16"),  # autocast gathers fp32
            dict(gpus=2, sharding="ddp", lora=16),
            dict(gpus=2, sharding="ddp", mode="infer", gen=8),
        ]
        for kwargs in bad:
            with self.subTest(kwargs=kwargs), self.assertRaises(ValueError):
                cases.case("x", "gpt2", **kwargs)


class ShardedCommandTest(unittest.TestCase):
    def test_a_case_runs_under_vramctl_run_as_torchrun_with_one_rank_per_gpu(self) -> None:
        c = cases.BY_NAME["tinyllama-fsdp-bf16-b4x2048"]
        cmd = runner.sharded_command("/bin/vramctl", "/out", c)
        self.assertEqual(cmd[:8], ["/bin/vramctl", "run", "--json", "--report",
                                   "/out/runs/tinyllama-fsdp-bf16-b4x2048.json", "--interval", "20ms", "--"])
        self.assertEqual(cmd[8:], [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node", "2", "scripts/estimate/truth.py", "tinyllama-fsdp-bf16-b4x2048"])
        self.assertEqual(runner.sharded_command("/bin/vramctl", "/out", c, smoke=True), cmd[8:])

    def test_the_runner_keeps_single_gpu_and_sharded_cases_apart(self) -> None:
        for args, error in ((["gpt2-ddp-fp32-b8x1024"],
                             "error: sharded case(s) gpt2-ddp-fp32-b8x1024 run with --sharded"),
                            (["--sharded", "gpt2-fp32-b8x512"],
                             "error: not sharded case(s) gpt2-fp32-b8x512 (cases.SHARDED lists them)"),
                            (["--smoke", "gpt2-fp32-b8x512"], "error: --smoke is for --sharded")):
            with self.subTest(args=args):
                done = subprocess.run([sys.executable, os.path.join(ESTIMATE, "runner.py"), "/nonexistent/vramctl",
                                       tempfile.gettempdir(), *args], capture_output=True, text=True, timeout=60)
                self.assertEqual(done.returncode, 1)
                self.assertEqual(done.stderr.strip(), error)


def line(ranks, exit_code=0, run_processes=(), smoke=False):
    torch = {"case": "x", "ranks": ranks}
    if smoke:
        torch["smoke"] = True
    return {"case": "x", "exit_code": exit_code, "timed_out": False, "ranks": ranks, "torch": torch,
            "run_processes": list(run_processes)}


def rank(r, nvml, pid=100, uuid=None):
    return {"rank": r, "pid": pid + r, "gpu_uuid": uuid or f"GPU-{r}", "nvml_peak_bytes": nvml,
            "peak_reserved_bytes": nvml - GiB if nvml else None}


class ShardedVerdictTest(unittest.TestCase):
    c = {"name": "x", "gpus": 2, "set": "held_back", "sharding": "ddp"}

    def test_every_rank_within_ten_percent_passes_and_the_max_over_ranks_is_reported(self) -> None:
        v = compare.judge_sharded(self.c, line([rank(0, 20 * GiB), rank(1, 21 * GiB)]), 22 * GiB)
        self.assertTrue(v["ok"], v)
        self.assertEqual(v["max_bytes"], 21 * GiB)
        self.assertAlmostEqual(v["max_error"], 1 / 21)
        self.assertEqual([(r, w) for r, _, _, w, _ in v["ranks"]], [(0, True), (1, True)])
        text = compare.sharded_line(self.c, v, 22 * GiB)
        self.assertTrue(text.startswith("PASS x (held back, ddp on 2 GPUs): estimate 22.00 GiB per GPU, "
                                        "NVML max over ranks 21.00 GiB (+4.8 %); rank 0 20.00 GiB +10.0 %;"), text)

    def test_one_rank_outside_fails_the_row_even_when_the_max_is_within(self) -> None:
        v = compare.judge_sharded(self.c, line([rank(0, 19 * GiB), rank(1, 21 * GiB)]), 22 * GiB)
        self.assertFalse(v["ok"])
        self.assertLessEqual(abs(v["max_error"]), 0.10)
        text = compare.sharded_line(self.c, v, 22 * GiB)
        self.assertTrue(text.startswith("FAIL "), text)
        self.assertIn("rank 0 19.00 GiB +15.8 % (outside 10 %)", text)

    def test_a_tuning_row_is_reported_not_judged(self) -> None:
        c = dict(self.c, set="tuning")
        v = compare.judge_sharded(c, line([rank(0, 10 * GiB), rank(1, 10 * GiB)]), 22 * GiB)
        self.assertTrue(compare.sharded_line(c, v, 22 * GiB).startswith("TUNE x (tuning"))

    def test_a_rank_nvml_did_not_list_takes_runs_figure_for_its_pid(self) -> None:
        ranks = [rank(0, 20 * GiB), rank(1, None)]
        run = [{"pid": 101, "uuid": "GPU-1", "peak_bytes": 21 * GiB}, {"pid": 101, "uuid": "GPU-0", "peak_bytes": 1}]
        v = compare.judge_sharded(self.c, line(ranks, run_processes=run), 22 * GiB)
        self.assertTrue(v["ok"], v)
        self.assertEqual(v["ranks"][1][1:], (21 * GiB, 1 / 21, True, "run"))
        self.assertIn("(run's per-PID figure)", compare.sharded_line(self.c, v, 22 * GiB))
        none = compare.judge_sharded(self.c, line(ranks), 22 * GiB)
        self.assertEqual(none["problem"], "no NVML figure for rank(s) 1")

    def test_what_measured_nothing_fails(self) -> None:
        problems = {
            "not measured (no line)": None,
            "did not run: exit 1": line([], exit_code=1),
            "a smoke run (TRUTH_SMOKE=1) measures nothing": line([rank(0, GiB), rank(1, GiB)], smoke=True),
            "1 rank records for 2 GPUs": line([rank(0, GiB)]),
        }
        for problem, row in problems.items():
            with self.subTest(problem=problem):
                v = compare.judge_sharded(self.c, row, GiB)
                self.assertFalse(v["ok"])
                self.assertEqual(v["problem"], problem)
                self.assertTrue(compare.sharded_line(self.c, v, GiB).startswith("FAIL x"))


class FakePynvml(types.ModuleType):
    """pynvml as the driver answers it: two GPUs, each listing (pid, usedGpuMemory) pairs
    that a test changes between samples; a list can fail as NVML calls do."""

    class NVMLError(Exception):
        pass

    def __init__(self, listings):
        super().__init__("pynvml")
        self.listings = listings  # uuid -> [(pid, bytes or None)] or an NVMLError
        self.shut = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return len(self.listings)

    def nvmlDeviceGetHandleByIndex(self, i):
        return list(self.listings)[i]

    def nvmlDeviceGetUUID(self, handle):
        return handle.encode()  # older pynvml answers bytes

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        listing = self.listings[handle]
        if isinstance(listing, Exception):
            raise listing
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in listing]


class NvmlPeakTest(unittest.TestCase):
    def peak(self, listings, uuid="GPU-1"):
        fake = FakePynvml(listings)
        sys.modules["pynvml"] = fake
        self.addCleanup(sys.modules.pop, "pynvml", None)
        return nvml_peak.NvmlPeak(uuid, pid=4242), fake

    def test_the_peak_of_this_pid_on_its_own_gpu_apart_from_other_gpus(self) -> None:
        listings = {"GPU-0": [(4242, 5 * GiB), (7, 60 * GiB)], "GPU-1": [(4242, 2 * GiB), (8, 70 * GiB)]}
        p, fake = self.peak(listings)
        p.sample()
        listings["GPU-1"] = [(4242, 9 * GiB)]
        listings["GPU-0"] = [(4242, 1 * GiB)]
        p.sample()
        listings["GPU-1"] = [(4242, 3 * GiB)]
        listings["GPU-0"] = FakePynvml.NVMLError("GPU is lost")
        figures = p.stop()
        self.assertEqual(figures, {"nvml_peak_bytes": 9 * GiB, "nvml_other_gpus_peak_bytes": 5 * GiB,
                                   "nvml_samples": 3, "nvml_listed_samples": 3, "nvml_errors": 1})
        self.assertTrue(fake.shut)

    def test_a_process_nvml_never_lists_has_no_figure_rather_than_zero(self) -> None:
        p, _ = self.peak({"GPU-0": [], "GPU-1": [(4242, None), (9, GiB)]})
        p.start()
        figures = p.stop()
        self.assertIsNone(figures["nvml_peak_bytes"])
        self.assertGreaterEqual(figures["nvml_samples"], 2)
        self.assertEqual(figures["nvml_listed_samples"], 0)

    def test_the_thread_samples_until_stopped(self) -> None:
        listings = {"GPU-1": [(4242, GiB)]}
        p, _ = self.peak(listings, "GPU-1")
        p.interval_s = 0.001
        p.start()
        deadline = time.monotonic() + 10
        while p.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        listings["GPU-1"] = [(4242, 3 * GiB)]
        while p.peak_bytes < 3 * GiB and time.monotonic() < deadline:
            time.sleep(0.005)
        listings["GPU-1"] = [(4242, GiB)]
        figures = p.stop()
        self.assertEqual(figures["nvml_peak_bytes"], 3 * GiB)
        self.assertGreaterEqual(figures["nvml_samples"], 6)

    def test_a_gpu_nvml_does_not_list_is_an_error(self) -> None:
        with self.assertRaises(SystemExit) as caught:
            self.peak({"GPU-0": []}, "GPU-9")
        self.assertEqual(str(caught.exception), "error: NVML lists no GPU 'GPU-9' (it lists GPU-0)")


class TwoGpuScriptTest(unittest.TestCase):
    def run_with_gpus(self, listed: int, visible: str | None = None) -> tuple[subprocess.CompletedProcess, str]:
        """The script with a stand-in nvidia-smi that lists `listed` GPUs (the driver's
        tool is the one test double here) and a VRAMCTL that fails every command."""
        fakes = tempfile.mkdtemp(prefix="vramctl-test-smi-")
        self.addCleanup(shutil.rmtree, fakes, True)
        for name, body in (("nvidia-smi", "".join(f"echo {i}\n" for i in range(listed))),
                           ("vramctl", "echo 'error: not a vramctl' >&2\nexit 7\n")):
            with open(os.path.join(fakes, name), "w") as f:
                f.write("#!/bin/sh\n" + body)
            os.chmod(os.path.join(fakes, name), 0o755)
        out = os.path.join(fakes, "out")
        path = os.pathsep.join([fakes, os.path.dirname(sys.executable), "/usr/bin", "/bin"])
        env = dict(os.environ, PATH=path, OUT=out, VRAMCTL=os.path.join(fakes, "vramctl"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        done = subprocess.run(["bash", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        return done, out

    def test_fewer_than_two_gpus_is_refused_in_one_line_and_nothing_runs(self) -> None:
        for listed, visible, seen in ((1, None, 1), (0, None, 0), (8, "3", 1), (2, "", 0)):
            with self.subTest(listed=listed, visible=visible):
                done, out = self.run_with_gpus(listed, visible)
                self.assertEqual(done.returncode, 3, done.stderr)
                self.assertEqual(done.stdout, "")
                self.assertEqual(done.stderr.splitlines(), [
                    f"REFUSED: the sharded estimate set needs 2 GPUs and {seen} are visible "
                    "(run it on nvidia-h200-x2); nothing was run"])
                self.assertFalse(os.path.exists(out))

    def test_a_failure_after_two_gpus_ends_with_a_fail_line_and_a_nonzero_exit(self) -> None:
        done, out = self.run_with_gpus(2, "0,1")
        self.assertEqual(done.returncode, 1, done.stdout + done.stderr)
        self.assertNotIn("REFUSED", done.stderr)
        lines = done.stdout.splitlines()
        self.assertIn(f"FAIL: cannot read the sharded measurements '{out}/truth-sharded.jsonl': [Errno 2] "
                      f"No such file or directory: '{out}/truth-sharded.jsonl'", lines)
        self.assertTrue(lines[-1].startswith("FAIL: the sharded estimate set failed (compare exit 1, runner exit 1;"),
                        lines)
        self.assertTrue(os.path.isfile(os.path.join(out, "env.txt")))
        with open(os.path.join(out, "cases.log")) as log:
            self.assertIn("error: vramctl estimate failed for gpt2-ddp-fp32-b8x1024: error: not a vramctl",
                          log.read())


if __name__ == "__main__":
    unittest.main()
