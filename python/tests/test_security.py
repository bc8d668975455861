"""Who may talk to an agent, and where its socket goes when the usual place is unusable.

Runs as root (as CI does) to act as other users: a client of another uid is spawned with
os.setuid in a forked child; agents of an unprivileged uid run in a setuid'd interpreter
so that their fallback directory (/tmp/vramctl-<uid>) is the tests' own."""

from __future__ import annotations

import errno
import glob
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import unittest

from harness import AGENT_UID, OTHER_UID, PlantedSocket, Target, TargetFailed, another_user, client, is_root, needs_root, python_for_uid, world_readable_copy

from vramctl_agent import _protocol as proto


def connect_as(uid: int, path: str, request: bytes = b'{"op":"hello"}\n') -> dict:
    """Connects to `path` as `uid` from a forked child; returns what happened."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into unittest
        result: dict
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(5)
            try:
                conn.connect(path)
            except OSError as err:
                result = {"connected": False, "errno": errno.errorcode.get(err.errno or 0)}
            else:
                try:
                    conn.sendall(request)
                except BrokenPipeError:
                    pass  # refused at once: the answer is already waiting
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                result = {"connected": True, "answer": json.loads(data) if data else None}
            os.write(write_end, json.dumps(result).encode())
        except BaseException as err:  # noqa: B902 - report to the parent
            os.write(write_end, json.dumps({"child_error": repr(err)}).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data)


def client_command_as(uid: int, *args: str) -> subprocess.CompletedProcess:
    """`python3 -m vramctl_agent.client ARGS` run as `uid`, from a copy that uid can read."""
    python = python_for_uid(uid)
    if python is None:
        raise unittest.SkipTest(f"no interpreter that uid {uid} may run")
    base, _ = world_readable_copy()
    try:

        def preexec() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": base, "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run(
            [python, "-m", "vramctl_agent.client", *args], capture_output=True, text=True, env=environment, preexec_fn=preexec, cwd="/", timeout=60
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


def forged_hello(pid: int) -> bytes:
    return json.dumps({"protocol": 1, "ok": True, "op": "hello", "id": 1, "pid": pid, "uid": AGENT_UID, "forged": True}).encode() + b"\n"


class PlantedSocketTest(unittest.TestCase):  # another_user() skips, on stderr, when not root
    """Another user plants a listening socket where a client looks for the agent of a process
    of AGENT_UID that has none (XDG_RUNTIME_DIR unset: /tmp/vramctl-AGENT_UID) and answers
    with forged JSON. The client must never send it a request nor print what it says."""

    fallback = f"/tmp/vramctl-{AGENT_UID}"

    def setUp(self) -> None:
        shutil.rmtree(self.fallback, ignore_errors=True)
        self.addCleanup(shutil.rmtree, self.fallback, True)

    def assert_refused(self, t: Target, planted: PlantedSocket, because: str) -> None:
        with self.assertRaises(client.WrongPeer) as raised:
            client.request(t.pid, "hello")
        self.assertIn(because, str(raised.exception))
        cli = self.command_as_root(str(t.pid), "hello")
        self.assertEqual(cli.returncode, 2, cli.stdout + cli.stderr)
        self.assertEqual(cli.stdout, "")
        self.assertIn(because, cli.stderr)
        own = client_command_as(AGENT_UID, str(t.pid), "hello")  # the process's own user
        self.assertEqual(own.returncode, 2, own.stdout + own.stderr)
        self.assertEqual(own.stdout, "")
        self.assertEqual(planted.requests(), [])

    def command_as_root(self, *args: str) -> subprocess.CompletedProcess:
        from harness import PYTHON_DIR

        environment = dict(os.environ, PYTHONPATH=PYTHON_DIR)
        return subprocess.run([sys.executable, "-m", "vramctl_agent.client", *args], capture_output=True, text=True, env=environment, timeout=60)

    def test_client_refuses_a_socket_another_user_planted(self) -> None:
        with another_user() as attacker, Target(uid=AGENT_UID, env={"XDG_RUNTIME_DIR": None}) as t:
            path = os.path.join(self.fallback, f"agent-{t.pid}.sock")
            # 1. The squatter's own directory at the fallback's name.
            with PlantedSocket(attacker.uid, path, forged_hello(t.pid), make_dir=True) as planted:
                self.assertEqual(os.lstat(self.fallback).st_uid, attacker.uid)
                self.assert_refused(t, planted, f"'{self.fallback}' belongs to uid {attacker.uid}, not {AGENT_UID}")
            shutil.rmtree(self.fallback)
            # 2. The user's own directory, left writable by others: anyone could have put it there.
            os.mkdir(self.fallback)
            os.chown(self.fallback, AGENT_UID, AGENT_UID)
            os.chmod(self.fallback, 0o777)
            with PlantedSocket(attacker.uid, path, forged_hello(t.pid)) as planted:
                self.assert_refused(t, planted, f"'{self.fallback}' may be written by others")
            shutil.rmtree(self.fallback)
            # 3. A private directory of the user's and a socket file of the user's, served by
            #    the attacker (root moved it there): only the kernel's word (SO_PEERCRED) tells.
            elsewhere = tempfile.mkdtemp(prefix="vramctl-test-planted-")
            self.addCleanup(shutil.rmtree, elsewhere, True)
            os.chmod(elsewhere, 0o777)
            with PlantedSocket(attacker.uid, os.path.join(elsewhere, "s"), forged_hello(t.pid)) as planted:
                os.mkdir(self.fallback, 0o700)
                os.chown(self.fallback, AGENT_UID, AGENT_UID)
                os.rename(os.path.join(elsewhere, "s"), path)
                os.lchown(path, AGENT_UID, AGENT_UID)
                self.assert_refused(t, planted, f"it is served by uid {attacker.uid}, not {AGENT_UID}")


@needs_root
class PeerTest(unittest.TestCase):
    def test_the_socket_directory_is_0700_and_the_socket_0600(self) -> None:
        with Target() as t:
            path = t.start_agent()
            self.assertEqual(stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode), 0o700)
            self.assertEqual(stat.S_IMODE(os.lstat(path).st_mode), 0o600)
            self.assertTrue(stat.S_ISSOCK(os.lstat(path).st_mode))
            self.assertEqual(path, os.path.join(t.runtime_dir, "vramctl", f"agent-{t.pid}.sock"))

    def test_another_user_cannot_even_reach_the_socket(self) -> None:
        with Target() as t:
            # The runtime directory itself open to all, as /run/user/<uid> is not: only
            # our own 0700 directory stands in the way.
            os.chmod(t.runtime_dir, 0o755)
            path = t.start_agent()
            result = connect_as(OTHER_UID, path)
            self.assertEqual(result, {"connected": False, "errno": "EACCES"})

    def test_another_user_is_refused_by_peer_credentials_even_through_an_open_directory(self) -> None:
        with Target() as t:
            os.chmod(t.runtime_dir, 0o755)
            path = t.start_agent()
            # Someone loosened the permissions: the peer check still refuses.
            os.chmod(os.path.dirname(path), 0o755)
            os.chmod(path, 0o666)
            result = connect_as(OTHER_UID, path, b'{"op":"reclaim"}\n')
            self.assertTrue(result["connected"])
            self.assertEqual(result["answer"]["error"]["code"], proto.PERMISSION_DENIED)
            self.assertIn(f"uid {OTHER_UID}", result["answer"]["error"]["message"])
            self.assertIn(f"refused a connection from pid", t.stderr())
            self.assertIn(f"uid {OTHER_UID}", t.stderr())
            self.assertTrue(client.request(path, "hello")["ok"])  # and it carries on

    def test_root_may_read_and_act_on_another_users_agent(self) -> None:
        with Target(uid=AGENT_UID) as t:
            path = t.start_agent()
            self.assertEqual(os.stat(path).st_uid, AGENT_UID)
            hello = client.request(t.pid, "hello")
            self.assertEqual(hello["uid"], AGENT_UID)
            t.run("import torch\nx = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); del x")
            self.assertEqual(client.request(t.pid, "reclaim")["released_bytes"], 1 << 30)


@needs_root
class FallbackTest(unittest.TestCase):
    """The agent runs as AGENT_UID; its fallback is /tmp/vramctl-AGENT_UID."""

    fallback = f"/tmp/vramctl-{AGENT_UID}"

    def setUp(self) -> None:
        shutil.rmtree(self.fallback, ignore_errors=True)
        self.runtime = tempfile.mkdtemp(prefix="vramctl-test-xdg-")
        os.chown(self.runtime, AGENT_UID, AGENT_UID)

    def tearDown(self) -> None:
        shutil.rmtree(self.runtime, ignore_errors=True)
        shutil.rmtree(self.fallback, ignore_errors=True)
        for fresh in glob.glob(f"{self.fallback}.*"):
            shutil.rmtree(fresh, ignore_errors=True)

    def agent(self, runtime_dir: str) -> Target:
        return Target(uid=AGENT_UID, runtime_dir=runtime_dir)

    def assert_fallback(self, t: Target, path: str) -> None:
        self.assertEqual(path, os.path.join(self.fallback, f"agent-{t.pid}.sock"))
        self.assertEqual(stat.S_IMODE(os.stat(self.fallback).st_mode), 0o700)
        self.assertEqual(os.stat(self.fallback).st_uid, AGENT_UID)
        # A client finds it by PID.
        self.assertEqual(client.request(t.pid, "hello")["socket"], path)

    def test_no_runtime_dir_uses_the_fallback(self) -> None:
        with Target(uid=AGENT_UID, env={"XDG_RUNTIME_DIR": None}) as t:
            self.assert_fallback(t, t.start_agent())

    def test_an_unwritable_runtime_dir_uses_the_fallback(self) -> None:
        os.chown(self.runtime, 0, 0)
        os.chmod(self.runtime, 0o755)
        with self.agent(self.runtime) as t:
            self.assert_fallback(t, t.start_agent())
            self.assertFalse(os.path.exists(os.path.join(self.runtime, "vramctl")))

    def test_a_socket_directory_owned_by_someone_else_is_not_used(self) -> None:
        squatted = os.path.join(self.runtime, "vramctl")
        os.mkdir(squatted, 0o777)
        os.chown(squatted, OTHER_UID, OTHER_UID)
        with self.agent(self.runtime) as t:
            self.assert_fallback(t, t.start_agent())
            self.assertEqual(os.listdir(squatted), [])

    def test_a_symlinked_socket_directory_is_not_used(self) -> None:
        elsewhere = tempfile.mkdtemp(prefix="vramctl-test-elsewhere-")
        os.chown(elsewhere, AGENT_UID, AGENT_UID)
        try:
            os.symlink(elsewhere, os.path.join(self.runtime, "vramctl"))
            with self.agent(self.runtime) as t:
                self.assert_fallback(t, t.start_agent())
                self.assertEqual(os.listdir(elsewhere), [])
        finally:
            shutil.rmtree(elsewhere, ignore_errors=True)

    def test_our_own_directory_with_a_loose_mode_is_made_private(self) -> None:
        own = os.path.join(self.runtime, "vramctl")
        os.mkdir(own)
        os.chmod(own, 0o755)
        os.chown(own, AGENT_UID, AGENT_UID)
        with self.agent(self.runtime) as t:
            path = t.start_agent()
            self.assertEqual(os.path.dirname(path), own)
            self.assertEqual(stat.S_IMODE(os.stat(own).st_mode), 0o700)

    def test_a_runtime_dir_too_long_for_a_socket_path_uses_the_fallback(self) -> None:
        deep = os.path.join(self.runtime, "d" * 60, "e" * 60)
        os.makedirs(deep)
        for d in (os.path.dirname(deep), deep):
            os.chown(d, AGENT_UID, AGENT_UID)
        with self.agent(deep) as t:
            self.assert_fallback(t, t.start_agent())

    def test_a_full_runtime_filesystem_uses_the_fallback(self) -> None:
        mount = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size=64k,nr_inodes=8,mode=0700,uid={AGENT_UID},gid={AGENT_UID}", "tmpfs", self.runtime],
            capture_output=True,
        )
        if mount.returncode != 0:
            self.skipTest(f"cannot mount a tmpfs here: {mount.stderr.decode().strip()}")
        try:
            own = os.path.join(self.runtime, "vramctl")
            os.mkdir(own, 0o700)
            os.chown(own, AGENT_UID, AGENT_UID)
            filled = 0
            while True:  # use up every inode: bind() then fails with ENOSPC
                try:
                    open(os.path.join(own, f"filler-{filled}"), "w").close()
                except OSError as err:
                    self.assertEqual(err.errno, errno.ENOSPC)
                    break
                filled += 1
            with self.agent(self.runtime) as t:
                path = t.start_agent()
                self.assert_fallback(t, path)
                self.assertEqual([n for n in os.listdir(own) if not n.startswith("filler-")], [])
        finally:
            subprocess.run(["umount", self.runtime], check=True)

    def test_a_squatted_fallback_directory_moves_the_agent_to_a_fresh_private_one(self) -> None:
        # XDG_RUNTIME_DIR unset and someone else made /tmp/vramctl-<uid>: that once stopped
        # the agent from starting at all.
        os.mkdir(self.fallback)
        os.chmod(self.fallback, 0o777)
        os.chown(self.fallback, OTHER_UID, OTHER_UID)
        with Target(uid=AGENT_UID, env={"XDG_RUNTIME_DIR": None}) as t:
            # The squatter also makes a look-alike of the fresh directory, sorting first,
            # with a socket at the agent's name: clients must pass it over.
            decoy = f"{self.fallback}.000decoy"
            with PlantedSocket(OTHER_UID, os.path.join(decoy, f"agent-{t.pid}.sock"), forged_hello(t.pid), make_dir=True) as planted:
                path = t.start_agent()
                fresh = os.path.dirname(path)
                self.assertTrue(fresh.startswith(f"{self.fallback}."), path)
                self.assertNotEqual(fresh, decoy)
                self.assertEqual(os.path.basename(path), f"agent-{t.pid}.sock")
                info = os.lstat(fresh)
                self.assertTrue(stat.S_ISDIR(info.st_mode))
                self.assertEqual((info.st_uid, stat.S_IMODE(info.st_mode)), (AGENT_UID, 0o700))
                # Said on stderr (no logging configured in the target), with why.
                self.assertIn(f"'{self.fallback}' belongs to uid {OTHER_UID}, not {AGENT_UID}", t.stderr())
                self.assertIn(f"using a fresh private directory '{fresh}' instead", t.stderr())
                # Clients find it by PID: root, and the process's own user.
                self.assertEqual(client.request(t.pid, "hello")["socket"], path)
                own = client_command_as(AGENT_UID, str(t.pid), "hello")
                self.assertEqual(own.returncode, 0, own.stderr)
                self.assertEqual(json.loads(own.stdout)["socket"], path)
                listed = {a["path"]: a["state"] for a in client.list_agents(uid=AGENT_UID)}
                self.assertEqual(listed[path], "live")
                self.assertEqual(listed[os.path.join(decoy, f"agent-{t.pid}.sock")], "untrusted")
                self.assertEqual(planted.requests(), [])
            self.assertEqual(os.listdir(self.fallback), [])
            self.assertEqual(t.finish(), 0)
            self.assertFalse(os.path.exists(fresh))  # removed with the socket at exit

    def test_no_usable_directory_is_an_error_that_says_why_for_each(self) -> None:
        os.chown(self.runtime, 0, 0)
        os.chmod(self.runtime, 0o755)
        os.mkdir(self.fallback, 0o700)
        os.chown(self.fallback, OTHER_UID, OTHER_UID)
        with self.agent(self.runtime) as t:
            # Where even a fresh directory cannot be made.
            t.run("import vramctl_agent._paths as p\np.FALLBACK_BASE = '/nonexistent'")
            with self.assertRaises(TargetFailed) as failed:
                t.start_agent()
            message = str(failed.exception)
            self.assertIn("AgentError: no usable socket directory", message)
            self.assertIn(f"cannot create '{self.runtime}/vramctl'", message)
            self.assertIn(f"'{self.fallback}' belongs to uid {OTHER_UID}, not {AGENT_UID}", message)
            self.assertIn("cannot create a fresh private directory in '/nonexistent'", message)


class WithoutRootTest(unittest.TestCase):
    @unittest.skipIf(is_root(), "covered by PeerTest as root")
    def test_the_socket_is_private(self) -> None:
        with Target() as t:
            path = t.start_agent()
            self.assertEqual(stat.S_IMODE(os.lstat(path).st_mode), 0o600)


if __name__ == "__main__":
    unittest.main()
