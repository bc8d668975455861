"""The agent: a Unix socket served by daemon threads (docs/agent.md, "Security model").

The accept thread and each connection's thread block in the kernel (accept, recv, send),
which releases the GIL, so a waiting agent costs the training thread nothing. Work done for
a request holds the GIL like any Python code; what else it holds (the allocator's lock in
`empty_cache`, a snapshot's copy) is said per request in docs/agent.md.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import stat
import struct
import threading
import time

from . import _ops, _paths, _torch
from . import _protocol as proto

log = logging.getLogger("vramctl_agent")

_SO_PEERCRED_FORMAT = "3i"  # struct ucred: pid, uid, gid
# How long a connection waits for a free slot before it is answered `busy`.
_SLOT_WAIT_S = 1.0


class AgentError(RuntimeError):
    """The agent could not start (no usable socket directory, another agent at our name)."""


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(_SO_PEERCRED_FORMAT))
    pid, uid, gid = struct.unpack(_SO_PEERCRED_FORMAT, raw)
    return pid, uid, gid


class _Timeout(Exception):
    pass


class _TooLarge(Exception):
    pass


class Agent:
    def __init__(
        self,
        started_by: str,
        request_timeout_s: float = proto.REQUEST_TIMEOUT_S,
        max_connections: int = proto.MAX_CONNECTIONS,
    ) -> None:
        self.pid = os.getpid()
        self.uid = os.geteuid()
        self.started_by = started_by
        self.started_at = time.time()
        self.request_timeout_s = float(request_timeout_s)
        self.max_connections = int(max_connections)
        self.path: str | None = None
        self.skipped: list[str] = []  # why each earlier candidate directory was not used
        self._made_dir: str | None = None  # the fresh private directory we made, if any
        self._listener: socket.socket | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of our socket file
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    # --- starting ----------------------------------------------------------------------

    def start(self) -> str:
        for directory in _paths.candidate_dirs(self.uid):
            try:
                _paths.ensure_private_dir(directory, self.uid)
            except _paths.UnusableDir as err:
                self.skipped.append(str(err))
                continue
            path = os.path.join(directory, _paths.socket_name(self.pid))
            if len(os.fsencode(path)) > _paths.MAX_SOCKET_PATH_BYTES:
                self.skipped.append(f"'{path}' is longer than a socket path may be ({_paths.MAX_SOCKET_PATH_BYTES} bytes)")
                continue
            try:
                self._listener = self._bind(directory, path)
            except OSError as err:
                self.skipped.append(f"cannot create a socket in '{directory}': {err.strerror or err}")
                continue
            self.path = path
            break
        else:
            self.path = self._start_in_fresh_dir()
        if self._made_dir is not None:
            # Said at WARNING (on stderr where the program configured no logging): the usual
            # place is blocked, quite possibly by someone else on purpose.
            log.warning(
                "vramctl agent: %s; using a fresh private directory '%s' instead (clients find it by its owner)",
                "; ".join(self.skipped),
                self._made_dir,
            )
        elif self.skipped:
            log.info("vramctl agent: %s; using '%s'", "; ".join(self.skipped), self.path)
        self._thread = threading.Thread(target=self._serve, name="vramctl-agent", daemon=True)
        self._thread.start()
        log.info("vramctl agent: listening on '%s' (pid %d)", self.path, self.pid)
        return self.path

    def _start_in_fresh_dir(self) -> str:
        """Every usual directory is unusable (typically: XDG_RUNTIME_DIR unset and someone
        else created /tmp/vramctl-<uid>): listen in a directory made now, which nobody can
        have planted. Clients look for these by name and owner (_paths.fallback_dirs)."""
        try:
            directory = _paths.make_fallback_dir(self.uid)
        except OSError as err:
            self.skipped.append(f"cannot create a fresh private directory in '{_paths.FALLBACK_BASE}': {err.strerror or err}")
            raise AgentError("no usable socket directory: " + "; ".join(self.skipped)) from None
        path = os.path.join(directory, _paths.socket_name(self.pid))
        try:
            self._listener = self._bind(directory, path)
        except OSError as err:
            try:
                os.rmdir(directory)
            except OSError:
                pass
            self.skipped.append(f"cannot create a socket in '{directory}': {err.strerror or err}")
            raise AgentError("no usable socket directory: " + "; ".join(self.skipped)) from None
        self._made_dir = directory
        return path

    def _bind(self, directory: str, path: str) -> socket.socket:
        state = _paths.probe(path)
        if state == "live":
            raise AgentError(
                f"another agent is listening on '{path}' (a process with this PID in another PID namespace sharing "
                "the directory?); set XDG_RUNTIME_DIR to a directory of this process's own"
            )
        if state in ("stale", "not_socket"):
            # The directory is ours (checked), so whatever is at our name is ours: the
            # socket of a dead process whose PID this one reuses.
            os.unlink(path)
        # Bound under a temporary name and renamed into place once listening, so that a
        # client never sees our path refuse connections and takes it for a stale socket.
        temporary = os.path.join(directory, f".agent-{self.pid}-{os.urandom(4).hex()}.tmp")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(temporary)
            os.chmod(temporary, 0o600)
            listener.listen(16)
            os.rename(temporary, path)
        except BaseException:
            listener.close()
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        info = os.lstat(path)
        self._identity = (info.st_dev, info.st_ino)
        return listener

    # --- serving -----------------------------------------------------------------------

    def _serve(self) -> None:
        listener = self._listener
        while not self._stopping.is_set() and listener is not None:
            try:
                conn, _ = listener.accept()
            except OSError as err:
                if self._stopping.is_set() or err.errno in (errno.EINVAL, errno.EBADF):
                    return
                # EMFILE and the like: the process is out of something; back off, stay up.
                log.warning("vramctl agent: accept failed: %s", err)
                time.sleep(0.1)
                continue
            if os.getpid() != self.pid:
                # A forked copy never answers as its parent (the fork hook closes the
                # socket first; this is the belt to its braces).
                conn.close()
                return
            # A client that just closed its connection may not have freed its slot yet
            # (its thread has still to see the end of input): wait a moment before saying
            # busy, so that quick successive requests are not refused. Meanwhile new
            # connections wait in the backlog.
            if not self._slots.acquire(timeout=_SLOT_WAIT_S):
                self._refuse_busy(conn)
                continue
            try:
                threading.Thread(target=self._handle, args=(conn,), name="vramctl-agent-conn", daemon=True).start()
            except RuntimeError:
                self._slots.release()
                conn.close()

    def _refuse_busy(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(1.0)
            conn.sendall(
                proto.encode_line(
                    proto.error_response(
                        proto.BUSY, f"the agent is serving {self.max_connections} connections already; retry", retry_after_s=1.0
                    )
                )
            )
        except OSError:
            pass
        finally:
            conn.close()

    def _handle(self, conn: socket.socket) -> None:
        self._connections.add(conn)
        try:
            pid, uid, gid = peer_credentials(conn)
            if uid not in (0, self.uid):
                log.warning(
                    "vramctl agent: refused a connection from pid %d uid %d: only uid %d or root may connect", pid, uid, self.uid
                )
                self._send(conn, proto.encode_line(proto.error_response(
                    proto.PERMISSION_DENIED, f"uid {uid} may not talk to this agent: only uid {self.uid} or root may")))
                return
            peer = _ops.Peer(pid, uid, gid)
            buffer = bytearray()
            while not self._stopping.is_set():
                try:
                    line = self._read_line(conn, buffer)
                except _Timeout:
                    if buffer:
                        self._send(conn, proto.encode_line(proto.error_response(
                            proto.TIMEOUT, f"no complete request line within {self.request_timeout_s:g} s")))
                    return
                except _TooLarge:
                    self._send(conn, proto.encode_line(proto.error_response(
                        proto.REQUEST_TOO_LARGE, f"a request line may be at most {proto.MAX_REQUEST_BYTES} bytes")))
                    return
                if line is None:
                    return
                if not line.strip():
                    continue
                if os.getpid() != self.pid:
                    return
                response = self._answer(line, peer)
                if not self._send(conn, self._encode(response)):
                    return
        except Exception:
            log.warning("vramctl agent: a connection failed", exc_info=True)
        finally:
            self._connections.discard(conn)
            try:
                conn.close()
            finally:
                self._slots.release()

    def _answer(self, line: bytes, peer: _ops.Peer) -> dict:
        try:
            request = proto.decode_line(line)
        except proto.ProtocolViolation as err:
            return proto.error_response(err.code, err.message)
        try:
            return _ops.answer(request, peer, self)
        except Exception as err:
            log.warning("vramctl agent: a request failed", exc_info=True)
            op = request.get("op") if isinstance(request, dict) else None
            return proto.error_response(proto.INTERNAL_ERROR, f"{type(err).__name__}: {str(err)[:300]}", op if isinstance(op, str) else None)

    def _encode(self, response: dict) -> bytes:
        """The answer's line; an answer that cannot be JSON (a bug: a value JSON cannot
        carry) is replaced by `internal_error`, so that every request is still answered."""
        try:
            return proto.trim_to_limit(response)
        except (ValueError, TypeError) as err:
            log.warning("vramctl agent: an answer could not be encoded", exc_info=True)
            op = response.get("op")
            return proto.encode_line(
                proto.error_response(
                    proto.INTERNAL_ERROR, f"the answer could not be written as JSON: {str(err)[:300]}", op if isinstance(op, str) else None
                )
            )

    def _read_line(self, conn: socket.socket, buffer: bytearray) -> bytes | None:
        """One line without its newline; None at the end of input. The whole line must
        arrive within the request timeout; a line over the limit raises _TooLarge."""
        deadline = time.monotonic() + self.request_timeout_s
        while True:
            newline = buffer.find(b"\n")
            if newline >= 0:
                if newline + 1 > proto.MAX_REQUEST_BYTES:
                    raise _TooLarge()
                line = bytes(buffer[:newline])
                del buffer[: newline + 1]
                return line
            if len(buffer) >= proto.MAX_REQUEST_BYTES:
                raise _TooLarge()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Timeout()
            conn.settimeout(remaining)
            try:
                chunk = conn.recv(proto.MAX_REQUEST_BYTES)
            except socket.timeout:
                raise _Timeout()
            except OSError:
                return None
            if not chunk:
                # A last line without its newline (a client that half-closes) still counts.
                if buffer:
                    line = bytes(buffer)
                    buffer.clear()
                    return line
                return None
            buffer += chunk

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        try:
            conn.settimeout(self.request_timeout_s)
            conn.sendall(data)
            return True
        except OSError:
            # The client went away or stopped reading (its timeout was shorter than the
            # work); the answer is dropped, the agent carries on.
            return False

    # --- stopping ----------------------------------------------------------------------

    def remove_socket_file(self) -> None:
        """Unlinks our socket if the file at our path is still ours. No locks: this runs from
        atexit and from a signal handler, which may interrupt any code."""
        path, identity = self.path, self._identity
        if path is None or identity is None or os.getpid() != self.pid:
            return
        try:
            info = os.lstat(path)
            if stat.S_ISSOCK(info.st_mode) and (info.st_dev, info.st_ino) == identity:
                os.unlink(path)
        except OSError:
            pass
        if self._made_dir is not None:
            try:
                os.rmdir(self._made_dir)  # only when empty; it is ours alone
            except OSError:
                pass

    def stop(self) -> None:
        self._stopping.set()
        self.remove_socket_file()
        listener, self._listener = self._listener, None
        if listener is not None:
            if os.getpid() == self.pid:
                # Wakes the accept thread (accept returns EINVAL). Never in a forked child:
                # the listening socket is shared with the parent, and shutdown would stop
                # the parent's agent too.
                try:
                    listener.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            listener.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and os.getpid() == self.pid:
            thread.join(timeout=2.0)

    def abandon_after_fork(self) -> None:
        """In a forked child: close the inherited descriptors (the listener, and connections
        a parent's thread was serving) without touching the parent's socket file or the
        shared listening socket. Without this, a child that outlives its parent keeps the
        socket accepting connections that nobody answers."""
        self._stopping.set()
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for conn in list(self._connections):
            try:
                conn.close()
            except OSError:
                pass
        self._connections.clear()


# --- removal at exit and on SIGTERM/SIGHUP -----------------------------------------------

_signals_installed: list[int] = []


def _on_fatal_signal(signum, frame) -> None:
    from . import _state

    agent = _state.agent
    if agent is not None:
        agent.remove_socket_file()
    # Die of the signal as the process would have without us.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_signal_cleanup() -> list[str]:
    """For SIGTERM and SIGHUP left at their default (terminate), a handler that removes the
    socket and then dies of the same signal. A handler the program installed is left alone
    (it usually exits through sys.exit, and atexit removes the socket). Only possible from
    the main thread. Trade-off (docs/agent.md): Python runs a handler when the main thread
    returns to the interpreter, so a process stuck in a long C call dies when that returns."""
    if threading.current_thread() is not threading.main_thread():
        return []
    names = []
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _on_fatal_signal)
                _signals_installed.append(sig)
                names.append(sig.name)
        except (ValueError, OSError):
            pass
    return names


def uninstall_signal_cleanup() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    while _signals_installed:
        sig = _signals_installed.pop()
        try:
            if signal.getsignal(sig) is _on_fatal_signal:
                signal.signal(sig, signal.SIG_DFL)
        except (ValueError, OSError):
            pass


def after_fork_in_child() -> None:
    from . import _state

    agent, _state.agent = _state.agent, None
    if agent is not None:
        agent.abandon_after_fork()
    _ops.reset_after_fork()
    _torch.reset_after_fork()
    from . import _oom

    _oom.reset_after_fork()
