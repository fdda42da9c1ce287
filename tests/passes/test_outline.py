"""outline: nodes -> one closed_call; inline undoes it exactly."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.passes import inline, outline
from jaxform._jax import CALL_PRIMITIVE as CALL   # 'closed_call' (JAX 0.10), 'eval_jaxpr' (0.11+)
from jaxform.testing import assert_same

X, Y = jnp.linspace(0.1, 1.0, 3), jnp.linspace(-1.0, 1.0, 9).reshape(3, 3)
C = np.arange(3.0, dtype=np.float32)


def prog(x, y):
    a = jnp.sin(x) * 2.0
    b = a + C
    c = jnp.cos(b) @ y
    return c, a


def looped(x, y):
    def body(c, _):
        d = jnp.tanh(y @ c)
        return d * 0.5 + jnp.exp(d), None
    return lax.scan(body, x, None, length=3)[0]


def test_outline_makes_one_closed_call():
    g = jaxform.trace(prog, X, Y)
    call = outline(g, g.nodes[1:4], "middle")
    assert call.name == CALL and [n.name for n in g.nodes] == ["sin", CALL, "dot_general"]
    body = call.regions["body"]
    assert [n.name for n in body.nodes] == ["mul", "add", "cos"]
    assert len(call.inputs) == 2 and len(call.outputs) == 2      # reads sin, C; gives a (an output) and cos
    jaxpr = g.to_jaxpr()
    eqn = jaxpr.eqns[1]
    assert eqn.primitive is jax.extend.core.primitives.closed_call_p
    assert set(eqn.params) == {"call_jaxpr"} and isinstance(eqn.params["call_jaxpr"], jax.extend.core.ClosedJaxpr)
    assert eqn.params["call_jaxpr"].jaxpr.debug_info.func_name == "middle"
    jax.extend.core.check_jaxpr(jaxpr.jaxpr)
    assert_same(prog, jaxform.to_function(g), X, Y)


@pytest.mark.parametrize("span", [(0, 1), (1, 4), (0, 5), (3, 5), (2, 3)])
def test_round_trip_is_exact(span):
    g = jaxform.trace(prog, X, Y)
    before = str(g.to_jaxpr())
    outline(g, g.nodes[span[0]:span[1]])
    assert str(g.to_jaxpr()) != before
    inline(g)
    assert str(g.to_jaxpr()) == before


def test_round_trip_closed_consts():
    g = jaxform.trace(prog, X, Y)
    before = str(g.to_jaxpr())
    call = outline(g, g.nodes[1:4], close_consts=True)
    assert not g.consts and len(call.regions["body"].consts) == 1 and len(call.inputs) == 1
    assert CALL in str(g.to_jaxpr())
    assert_same(prog, jaxform.to_function(g), X, Y)
    inline(g)
    assert str(g.to_jaxpr()) == before


def test_const_used_outside_stays_an_operand():
    def f(x):
        return jnp.sin(x + C) * C
    g = jaxform.trace(f, X)
    call = outline(g, g.nodes[:2], close_consts=True)
    assert len(g.consts) == 1 and len(call.inputs) == 2 and not call.regions["body"].consts


def test_non_contiguous_round_trip_same_equations():
    def f(x, y):
        a = jnp.sin(x)
        b = jnp.cos(y)
        return a * 2.0, b
    g = jaxform.trace(f, X, Y)
    before = g.to_jaxpr()
    outline(g, [g.nodes[0], g.nodes[2]])          # sin and mul: not adjacent, but convex
    assert_same(f, jaxform.to_function(g), X, Y)
    inline(g)
    after = g.to_jaxpr()
    assert sorted(map(str, before.eqns)) == sorted(map(str, after.eqns))   # same equations, maybe reordered


def test_outline_inside_a_loop_body():
    g = jaxform.trace(looped, X, Y)
    body = g.nodes[0].regions["body"]
    before = str(g.to_jaxpr())
    outline(body, body.nodes[:2], "step")
    assert [n.name for n in body.nodes][0] == CALL
    assert_same(looped, jaxform.to_function(g), X, Y)
    inline(g)
    assert str(g.to_jaxpr()) == before


def test_outlined_program_optimizes():
    """Other passes see through an outlined call after inline (default pipeline starts with inline)."""
    g = jaxform.trace(looped, X, Y)
    body = g.nodes[0].regions["body"]
    outline(body, body.nodes[:2])
    f = jaxform.to_function(g)
    assert_same(looped, jaxform.optimize(f, strict=True), X, Y)


def test_not_convex_raises():
    g = jaxform.trace(prog, X, Y)
    with pytest.raises(ValueError, match="not convex"):
        outline(g, [g.nodes[1], g.nodes[3]])      # mul -> add (outside) -> cos


def test_foreign_node_and_empty_raise():
    g, h = jaxform.trace(prog, X, Y), jaxform.trace(prog, X, Y)
    with pytest.raises(ValueError, match="not a node of this graph"):
        outline(g, [h.nodes[0]])
    with pytest.raises(ValueError, match="no nodes"):
        outline(g, [])


def test_effectful_node_raises():
    def f(x):
        jax.debug.print("x={}", x)
        return x * 2
    g = jaxform.trace(f, X)
    eff = next(n for n in g.nodes if n.effects)
    with pytest.raises(ValueError, match="has effects"):
        outline(g, [eff])


def test_outline_then_hoist():
    """An outlined call whose operands are loop constants is invariant as a whole and leaves the loop."""
    def f(w, x):
        return lax.scan(lambda c, _: (jnp.tanh(jnp.exp(w) @ c), None), x, None, length=4)[0]
    g = jaxform.trace(f, Y, X)
    body = g.nodes[0].regions["body"]
    outline(body, [n for n in body.nodes if n.name == "exp"], "prep")
    jaxform.passes.hoist_loop_invariants(g)
    assert [n.name for n in g.nodes] == [CALL, "scan"]
    assert_same(f, jaxform.to_function(g), Y, X)
    assert isinstance(g, Graph)
