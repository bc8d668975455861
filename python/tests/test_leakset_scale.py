"""The labeled leak set on a GPU smaller than the H200 it was sized for (an H100 80GB), on
the CPU with the stand-in torch: the memory scale scripts/workloads/leakset.py derives from
the GPU's memory, the caps and the `start` label at that scale, and
scripts/record-leakset-h200.sh's refusal of a GPU too small for the set (before anything
starts). Each run is a child interpreter, so the stand-in torch stays out of this one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import FAKES, PYTHON_DIR

REPO = os.path.dirname(PYTHON_DIR)
WORKLOADS = os.path.join(REPO, "scripts", "workloads")
TORCH = os.path.join(FAKES, "torch_pkg")


def leakset(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` run after `import leakset` (stand-in torch), in scripts/workloads."""
    full = dict(os.environ, PYTHONPATH=f"{TORCH}:{WORKLOADS}", **env)
    return subprocess.run([sys.executable, "-c", "import leakset\n" + code], capture_output=True, text=True,
                          cwd=WORKLOADS, env=full, timeout=60)


class ScaleTest(unittest.TestCase):
    def test_the_h200_keeps_its_sizes_and_an_h100_gets_a_third(self) -> None:
        done = leakset("print([leakset.scale_for_gpu(m) for m in (143771, 81559, 70000)])")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "[1.0, 0.314, None]")

    def test_the_command_line_answers_the_script_and_refuses_a_small_gpu(self) -> None:
        env = dict(os.environ, PYTHONPATH=TORCH)
        for arg, rc, out in (("81559", 0, "0.314\n"), ("143771", 0, "1.0\n"), ("40960", 2, ""), ("", 2, "")):
            with self.subTest(mib=arg):
                done = subprocess.run([sys.executable, "leakset.py", "--scale-for-mib", arg], capture_output=True,
                                      text=True, cwd=WORKLOADS, env=env, timeout=60)
                self.assertEqual((done.returncode, done.stdout), (rc, out), done.stderr)
                if rc:
                    self.assertTrue(done.stderr.startswith("leakset.py: error: "), done.stderr)

    def test_a_cap_scales_and_the_start_label_says_the_scale(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            labels = os.path.join(tmp, "labels.jsonl")
            code = ("r = leakset.Run('x', 'tune', 'm', True, 10, 8)\n"
                    "print(r.cap_bytes, leakset.scaled_mib(6 * 1024))")
            done = leakset(code, LEAKSET_MEMORY_SCALE="0.5", LABELS=labels)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.split(), [str(4 << 30), str(3 << 30)])
            with open(labels) as f:
                start = json.loads(f.readline())
            self.assertEqual((start["event"], start["memory_scale"], start["rate_mb_s"]), ("start", 0.5, 10))
            # At scale 1 (an H200) the caps and the labels are the set's own.
            done = leakset(code, LABELS=labels)
            self.assertEqual(done.stdout.split(), [str(8 << 30), str(6 << 30)])
            with open(labels) as f:
                self.assertNotIn("memory_scale", json.loads(f.read().splitlines()[-1]))

    def test_a_scale_outside_zero_to_one_is_refused(self) -> None:
        for bad in ("0", "1.5", "x"):
            with self.subTest(scale=bad):
                done = leakset("", LEAKSET_MEMORY_SCALE=bad)
                self.assertEqual(done.returncode, 2)
                self.assertIn(f"LEAKSET_MEMORY_SCALE '{bad}' is not a number in (0, 1]", done.stderr)


class RecordScriptTest(unittest.TestCase):
    def test_a_gpu_too_small_for_the_set_is_refused_before_anything_starts(self) -> None:
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        smi = os.path.join(tmp, "nvidia-smi")
        with open(smi, "w") as f:
            f.write("#!/bin/sh\necho 40960\n")  # a 40 GB GPU
        os.chmod(smi, 0o755)
        out = os.path.join(tmp, "out")
        env = dict(os.environ, PATH=f"{tmp}:{os.environ['PATH']}", PYTHONPATH=TORCH)
        env.pop("LEAKSET_MEMORY_SCALE", None)
        done = subprocess.run(["bash", os.path.join(REPO, "scripts", "record-leakset-h200.sh"), "/bin/false", out, "5"],
                              capture_output=True, text=True, env=env, timeout=60)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertEqual(done.stdout, "FAIL the leak set cannot run on this GPU (memory.total '40960' MiB)\n")
        self.assertFalse(os.path.exists(os.path.join(out, "labels.jsonl")), "no workload started")


if __name__ == "__main__":
    unittest.main()
