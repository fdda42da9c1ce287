"""ScanLoop: the one description of a scan's anatomy that loop passes edit through."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.ir import ScanLoop


def _program(w, xs):
    def step(h, x):
        u = jnp.cos(x) * 2.0          # carry-independent
        h = jnp.tanh(h * w + u)
        return h, h
    return lax.scan(step, jnp.zeros(3), xs)


def _scan(g):
    return next(n for n in g.nodes if n.name == "scan")


def test_roles_and_carry_dependence():
    g = jaxform.trace(_program, 0.5, np.ones((4, 3), np.float32))
    loop = ScanLoop(_scan(g))
    assert (loop.num_consts, loop.num_carry, loop.length, loop.reverse) == (1, 1, 4, False)
    assert len(loop.xs) == len(loop.body_xs) == 1 and len(loop.ys) == 1
    dep = loop.carry_dependent()
    names = {n.name: all(o.id in dep for o in n.outputs) for n in loop.body.nodes}
    assert names["cos"] is False and names["tanh"] is True


def test_add_const_xs_carry_ys_round_trips():
    w, xs = 0.5, np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    g = jaxform.trace(_program, w, xs)
    node = _scan(g)
    loop = ScanLoop(node)
    k = g.add("broadcast_in_dim", [g.inputs[0]], {"shape": (3,), "broadcast_dimensions": ()}).outputs[0]
    (k_in,) = loop.add_consts([k])
    (x_in,) = loop.add_xs([g.inputs[1]])
    zero = g.add("broadcast_in_dim", [jaxform.Graph.literal(0.0, np.float32)],
                 {"shape": (3,), "broadcast_dimensions": ()}).outputs[0]
    acc = loop.add_carry(zero)
    step = loop.body.add("mul", [x_in, k_in]).outputs[0]
    acc.set_next(loop.body.add("add", [acc.inner, step]).outputs[0])
    (stacked,) = loop.add_ys([step])
    g.set_outputs(list(g.outputs) + [acc.result, stacked])
    jaxform._jax.check_jaxpr(g.to_jaxpr())
    h, ys, total, per_step = g.evaluate(w, xs)
    np.testing.assert_allclose(total, (xs * w).sum(0), rtol=1e-6)
    np.testing.assert_allclose(per_step, xs * w, rtol=1e-6)
    h0, ys0 = _program(w, xs)
    np.testing.assert_allclose(h, h0, rtol=1e-6)
    np.testing.assert_allclose(ys, ys0, rtol=1e-6)
