"""while_grad: jax.grad through data-dependent while loops equals the unrolled scan's gradient."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.passes.while_grad import WhileGradError, static_bound
from jaxform.ir import Graph


# ---- three programs: (cond, body, init(params)) and a loss of the final carry ----------------

def newton_parts(a):
    """x <- (x + a / x) / 2 until |x^2 - a| < tol: a vector square root, trip count from the data."""
    cond = lambda c: jnp.max(jnp.abs(c * c - a)) > 1e-5 * jnp.max(a)
    body = lambda c: 0.5 * (c + a / c)
    return cond, body, a + 1.0


def ode_parts(p):
    """Heun with an adaptive step on dy/dt = -k y + sin(w t), t from 0 to 3 (k, w = p[0], p[1])."""
    k, w = p[0], p[1]
    f = lambda t, y: -k * y + jnp.sin(w * t)

    def body(c):
        t, y, h = c
        h = jnp.minimum(h, 3.0 - t)
        k1 = f(t, y)
        k2 = f(t + h, y + h * k1)
        y_new = y + 0.5 * h * (k1 + k2)
        err = jnp.max(jnp.abs(0.5 * h * (k2 - k1))) + 1e-12
        accept = err <= 1e-3
        t, y = jnp.where(accept, t + h, t), jnp.where(accept, y_new, y)
        h = h * jnp.clip(0.9 * jnp.sqrt(1e-3 / err), 0.2, 5.0)
        return t, y, h
    cond = lambda c: c[0] < 3.0 - 1e-6
    return cond, body, (jnp.zeros((), p.dtype), p[2:], jnp.asarray(0.01, p.dtype))


def fixed_point_parts(p):
    """x <- tanh(W x + b) until converged, at most 200 steps (a static bound in the condition)."""
    n = 3
    W, b = p[:n * n].reshape(n, n), p[n * n:]

    def body(c):
        i, x, _ = c
        x2 = jnp.tanh(W @ x + b)
        return i + 1, x2, jnp.max(jnp.abs(x2 - x))
    cond = lambda c: (c[0] < 200) & (c[2] > 1e-4)
    return cond, body, (0, jnp.zeros(n, p.dtype), jnp.asarray(1.0, p.dtype))


PARTS = {"newton": newton_parts, "ode": ode_parts, "fixed_point": fixed_point_parts}



def params(name, dtype=np.float32, seed=0):
    r = np.random.RandomState(seed)
    if name == "newton":
        return jnp.asarray(r.uniform(0.5, 4.0, 5), dtype)
    if name == "ode":
        return jnp.asarray([1.5, 4.0, 1.0, -0.5], dtype)
    return jnp.asarray(np.concatenate([r.randn(9) * 0.4, r.randn(3)]), dtype)


def loss_of(c):
    return sum(jnp.sum(jnp.sin(x)) for x in jax.tree_util.tree_leaves(c) if jnp.issubdtype(x.dtype, jnp.inexact))


def while_loss(name):
    def f(p):
        cond, body, init = PARTS[name](p)
        return loss_of(lax.while_loop(cond, body, init))
    return f


def trip_count(name, p):
    cond, body, init = PARTS[name](p)
    n, _ = lax.while_loop(lambda s: cond(s[1]), lambda s: (s[0] + 1, body(s[1])), (0, init))
    return int(n)


def scan_loss(name, n):
    """The same loop unrolled as a scan of its actual length `n`: the gradient's reference."""
    def f(p):
        cond, body, init = PARTS[name](p)
        c, _ = lax.scan(lambda c, _: (body(c), None), init, None, length=n)
        return loss_of(c)
    return f


MAX = {"newton": 64, "ode": 400, "fixed_point": None}   # fixed_point: the bound is read from `i < 200`


def opt(name, memory="auto", max_steps="table"):
    return jaxform.optimize(while_loss(name), memory=memory, max_steps=MAX[name] if max_steps == "table" else max_steps)


@pytest.mark.parametrize("memory", ["auto", "min", 2 ** 16])
@pytest.mark.parametrize("name", list(PARTS))
def test_grad_equals_the_unrolled_scan(name, memory):
    p = params(name)
    n = trip_count(name, p)
    assert n > 3
    ref_v, ref_g = jax.value_and_grad(scan_loss(name, n))(p)
    f = opt(name, memory)
    v, g = jax.value_and_grad(f)(p)
    assert v == while_loss(name)(p)          # the value comes from the while loop, unchanged
    np.testing.assert_allclose(g, ref_g, rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(v, ref_v, rtol=1e-6)
    jv, jg = jax.jit(jax.value_and_grad(f))(p)
    np.testing.assert_allclose(jg, ref_g, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(PARTS))
def test_grad_matches_finite_differences_in_float64(name):
    with jax.enable_x64(True):
        p = params(name, np.float64)
        g = jax.jit(jax.grad(opt(name)))(p)
        f = jax.jit(while_loss(name))
        n = trip_count(name, p)
        eps = 1e-6
        for i in range(p.shape[0]):
            e = jnp.zeros_like(p).at[i].set(eps)
            assert trip_count(name, p + e) == n == trip_count(name, p - e)   # FD of one discrete program
            fd = (f(p + e) - f(p - e)) / (2 * eps)
            np.testing.assert_allclose(g[i], fd, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(g, jax.grad(scan_loss(name, n))(p), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ["newton", "fixed_point"])
def test_vmap_of_grad_each_lane_its_own_trip_count(name):
    ps = jnp.stack([params(name, seed=s) * (4.0 ** s if name == "newton" else 1.0) for s in range(4)])
    counts = [trip_count(name, p) for p in ps]
    g = jax.jit(jax.vmap(jax.grad(opt(name))))(ps)
    for p, n, gi in zip(ps, counts, g):
        np.testing.assert_allclose(gi, jax.grad(scan_loss(name, n))(p), rtol=2e-5, atol=1e-6)
    assert len(set(counts)) > 1


def test_forward_runs_the_while_loop_alone():
    """Without differentiation the compiled program is the original while loop: no bounded scan."""
    p = params("ode")
    plain = jax.jit(while_loss("ode")).lower(p).as_text()
    ours = jax.jit(opt("ode")).lower(p).as_text()
    assert ours.count("stablehlo.while") == plain.count("stablehlo.while") == 1
    assert jax.jit(opt("ode"))(p) == jax.jit(while_loss("ode"))(p)


def test_forward_mode_still_works_and_matches_plain():
    p = params("newton")
    t = jnp.ones_like(p)
    ref = jax.jvp(while_loss("newton"), (p,), (t,))
    out = jax.jvp(opt("newton"), (p,), (t,))
    np.testing.assert_allclose(out[1], ref[1], rtol=2e-5)
    assert out[0] == ref[0]


def test_past_the_bound_the_gradient_is_nan_and_the_value_exact():
    p = params("ode")
    n = trip_count("ode", p)
    f = opt("ode", max_steps=n - 1)
    v, g = jax.jit(jax.value_and_grad(f))(p)
    assert v == while_loss("ode")(p)
    assert np.all(np.isnan(g))
    _, g = jax.jit(jax.value_and_grad(opt("ode", max_steps=n)))(p)   # exactly enough steps
    assert np.all(np.isfinite(g))


def test_no_bound_is_a_clear_error_naming_the_function_and_forward_mode_keeps_working():
    def my_solver(p):
        cond, body, init = PARTS["newton"](p)
        return loss_of(lax.while_loop(cond, body, init))
    f = jaxform.optimize(my_solver, memory="auto")
    p = params("newton")
    with pytest.raises(WhileGradError, match=r"my_solver.*max_steps=N"):
        jax.grad(f)(p)
    with pytest.raises(WhileGradError, match="my_solver"):
        jax.jit(jax.grad(f))(p)
    np.testing.assert_allclose(jax.jvp(f, (p,), (jnp.ones_like(p),))[1],
                               jax.jvp(my_solver, (p,), (jnp.ones_like(p),))[1], rtol=1e-6)
    assert f(p) == my_solver(p)


@pytest.mark.parametrize("bad,err,match", [(0, ValueError, ">= 1"), (2.5, TypeError, "positive int"),
                                            (True, TypeError, "positive int")])
def test_max_steps_is_checked_when_optimize_is_called(bad, err, match):
    with pytest.raises(err, match=match):
        jaxform.optimize(while_loss("newton"), max_steps=bad)
    with pytest.raises(ValueError, match="needs memory"):
        jaxform.optimize(while_loss("newton"), memory=None, max_steps=10)
    with pytest.raises(ValueError, match="needs memory"):
        jaxform.optimize(while_loss("newton"), passes=["dce"], max_steps=10)


def test_static_bounds_read_from_the_condition():
    def bound(fn, *args):
        g = Graph.from_jaxpr(jax.make_jaxpr(fn)(*args))
        return [static_bound(n) for n in g.nodes if n.name == "while"]
    x = jnp.ones(3)
    body = lambda c: (c[0] + 1, c[1] * 0.9)
    assert bound(lambda x: lax.while_loop(lambda c: c[0] < 50, body, (0, x)), x) == [50]
    assert bound(lambda x: lax.while_loop(lambda c: c[0] <= 50, body, (10, x)), x) == [41]
    assert bound(lambda x: lax.while_loop(lambda c: 50 > c[0], body, (0, x)), x) == [50]
    assert bound(lambda x: lax.while_loop(lambda c: (c[1].sum() > 1) & (c[0] < 7), body, (0, x)), x) == [7]
    assert bound(lambda x: lax.while_loop(lambda c: c[1].sum() > 1, body, (0, x)), x) == [None]
    assert bound(lambda x, i: lax.while_loop(lambda c: c[0] < 50, body, (i, x)), x, 0) == [None]   # traced start
    assert bound(lambda x: lax.while_loop(lambda c: c[0] < 50, lambda c: (c[0] + 2, c[1]), (0, x)), x) == [None]


def _temp(f, *args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_memory_grows_like_the_square_root_of_the_bound():
    """A 64-wide fixed-point carry, bounds 100 / 400 / 1600: √-checkpointing keeps ~2√N carries."""
    r = np.random.RandomState(1)
    W = jnp.asarray(r.randn(64, 64) * 0.1, np.float32)

    def f(b, n):
        def body(c):
            i, x = c
            return i + 1, jnp.tanh(jnp.sin(x) @ W + b)
        return jnp.sum(lax.while_loop(lambda c: (c[0] < n), body, (0, jnp.zeros((32, 64))))[1])

    b = jnp.ones((32, 64))
    mem = {n: _temp(jax.grad(jaxform.optimize(lambda b, n=n: f(b, n), memory="min")), b) for n in (100, 400, 1600)}
    scan_mem = _temp(jax.grad(lambda b: jnp.sum(lax.scan(
        lambda x, _: (jnp.tanh(jnp.sin(x) @ W + b), None), jnp.zeros((32, 64)), None, length=1600)[0])), b)
    print({k: v / 2 ** 20 for k, v in mem.items()}, scan_mem / 2 ** 20)
    assert mem[1600] < mem[100] * 6          # 16x the steps, about 4x the memory (√16)
    assert mem[1600] < scan_mem / 8          # plain JAX's scan of the same length stores every step


def test_typed_key_in_the_carry_and_a_custom_vjp_in_the_body():
    """Found by the attack on this pass: with a typed PRNG key argument the optimize-time check of the rules
    while_grad installs asked NumPy for the dtype key<fry>, raised, and the pass was skipped (grad then
    failed as plain JAX's). Keys are not differentiated; the gradient equals the 3-step scan's."""
    @jax.custom_vjp
    def cv(a):
        return jnp.sin(a)
    cv.defvjp(lambda a: (jnp.sin(a), a), lambda a, g: (g * 3.0,))

    def step(c, k):
        k, sub = jax.random.split(k)
        return cv(c) + jax.random.normal(sub, c.shape) * 0.1, k

    def f(x, key):
        def body(s):
            i, c, k = s
            c, k = step(c, k)
            return i + 1, c, k
        return lax.while_loop(lambda s: s[0] < 3, body, (0, x, key))[1].sum()

    def f_scan(x, key):
        (c, _), _ = lax.scan(lambda ck, _: (step(*ck), None), (x, key), None, length=3)
        return c.sum()
    x, key = jnp.array([1.0, 2.0]), jax.random.key(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = jax.grad(jaxform.optimize(f, memory="auto", max_steps=5))(x, key)
    np.testing.assert_allclose(g, jax.grad(f_scan)(x, key), rtol=1e-6)
