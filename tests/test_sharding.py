"""Sharding on 8 host CPU devices: optimized programs keep results, output shardings and constraints."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxform

MESH = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
S_XY, S_X, REP = NamedSharding(MESH, P("x", "y")), NamedSharding(MESH, P("x")), NamedSharding(MESH, P())


def annotations(fn, *args, **jit_kw):
    """Sharding annotations in the lowered StableHLO, in order."""
    text = jax.jit(fn, **jit_kw).lower(*args).as_text()
    return re.findall(r"<@\w+, \[[^\]]*\]>", text)


def check(fn, *args, **jit_kw):
    opt = jaxform.optimize(fn)
    want, got = jax.jit(fn, **jit_kw)(*args), jax.jit(opt, **jit_kw)(*args)
    for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        assert g.sharding.is_equivalent_to(w.sharding, g.ndim), (g.sharding, w.sharding)
    return opt


def test_named_shardings_2d_mesh():
    def f(a, b):
        h = jnp.tanh(a @ b) + jnp.tanh(a @ b)  # cse merges the duplicate
        return h * 2, h.sum(0)
    a = jax.device_put(jnp.arange(64.0).reshape(8, 8) / 64, S_XY)
    b = jax.device_put(jnp.ones((8, 8)), REP)
    kw = dict(in_shardings=(S_XY, REP), out_shardings=(S_XY, NamedSharding(MESH, P("y"))))
    opt = check(f, a, b, **kw)
    assert len(annotations(f, a, b, **kw)) >= 4 and annotations(opt, a, b, **kw) == annotations(f, a, b, **kw)


def constrained(x):
    y = lax.with_sharding_constraint(jnp.sin(x) * 2, S_X)
    z = lax.with_sharding_constraint(y + jnp.sin(x), S_XY)
    return z.sum(1)


def scan_constrained(x):
    def body(c, row):
        c = lax.with_sharding_constraint(c + jnp.sin(row), NamedSharding(MESH, P("y")))
        return c, c * 2
    return lax.scan(body, jnp.zeros(x.shape[1]), x)


def test_sharding_constraints_preserved():
    x = jnp.arange(64.0).reshape(8, 8)
    opt = check(constrained, x)
    g = jaxform.trace(opt, x)
    specs = [str(n.params["sharding"].spec) for n, _ in g.walk() if n.name == "sharding_constraint"]
    orig = [str(n.params["sharding"].spec) for n, _ in jaxform.trace(constrained, x).walk()
            if n.name == "sharding_constraint"]
    assert specs == orig and len(specs) == 2
    assert len(annotations(constrained, x)) == 2 and annotations(opt, x) == annotations(constrained, x)


def test_sharding_constraint_in_scan_body():
    x = jnp.arange(32.0).reshape(4, 8)
    opt = check(scan_constrained, x)
    ours = [str(n.params["sharding"].spec) for n, _ in jaxform.trace(opt, x).walk() if n.name == "sharding_constraint"]
    assert ours == [str(P("y"))]
    assert annotations(opt, x) == annotations(scan_constrained, x)


def test_shard_map_psum():
    def f(a):
        g = jax.shard_map(lambda b: (jnp.sin(b) + jnp.sin(b)) * lax.psum(b.sum(), ("x", "y")),
                          mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"))
        return g(a)
    a = jax.device_put(jnp.arange(64.0).reshape(8, 8) / 64, S_XY)
    opt = check(f, a)
    names = [n.name for n, _ in jaxform.trace(opt, a).walk()]
    assert "shard_map" in names and any(n.startswith("psum") for n in names) and names.count("sin") == 1


def test_fuse_scan_reductions_data_parallel_rnn():
    def loss(w, xs, ts):  # xs, ts: [time, batch, hidden], batch sharded over all 8 devices
        _, hs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), jnp.tanh(h @ w + x)), jnp.zeros(xs.shape[1:]), xs)
        return jnp.mean((hs - ts) ** 2)
    mesh = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Auto,))
    sb = NamedSharding(mesh, P(None, "b"))
    w = jnp.eye(4) * 0.5
    xs = jax.device_put(jnp.sin(jnp.arange(6 * 16 * 4.0)).reshape(6, 16, 4), sb)
    ts = jax.device_put(jnp.cos(jnp.arange(6 * 16 * 4.0)).reshape(6, 16, 4), sb)
    kw = dict(in_shardings=(NamedSharding(mesh, P()), sb, sb))
    opt = jaxform.optimize(loss, passes=["fuse_scan_reductions", "dce"])
    np.testing.assert_allclose(jax.jit(opt, **kw)(w, xs, ts), jax.jit(loss, **kw)(w, xs, ts), rtol=1e-5)
    g = jaxform.trace(opt, w, xs, ts)
    scan = [n for n in g.nodes if n.name == "scan"][0]
    assert not any(v.aval.shape == xs.shape for v in scan.outputs)  # no stacked [time, batch, hidden] ys left
    assert scan.params["num_carry"] == 2   # the loss accumulator joined the carry (deferred on CPU: [batch, hidden])
    text = jax.jit(opt, **kw).lower(w, xs, ts).as_text()
    assert '[{}, {"b"}, {}]' in text  # xs, ts stay batch-sharded in the fused program


# ---- re-traced loops keep sharded types (explicit mesh axes) ----

EXPLICIT = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Explicit,))


def _types(tree):
    return [jax.typeof(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("memory", ["auto", "min"])
def test_remat_loops_corpus_scan_rnn_in_explicit_mesh(memory):
    """Under an explicit-axes mesh, values made inside the program carry the mesh in their type.
    remat_loops re-traces the scan from ShapeDtypeStructs that dropped it, so the result
    types changed and the pass was skipped ("signature changed"); now they carry it."""
    from corpus import scan_rnn
    xs, w = jnp.sin(jnp.arange(21.0)).reshape(7, 3), jnp.eye(3) * 0.5
    with jax.set_mesh(EXPLICIT):
        opt = jaxform.optimize(scan_rnn, memory=memory, strict=True)
        assert _types(opt(xs, w)) == _types(jax.jit(scan_rnn)(xs, w))
        loss = lambda f: lambda xs, w: sum(jnp.sum(y) for y in jax.tree_util.tree_leaves(f(xs, w)))  # noqa: E731
        want, got = jax.jit(jax.grad(loss(scan_rnn), (0, 1)))(xs, w), jax.jit(jax.grad(loss(opt), (0, 1)))(xs, w)
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        # the pass itself, unplanned: it reschedules the loop and keeps the mesh in the result types (whether the
        # planner keeps that schedule is XLA's say: on JAX 0.12 this 7-step loop's gradient w.r.t. xs grows)
        g = jaxform.passes.remat_loops(jaxform.trace(scan_rnn, xs, w), memory=memory)
        if memory == "min":
            assert any(n.name in ("remat2", "checkpoint") for n, _ in g.walk())   # the loop was rescheduled
        assert _types(g.evaluate(xs, w)) == _types(jax.jit(scan_rnn)(xs, w))


def test_remat_loops_data_parallel_rnn_explicit_batch_sharding():
    def loss(w, h0, xs):   # batch sharded over the 8 devices, explicitly
        _, hs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h0, xs)
        return jnp.sum(hs ** 2)
    sb = NamedSharding(EXPLICIT, P(None, "b"))
    w = jax.device_put(jnp.eye(4) * 0.5, NamedSharding(EXPLICIT, P()))
    h0 = jax.device_put(jnp.zeros((16, 4)), NamedSharding(EXPLICIT, P("b")))
    xs = jax.device_put(jnp.sin(jnp.arange(20 * 16 * 4.0)).reshape(20, 16, 4), sb)
    with jax.set_mesh(EXPLICIT):
        opt = jaxform.optimize(loss, passes=[], memory="min", strict=True)
        want, got = jax.jit(jax.grad(loss, (0, 2)))(w, h0, xs), jax.jit(jax.grad(opt, (0, 2)))(w, h0, xs)
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
            assert jax.typeof(b) == jax.typeof(a)   # same sharded types
        g = jaxform.trace(opt, w, h0, xs)
        assert sum(n.name == "scan" for n, _ in g.walk()) == 2   # √L: an outer and an inner scan


def test_remat_loops_leaves_device_varying_scan_in_shard_map():
    """A scan in shard_map whose carry varies over devices cannot be re-traced outside shard_map's
    axis environment: remat_loops must leave it (the check read `aval.vma`, which JAX 0.10+ avals no
    longer have, so memory="min" raised 'unbound axis name' and the pass was skipped)."""
    from jaxform.passes.remat_loops import reschedulable_why
    mesh = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Auto,))

    def inner(w, h0, xs):
        _, hs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h0, xs)
        return jnp.sum(hs ** 2, keepdims=True)[None]
    f = jax.shard_map(inner, mesh=mesh, in_specs=(P(), P("b"), P(None, "b")), out_specs=P("b"))
    w, h0, xs = jnp.eye(4) * 0.5, jnp.zeros((16, 4)), jnp.sin(jnp.arange(20 * 16 * 4.0)).reshape(20, 16, 4)
    opt = jaxform.optimize(f, passes=[], memory="min", strict=True)
    want = jax.grad(lambda *a: f(*a).sum(), (0, 2))(w, h0, xs)
    got = jax.grad(lambda *a: opt(*a).sum(), (0, 2))(w, h0, xs)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    (scan,) = [n for n, _ in jaxform.trace(f, w, h0, xs).walk() if n.name == "scan"]
    assert "vary across shard_map devices" in reschedulable_why(scan)
