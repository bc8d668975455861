"""A small client of the agent's protocol (docs/agent.md), for debugging, scripts and tests.

    python3 -m vramctl_agent.client PID hello
    python3 -m vramctl_agent.client PID stats
    python3 -m vramctl_agent.client PID reclaim [--gc] [--deep] [--dry-run]
    python3 -m vramctl_agent.client PID snapshot --path /abs/file.pickle [--overwrite]
    python3 -m vramctl_agent.client PID snapshot --record start [--max-entries N] [--stacks python|all]
    python3 -m vramctl_agent.client PID snapshot --record stop
    python3 -m vramctl_agent.client PID reset-peak
    python3 -m vramctl_agent.client list [--clean] [--all-users]

Prints the agent's answer as JSON. Exit status: 0 answered ok, 1 the agent answered with an
error, 2 usage error or no answer (no agent, a stale socket (removed), a timeout, refused).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import sys
import time

from . import _paths
from . import _protocol as proto

# A client reads at most this much for one answer: the agent's limit, with room for an agent
# of a later version that raised it.
MAX_ANSWER_BYTES = 4 * proto.MAX_RESPONSE_BYTES


class ClientError(Exception):
    code = "client_error"


class NoAgent(ClientError):
    code = "no_agent"


class StaleAgent(ClientError):
    """A socket file nobody listens on: its process died without removing it."""

    code = "stale"

    def __init__(self, message: str, path: str, removed: bool) -> None:
        super().__init__(message)
        self.path, self.removed = path, removed


class AgentTimeout(ClientError):
    code = "timeout"


class AccessDenied(ClientError):
    code = "permission_denied"


class BadAnswer(ClientError):
    code = "bad_answer"


class AgentRefused(ClientError):
    """The agent answered `ok: false`; `.answer` is the whole answer, `.code` its error code."""

    def __init__(self, answer: dict) -> None:
        error = answer.get("error") if isinstance(answer.get("error"), dict) else {}
        super().__init__(f"the agent answered {error.get('code', '?')}: {error.get('message', '')}")
        self.answer = answer
        self.code = str(error.get("code", "unknown"))


# --- finding an agent ------------------------------------------------------------------


def _owner_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _runtime_dir_of(pid: int) -> str | None:
    """XDG_RUNTIME_DIR from the process's initial environment (readable by its owner and
    root only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            for entry in environ.read().split(b"\0"):
                if entry.startswith(b"XDG_RUNTIME_DIR="):
                    return os.fsdecode(entry.split(b"=", 1)[1])
    except OSError:
        return None
    return None


def candidate_dirs(pid: int | None = None, uid: int | None = None) -> list[str]:
    """Where the agent of `pid` (owned by `uid`) may have put its socket, most likely first:
    the process's own XDG_RUNTIME_DIR, ours if we are its user, the systemd default
    /run/user/<uid>, and the fallback /tmp/vramctl-<uid>."""
    if uid is None:
        uid = _owner_of(pid) if pid is not None else None
        if uid is None:
            uid = os.geteuid()
    dirs = []
    runtime = _runtime_dir_of(pid) if pid is not None else None
    if runtime and os.path.isabs(runtime):
        dirs.append(os.path.join(runtime, "vramctl"))
    if uid == os.geteuid():
        dirs.extend(_paths.candidate_dirs(uid)[:-1])
    dirs.append(f"/run/user/{uid}/vramctl")
    dirs.append(f"/tmp/vramctl-{uid}")
    seen, out = set(), []
    for directory in dirs:
        if directory not in seen:
            seen.add(directory)
            out.append(directory)
    return out


def socket_paths(pid: int, uid: int | None = None) -> list[str]:
    """The candidate socket paths of `pid` that exist."""
    out = []
    for directory in candidate_dirs(pid, uid):
        path = os.path.join(directory, _paths.socket_name(pid))
        try:
            os.lstat(path)
        except OSError:
            continue
        out.append(path)
    return out


# --- talking ---------------------------------------------------------------------------


class Connection:
    """One connection; requests on it are answered in order."""

    def __init__(self, path: str, timeout_s: float = 5.0) -> None:
        self.path = path
        self._buffer = bytearray()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout_s)
        try:
            self._socket.connect(path)
        except BaseException as err:
            self._socket.close()
            raise _connect_error(path, err) from None

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._socket.close()

    def request(self, op: str, timeout_s: float | None = None, check: bool = True, **fields) -> dict:
        """Sends {"op": op, **fields} and returns the answer; raises AgentRefused for an
        `ok: false` answer when `check`."""
        return self.exchange({"op": op, **fields}, timeout_s=timeout_s, check=check)

    def exchange(self, request: object, timeout_s: float | None = None, check: bool = True) -> dict:
        if timeout_s is None:
            op = request.get("op") if isinstance(request, dict) else None
            timeout_s = proto.CLIENT_TIMEOUT_S.get(op, 5.0) if isinstance(op, str) else 5.0
        line = request if isinstance(request, bytes) else proto.encode_line(request)
        deadline = time.monotonic() + timeout_s
        try:
            self._socket.settimeout(timeout_s)
            self._socket.sendall(line)
        except socket.timeout:
            raise AgentTimeout(f"the agent at '{self.path}' did not take the request within {timeout_s:g} s") from None
        except (BrokenPipeError, ConnectionResetError):
            # The agent may have answered before reading (busy, permission denied) and
            # closed: that answer is what to report.
            pass
        except OSError as err:
            raise ClientError(f"cannot send to the agent at '{self.path}': {err.strerror or err}") from None
        answer = self._read_answer(deadline, timeout_s)
        if check and not answer["ok"]:
            raise AgentRefused(answer)
        return answer

    def _read_answer(self, deadline: float, timeout_s: float) -> dict:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                return _check_answer(line, self.path)
            if len(self._buffer) > MAX_ANSWER_BYTES:
                raise BadAnswer(f"the agent at '{self.path}' sent more than {MAX_ANSWER_BYTES} bytes without a newline")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AgentTimeout(f"the agent at '{self.path}' did not answer within {timeout_s:g} s")
            self._socket.settimeout(remaining)
            try:
                chunk = self._socket.recv(65536)
            except socket.timeout:
                raise AgentTimeout(f"the agent at '{self.path}' did not answer within {timeout_s:g} s") from None
            except OSError as err:
                raise ClientError(f"lost the agent at '{self.path}': {err.strerror or err}") from None
            if not chunk:
                if self._buffer:
                    raise BadAnswer(f"the agent at '{self.path}' closed the connection in the middle of an answer")
                raise ClientError(f"the agent at '{self.path}' closed the connection without answering")
            self._buffer += chunk


def _connect_error(path: str, err: BaseException) -> ClientError:
    if isinstance(err, socket.timeout):
        return AgentTimeout(f"the agent at '{path}' did not accept a connection in time")
    if isinstance(err, OSError):
        if err.errno == errno.ENOENT:
            return NoAgent(f"no agent socket at '{path}'")
        if err.errno == errno.ECONNREFUSED:
            removed = _paths.remove_if_stale(path)
            return StaleAgent(
                f"'{path}' is a stale agent socket (nobody listens: its process ended without removing it)"
                + ("; removed it" if removed else ""),
                path,
                removed,
            )
        if err.errno in (errno.EACCES, errno.EPERM):
            return AccessDenied(f"may not connect to '{path}': only the process's user and root may")
        if err.errno == errno.EAGAIN:
            return AgentTimeout(f"the agent at '{path}' has a full backlog; retry")
        return ClientError(f"cannot connect to '{path}': {err.strerror or err}")
    return ClientError(f"cannot connect to '{path}': {err}")


def _check_answer(line: bytes, path: str) -> dict:
    try:
        answer = proto.decode_line(line)
    except proto.ProtocolViolation as err:
        raise BadAnswer(f"the agent at '{path}' sent a malformed answer: {err.message}") from None
    if not isinstance(answer, dict):
        raise BadAnswer(f"the agent at '{path}' answered with a JSON {type(answer).__name__}, not an object")
    if not isinstance(answer.get("ok"), bool):
        raise BadAnswer(f"the agent at '{path}' answered without 'ok'")
    version = answer.get("protocol")
    if isinstance(version, bool) or not isinstance(version, int):
        raise BadAnswer(f"the agent at '{path}' answered without 'protocol'")
    if not answer["ok"] and not isinstance(answer.get("error"), dict):
        raise BadAnswer(f"the agent at '{path}' answered ok: false without 'error'")
    return answer


def connect(target: int | str, timeout_s: float = 5.0, uid: int | None = None) -> Connection:
    """A connection to the agent of a PID (found as candidate_dirs says; stale sockets met on
    the way are removed) or at a socket path."""
    if isinstance(target, str):
        return Connection(target, timeout_s)
    paths = socket_paths(target, uid)
    if not paths:
        raise NoAgent(
            f"no agent socket for pid {target} (looked in {', '.join(repr(d) for d in candidate_dirs(target, uid))}); "
            "start one in the process with vramctl_agent.start(), %load_ext vramctl_agent or VRAMCTL_AGENT=1"
        )
    last: ClientError | None = None
    for path in paths:
        try:
            return Connection(path, timeout_s)
        except StaleAgent as err:
            last = err
    assert last is not None
    raise last


def request(target: int | str, op: str, timeout_s: float | None = None, check: bool = True, **fields) -> dict:
    """One request on a new connection."""
    budget = timeout_s if timeout_s is not None else proto.CLIENT_TIMEOUT_S.get(op, 5.0)
    with connect(target, timeout_s=min(budget, 5.0)) as conn:
        return conn.request(op, timeout_s=budget, check=check, **fields)


def list_agents(uid: int | None = None, all_users: bool = False, clean: bool = False) -> list[dict]:
    """The agent sockets in the socket directories of `uid` (default: ours), or of every user
    (root), each with its state: live, stale, or removed (stale, and `clean` removed it)."""
    if all_users:
        dirs = []
        for base in ("/run/user",):
            try:
                dirs.extend(os.path.join(base, entry, "vramctl") for entry in sorted(os.listdir(base)))
            except OSError:
                pass
        try:
            dirs.extend(os.path.join("/tmp", e) for e in sorted(os.listdir("/tmp")) if e.startswith("vramctl-"))
        except OSError:
            pass
        if os.environ.get("XDG_RUNTIME_DIR"):
            dirs.insert(0, os.path.join(os.environ["XDG_RUNTIME_DIR"], "vramctl"))
    else:
        dirs = candidate_dirs(None, uid if uid is not None else os.geteuid())
    out, seen = [], set()
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            pid = _paths.pid_of_socket_name(name)
            path = os.path.join(directory, name)
            if pid is None or path in seen:
                continue
            seen.add(path)
            state = _paths.probe(path)
            if state == "stale" and clean and _paths.remove_if_stale(path):
                state = "removed"
            out.append({"path": path, "pid": pid, "state": state, "pid_exists": os.path.exists(f"/proc/{pid}")})
    return out


# --- command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m vramctl_agent.client",
        description="Talk to a vramctl agent (docs/agent.md).",
    )
    parser.add_argument("target", help="the PID of a process with an agent, or 'list'")
    parser.add_argument("op", nargs="?", choices=list(proto.OPS), help="the request")
    parser.add_argument("--socket", help="the socket path (instead of finding it by PID)")
    parser.add_argument("--timeout", type=float, help="seconds for the whole exchange (default per op)")
    parser.add_argument("--gc", action="store_true", help="reclaim: gc.collect() first")
    parser.add_argument("--deep", action="store_true", help="reclaim: drop the last exception and IPython's output cache")
    parser.add_argument("--dry-run", action="store_true", help="reclaim: say what would be released, change nothing")
    parser.add_argument("--path", help="snapshot: write the allocator snapshot to this absolute path")
    parser.add_argument("--overwrite", action="store_true", help="snapshot: replace an existing file")
    parser.add_argument("--record", choices=["start", "stop"], help="snapshot: start or stop recording history")
    parser.add_argument("--max-entries", type=int, help="snapshot --record start: the history's bound")
    parser.add_argument("--stacks", choices=["python", "all"], help="snapshot --record start: which stacks")
    parser.add_argument("--clean", action="store_true", help="list: remove stale sockets")
    parser.add_argument("--all-users", action="store_true", help="list: every user's directories (root)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    prog = parser.prog
    if args.target == "list":
        print(json.dumps(list_agents(all_users=args.all_users, clean=args.clean), indent=2))
        return 0
    if not args.target.isdigit() and not args.socket:
        parser.error(f"the target must be a PID or 'list', not '{args.target}'")
    if args.op is None:
        parser.error("which request? one of " + ", ".join(proto.OPS))
    fields: dict = {}
    if args.op == "reclaim":
        fields = {"gc": args.gc, "deep": args.deep, "dry_run": args.dry_run}
    elif args.op == "snapshot":
        for name in ("path", "record", "max_entries", "stacks"):
            value = getattr(args, name)
            if value is not None:
                fields[name] = value
        if args.overwrite:
            fields["overwrite"] = True
    target: int | str = args.socket if args.socket else int(args.target)
    try:
        answer = request(target, args.op, timeout_s=args.timeout, check=False, **fields)
    except ClientError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(answer, indent=2))
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
