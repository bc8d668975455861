"""The OOM observer (_oom.py) with the stand-in torch (python/tests/fakes, a test double at
the PyTorch boundary): attached only when CUDA is initialized, nothing recorded before an
OOM, one snapshot kept at the first OOM (0600, O_EXCL), the `oom` op answering its record
and streaming its bytes, and the run report directory's record under `vramctl run`."""

from __future__ import annotations

import base64
import json
import os
import pickle
import shutil
import stat
import tempfile
import unittest

from harness import Target, client

from vramctl_agent import _protocol as proto

GiB = 1 << 30
AGAIN = (
    "try:\n    torch.empty(60 * GiB, dtype=torch.uint8, device='cuda')\n"
    "except torch.cuda.OutOfMemoryError as err:\n    message = str(err)\n"
)
OOM = "import torch\nGiB = 1 << 30\nkeep = torch.empty(100 * GiB, dtype=torch.uint8, device='cuda')\n" + AGAIN


class OomObserverTest(unittest.TestCase):
    def setUp(self) -> None:
        self.out = tempfile.mkdtemp(prefix="vramctl-test-oom-")

    def tearDown(self) -> None:
        shutil.rmtree(self.out, ignore_errors=True)

    def test_nothing_is_attached_or_recorded_before_cuda_is_initialized(self) -> None:
        with Target() as target:
            target.start_agent()
            target.run("import torch")
            # Attaching would initialize CUDA (a context); the observer waits for the program.
            self.assertFalse(target.run("", "torch.cuda.is_initialized()"))
            self.assertEqual(target.run("", "len(torch.cuda._fake.oom_observers)"), 0)
            answer = client.request(target.pid, "oom")
            self.assertEqual((answer["observer_attached"], answer["oom"]), (False, None))
            target.run("x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')")
            self.assertEqual(target.run("", "len(torch.cuda._fake.oom_observers)"), 1)
            self.assertTrue(client.request(target.pid, "oom")["observer_attached"])
            # No history is recorded unless asked.
            self.assertIsNone(target.run("", "torch.cuda._fake.recording"))

    def test_the_first_oom_keeps_one_snapshot_and_the_op_streams_it(self) -> None:
        with Target() as target:
            path = target.start_agent()
            target.run(OOM)
            # The program still gets torch's own error.
            self.assertIn("CUDA out of memory", target.run("", "message"))
            record = client.request(target.pid, "oom")["oom"]
            self.assertEqual(record["pid"], target.pid)
            self.assertEqual(record["device"], 0)
            self.assertEqual(record["segment_bytes"], 60 * GiB)
            self.assertEqual(record["allowed_bytes"], record["device_total_bytes"])
            self.assertEqual(record["device_free_bytes"], record["device_total_bytes"] - 100 * GiB)
            self.assertEqual(record["allocator_backend"], "native")
            self.assertIsNone(record["snapshot_error"])
            kept = record["snapshot"]["path"]
            self.assertEqual(os.path.dirname(kept), os.path.dirname(path))
            info = os.lstat(kept)
            self.assertEqual(stat.S_IMODE(info.st_mode), 0o600)
            # Streamed in chunks, the bytes are the file's.
            data, offset = b"", 0
            while True:
                chunk = client.request(target.pid, "oom", offset=offset, max_bytes=1000)["chunk"]
                data += base64.b64decode(chunk["data_base64"])
                offset = len(data)
                if chunk["eof"]:
                    break
            with open(kept, "rb") as f:
                self.assertEqual(data, f.read())
            self.assertEqual(pickle.loads(data)["segments"][0]["total_size"], 100 * GiB)
            # A second OOM is counted, not kept again.
            target.run(AGAIN)
            again = client.request(target.pid, "oom")["oom"]
            self.assertEqual((again["ooms"], again["snapshot"]["path"]), (2, kept))
            bad = client.request(target.pid, "oom", check=False, offset=0, max_bytes=proto.MAX_OOM_CHUNK_BYTES + 1)
            self.assertEqual(bad["error"]["code"], proto.BAD_REQUEST)

    def test_under_run_the_record_and_snapshot_go_to_the_report_directory(self) -> None:
        os.chmod(self.out, 0o700)
        env = {"VRAMCTL_RUN_REPORT_DIR": self.out, "VRAMCTL_OOM_HISTORY": "1", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G"}
        with Target(env=env) as target:
            target.start_agent()
            target.run(OOM)
            with open(os.path.join(self.out, f"{target.pid}.oom.json")) as f:
                record = json.load(f)
            self.assertTrue(record["history_recorded"])
            self.assertEqual(record["limits_env"], {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16G"})
            snapshot = os.path.join(self.out, f"{target.pid}.oom.pickle")
            self.assertEqual(record["snapshot"]["path"], snapshot)
            with open(snapshot, "rb") as f:
                trace = pickle.load(f)["device_traces"][0]
            # History was recorded from CUDA's initialization: the OOM is in the trace.
            self.assertEqual(trace[-1]["action"], "oom")
            self.assertEqual(trace[-1]["device_free"], record["device_free_bytes"])
            # Python frames only: C++ frames cost a symbolization at the snapshot.
            frames = [f for entry in trace for f in entry.get("frames", [])]
            self.assertTrue(frames, "the trace carries stacks")
            self.assertFalse([f for f in frames if f["filename"] == "??"], "no C++ frame recorded")

    def test_with_history_the_module_torchs_snapshot_imports_is_imported_ahead_on_a_thread(self) -> None:
        # Real torch imports it at the first snapshot with Python frames (5.2-5.9 s on the
        # H100): at the OOM, unless the agent imported it when the recording started.
        module = "torch._inductor.codecache"
        check = f"__import__('sys').modules.get('{module}') is not None"
        wait = "__import__('vramctl_agent._oom', fromlist=['_']).wait_for_warm_up(10)"
        with Target(env={"VRAMCTL_OOM_HISTORY": "1"}) as target:
            target.start_agent()
            target.run("import torch")
            self.assertFalse(target.run("", check), "nothing before CUDA is initialized")
            target.run("x = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')")
            self.assertTrue(target.run("", wait))
            self.assertTrue(target.run("", check))
        # Without history, no snapshot symbolizes frames at the OOM: nothing to import.
        with Target() as target:
            target.start_agent()
            target.run("import torch\nx = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')")
            self.assertFalse(target.run("", wait))
            self.assertFalse(target.run("", check))

    def test_a_fork_during_the_warm_up_waits_for_its_import(self) -> None:
        # A child forked mid-import would hold a half-imported module whose lock belongs to
        # a thread it does not have. The fork waits; the child sees the whole module.
        fork = (
            "import os, sys\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    m = sys.modules.get('torch._inductor.codecache')\n"
            "    os._exit(0 if m is not None and hasattr(m, 'PyCodeCache') else 3)\n"
            "child_status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])\n"
        )
        env = {"VRAMCTL_OOM_HISTORY": "1", "FAKE_CODECACHE_IMPORT_S": "1.5"}
        with Target(env=env) as target:
            target.start_agent()
            target.run("import torch\nx = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')")
            target.run(fork)
            self.assertEqual(target.run("", "child_status"), 0)

    def test_the_record_times_each_stage_and_the_kept_trace_is_bounded_to_its_newest_entries(self) -> None:
        os.chmod(self.out, 0o700)
        env = {"VRAMCTL_RUN_REPORT_DIR": self.out, "VRAMCTL_OOM_HISTORY": "1"}
        with Target(env=env) as target:
            target.start_agent()
            # A bound of 5 stands in for the 100,000 (the same code path, a small trace).
            target.run("import vramctl_agent._oom as _o\n_o.MAX_OOM_TRACE_ENTRIES = 5")
            target.run(
                "import torch\nfor _ in range(10):\n    x = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')\n"
                "    del x\n" + OOM
            )
            with open(os.path.join(self.out, f"{target.pid}.oom.json")) as f:
                record = json.load(f)
            kept = record["snapshot"]
            for stage in ("snapshot_s", "pickle_s", "write_s", "taken_s"):
                self.assertGreaterEqual(kept[stage], 0.0, stage)
            self.assertGreaterEqual(kept["taken_s"], kept["snapshot_s"])
            with open(kept["path"], "rb") as f:
                trace = pickle.load(f)["device_traces"][0]
            # The newest entries: the OOM is the last of them.
            self.assertEqual(len(trace), 5)
            self.assertEqual(trace[-1]["action"], "oom")
            self.assertEqual((kept["trace_entries"], kept["trace_entries_dropped"] > 0), (5, True))

    def test_a_snapshot_request_neither_restarts_nor_stops_the_observers_history(self) -> None:
        # leaks --where starts and stops a recording around its two snapshots; with
        # VRAMCTL_OOM_HISTORY=1 the recording is the observer's, and must outlive the probe.
        with Target(env={"VRAMCTL_OOM_HISTORY": "1"}) as target:
            target.start_agent()
            target.run("import torch\nkeep = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')")
            observers = target.run("", "torch.cuda._fake.recording")
            self.assertIsNotNone(observers)
            hello = client.request(target.pid, "hello")["history"]
            self.assertEqual((hello["recording"], hello["owner"]), (True, "observer"))
            started = client.request(target.pid, "snapshot", record="start", max_entries=50)
            self.assertEqual(started["history"]["owner"], "observer", started)
            self.assertEqual(target.run("", "torch.cuda._fake.recording"), observers)
            stopped = client.request(target.pid, "snapshot", record="stop")
            self.assertTrue(stopped["history"]["recording"], stopped)
            self.assertEqual(target.run("", "torch.cuda._fake.recording"), observers)

    def test_a_planted_file_at_the_snapshot_path_is_never_written_through(self) -> None:
        os.chmod(self.out, 0o700)
        with Target(env={"VRAMCTL_RUN_REPORT_DIR": self.out}) as target:
            victim = os.path.join(self.out, "victim")
            with open(victim, "w") as f:
                f.write("keep")
            os.symlink(victim, os.path.join(self.out, f"{target.pid}.oom.pickle"))
            target.start_agent()
            target.run(OOM)
            record = client.request(target.pid, "oom")["oom"]
            self.assertIsNone(record["snapshot"])
            self.assertIn("cannot write", record["snapshot_error"])
            with open(victim) as f:
                self.assertEqual(f.read(), "keep")


if __name__ == "__main__":
    unittest.main()
