"""The project's test command itself (scripts/test.sh): both suites always run, and each
says how it ended — a Python failure once stopped the script before `cargo test` began."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import PYTHON_DIR

REPO = os.path.dirname(PYTHON_DIR)
TEST_SH = os.path.join(REPO, "scripts", "test.sh")


class TestScriptTest(unittest.TestCase):
    def run_with(self, python_exit: int, cargo_exit: int) -> subprocess.CompletedProcess:
        """scripts/test.sh with stand-ins for python3 and cargo that log and exit as told."""
        fakes = tempfile.mkdtemp(prefix="vramctl-test-sh-")
        self.addCleanup(shutil.rmtree, fakes, True)
        log = os.path.join(fakes, "log")
        for name, code in (("python3", python_exit), ("cargo", cargo_exit)):
            with open(os.path.join(fakes, name), "w") as script:
                script.write(f'#!/bin/sh\necho "{name} $*" >> "{log}"\nexit {code}\n')
            os.chmod(os.path.join(fakes, name), 0o755)
        environment = dict(os.environ)
        environment["PATH"] = fakes + os.pathsep + environment.get("PATH", "/usr/bin:/bin")
        # Never install packages from a test, never fail on one missing.
        environment["VRAMCTL_TEST_NO_INSTALL"] = "1"
        environment.pop("VRAMCTL_TEST_STRICT", None)
        done = subprocess.run(["bash", TEST_SH, "-p", "vramctl-core"], env=environment, capture_output=True, text=True, timeout=60)
        with open(log) as ran:
            done.ran = ran.read().splitlines()  # type: ignore[attr-defined]
        return done

    def test_the_test_script_runs_both_suites_and_reports_both(self) -> None:
        cases = [
            (0, 0, 0, "passed", "passed"),
            (1, 0, 1, "FAILED (exit 1)", "passed"),
            (0, 101, 1, "passed", "FAILED (exit 101)"),
            (1, 101, 1, "FAILED (exit 1)", "FAILED (exit 101)"),
        ]
        for python_exit, cargo_exit, status, python_line, rust_line in cases:
            with self.subTest(python=python_exit, cargo=cargo_exit):
                done = self.run_with(python_exit, cargo_exit)
                self.assertEqual(
                    done.ran,
                    ["python3 -m unittest discover -s python/tests -t python/tests", "cargo test --workspace -p vramctl-core"],
                )
                lines = done.stdout.splitlines()
                self.assertEqual(lines[-2], f"scripts/test.sh: python tests (python/tests): {python_line}")
                self.assertEqual(lines[-1], f"scripts/test.sh: rust tests (cargo test --workspace -p vramctl-core): {rust_line}")
                self.assertEqual(done.returncode, status, done.stderr)


if __name__ == "__main__":
    unittest.main()
