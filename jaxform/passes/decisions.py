"""Where a pass asks for a decision that is the planner's to make.

A memory pass knows how to checkpoint a loop or a segment; which schedule each loop gets, and whether a
recomputation pays, is decided in `jaxform.plan.memory`, with its cost model and XLA's numbers. Imports
run one way (`plan` -> `passes` -> `ir`), so the planner installs its deciders here when it is imported
(`import jaxform` does), and a pass calls them by name.
"""
from __future__ import annotations

from typing import Callable

_DECIDERS: dict[str, Callable] = {}


def install(name: str, fn: Callable) -> Callable:
    """Make `fn` the decider called `name` (the planner does this at import)."""
    _DECIDERS[name] = fn
    return fn


def decider(name: str) -> Callable:
    try:
        return _DECIDERS[name]
    except KeyError:
        raise RuntimeError(f"jaxform: no decider {name!r} is installed; import jaxform (jaxform.plan installs "
                           f"it) before running memory passes") from None
