"""The version adapters in jaxform/_jax.py: passes see one param layout, JAX gets its own back.

Run on every supported JAX (0.10, 0.11, 0.12): the same assertions hold on each.
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.ir import Graph
from jaxform.passes import inline, outline
from jaxform.testing import assert_same

W = jnp.linspace(-0.5, 0.5, 16).reshape(4, 4)
XS = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)


def rnn(W, xs):
    def body(c, x):
        h = jnp.tanh(W @ c + x)
        return h, h * 2.0
    c, ys = lax.scan(body, jnp.zeros(4), xs)
    return c.sum() + ys.sum()


def scans(closed):
    return [n for n, _ in Graph.from_jaxpr(closed).walk() if n.name == "scan"]


def test_scan_params_are_canonical():
    (scan,) = scans(jax.make_jaxpr(rnn)(W, XS))
    assert scan.params["num_consts"] == 1 and scan.params["num_carry"] == 1   # W | c | x
    assert "ft_in" not in scan.params and "ft_out" not in scan.params
    assert {"length", "reverse", "unroll"} <= set(scan.params)


def test_round_trip_is_exact_with_nested_scan_layouts():
    """grad of a scan: JAX 0.11+ nests the transposed scan's FlatTrees; the round trip keeps them."""
    closed = jax.make_jaxpr(jax.grad(rnn))(W, XS)
    assert len(scans(closed)) == 2
    out = Graph.from_jaxpr(closed).to_jaxpr()
    jax.extend.core.check_jaxpr(out.jaxpr)
    assert str(out) == str(closed)


def test_changed_counts_rebuild_the_jax_layout():
    """A pass that moves a carry into the consts (here by hand) gets a valid equation on every version."""
    g = jaxform.trace(rnn, W, XS)
    (scan,) = [n for n in g.nodes if n.name == "scan"]
    p = scan.full_params()   # in the running JAX's layout
    assert ("ft_in" in p) == (_jax.JAX_VERSION >= (0, 11))
    scan.params["num_consts"], scan.params["num_carry"] = 0, 2   # wrong on purpose: W is no carry
    bad = scan.full_params()
    if "ft_in" in bad:
        consts, carry, xs = bad["ft_in"].unpack()
        assert (len(consts), len(carry), len(xs)) == (0, 2, 1)
    scan.params["num_consts"], scan.params["num_carry"] = 1, 1
    out = g.to_jaxpr()
    jax.extend.core.check_jaxpr(out.jaxpr)
    assert_same(rnn, jaxform.to_function(g), W, XS)


def test_call_primitive_round_trips_and_inlines():
    """`closed_call` (0.10) / `eval_jaxpr` (0.11+): a region on every version; outline makes one, inline undoes it."""
    def f(x):
        return jnp.cos(jnp.sin(x) * 2.0) + 1.0
    x = jnp.linspace(0.0, 1.0, 5)
    g = jaxform.trace(f, x)
    before = str(g.to_jaxpr())
    outline(g, g.nodes[:2])
    closed = g.to_jaxpr()
    assert closed.eqns[0].primitive.name == _jax.CALL_PRIMITIVE
    g2 = Graph.from_jaxpr(closed)
    assert "body" in g2.nodes[0].regions
    assert str(g2.to_jaxpr()) == str(closed)
    assert_same(f, jaxform.to_function(g), x)
    inline(g2)
    assert str(g2.to_jaxpr()) == before


def test_closed_jaxpr_keeps_consts_as_consts():
    c = np.arange(4.0, dtype=np.float32)
    closed = jax.make_jaxpr(lambda x: x * c + jnp.asarray(c).sum())(jnp.ones(4))
    g = Graph.from_jaxpr(closed)
    out = g.to_jaxpr()
    assert len(out.consts) == len(g.consts) and len(out.jaxpr.invars) == 1
    np.testing.assert_allclose(jax.extend.core.jaxpr_as_fun(out)(jnp.ones(4))[0], c + c.sum())
