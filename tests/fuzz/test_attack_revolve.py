"""Attack on revolve's forward mode (commit "revolve: forward mode (issue 26 finding 4)"): scan_revolve as a
custom_jvp whose tangent is a linear_call transposed by the binomial schedule, and _jax's linear_call batching /
jvp rules. Plain tests: behaviour that held (a representative handful). xfail(strict=True): bugs found.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.custom_derivatives import linear_call

import jaxform
from jaxform import _jax

OLD_JAX = _jax.JAX_VERSION < (0, 12)


pytestmark = pytest.mark.usefixtures("revolve_as_scheduled")   # (tests/conftest.py: revolve, not measured)


def _opt(f, memory=1):
    return jaxform.optimize(f, passes=["hoist_loop_invariants", "dce"], memory=memory, strict=True)


def _is_revolve(opt, *args) -> bool:
    return "custom_jvp" in str(jaxform.trace(opt, *args))


def _close(got, want, rtol=1e-4, atol=1e-5):
    jax.tree_util.tree_map(lambda g, w: np.testing.assert_allclose(g, w, rtol=rtol, atol=atol), got, want)


def _rnn(w, xs):
    def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    h, ys = lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    return jnp.sum(ys ** 2) + jnp.sum(h)


W = np.eye(4, dtype=np.float32) * 0.5 + 0.1
XS = np.linspace(-1, 1, 20 * 12, dtype=np.float32).reshape(20, 3, 4)


# ---- what held ---------------------------------------------------------------------------------------------

@pytest.mark.slow   # 24 s: the fast tier keeps revolve's other transform tests
def test_transforms_match_plain_jax_with_special_values():
    """grad (eager and jit), jvp, jvp-of-grad, vmap of grad with the batch axis on a non-leading axis of xs,
    grad of vmap and jacfwd agree with plain JAX, also with inf/NaN/-0.0/3e38/1e-40 in xs and in w."""
    opt = _opt(_rnn)
    assert _is_revolve(opt, W, XS)
    for val in (np.inf, np.nan, -0.0, 3e38, 1e-40):
        w, xs = W.copy(), XS.copy()
        xs[9, 1, 2] = val
        w[1, 2] = val
        cases = [
            lambda f: jax.jit(jax.grad(f, (0, 1)))(w, xs),
            lambda f: jax.jvp(f, (w, xs), (jnp.ones_like(w), jnp.ones_like(xs))),
            lambda f: jax.jvp(lambda v: jax.grad(f, 0)(v, xs), (w,), (jnp.ones_like(w),))[1],
        ]
        for case in cases:
            _close(case(opt), case(_rnn))
    cases = [
        lambda f: jax.grad(f, (0, 1))(W, XS),
        lambda f: jax.vmap(jax.grad(f, (0, 1)), (None, 1))(W, jnp.stack([XS, 2 * XS], 1)),
        lambda f: jax.grad(lambda w, xs: jnp.sum(jax.vmap(f, (0, None))(w, xs)), (0, 1))(jnp.stack([W, 2 * W]), XS),
        lambda f: jax.jacfwd(f, 0)(W, XS),
        lambda f: jax.linear_transpose(jax.linearize(f, W, XS)[1], W, XS)(2.0),
    ]
    for case in cases:
        _close(case(opt), case(_rnn))


def test_narrow_float_complex_and_x64_bodies():
    """f16 x f16 -> f32 preferred_element_type body, complex64 carry, float64 under x64: values and dtypes."""
    def pet(w, xs):
        def body(h, x):
            h2 = jnp.tanh(lax.dot(h.astype(jnp.float16), w, preferred_element_type=jnp.float32) + x.astype(jnp.float32))
            return h2, h2.astype(jnp.float16)
        h, ys = lax.scan(body, jnp.zeros(xs.shape[1:], jnp.float32), xs)
        return jnp.sum(ys.astype(jnp.float32) ** 2) + jnp.sum(h)

    def cplx(w, xs):
        def body(h, x):
            h = jnp.tanh(h @ w + x) * jnp.exp(0.3j)
            return h, h
        h, ys = lax.scan(body, jnp.zeros(xs.shape[1:], jnp.complex64), xs)
        return jnp.sum(jnp.abs(ys) ** 2) + jnp.sum(h.real)

    for fn, args, tol in ((pet, (jnp.asarray(W, jnp.float16), jnp.asarray(XS, jnp.float16)), 2e-2),
                          (cplx, (W, XS), 1e-4)):
        opt = _opt(fn)
        assert _is_revolve(opt, *args)
        for case in (lambda f: jax.grad(f, (0, 1))(*args),
                     lambda f: jax.jvp(f, args, tuple(jnp.ones_like(a) for a in args))[1]):
            got, want = case(opt), case(fn)
            assert jax.tree_util.tree_map(lambda a: a.dtype, got) == jax.tree_util.tree_map(lambda a: a.dtype, want)
            _close(got, want, tol, tol)
    with jax.enable_x64(True):
        w, xs = jnp.asarray(W, jnp.float64), jnp.asarray(XS, jnp.float64)
        opt = _opt(_rnn)
        assert _is_revolve(opt, w, xs)
        _close(jax.jvp(lambda v: jax.grad(opt, 0)(v, xs), (w,), (w,))[1],
               jax.jvp(lambda v: jax.grad(_rnn, 0)(v, xs), (w,), (w,))[1], 1e-10, 1e-12)


def test_revolve_inside_outer_scan_and_checkpoint():
    def nested(w, xs):
        def outer(c, xo):
            def body(h, x):
                h = jnp.tanh(h @ w + x + c)
                return h, h
            h, ys = lax.scan(body, jnp.zeros(xo.shape[1:]), xo)
            return c + 0.1 * jnp.sum(h), jnp.sum(ys ** 2)
        c, zs = lax.scan(outer, 0.0, xs)
        return c + jnp.sum(zs)
    xs = np.stack([XS, -XS, 0.5 * XS])
    opt = _opt(nested)
    assert _is_revolve(opt, W, xs)
    for case in (lambda f: jax.grad(f, (0, 1))(W, xs),
                 lambda f: jax.jvp(lambda v: jax.grad(f, 0)(v, xs), (W,), (W,))[1],
                 lambda f: jax.grad(jax.checkpoint(f), (0, 1))(W, xs)):
        _close(case(opt), case(nested))


def test_user_linear_call_under_vmap_is_plain_jax():
    """Issue 40 finding 3: jaxform registers nothing for JAX's linear_call (revolve's map is a primitive of its
    own, `_jax.linear_map`). A user's raises what plain JAX raises (no batching rule) after a revolve was
    traced, while revolve's own still batches (vmap of its gradient)."""
    jax.grad(_opt(_rnn))(W, XS)   # a revolve, traced

    def user(r, x):
        return linear_call(lambda r, x: r * x, lambda r, ct: 3.0 * r * ct, r, x)
    r, x = jnp.array([1., 2., 3.]), jnp.array([[1., 2., 3.], [4., 5., 6.]])
    with pytest.raises(NotImplementedError, match="Batching rule for 'linear_call' not implemented"):
        jax.vmap(user, (None, 0))(r, x)
    with pytest.raises(NotImplementedError, match="Batching rule for 'linear_call' not implemented"):
        jax.vmap(lambda rr: jax.grad(lambda v: jnp.sum(user(rr, v)))(r))(x)
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(user(r, v)))(r), 3 * r)
    XS2 = np.stack([XS, XS * 0.5])
    _close(jax.vmap(jax.grad(_opt(_rnn)), (None, 0))(W, XS2), jax.vmap(jax.grad(_rnn), (None, 0))(W, XS2))


def _long_args():
    """L=1000, batch 8, hidden 32: long enough that the schedules' memory differs by multiples."""
    L, B, H = 1000, 8, 32
    return jnp.eye(H) * 0.1, jnp.asarray(np.random.RandomState(0).randn(L, B, H).astype(np.float32))


def _last_carry_loss(w, xs):
    def body(h, x):
        return jnp.tanh(h @ w + x), None
    h, _ = lax.scan(body, jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(h ** 2)


def _grad_temp(f, argnum, *args) -> int:
    return jax.jit(jax.grad(f, argnum)).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_grad_wrt_weights_keeps_memory_below_min_schedule():
    w, xs = _long_args()
    temp = lambda f: _grad_temp(f, 0, w, xs)   # noqa: E731
    tight, low = _opt(_last_carry_loss), _opt(_last_carry_loss, "min")
    assert temp(tight) < temp(low) / 3
    hvp = lambda f: jax.jit(lambda v: jax.jvp(lambda u: jax.grad(f)(u, xs), (v,), (v,))[1])   # noqa: E731
    assert (hvp(tight).lower(w).compile().memory_analysis().temp_size_in_bytes
            < hvp(low).lower(w).compile().memory_analysis().temp_size_in_bytes / 3)


# ---- bugs found --------------------------------------------------------------------------------------------

def _sqrt_body(k1, k2, xs):
    def body(h, x):
        h = jnp.tanh(h * k2 + x) + jnp.sqrt(k1 * jnp.exp(x))
        return h, h
    h, ys = lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    return jnp.sum(ys ** 2) + jnp.sum(h)


def test_forward_mode_nan_from_instantiated_zero_tangents():
    """Found by the attack, fixed (the tangent is now the JVP w.r.t. the differentiated inputs only). k1 = 0 (not differentiated), body term sqrt(k1 * exp(x)) (derivative inf at 0). jax.jvp / jacfwd /
    jvp-of-grad / hessian w.r.t. k2 only: plain JAX gives finite tangents (100.75, Hessian diag ~5.26), the
    revolve schedule gives NaN (eager and jit, JAX 0.10.2 and 0.12). The rule's `tangent` feeds
    jnp.zeros_like(p) for every symbolic-zero tangent into jax.jvp of the plain scan (and _linear_call_jvp
    does the same for residual tangents), so 0 * inf enters; grad w.r.t. k2 is right."""
    xs = XS
    k1, k2 = np.zeros(4, np.float32), np.full(4, 0.5, np.float32)
    opt = _opt(_sqrt_body)
    assert _is_revolve(opt, k1, k2, xs)
    jvp = lambda f: jax.jvp(lambda v: f(k1, v, xs), (k2,), (jnp.ones(4),))[1]   # noqa: E731
    want = jvp(_sqrt_body)
    assert np.isfinite(want)
    np.testing.assert_allclose(jvp(opt), want, rtol=1e-4)


def test_grad_of_weak_typed_carry_keeps_weak_type():
    """Found by the attack, fixed (the transpose gives each cotangent its primal's weak type). s = jnp.full((3, 4), 0.3) (weak float32) as the scan's initial carry: jax.grad(f, 1) is weak_type=True
    in plain JAX and with memory=None/'min', weak_type=False with memory=1 (revolve); both JAX versions."""
    def f(xs, s):
        def body(h, x):
            h = jnp.tanh(h * 0.5 + x)
            return h, h
        h, ys = lax.scan(body, s, xs)
        return jnp.sum(ys ** 2) + jnp.sum(h)
    xs, s = jnp.asarray(XS), jnp.full((3, 4), 0.3)
    opt = _opt(f)
    assert s.weak_type and _is_revolve(opt, xs, s)
    assert jax.grad(opt, 1)(xs, s).weak_type == jax.grad(f, 1)(xs, s).weak_type


@pytest.mark.xfail(strict=True, reason="reverse-over-reverse through revolve raises (documented: 'the revolve "
                                       "VJP is first order'), plain JAX computes it")
def test_grad_of_grad_through_revolve():
    """jax.grad(lambda w: jnp.sum(jax.grad(opt)(w, xs)))(w) raises ValueError 'Reverse-mode differentiation does
    not work for lax.while_loop or lax.fori_loop with dynamic start/stop values' (the schedule's interpreter),
    eagerly and under jit; plain JAX and memory='min' give the value. jvp-of-grad / hessian work."""
    opt = _opt(_rnn)
    assert _is_revolve(opt, W, XS)
    gg = lambda f: jax.grad(lambda w: jnp.sum(jax.grad(f, 0)(w, XS)))(W)   # noqa: E731
    _close(gg(opt), gg(_rnn))


@pytest.mark.xfail(OLD_JAX, strict=True, reason="JAX 0.10.2: grad w.r.t. xs under revolve takes ~8.5x the XLA "
                                                "temp of memory='min' (1040592 vs 122436 B)")
def test_grad_wrt_xs_keeps_memory_below_min_schedule():
    """L=1000, batch 8, hidden 32, loss on the final carry only. jax.jit(jax.grad(opt, 1)) temp: revolve
    1,040,592 B vs memory='min' 122,436 B on JAX 0.10.2 (a whole xs-sized buffer extra: the ct_xs buffer of the
    while-loop interpreter is copied); w.r.t. w it is 15,368 B. JAX 0.12: 15,568 B (holds)."""
    w, xs = _long_args()
    tight = _opt(_last_carry_loss)
    assert _is_revolve(tight, w, xs)
    assert _grad_temp(tight, 1, w, xs) < _grad_temp(_opt(_last_carry_loss, "min"), 1, w, xs)


def test_user_linear_call_transpose_not_silently_dropped():
    """Found by the attack, fixed. user(r, x) = linear_call(r * x, transpose 3 * r * ct). jax.grad w.r.t. x alone
    gives 3 * r; w.r.t. (r, x) plain JAX refuses (an AssertionError in its jvp rule). jaxform's jvp rule for
    linear_call (forward mode over revolve's transposed map) once answered there with the callee's own transpose
    (ct_x = r), a silently different gradient depending on whether revolve had run in the process. jaxform's
    map is now a primitive of its own (`_jax.linear_map`): the user's linear_call is JAX's as it was."""
    jax.grad(_opt(_rnn))(W, XS)   # a revolve, traced

    def user(r, x):
        return linear_call(lambda r, x: r * x, lambda r, ct: 3.0 * r * ct, r, x)
    r, x = jnp.array([1., 2., 3.]), jnp.array([4., 5., 6.])
    alone = jax.grad(lambda v: jnp.sum(user(r, v)))(x)
    np.testing.assert_allclose(alone, 3 * r)
    with pytest.raises(AssertionError):
        jax.grad(lambda a, v: jnp.sum(user(a, v)), (0, 1))(r, x)
