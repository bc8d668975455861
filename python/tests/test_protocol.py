"""The wire protocol against a real agent in a real interpreter: the answers' shape, and
every malformed, oversized, slow or excessive request the agent must survive."""

from __future__ import annotations

import json
import os
import socket
import time
import unittest

from harness import GiB, Target, client, wait_for

from vramctl_agent import _protocol as proto


def raw(path: str, data: bytes, timeout_s: float = 5.0, shut: bool = False) -> list[dict]:
    """Sends bytes as they are and returns every answer line until the agent closes."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout_s)
    conn.connect(path)
    try:
        conn.sendall(data)
        if shut:
            conn.shutdown(socket.SHUT_WR)
    except BrokenPipeError:
        pass  # the agent answered early (busy, too large) and closed; read its answer
    received = b""
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
            if not shut and received.endswith(b"\n") and received.count(b"\n") >= data.count(b"\n"):
                break
    finally:
        conn.close()
    return [json.loads(line) for line in received.splitlines() if line.strip()]


class ProtocolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.target = Target()
        cls.path = cls.target.start_agent(request_timeout_s=1.0)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.target.__exit__(None, None, None)

    def assert_alive(self) -> None:
        self.assertTrue(client.request(self.path, "hello")["ok"])

    def test_hello_names_the_process_the_python_and_the_protocol(self) -> None:
        self.target.run("import torch; x = torch.empty(GiB, dtype=torch.uint8, device='cuda')".replace("GiB", str(GiB)))
        hello = client.request(self.target.pid, "hello")
        self.assertEqual(hello["protocol"], proto.PROTOCOL)
        self.assertEqual(hello["pid"], self.target.pid)
        self.assertEqual(hello["uid"], os.geteuid())
        self.assertEqual(hello["agent_version"], "0.1.0")
        self.assertEqual(hello["socket"], self.path)
        self.assertEqual(hello["started_by"], "start")
        self.assertIsInstance(hello["start_time_ticks"], int)
        self.assertEqual(hello["ops"], list(proto.OPS))
        self.assertEqual(hello["limits"]["max_request_bytes"], proto.MAX_REQUEST_BYTES)
        self.assertEqual(hello["limits"]["request_timeout_s"], 1.0)
        self.assertRegex(hello["python"]["version"], r"^3\.\d+\.\d+")
        torch = [f for f in hello["frameworks"] if f["name"] == "torch"]
        self.assertEqual(torch[0]["version"], "2.11.0+fake")
        self.assertTrue(torch[0]["initialized"])
        self.assertTrue(torch[0]["capture_guard"])
        self.assertEqual(hello["devices"][0]["uuid"], "8cca1523-521a-59dd-48fa-95c44bc1b100")
        self.assertEqual(hello["devices"][0]["total_bytes"], 143771 << 20)

    def test_requests_on_one_connection_are_answered_in_order_with_their_ids(self) -> None:
        answers = raw(self.path, b'{"op":"hello","id":1}\n{"op":"stats","id":"two"}\n{"op":"nope","id":3}\n')
        self.assertEqual([a["id"] for a in answers], [1, "two", 3])
        self.assertEqual([a["ok"] for a in answers], [True, True, False])
        self.assertEqual(answers[2]["error"]["code"], proto.UNKNOWN_OP)
        self.assertEqual(answers[2]["error"]["ops"], list(proto.OPS))

    def test_malformed_requests_get_an_error_each_and_the_connection_survives(self) -> None:
        cases = [
            (b"not json\n", proto.BAD_JSON),
            (b"[1, 2]\n", proto.BAD_REQUEST),
            (b'"hello"\n', proto.BAD_REQUEST),
            (b"{}\n", proto.BAD_REQUEST),
            (b'{"op": 7}\n', proto.BAD_REQUEST),
            (b'{"op": "hello", "protocol": "1"}\n', proto.BAD_REQUEST),
            (b'{"op": "hello", "protocol": 2}\n', proto.UNSUPPORTED_PROTOCOL),
            (b'{"op": "hello", "protocol": 0}\n', proto.UNSUPPORTED_PROTOCOL),
            (b'{"op": "hello", "id": {"a": 1}}\n', proto.BAD_REQUEST),
            (b'{"op": "hello", "id": NaN}\n', proto.BAD_JSON),
            (b'{"op": "\xff\xfe"}\n', proto.BAD_JSON),
            (b"[" * 50000 + b"]" * 50 + b"\n", proto.BAD_JSON),
            (b'{"op": "reclaim", "gc": "yes"}\n', proto.BAD_REQUEST),
            (b'{"op": "reclaim", "dry_run": true, "gc": true}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "path": "relative.pickle"}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot"}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "record": "start", "max_entries": 0}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "record": "start", "max_entries": 10000001}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "record": "start", "max_entries": true}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "record": "pause"}\n', proto.BAD_REQUEST),
            (b'{"op": "snapshot", "record": "start", "stacks": "cpp"}\n', proto.BAD_REQUEST),
        ]
        for line, code in cases:
            with self.subTest(line=line[:60]):
                answers = raw(self.path, line + b'{"op":"hello"}\n')
                self.assertEqual(len(answers), 2, answers)
                self.assertFalse(answers[0]["ok"])
                self.assertEqual(answers[0]["protocol"], proto.PROTOCOL)
                self.assertEqual(answers[0]["error"]["code"], code, answers[0])
                self.assertTrue(answers[1]["ok"])
        self.assert_alive()

    def test_an_id_beyond_a_doubles_range_is_answered_with_a_null_id(self) -> None:
        # 1e400 parses as infinity, which no JSON answer can carry: once it killed the
        # answer on its way out and the client heard nothing.
        for literal in (b"1e400", b"-1e400", b"1E+999"):
            with self.subTest(id=literal):
                answers = raw(self.path, b'{"op":"hello","id":' + literal + b'}\n{"op":"hello","id":2}\n')
                self.assertEqual(len(answers), 2, answers)
                self.assertFalse(answers[0]["ok"])
                self.assertEqual(answers[0]["error"]["code"], proto.BAD_REQUEST)
                self.assertIn("id", answers[0])
                self.assertIsNone(answers[0]["id"])
                self.assertEqual(answers[0]["op"], "hello")
                self.assertEqual(answers[1]["id"], 2)
                self.assertTrue(answers[1]["ok"])
        # Large but finite ids are still echoed as the numbers they are.
        [answer] = raw(self.path, b'{"op":"hello","id":1e300}\n')
        self.assertEqual(answer["id"], 1e300)
        self.assertTrue(answer["ok"])

    def test_an_unsupported_protocol_answer_says_which_the_agent_speaks(self) -> None:
        answer = raw(self.path, b'{"op":"hello","protocol":2}\n')[0]
        self.assertEqual(answer["error"]["supported"], [1])
        self.assertEqual(answer["op"], "hello")

    def test_unknown_fields_are_ignored(self) -> None:
        answer = raw(self.path, b'{"op":"hello","future":{"x":[1,2]}}\n')[0]
        self.assertTrue(answer["ok"])

    def test_blank_lines_are_skipped(self) -> None:
        answers = raw(self.path, b'\n   \n{"op":"hello"}\n', shut=True)
        self.assertEqual(len(answers), 1)
        self.assertTrue(answers[0]["ok"])

    def test_a_last_line_without_newline_is_answered_when_the_client_half_closes(self) -> None:
        answers = raw(self.path, b'{"op":"hello"}', shut=True)
        self.assertEqual(len(answers), 1)
        self.assertTrue(answers[0]["ok"])

    def test_an_oversized_line_is_refused_and_the_connection_closed(self) -> None:
        for data in (b"x" * (proto.MAX_REQUEST_BYTES + 10), b'{"op":"hello","pad":"' + b"y" * proto.MAX_REQUEST_BYTES + b'"}\n'):
            with self.subTest(newline=data.endswith(b"\n")):
                answers = raw(self.path, data, shut=False)
                self.assertEqual(len(answers), 1)
                self.assertEqual(answers[0]["error"]["code"], proto.REQUEST_TOO_LARGE)
        self.assert_alive()

    def test_a_line_of_exactly_the_limit_is_served(self) -> None:
        prefix = b'{"op":"hello","pad":"'
        suffix = b'"}\n'
        line = prefix + b"z" * (proto.MAX_REQUEST_BYTES - len(prefix) - len(suffix)) + suffix
        self.assertEqual(len(line), proto.MAX_REQUEST_BYTES)
        self.assertTrue(raw(self.path, line)[0]["ok"])

    def test_a_client_that_stops_mid_line_is_timed_out_and_the_agent_carries_on(self) -> None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        conn.connect(self.path)
        conn.sendall(b'{"op": "hel')
        started = time.monotonic()
        received = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk
        conn.close()
        waited = time.monotonic() - started
        self.assertEqual(json.loads(received)["error"]["code"], proto.TIMEOUT)
        self.assertGreaterEqual(waited, 0.9)
        self.assertLess(waited, 4.0)
        self.assert_alive()

    def test_an_idle_client_is_disconnected_silently(self) -> None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.settimeout(5)
        conn.connect(self.path)
        self.assertEqual(conn.recv(4096), b"")
        conn.close()

    def test_connections_over_the_limit_are_answered_busy(self) -> None:
        with Target() as target:
            path = target.start_agent(max_connections=2)
            held = []
            try:
                for _ in range(2):
                    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    conn.connect(path)
                    conn.sendall(b'{"op":"hello"}\n')
                    conn.settimeout(5)
                    conn.recv(65536)  # served: the slot stays taken until we close
                    held.append(conn)
                answer = raw(path, b'{"op":"hello"}\n')[0]
                self.assertEqual(answer["error"]["code"], proto.BUSY)
                self.assertIn("retry_after_s", answer["error"])
            finally:
                for conn in held:
                    conn.close()
            wait_for(lambda: raw(path, b'{"op":"hello"}\n')[0]["ok"], what="a free slot")

    def test_quick_successive_requests_are_not_refused_busy(self) -> None:
        # Each closed connection frees its slot only once the agent's thread sees the end
        # of input; a client asking again at once must not get `busy` for that.
        with Target() as target:
            path = target.start_agent(max_connections=1)
            for _ in range(30):
                self.assertTrue(client.request(path, "hello")["ok"])

    def test_a_client_that_never_reads_does_not_stop_the_agent(self) -> None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.sendall(b'{"op":"stats"}\n' * 500)
        # The agent blocks writing to us (until its write timeout); others are still served.
        try:
            wait_for(lambda: client.request(self.path, "hello", check=False)["ok"], what="another client served")
        finally:
            conn.close()


if __name__ == "__main__":
    unittest.main()
