"""Differential checks: is a transformed program the same as the original?

`assert_same(fn, transformed, *args)` compares values and gradients, eagerly,
under `jit` and under `vmap`; `assert_pass_ok(p, fn, *args)` also type-checks
the graph a pass emits. Use them to test your own rules and passes.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from . import _jax
from .optimize import run_passes, verify


def _tol(x, rtol, atol):
    if rtol is not None:
        return rtol, atol
    d = jnp.result_type(x)
    return (1e-5, 1e-5) if d in (jnp.float32, jnp.complex64) else (1e-2, 1e-2) if jnp.dtype(d).itemsize <= 2 \
        else (1e-10, 1e-10)


def _close(a, b, what: str, rtol=None, atol=None) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, f"{what}: output structure differs: {ta} vs {tb}"
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        r, t = _tol(x, rtol, atol)
        if np.issubdtype(x.dtype, np.inexact):
            np.testing.assert_allclose(x, y, rtol=r, atol=t, err_msg=what)
        else:
            np.testing.assert_array_equal(x, y, err_msg=what)


def _float_argnums(args):
    return tuple(i for i, a in enumerate(args)
                 if all(jnp.issubdtype(jnp.result_type(l), jnp.floating) for l in jax.tree_util.tree_leaves(a))
                 and jax.tree_util.tree_leaves(a))


def _scalar_loss(f):
    def loss(*args):
        outs = jax.tree_util.tree_leaves(f(*args))
        return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in outs
                   if jnp.issubdtype(o.dtype, jnp.inexact))
    return loss


def assert_same(fn: Callable, transformed: Callable, *args, grad: bool = True, vmap: bool = True,
                jit: bool = True, rtol: float | None = None, atol: float | None = None) -> None:
    """Values (eager and jitted), gradients w.r.t. float args, and vmap over a stacked batch agree."""
    _close(fn(*args), transformed(*args), "values", rtol, atol)
    if jit:
        _close(jax.jit(fn)(*args), jax.jit(transformed)(*args), "values under jit", rtol, atol)
    argnums = _float_argnums(args)
    if grad and argnums:
        g = lambda f: jax.jit(jax.grad(_scalar_loss(f), argnums=argnums))(*args)
        _close(g(fn), g(transformed), "gradients", rtol, atol)
    if vmap:
        stacked = [jax.tree_util.tree_map(lambda x: jnp.stack([x, x * 0.5 if jnp.issubdtype(
            jnp.result_type(x), jnp.floating) else x]), a) for a in args]
        v = lambda f: jax.jit(jax.vmap(f))(*stacked)
        _close(v(fn), v(transformed), "values under vmap", rtol, atol)


def assert_pass_ok(p, fn: Callable, *args, **kwargs):
    """Run pass `p` on `fn`'s graph; check_jaxpr the result and compare with `assert_same`.

    Returns the transformed ClosedJaxpr so tests can also assert the pass did something.
    """
    closed = jax.make_jaxpr(fn)(*args)
    out = run_passes(closed, [p], strict=True)
    verify(out, closed)
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, *args))

    def transformed(*a):
        return jax.tree_util.tree_unflatten(out_tree, _jax.eval_jaxpr(out, *jax.tree_util.tree_leaves(a)))

    assert_same(fn, transformed, *args, **kwargs)
    return out
