"""inline inside bodies that cannot hold constants (issue 15, finding 13).

A `jax.checkpoint` body is an open jaxpr: a `jit` inside it that closes over a
NumPy array cannot be spliced in (its constant has nowhere to go). Before, the
pass failed and was skipped with a warning; now that call stays a call and the
rest is inlined.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import jaxform
from jaxform.testing import assert_same

C = np.arange(3.0, dtype=np.float32)


@jax.jit
def scaled(x):
    return jnp.sin(x) * C


@jax.jit
def plain(x):
    return jnp.cos(x) * 2.0


def remat_of_jit_with_numpy_const(x):
    return jax.checkpoint(lambda x: (scaled(x) + plain(x)).sum())(x)


def test_inline_in_checkpoint_of_jit_closing_over_numpy_constant():
    x = jnp.arange(1.0, 4.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = jaxform.optimize(remat_of_jit_with_numpy_const, passes=["inline"], strict=True)
        assert_same(remat_of_jit_with_numpy_const, opt, x, vmap=False)
    g = jaxform.passes.inline(jaxform.trace(remat_of_jit_with_numpy_const, x))
    body = next(n for n in g.nodes if n.name in ("checkpoint", "remat2")).regions["body"]
    calls = [n for n in body.nodes if n.name in ("jit", "pjit")]
    assert len(calls) == 1 and calls[0].regions["body"].consts     # the one with a constant stays
    assert "cos" in [n.name for n in body.nodes]                     # the other one was inlined
