"""stats, reclaim and reset-peak against the stand-in torch (tests/fakes/torch_pkg), whose
allocator follows the caching allocator's rules: what the agent reports and does is checked
against what that model says, case by case."""

from __future__ import annotations

import threading
import unittest

from harness import GiB, MiB, Target, client, wait_for

from vramctl_agent import _protocol as proto

SETUP = "import torch, gc\nGiB = 1 << 30\nMiB = 1 << 20\n"


def device(answer: dict, index: int = 0, framework: str = "torch") -> dict:
    return next(d for d in answer["devices"] if d["framework"] == framework and d["index"] == index)


class StatsTest(unittest.TestCase):
    def test_stats_are_the_allocators_own_counters(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "a = torch.empty(3 * GiB, dtype=torch.uint8, device='cuda')\n"
                + "b = torch.empty(5 * MiB, dtype=torch.uint8, device='cuda')\n"
                + "c = torch.empty(1000, dtype=torch.uint8, device='cuda')\n"
                + "del a\n"
            )
            stats = device(client.request(t.pid, "stats"))
            # a: a 3 GiB segment, freed whole (cached, releasable). b: 5 MiB in a 20 MiB
            # segment (15 MiB free inside it). c: 1000 B rounded to 1024 in a 2 MiB small
            # segment.
            reserved = 3 * GiB + 20 * MiB + 2 * MiB
            allocated = 5 * MiB + 1024
            self.assertEqual(stats["reserved_bytes"], reserved)
            self.assertEqual(stats["allocated_bytes"], allocated)
            self.assertEqual(stats["active_bytes"], allocated)
            self.assertEqual(stats["requested_bytes"], 5 * MiB + 1000)
            self.assertEqual(stats["inactive_split_bytes"], 15 * MiB + 2 * MiB - 1024)
            self.assertEqual(stats["cached_bytes"], reserved - allocated)
            self.assertEqual(stats["releasable_bytes"], 3 * GiB)
            self.assertEqual(stats["allocated_peak_bytes"], 3 * GiB + allocated)
            self.assertEqual(stats["reserved_peak_bytes"], reserved)
            self.assertEqual(stats["segments"], 3)
            self.assertEqual(stats["alloc_retries"], 0)
            self.assertEqual(stats["ooms"], 0)
            self.assertEqual(stats["device_allocs"], 3)
            self.assertEqual(stats["name"], "NVIDIA H200")

    def test_retries_and_ooms_are_counted_as_the_allocator_counts_them(self) -> None:
        with Target(env={"FAKE_TORCH_CAPACITY": str(10 * GiB)}) as t:
            t.start_agent()
            t.run(
                SETUP
                + "a = torch.empty(6 * GiB, dtype=torch.uint8, device='cuda'); del a\n"
                + "b = torch.empty(6 * GiB + 2 * MiB, dtype=torch.uint8, device='cuda')\n"  # retry frees a's cache
                + "try:\n    c = torch.empty(6 * GiB, dtype=torch.uint8, device='cuda')\n"
                + "except torch.cuda.OutOfMemoryError:\n    pass\n"
            )
            stats = device(client.request(t.pid, "stats"))
            self.assertEqual(stats["alloc_retries"], 2)
            self.assertEqual(stats["ooms"], 1)

    def test_every_visible_device_is_listed(self) -> None:
        with Target(env={"FAKE_TORCH_DEVICES": "2"}) as t:
            t.start_agent()
            t.run(SETUP + "a = torch.empty(GiB, dtype=torch.uint8, device='cuda:1')")
            answer = client.request(t.pid, "stats")
            self.assertEqual([d["index"] for d in answer["devices"]], [0, 1])
            self.assertEqual(device(answer, 0)["reserved_bytes"], 0)
            self.assertEqual(device(answer, 1)["reserved_bytes"], GiB)

    def test_the_agent_never_initializes_cuda_in_a_process_that_has_not(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run("import torch")
            for op in ("hello", "stats", "reclaim", "reset-peak"):
                client.request(t.pid, op)
            answer = client.request(t.pid, "reclaim")
            self.assertEqual(answer["outcome"], "no_gpu_allocator")
            self.assertEqual(client.request(t.pid, "stats")["devices"], [])
            refused = client.request(t.pid, "snapshot", check=False, record="start")
            self.assertEqual(refused["error"]["code"], proto.NO_FRAMEWORK)
            self.assertFalse(t.run("", "torch.cuda.is_initialized()"))
            self.assertEqual(t.run("", "torch.cuda._fake.init_threads"), [])

    def test_nothing_is_reported_for_a_torch_that_is_not_imported(self) -> None:
        with Target() as t:
            t.start_agent()
            hello = client.request(t.pid, "hello")
            self.assertEqual(hello["frameworks"], [])
            self.assertFalse(t.run("import sys", "'torch' in sys.modules"))

    def test_reset_peak_sets_the_peaks_to_the_current_values(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "a = torch.empty(4 * GiB, dtype=torch.uint8, device='cuda'); del a\nb = torch.empty(GiB, dtype=torch.uint8, device='cuda')")
            self.assertEqual(device(client.request(t.pid, "stats"))["allocated_peak_bytes"], 4 * GiB)
            answer = client.request(t.pid, "reset-peak")
            self.assertEqual(answer["devices"], [{"framework": "torch", "index": 0, "reset": True}])
            self.assertEqual(device(client.request(t.pid, "stats"))["allocated_peak_bytes"], GiB)


class ReclaimTest(unittest.TestCase):
    def test_a_freed_cache_is_returned_and_the_figures_before_and_after_say_so(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "x = torch.empty(20 * GiB, dtype=torch.uint8, device='cuda')\ndel x")
            answer = client.request(t.pid, "reclaim")
            d = device(answer)
            self.assertEqual(answer["outcome"], "released_all")
            self.assertEqual(d["reserved_before_bytes"], 20 * GiB)
            self.assertEqual(d["reserved_after_bytes"], 0)
            self.assertEqual(d["released_bytes"], 20 * GiB)
            self.assertEqual(answer["released_bytes"], 20 * GiB)
            self.assertEqual(d["pinned_segments"], [])
            self.assertEqual(t.run("", "torch.cuda.memory_reserved()"), 0)
            self.assertEqual(t.run("", "torch.cuda._fake.empty_cache_threads"), ["vramctl-agent-conn"])

    def test_a_process_that_keeps_its_tensors_has_nothing_to_reclaim(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "x = torch.empty(4 * GiB, dtype=torch.uint8, device='cuda')")
            answer = client.request(t.pid, "reclaim")
            self.assertEqual(answer["outcome"], "nothing_cached")
            self.assertEqual(answer["released_bytes"], 0)
            self.assertEqual(device(answer)["reserved_after_bytes"], 4 * GiB)

    def test_a_small_tensor_in_a_cached_segment_pins_it_and_the_answer_says_where(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "big = torch.empty(8 * GiB, dtype=torch.uint8, device='cuda')\ndel big")
            client.request(t.pid, "snapshot", record="start", max_entries=1000)
            t.run("def load_batch():\n    return torch.empty(4 * MiB, dtype=torch.uint8, device='cuda')\nsmall = load_batch()")
            answer = client.request(t.pid, "reclaim")
            d = device(answer)
            self.assertEqual(answer["outcome"], "nothing_released")
            self.assertEqual(d["released_bytes"], 0)
            self.assertEqual(d["pinned_bytes"], 8 * GiB - 4 * MiB)
            [segment] = d["pinned_segments"]
            self.assertEqual(segment["total_bytes"], 8 * GiB)
            self.assertEqual(segment["live_bytes"], 4 * MiB)
            self.assertEqual(segment["free_bytes"], 8 * GiB - 4 * MiB)
            self.assertEqual(segment["reason"], "live_blocks")
            self.assertTrue(segment["stacks_recorded"])
            [block] = segment["blocks"]
            self.assertEqual(block["size_bytes"], 4 * MiB)
            self.assertEqual(block["frames"][0], {"filename": "workload.py", "line": 2, "name": "load_batch"})
            # Once the tensor goes, the whole segment comes back.
            t.run("del small")
            self.assertEqual(client.request(t.pid, "reclaim")["released_bytes"], 8 * GiB)

    def test_history_with_cpp_frames_still_names_the_users_line(self) -> None:
        # torch's default `_record_memory_history()` records C++ frames first (issue 33:
        # reclaim named `torch::unwind::unwind() at ??:0`).
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "big = torch.empty(8 * GiB, dtype=torch.uint8, device='cuda')\ndel big")
            t.run("torch.cuda.memory._record_memory_history()")
            t.run("def load_batch():\n    return torch.empty(4 * MiB, dtype=torch.uint8, device='cuda')\nsmall = load_batch()")
            [segment] = device(client.request(t.pid, "reclaim"))["pinned_segments"]
            [block] = segment["blocks"]
            self.assertEqual(block["frames"][0], {"filename": "workload.py", "line": 2, "name": "load_batch"})

    def test_code_from_stdin_or_a_string_counts_as_the_users_python(self) -> None:
        # leak35 on the H200 ran its workload as `python3 - <<PY`: every user frame was
        # `<stdin>`, and with `.py` alone the kept stack was C++ frames only.
        from vramctl_agent import _torch

        cpp = {"filename": "??", "line": 0, "name": "torch::unwind::unwind()"}
        for user in ("<stdin>", "<string>", "<ipython-input-3-5d1f>"):
            frames = _torch._frames({"frames": [cpp, {"filename": user, "line": 7, "name": "leaky_step"}]})
            self.assertEqual(frames, [{"filename": user, "line": 7, "name": "leaky_step"}], user)
        frozen = {"filename": "<frozen runpy>", "line": 88, "name": "_run_code"}
        self.assertEqual(_torch._frames({"frames": [cpp, frozen]})[0]["filename"], "??")

    def test_pinned_blocks_without_recorded_history_have_no_stacks(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "big = torch.empty(8 * GiB, dtype=torch.uint8, device='cuda')\ndel big\nsmall = torch.empty(4 * MiB, dtype=torch.uint8, device='cuda')")
            [segment] = device(client.request(t.pid, "reclaim"))["pinned_segments"]
            self.assertFalse(segment["stacks_recorded"])
            self.assertEqual(segment["blocks"][0]["frames"], [])

    def test_pinned_segments_are_capped_and_the_rest_counted(self) -> None:
        with Target() as t:
            t.start_agent()
            count = proto.MAX_PINNED_SEGMENTS + 5
            # `count` cached 40 MiB segments, then a 30 MiB tensor in each (best fit puts
            # each in its own segment: 10 MiB left over is too small for the next).
            t.run(
                SETUP
                + f"big = [torch.empty(40 * MiB, dtype=torch.uint8, device='cuda') for _ in range({count})]\n"
                + "del big\n"
                + f"keep = [torch.empty(30 * MiB, dtype=torch.uint8, device='cuda') for _ in range({count})]\n"
            )
            d = device(client.request(t.pid, "reclaim"))
            self.assertEqual(len(d["pinned_segments"]), proto.MAX_PINNED_SEGMENTS)
            self.assertEqual(d["pinned_segments_omitted"], 5)
            self.assertEqual(d["pinned_bytes"], count * 10 * MiB)
            self.assertLess(len(proto.encode_line(d)), proto.MAX_RESPONSE_BYTES)

    def test_a_dry_run_says_what_would_come_back_and_changes_nothing(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "x = torch.empty(6 * GiB, dtype=torch.uint8, device='cuda')\ny = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')\ndel x")
            answer = client.request(t.pid, "reclaim", dry_run=True)
            self.assertTrue(answer["dry_run"])
            self.assertEqual(answer["released_bytes"], 6 * GiB)
            self.assertIsNone(answer["empty_cache_s"])
            self.assertEqual(t.run("", "torch.cuda._fake.empty_cache_calls"), 0)
            self.assertEqual(t.run("", "torch.cuda.memory_reserved()"), 8 * GiB)

    def test_gc_first_frees_tensors_that_only_a_reference_cycle_keeps(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "gc.disable()\n"
                + "class Node:\n    pass\n"
                + "n = Node(); n.self = n; n.t = torch.empty(3 * GiB, dtype=torch.uint8, device='cuda')\n"
                + "del n\n"
            )
            self.assertEqual(client.request(t.pid, "reclaim")["released_bytes"], 0)
            answer = client.request(t.pid, "reclaim", gc=True)
            self.assertEqual(answer["released_bytes"], 3 * GiB)
            self.assertGreater(answer["gc"]["collected"], 0)

    def test_reclaim_refuses_while_the_main_thread_captures_a_cuda_graph(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "x = torch.empty(GiB, dtype=torch.uint8, device='cuda'); del x\ng = torch.cuda.CUDAGraph()\ng.capture_begin()")
            # From the agent's thread the capture is invisible to torch's own check.
            self.assertTrue(t.run("", "torch.cuda.is_current_stream_capturing()"))
            answer = client.request(t.pid, "reclaim", check=False)
            self.assertFalse(answer["ok"])
            self.assertEqual(answer["error"]["code"], proto.CAPTURING)
            self.assertIn("MainThread", answer["error"]["message"])
            self.assertEqual(answer["error"]["retry_after_s"], 1.0)
            self.assertEqual(t.run("", "torch.cuda._fake.captures_invalidated"), 0)
            t.run("g.capture_end(); g.replay()")
            self.assertEqual(client.request(t.pid, "reclaim")["released_bytes"], GiB)

    def test_reclaim_refuses_inside_torch_cuda_graph_and_after_a_failed_capture_it_works(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "x = torch.empty(GiB, dtype=torch.uint8, device='cuda'); del x\n"
                + "g = torch.cuda.CUDAGraph()\nctx = torch.cuda.graph(g)\nctx.__enter__()\n"
            )
            self.assertEqual(client.request(t.pid, "reclaim", check=False)["error"]["code"], proto.CAPTURING)
            t.run("try:\n    ctx.__exit__(None, None, None)\nexcept RuntimeError:\n    pass")
            self.assertEqual(client.request(t.pid, "reclaim")["released_bytes"], GiB)
            self.assertEqual(t.run("", "torch.cuda._fake.captures_invalidated"), 0)

    def test_the_capture_guard_is_installed_when_torch_is_imported_after_start(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "g = torch.cuda.CUDAGraph()\ng.capture_begin()")
            self.assertTrue(t.run("", "torch.cuda.CUDAGraph.capture_begin.__vramctl_agent_wrapped__"))
            self.assertEqual(client.request(t.pid, "reclaim", check=False)["error"]["code"], proto.CAPTURING)
            self.assertEqual(t.run("", "torch.cuda._fake.captures_invalidated"), 0)

    def test_a_slow_empty_cache_times_the_client_out_and_the_agent_keeps_answering(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(SETUP + "import threading\ngate = threading.Event()\ntorch.cuda._fake.empty_cache_gate = gate\nx = torch.empty(GiB, dtype=torch.uint8, device='cuda'); del x")
            with self.assertRaises(client.AgentTimeout):
                client.request(t.pid, "reclaim", timeout_s=0.3)
            # That reclaim still waits in empty_cache (as cudaFree waits for a running
            # kernel), holding the allocator's lock: stats would wait for it too, hello not.
            wait_for(lambda: t.run("", "torch.cuda._fake.empty_cache_calls") == 1, what="empty_cache entered")
            self.assertTrue(client.request(t.pid, "hello")["ok"])
            busy = client.request(t.pid, "reclaim", check=False)
            self.assertEqual(busy["error"]["code"], proto.BUSY)
            t.run("gate.set()")
            wait_for(lambda: t.run("", "torch.cuda.memory_reserved()") == 0, what="the first reclaim to finish")
            self.assertTrue(client.request(t.pid, "reclaim")["ok"])


    def test_the_capture_guard_is_installed_when_torch_was_imported_before_start(self) -> None:
        with Target() as t:
            t.run(SETUP)
            t.start_agent()
            t.run("g = torch.cuda.CUDAGraph()\ng.capture_begin()")
            self.assertEqual(client.request(t.pid, "reclaim", check=False)["error"]["code"], proto.CAPTURING)


class DeepTest(unittest.TestCase):
    def test_deep_drops_the_last_exception_and_its_frames_tensors(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "import sys\n"
                + "def step():\n    activations = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')\n    raise MemoryError('CUDA out of memory (simulated)')\n"
                + "try:\n    step()\nexcept MemoryError:\n    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()\n"
            )
            self.assertEqual(client.request(t.pid, "reclaim", gc=True)["released_bytes"], 0)
            answer = client.request(t.pid, "reclaim", deep=True)
            self.assertEqual(answer["released_bytes"], 2 * GiB)
            self.assertFalse(answer["deep"]["in_ipython"])
            [dropped] = answer["deep"]["dropped"]
            self.assertEqual(dropped["what"], "last_exception")
            self.assertEqual(dropped["detail"], "MemoryError: CUDA out of memory (simulated)")
            self.assertGreaterEqual(dropped["frames_cleared"], 2)
            self.assertFalse(t.run("", "hasattr(sys, 'last_traceback')"))

    def test_deep_names_what_it_dropped_and_counts_the_frames_tensors(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "import sys\n"
                + "def step():\n    a = torch.empty(GiB, dtype=torch.uint8, device='cuda')\n"
                + "    b = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')\n    same = a\n    n = 3\n    1 / 0\n"
                + "try:\n    step()\nexcept ZeroDivisionError:\n    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()\n"
            )
            [dropped] = client.request(t.pid, "reclaim", deep=True)["deep"]["dropped"]
            # `same` is `a` again: two tensors, 3 GiB, not three.
            self.assertEqual((dropped["tensors"], dropped["tensor_bytes"]), (2, 3 * GiB))
            self.assertEqual(dropped["names"], ["sys.last_type", "sys.last_value", "sys.last_traceback"])

    def test_deep_frees_the_tensors_of_a_traceback_that_something_else_still_holds(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                SETUP
                + "import sys\nkept = []\n"
                + "def step():\n    activations = torch.empty(2 * GiB, dtype=torch.uint8, device='cuda')\n    raise MemoryError('oom')\n"
                + "try:\n    step()\nexcept MemoryError:\n    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()\n"
                + "    kept.append(sys.last_traceback)\n"  # a logger, %tb, a debugger
            )
            answer = client.request(t.pid, "reclaim", deep=True)
            self.assertEqual(answer["released_bytes"], 2 * GiB)
            self.assertEqual(t.run("", "len(kept)"), 1)

    def test_deep_with_nothing_to_drop_says_so(self) -> None:
        with Target() as t:
            t.start_agent()
            answer = client.request(t.pid, "reclaim", deep=True)
            self.assertEqual(answer["deep"], {"in_ipython": False, "dropped": []})


if __name__ == "__main__":
    unittest.main()
