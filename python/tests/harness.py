"""Test helpers: a real Python interpreter running the agent (the "target"), steered line by
line over its stdin, with the stand-in frameworks of tests/fakes on its path.

    with Target() as t:                      # a child interpreter, its own XDG_RUNTIME_DIR
        path = t.start_agent()
        t.run("import torch; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')")
        answer = client.request(path, "stats")
"""

from __future__ import annotations

import json
import os
import random
import select
import socket
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

TESTS = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS)
FAKES = os.path.join(TESTS, "fakes")
TARGET = os.path.join(TESTS, "target.py")
sys.path.insert(0, PYTHON_DIR)

from vramctl_agent import client  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20

# Unprivileged identities for the tests that need another user (run as root): drawn per
# test run from a range no real account uses, so that their fallback directories
# (/tmp/vramctl-<uid>) belong to this run alone, even beside another run of the suite.
# (Below 65536: a container's user namespace often maps no more.)
AGENT_UID = random.SystemRandom().randrange(40000, 65000, 2)
OTHER_UID = AGENT_UID + 1


def is_root() -> bool:
    return os.geteuid() == 0


def fake_path(*names: str) -> list[str]:
    return [os.path.join(FAKES, f"{name}_pkg") for name in names]


class TargetFailed(AssertionError):
    pass


# Signals a target starts with at their default action whatever the test run inherited: a
# suite started under `nohup` (SIGHUP ignored) or from a script's background job (SIGINT
# ignored) would otherwise hand that to every target, and the agent rightly leaves an
# ignored signal alone. A test that wants one ignored says so (Target(ignore_signals=...)).
DEFAULT_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


class Target:
    """A child interpreter that runs code sent to it and answers with JSON lines.

    With `uid` it runs as that user, from a copy of the agent package, the fakes and
    target.py that every user can read (the checkout may sit in a 0700 home directory), and
    with an interpreter that user may run (python_for_uid) unless `python` is given."""

    def __init__(
        self,
        fakes: tuple = ("torch",),
        env: dict | None = None,
        uid: int | None = None,
        runtime_dir: str | None = None,
        python: str | None = None,
        pythonpath: list[str] | None = None,
        args: list[str] | None = None,
        ignore_signals: tuple = (),
    ) -> None:
        self._own_runtime = runtime_dir is None
        self._copy: str | None = None
        self.proc = None
        self.runtime_dir = runtime_dir if runtime_dir is not None else tempfile.mkdtemp(prefix="vramctl-test-run-")
        if self._own_runtime and uid is not None:
            os.chown(self.runtime_dir, uid, uid)
        self.stderr_file = tempfile.TemporaryFile()
        target = TARGET
        if uid is not None:
            if python is None:
                python = python_for_uid(uid)
                if python is None:
                    self._cleanup()
                    raise unittest.SkipTest(f"no interpreter that uid {uid} may run")
            self._copy, copied_path = world_readable_copy(*fakes)
            target = os.path.join(self._copy, "target.py")
            if pythonpath is None:
                pythonpath = copied_path
        path = list(pythonpath) if pythonpath is not None else [PYTHON_DIR] + fake_path(*fakes)
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/",
            "PYTHONPATH": os.pathsep.join(path),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONNOUSERSITE": "1",
            "XDG_RUNTIME_DIR": self.runtime_dir,
        }
        environment.update(env or {})
        environment = {k: v for k, v in environment.items() if v is not None}

        def preexec() -> None:
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_IGN if sig in ignore_signals else signal.SIG_DFL)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        self.proc = subprocess.Popen(
            [python or sys.executable, *(args or []), target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            env=environment,
            preexec_fn=preexec,
            cwd="/",
        )
        self.pid = self.proc.pid
        try:
            hello = self._read(timeout_s=20)
            if not hello.get("ready"):
                raise TargetFailed(f"the target did not start: {hello} {self.stderr()}")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def _read(self, timeout_s: float) -> dict:
        stdout = self.proc.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], timeout_s)
        if not ready:
            raise TargetFailed(f"the target did not answer within {timeout_s} s; stderr: {self.stderr()}")
        line = stdout.readline()
        if not line:
            raise TargetFailed(f"the target exited ({self.proc.poll()}); stderr: {self.stderr()}")
        return json.loads(line)

    def run(self, code: str = "", expr: str | None = None, timeout_s: float = 20, check: bool = True):
        """Executes `code` in the target's namespace and returns `expr`'s value."""
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write((json.dumps({"exec": code, "eval": expr}) + "\n").encode())
        stdin.flush()
        answer = self._read(timeout_s)
        if check and not answer["ok"]:
            raise TargetFailed(f"the target failed: {answer['error']}\n{answer.get('traceback', '')}")
        return answer.get("value") if answer["ok"] else answer

    def start_agent(self, **kwargs) -> str:
        return self.run(f"import vramctl_agent\npath = vramctl_agent.start(**{kwargs!r})", "path")

    def stderr(self) -> str:
        self.stderr_file.seek(0)
        return self.stderr_file.read().decode(errors="replace")

    def finish(self, timeout_s: float = 20) -> int:
        """Closes stdin (the target exits normally, running atexit) and waits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout_s)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(20)

    def __enter__(self) -> "Target":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(20)
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
        self._cleanup()

    def _cleanup(self) -> None:
        self.stderr_file.close()
        if self._own_runtime:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def world_readable_copy(*fakes: str) -> tuple[str, list[str]]:
    """The package and fakes copied to a directory every user can read (the checkout may sit
    under a private home), for targets that run as another user. Returns (dir, pythonpath)."""
    base = tempfile.mkdtemp(prefix="vramctl-test-pkg-")
    os.chmod(base, 0o755)
    shutil.copytree(os.path.join(PYTHON_DIR, "vramctl_agent"), os.path.join(base, "vramctl_agent"), ignore=shutil.ignore_patterns("__pycache__"))
    paths = [base]
    for name in fakes:
        destination = os.path.join(base, f"{name}_pkg")
        shutil.copytree(os.path.join(FAKES, f"{name}_pkg"), destination, ignore=shutil.ignore_patterns("__pycache__"))
        paths.append(destination)
    shutil.copy(TARGET, os.path.join(base, "target.py"))
    for root, dirs, files in os.walk(base):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)
    return base, paths


_python_for_uid: dict[int, str | None] = {}


def python_for_uid(uid: int) -> str | None:
    """An interpreter that `uid` can run: ours, unless it lives under a private directory
    (pyenv under /root), else the system's."""
    if uid in _python_for_uid:
        return _python_for_uid[uid]
    found = None
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if not os.path.exists(candidate):
            continue

        def preexec() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        try:
            done = subprocess.run([candidate, "-c", "import sys; assert sys.version_info >= (3, 8)"], preexec_fn=preexec, cwd="/", capture_output=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            found = candidate
            break
    _python_for_uid[uid] = found
    return found


def needs_root(test):
    return unittest.skipUnless(is_root(), "needs root (to act as other users); CI runs as root")(test)


class PlantedSocket:
    """A listening socket bound and served by a forked child running as `uid` (an attacker),
    which answers every connection with `reply` and reports over a pipe whatever it was
    sent. With `make_dir`, the child first creates the socket's directory (mode 0777), as a
    squatter in /tmp would."""

    def __init__(self, uid: int, path: str, reply: bytes, make_dir: bool = False) -> None:
        self.path = path
        read_end, write_end = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into unittest
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                if make_dir:
                    os.mkdir(os.path.dirname(path))
                    os.chmod(os.path.dirname(path), 0o777)
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                listener.bind(path)
                os.chmod(path, 0o777)
                listener.listen(8)
                os.write(write_end, b"ready\n")
                while True:
                    conn, _ = listener.accept()
                    conn.settimeout(2)
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if data:
                        os.write(write_end, b"request " + data.replace(b"\n", b" ") + b"\n")
                    try:
                        conn.sendall(reply)
                    except OSError:
                        pass
                    conn.close()
            except BaseException as err:  # noqa: B902 - report to the parent
                os.write(write_end, f"error {err!r}\n".encode())
            finally:
                os._exit(0)
        os.close(write_end)
        self._pipe = os.fdopen(read_end, "rb")
        ready, _, _ = select.select([self._pipe], [], [], 10)
        line = self._pipe.readline() if ready else b""
        if line != b"ready\n":
            self.close()
            raise AssertionError(f"the planted socket did not start: {line!r}")

    def requests(self) -> list[bytes]:
        """What clients sent it so far."""
        out = []
        while select.select([self._pipe], [], [], 0.2)[0]:
            line = self._pipe.readline()
            if not line:
                break
            out.append(line.rstrip(b"\n"))
        return out

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass

    def __enter__(self) -> "PlantedSocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self._pipe.close()


class another_user:
    """A user created for one test (useradd) and removed after it (userdel); its uid is
    `.uid`. Skips the test, saying why on stderr, when not root or useradd fails."""

    def __init__(self) -> None:
        self.name = f"vramctl-t{random.SystemRandom().randrange(16**6):06x}"
        self.uid = -1

    def __enter__(self) -> "another_user":
        import pwd

        if not is_root():
            print(f"\nskipped: creating a user needs root (uid {os.geteuid()})", file=sys.stderr)
            raise unittest.SkipTest("creating a user needs root")
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", self.name],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(f"\nskipped: useradd {self.name} failed: {done.stderr.strip()}", file=sys.stderr)
            raise unittest.SkipTest(f"useradd failed: {done.stderr.strip()}")
        self.uid = pwd.getpwnam(self.name).pw_uid
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["userdel", self.name], capture_output=True)
