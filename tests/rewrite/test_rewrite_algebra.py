"""Every algebra rule: same values and gradients (eager, jit, grad, vmap) as the original, and it fired."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.passes.algebra import RULES
from jaxform.testing import assert_pass_ok

rng = np.random.default_rng(0)
X = rng.normal(size=(3, 4)).astype(np.float32)
U = rng.uniform(0.1, 1.0, size=(3, 4)).astype(np.float32)
X3 = rng.normal(size=(2, 3, 4)).astype(np.float32)


def prims(closed) -> list[str]:
    """Every primitive in a jaxpr, nested bodies included."""
    g = Graph.from_jaxpr(closed)
    return [n.prim.name for n, _ in g.walk()]


def fired(fn, *args) -> dict:
    return RULES.apply(jaxform.trace(fn, *args)).fired


CASES = [  # (rule, fn, args, primitives that must be gone afterwards)
    ("x*1 -> x", lambda x: jnp.sin(x) * 1.0, (X,), ["mul"]),
    ("x*1 -> x", lambda x: 1.0 * jnp.sin(x), (X,), ["mul"]),
    ("x/1 -> x", lambda x: jnp.sin(x) / 1.0, (X,), ["div"]),
    ("x-0 -> x", lambda x: jnp.sin(x) - 0.0, (X,), ["sub"]),
    ("x+0 -> x", lambda x: 0.0 + jnp.sin(x), (X,), ["add"]),
    ("--x -> x", lambda x: -(-jnp.sin(x)), (X,), ["neg"]),
    ("x**1 -> x", lambda x: jnp.sin(x) ** 1, (X,), ["integer_pow"]),
    ("x + -y -> x - y", lambda x: jnp.sin(x) + (-jnp.cos(x)), (X,), ["neg", "add"]),
    ("x - -y -> x + y", lambda x: jnp.sin(x) - (-jnp.cos(x)), (X,), ["neg", "sub"]),
    ("transpose(transpose(x))", lambda x: jnp.sin(x).T.T, (X,), ["transpose"]),
    ("transpose(transpose(x))", lambda x: jnp.transpose(jnp.transpose(x, (1, 2, 0)), (0, 2, 1)), (X3,), []),
    ("reshape(reshape(x))", lambda x: jnp.sin(x).reshape(12).reshape(4, 3), (X,), []),
    ("reshape(reshape(x))", lambda x: jnp.sin(x).reshape(12).reshape(2, 6).reshape(3, 4), (X,), ["reshape"]),
    ("log(exp(x)) -> x", lambda x: jnp.log(jnp.exp(x)) * 3.0, (X,), ["log", "exp"]),
    ("log(1+x) -> log1p(x)", lambda x: jnp.log(1 + x), (U,), ["log"]),
    ("log(1+x) -> log1p(x)", lambda x: jnp.log(x + 1.0), (U,), ["log"]),
    ("softmax -> stable softmax", lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True), (X,), []),
    ("softmax -> stable softmax", lambda x: jnp.exp(x) / jnp.exp(x).sum(axis=(0, 2), keepdims=True), (X3,), []),
    ("softmax (all axes) -> stable softmax", lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x)), (X,), []),
]


@pytest.mark.parametrize("rule,fn,args,gone", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_same_values_and_grads_and_fires(rule, fn, args, gone):
    out = assert_pass_ok("algebra", fn, *args)
    assert fired(fn, *args)[rule] >= 1, f"{rule} did not fire"
    left = prims(out)
    for p in gone:
        assert p not in left, f"{p} still in {left}"
    assert len(left) < len(prims(jax.make_jaxpr(fn)(*args))) or "softmax" in rule


def test_stable_softmax_fixes_overflow():
    fn = lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True)
    big = X * 100.0
    assert np.isnan(np.asarray(fn(big))).any()
    out = jaxform.optimize(fn, passes=["algebra"], strict=True)(big)
    np.testing.assert_allclose(out, jax.nn.softmax(big, axis=-1), rtol=1e-6)
    # the rewritten softmax is not matched again (it is already shifted): no cycle
    assert fired(fn, X) == {"softmax -> stable softmax": 1}


def test_softmax_rule_declines_non_softmax_division():
    # e / sum(e, axis=1) without keepdims broadcasts along the wrong axis: not a softmax.
    sq = rng.normal(size=(4, 4)).astype(np.float32)
    fn = lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=1)
    assert fired(fn, sq) == {}
    assert_pass_ok("algebra", fn, sq)


def test_identity_rules_decline_when_the_type_would_change():
    s = np.float32(1.5)
    fn = lambda x: jnp.ones(3) * x          # broadcast: x * 1 has shape (3,), x has ()
    assert fired(fn, s) == {}
    weak = lambda x: lax.convert_element_type(x, jnp.float32)   # weak -> strong f32
    assert fired(weak, 1.0) == {}


def _graph_with(prim, params):
    g = jaxform.trace(lambda x: jnp.sin(x), X)
    n = g.add(prim, [g.outputs[0]], params)
    g.set_outputs([n.outputs[0]])
    return g


@pytest.mark.parametrize("prim,params,rule", [
    ("convert_element_type", {"new_dtype": jnp.dtype("float32"), "weak_type": False, "sharding": None},
     "convert to own dtype -> x"),
    ("reshape", {"new_sizes": (3, 4), "dimensions": None, "sharding": None}, "reshape to own shape -> x"),
])
def test_noop_rules_on_built_graphs(prim, params, rule):
    g = _graph_with(prim, params)
    before = g.to_jaxpr()
    assert RULES.apply(g).fired == {rule: 1}
    assert [n.prim.name for n in g.nodes] == ["sin"]
    np.testing.assert_array_equal(g.evaluate(X)[0], jaxform.to_function(Graph.from_jaxpr(before))(X)[0])


def test_exact_subset_and_registration():
    assert jaxform.passes.get("algebra").exact is False
    assert jaxform.passes.get("algebra_exact").exact is True
    names = {r.name for r in jaxform.passes.algebra_exact.rules}
    assert "--x -> x" in names and "log(exp(x)) -> x" not in names and "x+0 -> x" not in names
    fn = lambda x: (-(-x), jnp.log(jnp.exp(x)))
    out = assert_pass_ok("algebra_exact", fn, X)
    assert prims(out) == ["exp", "log"]


def test_rules_fire_in_the_gradient_program():
    fn = lambda x: jnp.sum(jnp.log(jnp.exp(x)) * 1.0)
    g = jax.grad(fn)
    out = assert_pass_ok("algebra", g, X)
    assert len(prims(out)) < len(prims(jax.make_jaxpr(g)(X)))


def _inner(v):
    return -(-jnp.log(jnp.exp(v)) * 1.0)      # three rules: log(exp), x*1, --x


NESTED = {  # body kind -> (program, differentiable)
    "scan": (lambda x: lax.scan(lambda c, a: (c + _inner(a), _inner(a) - 0.0), x[0], x), True),
    "cond": (lambda x: lax.cond(x.sum() > 0, _inner, jnp.sin, x), True),
    "while": (lambda x: lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, _inner(s[1]) * 0.5), (0, x))[1],
              False),   # no reverse-mode through while_loop
    "jit": (lambda x: jax.jit(lambda v: jax.jit(_inner)(v) * 2.0)(x), True),
}


@pytest.mark.parametrize("kind", NESTED)
def test_algebra_fires_inside_bodies(kind):
    fn, diff = NESTED[kind]
    out = assert_pass_ok("algebra", fn, X, grad=diff)
    left, before = prims(out), prims(jax.make_jaxpr(fn)(X))
    assert kind in before and kind in left       # rewritten in place, the body kept
    assert "exp" in before and "exp" not in left and "neg" not in left and len(left) < len(before)
    assert {"log(exp(x)) -> x", "x*1 -> x", "--x -> x"} <= set(fired(fn, X))


# ---- safe on every program of the corpus -----------------------------
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
from corpus import PROGRAMS  # noqa: E402


HEAVY = {"equinox_train_step", "mlp_train_step", "flax_train_step"}   # 10-40 s each on 2 busy cores


@pytest.mark.parametrize("name,fn,args,diff", [pytest.param(*p, marks=pytest.mark.slow) if p[0] in HEAVY else p
                                               for p in PROGRAMS], ids=[p[0] for p in PROGRAMS])
def test_algebra_on_the_corpus(name, fn, args, diff):
    assert_pass_ok("algebra", fn, *args, grad=diff)



# ---- issue 15, findings 8 and 9 ----

def test_log_exp_not_rewritten_for_complex():
    f = lambda z: jnp.log(jnp.exp(z))
    z = jnp.complex64(1 + 4j)          # exp wraps the imaginary part: log(exp(z)) = 1 + (4 - 2pi)j
    out = jaxform.optimize(f, passes=["algebra"])(z)
    np.testing.assert_allclose(out, f(z), rtol=1e-6)
    assert abs(out - z) > 1
    r = jaxform.optimize(f, passes=["algebra"])(jnp.float32(3.0))   # still fires on real floats
    assert "exp" not in str(jax.make_jaxpr(jaxform.optimize(f, passes=["algebra"]))(jnp.float32(3.0)))
    np.testing.assert_allclose(r, 3.0)


@pytest.mark.parametrize("passes", [["algebra_exact"], ["algebra"]])
def test_minus_negative_zero_keeps_sign(passes):
    f = lambda x: x - (-0.0)
    x = jnp.float32(-0.0)
    out = jaxform.optimize(f, passes=passes)(x)
    assert np.signbit(f(x)) == np.signbit(out) == False  # noqa: E712  (-0.0 - -0.0 is +0.0)
    g = lambda x: x - 0.0                                  # x - (+0) -> x still fires, and is exact
    assert "sub" not in str(jax.make_jaxpr(jaxform.optimize(g, passes=passes))(x))
    assert np.signbit(jaxform.optimize(g, passes=passes)(x))


def test_exact_rules_keep_signed_zero_and_nan():
    """Every exact algebra rule, on -0.0, +0.0 and NaN: bit-identical to the original (eagerly)."""
    fs = [lambda x: x * 1.0, lambda x: x / 1.0, lambda x: x - 0.0, lambda x: -(-x), lambda x: x ** 1,
          lambda x: x + -(x * 2), lambda x: x - -(x * 2), lambda x: x.astype(jnp.float32),
          lambda x: x.reshape(1).reshape(()), lambda x: x - (-0.0)]
    for f in fs:
        for v in [-0.0, 0.0, np.nan, -np.inf]:
            x = jnp.float32(v)
            want, got = f(x), jaxform.optimize(f, passes=["algebra_exact"])(x)
            assert np.asarray(want).tobytes() == np.asarray(got).tobytes(), (f, v)
