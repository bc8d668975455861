"""vramctl's in-process agent: lets `vramctl` (or any client of docs/agent.md's protocol)
read this process's allocator counters, release its cached GPU memory and take allocator
snapshots, over a Unix socket that only this process's user and root can use.

    import vramctl_agent
    vramctl_agent.start()          # returns the socket path

or `%load_ext vramctl_agent` in IPython/Jupyter, or `VRAMCTL_AGENT=1` in the environment of a
process where the package is installed (its .pth file starts the agent once torch, jax or
tensorflow is imported). Standard library only; it never imports a framework itself.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading

from . import _hook, _ipython, _oom, _server, _state, _torch
from ._ops import AGENT_VERSION
from ._protocol import PROTOCOL
from ._server import AgentError

__version__ = AGENT_VERSION
__all__ = ["start", "stop", "is_running", "socket_path", "AgentError", "PROTOCOL", "__version__"]

log = logging.getLogger("vramctl_agent")
_start_lock = threading.Lock()


def _guard_when_torch_arrives(name: str, module) -> None:
    _torch.install_capture_guard(module)
    _oom.arm(module)


def start(
    *,
    request_timeout_s: float | None = None,
    max_connections: int | None = None,
    cleanup_on_signals: bool | None = None,
    _started_by: str = "start",
) -> str:
    """Starts the agent (once per process; later calls return the same path) and returns its
    socket path. Raises AgentError if no socket directory is usable.

    request_timeout_s and max_connections override the protocol's defaults (10 s, 4).
    cleanup_on_signals (default: on, unless VRAMCTL_AGENT_SIGNALS=0) installs a SIGTERM and
    SIGHUP handler that removes the socket, where those signals are at their default."""
    with _start_lock:
        agent = _state.agent
        if agent is not None and agent.pid == os.getpid():
            return agent.path  # type: ignore[return-value]
        kwargs = {}
        if request_timeout_s is not None:
            kwargs["request_timeout_s"] = request_timeout_s
        if max_connections is not None:
            kwargs["max_connections"] = max_connections
        agent = _server.Agent(_started_by, **kwargs)
        path = agent.start()
        _state.agent = agent
        _oom.set_directory(os.path.dirname(path))
        if cleanup_on_signals is None:
            cleanup_on_signals = os.environ.get("VRAMCTL_AGENT_SIGNALS", "1") != "0"
        if cleanup_on_signals:
            _server.install_signal_cleanup()
        if "torch" in sys.modules:
            _torch.install_capture_guard()
            # The OOM observer: attached when the program initializes CUDA, never before.
            _oom.arm()
        else:
            _hook.on_import("torch", _guard_when_torch_arrives)
        return path


def stop() -> None:
    """Stops the agent and removes its socket (also done at exit)."""
    with _start_lock:
        agent, _state.agent = _state.agent, None
        if agent is not None:
            agent.stop()
        _server.uninstall_signal_cleanup()


def is_running() -> bool:
    agent = _state.agent
    return agent is not None and agent.pid == os.getpid()


def socket_path() -> str | None:
    agent = _state.agent
    return agent.path if agent is not None and agent.pid == os.getpid() else None


def _at_exit() -> None:
    agent = _state.agent
    # A forked child inherits this registration; only the agent's own process removes it.
    if agent is not None and agent.pid == os.getpid():
        agent.stop()


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_server.after_fork_in_child)


# --- IPython / Jupyter: %load_ext vramctl_agent ----------------------------------------


def load_ipython_extension(ipython) -> None:
    _ipython.set_shell(ipython)
    try:
        path = start(_started_by="ipython")
    except AgentError as err:
        print(f"vramctl agent: not started: {err}")
        return
    print(f"vramctl agent: listening on {path} (pid {os.getpid()})")


def unload_ipython_extension(ipython) -> None:
    stop()
    _ipython.set_shell(None)
