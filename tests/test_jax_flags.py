"""JAX's opt-in flags `jax_scan3`, `jax_remat3`, `jax_custom_vjp3`: programs traced with one on.

The flags swap scan, checkpoint and custom_vjp for new primitives (`Scan3` with the carry held in
Refs, `RematTraced`, `CustomVJPTraced`). jaxform does not know their regions, so they stay opaque:
the round trip keeps them as they are, passes optimize around them, and the results must still be
the same values (eagerly, under jit and vmap) and, where JAX can differentiate them, gradients.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.ir import Graph
from jaxform.testing import assert_same

FLAGS = ("jax_scan3", "jax_remat3", "jax_custom_vjp3")
pytestmark = pytest.mark.skipif(not all(hasattr(jax.config, f) for f in FLAGS),
                                reason="this JAX lacks the opt-in flags")

W = jnp.linspace(-0.5, 0.5, 16).reshape(4, 4)
X = jnp.linspace(0.1, 1.0, 4)
XS = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def rnn(W, x, xs):
    """A scan whose body recomputes a loop invariant (W @ W.T), plus a common subexpression."""
    def body(c, xt):
        h = jnp.tanh((W @ W.T) @ c + xt)
        return h, jnp.sin(h) + jnp.sin(h)
    c, ys = lax.scan(body, x, xs)
    return c.sum() + ys.sum()


def remat(W, x, xs):
    f = jax.checkpoint(lambda W, x: jnp.sin(W @ x) * jnp.sin(W @ x))
    return jnp.sum(f(W, x)) + xs.sum()


@jax.custom_vjp
def _scaled(x):
    return 3.0 * jnp.sin(x)


_scaled.defvjp(lambda x: (_scaled(x), jnp.cos(x)), lambda c, g: (3.0 * c * g,))


def custom(W, x, xs):
    return jnp.sum(_scaled(W @ x) + jnp.exp(x) * jnp.exp(x)) + xs.sum()


# (flag, program, the new primitive as printed, can JAX 0.12 differentiate and vmap it)
CASES = [("jax_scan3", rnn, "Scan3", False), ("jax_remat3", remat, "RematTraced", True),
         ("jax_custom_vjp3", custom, "CustomVJPTraced", True)]
IDS = [c[0] for c in CASES]


class _flag:
    """Turn one JAX config flag on for a block."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.old = getattr(jax.config, self.name)
        jax.config.update(self.name, True)

    def __exit__(self, *exc):
        jax.config.update(self.name, self.old)


@pytest.mark.parametrize("name, fn, prim, grad", CASES, ids=IDS)
def test_round_trip_keeps_the_new_primitive(name, fn, prim, grad):
    with _flag(name):
        closed = jax.make_jaxpr(fn)(W, X, XS)
        if prim not in str(closed):   # a `call_hi_primitive` equation; on 0.12 every flag makes one
            assert _jax.JAX_VERSION < (0, 12), f"{name} did not change the jaxpr"
            pytest.skip(f"{name} does not change this program on JAX {jax.__version__}")
        out = Graph.from_jaxpr(closed).to_jaxpr()
        jax.extend.core.check_jaxpr(out.jaxpr)
        assert str(out) == str(closed)
        g = jaxform.trace(fn, W, X, XS)
        assert_same(fn, jaxform.to_function(g), W, X, XS, grad=grad, vmap=grad)


@pytest.mark.parametrize("name, fn, prim, grad", CASES, ids=IDS)
def test_default_pipeline(name, fn, prim, grad):
    with _flag(name):
        opt = jaxform.optimize(fn)
        assert_same(fn, opt, W, X, XS, grad=grad, vmap=grad)
        np.testing.assert_allclose(opt(W, X, XS), fn(W, X, XS), rtol=1e-6)


@pytest.mark.parametrize("name, fn, prim, grad", [c for c in CASES if c[3]], ids=[c[0] for c in CASES if c[3]])
def test_optimize_gradient(name, fn, prim, grad):
    with _flag(name):
        g = jax.grad(fn, argnums=(0, 1))
        got, want = jaxform.optimize(g)(W, X, XS), g(W, X, XS)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_scan3_gradient_and_vmap_are_jax_limitations():
    """JAX 0.12.0 itself can neither differentiate nor vmap Scan3 (no `vjp_fwd`, no `batch`): those checks
    are off for it above. This fails once JAX can, as a reminder to turn them on."""
    with _flag("jax_scan3"):
        with pytest.raises(NotImplementedError, match="vjp_fwd"):
            jax.make_jaxpr(jax.grad(rnn))(W, X, XS)
        with pytest.raises(NotImplementedError, match="batch"):
            jax.make_jaxpr(jax.vmap(rnn, (None, None, 0)))(W, X, jnp.stack([XS, XS]))
