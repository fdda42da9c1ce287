"""Running a pipeline of passes over a jaxpr: verify the result, skip (warn) or raise on a failing pass.

The mechanism every caller shares (`optimize`, the planner, `explain`, `jaxform.testing`): an
optimization bug must never break or change the user's program, so a pass that raises, or whose output
fails verification, is skipped with a warning that points at the user's line (strict=True raises).
"""
from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Callable, Sequence

import jax

from .. import _jax
from ..ir import Graph
from ..ir.graph import gc_paused
from ..ir.rules import check_installed_rules
from ..state.ref_loops import scans_from_ref_loops as _scans_from_ref_loops
from .registry import get as _get


class PassError(RuntimeError):
    """A pass failed (raised, or emitted an invalid graph) under strict=True."""


def verify(closed, like, *, typecheck: bool = True) -> None:
    """Raise if `closed` is not a well-typed jaxpr with the signature of `like`.

    typecheck=False skips `check_jaxpr` (re-running every abstract eval costs
    about twice the trace time) and checks only the signature.
    """
    if typecheck:
        _jax.check_jaxpr(closed, like)
    same = lambda a, b: len(a) == len(b) and all(x.strip_weak_type() == y.strip_weak_type() for x, y in zip(a, b))
    if not same(closed.in_avals, like.in_avals) or not same(closed.out_avals, like.out_avals):
        raise TypeError(f"signature changed: {closed.in_avals} -> {closed.out_avals}, "
                        f"expected {like.in_avals} -> {like.out_avals}")
    check_installed_rules(closed, like)   # a rule the pass installed fails here, not at the user's grad


def _package_dir(module) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


# Frames a pass-failure warning skips: jaxform itself, JAX's tracing machinery, and the
# stdlib decorators between them (contextlib's ContextDecorator wraps run_passes).
_INTERNAL = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, _package_dir(jax), contextlib.__file__)


def user_stacklevel() -> int:
    """`stacklevel` for a warning issued by our caller: the first frame outside jaxform and JAX.

    A pass fails while `optimize`'s wrapper traces, possibly deep inside
    `jax.jit`/`grad` tracing: the warning then points at the user's line that
    called the wrapper (or the transformation of it), not at jaxform.
    """
    frame, level = sys._getframe(2), 2    # level 1: the caller, which warns
    while frame is not None and (frame.f_code.co_filename.startswith(_INTERNAL)
                                 or frame.f_code.co_filename.startswith("<frozen ")):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


@gc_paused()
def run_passes(closed, passes: Sequence, *, strict: bool = False, where: str = "",
               on_change: Callable | None = None):
    """Run passes over a jaxpr; skip (warn) or raise (strict) on a failing pass.

    Fast path: all passes run on one Graph and the result is verified once.
    If anything fails, rerun one pass at a time from the last good jaxpr,
    verifying after each, so that only the culprit is skipped.
    JAXFORM_CHECK=1 verifies after every pass; JAXFORM_CHECK=0 skips
    `check_jaxpr` on the fast path (the signature is still checked).
    """
    passes = [_get(p) for p in passes]
    with _jax.classic_loops():    # what passes trace themselves (remat's checkpointed scans) stays `scan`
        return _run_passes(closed, passes, strict, where, on_change)


def _run_passes(closed, passes, strict, where, on_change):
    if _scans_from_ref_loops not in passes and _jax.has_scan3(closed):
        passes = [_scans_from_ref_loops, *passes]   # JAX 0.12's Scan3 as the scan loop passes know
    check = os.environ.get("JAXFORM_CHECK", "")
    if not strict and on_change is None and check != "1":
        try:
            g = Graph.from_jaxpr(closed)
            for p in passes:
                g = p(g)
            out = g.to_jaxpr()
            verify(out, closed, typecheck=check != "0")
            return out
        except Exception:
            pass  # find and skip the culprit below
    good = closed
    for p in passes:
        name = getattr(p, "pass_name", getattr(p, "__name__", repr(p)))
        try:
            g = p(Graph.from_jaxpr(good))
            out = g.to_jaxpr()
            verify(out, good)
        except Exception as e:
            msg = f"jaxform: pass {name!r} failed on {where or 'a program'}" + \
                ("" if strict else " and was skipped") + f": {type(e).__name__}: {e}"
            if strict:
                raise PassError(msg) from e
            warnings.warn(msg, stacklevel=user_stacklevel())
            continue
        if on_change is not None:
            on_change(name, good, out)
        good = out
    return good
