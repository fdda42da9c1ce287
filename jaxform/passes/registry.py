"""The registry of passes by name: `register` makes a function `Graph -> Graph` a pass, `get` finds one.

Its own module so that every pass module imports it (`from .registry import register`) without
importing the `passes` package that imports them: imports run one way.
"""
from __future__ import annotations

import difflib
import functools
from typing import Callable

from .. import _jax
from ..ir import Graph
from ..state.ref_loops import has_ref_loops, scans_from_ref_loops

PASSES: dict[str, Callable[[Graph], Graph]] = {}


def register(name: str | None = None, *, exact: bool = True, loops: bool = False, decided: bool = False):
    """Register `fn(graph) -> graph` as a pass (sets `fn.pass_name`, `fn.exact`, `fn.decided`).

    loops=True: a loop pass; loops over refs (JAX's Scan3) are first read as the scans they stand
    for (`state.ref_loops`), so the pass sees them when called on a Graph directly too, and loops
    it traces itself are built with jax_scan3/jax_remat3 off (`_jax.classic_loops`).
    decided=True: in a planned pipeline (`optimize(f, passes=[...], plan=True)`) the pass *proposes*
    and the planner decides whether to keep it, as for jaxform's own loop passes: on XLA's memory and
    measured time, for the use the function is traced under, one loop at a time (docs/extending.md).
    """
    def wrap(fn):
        if loops:
            fn = _reading_ref_loops(fn)
        fn.pass_name, fn.exact, fn.decided = name or fn.__name__, exact, decided
        PASSES[fn.pass_name] = fn
        return fn
    return wrap


def _reading_ref_loops(fn):
    @functools.wraps(fn)
    def run(graph: Graph, *args, **kwargs) -> Graph:
        if has_ref_loops(graph):
            graph = scans_from_ref_loops(graph)
        with _jax.classic_loops():   # loops the pass traces itself are scans (see run_passes)
            return fn(graph, *args, **kwargs)
    return run


def get(p) -> Callable[[Graph], Graph]:
    """A pass from its name or itself (any callable Graph -> Graph is a pass)."""
    if callable(p):
        return p
    if p not in PASSES:
        close = difflib.get_close_matches(str(p), PASSES, n=3)
        raise ValueError(f"jaxform: unknown pass {p!r}." + (f" Did you mean {', '.join(close)}?" if close else
                         f" Known passes: {', '.join(sorted(PASSES))}."))
    return PASSES[p]
