"""`vramctl run` and `vramctl fit` copy this file as `sitecustomize.py` into the directory
they put first on the job's `PYTHONPATH`, beside a copy of the package: every Python
interpreter of the job (its workers and DDP ranks too, which inherit the environment)
then arms the agent as the `.pth` hook of an installed package would (`VRAMCTL_AGENT=1`:
it starts once torch, jax or tensorflow is imported, and never imports them itself).

A `sitecustomize` the environment already had (Debian's, conda's) is shadowed by this
one, so it is looked up on the rest of `sys.path` and run after. Nothing here may break
the job: any failure is one line on stderr.
"""

import os as _os
import sys as _sys


def _vramctl_start() -> None:
    try:
        from vramctl_agent import _hook

        _hook.autostart()
    except Exception as err:  # the job must run even when the agent cannot
        _sys.stderr.write(f"vramctl: the agent was not armed in this process: {err}\n")


def _vramctl_chain() -> None:
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is None or spec.loader is None:
            return
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as err:
        _sys.stderr.write(f"vramctl: the environment's sitecustomize failed: {err}\n")


_vramctl_start()
_vramctl_chain()
