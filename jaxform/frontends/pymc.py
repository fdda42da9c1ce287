"""PyMC models → JAX logp functions, built as jaxprs by the PyTensor front end.

PyMC's JAX samplers call `pymc.sampling.jax.get_jaxified_graph`, which rewrites the
graph with PyTensor's JAX mode and re-traces `jax.numpy` code op by op. Here the
model's logp graph is converted straight into lax equations instead
(`jaxform.frontends.pytensor`), with PyMC's plumbing done automatically:

* shared variables (`pm.Data`, coords-sized dims) become constants, as in PyMC's own JAX path;
* value variables whose PyTensor type leaves a dim unknown get the static shape of
  the model's initial point (or, through `get_jaxified_graph`, of the arrays it is called with).

    from jaxform.frontends import pymc as jpm
    logp = jpm.logp_fn(model)                        # f({value var name: array}) -> scalar
    vg = jpm.value_and_grad_fn(model)                # f(point) -> (logp, {name: dlogp})
    with jpm.jaxify():                               # pm.sample(nuts_sampler="numpyro") uses jaxform
        idata = pm.sample(nuts_sampler="numpyro")

PyMC is an optional dependency: importing this module does not import it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..ir import Graph
from ..optimize import to_function
from . import pytensor as jpt


def _replace_shared(outputs: Sequence) -> list:
    """Shared variables (pm.Data, coords) → constants of their current value, like PyMC's JAX path.

    A shared variable with a default update (an RNG state) cannot be frozen: that is an error.
    """
    from pytensor.compile.sharedvalue import SharedVariable
    try:
        from pytensor.graph.traversal import graph_inputs
    except ImportError:  # pytensor < 2.32
        from pytensor.graph.basic import graph_inputs
    from pytensor.graph.replace import clone_replace
    import pytensor.tensor as pt
    shared = [v for v in graph_inputs(outputs) if isinstance(v, SharedVariable)]
    if not shared:
        return list(outputs)
    for v in shared:
        if getattr(v, "default_update", None) is not None:
            raise jpt.ConversionError(f"jaxform: the graph uses shared variable {v.name or v} that has a default "
                                      "update (random state); a logp graph must not draw random numbers")
    return clone_replace(list(outputs), replace={v: pt.constant(v.get_value(borrow=True), name=v.name,
                                                                 dtype=v.type.dtype) for v in shared})


def model_graph(model, outputs=None, *, jacobian: bool = True, rewrite: bool = True,
                stats: dict | None = None, checks: str = "ninf") -> tuple[Graph, list[str]]:
    """The jaxform Graph of a model's joint logp (or `outputs`) over its value variables.

    Returns (graph, names): the graph takes the value variables in `names` order.
    stats: if a dict, receives conversion counts (`fallback` is 0 when every op converted
    natively) and `time_rewrite_s` / `time_convert_s`. checks: "ninf" (-inf where a parameter check fails,
    as PyMC's C backend) or "drop" (as PyMC's JAX samplers).
    """
    outs = [model.logp(jacobian=jacobian)] if outputs is None else list(outputs)
    inputs = list(model.value_vars)
    shapes = _value_shapes(model, inputs)
    outs = _replace_shared(outs)
    g = jpt.to_graph(inputs, outs[0] if outputs is None else outs, shapes=shapes, rewrite=rewrite, stats=stats,
                     checks=checks)
    return g, [v.name for v in inputs]


def _value_shapes(model, inputs) -> list[tuple]:
    """Static shapes of the value variables: their types' when fully known, else PyMC's shape graph's
    (`eval_rv_shapes`, a small function of shapes: 5 ms where the initial point took 9-21 ms of a 45 ms
    conversion of the 8k-row hierarchical logistic), else the initial point's."""
    known = [tuple(v.type.shape) for v in inputs]
    if all(None not in s for s in known):
        return known
    try:
        shapes = model.eval_rv_shapes()
        return [tuple(int(d) for d in shapes[v.name]) for v in inputs]
    except Exception:   # noqa: BLE001 (a model PyMC's shape graph cannot evaluate: the initial point can)
        point = model.initial_point()
        return [np.shape(point[v.name]) for v in inputs]


def logp_fn(model, *, jacobian: bool = True, rewrite: bool = True, jit: bool = True) -> Callable:
    """f(point) -> the model's joint logp, for `point` a dict {value variable name: array}.

    Composes with jax.grad/vmap; values have the model's initial-point shapes.
    """
    g, names = model_graph(model, jacobian=jacobian, rewrite=rewrite)
    flat = to_function(g)

    def logp(point: dict) -> jax.Array:
        return flat(*[point[n] for n in names])
    logp.names = names
    return jax.jit(logp) if jit else logp


def value_and_grad_fn(model, *, jacobian: bool = True, rewrite: bool = True, jit: bool = True) -> Callable:
    """f(point) -> (logp, {name: dlogp/dvalue}) by jax.value_and_grad of `logp_fn`."""
    vg = jax.value_and_grad(logp_fn(model, jacobian=jacobian, rewrite=rewrite, jit=False))
    return jax.jit(vg) if jit else vg


def get_jaxified_graph(inputs=None, outputs=None, *, rewrite: bool = True, checks: str = "drop") -> Callable:
    """Drop-in for `pymc.sampling.jax.get_jaxified_graph`: f(*input values) -> list of outputs.

    Shapes are read from the arguments at call (trace) time and each shape set is
    converted once, so value variables with unknown dims need no declaration.
    checks="drop" (default): parameter checks are dropped, as in the function this replaces (PyTensor's
    JAX backend drops them; a select per element costs up to 1.5x on small models); "ninf" gives -inf
    where one fails, as `logp_fn` and PyMC's C backend do.
    """
    inputs, outputs = list(inputs), _replace_shared(list(outputs))
    cache: dict[tuple, Callable] = {}

    def fn(*args):
        key = tuple((tuple(np.shape(a)), str(a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype)) for a in args)
        f = cache.get(key)
        if f is None:
            g = jpt.to_graph(inputs, list(outputs), shapes=[k[0] for k in key], rewrite=rewrite, checks=checks)
            f = cache[key] = to_function(g)
        out = f(*args)
        return list(out) if isinstance(out, (list, tuple)) else [out]
    return fn


@contextlib.contextmanager
def jaxify(*, rewrite: bool = True, checks: str = "drop"):
    """Within the block, PyMC's JAX samplers (numpyro, blackjax) build their logp with jaxform.

    Patches `pymc.sampling.jax.get_jaxified_graph`; restores it on exit. checks: see `get_jaxified_graph`.
    """
    import pymc.sampling.jax as pmjax
    old = pmjax.get_jaxified_graph
    pmjax.get_jaxified_graph = lambda inputs=None, outputs=None: get_jaxified_graph(inputs, outputs,
                                                                                     rewrite=rewrite, checks=checks)
    try:
        yield
    finally:
        pmjax.get_jaxified_graph = old


def conversion_times(model, *, rewrite: bool = True) -> dict[str, float]:
    """Seconds spent building PyMC's logp graph (with its shared variables frozen), finding static shapes,
    in PyTensor's rewrites, and in jaxform's conversion (everything else in `to_graph`)."""
    t0 = time.perf_counter()
    out = _replace_shared([model.logp()])
    t1 = time.perf_counter()
    stats: dict[str, Any] = {}
    shapes = _value_shapes(model, list(model.value_vars))
    t2 = time.perf_counter()
    jpt.to_graph(list(model.value_vars), out, shapes=shapes, rewrite=rewrite, stats=stats)
    t3 = time.perf_counter()
    return {"logp_graph": t1 - t0, "shapes": t2 - t1, "rewrite": stats["time_rewrite_s"],
            "convert": t3 - t2 - stats["time_rewrite_s"], "total": t3 - t0}
