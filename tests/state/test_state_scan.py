"""`jaxform.scan` (written on for_loop) must equal `lax.scan`: values, dtypes, grads."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxform.state import StateError, scan

R = np.random.RandomState(0)


def arr(*shape, dtype=np.float32):
    return jnp.asarray(R.randn(*shape).astype(dtype))


def mlp_cell(c, x):
    h = jnp.tanh(c["h"] @ c["W"] + x)
    return {"h": h, "W": c["W"]}, h.sum()


def rnn_tuple(c, x):
    h, n = c
    h = jnp.tanh(0.5 * h + x["a"] * x["b"])
    return (h, n + 1), (h, h * 2.0)


# (name, f, init, xs, kwargs): every program runs with default, reverse and unroll.
PROGRAMS = [
    ("cumsum", lambda c, x: (c + x, c + x), 0.0, arr(7), {}),
    ("cumprod", lambda c, x: (c * x, c), jnp.float32(1.0), arr(6), {}),
    ("python_int_init", lambda c, x: (c + x, c), 0, arr(5), {}),
    ("no_ys", lambda c, x: (c * 0.9 + x, None), jnp.zeros(3), arr(5, 3), {}),
    ("vector_carry", lambda c, x: (jnp.sin(c) * x, c.sum()), arr(4), arr(6, 4), {}),
    ("matrix_xs", lambda c, x: (c @ x, jnp.trace(x)), jnp.eye(3), arr(5, 3, 3) * 0.5, {}),
    ("xs_none_length", lambda c, _: (c * 1.1, c), arr(3), None, {"length": 6}),
    ("xs_none_counter", lambda c, _: ((c[0] + 1, c[1] * 0.5), c[0]), (0, arr(2)), None, {"length": 4}),
    ("length_matches_xs", lambda c, x: (c + x, c), 0.0, arr(5), {"length": 5}),
    ("pytree_xs_dict", lambda c, x: (c + x["u"] * x["v"], x["u"]), jnp.zeros(2), {"u": arr(4, 2), "v": arr(4, 2)}, {}),
    ("pytree_carry_tuple", rnn_tuple, (jnp.zeros(3), 0), {"a": arr(5, 3), "b": arr(5, 3)}, {}),
    ("pytree_carry_dict", mlp_cell, {"h": arr(4), "W": arr(4, 4) * 0.3}, arr(6, 4), {}),
    ("list_xs", lambda c, x: (c + x[0] - x[1], [x[0], c]), jnp.zeros(()), [arr(5), arr(5)], {}),
    ("nested_ys", lambda c, x: (c + x, {"a": (c, x * 2), "b": [x ** 2]}), 1.0, arr(4), {}),
    ("int_carry", lambda c, x: (c + x, c * 2), jnp.int32(1), jnp.arange(6, dtype=jnp.int32), {}),
    ("mixed_int_float", lambda c, x: ((c[0] + 1, c[1] + c[0] * x), c[1]), (jnp.int32(0), 0.0), arr(5), {}),
    ("bool_xs", lambda c, x: (jnp.where(x, c + 1.0, c * 0.5), x), 1.0, jnp.array([True, False, True, True]), {}),
    ("scalar_ys_only", lambda c, x: (c, c * x), 2.0, arr(5), {}),
    ("length_one", lambda c, x: (c * x, c), arr(3), arr(1, 3), {}),
    ("length_zero", lambda c, x: (c + x, c * x), arr(3), arr(0, 3), {}),
    ("closure_const", lambda c, x: (c + W @ x, jnp.dot(c, c)), jnp.zeros(3), arr(4, 3), {}),
    ("nested_scan", lambda c, x: scan(lambda d, y: (d * y + 1.0, d), c, x), jnp.ones(()), arr(3, 4), {}),
    ("nested_lax_inside", lambda c, x: lax.scan(lambda d, y: (d + y, d), c, x), 0.0, arr(3, 4), {}),
    ("cond_in_body", lambda c, x: (lax.cond(x > 0, lambda: c + x, lambda: c - x), c), 0.0, arr(6), {}),
    ("fori_in_body", lambda c, x: (lax.fori_loop(0, 3, lambda i, v: v * x + 0.1, c), c), arr(2), arr(4), {}),
    ("float16", lambda c, x: (c + x, c * x), jnp.zeros(2, jnp.float16), arr(5, 2, dtype=np.float16), {}),
    ("high_rank_ys", lambda c, x: (c + x.sum(), jnp.outer(x, x) * c), 0.0, arr(4, 3), {}),
    ("unroll_true", lambda c, x: (c * 0.5 + x, c), 0.0, arr(5), {"unroll": True}),
]
W = arr(3, 3)

MODES = [dict(), dict(reverse=True, unroll=3)]
SOME = ["cumsum", "python_int_init", "xs_none_counter", "pytree_carry_tuple", "int_carry", "closure_const"]


def close(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb, (ta, tb)
    for x, y in zip(la, lb):
        x, y = np.asarray(jnp.asarray(x)), np.asarray(jnp.asarray(y))
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, x.dtype, y.shape, y.dtype)
        tol = 1e-2 if x.dtype == np.float16 else 1e-5
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


def float_loss(s):
    def loss(init, xs):
        outs = [jnp.asarray(o) for o in jax.tree_util.tree_leaves(s(init, xs))]
        return sum(jnp.sum(jnp.sin(o.astype(jnp.float32))) for o in outs if jnp.issubdtype(o.dtype, jnp.floating))
    return loss


def diff_argnums(init, xs):
    is_float = lambda t: bool(jax.tree_util.tree_leaves(t)) and all(
        jnp.issubdtype(jnp.result_type(l), jnp.floating) and not isinstance(l, (int, float))
        for l in jax.tree_util.tree_leaves(t))
    return tuple(k for k, t in enumerate((init, xs)) if is_float(t))


@pytest.mark.parametrize("mode", MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "plain")
@pytest.mark.parametrize("name,f,init,xs,kw", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_scan_matches_lax(name, f, init, xs, kw, mode):
    kw = {**kw, **mode} if "unroll" not in kw else {**mode, **kw}
    ours = lambda i, x: scan(f, i, x, **kw)
    ref = lambda i, x: lax.scan(f, i, x, **kw)
    expected = ref(init, xs)
    close(jax.jit(ours)(init, xs), expected)
    if not mode:
        close(ours(init, xs), expected)
    argnums = diff_argnums(init, xs)
    if argnums and name != "float16":
        close(jax.grad(float_loss(ours), argnums)(init, xs), jax.grad(float_loss(ref), argnums)(init, xs))


@pytest.mark.parametrize("mode", [dict(reverse=True), dict(unroll=2), dict(unroll=100)], ids=str)
@pytest.mark.parametrize("name", SOME)
def test_scan_reverse_and_unroll_alone(name, mode):
    _, f, init, xs, kw = next(p for p in PROGRAMS if p[0] == name)
    close(scan(f, init, xs, **kw, **mode), lax.scan(f, init, xs, **kw, **mode))


def test_at_least_25_programs():
    assert len(PROGRAMS) >= 25


@pytest.mark.parametrize("name", ["vector_carry", "pytree_carry_dict", "nested_scan", "xs_none_length"])
def test_scan_forward_mode_and_vmap(name):
    _, f, init, xs, kw = next(p for p in PROGRAMS if p[0] == name)
    ours = lambda i, x: scan(f, i, x, **kw)
    ref = lambda i, x: lax.scan(f, i, x, **kw)
    close(jax.jacfwd(ours)(init, xs), jax.jacfwd(ref)(init, xs))
    t_init = jax.tree_util.tree_map(jnp.ones_like, init)
    close(jax.jvp(lambda i: ours(i, xs), (init,), (t_init,)), jax.jvp(lambda i: ref(i, xs), (init,), (t_init,)))
    batched = jax.tree_util.tree_map(lambda l: jnp.stack([l, 0.5 * l]), init)
    close(jax.vmap(ours, (0, None))(batched, xs), jax.vmap(ref, (0, None))(batched, xs))
    if xs is not None:
        bxs = jax.tree_util.tree_map(lambda l: jnp.stack([l, -l]), xs)
        close(jax.vmap(ours, (None, 0))(init, bxs), jax.vmap(ref, (None, 0))(init, bxs))


def test_scan_nested_transforms():
    f = lambda c, x: (jnp.tanh(c * x + 1.0), c ** 2)
    xs = arr(3, 5)
    loss = lambda s: (lambda c: float_loss(s)(c, xs))
    ours = lambda c, x: scan(f, c, x)
    ref = lambda c, x: lax.scan(f, c, x)
    cs = arr(4, 5)
    hess = lambda s: jax.jit(jax.vmap(jax.hessian(loss(s))))(cs)
    close(hess(ours), hess(ref))


def test_scan_closing_over_a_user_ref():
    def f(xs):
        seen = jax.new_ref(jnp.zeros(()))
        def step(c, x):
            seen[...] += x
            return c * x, seen[...]
        c, ys = scan(step, 1.0, xs)
        return c, ys, seen[...]
    xs = arr(5)
    c, ys, total = jax.jit(f)(xs)
    np.testing.assert_allclose(ys, np.cumsum(xs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, np.sum(xs), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(c, np.prod(xs), rtol=1e-5)
    g = jax.grad(lambda xs: f(xs)[2] + f(xs)[1].sum())(xs)
    np.testing.assert_allclose(g, 1 + np.arange(5, 0, -1), rtol=1e-5)


def test_scan_errors():
    with pytest.raises(StateError, match="carry"):
        scan(lambda c, x: (jnp.stack([c, c]), x), 0.0, arr(3))
    with pytest.raises(ValueError, match="inconsistent lengths"):
        scan(lambda c, x: (c, x), 0.0, arr(3), length=4)
    with pytest.raises(ValueError, match="length"):
        scan(lambda c, x: (c, x), 0.0, None)
    with pytest.raises(StateError, match="structure"):
        scan(lambda c, x: ((c, c), x), 0.0, arr(3))
