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
from .optimize import optimize, run_passes, verify


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


# ---- a pass's checks for free ------------------------------------------------------------------------

def loop_programs() -> dict:
    """Small loop programs that have found bugs in loop passes, `name -> (fn, args[, assert_same options])`: a scan RNN and its
    loss, a reverse scan, lengths 0 and 1, an integer body, float16 with float32 accumulation, a
    callback in the body (order and count), RNG, a `custom_jvp` rule, weak-typed scalars, a while loop."""
    from jax import lax
    r = np.random.default_rng(0)
    a = lambda *s: jnp.asarray(r.standard_normal(s) * 0.3, jnp.float32)  # noqa: E731
    w, xs = a(8, 8), a(12, 4, 8)

    def rnn(w, xs, reverse=False):
        return lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(xs.shape[1:]), xs, reverse=reverse)[1]

    @jax.custom_jvp
    def soft(x):
        return jnp.log1p(jnp.exp(x))
    soft.defjvp(lambda p, t: (soft(p[0]), t[0] * jax.nn.sigmoid(p[0])))

    def cb_body(h, x):
        jax.debug.callback(lambda v: None, x[0, 0], ordered=True)
        return h + jnp.sin(x), None

    return {
        "rnn_mse": (lambda w, xs: jnp.mean((rnn(w, xs) - 0.1) ** 2), (w, xs)),
        "rnn_reverse": (lambda w, xs: jnp.sum(rnn(w, xs, True) ** 2), (w, xs)),
        "length0": (lambda w, xs: jnp.sum(rnn(w, xs[:0]) ** 2) + jnp.sum(w), (w, xs)),
        "length1": (lambda w, xs: jnp.max(rnn(w, xs[:1])), (w, xs)),
        "integer_body": (lambda n: lax.scan(lambda c, i: (c * 3 + i, c // 2), n, jnp.arange(7))[1].sum(),
                         (jnp.int32(5),)),
        "float16": (lambda w, xs: jnp.sum(rnn(w.astype(jnp.float16), xs.astype(jnp.float16)),
                                          dtype=jnp.float32), (w, xs)),
        "callback": (lambda w, xs: lax.scan(cb_body, w[:4], xs)[0].sum(), (w, xs)),
        "rng": (lambda w, xs: lax.scan(lambda k, x: (jax.random.split(k)[0], x * jax.random.normal(k, x.shape)),
                                       jax.random.key(0), xs)[1].sum() + w.sum(), (w, xs)),
        "custom_jvp": (lambda w, xs: jnp.sum(lax.scan(lambda h, x: (soft(h @ w + x),) * 2, xs[0], xs)[1]),
                       (w, xs)),
        "weak_scalar": (lambda w, xs: lax.scan(lambda c, x: (c * 0.5 + jnp.sum(x), c), 1.0, xs)[1].sum(), (w, xs)),
        "while": (lambda w, xs: lax.while_loop(lambda c: c[1] < 5, lambda c: (jnp.tanh(c[0] @ w), c[1] + 1),
                                               (xs[0], 0))[0].sum(), (w, xs), {"grad": False}),
    }


def check_pass(p, programs: dict | None = None, **kwargs) -> dict:
    """`assert_pass_ok(p, ...)` over `loop_programs()` (or `programs`), and the same through a planned
    pipeline (`optimize(f, passes=[p], plan=True)`, grad and vmap included): what every jaxform loop pass
    must survive. Returns `name -> True if p changed that program`."""
    changed = {}
    for name, (fn, args, *opts) in (programs or loop_programs()).items():
        kw = {"grad": bool(_float_argnums(args)), **(opts[0] if opts else {}), **kwargs}
        try:
            out = assert_pass_ok(p, fn, *args, **kw)
        except AssertionError as e:
            raise AssertionError(f"{getattr(p, 'pass_name', p)} on {name}: {e}") from None
        changed[name] = str(out) != str(run_passes(jax.make_jaxpr(fn)(*args), []))
        assert_same(fn, optimize(fn, passes=[p, "dce"], plan=True), *args, **{**kw, "vmap": False, "jit": False})
    return changed
