"""Where an agent's socket lives, and how anyone tells a live one from a stale one.

`$XDG_RUNTIME_DIR/vramctl/agent-<pid>.sock`, else `/tmp/vramctl-<uid>/agent-<pid>.sock`,
else (both unusable: someone else made `/tmp/vramctl-<uid>`) a fresh private directory
`/tmp/vramctl-<uid>.XXXXXXXX/agent-<pid>.sock` (docs/agent.md, "Where the socket is"). The
directory is the security boundary: it must be a real directory (not a symlink) owned by the
agent's user with mode 0700, or it is not used — and a client believes only a directory that
its user (or root) owns and nobody else may write (`untrusted_reason`).
"""

from __future__ import annotations

import os
import socket
import stat
import tempfile

SOCKET_PREFIX = "agent-"
SOCKET_SUFFIX = ".sock"
# sockaddr_un.sun_path is 108 bytes on Linux, the terminating NUL included.
MAX_SOCKET_PATH_BYTES = 107


class UnusableDir(Exception):
    """A candidate directory that cannot hold the socket, and why (for the log)."""


def socket_name(pid: int) -> str:
    return f"{SOCKET_PREFIX}{pid}{SOCKET_SUFFIX}"


def pid_of_socket_name(name: str) -> int | None:
    if not (name.startswith(SOCKET_PREFIX) and name.endswith(SOCKET_SUFFIX)):
        return None
    digits = name[len(SOCKET_PREFIX) : -len(SOCKET_SUFFIX)]
    return int(digits) if digits.isdigit() else None


def candidate_dirs(uid: int, environ: dict | None = None) -> list[str]:
    """The socket directories of a user, in the order the agent tries them."""
    environ = os.environ if environ is None else environ
    dirs = []
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        dirs.append(os.path.join(runtime, "vramctl"))
    dirs.append(f"/tmp/vramctl-{uid}")
    return dirs


# Where the fresh private directories go: /tmp, as /tmp/vramctl-<uid> (not $TMPDIR: a
# client of another environment, root's, must find them).
FALLBACK_BASE = "/tmp"


def fallback_prefix(uid: int) -> str:
    """The name's start of `uid`'s fresh private directories: `vramctl-<uid>.` (the dot
    keeps uid 10's apart from uid 100's, and from the fixed `/tmp/vramctl-<uid>`)."""
    return f"vramctl-{uid}."


def make_fallback_dir(uid: int, base: str | None = None) -> str:
    """A new directory `<base>/vramctl-<uid>.XXXXXXXX`, mode 0700, that did not exist before
    (mkdir fails on an existing name and mkdtemp draws another): no one can have planted it."""
    return tempfile.mkdtemp(prefix=fallback_prefix(uid), dir=FALLBACK_BASE if base is None else base)


def untrusted_reason(path: str, uid: int) -> str | None:
    """Why a directory cannot be believed to hold `uid`'s agent sockets, or None when it can:
    a real directory (the path's last component is never followed), owned by `uid` or root,
    writable by neither its group nor others. Anything else another user could have made or
    could put a socket into."""
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"cannot stat '{path}': {err.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"'{path}' is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return f"'{path}' is not a directory"
    if info.st_uid not in (uid, 0):
        return f"'{path}' belongs to uid {info.st_uid}, not {uid} (someone else created it)"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"'{path}' may be written by others (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def fallback_dirs(uid: int, base: str | None = None, trusted_only: bool = True) -> list[str]:
    """`uid`'s fresh private directories in `base` that can be believed (untrusted_reason),
    in name order. Another user can make names that look like them, never ones owned by
    `uid`: those are passed over (listed too with `trusted_only=False`, for `list`), so they
    cannot hide the real one."""
    prefix = fallback_prefix(uid)
    base = FALLBACK_BASE if base is None else base
    try:
        with os.scandir(base) as entries:
            names = sorted(e.name for e in entries if e.name.startswith(prefix))
    except OSError:
        return []
    paths = [os.path.join(base, name) for name in names]
    return [p for p in paths if untrusted_reason(p, uid) is None] if trusted_only else paths


def ensure_private_dir(path: str, uid: int) -> None:
    """Creates `path` (mode 0700) or checks an existing one; raises UnusableDir.

    An existing directory must be owned by `uid` and must not be a symlink: someone else's
    directory at our name (a squatter in /tmp) would let them replace our socket. A wrong
    mode on our own directory is repaired, since only the owner could have set it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise UnusableDir(f"cannot create '{path}': {err.strerror}")
    try:
        info = os.lstat(path)
    except OSError as err:
        raise UnusableDir(f"cannot stat '{path}': {err.strerror}")
    if stat.S_ISLNK(info.st_mode):
        raise UnusableDir(f"'{path}' is a symlink")
    if not stat.S_ISDIR(info.st_mode):
        raise UnusableDir(f"'{path}' is not a directory")
    if info.st_uid != uid:
        raise UnusableDir(f"'{path}' belongs to uid {info.st_uid}, not {uid}")
    if stat.S_IMODE(info.st_mode) != 0o700:
        try:
            os.chmod(path, 0o700)
        except OSError as err:
            raise UnusableDir(f"cannot make '{path}' private (mode 0700): {err.strerror}")


def probe(path: str, timeout_s: float = 1.0) -> str:
    """What is at a socket path: "absent", "live" (something accepts connections),
    "stale" (a socket file nobody listens on: connect is refused) or "not_socket".

    Refusal is the authority, not the PID in the name: a process in another PID namespace
    can share the directory, and a dead process's PID can be reused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISSOCK(info.st_mode):
        return "not_socket"
    probe_socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe_socket.settimeout(timeout_s)
    try:
        probe_socket.connect(path)
    except ConnectionRefusedError:
        return "stale"
    except FileNotFoundError:
        return "absent"
    except OSError:
        # EAGAIN (the listener's backlog is full) means alive; anything else (EACCES, a
        # timeout) says nothing about liveness, so it counts as alive and nobody deletes it.
        return "live"
    finally:
        probe_socket.close()
    return "live"


def remove_if_stale(path: str) -> bool:
    """Removes a stale socket file (see probe); True if it removed one."""
    if probe(path) != "stale":
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
