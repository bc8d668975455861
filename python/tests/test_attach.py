"""`reclaim --attach`: `_attach.run`, which vramctl's bootstrap script calls in a process
without an agent through `sys.remote_exec` (here called directly, in a real interpreter with
the stand-in torch): the same answers as the agent's `reclaim`, into a result file, never
past the caller's deadline."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import unittest

from harness import Target

SETUP = "import torch\nGiB = 1 << 30\nx = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')\ndel x\n"


class AttachTest(unittest.TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="vramctl-test-attach-")

    def tearDown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_in(self, t: Target, **request) -> dict:
        result = os.path.join(self.dir, "result.json")
        path = os.path.join(self.dir, "request.json")
        with open(path, "w") as f:
            json.dump({"result": result, "deadline": time.time() + 60, **request}, f)
        t.run(f"from vramctl_agent import _attach\n_attach.run({path!r})")
        with open(result) as f:
            return json.load(f)

    def test_attach_answers_as_the_agents_reclaim_would(self) -> None:
        with Target() as t:
            t.run(SETUP)
            body = self.run_in(t, gc=True)
            self.assertTrue(body["ok"], body)
            self.assertEqual(body["pid"], t.pid)
            self.assertEqual(body["answer"]["released_bytes"], 2 * (1 << 30))
            self.assertEqual(body["answer"]["outcome"], "released_all")
            self.assertIsNotNone(body["answer"]["gc"])
            self.assertEqual(os.listdir(self.dir), ["request.json", "result.json"], "no temporary file left")

    def test_attach_past_the_deadline_does_nothing(self) -> None:
        with Target() as t:
            t.run(SETUP)
            body = self.run_in(t, deadline=time.time() - 1)
            self.assertEqual(body["error"]["code"], "too_late")
            self.assertEqual(t.run("", "torch.cuda.memory_reserved(0)"), 2 * (1 << 30), "still cached")

    def test_attach_refuses_a_bad_request_and_a_capture_on_the_main_thread(self) -> None:
        with Target() as t:
            t.run(SETUP)
            body = self.run_in(t, dry_run=True, gc=True)
            self.assertEqual(body["error"]["code"], "bad_request")
            os.unlink(os.path.join(self.dir, "result.json"))
            # No agent, so no capture guard: the main thread's own capture status is seen,
            # because the script runs on the main thread.
            t.run("g = torch.cuda.CUDAGraph()\ng.capture_begin()")
            body = self.run_in(t)
            self.assertEqual(body["error"]["code"], "capturing", body)
            self.assertEqual(t.run("", "torch.cuda.memory_reserved(0)"), 2 * (1 << 30), "still cached")


if __name__ == "__main__":
    unittest.main()
