"""Sharding on 8 host CPU devices: optimized programs keep results, output shardings and constraints."""
import re

import jax
import jax.numpy as jnp
import numpy as np
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
