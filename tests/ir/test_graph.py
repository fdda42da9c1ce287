"""The Graph API: use lists, editing, literals, source info, printing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph, diff, format_graph, scan_roles


def prog(x, y):
    a = jnp.sin(x) * 2.0
    return a + y, a


X, Y = jnp.arange(3.0), jnp.ones(3)


def test_use_lists():
    g = jaxform.trace(prog, X, Y)
    x, y = g.inputs
    sin = g.nodes[0]
    assert sin.name == "sin" and x.users == [sin]
    a = g.nodes[1].outputs[0]
    assert {n.name for n in a.users} == {"add"} and a.is_output
    lit = g.nodes[1].inputs[1]
    assert lit.is_literal and float(lit.literal) == 2.0 and not lit.uses == []


def test_replace_uses_and_remove():
    g = jaxform.trace(prog, X, Y)
    sin, mul = g.nodes[0], g.nodes[1]
    cos = g.add("cos", [g.inputs[0]])
    g.replace_uses(sin.outputs[0], cos.outputs[0])
    assert not sin.outputs[0].uses
    g.remove(sin)
    assert sin not in g.nodes and mul.inputs[0] is cos.outputs[0]
    out = jaxform.to_function(g)(X, Y)
    np.testing.assert_allclose(out[0], jnp.cos(X) * 2 + Y)
    with pytest.raises(AssertionError, match="still used"):
        g.remove(cos)


def test_add_node_out_of_order_is_emitted_after_producers():
    g = jaxform.trace(prog, X, Y)
    neg = g.add("neg", [g.outputs[0]])           # appended after everything
    g._nodes.insert(0, g._nodes.pop())          # ... and moved to the front
    g.set_output(1, neg.outputs[0])
    out = jaxform.to_function(g)(X, Y)
    np.testing.assert_allclose(out[1], -(jnp.sin(X) * 2 + Y))


def test_copy_node_of_a_call_with_a_custom_rule():
    """`copy_node` repeats a call-like node (relu is a custom_jvp_call, which has no abstract evaluation)
    on other inputs: the same rule object, values and gradients."""
    g = jaxform.trace(lambda x, y: jax.nn.relu(x) * y, X - 1.0, Y)
    call = next(n for n in g.nodes if n.name == "custom_jvp_call")
    twin = g.copy_node(call, [g.inputs[1]])
    assert twin.regions == call.regions and twin.params == call.params and twin is not call
    assert twin.outputs[0].aval == call.outputs[0].aval
    g.add_output(twin.outputs[0])
    f = g.evaluate
    out = f(X - 1.0, Y - 2.0)
    np.testing.assert_array_equal(out[1], jax.nn.relu(Y - 2.0))
    np.testing.assert_array_equal(jax.grad(lambda y: f(X, y)[1].sum())(Y - 0.5), jax.grad(
        lambda y: jax.nn.relu(y).sum())(Y - 0.5))


def test_abstract_eval_errors_on_bad_shapes():
    g = jaxform.trace(prog, X, Y)
    with pytest.raises(TypeError):
        g.add("add", [g.inputs[0], g.add_input(jax.core.ShapedArray((4,), jnp.float32))])


def test_source_info_points_at_user_line():
    g = jaxform.trace(prog, X, Y)
    assert "test_graph.py" in g.nodes[0].location()


def test_regions_and_roles():
    def f(xs):
        return lax.scan(lambda c, x: (c + x, c * x), 0.0, xs)
    g = jaxform.trace(f, jnp.arange(4.0))
    (scan,) = g.nodes
    body = scan.regions["body"]
    r = scan_roles(scan.params)
    assert len(body.inputs[r["carry"]]) == 1 and len(body.outputs[r["ys"]]) == 1
    assert "jaxpr" not in scan.params and "jaxpr" in scan.full_params()
    names = [n.name for n, _ in g.walk()]
    assert names[0] == "scan" and {"add", "mul"} <= set(names[1:])


def test_unknown_higher_order_primitive_stays_opaque():
    def f(x):
        return jax.pure_callback(lambda a: np.sin(a), jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    g = jaxform.trace(f, X)
    assert g.nodes[0].regions == {}
    np.testing.assert_allclose(jaxform.to_function(g)(X), np.sin(X), rtol=1e-6)


def test_consts_survive():
    c = jnp.arange(3.0) * 7
    g = jaxform.trace(lambda x: x * c, X)
    assert len(g.consts) == 1 and g.consts[0].is_const
    np.testing.assert_allclose(jaxform.to_function(g)(X), X * c)


def test_printing_and_diff():
    g = jaxform.trace(prog, X, Y)
    names = {}
    before = format_graph(g, names)
    assert "sin" in before and "mul" in before and before.startswith("{ lambda")
    jaxform.passes.cse(g)
    g.add("cos", [g.inputs[0]])
    after = format_graph(g, names)
    d = diff(before, after)
    assert "+" in d and "cos" in d and diff(before, before) == ""
    assert str(g) == format_graph(g)


def test_optional_params_table_leaks_nothing_into_an_active_trace():
    """The table is built by tracing lax calls; built first inside a user's trace it must add no equations."""
    from jaxform import _jax
    table = _jax._optional_params.__wrapped__

    def f(x):
        assert "sin" in table()
        return jnp.sin(x)
    assert [e.primitive.name for e in jax.make_jaxpr(f)(1.0).eqns] == ["sin"]


def test_literals_print_as_plain_numbers():
    text = str(jaxform.trace(lambda x, i: (x + 1, i * 3), jnp.ones(3, jnp.int32), 2))
    assert "add a 1:i32[]" in text and "mul b 3:i32[]" in text and "Typed" not in text


def _jit_bodies(j):
    for e in j.eqns:
        if e.primitive.name == "jit":
            yield e.params["jaxpr"]
            yield from _jit_bodies(e.params["jaxpr"].jaxpr)


def test_round_trip_keeps_shared_bodies_shared():
    """Call sites sharing one jit body get one editable sub-Graph each, but come back sharing it:
    otherwise nested calls multiply the program (3 distinct bodies came back as 258)."""
    k = jax.jit(lambda x: jnp.sin(x) * 2)
    h = jax.jit(lambda x: k(k(k(x))))
    closed = jax.make_jaxpr(lambda x: h(h(h(x))))(1.0)
    out = Graph.from_jaxpr(closed).to_jaxpr()
    assert len({id(b) for b in _jit_bodies(out.jaxpr)}) == len({id(b) for b in _jit_bodies(closed.jaxpr)}) == 2


def test_editing_one_call_site_leaves_the_others():
    k = jax.jit(lambda x: jnp.sin(x) * 2)
    g = Graph.from_jaxpr(jax.make_jaxpr(lambda x: k(x) + k(x + 1))(1.0))
    first = next(n for n in g.nodes if n.name == "jit").regions["body"]
    sin = next(n for n in first.nodes if n.name == "sin")
    cos = first.add("cos", sin.inputs, {"accuracy": None})
    first.replace_uses(sin.outputs[0], cos.outputs[0])
    first.remove(sin)
    out = g.to_jaxpr()
    bodies = list(_jit_bodies(out.jaxpr))
    assert len({id(b) for b in bodies}) == 2
    np.testing.assert_allclose(jaxform.to_function(Graph.from_jaxpr(out))(1.0)[0],
                               np.cos(1.0) * 2 + np.sin(2.0) * 2, rtol=1e-6)
