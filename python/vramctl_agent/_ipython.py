"""`reclaim` with `deep`: what an IPython shell keeps alive that users forget.

- The last exception: `sys.last_type/last_value/last_traceback` (and `sys.last_exc`,
  Python 3.12+), which IPython sets for every error shown, and the traceback its
  formatter keeps (`InteractiveTB.tb`). A traceback holds every frame of the failed call,
  and each frame its local variables: the tensors of a cell that died with an OOM. The
  frames' locals are cleared (`traceback.clear_frames`) as well, so that a reference kept
  elsewhere to the exception does not keep the tensors.
- The output cache: `Out`/`_oh`, `_`, `__`, `___` and `_<n>` in the user namespace and in
  `user_ns_hidden`, where IPython keeps a second reference (`%reset -f out` misses that
  one), which keep every displayed result.

The agent runs on its own thread, so this mutates the shell's namespace while a cell may
be running; deep reclaim is meant for an idle notebook. Each change is a single dict or
attribute operation, atomic under the GIL.
"""

from __future__ import annotations

import sys
import traceback

from ._frameworks import imported

# The shell that loaded the extension (`%load_ext vramctl_agent`), if any.
_shell = None


def set_shell(shell: object) -> None:
    global _shell
    _shell = shell


def current_shell():
    if _shell is not None:
        return _shell
    ipython = imported("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython is not None else None
    try:
        return get() if get is not None else None
    except Exception:
        return None


def _describe(value: object) -> str:
    text = f"{type(value).__name__}: {value}" if value is not None else "unknown"
    return text if len(text) <= 200 else text[:199] + "…"


def _clear_tb_frames(tb) -> int:
    count = 0
    walk = tb
    while walk is not None:
        count += 1
        walk = walk.tb_next
    try:
        traceback.clear_frames(tb)
    except Exception:
        pass
    return count


def _drop_last_exception(shell) -> dict | None:
    value = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    tb = getattr(sys, "last_traceback", None)
    formatter_tbs = []
    for name in ("InteractiveTB", "SyntaxTB"):
        formatter = getattr(shell, name, None)
        held = getattr(formatter, "tb", None) if formatter is not None else None
        if held is not None:
            formatter_tbs.append((formatter, held))
    if value is None and tb is None and not formatter_tbs:
        return None
    frames = 0
    seen = set()
    # Every traceback reachable from the exception chain (raise ... from ..., context).
    chain, exc = [], value
    while isinstance(exc, BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    tbs = [tb] + [e.__traceback__ for e in chain] + [held for _, held in formatter_tbs]
    cleared = set()
    for each in tbs:
        if each is not None and id(each) not in cleared:
            cleared.add(id(each))
            frames += _clear_tb_frames(each)
    for exc in chain:
        try:
            exc.__traceback__ = None
        except Exception:
            pass
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            try:
                delattr(sys, name)
            except AttributeError:
                pass
    for formatter, _ in formatter_tbs:
        try:
            formatter.tb = None
        except Exception:
            pass
    return {"what": "last_exception", "detail": _describe(value), "frames_cleared": frames}


def _drop_output_cache(shell) -> dict | None:
    user_ns = getattr(shell, "user_ns", None)
    if not isinstance(user_ns, dict):
        return None
    hook = getattr(shell, "displayhook", None)
    out = user_ns.get("_oh")
    entries = len(out) if isinstance(out, dict) else 0
    numbered = [k for k in list(user_ns) if k.startswith("_") and k[1:].isdigit()]
    held = [name for name in ("_", "__", "___") if user_ns.get(name, "") != ""]
    if not entries and not numbered and not held:
        return None
    hidden = getattr(shell, "user_ns_hidden", None)
    for key in numbered:
        user_ns.pop(key, None)
        if isinstance(hidden, dict):
            hidden.pop(key, None)
    if isinstance(out, dict):
        out.clear()
    for name in ("_", "__", "___"):
        if name in user_ns:
            user_ns[name] = ""
        # IPython pushes these with interactive=False, which keeps a copy in user_ns_hidden.
        if isinstance(hidden, dict) and name in hidden:
            hidden[name] = ""
    if hook is not None:
        for name in ("_", "__", "___"):
            try:
                setattr(hook, name, "")
            except Exception:
                pass
    return {"what": "output_cache", "entries": max(entries, len(numbered))}


def deep_clean() -> dict:
    """What it dropped. The last exception is dropped in any interpreter (the plain REPL
    and `python -i` set `sys.last_*` too); the output cache exists only in IPython."""
    shell = current_shell()
    dropped = []
    steps = [_drop_last_exception] + ([_drop_output_cache] if shell is not None else [])
    for step in steps:
        try:
            result = step(shell)
        except Exception as err:
            result = {"what": step.__name__.replace("_drop_", ""), "error": str(err)[:200]}
        if result is not None:
            dropped.append(result)
    return {"in_ipython": shell is not None, "dropped": dropped}
