"""JAX and TensorFlow through their stand-ins (tests/fakes): their own counters when their
runtime has started, nothing (and no start) when it has not, and what reclaim cannot do."""

from __future__ import annotations

import unittest

from harness import GiB, MiB, Target, client

from vramctl_agent._frameworks import DEVICE_FIELDS

POOL = int(0.75 * 143771 * MiB)


class JaxTest(unittest.TestCase):
    def test_jax_counters_are_read_once_its_backend_has_started(self) -> None:
        with Target(fakes=("jax",)) as t:
            t.start_agent()
            t.run(f"import jax\njax.devices()\njax.numpy_ones(3 * {GiB})")
            answer = client.request(t.pid, "stats")
            [d] = answer["devices"]
            self.assertEqual(d["framework"], "jax")
            self.assertEqual(d["allocated_bytes"], 3 * GiB)
            self.assertEqual(d["allocated_peak_bytes"], 3 * GiB)
            self.assertEqual(d["reserved_bytes"], POOL)
            self.assertEqual(d["cached_bytes"], POOL - 3 * GiB)
            self.assertIsNone(d["alloc_retries"])
            self.assertEqual(d["name"], "NVIDIA H200")
            self.assertEqual(answer["frameworks"], [{"name": "jax", "version": "0.7.2+fake", "initialized": True}])

    def test_a_jax_that_has_not_started_is_not_started_by_the_agent(self) -> None:
        with Target(fakes=("jax",)) as t:
            t.start_agent()
            t.run("import jax")
            answer = client.request(t.pid, "stats")
            self.assertEqual(answer["devices"], [])
            self.assertEqual(answer["frameworks"][0]["initialized"], False)
            client.request(t.pid, "reclaim")
            client.request(t.pid, "reset-peak")
            self.assertEqual(t.run("", "jax._src.xla_bridge.init_calls"), 0)

    def test_reclaim_and_reset_peak_say_what_jax_cannot_do(self) -> None:
        with Target(fakes=("jax",)) as t:
            t.start_agent()
            t.run("import jax\njax.devices()")
            reclaim = client.request(t.pid, "reclaim")
            self.assertEqual(reclaim["outcome"], "no_gpu_allocator")
            self.assertEqual([u["framework"] for u in reclaim["unsupported"]], ["jax"])
            reset = client.request(t.pid, "reset-peak")
            self.assertEqual([u["framework"] for u in reset["unsupported"]], ["jax"])


class TensorFlowTest(unittest.TestCase):
    def test_tensorflow_counters_and_reset_once_its_context_has_started(self) -> None:
        with Target(fakes=("tensorflow",)) as t:
            t.start_agent()
            t.run(f"import tensorflow as tf\ntf.constant(2 * {GiB})")
            [d] = client.request(t.pid, "stats")["devices"]
            self.assertEqual((d["framework"], d["index"]), ("tensorflow", 0))
            self.assertEqual(d["allocated_bytes"], 2 * GiB)
            self.assertEqual(d["allocated_peak_bytes"], 2 * GiB)
            self.assertIsNone(d["reserved_bytes"])
            t.run("tf.config.experimental.current -= GiB".replace("GiB", str(GiB)))
            reset = client.request(t.pid, "reset-peak")
            self.assertEqual(reset["devices"], [{"framework": "tensorflow", "index": 0, "reset": True}])
            [d] = client.request(t.pid, "stats")["devices"]
            self.assertEqual(d["allocated_peak_bytes"], GiB)

    def test_a_tensorflow_that_has_not_started_is_not_started_by_the_agent(self) -> None:
        with Target(fakes=("tensorflow",)) as t:
            t.start_agent()
            t.run("import tensorflow as tf")
            for op in ("stats", "reclaim", "reset-peak", "hello"):
                client.request(t.pid, op)
            self.assertEqual(t.run("", "tf.python.eager.context.init_calls"), 0)


class MixedTest(unittest.TestCase):
    def test_all_three_at_once(self) -> None:
        with Target(fakes=("torch", "jax", "tensorflow")) as t:
            t.start_agent()
            t.run(
                "import torch, jax, tensorflow as tf\n"
                f"x = torch.empty({GiB}, dtype=torch.uint8, device='cuda')\njax.devices()\ntf.constant(1)"
            )
            answer = client.request(t.pid, "stats")
            self.assertEqual([d["framework"] for d in answer["devices"]], ["torch", "jax", "tensorflow"])
            self.assertEqual([f["name"] for f in answer["frameworks"]], ["torch", "jax", "tensorflow"])
            # Every device entry has the same fields, null where the framework cannot say.
            for d in answer["devices"]:
                self.assertLessEqual(set(DEVICE_FIELDS) | {"framework", "index", "name", "uuid"}, set(d), d["framework"])


if __name__ == "__main__":
    unittest.main()
