"""Builder: graphs built without tracing equal the traced jax.numpy programs, and errors name the culprit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import Builder, BuildError, to_function
from jaxform._jax import check_jaxpr
from jaxform.testing import assert_same

r = np.random.default_rng(0)
A = jnp.asarray(r.normal(size=(3, 4)), jnp.float32)
W = jnp.asarray(r.normal(size=(4,)), jnp.float32)


def _checked(g):
    check_jaxpr(g.to_jaxpr())
    return to_function(g)


def test_elementwise_matmul_reduce_matches_jnp():
    b = Builder()
    x, w = b.arg((3, 4), name="x"), b.arg((4,), name="w")
    y = b.tanh(x @ w) * 2.0 + b.exp(-b.reduce_sum(x * x, 1)) / 3.0 - 1.0
    f = _checked(b.build(y))
    ref = lambda x, w: jnp.tanh(x @ w) * 2 + jnp.exp(-jnp.sum(x * x, 1)) / 3 - 1
    assert_same(ref, f, A, W)


def test_shape_ops_and_indexing():
    b = Builder()
    x = b.arg((3, 4))
    parts = [b.transpose(x, (1, 0)), b.reshape(x, (2, -1)), b.broadcast_to(b.index(x, (slice(None), 1)), (2, 3)),
             b.index(x, (slice(None, None, -1), slice(3, 0, -2))), b.index(x, (1, None, Ellipsis)),
             b.concatenate([x, x], 0), b.expand_dims(x, [0, -1]), b.squeeze(b.reshape(x, (3, 1, 4)), [1]),
             b.convert(x, jnp.int32), b.where(x > 0, x, 0.5), b.reduce_max(x, 0), b.argmax(x, 1),
             b.pad(x, 0.0, [(1, 0, 0), (0, 2, 1)]), b.rev(x, [1]), b.iota(jnp.int32, (3, 4), 1) * 2]
    f = _checked(b.build(parts))
    ref = lambda x: [x.T, x.reshape(2, -1), jnp.broadcast_to(x[:, 1], (2, 3)), x[::-1, 3:0:-2], x[1, None, ...],
                     jnp.concatenate([x, x]), x[None, :, :, None], x, x.astype(jnp.int32), jnp.where(x > 0, x, 0.5),
                     x.max(0), jnp.argmax(x, 1), lax.pad(x, 0.0, [(1, 0, 0), (0, 2, 1)]), x[:, ::-1],
                     lax.broadcasted_iota(jnp.int32, (3, 4), 1) * 2]
    assert_same(ref, lambda x: list(f(x)), A)


def test_dot_general_and_batched_matmul():
    b = Builder()
    x, y, v = b.arg((2, 3, 4)), b.arg((4, 5)), b.arg((4,))
    f = _checked(b.build([b.matmul(x, y), b.matmul(x, v), b.matmul(v, y), b.dot(v, v),
                          b.dot_general(x, x, ((2,), (2,)), ((0,), (0,)))]))
    X, Y, V = (jnp.asarray(r.normal(size=s), jnp.float32) for s in [(2, 3, 4), (4, 5), (4,)])
    ref = lambda x, y, v: [x @ y, x @ v, v @ y, v @ v, jnp.einsum("bik,bjk->bij", x, x)]
    assert_same(ref, lambda *a: list(f(*a)), X, Y, V)


def test_const_and_literals():
    b = Builder()
    x = b.arg((3,))
    c = b.const(np.array([1.0, 2.0, 3.0], np.float32), name="c")
    y = 2.0 * x + c - 1 + np.float32(0.5) * x
    g = b.build(y)
    assert len(g.consts) == 1
    f = _checked(g)
    assert_same(lambda x: 2 * x + jnp.array([1.0, 2, 3]) - 1 + 0.5 * x, f, W[:3])


def test_bind_by_name_and_primitive():
    b = Builder()
    x = b.arg((4,))
    y = b.bind("integer_pow", x, y=3)
    z = b.bind(jaxform._jax.primitive("cumsum"), y, axis=0, reverse=False)
    assert_same(lambda x: jnp.cumsum(x ** 3), _checked(b.build(z)), W)


def test_scan_with_capture_and_reverse():
    b = Builder()
    xs, c0, s = b.arg((5, 3), name="xs"), b.arg((3,), name="c0"), b.arg((), name="s")
    (c,), (ys,) = b.scan(lambda bb, c, x: (c * 0.9 + x * s, bb.sin(c)), [], [c0], [xs], reverse=True)
    g = b.build([c, ys])
    f = _checked(g)
    node = next(n for n in g.nodes if n.name == "scan")
    assert node.params["num_consts"] == 1 and node.params["reverse"] and node.params["length"] == 5

    def ref(xs, c0, s):
        c, ys = lax.scan(lambda c, x: (c * 0.9 + x * s, jnp.sin(c)), c0, xs, reverse=True)
        return [c, ys]
    XS = jnp.asarray(r.normal(size=(5, 3)), jnp.float32)
    assert_same(ref, lambda *a: list(f(*a)), XS, W[:3], jnp.float32(0.7))


def test_scan_body_as_graph_with_consts():
    body = Builder()
    c, x = body.arg(()), body.arg(())
    k = body.const(np.arange(2, dtype=np.float32))
    out = body.reduce_sum(k * x) + c
    bg = body.build([out, out * 2.0])
    b = Builder()
    xs, c0 = b.arg((4,)), b.arg(())
    (cf,), (ys,) = b.scan(bg, [], [c0], [xs])
    f = _checked(b.build([cf, ys]))

    def ref(xs, c0):
        def step(c, x):
            o = jnp.sum(jnp.arange(2.0) * x) + c
            return o, o * 2
        return list(lax.scan(step, c0, xs))
    assert_same(ref, lambda *a: list(f(*a)), W, jnp.float32(1.0))


def test_cond_switch_and_bool():
    b = Builder()
    i, x = b.arg((), jnp.int32), b.arg((3,))
    y = b.arg((3,), name="y")
    (o,) = b.cond(i, [lambda bb, x: bb.sin(x) * y, lambda bb, x: x * 2.0, lambda bb, x: bb.cos(x)], x)
    f = _checked(b.build(o))
    ref = lambda i, x, y: lax.switch(i, [lambda x: jnp.sin(x) * y, lambda x: x * 2, jnp.cos], x)
    for k in (0, 1, 2, 7, -3):  # clamped like lax.switch
        np.testing.assert_allclose(f(k, W[:3], W[1:]), ref(k, W[:3], W[1:]), rtol=1e-6)
    assert_same(lambda x, y: ref(1, x, y), lambda x, y: f(1, x, y), W[:3], W[1:])
    b = Builder()
    p, x = b.arg((), jnp.bool_), b.arg(())
    (o,) = b.cond(p, [lambda bb, x: -x, lambda bb, x: x + 1.0], x)
    f = _checked(b.build(o))
    assert float(f(True, 2.0)) == 3.0 and float(f(False, 2.0)) == -2.0


def test_while_loop():
    b = Builder()
    x, n = b.arg(()), b.arg((), jnp.int32)
    _, acc = b.while_loop(lambda bb, i, a: i < n, lambda bb, i, a: (i + 1, a * x), [b.const(0, jnp.int32), 1.0])
    f = _checked(b.build(acc))
    ref = lambda x, n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]
    assert float(f(2.0, 5)) == 32.0
    np.testing.assert_allclose(jax.jit(jax.vmap(f))(jnp.array([2.0, 3.0]), jnp.array([3, 2])), [8.0, 9.0])
    np.testing.assert_allclose(jax.jit(f)(1.5, 3), ref(1.5, 3))


def test_trace_and_call_splice():
    b = Builder()
    x = b.arg((3, 4))
    y = b.trace(lambda a: jax.nn.softplus(a) @ jnp.ones((4,)), x)
    inner = jaxform.trace(lambda a: a * 3.0, jax.ShapeDtypeStruct((3,), jnp.float32))
    (z,) = b.call(inner, y)
    assert_same(lambda a: jax.nn.softplus(a) @ jnp.ones(4) * 3, _checked(b.build(z)), A)


def test_to_function_composes_with_jit_vmap_grad():
    b = Builder()
    x, w = b.arg((4,)), b.arg((4,))
    f = to_function(b.build(b.reduce_sum(b.tanh(x * w))))
    ref = lambda x, w: jnp.sum(jnp.tanh(x * w))
    np.testing.assert_allclose(jax.grad(f, argnums=(0, 1))(W, W * 2), jax.grad(ref, argnums=(0, 1))(W, W * 2),
                               rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(f, (0, None)))(jnp.stack([W, -W]), W),
                               jax.vmap(ref, (0, None))(jnp.stack([W, -W]), W), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(jax.grad(lambda a: f(a * W, W).sum())))(0.3),
                               jax.grad(jax.grad(lambda a: ref(a * W, W)))(0.3), rtol=1e-5)


def test_build_drops_unused_work():
    b = Builder()
    x = b.arg((3,))
    b.exp(x) * 3.0  # dead
    g = b.build(b.sin(x))
    assert [n.name for n in g.nodes] == ["sin"]
    assert all(len(v.uses) == 1 for v in g.inputs)


# ---- errors -------------------------------------------------------------------------

def test_shape_mismatch_names_primitive_and_operands():
    b = Builder()
    x, w = b.arg((3, 4), name="x"), b.arg((3,), name="w")
    with pytest.raises(BuildError, match=r"dot_general(.|\n)*operand 0 \(x: float32\[3,4\]\)(.|\n)*"
                                         r"operand 1 \(w: float32\[3\]\)"):
        x @ w
    assert isinstance(BuildError("x"), TypeError)
    assert x.value.uses == [] and w.value.uses == []  # the failed node left no trace
    with pytest.raises(BuildError, match=r"add(.|\n)*operand 1 \(k: int32\[3,4\]\)"):
        x + b.arg((3, 4), jnp.int32, name="k")
    with pytest.raises(BuildError, match=r"mul(.|\n)*result of exp: float32\[3\]"):
        x * b.exp(w)


def test_region_and_loop_errors():
    b = Builder()
    xs, c0 = b.arg((5, 3)), b.arg((3,))
    with pytest.raises(BuildError, match=r"scan: the body returns carry \(float32\[\]\) but the carry is "
                                         r"\(float32\[3\]\)"):
        b.scan(lambda bb, c, x: (bb.reduce_sum(c), x), [], [c0], [xs])
    with pytest.raises(BuildError, match="length=4 but xs have leading sizes"):
        b.scan(lambda bb, c, x: (c, x), [], [c0], [xs], length=4)
    with pytest.raises(BuildError, match="branch 1 returns"):
        b.cond(b.arg((), jnp.int32), [lambda bb, x: x, lambda bb, x: bb.reduce_sum(x)], c0)
    with pytest.raises(BuildError, match="cond must return one bool"):
        b.while_loop(lambda bb, c: c, lambda bb, c: c, [c0])
    other = Builder().arg((3,))
    with pytest.raises(BuildError, match="belongs to another Builder"):
        b.add(c0, other)
    with pytest.raises(BuildError, match="cannot broadcast"):
        b.broadcast_to(c0, (2, 4))
    with pytest.raises(BuildError, match="reshape cannot"):
        b.reshape(c0, (2, 2))
    with pytest.raises(BuildError, match="non-negative ints"):
        b.arg((None, 3), name="q")
    with pytest.raises(ValueError, match="no JAX primitive named 'tanhh'"):
        b.bind("tanhh", c0)


def test_built_builder_is_closed():
    b = Builder()
    x = b.arg(())
    b.build(x)
    with pytest.raises(BuildError, match="already"):
        b.sin(x)
    with pytest.raises(BuildError, match="already"):
        b.build(x)


def test_out_of_range_axes_raise():
    """Issue 15, finding 10: axes never wrap around (reduce_sum(x, (2,)) on rank 2 reduced axis 0)."""
    b = Builder()
    x = b.arg((3, 4), name="x")
    for call in [lambda: b.reduce_sum(x, (2,)), lambda: b.reduce_max(x, -3), lambda: b.argmax(x, 2),
                 lambda: b.argmin(x, -3), lambda: b.concatenate([x, x], 2), lambda: b.squeeze(x, (5,)),
                 lambda: b.expand_dims(x, (3,)), lambda: b.reduce_sum(x, (0, 0)), lambda: b.reduce_sum(x, 1.0)]:
        with pytest.raises(BuildError, match=r"axis .*out of range|repeated axis|axis 1.0"):
            call()
    with pytest.raises(BuildError, match="not all size 1"):
        b.squeeze(x, (0,))
    y = [b.reduce_sum(x, -1), b.argmax(x, -2), b.expand_dims(x, (-1,)), b.concatenate([x, x], -1)]
    f = to_function(b.build(y))
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    want = [a.sum(-1), a.argmax(-2), a[..., None], np.concatenate([a, a], -1)]
    for w, g in zip(want, f(a)):
        np.testing.assert_array_equal(g, w)
