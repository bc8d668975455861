"""Run code once a module's import has finished, without importing it: a `sys.meta_path`
finder that lets the normal finders find the module and wraps its loader.

Used by the `.pth` file (`VRAMCTL_AGENT=1`: start the agent once torch, jax or tensorflow is
imported) and by `start()` before torch is imported (install the CUDA graph capture guard
the moment torch arrives).
"""

from __future__ import annotations

import importlib.abc
import logging
import os
import sys
import threading
from typing import Callable

log = logging.getLogger("vramctl_agent")

TRIGGERS = ("torch", "jax", "tensorflow")

_lock = threading.RLock()
_callbacks: dict[str, list[Callable]] = {}
_finder: "_Finder | None" = None
_autostart_armed = False


class _NotifyingLoader(importlib.abc.Loader):
    """The module's own loader, plus a call after the module has executed."""

    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        # Put the real loader back first, so that the module looks as if we were never there
        # (importlib.resources, pkgutil and reloads use it).
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._finding = threading.local()

    def find_spec(self, fullname, path, target=None):
        with _lock:
            if fullname not in _callbacks:
                return None
        if getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._finding.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _NotifyingLoader(spec.loader, fullname)
        return spec


def _fire(name: str, module) -> None:
    with _lock:
        callbacks = _callbacks.pop(name, [])
        _remove_finder_if_idle()
    for callback in callbacks:
        try:
            callback(name, module)
        except Exception:
            # Never break the program's import because of the agent.
            log.warning("vramctl agent: a hook on importing '%s' failed", name, exc_info=True)


def _remove_finder_if_idle() -> None:
    global _finder
    if not _callbacks and _finder is not None:
        try:
            sys.meta_path.remove(_finder)
        except ValueError:
            pass
        _finder = None


def on_import(name: str, callback: Callable) -> None:
    """Calls callback(name, module) once `name`'s import has finished: now if it already
    has (the module is complete in sys.modules), else when it does."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None) if module is not None else None
    if module is not None and not getattr(spec, "_initializing", False):
        callback(name, module)
        return
    global _finder
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)


def cancel(name: str, callback: Callable) -> None:
    with _lock:
        callbacks = _callbacks.get(name, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if not callbacks:
            _callbacks.pop(name, None)
        _remove_finder_if_idle()


def _start_from_environment(name: str, module) -> None:
    global _autostart_armed
    with _lock:
        if not _autostart_armed:
            return
        _autostart_armed = False
        for other in TRIGGERS:
            if other != name:
                cancel(other, _start_from_environment)
    from . import _run_report, _torch, start

    if name == "torch":
        _torch.install_capture_guard(module)
    _run_report.arm()
    try:
        start(_started_by="env")
    except Exception as err:
        log.warning("vramctl agent: could not start (VRAMCTL_AGENT=1): %s", err)


def autostart() -> None:
    """Called by vramctl_agent.pth at interpreter start-up when VRAMCTL_AGENT=1: starts the
    agent once the first of torch, jax or tensorflow has been imported. Never imports them."""
    global _autostart_armed
    if os.environ.get("VRAMCTL_AGENT") != "1":
        return
    with _lock:
        if _autostart_armed:
            return
        _autostart_armed = True
    for name in TRIGGERS:
        module = sys.modules.get(name)
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            _start_from_environment(name, module)
            return
    for name in TRIGGERS:
        on_import(name, _start_from_environment)
