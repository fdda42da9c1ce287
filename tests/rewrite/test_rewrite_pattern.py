"""Pat: primitives, params, captures, commutativity, aval constraints, constants."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import Pat

X = np.ones((3, 4), np.float32)


def root(fn, *args):
    """The value the traced function returns (its first output)."""
    g = jaxform.trace(fn, *args)
    return g, g.outputs[0]


def test_prim_and_sources_and_captures():
    g, v = root(lambda x: jnp.log(jnp.exp(x)), X)
    caps = Pat("log", Pat("exp", Pat.any("x"), name="e"), name="l").match(v)
    assert caps["x"] is g.inputs[0] and caps["l"] is v and caps["e"] is v.producer.inputs[0]
    assert Pat("log", Pat("sin", Pat.any())).match(v) is None
    assert Pat("exp").match(v) is None
    assert Pat({"log", "log1p"}).match(v) == {}
    assert Pat(jax.lax.log_p).match(v) == {}


def test_same_name_must_be_same_value():
    same = Pat("sub", Pat.any("x"), Pat.any("x"))
    assert same.match(root(lambda x: x - x, X)[1]) is not None
    assert same.match(root(lambda x, y: x - y, X, X)[1]) is None


def test_commutative_auto_and_explicit():
    p = Pat("mul", Pat("sin", Pat.any("x")), Pat.any("y"))
    g, v = root(lambda x, y: y * jnp.sin(x), X, X)
    caps = p.match(v)
    assert caps is not None and caps["x"] is g.inputs[0] and caps["y"] is g.inputs[1]
    assert Pat("sub", Pat("sin", Pat.any()), Pat.any()).match(root(lambda x, y: y - jnp.sin(x), X, X)[1]) is None
    assert Pat("sub", Pat("sin", Pat.any()), Pat.any(), commutative=True).match(
        root(lambda x, y: y - jnp.sin(x), X, X)[1]) is not None
    assert Pat("mul", Pat("sin", Pat.any()), Pat.any(), commutative=False).match(v) is None


def test_params_value_predicate_bind_and_dict_predicate():
    _, v = root(lambda x: jnp.sum(x, axis=1), X)
    assert Pat("reduce_sum", params={"axes": (1,)}).match(v) is not None
    assert Pat("reduce_sum", params={"axes": (0,)}).match(v) is None
    assert Pat("reduce_sum", params={"axes": lambda a: 1 in a}).match(v) is not None
    assert Pat("reduce_sum", params={"nope": 1}).match(v) is None
    assert Pat("reduce_sum", params={"axes": Pat.bind("ax")}).match(v) == {"ax": (1,)}
    assert Pat("reduce_sum", params=lambda p: p["axes"] == (1,)).match(v) is not None


def test_aval_constraints_and_where():
    _, v = root(lambda x: jnp.sin(x), X)
    assert Pat("sin", dtype=jnp.floating, rank=2, shape=(3, None)).match(v) is not None
    assert Pat("sin", dtype=jnp.integer).match(v) is None
    assert Pat("sin", dtype=(jnp.int32, jnp.float32)).match(v) is not None
    assert Pat("sin", rank=(0, 1)).match(v) is None
    assert Pat("sin", shape=(4, None)).match(v) is None
    assert Pat("sin", shape=lambda s: s[1] == 4).match(v) is not None
    assert Pat("sin", where=lambda v: len(v.users) > 0).match(v) is None   # only a graph output


def test_const_matches_literals_filled_constants_and_broadcasts():
    one = Pat("mul", Pat.any("x"), Pat.const(1))
    assert one.match(root(lambda x: x * 1.0, X)[1]) is not None
    assert one.match(root(lambda x: x * jnp.ones((3, 4)), X)[1]) is not None          # broadcast of 1
    assert one.match(root(lambda x: x * np.ones((3, 4), np.float32), X)[1]) is not None  # constant array
    assert one.match(root(lambda x: x * np.arange(12.0, dtype=np.float32).reshape(3, 4), X)[1]) is None
    assert one.match(root(lambda x: x * 2.0, X)[1]) is None


def test_str_depth_and_captures():
    p = Pat("log", Pat("add", Pat.any("x"), Pat.const(1)), params={"accuracy": Pat.bind("acc")})
    assert str(p) == "log(add(x, 1))"
    assert p.depth() == 3 and p.captures() == {"x", "acc"}
    assert "Pat('log'" in repr(p)
    with pytest.raises(TypeError, match="Pat sources must be Pats"):
        Pat("log", "x")


@pytest.mark.parametrize("op,commutes", [(jnp.add, True), (jnp.multiply, True), (jnp.maximum, True),
                                         (jnp.minimum, True), (jnp.subtract, False), (jnp.divide, False)])
def test_commutative_primitives_match_either_order(op, commutes):
    g, v = root(lambda x, y: op(y, jnp.sin(x)), X, X)
    p = Pat(v.producer.prim.name, Pat("sin", Pat.any("x")), Pat.any("y"))
    assert (p.match(v) is not None) == commutes
