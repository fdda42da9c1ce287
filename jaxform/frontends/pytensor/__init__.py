"""PyTensor graphs → jaxform Graphs, built directly with the Builder (seed 004).

PyTensor already holds the whole program as a graph, so there is no need to
generate `jax.numpy` code and trace it again: each PyTensor op is turned into
JAX primitives by a converter from `CONVERTERS` (keyed by op class, looked up
along the MRO). Elementwise scalar ops, including the fused `Composite` ones,
come from `SCALARS`. An op with no converter falls back to PyTensor's own
JAX dispatch (`jax_funcify`), traced on the operand avals and spliced in, so
any graph PyTensor's JAX backend runs converts.

Shapes are static: inputs need static shapes (`pt.tensor(shape=(3, 4))`) or
`shapes=`; integer values that only depend on shapes (`x.shape[0] * 2`) are
folded at conversion time, so reshape/alloc targets become static too.

    import pytensor.tensor as pt
    from jaxform.frontends import pytensor as jpt
    x = pt.tensor("x", shape=(3, 4))
    f = jpt.function([x], pt.exp(x).sum())    # jitted; composes with grad/vmap

The package, one concept per module:

    registry.py   CONVERTERS / SCALARS, register, errors
    walk.py       Converter: one node at a time (fold, converter, fallback)
    scalar.py     scalar ops inside Elemwise / Composite
    tensor.py     tensor ops every graph has
    logp_ops.py   indexing, checks, linear algebra, Blockwise (PyMC's logp graphs)
    scan.py       OpFromGraph and Scan (inner graphs)
    ranges.py     value ranges that prove a parameter check holds
    ops.py        all converters, registered on first use
    op_table.py   what happens to each op PyTensor's JAX backend knows
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import jax

from ...ir import Graph
from ...ir.build import Builder
from ...ir.graph import gc_paused
from ...optimize import to_function
from ...passes.cse import cse
from .registry import CONVERTERS, SCALARS, ConversionError, Known, _check_dtype, register, register_scalar  # noqa: F401
from .walk import Converter, _jax_funcify, _static_shapes  # noqa: F401
from .ranges import _always_holds  # noqa: F401
from .ops import _ensure_registered
from .op_table import op_table  # noqa: F401

__all__ = ["to_graph", "function", "op_table", "register", "register_scalar", "ConversionError", "Converter",
           "CONVERTERS", "SCALARS"]


def to_graph(inputs: Sequence, outputs, *, shapes: dict | Sequence | None = None,
             rewrite: bool = True, stats: dict | None = None, checks: str = "ninf") -> Graph:
    """Convert the PyTensor graph from `inputs` to `outputs` into a jaxform Graph.

    shapes: static shapes for inputs whose PyTensor type leaves dims unknown, as a
        list (one per input, None to keep) or a dict keyed by variable or name.
    rewrite: first apply the rewrites PyTensor's JAX mode applies (fusion,
        canonicalization); False converts the graph as written.
    stats: if a dict, receives counts of nodes converted directly / by fallback / folded.
    checks: "ninf" turns the parameter checks PyMC marks replaceable into -inf where they fail (PyMC's C
        backend does); "drop" drops them all, as PyTensor's JAX backend (hence PyMC's JAX samplers) does.
    Returns a Graph whose `to_function` takes the inputs in order and returns one
    array (single output) or a list.
    """
    from pytensor.graph.fg import FunctionGraph
    import pytensor.tensor as pt
    _ensure_registered()
    if checks not in ("ninf", "drop"):
        raise ValueError(f"jaxform.frontends.pytensor.to_graph: checks must be 'ninf' or 'drop', got {checks!r}")

    single = not isinstance(outputs, (list, tuple))
    outs = [outputs] if single else list(outputs)
    inputs = list(inputs)
    # the graph keeps its inputs' types (PyTensor's rewrites need no static shapes, and re-typing them
    # cloned the whole graph once more); the static shapes are the converted inputs'
    static = _static_shapes(inputs, shapes)
    t0 = time.perf_counter()
    with gc_paused():  # no cyclic garbage is made here; full collections over PyTensor's graph were 1/3 of it
        fg = FunctionGraph(inputs, [pt.as_tensor_variable(o) for o in outs], clone=rewrite)
    t1 = time.perf_counter()
    if rewrite:  # rewrites work in place on a clone; without them the graph is only read (clients live in fg)
        from pytensor.compile.mode import get_mode
        get_mode("JAX").optimizer.rewrite(fg)
    t2 = time.perf_counter()
    with gc_paused():
        b = Builder()
        cv = Converter(b, checks)
        for var, shape in zip(fg.inputs, static):
            _check_dtype(var.type.dtype, f"PyTensor input {var.name or var}")
            cv.env[var] = b.arg(shape, var.type.dtype, name=var.name)
        for node in fg.toposort():
            cv.convert(node)
        results = [cv.value(cv.get(o)) for o in fg.outputs]
        g = b.build(results[0] if single else results)
        if not rewrite:  # PyTensor's graph repeats subexpressions (log(sigma) per term) that its merge rewrite joins
            cse(g)
    if stats is not None:
        stats.update(direct=cv.direct, fallback=cv.fallback, folded=cv.folded, fallback_ops=cv.fallback_ops,
                     nodes=len(fg.apply_nodes), time_graph_s=t1 - t0, time_rewrite_s=t2 - t1,
                     time_convert_s=time.perf_counter() - t2)
    return g


def function(inputs: Sequence, outputs, *, shapes: dict | Sequence | None = None, rewrite: bool = True,
             jit: bool = True) -> Callable:
    """A JAX callable for the PyTensor graph (jitted unless jit=False); composes with grad/vmap."""
    f = to_function(to_graph(inputs, outputs, shapes=shapes, rewrite=rewrite))
    return jax.jit(f) if jit else f
