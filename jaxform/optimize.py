"""`trace`, `to_function` and `optimize`: the way in and out of the Graph world.

`optimize(fn)` wraps `fn` like `jax.jit` does: per input signature it traces
`fn` to a jaxpr, runs the passes over its Graph, verifies the result, and
caches it; each call evaluates the cached jaxpr by binding primitives, so the
wrapper composes with jit, grad, vmap and sharded jit. An optimization bug
must never break or change the user's program: a pass that raises, or whose
output fails verification, is skipped with a warning (strict=True raises).
"""
from __future__ import annotations

import functools
import inspect
import os
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _jax
from .ir import Graph
from .ir.graph import gc_paused
from . import passes as _passes
from .passes.remat_loops import with_memory as remat_with_memory


class PassError(RuntimeError):
    """A pass failed (raised, or emitted an invalid graph) under strict=True."""


def _fn_name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        code = inspect.unwrap(fn).__code__
        return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    except AttributeError:
        return name


def _check_leaves(fn, leaves, paths) -> None:
    for leaf, path in zip(leaves, paths):
        if isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)) or \
                isinstance(leaf, _jax.Tracer):
            continue
        raise TypeError(
            f"jaxform: argument {jax.tree_util.keystr(path) or '(positional)'} of {_fn_name(fn)} is a "
            f"{type(leaf).__name__}, which is not an array. Mark it static "
            f"(optimize(fn, static_argnums=...) / static_argnames=...) or pass an array.")


def trace(fn: Callable, *args, **kwargs) -> Graph:
    """Trace `fn` on example arguments (arrays, ShapeDtypeStructs or pytrees of them) into a Graph."""
    flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path((args, kwargs))[0]]
    _check_leaves(fn, [jax.numpy.zeros(x.shape, x.dtype) if isinstance(x, jax.ShapeDtypeStruct) else x
                       for x in flat], paths)
    out_tree = None

    def flat_fn(*leaves):
        nonlocal out_tree
        a, k = jax.tree_util.tree_unflatten(in_tree, leaves)
        out, out_tree = jax.tree_util.tree_flatten(fn(*a, **k))
        return out

    closed = jax.make_jaxpr(flat_fn)(*flat)
    g = Graph.from_jaxpr(closed)
    g.in_tree, g.out_tree = in_tree, out_tree
    return g


def to_function(graph: Graph) -> Callable:
    """A callable running `graph` (a snapshot of it now); composes with jit, grad, vmap.

    If the graph came from `trace`, it takes and returns the same pytrees as
    the traced function; otherwise flat arrays in, a list of arrays out.
    """
    closed = graph.to_jaxpr()
    in_tree, out_tree = graph.in_tree, graph.out_tree

    def run(*args, **kwargs):
        flat = jax.tree_util.tree_leaves((args, kwargs)) if in_tree is not None else list(args)
        if len(flat) != len(closed.jaxpr.invars):
            raise TypeError(f"jaxform: this graph takes {len(closed.jaxpr.invars)} arrays, got {len(flat)}")
        outs = _jax.eval_jaxpr(closed, *flat)
        return jax.tree_util.tree_unflatten(out_tree, outs) if out_tree is not None else outs

    run.jaxpr = closed
    return run


# ---- verification -------------------------------------------------------------

def verify(closed, like, *, typecheck: bool = True) -> None:
    """Raise if `closed` is not a well-typed jaxpr with the signature of `like`.

    typecheck=False skips `check_jaxpr` (re-running every abstract eval costs
    about twice the trace time) and checks only the signature.
    """
    if typecheck:
        _jax.check_jaxpr(closed)
    same = lambda a, b: len(a) == len(b) and all(x.strip_weak_type() == y.strip_weak_type() for x, y in zip(a, b))
    if not same(closed.in_avals, like.in_avals) or not same(closed.out_avals, like.out_avals):
        raise TypeError(f"signature changed: {closed.in_avals} -> {closed.out_avals}, "
                        f"expected {like.in_avals} -> {like.out_avals}")


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
    passes = [_passes.get(p) for p in passes]
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
            warnings.warn(msg, stacklevel=3)
            continue
        if on_change is not None:
            on_change(name, good, out)
        good = out
    return good


# ---- optimize -------------------------------------------------------------------

def _aval_key(x):
    a = _jax.get_aval(x)
    return (a.shape, a.dtype, getattr(a, "weak_type", False), getattr(a, "sharding", None))


def optimize(fn: Callable | None = None, passes: Sequence | None = None, *, exact: bool = False,
             strict: bool = False, static_argnums: int | Sequence[int] = (),
             static_argnames: str | Sequence[str] = (), memory="default") -> Callable:
    """Optimize `fn` with jaxform passes; a drop-in wrapper like `jax.jit`.

    passes: pass names or callables (default: the `passes.DEFAULT` pipeline).
    exact: keep only passes that give bit-for-bit equal results.
    strict: raise instead of skipping a pass that fails.
    static_argnums / static_argnames: as in `jax.jit` (hashable, part of the cache key).
    memory: what loops remember under grad (`passes.remat_loops`): None (everything, as JAX
      does), "auto" (remat a scan body where that at least halves its stored bytes and the
      recomputation is cheap), "min" (two-level √L checkpointing) or a byte budget for the
      gradient's loop residuals. Default: "auto" with the default pipeline, None when `passes`
      is given or exact=True (remat is not bit-exact).

    Does not compile by itself: wrap in `jax.jit` for speed.
    """
    if fn is None:
        return functools.partial(optimize, passes=passes, exact=exact, strict=strict,
                                 static_argnums=static_argnums, static_argnames=static_argnames, memory=memory)
    if not callable(fn):
        raise TypeError(f"jaxform.optimize expects a function, got {type(fn).__name__}")
    if passes is None:
        pipeline = _passes.default_pipeline(exact)
    else:
        pipeline = [_passes.get(p) for p in passes]
        if exact:
            pipeline = [p for p in pipeline if getattr(p, "exact", False)]
    if memory == "default":
        memory = "auto" if passes is None else None
    if memory is not None and not exact:   # planned last: fusion first shrinks what loops remember
        pipeline.append(remat_with_memory(memory))   # (not exact: XLA fuses recomputed ops anew)
    static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    name = _fn_name(fn)
    cache: dict = {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        static_pos = {i % len(args) for i in static_argnums if -len(args) <= i < len(args)}
        statics = tuple((i, args[i]) for i in sorted(static_pos)) + \
            tuple(sorted((k, v) for k, v in kwargs.items() if k in static_argnames))
        dyn_args = [a for i, a in enumerate(args) if i not in static_pos]
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in static_argnames}
        leaves_paths, in_tree = jax.tree_util.tree_flatten_with_path((dyn_args, dyn_kwargs))
        leaves = [l for _, l in leaves_paths]
        _check_leaves(fn, leaves, [p for p, _ in leaves_paths])
        try:
            key = (in_tree, tuple(map(_aval_key, leaves)), statics)
            hash(key)
        except TypeError as e:
            raise TypeError(f"jaxform: a static argument of {name} is not hashable: {e}") from None
        entry = cache.get(key)
        if entry is None:
            entry = _build(leaves, in_tree, statics)
            if entry[2]:
                cache[key] = entry
        closed, out_tree, _ = entry
        return jax.tree_util.tree_unflatten(out_tree, _jax.eval_jaxpr(closed, *leaves))

    def _build(leaves, in_tree, statics):
        out_tree = None

        def flat_fn(*flat):
            nonlocal out_tree
            dyn_args, kw = jax.tree_util.tree_unflatten(in_tree, flat)
            it, args = iter(dyn_args), []
            pos = dict((i, v) for i, v in statics if isinstance(i, int))
            for i in range(len(dyn_args) + len(pos)):
                args.append(pos[i] if i in pos else next(it))
            kw = {**kw, **{k: v for k, v in statics if isinstance(k, str)}}
            out, out_tree = jax.tree_util.tree_flatten(fn(*args, **kw))
            return out

        closed = jax.make_jaxpr(flat_fn)(*leaves)
        # Constants that are tracers of an enclosing transformation belong to this call only.
        cacheable = not any(isinstance(c, _jax.Tracer) for c in closed.consts)
        return run_passes(closed, pipeline, strict=strict, where=name), out_tree, cacheable

    wrapper.cache_size = lambda: len(cache)
    wrapper.passes = tuple(pipeline)
    return wrapper
