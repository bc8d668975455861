"""snapshot: recording history with a bound, writing `_snapshot()` where the client says,
safely (never over an existing file unless asked, never through a symlink, 0600)."""

from __future__ import annotations

import os
import pickle
import shutil
import stat
import tempfile
import unittest

from harness import Target, client

from vramctl_agent import _protocol as proto

SETUP = "import torch\nGiB = 1 << 30\nMiB = 1 << 20\n"


class SnapshotTest(unittest.TestCase):
    def setUp(self) -> None:
        self.out = tempfile.mkdtemp(prefix="vramctl-test-snap-")
        self.target = Target()
        self.target.start_agent()
        self.target.run(SETUP + "keep = torch.empty(GiB, dtype=torch.uint8, device='cuda')")

    def tearDown(self) -> None:
        self.target.__exit__(None, None, None)
        shutil.rmtree(self.out, ignore_errors=True)

    def snapshot(self, **fields) -> dict:
        return client.request(self.target.pid, "snapshot", check=False, **fields)

    def test_recording_is_bounded_and_the_snapshot_is_the_allocators(self) -> None:
        started = self.snapshot(record="start", max_entries=50)
        self.assertTrue(started["ok"], started)
        self.assertEqual(started["history"], {"recording": True, "max_entries": 50, "stacks": "python", "owner": "request"})
        self.assertEqual(self.target.run("", "torch.cuda._fake.recording"), {"max_entries": 50, "stacks": "python", "context": "all"})
        self.target.run("for _ in range(100):\n    x = torch.empty(MiB, dtype=torch.uint8, device='cuda'); del x")
        path = os.path.join(self.out, "snap.pickle")
        answer = self.snapshot(path=path)
        written = answer["written"]
        self.assertEqual(written["path"], path)
        self.assertEqual(written["trace_entries"], 50)
        self.assertEqual(written["segments"], 2)
        self.assertEqual(written["size_bytes"], os.stat(path).st_size)
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path, "rb") as f:
            header = f.read(2)
            f.seek(0)
            data = pickle.load(f)
        self.assertEqual(header, b"\x80\x04")  # protocol 4: what memory_viz reads
        self.assertEqual(set(data), {"segments", "device_traces", "allocator_settings", "external_annotations"})
        self.assertEqual(len(data["device_traces"][0]), 50)
        self.assertTrue(client.request(self.target.pid, "hello")["history"]["recording"])
        stopped = self.snapshot(record="stop")
        self.assertEqual(stopped["history"]["recording"], False)
        self.assertIsNone(self.target.run("", "torch.cuda._fake.recording"))

    def test_an_existing_file_is_kept_unless_overwrite_is_asked(self) -> None:
        path = os.path.join(self.out, "snap.pickle")
        with open(path, "w") as f:
            f.write("precious")
        answer = self.snapshot(path=path)
        self.assertEqual(answer["error"]["code"], proto.IO_ERROR)
        self.assertEqual(answer["error"]["errno"], "EEXIST")
        self.assertIn("overwrite", answer["error"]["message"])
        with open(path) as f:
            self.assertEqual(f.read(), "precious")
        self.assertTrue(self.snapshot(path=path, overwrite=True)["ok"])
        with open(path, "rb") as f:
            self.assertIn("segments", pickle.load(f))
        self.assertEqual([n for n in os.listdir(self.out) if n.endswith(".tmp")], [])

    def test_a_symlink_at_the_path_is_not_followed(self) -> None:
        victim = os.path.join(self.out, "victim")
        with open(victim, "w") as f:
            f.write("keep me")
        link = os.path.join(self.out, "snap.pickle")
        os.symlink(victim, link)
        for overwrite in (False, True):
            with self.subTest(overwrite=overwrite):
                answer = self.snapshot(path=link, overwrite=overwrite)
                if answer["ok"]:
                    # overwrite replaces the link itself (rename), never writes through it
                    self.assertFalse(os.path.islink(link))
                else:
                    self.assertEqual(answer["error"]["code"], proto.IO_ERROR)
                with open(victim) as f:
                    self.assertEqual(f.read(), "keep me")

    def test_a_missing_directory_is_an_io_error_that_names_the_path(self) -> None:
        path = os.path.join(self.out, "no", "such", "dir.pickle")
        answer = self.snapshot(path=path)
        self.assertEqual(answer["error"]["code"], proto.IO_ERROR)
        self.assertEqual(answer["error"]["errno"], "ENOENT")
        self.assertIn(f"'{path}'", answer["error"]["message"])

    def test_write_then_stop_in_one_request(self) -> None:
        self.snapshot(record="start")
        path = os.path.join(self.out, "last.pickle")
        answer = self.snapshot(path=path, record="stop")
        self.assertTrue(answer["ok"])
        self.assertTrue(os.path.exists(path))
        self.assertFalse(answer["history"]["recording"])


if __name__ == "__main__":
    unittest.main()
