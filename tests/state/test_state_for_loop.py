"""for_loop programs against NumPy, their gradients against finite differences,
every transformation (jit, jvp/jacfwd, grad, vmap of values and of indices,
nesting), closed-over refs, and the errors a user sees."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

from jaxform.state import StateError, for_loop

R = np.random.RandomState(0)


def arr(*shape):
    return jnp.asarray(R.randn(*shape).astype(np.float32))


# ------------------------------------------------------------------ programs

def cumsum(x):
    def body(i, r):
        r[i + 1] += r[i]
    return for_loop(x.shape[0] - 1, body, x)


def histogram(w, idx, bins=5):
    w, idx = jnp.asarray(w), jnp.asarray(idx)
    def body(i, h):
        h[idx[i]] += w[i]
    return for_loop(w.shape[0], body, jnp.zeros(bins, w.dtype))


def fill_rows(a):  # m[i, :] = a * (i + 1) ** 2
    def body(i, m):
        m[i] = a * ((i + 1.0) ** 2)
    return for_loop(4, body, jnp.zeros((4, a.shape[0])))


def fill_cols(a):  # m[:, j] = sin(a * j)
    def body(j, m):
        m[:, j] = jnp.sin(a * j)
    return for_loop(3, body, jnp.zeros((a.shape[0], 3)))


def prefix_sum(x):
    """Hillis-Steele inclusive scan in place: each level walks right to left, so
    r[i] is read before this level overwrites it."""
    n, out, step = x.shape[0], x, 1
    while step < n:  # the step size is static, so each level is its own loop
        def body(i, r, step=step):
            r[i + step] += r[i]
        out = for_loop(n - step, body, out, reverse=True)
        step *= 2
    return out


def gauss_seidel(A, b, sweeps=3):
    A, b = jnp.asarray(A), jnp.asarray(b)
    n = b.shape[0]
    def sweep(s, x):
        def row(i, _):
            off = A[i] @ x[...] - A[i, i] * x[i]
            x[i] = (b[i] - off) / A[i, i]
        for_loop(n, row, ())
    return for_loop(sweeps, sweep, jnp.zeros_like(b))


def np_gauss_seidel(A, b, sweeps=3):
    A, b = np.asarray(A, np.float64), np.asarray(b, np.float64)
    x = np.zeros_like(b)
    for _ in range(sweeps):
        for i in range(len(b)):
            x[i] = (b[i] - (A[i] @ x - A[i, i] * x[i])) / A[i, i]
    return x


SPD = jnp.asarray(np.eye(4) * 4 + R.rand(4, 4) * 0.5, jnp.float32)
IDX = jnp.array([0, 3, 3, 1, 4, 0, 3])


def test_programs_match_numpy():
    x, a, w = arr(6), arr(5), arr(7)
    np.testing.assert_allclose(cumsum(x), np.cumsum(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(histogram(w, IDX), np.bincount(np.asarray(IDX), np.asarray(w), 5), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fill_rows(a), np.outer((np.arange(4) + 1.0) ** 2, a), rtol=1e-5)
    np.testing.assert_allclose(fill_cols(a), np.sin(np.outer(a, np.arange(3))), rtol=1e-5, atol=1e-6)
    for n in (1, 2, 5, 8, 11):
        y = arr(n)
        np.testing.assert_allclose(prefix_sum(y), np.cumsum(y), rtol=1e-5, atol=1e-5)
    b = arr(4)
    np.testing.assert_allclose(gauss_seidel(SPD, b), np_gauss_seidel(SPD, b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gauss_seidel(SPD, b, 30), np.linalg.solve(SPD, b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn,args", [
    (cumsum, (arr(5),)), (lambda w: histogram(w, IDX), (arr(7),)), (fill_rows, (arr(3),)),
    (fill_cols, (arr(3),)), (prefix_sum, (arr(6),)), (gauss_seidel, (SPD, arr(4))),
], ids=["cumsum", "histogram", "fill_rows", "fill_cols", "prefix_sum", "gauss_seidel"])
def test_grads_match_finite_differences(fn, args):
    check_grads(jax.jit(fn), args, order=1, modes=("fwd", "rev"), atol=2e-2, rtol=2e-2)


def test_second_order_grads():
    f = jax.jit(lambda A, b: jnp.sum(gauss_seidel(A, b, 2) ** 2))
    check_grads(f, (SPD, arr(4)), order=2, modes=("rev",), atol=5e-2, rtol=5e-2)  # fwd-over-rev: nesting test


# ------------------------------------------------------------------ transformations

def test_jit_jvp_jacfwd_jacrev():
    x = arr(5)
    expected = np.tril(np.ones((5, 5), np.float32))
    np.testing.assert_allclose(jax.jit(cumsum)(x), np.cumsum(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(cumsum)(x), expected)
    np.testing.assert_allclose(jax.jacrev(cumsum)(x), expected)
    _, t = jax.jvp(cumsum, (x,), (jnp.ones(5),))
    np.testing.assert_allclose(t, np.arange(1, 6), rtol=1e-6)


def test_vmap_batched_values_and_indices():
    ws, idxs = arr(3, 7), jnp.asarray(R.randint(0, 5, (3, 7)))
    ref = np.stack([np.bincount(np.asarray(i), np.asarray(w), 5) for w, i in zip(ws, idxs)])
    np.testing.assert_allclose(jax.vmap(histogram)(ws, idxs), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(histogram, (None, 0))(ws[0], idxs), np.stack(
        [np.bincount(np.asarray(i), np.asarray(ws[0]), 5) for i in idxs]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(histogram, (0, None))(ws, IDX), np.stack(
        [np.bincount(np.asarray(IDX), np.asarray(w), 5) for w in ws]), rtol=1e-5, atol=1e-6)
    # an index that is batched while the written array is not: r is batched by the write
    def scatter_one(i, v):
        return for_loop(1, lambda _, r: r.__setitem__(i, v), jnp.zeros(4))
    np.testing.assert_allclose(jax.vmap(scatter_one, (0, None))(jnp.arange(4), 2.0), 2 * np.eye(4))
    # gradient of a batched-index program, per example
    g = jax.vmap(jax.grad(lambda w, i: jnp.sum(histogram(w, i) ** 2)))(ws, idxs)
    h = np.stack([np.bincount(np.asarray(i), np.asarray(w), 5) for w, i in zip(ws, idxs)])
    np.testing.assert_allclose(g, 2 * np.take_along_axis(h, np.asarray(idxs), 1), rtol=1e-5, atol=1e-5)


def test_nesting_of_transformations():
    A, bs = SPD, arr(3, 4)
    loss = lambda b: jnp.sum(jnp.sin(gauss_seidel(A, b, 2)))
    ours = jax.jit(jax.vmap(jax.jacfwd(jax.grad(loss))))(bs)
    rr = jax.jit(jax.vmap(jax.jacrev(jax.grad(loss))))(bs)  # reverse-over-reverse agrees with forward-over-reverse
    assert ours.shape == (3, 4, 4)
    np.testing.assert_allclose(ours, rr, rtol=1e-4, atol=1e-5)
    g = jax.jit(jax.grad(loss))
    fd = (g(bs[0] + 1e-2 * jnp.eye(4)[1]) - g(bs[0] - 1e-2 * jnp.eye(4)[1])) / 2e-2
    np.testing.assert_allclose(ours[0, :, 1], fd, rtol=2e-2, atol=2e-2)
    gv = jax.grad(lambda b: jnp.sum(jax.vmap(cumsum)(b) ** 2))(bs)
    np.testing.assert_allclose(gv, jax.grad(lambda b: jnp.sum(jnp.cumsum(b, 1) ** 2))(bs), rtol=1e-5, atol=1e-5)


def test_traced_trip_count_reverse_and_unroll():
    x = arr(6)
    def partial_cumsum(x, n):
        def body(i, r):
            r[i + 1] += r[i]
        return for_loop(n, body, x)
    np.testing.assert_allclose(jax.jit(partial_cumsum)(x, 3), np.concatenate([np.cumsum(x[:4]), x[4:]]), rtol=1e-5)
    _, t = jax.jvp(lambda x: jax.jit(partial_cumsum)(x, 3), (x,), (jnp.ones(6),))  # while loop: fwd mode works
    np.testing.assert_allclose(t, [1, 2, 3, 4, 1, 1])
    order = for_loop(4, lambda i, r: r.__setitem__(i, r[4] * 1.0 + 0 * r[i]) or r.__setitem__(4, i * 1.0),
                     jnp.zeros(5), reverse=True)
    np.testing.assert_allclose(order, [1, 2, 3, 0, 0])  # i = 3, 2, 1, 0: each slot sees the previous i
    for u in (1, 2, 3, True):
        np.testing.assert_allclose(for_loop(5, lambda i, r: r.__setitem__(i + 1, r[i] * 2), jnp.ones(6), unroll=u),
                                   2.0 ** np.arange(6))


def test_batched_trip_count_and_empty_loops():
    def partial_sum(n):
        return for_loop(n, lambda i, r: r.__setitem__(..., r[...] + i), jnp.float32(0))
    np.testing.assert_allclose(jax.vmap(partial_sum)(jnp.array([0, 1, 4, 6])), [0, 0, 6, 15])
    x = arr(3)
    for n in (0, -2):
        np.testing.assert_array_equal(for_loop(n, lambda i, r: r.__setitem__(i, 0.0), x), x)
        np.testing.assert_array_equal(for_loop(n, lambda i, r: r.__setitem__(i, 0.0), x, reverse=True), x)


def test_pytree_init_and_closed_over_refs():
    def two(x):
        def body(i, refs):
            refs["s"][...] += refs["v"][i]
            refs["v"][i] = refs["s"][...]
        return for_loop(x.shape[0], body, {"s": jnp.float32(0), "v": x})
    x = arr(5)
    out = two(x)
    np.testing.assert_allclose(out["v"], np.cumsum(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["s"], np.sum(x), rtol=1e-5, atol=1e-6)

    def user_ref(x):  # a user's own jax.new_ref, closed over by the body
        acc = jax.new_ref(jnp.zeros(()))
        def body(i, r):
            acc[...] += r[i] ** 2
            r[i] = acc[...]
        out = for_loop(x.shape[0], body, x)
        return out, acc[...]
    out, total = jax.jit(user_ref)(x)
    np.testing.assert_allclose(out, np.cumsum(np.asarray(x) ** 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, np.sum(np.asarray(x) ** 2), rtol=1e-5)
    g = jax.grad(lambda x: user_ref(x)[1])(x)
    np.testing.assert_allclose(g, 2 * x, rtol=1e-5)


def test_body_may_use_lax_loops_over_refs():
    def f(x):
        def body(i, r):
            lax.fori_loop(0, 3, lambda k, c: r.__setitem__(i, r[i] * 2.0) or c, None)
        return for_loop(x.shape[0], body, x)
    x = arr(4)
    np.testing.assert_allclose(f(x), 8 * np.asarray(x), rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x).sum())(x), 8 * np.ones(4))


def test_result_has_no_refs():
    jaxpr = jax.make_jaxpr(gauss_seidel)(SPD, arr(4))
    text = str(jaxpr)
    assert "Ref" not in text and "new_ref" not in text and not jaxpr.effects


# ------------------------------------------------------------------ errors

def _line_of(fn, offset):
    return f"{inspect.getsourcefile(fn)}:{fn.__code__.co_firstlineno + offset}"


def test_error_wrong_shape_names_the_line():
    def body(i, r):
        r[i] = jnp.zeros(3)
    with pytest.raises(ValueError) as e:
        for_loop(2, body, jnp.zeros((4, 2)))
    assert isinstance(e.value, StateError) and _line_of(body, 1) in str(e.value)
    assert "r[i] = jnp.zeros(3)" in str(e.value) and "shape" in str(e.value)


def test_error_wrong_dtype_names_the_line():
    def body(i, r):
        r[i] = jnp.int32(1)
    with pytest.raises(TypeError) as e:  # StateError is both a ValueError and a TypeError
        for_loop(2, body, jnp.zeros(4))
    assert _line_of(body, 1) in str(e.value) and "dtype" in str(e.value)


def test_error_too_many_indices_names_the_line():
    def body(i, r):
        r[i, 0] += 1.0
    with pytest.raises(StateError) as e:
        jax.jit(lambda x: for_loop(2, body, x))(jnp.zeros(4))
    assert _line_of(body, 1) in str(e.value) and "indices" in str(e.value)


def test_error_in_nested_loop_names_inner_line():
    def outer(i, r):
        def inner(j, _):
            r[i, j] = jnp.ones(2)
        for_loop(2, inner, ())
    with pytest.raises(StateError) as e:
        for_loop(2, outer, jnp.zeros((2, 2)))
    assert _line_of(outer, 2) in str(e.value)


def test_error_body_returns_something():
    def body(i, r):
        r[i] = 1.0
        return r
    with pytest.raises(TypeError, match="must return None") as e:
        for_loop(2, body, jnp.zeros(4))
    assert _line_of(body, 0) in str(e.value)


def test_user_exceptions_pass_through():
    def body(i, r):
        raise KeyError("mine")
    with pytest.raises(KeyError, match="mine"):
        for_loop(2, body, jnp.zeros(4))
