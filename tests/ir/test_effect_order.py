"""Order rules (issue 15, finding 2, the IR part): `to_jaxpr` keeps effectful nodes in order.

Node order may be stale after a pass (`to_jaxpr` emits producers first), but
emitting producers first must never hoist a ref read, callback or RNG draw above
an effect that preceded it. A stale order that is still consistent is fixed
silently; a pass that made an earlier effect depend on a later one is an error.
"""
import jax
import jax.experimental
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform.ir import Graph

X = jnp.arange(1.0, 4.0)


def ref_program(x):
    r = jax.new_ref(x)
    r[...] = x * 3.0
    return r[...]


def run(g: Graph, *args):
    return jax.extend.core.jaxpr_as_fun(g.to_jaxpr())(*args)


def test_stale_order_does_not_hoist_a_read_above_a_write():
    """A pure node listed first that uses a ref read: emitting its producers first used to emit
    the read before the write (x + 1 instead of 3x + 1)."""
    g = jaxform.trace(ref_program, X)
    read = g.outputs[0]
    plus = g.add("add", [read, Graph.literal(1.0, np.float32)])
    g._nodes.insert(0, g._nodes.pop())     # a pass left the new node at the front
    g.set_outputs([plus.outputs[0]])
    out = run(g, X)
    np.testing.assert_array_equal(np.asarray(out[0]), np.asarray(X * 3.0 + 1.0))
    names = [e.primitive.name for e in g.to_jaxpr().jaxpr.eqns]
    assert names.index("swap") < names.index("get") < names.index("add")


def test_callbacks_keep_their_order_when_a_later_value_is_pulled_forward():
    """A pure node listed first that uses the second callback's result: emitting its producers
    first used to run the second callback before the first."""
    calls = []
    S = jax.ShapeDtypeStruct((), jnp.float32)

    def record(tag):
        return lambda v: (calls.append(tag), np.float32(v))[1]

    def f(x):
        a = jax.experimental.io_callback(record("first"), S, x, ordered=True)
        b = jax.experimental.io_callback(record("second"), S, x + 1.0, ordered=True)
        return b, a

    g = jaxform.trace(f, jnp.float32(0.5))
    cb1, cb2 = [n for n in g.nodes if n.name == "io_callback"]
    twice = g.add("mul", [g.outputs[0], Graph.literal(2.0, np.float32)])
    g._nodes.insert(0, g._nodes.pop())     # a pass left the new node at the front
    g.set_outputs([twice.outputs[0], g.outputs[1]])
    cbs = [e.params["callback"] for e in g.to_jaxpr().jaxpr.eqns if e.primitive.name == "io_callback"]
    assert cbs == [cb1.params["callback"], cb2.params["callback"]]
    for fn in (lambda x: run(g, x), jax.jit(lambda x: run(g, x))):
        calls.clear()
        out = jax.block_until_ready(fn(jnp.float32(0.5)))
        jax.effects_barrier()
        assert calls == ["first", "second"] and float(out[0]) == 3.0


def test_a_dependency_against_the_effect_order_is_an_error():
    """What fusing a post-scan ref read into the scan did (issue 15, finding 2): an effectful node
    made to depend on a value read after it. Before, `to_jaxpr` silently emitted the read first."""
    calls = []

    def f(x):
        r = jax.new_ref(x)
        jax.debug.callback(lambda v: calls.append(float(v.sum())), x, ordered=True)
        r[...] = x * 3.0
        return r[...]

    g = jaxform.trace(f, X)
    cb = next(n for n in g.nodes if n.name == "debug_callback")
    cb.set_input(0, g.outputs[0])     # the callback now reads the value read after the write
    with pytest.raises(ValueError, match="effect order violated"):
        g.to_jaxpr()


def test_ref_program_round_trip_and_optimize_keep_reads_after_writes():
    def f(x, xs):
        r = jax.new_ref(jnp.zeros((), jnp.float32))

        def step(c, x):
            r[...] += x
            return c * 0.5, c * x
        _, ys = jax.lax.scan(step, x, xs)
        v = r[...]
        return jnp.sum(ys * v)
    x, xs = jnp.float32(1.5), jnp.arange(1.0, 9.0)
    want = f(x, xs)
    for g in (jaxform.optimize(f), jax.jit(jaxform.optimize(f))):
        np.testing.assert_allclose(np.asarray(g(x, xs)), np.asarray(want), rtol=1e-6)
