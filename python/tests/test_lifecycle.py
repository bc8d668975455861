"""The socket's life: removed at exit and on SIGTERM/SIGHUP, stale after SIGKILL and removed
by the next client, replaced when a dead process's PID comes back, and never answered by a
forked child in its parent's name."""

from __future__ import annotations

import json
import os
import signal
import socket
import unittest

from harness import GiB, Target, TargetFailed, client, wait_for

from vramctl_agent import _paths


class ExitTest(unittest.TestCase):
    def test_the_socket_is_removed_at_a_normal_exit(self) -> None:
        with Target() as t:
            path = t.start_agent()
            self.assertTrue(os.path.exists(path))
            self.assertEqual(t.finish(), 0)
            self.assertFalse(os.path.exists(path))

    def test_the_socket_is_removed_at_sys_exit(self) -> None:
        with Target() as t:
            path = t.start_agent()
            with self.assertRaises(TargetFailed):
                t.run("import sys\nsys.exit(4)")
            self.assertEqual(t.finish(), 4)
            self.assertFalse(os.path.exists(path))

    def test_stop_removes_the_socket_and_start_makes_a_new_one(self) -> None:
        with Target() as t:
            path = t.start_agent()
            t.run("vramctl_agent.stop()")
            self.assertFalse(os.path.exists(path))
            self.assertFalse(t.run("", "vramctl_agent.is_running()"))
            self.assertEqual(t.start_agent(), path)
            self.assertTrue(client.request(path, "hello")["ok"])

    def test_start_twice_returns_the_same_agent(self) -> None:
        with Target() as t:
            path = t.start_agent()
            self.assertEqual(t.start_agent(), path)
            self.assertEqual(t.run("import threading", "sum(th.name == 'vramctl-agent' for th in threading.enumerate())"), 1)

    def test_sigterm_removes_the_socket_and_the_process_still_dies_of_it(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with self.subTest(signal=sig.name), Target() as t:
                path = t.start_agent()
                self.assertEqual(t.kill(sig), -sig)
                self.assertFalse(os.path.exists(path))

    def test_a_sighup_the_program_ignores_stays_ignored(self) -> None:
        # A program started under nohup ignores SIGHUP: the agent must not turn a hangup
        # into its death, and the socket stays for as long as the process lives.
        with Target(ignore_signals=(signal.SIGHUP,)) as t:
            path = t.start_agent()
            self.assertEqual(t.run("import signal", "signal.getsignal(signal.SIGHUP) is signal.SIG_IGN"), True)
            t.proc.send_signal(signal.SIGHUP)
            self.assertEqual(t.run("", "1"), 1)  # still alive and answering
            self.assertTrue(client.request(path, "hello")["ok"])

    def test_a_handler_the_program_installed_is_left_alone(self) -> None:
        with Target() as t:
            t.run("import signal, sys\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(3))")
            path = t.start_agent()
            self.assertEqual(t.run("", "signal.getsignal(signal.SIGTERM).__name__"), "<lambda>")
            self.assertEqual(t.kill(signal.SIGTERM), 3)  # its handler ran; atexit removed the socket
            self.assertFalse(os.path.exists(path))

    def test_signal_cleanup_can_be_turned_off(self) -> None:
        with Target(env={"VRAMCTL_AGENT_SIGNALS": "0"}) as t:
            path = t.start_agent()
            self.assertEqual(t.run("import signal", "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL"), True)
            t.kill(signal.SIGTERM)
            self.assertEqual(_paths.probe(path), "stale")


class StaleTest(unittest.TestCase):
    def test_a_killed_agents_socket_is_stale_and_the_next_client_removes_it(self) -> None:
        with Target() as t:
            path = t.start_agent()
            t.kill(signal.SIGKILL)
            self.assertEqual(_paths.probe(path), "stale")
            # (By path: the dead process's environment, which said where its runtime
            # directory is, is gone with it.)
            with self.assertRaises(client.StaleAgent) as raised:
                client.request(path, "hello")
            self.assertTrue(raised.exception.removed)
            self.assertIn("stale", str(raised.exception))
            self.assertFalse(os.path.exists(path))
            with self.assertRaises(client.NoAgent):
                client.request(path, "hello")

    def test_a_reused_pids_stale_socket_is_removed_by_a_client_asking_by_pid(self) -> None:
        with Target() as t:  # this process has no agent; a dead one with its PID left a socket
            directory = os.path.join(t.runtime_dir, "vramctl")
            os.mkdir(directory, 0o700)
            stale = os.path.join(directory, f"agent-{t.pid}.sock")
            leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            leftover.bind(stale)
            leftover.close()
            with self.assertRaises(client.StaleAgent) as raised:
                client.request(t.pid, "hello")
            self.assertEqual(raised.exception.path, stale)
            self.assertFalse(os.path.exists(stale))

    def test_list_clean_removes_only_stale_sockets(self) -> None:
        with Target() as dead, Target(runtime_dir=dead.runtime_dir) as alive:
            dead_path = dead.start_agent()
            alive_path = alive.start_agent()
            dead.kill(signal.SIGKILL)
            os.environ["XDG_RUNTIME_DIR"] = dead.runtime_dir
            try:
                states = {a["path"]: a["state"] for a in client.list_agents(clean=True)}
            finally:
                del os.environ["XDG_RUNTIME_DIR"]
            self.assertEqual(states[dead_path], "removed")
            self.assertEqual(states[alive_path], "live")
            self.assertFalse(os.path.exists(dead_path))
            self.assertTrue(client.request(alive_path, "hello")["ok"])

    def test_a_stale_socket_at_our_own_name_is_replaced(self) -> None:
        with Target() as t:
            directory = os.path.join(t.runtime_dir, "vramctl")
            os.mkdir(directory, 0o700)
            stale = os.path.join(directory, f"agent-{t.pid}.sock")
            leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            leftover.bind(stale)  # a dead process with our PID left this
            leftover.close()
            self.assertEqual(_paths.probe(stale), "stale")
            self.assertEqual(t.start_agent(), stale)
            self.assertEqual(client.request(t.pid, "hello")["pid"], t.pid)

    def test_a_live_listener_at_our_name_is_not_stolen(self) -> None:
        with Target() as t:
            directory = os.path.join(t.runtime_dir, "vramctl")
            os.mkdir(directory, 0o700)
            other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            other.bind(os.path.join(directory, f"agent-{t.pid}.sock"))
            other.listen(1)
            try:
                with self.assertRaises(TargetFailed) as failed:
                    t.start_agent()
                self.assertIn("another agent is listening", str(failed.exception))
            finally:
                other.close()

    def test_a_client_arriving_while_the_agent_starts_does_not_take_it_for_stale(self) -> None:
        # A client that probes our path between bind() and listen() (connect refused) would
        # remove the socket as stale. Play that client from inside listen(): the agent binds
        # under a temporary name and renames it into place once listening, so at that
        # moment there is nothing at our path to remove.
        with Target() as t:
            t.run(
                "import socket, os\nfrom vramctl_agent import _paths\n"
                "real_listen = socket.socket.listen\nremoved = []\n"
                "def listen(self, *args):\n"
                "    path = os.path.join(os.environ['XDG_RUNTIME_DIR'], 'vramctl', _paths.socket_name(os.getpid()))\n"
                "    removed.append(_paths.remove_if_stale(path))\n"
                "    return real_listen(self, *args)\n"
                "socket.socket.listen = listen\n"
            )
            path = t.start_agent()
            t.run("socket.socket.listen = real_listen")
            self.assertEqual(t.run("", "removed"), [False])
            self.assertTrue(client.request(t.pid, "hello")["ok"])
            self.assertEqual(os.listdir(os.path.dirname(path)), [f"agent-{t.pid}.sock"])


FORK_CHILD = """
import os, sys, time, json
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(r)
    report = {"running": vramctl_agent.is_running(), "path": vramctl_agent.socket_path()}
    if MODE == "start":
        report["own"] = vramctl_agent.start()
    os.write(w, (json.dumps(report) + "\\n").encode())
    if MODE == "exit":
        sys.exit(0)   # runs the inherited atexit handlers
    time.sleep(60)    # a DataLoader worker outliving its parent
    os._exit(0)
os.close(w)
child_report = json.loads(os.fdopen(r).readline())
"""


class ForkTest(unittest.TestCase):
    def fork(self, t: Target, mode: str) -> tuple[int, dict]:
        t.run("MODE = %r\n" % mode + FORK_CHILD)
        return t.run("", "child"), t.run("", "child_report")

    def test_a_forked_child_has_no_agent_and_its_exit_keeps_the_parents_socket(self) -> None:
        with Target() as t:
            path = t.start_agent()
            child, report = self.fork(t, "exit")
            self.assertEqual(report, {"running": False, "path": None})
            t.run(f"os.waitpid({child}, 0)")
            self.assertTrue(os.path.exists(path))
            self.assertEqual(client.request(t.pid, "hello")["pid"], t.pid)

    def test_a_child_that_outlives_its_parent_leaves_a_stale_socket_not_a_silent_one(self) -> None:
        with Target() as t:
            path = t.start_agent()
            child, _ = self.fork(t, "sleep")
            try:
                t.kill(signal.SIGKILL)
                # The child still runs; it closed its copy of the listening socket at the
                # fork, so connecting is refused (stale) instead of accepted and never
                # answered.
                os.kill(child, 0)
                self.assertEqual(_paths.probe(path), "stale")
                with self.assertRaises(client.StaleAgent):
                    client.request(path, "hello", timeout_s=2)
            finally:
                os.kill(child, signal.SIGKILL)

    def test_a_forked_child_may_start_its_own_agent(self) -> None:
        with Target() as t:
            path = t.start_agent()
            child, report = self.fork(t, "start")
            try:
                self.assertEqual(report["own"], os.path.join(os.path.dirname(path), f"agent-{child}.sock"))
                self.assertEqual(client.request(child, "hello")["pid"], child)
                self.assertEqual(client.request(t.pid, "hello")["pid"], t.pid)
            finally:
                os.kill(child, signal.SIGKILL)

    def test_a_fork_during_a_reclaim_does_not_leave_the_child_a_held_lock(self) -> None:
        with Target() as t:
            t.start_agent()
            t.run(
                "import threading, torch\n"
                "gate = threading.Event()\ntorch.cuda._fake.empty_cache_gate = gate\n"
                f"x = torch.empty({GiB}, dtype=torch.uint8, device='cuda'); del x\n"
            )
            with self.assertRaises(client.AgentTimeout):
                client.request(t.pid, "reclaim", timeout_s=0.2)
            wait_for(lambda: t.run("", "torch.cuda._fake.empty_cache_calls") == 1, what="empty_cache entered")
            # Fork while the agent's thread holds the capture gate: the child's
            # capture_begin must not wait for a thread that does not exist in it.
            t.run(
                "import os, json\nr, w = os.pipe()\nchild = os.fork()\n"
                "if child == 0:\n"
                "    torch.cuda._fake.empty_cache_gate = None\n"
                "    g = torch.cuda.CUDAGraph(); g.capture_begin(); g.capture_end()\n"
                "    os.write(w, b'captured\\n'); os._exit(0)\n"
                "os.close(w)\nchild_said = os.fdopen(r).readline().strip()\nos.waitpid(child, 0)\n",
                timeout_s=10,
            )
            self.assertEqual(t.run("", "child_said"), "captured")
            t.run("gate.set()")


if __name__ == "__main__":
    unittest.main()
