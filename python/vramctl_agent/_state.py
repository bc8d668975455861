"""The one agent of this process (None when none runs, and in a forked child)."""

from __future__ import annotations

import typing

if typing.TYPE_CHECKING:
    from ._server import Agent

agent: "Agent | None" = None
