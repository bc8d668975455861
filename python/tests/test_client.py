"""The client against agents that misbehave (servers in this process that never answer,
answer garbage, too much, or half), and the debugging command's exit statuses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from harness import PYTHON_DIR, Target, client

from vramctl_agent import _protocol as proto


class FakeAgent:
    """A socket server that answers every connection with `reply(request_line)` bytes (None:
    never answer, keep the connection open)."""

    def __init__(self, reply, read_first: bool = True) -> None:
        self.read_first = read_first
        self.answered = threading.Event()
        self.dir = tempfile.mkdtemp(prefix="vramctl-test-fake-")
        self.path = os.path.join(self.dir, "agent-1.sock")
        self.reply = reply
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            try:
                line = b""
                while self.read_first and not line.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    line += chunk
                data = self.reply(line)
                if data is not None:
                    conn.sendall(data)
                    conn.close()
                    self.answered.set()
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "FakeAgent":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class MisbehavingAgentTest(unittest.TestCase):
    def test_an_agent_that_never_answers_times_the_client_out(self) -> None:
        with FakeAgent(lambda line: None) as fake:
            started = time.monotonic()
            with self.assertRaises(client.AgentTimeout) as raised:
                client.request(fake.path, "stats", timeout_s=0.5)
            self.assertLess(time.monotonic() - started, 3.0)
            self.assertIn("did not answer within 0.5 s", str(raised.exception))

    def test_malformed_answers_are_refused_with_what_was_wrong(self) -> None:
        cases = [
            (b"not json\n", "malformed answer"),
            (b"[1, 2]\n", "JSON list, not an object"),
            (b'{"protocol": 1}\n', "without 'ok'"),
            (b'{"ok": true}\n', "without 'protocol'"),
            (b'{"ok": false, "protocol": 1}\n', "without 'error'"),
            (b'{"ok": true, "protocol": 1', "in the middle of an answer"),
            (b"", "closed the connection without answering"),
            (b'{"ok": true, "protocol": 1, "x": "\xff"}\n', "not UTF-8"),
        ]
        for data, message in cases:
            with self.subTest(data=data[:40]), FakeAgent(lambda line, data=data: data) as fake:
                with self.assertRaises(client.ClientError) as raised:
                    client.request(fake.path, "hello", timeout_s=2)
                self.assertIn(message, str(raised.exception))

    def test_an_endless_answer_is_cut_off(self) -> None:
        huge = b'{"ok": true, "protocol": 1, "pad": "' + b"x" * (client.MAX_ANSWER_BYTES + 10)
        with FakeAgent(lambda line: huge) as fake:
            with self.assertRaises(client.BadAnswer) as raised:
                client.request(fake.path, "hello", timeout_s=10)
            self.assertIn("without a newline", str(raised.exception))

    def test_an_error_answer_raises_with_its_code_or_is_returned(self) -> None:
        answer = proto.encode_line(proto.error_response(proto.CAPTURING, "a capture", op="reclaim", retry_after_s=1.0))
        with FakeAgent(lambda line: answer) as fake:
            with self.assertRaises(client.AgentRefused) as raised:
                client.request(fake.path, "reclaim")
            self.assertEqual(raised.exception.code, proto.CAPTURING)
            self.assertEqual(raised.exception.answer["error"]["retry_after_s"], 1.0)
            self.assertFalse(client.request(fake.path, "reclaim", check=False)["ok"])

    def test_an_answer_sent_before_the_request_was_read_is_still_read(self) -> None:
        # The agent answers `busy` (or permission denied) at once and closes; the client's
        # send then fails with EPIPE, and the answer waiting in its buffer is the news.
        busy = proto.encode_line(proto.error_response(proto.BUSY, "full", retry_after_s=1.0))
        with FakeAgent(lambda line: busy, read_first=False) as fake:
            with client.Connection(fake.path) as conn:
                self.assertTrue(fake.answered.wait(5))
                with self.assertRaises(client.AgentRefused) as raised:
                    conn.request("hello", pad="x" * 300000)
                self.assertEqual(raised.exception.code, proto.BUSY)

    def test_a_socket_served_by_another_process_is_not_believed(self) -> None:
        # The right directory, the right user, the right name, but this test process serves
        # it, not the process asked about: the kernel's SO_PEERCRED says so.
        with Target() as t:
            directory = os.path.join(t.runtime_dir, "vramctl")
            os.mkdir(directory, 0o700)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.addCleanup(listener.close)
            listener.bind(os.path.join(directory, f"agent-{t.pid}.sock"))
            listener.listen(1)
            with self.assertRaises(client.WrongPeer) as raised:
                client.request(t.pid, "hello", timeout_s=2)
            self.assertIn(f"it is served by process {os.getpid()}, not {t.pid}", str(raised.exception))

    def test_a_socket_behind_a_symlink_is_not_followed(self) -> None:
        with FakeAgent(lambda line: b'{"protocol": 1, "ok": true}\n') as fake:
            link = os.path.join(fake.dir, "agent-2.sock")
            os.symlink(fake.path, link)
            with self.assertRaises(client.WrongPeer) as raised:
                client.request(link, "hello", timeout_s=2)
            self.assertIn("is not a socket (a symlink)", str(raised.exception))
            linked_dir = fake.dir + "-link"
            os.symlink(fake.dir, linked_dir)
            self.addCleanup(os.unlink, linked_dir)
            with self.assertRaises(client.WrongPeer) as raised:
                client.request(os.path.join(linked_dir, "agent-1.sock"), "hello", timeout_s=2)
            self.assertIn("is a symlink", str(raised.exception))
            self.assertFalse(fake.answered.is_set())

    def test_no_socket_is_no_agent(self) -> None:
        with self.assertRaises(client.NoAgent):
            client.request("/nonexistent/agent-1.sock", "hello")
        with self.assertRaises(client.NoAgent) as raised:
            client.request(2**22 + 7, "hello")  # above pid_max: certainly no such process
        self.assertIn("vramctl_agent.start()", str(raised.exception))


class CommandTest(unittest.TestCase):
    def command(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        environment = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        environment.update(env or {})
        return subprocess.run([sys.executable, "-m", "vramctl_agent.client", *args], capture_output=True, text=True, env=environment, timeout=60)

    def test_exit_statuses_say_answered_refused_or_unreachable(self) -> None:
        with Target() as t:
            path = t.start_agent()
            t.run("import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del x")
            ok = self.command(str(t.pid), "reclaim", "--dry-run")
            self.assertEqual(ok.returncode, 0, ok.stderr)
            self.assertEqual(json.loads(ok.stdout)["released_bytes"], 1 << 30)
            refused = self.command(str(t.pid), "snapshot", "--path", "relative.pickle")
            self.assertEqual(refused.returncode, 1)
            self.assertEqual(json.loads(refused.stdout)["error"]["code"], proto.BAD_REQUEST)
            by_socket = self.command("0", "hello", "--socket", path)
            self.assertEqual(by_socket.returncode, 0)
        gone = self.command(str(2**22 + 7), "hello")
        self.assertEqual(gone.returncode, 2)
        self.assertRegex(gone.stderr, r"^python3 -m vramctl_agent.client: error: no agent socket for pid \d+")
        usage = self.command("abc", "hello")
        self.assertEqual(usage.returncode, 2)

    def test_python_dash_m_vramctl_agent_is_the_client(self) -> None:
        done = subprocess.run([sys.executable, "-m", "vramctl_agent", "--help"], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
        self.assertEqual(done.returncode, 0)
        self.assertIn("Talk to a vramctl agent", done.stdout)


if __name__ == "__main__":
    unittest.main()
