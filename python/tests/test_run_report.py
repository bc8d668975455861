"""What `vramctl run` injects into a Python job: the sitecustomize that arms the agent in
every interpreter of the job (chaining to the one it shadows), and the report of the
framework's counters each process writes at exit."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import GiB, PYTHON_DIR, fake_path


class RunInjectionTest(unittest.TestCase):
    def setUp(self) -> None:
        self.base = tempfile.mkdtemp(prefix="vramctl-test-run-")
        self.site = os.path.join(self.base, "python")
        self.reports = os.path.join(self.base, "reports")
        os.makedirs(self.reports)
        shutil.copytree(os.path.join(PYTHON_DIR, "vramctl_agent"), os.path.join(self.site, "vramctl_agent"))
        shutil.copy(
            os.path.join(PYTHON_DIR, "vramctl_agent", "_run_site.py"), os.path.join(self.site, "sitecustomize.py")
        )

    def tearDown(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)

    def job(self, code: str, extra_path: list[str] = (), **env) -> subprocess.CompletedProcess:
        path = [self.site, *extra_path, *fake_path("torch")]
        environ = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(path),
            VRAMCTL_AGENT="1",
            VRAMCTL_RUN_REPORT_DIR=self.reports,
            **env,
        )
        return subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=30)

    def reports_written(self) -> dict[int, dict]:
        out = {}
        for name in os.listdir(self.reports):
            if ".oom." in name or name.endswith(".trace.json"):
                continue  # the OOM observer's record and snapshot (test_oom.py), fit's trace
            self.assertTrue(name.endswith(".json") and not name.startswith("."), name)
            with open(os.path.join(self.reports, name), encoding="utf-8") as f:
                report = json.load(f)
            out[report["pid"]] = report
        return out

    def test_each_process_reports_its_peaks_at_exit_even_after_an_out_of_memory_error(self) -> None:
        code = (
            "import os, torch\n"
            f"a = torch.empty(3 * {GiB}, dtype=torch.uint8, device='cuda'); del a\n"
            "print(os.getpid())\n"
            f"b = torch.empty(20 * {GiB}, dtype=torch.uint8, device='cuda')\n"
        )
        done = self.job(code, FAKE_TORCH_CAPACITY=str(10 * GiB))
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("out of memory", done.stderr)
        pid = int(done.stdout.strip())
        reports = self.reports_written()
        self.assertEqual(list(reports), [pid])
        device = next(d for d in reports[pid]["devices"] if d["framework"] == "torch")
        self.assertEqual(device["allocated_peak_bytes"], 3 * GiB)
        self.assertEqual(device["reserved_peak_bytes"], 3 * GiB)
        self.assertGreaterEqual(device["ooms"], 1)
        # The OOM observer kept its record and snapshot beside the report.
        self.assertEqual(sorted(n for n in os.listdir(self.reports) if ".oom." in n), [f"{pid}.oom.json", f"{pid}.oom.pickle"])

    def test_under_fit_the_allocator_trace_is_written_at_exit_with_each_allocations_frame(self) -> None:
        code = (
            "import os, torch\n"
            "def step(n):\n"
            "    a = torch.empty(n, dtype=torch.uint8, device='cuda')\n"
            "    b = torch.empty(2 * n, dtype=torch.uint8, device='cuda')\n"
            "    del a\n"
            "    return b\n"
            "keep = step(12 << 20)\n"
            "torch.cuda.empty_cache()\n"
            "print(os.getpid())\n"
        )
        done = self.job(code, VRAMCTL_FIT_TRACE="1")
        self.assertEqual(done.returncode, 0, done.stderr)
        pid = int(done.stdout.strip())
        self.assertIn(pid, self.reports_written())
        path = os.path.join(self.reports, f"{pid}.trace.json")
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o600)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        self.assertEqual(trace["version"], 1)
        device = trace["devices"][0]
        self.assertFalse(device["truncated"])
        kinds = [(e[0], e[1]) for e in device["events"]]
        # Two allocations, the first one's free, and empty_cache releasing its segment.
        self.assertEqual(kinds, [(0, 12 << 20), (0, 24 << 20), (1, 12 << 20), (2, 12 << 20)])
        # Each allocation's first frame outside torch: the job's `step`, two lines apart.
        frames = [device["frames"][e[4]] for e in device["events"] if e[0] == 0]
        self.assertTrue(frames[0].endswith(":3 step") and frames[1].endswith(":4 step"), frames)
        # The free names the address of the first allocation.
        self.assertEqual(device["events"][2][3], device["events"][0][3])

    def test_allocations_under_torch_s_convolution_module_are_marked(self) -> None:
        from vramctl_agent import _alloc_trace

        conv = [{"filename": "/site/torch/nn/modules/conv.py", "line": 549, "name": "_conv_forward"},
                {"filename": "/home/u/model.py", "line": 7, "name": "forward"}]
        other = [{"filename": "/home/u/model.py", "line": 9, "name": "forward"}]
        snapshot = {"device_traces": [[
            {"action": "alloc", "size": 4096, "stream": 0, "addr": 1, "frames": conv},
            {"action": "alloc", "size": 1024, "stream": 0, "addr": 2, "frames": other},
            {"action": "free_requested", "size": 4096, "stream": 0, "addr": 1, "frames": []},
            {"action": "free_completed", "size": 4096, "stream": 0, "addr": 1, "frames": []},
            {"action": "alloc", "size": 512, "stream": 7, "addr": 3, "frames": []},
        ]]}
        doc = _alloc_trace.document(snapshot, "/site/torch/", {0: "abc"})
        device = doc["devices"][0]
        self.assertEqual(device["uuid"], "abc")
        # The conv's allocation is kind 3 and named by its first frame outside torch.
        self.assertEqual(device["events"][0], [3, 4096, 0, 1, 0])
        self.assertEqual(device["frames"], ["/home/u/model.py:7 forward", "/home/u/model.py:9 forward"])
        self.assertEqual(device["events"][1], [0, 1024, 0, 2, 1])
        self.assertEqual(device["events"][2], [1, 4096, 0, 1, -1])
        self.assertEqual(device["events"][3], [0, 512, 7, 3, -1])

    def test_without_fit_no_trace_is_recorded(self) -> None:
        done = self.job("import torch\na = torch.empty(1024, device='cuda')\n")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual([n for n in os.listdir(self.reports) if "trace" in n], [])

    def test_a_process_that_never_imports_a_framework_writes_nothing(self) -> None:
        done = self.job("print('hello')")
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout, "hello\n")
        self.assertEqual(self.reports_written(), {})
        self.assertNotIn("torch", done.stderr)

    def test_the_sitecustomize_it_shadows_still_runs(self) -> None:
        theirs = os.path.join(self.base, "theirs")
        os.makedirs(theirs)
        with open(os.path.join(theirs, "sitecustomize.py"), "w", encoding="utf-8") as f:
            f.write("import builtins\nbuiltins.THEIRS_RAN = True\n")
        done = self.job("import builtins; print(getattr(builtins, 'THEIRS_RAN', False))", extra_path=[theirs])
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.strip(), "True")


if __name__ == "__main__":
    unittest.main()
