"""The program being inspected: trace once, run the pipeline, compile, time.

`show`, `explain`, `draw` and the CLI all start from a function and example
arguments (arrays or `jax.ShapeDtypeStruct`s, in pytrees); this module turns
them into a ClosedJaxpr on flat arguments and runs the passes on it through
`optimize.run_passes`, the same path `jaxform.optimize` takes.
"""
from __future__ import annotations

import os
import re
import sys
import time
from typing import Callable, Sequence

import jax
import numpy as np

from .. import _jax
from .. import passes as _passes
from ..ir import Graph
from ..ir.identity import program_identity
from ..optimize import run_passes


def fn_name(fn) -> str:
    """'name (file.py:12)' for messages and report titles."""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})" if code else name


def short_location(location: str) -> str:
    """'file.py:12 (fn)' from a node's location: no column, paths under the working directory made relative."""
    cwd = os.getcwd() + os.sep
    location = re.sub(r"^(.*:\d+):\d+((?: .*)?)$", r"\1\2", location)
    return location[len(cwd):] if location.startswith(cwd) else location


def trace_flat(fn: Callable, args: Sequence) -> tuple:
    """(ClosedJaxpr over the flattened arguments, flat argument leaves)."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tuple(args))[0]:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")) and \
                not isinstance(leaf, (bool, int, float, complex, np.generic)):
            raise TypeError(f"jaxform: argument args{jax.tree_util.keystr(path)} of {fn_name(fn)} is a "
                            f"{type(leaf).__name__}, not an array: pass arrays or jax.ShapeDtypeStructs "
                            f"(pytrees of them), as the function will be called with")
    flat, tree = jax.tree_util.tree_flatten(tuple(args))
    closed = jax.make_jaxpr(lambda *leaves: jax.tree_util.tree_leaves(fn(*jax.tree_util.tree_unflatten(tree, leaves))))(*flat)
    return closed, flat


def pipeline(passes) -> list:
    """Pass callables: None is the default pipeline; 'a,b' or ['a', fn] pick passes."""
    if passes is None:
        return _passes.default_pipeline()
    if isinstance(passes, str):
        passes = [p.strip() for p in passes.split(",") if p.strip()]
    return [_passes.get(p) for p in passes]


def pass_name(p) -> str:
    return getattr(p, "pass_name", None) or getattr(p, "__name__", None) or repr(p)


def program_key(closed):
    """Equal keys: the same program by the identity rule (`identity.program_identity`), never by printed
    text, which JAX prints alike for two different callbacks."""
    return program_identity(Graph.from_jaxpr(closed), closed)


def run(closed, passes, on_change: Callable | None = None, *, strict: bool = False):
    """Run the passes on `closed`; on_change(name, before, after) only for passes that changed it."""
    def changed(name, before, after):
        if on_change is not None and program_key(before) != program_key(after):
            on_change(name, before, after)
    return run_passes(closed, pipeline(passes), strict=strict, on_change=changed)


def as_function(closed) -> Callable:
    return lambda *flat: _jax.eval_jaxpr(closed, *flat)


def temp_bytes(closed, flat) -> int:
    """XLA's temporary buffer size for the compiled program (`memory_analysis`)."""
    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in flat]
    return int(jax.jit(as_function(closed)).lower(*specs).compile().memory_analysis().temp_size_in_bytes)


def grad_temp_bytes(closed, flat) -> int | None:
    """XLA temp memory of the gradient of the sum of the float outputs w.r.t. the float inputs (None: none)."""
    floats = [i for i, x in enumerate(flat) if jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)]
    if not floats or not any(jax.numpy.issubdtype(a.dtype, jax.numpy.inexact) for a in closed.out_avals):
        return None
    f = as_function(closed)

    def loss(*xs):
        return sum(jax.numpy.sum(o.real).astype(jax.numpy.float32) for o in f(*xs)
                   if jax.numpy.issubdtype(o.dtype, jax.numpy.inexact))
    specs = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in flat]
    g = jax.jit(jax.grad(loss, argnums=tuple(floats)))
    return int(g.lower(*specs).compile().memory_analysis().temp_size_in_bytes)


def concrete(flat, seed: int = 0) -> list:
    """Arrays for `jax.ShapeDtypeStruct` leaves (normal floats, zeros otherwise), others as given."""
    r = np.random.RandomState(seed)

    def make(x):
        if not isinstance(x, jax.ShapeDtypeStruct):
            return x
        if jax.numpy.issubdtype(x.dtype, np.floating) or jax.numpy.issubdtype(x.dtype, np.complexfloating):
            return jax.numpy.asarray(r.standard_normal(x.shape), x.dtype)
        return jax.numpy.zeros(x.shape, x.dtype)
    return [make(x) for x in flat]


def min_time(fns: Sequence[Callable], args, reps: int = 5, sample_seconds: float = 0.0) -> list[float]:
    """Min-of-`reps` wall time per function, after a warm-up call, interleaved so drift hits all alike.

    With `sample_seconds`, one sample of a fast function runs it back to back for about that long (at most
    1000 calls) and counts the mean call: a single 0.1 ms call is mostly dispatch and timer jitter (the
    regret benchmark timed one program 0.70x-1.42x of itself in one run, issue 37)."""
    first = []
    for f in fns:
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        first.append(time.perf_counter() - t0)
    calls = [max(1, min(1000, int(sample_seconds / max(t, 1e-7)))) for t in first]
    best = [np.inf] * len(fns)
    for _ in range(reps):
        for i, f in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls[i]):
                out = f(*args)
            jax.block_until_ready(out)
            best[i] = min(best[i], (time.perf_counter() - t0) / calls[i])
    return best


class Progress:
    """`with progress("compiling"):` prints 'jaxform: compiling ... 1.2 s' on stderr (or nothing if off)."""

    def __init__(self, enabled: bool = False, stream=None):
        self.enabled, self.stream = enabled, stream or sys.stderr

    def __call__(self, what: str):
        return _Step(self, what)


class _Step:
    def __init__(self, progress: Progress, what: str):
        self.p, self.what = progress, what

    def __enter__(self):
        self.t0 = time.perf_counter()
        if self.p.enabled:
            print(f"jaxform: {self.what} ...", end="", file=self.p.stream, flush=True)

    def __exit__(self, *exc):
        if self.p.enabled:
            print(f" {time.perf_counter() - self.t0:.1f} s" if exc[0] is None else " failed",
                  file=self.p.stream, flush=True)
