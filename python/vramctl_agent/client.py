"""A small client of the agent's protocol (docs/agent.md), for debugging, scripts and tests.

    python3 -m vramctl_agent.client PID hello
    python3 -m vramctl_agent.client PID stats
    python3 -m vramctl_agent.client PID reclaim [--gc] [--deep] [--dry-run]
    python3 -m vramctl_agent.client PID snapshot --path /abs/file.pickle [--overwrite]
    python3 -m vramctl_agent.client PID snapshot --record start [--max-entries N] [--stacks python|all]
    python3 -m vramctl_agent.client PID snapshot --record stop
    python3 -m vramctl_agent.client PID reset-peak
    python3 -m vramctl_agent.client PID hello --socket PATH   # PID 0: a socket of our own user
    python3 -m vramctl_agent.client list [--clean] [--all-users]

Prints the agent's answer as JSON. Exit status: 0 answered ok, 1 the agent answered with an
error, 2 usage error or no answer (no agent, a stale socket (removed), a timeout, refused,
or a socket that is not provably the process's agent: WrongPeer, never asked).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import stat
import struct
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


class WrongPeer(ClientError):
    """A socket that is not provably the agent asked for: in a directory someone else could
    have made or may write, owned by someone else, or served by another user or process.
    Never talked to: what it would answer could be forged."""

    code = "wrong_peer"


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
    """The effective uid of `pid` (`Uid:` of /proc/PID/status, readable by anyone; the owner
    of /proc/PID is root for a process that is not dumpable), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
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
    /run/user/<uid>, the fallback /tmp/vramctl-<uid>, and the fresh private directories
    /tmp/vramctl-<uid>.XXXXXXXX that `uid` owns (where an agent goes when someone else made
    /tmp/vramctl-<uid>)."""
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
    dirs.extend(_paths.fallback_dirs(uid))
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


def untrusted_socket_reason(path: str, uid: int) -> str | None:
    """Why the socket file at `path` cannot be believed to be an agent of `uid`, or None:
    its directory must pass _paths.untrusted_reason, and the file itself (never followed)
    must be a socket owned by `uid` or root. A missing file is not judged here (connect
    says NoAgent)."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.lexists(directory):
        return None
    reason = _paths.untrusted_reason(directory, uid)
    if reason is not None:
        return reason
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot stat '{path}': {err.strerror}"
    if not stat.S_ISSOCK(info.st_mode):
        return f"'{path}' is not a socket" + (" (a symlink)" if stat.S_ISLNK(info.st_mode) else "")
    if info.st_uid not in (uid, 0):
        return f"'{path}' belongs to uid {info.st_uid}, not {uid}"
    return None


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel recorded them when it
    listened (struct ucred of SO_PEERCRED)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return pid, uid, gid


class Connection:
    """One connection; requests on it are answered in order.

    Before a byte is sent, the socket must be shown to belong to `expect_uid` (default: our
    own euid) or root — its directory, the file and, from the kernel, the process serving
    it — and, when `expect_pid` is given, to be served by that process (when the kernel can
    say: 0 means another PID namespace). Anything else is WrongPeer: a socket another user
    planted in /tmp/vramctl-<uid> is never asked."""

    def __init__(self, path: str, timeout_s: float = 5.0, expect_uid: int | None = None, expect_pid: int | None = None) -> None:
        self.path = path
        self._buffer = bytearray()
        uid = os.geteuid() if expect_uid is None else expect_uid
        reason = untrusted_socket_reason(path, uid)
        if reason is not None:
            raise WrongPeer(f"not talking to '{path}': {reason}")
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout_s)
        try:
            self._socket.connect(path)
        except BaseException as err:
            self._socket.close()
            raise _connect_error(path, err) from None
        try:
            peer_pid, peer_uid, _ = peer_credentials(self._socket)
        except OSError as err:
            self._socket.close()
            raise WrongPeer(f"not talking to '{path}': the kernel does not say who serves it ({err.strerror or err})") from None
        if peer_uid not in (uid, 0):
            self._socket.close()
            raise WrongPeer(f"not talking to '{path}': it is served by uid {peer_uid}, not {uid}")
        if expect_pid is not None and peer_pid not in (0, expect_pid):
            self._socket.close()
            raise WrongPeer(f"not talking to '{path}': it is served by process {peer_pid}, not {expect_pid}")

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


def connect(target: int | str, timeout_s: float = 5.0, uid: int | None = None, pid: int | None = None) -> Connection:
    """A connection to the agent of a PID (found as candidate_dirs says; stale sockets met on
    the way are removed) or at a socket path.

    The agent must be the process's user's (`uid`, default: the process's effective uid, ours
    when it is gone) or root's, and served by that process (Connection). For a path, `pid`
    names the process when known; without it the socket must be ours or root's. Sockets that
    fail the checks are passed over (another may be the real one) and reported as WrongPeer
    when no other answers."""
    if isinstance(target, str):
        expect_uid = uid if uid is not None else (_owner_of(pid) if pid is not None else None)
        return Connection(target, timeout_s, expect_uid=expect_uid, expect_pid=pid)
    if uid is None:
        uid = _owner_of(target)
        if uid is None:
            uid = os.geteuid()
    paths = socket_paths(target, uid)
    if not paths:
        raise NoAgent(
            f"no agent socket for pid {target} (looked in {', '.join(repr(d) for d in candidate_dirs(target, uid))}); "
            "start one in the process with vramctl_agent.start(), %load_ext vramctl_agent or VRAMCTL_AGENT=1"
        )
    stale: StaleAgent | None = None
    refused: list[str] = []
    for path in paths:
        try:
            return Connection(path, timeout_s, expect_uid=uid, expect_pid=target)
        except StaleAgent as err:
            stale = stale or err
        except WrongPeer as err:
            refused.append(str(err))
    if stale is not None:
        raise stale
    raise WrongPeer(f"no agent of pid {target} (uid {uid}) that can be believed: " + "; ".join(refused))


def request(target: int | str, op: str, timeout_s: float | None = None, check: bool = True, pid: int | None = None, **fields) -> dict:
    """One request on a new connection (`pid`: the process a socket path belongs to)."""
    budget = timeout_s if timeout_s is not None else proto.CLIENT_TIMEOUT_S.get(op, 5.0)
    with connect(target, timeout_s=min(budget, 5.0), pid=pid) as conn:
        return conn.request(op, timeout_s=budget, check=check, **fields)


def _uid_of_tmp_name(name: str) -> int | None:
    """The uid in `vramctl-<uid>` or `vramctl-<uid>.XXXXXXXX`, or None for another name."""
    if not name.startswith("vramctl-"):
        return None
    digits = name[len("vramctl-") :].split(".", 1)[0]
    return int(digits) if digits.isdigit() else None


def list_agents(uid: int | None = None, all_users: bool = False, clean: bool = False) -> list[dict]:
    """The agent sockets in the socket directories of `uid` (default: ours), or of every user
    (root), each with its state: live, stale, removed (stale, and `clean` removed it), or
    untrusted (in a directory or a file that is not the user's: never probed nor removed,
    `reason` says why)."""
    dirs: list[tuple[str, int]] = []  # (directory, the uid whose it must be)
    if all_users:
        if os.environ.get("XDG_RUNTIME_DIR"):
            dirs.append((os.path.join(os.environ["XDG_RUNTIME_DIR"], "vramctl"), os.geteuid()))
        try:
            dirs.extend((os.path.join("/run/user", e, "vramctl"), int(e)) for e in sorted(os.listdir("/run/user")) if e.isdigit())
        except OSError:
            pass
        try:
            for entry in sorted(os.listdir("/tmp")):
                owner = _uid_of_tmp_name(entry)
                if owner is not None:
                    dirs.append((os.path.join("/tmp", entry), owner))
        except OSError:
            pass
    else:
        uid = uid if uid is not None else os.geteuid()
        # With the look-alikes of the fresh private directories that are not the user's, so
        # that a squatter's shows (as untrusted).
        looked = candidate_dirs(None, uid)
        looked += [d for d in _paths.fallback_dirs(uid, trusted_only=False) if d not in looked]
        dirs = [(d, uid) for d in looked]
    out, seen = [], set()
    for directory, owner in dirs:
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
            entry = {"path": path, "pid": pid, "uid": owner}
            reason = untrusted_socket_reason(path, owner)
            if reason is not None:
                entry.update(state="untrusted", reason=reason)
            else:
                state = _paths.probe(path)
                if state == "stale" and clean and _paths.remove_if_stale(path):
                    state = "removed"
                entry["state"] = state
            entry["pid_exists"] = os.path.exists(f"/proc/{pid}")
            out.append(entry)
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
    # With --socket, a PID (not 0) says whose agent it must be; without, it must be ours or root's.
    pid = int(args.target) if args.socket and args.target.isdigit() and int(args.target) > 0 else None
    try:
        answer = request(target, args.op, timeout_s=args.timeout, check=False, pid=pid, **fields)
    except ClientError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(answer, indent=2))
    return 0 if answer["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
