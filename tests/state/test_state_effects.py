"""Refs next to other effects, and jaxform.scan's types (issue 15, findings 14 and 20).

Before: `discharge` raised "jaxform internal error" on any graph with a debug
print (it took every effect for a ref), a `for_loop` body with a debug print
failed the same way, and `jaxform.scan` returned strong types where lax.scan
returns weak ones and warned DeprecationWarning (a Jaxpr without DebugInfo).
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax

X = jnp.arange(1.0, 4.0)


def ref_and_prints(x, calls):
    r = jax.new_ref(x)
    r[...] = r[...] * 2.0
    jax.debug.print("v={v}", v=r[...])
    jax.debug.callback(lambda v: calls.append(float(v.sum())), r[...], ordered=True)
    r[...] += 1.0
    return r[...]


def test_discharge_keeps_debug_print_and_callbacks():
    calls = []
    f = lambda x: ref_and_prints(x, calls)   # noqa: E731
    g = jaxform.trace(f, X)
    d = jaxform.discharge(g)
    names = [n.name for n, _ in d.walk()]
    assert "debug_print" in names and "debug_callback" in names
    assert not any(_jax.is_ref_aval(v.aval) for n, _ in d.walk() for v in n.inputs + n.outputs)
    run = jaxform.to_function(d)
    for fn in (run, jax.jit(run)):
        calls.clear()
        np.testing.assert_array_equal(np.asarray(fn(X)), np.asarray(X * 2.0 + 1.0))
        jax.effects_barrier()
        assert calls == [12.0]


def test_discharge_of_a_graph_with_only_a_debug_print_is_unchanged():
    g = jaxform.trace(lambda x: (jax.debug.print("{}", x), x + 1.0)[1], X)
    assert jaxform.discharge(g) is g


def test_for_loop_body_with_debug_callback():
    calls = []

    def body(i, r):
        jax.debug.callback(lambda i: calls.append(int(i)), i, ordered=True)
        r[...] += 1.0
    for fn in (lambda x: jaxform.for_loop(3, body, x), jax.jit(lambda x: jaxform.for_loop(3, body, x))):
        calls.clear()
        np.testing.assert_array_equal(np.asarray(fn(jnp.zeros(2))), np.full(2, 3.0))
        jax.effects_barrier()
        assert calls == [0, 1, 2]


F32 = jnp.float32(0)
STEPS = {
    "weak_stays_weak": (0.0, lambda c, x: (c + 1.0, c * 2.0)),
    "weak_init_strong_carry": (0.0, lambda c, x: (c + F32, c)),
    "strong_init_weak_carry": (F32, lambda c, x: (1.0, c)),
    "strong": (F32, lambda c, x: (c + 1.0, c * 2.0)),
    "int_tuple_ys": (0, lambda c, x: (c + 1, (c, 1.0))),
    "uses_x": (0.0, lambda c, x: (c + x, c * 2)),
}


@pytest.mark.parametrize("xs", [jnp.arange(3.0), lax.full((3,), 2.0), jnp.zeros((0,))],
                         ids=["strong_xs", "weak_xs", "empty"])
@pytest.mark.parametrize("name", sorted(STEPS))
def test_scan_types_match_lax_scan(name, xs):
    init, f = STEPS[name]
    for tr in (lambda g: g, jax.jit):
        want = tr(lambda i: lax.scan(f, i, xs))(init)
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            got = tr(lambda i: jaxform.scan(f, i, xs))(init)
        assert [jax.typeof(v) for v in jax.tree.leaves(got)] == [jax.typeof(v) for v in jax.tree.leaves(want)]
        for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w))


def test_scan_weak_types_survive_grad():
    f = lambda c, x: (c * x + 1.0, c)   # noqa: E731
    loss = lambda x, scan: scan(f, 1.0, x)[1].sum()   # noqa: E731
    want = jax.grad(loss)(jnp.arange(1.0, 4.0), lax.scan)
    got = jax.grad(loss)(jnp.arange(1.0, 4.0), jaxform.scan)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
