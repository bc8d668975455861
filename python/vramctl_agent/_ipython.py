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

import gc
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


def _tensor_storage(value, tensor_type):
    """(key, bytes) of a GPU tensor's storage, so that views of one storage count once;
    None for anything else. Never imports torch: `tensor_type` is the imported one's."""
    if tensor_type is None or not isinstance(value, tensor_type):
        return None
    try:
        if getattr(value, "is_cuda", True) is False:
            return None
        storage = getattr(value, "untyped_storage", None)
        if storage is not None:
            s = storage()
            return ("storage", s.data_ptr()), int(s.nbytes())
        return ("tensor", id(value)), int(value.nbytes)
    except Exception:
        return ("tensor", id(value)), 0


def _count_tensors(tb, tensor_type, seen_frames: set, tensors: dict) -> None:
    """The GPU tensors `tb`'s frames hold directly (their locals), into `tensors`."""
    walk = tb
    while walk is not None:
        frame = walk.tb_frame
        if id(frame) not in seen_frames:
            seen_frames.add(id(frame))
            # Not `frame.f_locals`: before 3.13 that makes a dict of the locals which the
            # frame keeps, holding the tensors past `clear_frames`. The frame's own
            # references are its locals (and evaluation stack), not a module's globals.
            try:
                values = gc.get_referents(frame)
            except Exception:
                values = []
            for value in values:
                found = _tensor_storage(value, tensor_type)
                if found is not None:
                    key, size = found
                    tensors[key] = max(size, tensors.get(key, 0))
        walk = walk.tb_next


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
            formatter_tbs.append((formatter, held, name))
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
    tbs = [tb] + [e.__traceback__ for e in chain] + [held for _, held, _ in formatter_tbs]
    torch = imported("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    seen_frames: set = set()
    tensors: dict = {}
    for each in tbs:
        if each is not None:
            _count_tensors(each, tensor_type, seen_frames, tensors)
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
    names = []
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            try:
                delattr(sys, name)
                names.append(f"sys.{name}")
            except AttributeError:
                pass
    for formatter, _, name in formatter_tbs:
        try:
            formatter.tb = None
            names.append(f"{name}.tb")
        except Exception:
            pass
    return {
        "what": "last_exception",
        "detail": _describe(value),
        "names": names,
        "frames_cleared": frames,
        "tensors": len(tensors),
        "tensor_bytes": sum(tensors.values()),
    }


def _is_empty_slot(value: object) -> bool:
    return isinstance(value, str) and value == ""


def _drop_output_cache(shell) -> dict | None:
    user_ns = getattr(shell, "user_ns", None)
    if not isinstance(user_ns, dict):
        return None
    hook = getattr(shell, "displayhook", None)
    out = user_ns.get("_oh")
    entries = len(out) if isinstance(out, dict) else 0
    numbered = [k for k in list(user_ns) if k.startswith("_") and k[1:].isdigit()]
    # Not `!= ""`: a tensor compares element-wise (or refuses to compare with a string).
    held = [name for name in ("_", "__", "___") if not _is_empty_slot(user_ns.get(name, ""))]
    if not entries and not numbered and not held:
        return None
    hidden = getattr(shell, "user_ns_hidden", None)
    names = (["Out"] if entries else []) + held + sorted(numbered, key=lambda k: int(k[1:]))
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
    return {"what": "output_cache", "names": names, "entries": max(entries, len(numbered))}


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
