"""Identity rules (issue 15, findings 1, 4, 5): what may be merged.

Bodies shared by `to_jaxpr` and nodes merged by `cse` must be structurally
equal with callables, custom rules, params and equation context compared by
identity; impure primitives are never merged. Each test failed before
`jaxform/ir/identity.py` (printed-text body sharing, cse keyed on params only).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.ir.identity import effect_free, is_impure, may_move_across, node_key, param_key, structure

S = jax.ShapeDtypeStruct((), jnp.float32)


@pytest.fixture(autouse=True)
def _round_trip_on_fast_path(monkeypatch):
    """tests/conftest.py sets JAXFORM_CHECK=1, whose pass-by-pass path returns the traced jaxpr
    untouched when `passes=[]`; users get the fast path, which round-trips through a Graph."""
    monkeypatch.setenv("JAXFORM_CHECK", "0")


def round_trip(f, *args):
    """f through jaxpr -> Graph -> jaxpr (no passes), as a function of f's flat arguments."""
    closed = Graph.from_jaxpr(jax.make_jaxpr(f)(*args)).to_jaxpr()
    run = jax.extend.core.jaxpr_as_fun(closed)
    return lambda *a: (lambda out: out[0] if len(out) == 1 else tuple(out))(run(*a))


def both(f, *args):
    """f's result eagerly and under jit; then the same for its round trip and optimize(f, passes=[])."""
    outs = []
    for g in (round_trip(f, *args), jaxform.optimize(f, passes=[])):
        outs += [g(*args), jax.jit(g)(*args)]
    return [f(*args), jax.jit(f)(*args)], outs


# ---- finding 1: to_jaxpr shared region bodies by printed text -------------------------

def cond_two_callbacks(p, x):
    return lax.cond(p, lambda x: jax.pure_callback(lambda v: np.float32(v + 100), S, x),
                    lambda x: jax.pure_callback(lambda v: np.float32(v - 100), S, x), x)


@pytest.mark.parametrize("p,want", [(True, 101.0), (False, -99.0)])
def test_cond_branches_with_different_pure_callbacks(p, want):
    ref, got = both(cond_two_callbacks, p, jnp.float32(1.0))
    assert [float(v) for v in ref] == [want, want]
    assert [float(v) for v in got] == [want] * 4


def test_scans_with_different_pure_callbacks():
    def f(x):
        a = lax.scan(lambda c, _: (jax.pure_callback(lambda v: np.float32(v + 1), S, c), None), x, length=3)[0]
        b = lax.scan(lambda c, _: (jax.pure_callback(lambda v: np.float32(v * 2), S, c), None), x, length=3)[0]
        return a, b
    ref, got = both(f, jnp.float32(1.0))
    for r in ref:
        assert [float(v) for v in r] == [4.0, 8.0]
    for g in got:
        assert [float(v) for v in g] == [4.0, 8.0]


def test_scans_with_different_debug_callbacks_record_their_own_sequence():
    calls = []

    def f(x):
        def scan_with(tag, x):
            def step(c, _):
                jax.debug.callback(lambda v: calls.append((tag, float(v))), c)
                return c + 1.0, None
            return lax.scan(step, x, length=2)[0]
        return scan_with("b", scan_with("a", x))   # data-dependent: the order is fixed under jit too

    want = [("a", 0.0), ("a", 1.0), ("b", 2.0), ("b", 3.0)]
    x = jnp.float32(0.0)
    rt, opt = round_trip(f, x), jaxform.optimize(f, passes=[])
    for run in (f, jax.jit(f), rt, jax.jit(rt), opt, jax.jit(opt)):
        calls.clear()
        jax.block_until_ready(run(x))
        jax.effects_barrier()
        assert calls == want, run


@jax.custom_jvp
def jvp5(x):
    return jnp.sin(x)


@jax.custom_jvp
def jvp4(x):
    return jnp.sin(x)


jvp5.defjvp(lambda p, t: (jvp5(p[0]), 5.0 * t[0]))
jvp4.defjvp(lambda p, t: (jvp4(p[0]), 4.0 * t[0]))


@jax.custom_vjp
def vjp11(x):
    return jnp.sin(x)


@jax.custom_vjp
def vjp2(x):
    return jnp.sin(x)


vjp11.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (11.0 * g,))
vjp2.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (2.0 * g,))


@pytest.mark.parametrize("f,want", [
    (lambda x: jax.jit(jvp5)(x) + 10.0 * jax.jit(jvp4)(x), 45.0),        # same jit bodies but the rule
    (lambda x: lax.cond(x > 0, jvp5, jvp4, x), 5.0),
    (lambda x: lax.cond(x < 0, jvp5, jvp4, x), 4.0),
    (lambda x: lax.cond(x > 0, vjp11, vjp2, x), 11.0),
    (lambda x: lax.cond(x < 0, vjp11, vjp2, x), 2.0),
    (lambda x: jax.jit(vjp11)(x) + 10.0 * jax.jit(vjp2)(x), 31.0),
], ids=["jit_jvp", "cond_jvp5", "cond_jvp4", "cond_vjp11", "cond_vjp2", "jit_vjp"])
def test_custom_rules_with_equal_primal_bodies_keep_their_rule(f, want):
    x = jnp.float32(1.0)
    assert float(jax.grad(f)(x)) == want
    for g in (round_trip(f, x), jaxform.optimize(f, passes=[])):
        assert float(jax.grad(g)(x)) == want
        assert float(jax.jit(jax.grad(g))(x)) == want


def test_equal_bodies_are_still_shared():
    """Structural sharing keeps what the text key gave: one jit body called twice is emitted once."""
    inner = jax.jit(lambda x: jnp.sin(x) * 2.0)
    closed = Graph.from_jaxpr(jax.make_jaxpr(lambda x: inner(x) + inner(x + 1.0))(1.0)).to_jaxpr()
    bodies = [e.params["jaxpr"] for e in closed.jaxpr.eqns if e.primitive.name in ("jit", "pjit")]
    assert len(bodies) == 2 and bodies[0] is bodies[1]


def test_bodies_differing_in_input_types_are_not_shared():
    g = Graph.from_jaxpr(jax.make_jaxpr(lambda x, y: (jax.jit(lambda a: a)(x), jax.jit(lambda a: a)(y)))(
        jnp.ones(3), jnp.ones(4)))
    s = [structure(n.regions["body"]) for n in g.nodes]
    assert s[0] != s[1]


# ---- node keys: identity of params -----------------------------------------------------

def test_param_keys():
    f, g = (lambda v: v), (lambda v: v)
    assert param_key(f) == param_key(f) and param_key(f) != param_key(g)
    a, b = np.arange(3.0), np.arange(3.0)
    assert param_key(a) == param_key(b) != param_key(a.astype(np.float32))
    assert param_key(1) != param_key(1.0) != param_key(True)
    with pytest.raises(TypeError):
        param_key([1, 2])


# ---- finding 4: cse merged impure primitives -------------------------------------------

def test_cse_never_merges_rng_uniform():
    def f(x):
        return lax.rng_uniform(0.0, 1.0, (16,)) - lax.rng_uniform(0.0, 1.0, (16,)) + x
    g = jaxform.trace(f, 0.0)
    assert all(is_impure(n) for n in g.nodes if n.name == "rng_uniform")
    out = jaxform.optimize(f, passes=["cse"], strict=True)(0.0)
    assert np.any(np.asarray(out) != 0.0)
    assert [n.name for n in jaxform.passes.cse(g).nodes].count("rng_uniform") == 2


def test_cse_never_merges_callbacks_and_keeps_their_count():
    calls = []

    def f(x):
        a = jax.pure_callback(lambda v: (calls.append(1), v)[1], jax.ShapeDtypeStruct((), jnp.float32), x)
        b = jax.pure_callback(lambda v: (calls.append(2), v)[1], jax.ShapeDtypeStruct((), jnp.float32), x)
        return a + b
    g = jaxform.passes.cse(jaxform.trace(f, jnp.float32(1.0)))
    assert [n.name for n in g.nodes].count("pure_callback") == 2
    jaxform.optimize(f, passes=["cse"], strict=True)(jnp.float32(1.0))
    assert sorted(calls) == [1, 2]


def test_cse_still_merges_pure_twins():
    g = jaxform.passes.cse(jaxform.trace(lambda x: jnp.sin(x) + jnp.sin(x), 1.0))
    assert [n.name for n in g.nodes] == ["sin", "add"]
    k = jax.random.key(0)
    g = jaxform.passes.cse(jaxform.trace(lambda k: jax.random.bits(k, (4,)) ^ jax.random.bits(k, (4,)), k))
    assert [n.name for n in g.nodes].count("random_bits") == 1   # pure given the key (same ctx)


# ---- finding 5: cse ignored the equation context -------------------------------------

def test_cse_keys_include_equation_context():
    def f(k):
        with jax.threefry_partitionable(False):
            a = jax.random.bits(k, (8,))
        with jax.threefry_partitionable(True):
            b = jax.random.bits(k, (8,))
        return a, b
    k = jax.random.key(1)
    want = f(k)
    assert np.any(np.asarray(want[0]) != np.asarray(want[1]))   # the two modes differ
    g = jaxform.trace(f, k)
    n1, n2 = [n for n in g.nodes if n.name == "random_bits"]
    assert node_key(n1) != node_key(n2)
    for got in (jaxform.optimize(f, passes=["cse"], strict=True)(k),
                jax.jit(jaxform.optimize(f, passes=["cse"], strict=True))(k)):
        for w, o in zip(want, got):
            np.testing.assert_array_equal(np.asarray(w), np.asarray(o))


# ---- the order helpers passes ask ------------------------------------------------------

def test_effect_free_and_may_move_across():
    def f(x):
        r = jax.new_ref(x)
        r[...] = x * 3.0
        y = r[...]
        z = jnp.sin(x)
        jax.debug.print("{}", z)
        return y + 1.0, z * 2.0
    g = jaxform.trace(f, jnp.ones(3))
    by = {}
    for n in g.nodes:
        by.setdefault(n.name, []).append(n)
    y_plus, z_times = g.outputs
    assert not effect_free([y_plus]) and effect_free([z_times])
    swap, (get,), (dbg,), (sin,) = by["swap"][0], by["get"], by["debug_print"], by["sin"]
    assert not may_move_across(get, [swap]) and not may_move_across(dbg, [swap])
    assert may_move_across(sin, [swap, dbg]) and may_move_across(get, [sin])


# ---- finding 20 (IR part): a rebuilt node keeps its equation context ------------------

def test_graph_add_keeps_equation_context():
    """Passes rebuild nodes with `Graph.add(..., ctx=node.ctx)`: the rebuilt random_bits keeps the
    threefry mode it was traced under (before, `add` took no ctx and the mode at emission applied)."""
    def f(k):
        with jax.threefry_partitionable(False):
            return jax.random.bits(k, (8,))
    k = jax.random.key(2)
    g = jaxform.trace(f, k)
    old = next(n for n in g.nodes if n.name == "random_bits")
    new = g.add(old.prim, old.inputs, old.params, source_info=old.source_info, ctx=old.ctx)
    g.replace_uses(old.outputs[0], new.outputs[0])
    g.remove(old)
    eqn = next(e for e in g.to_jaxpr().jaxpr.eqns if e.primitive.name == "random_bits")
    assert eqn.ctx is old.ctx and eqn.ctx.threefry_partitionable is False
    with jax.threefry_partitionable(True):
        got = jaxform.to_function(g)(k)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(k)))


def test_program_identity_is_structural_and_an_unhashable_program_is_only_itself():
    """The one cache key every cache uses (the planner's costs, measure's memo, explain's stages): equal for
    the same program traced twice, apart for callbacks JAX prints alike, and, where a param cannot be
    hashed, equal only to the program it came from."""
    from jaxform.ir.identity import program_identity

    def cb(k):
        return lambda x: jax.pure_callback(lambda v: np.float32(v + k), S, x)
    one, other = (jax.make_jaxpr(f)(jnp.float32(1.0)) for f in (cb(1), cb(2)))
    key = lambda c: program_identity(Graph.from_jaxpr(c), c)  # noqa: E731
    assert str(one) == str(other) and key(one) != key(other)     # printed alike, different callables
    f = lambda x: jnp.sin(x) * 2  # noqa: E731
    assert key(jax.make_jaxpr(f)(1.0)) == key(jax.make_jaxpr(f)(1.0))

    class Unhashable:
        __hash__ = None
    g = Graph.from_jaxpr(jax.make_jaxpr(f)(1.0))
    g.nodes[0].params["extra"] = Unhashable()
    owner = object()
    assert program_identity(g, owner) == ("unshared", id(owner))
    assert program_identity(g, owner) != program_identity(g, object())
