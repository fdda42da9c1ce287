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


# ---- the call's name stack stays on the equations spliced out of it ----

_layer = jax.jit(lambda h, w: jnp.tanh(h @ w))


def _jitted_mlp(params, x):
    h = x
    for w in params:
        h = _layer(h, w)
    return jnp.mean(h ** 2)


def test_inlined_transposed_call_is_still_a_backward():
    """`jax.grad` of jitted layers transposes each call: JAX names the call "transpose(jvp(...))" and not the
    equations in its body. Inlined without the call's name stack, the gradient was no longer told for one
    (`recompute.is_gradient`), and `optimize(jax.grad(f), memory=60%)` left it at plain's bytes, warned, after
    19 compiles (JAX 0.12): the budget judged it as a forward whose own gradient nobody runs."""
    from jaxform.passes.recompute import is_gradient
    r = np.random.RandomState(0)
    params = [jnp.asarray(r.randn(16, 16) * 0.1, np.float32) for _ in range(3)]
    x = jnp.asarray(r.randn(4, 16), np.float32)
    traced = jax.make_jaxpr(jax.grad(_jitted_mlp))(params, x)
    inlined = jaxform.passes.inline(jaxform.ir.Graph.from_jaxpr(traced))
    assert is_gradient(traced) and is_gradient(inlined.to_jaxpr())
    outer = [str(e.source_info.name_stack) for e in traced.jaxpr.eqns if e.primitive.name in ("pjit", "jit")]
    assert any("transpose(" in s for s in outer)
    assert any("transpose(" in str(n.source_info.name_stack) for n in inlined.nodes if n.name == "dot_general")
