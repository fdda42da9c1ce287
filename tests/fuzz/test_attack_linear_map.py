"""Attack on `_jax.linear_map` (commit f948eeb: JAX's `linear_call` contract on jaxform's own primitive
`jaxform_linear_call`, with jvp / transpose / batching rules and a lowering), on its two users (revolve's forward
mode, `passes/revolve.py::scan_revolve`; a bounded while_loop's exact tangents, `passes/while_grad.py`), and on
JAX's own `linear_call` staying plain JAX next to them.

Plain tests: behaviour that held. xfail(strict=True): bugs found, each with what was expected and what happened.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.custom_derivatives import linear_call

import jaxform
from jaxform import _jax
from jaxform.passes.revolve import scan_revolve

lm = _jax.linear_map


# ---- helpers -------------------------------------------------------------------------------------------------

def _same(got, want, tol=1e-5):
    """Same tree, shapes, dtypes, weak types and values (NaN where NaN)."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        g, w = jnp.asarray(g), jnp.asarray(w)
        assert (g.shape, g.dtype, g.weak_type) == (w.shape, w.dtype, w.weak_type)
        if g.dtype != jax.dtypes.float0:
            np.testing.assert_allclose(np.asarray(g, np.complex128), np.asarray(w, np.complex128),
                                       rtol=tol, atol=tol, equal_nan=True)


def _sin_map(r, x):          # linear in x, not in r
    return jnp.sin(r) * x


def _sin_map_t(r, ct):        # its exact transpose
    return jnp.sin(r) * ct


def _marked_t(r, ct):         # a transpose that is twice the true one: shows which transpose ran
    return 2.0 * jnp.sin(r) * ct


def _lm(r, x):
    return lm(_sin_map, _sin_map_t, r, x)


R = jnp.array([0.3, 1.0, -2.0])
X = jnp.array([1.0, 2.0, 3.0])
RB = jnp.stack([R, 2 * R])
XB = jnp.stack([X, -X])


def _total(h):
    return lambda r, x: jnp.sum(h(r, x))


# ---- linear_map directly: what held -------------------------------------------------------------------------

_TRANSFORMS = {
    "jvp": lambda h: jax.jvp(h, (R, X), (R, X)),
    "grad_both": lambda h: jax.grad(_total(h), (0, 1))(R, X),
    "vjp": lambda h: jax.vjp(h, R, X)[1](X),
    "linearize": lambda h: jax.linearize(h, R, X)[1](R, X),
    "jvp_of_grad": lambda h: jax.jvp(jax.grad(_total(h), 1), (R, X), (R, X)),
    "hessian": lambda h: jax.hessian(_total(h), (0, 1))(R, X),
    "jacfwd": lambda h: jax.jacfwd(h, (0, 1))(R, X),
    "jacrev": lambda h: jax.jacrev(h, (0, 1))(R, X),
    "jit_grad": lambda h: jax.jit(jax.grad(_total(h), (0, 1)))(R, X),
    "checkpoint_grad": lambda h: jax.grad(jax.checkpoint(_total(h)), (0, 1))(R, X),
    "checkpoint_dots_grad": lambda h: jax.grad(jax.checkpoint(_total(h), policy=jax.checkpoint_policies.dots_saveable),
                                               (0, 1))(R, X),
    "scan_body_grad": lambda h: jax.grad(lambda a, b: lax.scan(lambda c, x: (c + jnp.sum(h(a, x)), None), 0.,
                                                               jnp.stack([b, 2 * b]))[0], (0, 1))(R, X),
    "vmap_vmap_grad": lambda h: jax.vmap(jax.vmap(jax.grad(_total(h), 1)))(jnp.stack([RB, RB]), jnp.stack([XB, XB])),
    "grad_vmap_vmap": lambda h: jax.grad(lambda a, b: jnp.sum(jax.vmap(jax.vmap(h))(a, b)), (0, 1))(
        jnp.stack([RB, RB]), jnp.stack([XB, XB])),
    "linear_transpose": lambda h: jax.linear_transpose(lambda y: h(R, y), X)(X),
    "linear_transpose_twice": lambda h: jax.linear_transpose(
        lambda c: jax.linear_transpose(lambda y: h(R, y), X)(c)[0], X)(X),
    "grad_of_linear_transpose_wrt_r": lambda h: jax.grad(
        lambda rr: jnp.sum(jax.linear_transpose(lambda y: h(rr, y), X)(X)[0] ** 2))(R),
    "rev_over_fwd": lambda h: jax.grad(lambda a, b: jnp.sum(jax.jvp(h, (a, b), (a, b))[1]), (0, 1))(R, X),
    "cond_in_grad_vmap": lambda h: jax.grad(lambda a, b: jnp.sum(jax.vmap(
        lambda r, x: lax.cond(jnp.sum(r) > 0, lambda: jnp.sum(h(r, x)), lambda: jnp.sum(h(r, 2 * x) ** 2)))(a, b)),
        (0, 1))(RB, XB),
}


@pytest.mark.parametrize("name", sorted(_TRANSFORMS))
def test_linear_map_matches_the_plain_function(name):
    """With an exact transpose, every transformation (and their compositions) of linear_map equals the same
    transformation of the plain function: values, dtypes, weak types. Both JAX versions."""
    case = _TRANSFORMS[name]
    _same(case(_lm), case(_sin_map))


@pytest.mark.parametrize("axes", [(0, 0), (0, None), (None, 0), (1, 1), (None, 1), (1, None)])
def test_linear_map_under_vmap_in_axes(axes):
    """vmap / vmap(grad) / grad(vmap) / jvp(vmap) with residual and linear args batched on axis 0, 1 or not."""
    rr = {0: RB, 1: RB.T, None: R}[axes[0]]
    xx = {0: XB, 1: XB.T, None: X}[axes[1]]
    for case in (lambda h: jax.vmap(h, axes)(rr, xx),
                 lambda h: jax.vmap(jax.grad(_total(h), (0, 1)), axes)(rr, xx),
                 lambda h: jax.grad(lambda a, b: jnp.sum(jax.vmap(h, axes)(a, b)), (0, 1))(rr, xx),
                 lambda h: jax.jvp(jax.vmap(h, axes), (rr, xx), (rr, xx))):
        _same(case(_lm), case(_sin_map))


def test_the_given_transpose_runs_where_reverse_mode_transposes():
    """A transpose that is twice the true one (a marker): grad w.r.t. the linear operand gives 2 sin(r) eagerly,
    under jit, vmap(grad), grad(vmap) (residual batched or not), jit(vmap(grad)), and with fun/fun_transpose
    closing over an outer jit tracer; JAX's own linear_call agrees where it can run."""
    def g(r, x):
        return lm(_sin_map, _marked_t, r, x)
    want = 2 * jnp.sin(R)
    _same(jax.grad(_total(g), 1)(R, X), want)
    _same(jax.grad(_total(lambda r, x: linear_call(_sin_map, _marked_t, r, x)), 1)(R, X), want)
    _same(jax.jit(jax.grad(_total(g), 1))(R, X), want)
    _same(jax.vmap(jax.grad(_total(g), 1))(RB, XB), 2 * jnp.sin(RB))
    _same(jax.jit(jax.vmap(jax.grad(_total(g), 1)))(RB, XB), 2 * jnp.sin(RB))
    _same(jax.grad(lambda a, b: jnp.sum(jax.vmap(g)(a, b)), 1)(RB, XB), 2 * jnp.sin(RB))
    _same(jax.grad(lambda b: jnp.sum(jax.vmap(g, (None, 0))(R, b)))(XB), jnp.stack([want, want]))

    def closed(x, c):
        return lm(lambda rr, xx: c * jnp.sin(rr) * xx, lambda rr, ct: 2 * c * jnp.sin(rr) * ct, R, x)
    c = jnp.float32(1.5)
    _same(jax.jit(lambda c: jax.grad(lambda x: jnp.sum(closed(x, c)))(X))(c), 1.5 * want)
    cs = jnp.array([1.5, 3.0])
    _same(jax.vmap(lambda c: jax.grad(lambda x: jnp.sum(closed(x, c)))(X))(cs), cs[:, None] * want)
    _same(jax.vmap(lambda c: jax.linear_transpose(lambda y: closed(y, c), X)(X)[0])(cs), cs[:, None] * want * X)


def test_transposing_repeatedly_matches_jax_linear_call():
    """JAX's docstring example (custom_id with transpose 7): transposed 1-4 times, grad of the transposes, jit,
    jvp of a transposed map: the same as JAX's linear_call; vmap of each (JAX has no batching rule) the same
    value per lane."""
    def custom_id(call):
        return lambda x: call(lambda _, x: x, lambda _, t: 7. * t, (), x)

    def T(f, ex=1.):
        return lambda y: jax.linear_transpose(f, ex)(y)[0]
    for call in (linear_call, lm):
        g = custom_id(call)
        got = [T(g)(1.), T(T(g))(1.), T(T(T(g)))(1.), T(T(T(T(g))))(1.), jax.grad(T(g))(1.), jax.grad(T(T(g)))(1.),
               jax.jit(T(T(T(g))))(1.), jax.jvp(T(g), (1.,), (1.,))]
        _same(got, [7., 1., 7., 1., 1., 7., 7., (7., 7.)])
    g, ones = custom_id(lm), jnp.ones(2)
    np.testing.assert_allclose(jax.vmap(T(g))(ones), [7., 7.])
    np.testing.assert_allclose(jax.vmap(T(T(g)))(ones), [1., 1.])
    np.testing.assert_allclose(T(jax.vmap(g), ones)(ones), [7., 7.])
    np.testing.assert_allclose(T(T(jax.vmap(g), ones), ones)(ones), [1., 1.])
    np.testing.assert_allclose(T(jax.vmap(T(g)), ones)(ones), [1., 1.])
    # a residual through two transposes, batched, and forward mode over a transpose w.r.t. the residual
    f2 = lambda r, x: lm(_sin_map, _marked_t, r, x)   # noqa: E731
    _same(jax.vmap(lambda r, x: T(T(lambda y: f2(r, y), x), x)(x))(RB, XB), jnp.sin(RB) * XB)
    _same(jax.jvp(lambda r: T(lambda y: f2(r, y), X)(X), (R,), (jnp.ones(3),))[1], 2 * jnp.cos(R) * X)
    _same(jax.grad(lambda r: jnp.sum(T(lambda y: f2(r, y), X)(X)))(R), 2 * jnp.cos(R) * X)


def test_pytrees_int_residuals_narrow_complex_and_empty():
    """Pytree residuals (with a Python int and an int array) and linear args (dict/tuple outputs), f16, bf16,
    complex64, weak-typed Python floats, zero-size arrays: output, jit, jvp, grad, vjp, linearize, vmap(grad),
    grad(vmap) equal the plain function's (dtype and weak type included)."""
    def f(res, lin):
        a, (b, n) = res["a"], res["bn"]
        return {"u": a * lin[0] + b * lin[1] * n, "v": (lin[0] * 2.0,)}

    def ft(res, ct):
        a, (b, n) = res["a"], res["bn"]
        return [a * ct["u"] + 2.0 * ct["v"][0], b * n * ct["u"]]
    res = {"a": jnp.array([1., 2.]), "bn": (jnp.array(3.), 4)}
    lin = [jnp.array([1., 1.]), jnp.array([5., 6.])]
    ct = {"u": jnp.ones(2), "v": (jnp.ones(2),)}
    for case in (lambda h: h(res, lin), lambda h: jax.jit(h)(res, lin),
                 lambda h: jax.linear_transpose(lambda l: h(res, l), lin)(ct),
                 lambda h: jax.vjp(lambda l: h(res, l), lin)[1](ct)):
        _same(case(lambda r, l: lm(f, ft, r, l)), case(f))

    mul = lambda r, x: r * x   # noqa: E731
    cases = [(2.0, 3.0), (2.0, jnp.array([3.0, 1.0])),
             (jnp.array([2.0, 1.], jnp.float16), jnp.array([3.0, 4.], jnp.float16)),
             (jnp.array([2.0, 1.], jnp.bfloat16), jnp.array([3.0, 4.], jnp.bfloat16)),
             (jnp.array([2.0 + 1j, 1.], jnp.complex64), jnp.array([3.0 - 2j, 4.], jnp.complex64)),
             (jnp.array([2, 1]), jnp.array([3.0, 4.])), (2, jnp.array([3.0, 4.])),
             (jnp.zeros((0, 3)), jnp.zeros((0, 3)))]
    for r, x in cases:
        h = lambda r, x: lm(mul, mul, r, x)   # noqa: E731
        loss = lambda hh: lambda x: jnp.sum(jnp.real(hh(r, x)))   # noqa: E731
        tx = jnp.ones_like(x)
        checks = [lambda hh: hh(r, x), lambda hh: jax.jit(hh)(r, x),
                  lambda hh: jax.jvp(lambda x: hh(r, x), (x,), (tx,)),
                  lambda hh: jax.grad(loss(hh))(x), lambda hh: jax.jit(jax.grad(loss(hh)))(x),
                  lambda hh: jax.vjp(lambda x: hh(r, x), x)[1](hh(r, x)),
                  lambda hh: jax.linearize(lambda x: hh(r, x), x)[1](tx),
                  lambda hh: jax.vmap(jax.grad(loss(hh)))(jnp.stack([x, x]))]
        if jnp.ndim(x):
            checks.append(lambda hh: jax.grad(lambda xx: jnp.sum(jnp.real(jax.vmap(hh, (None, 0))(r, xx))))(
                jnp.stack([x, x])))
        if jnp.issubdtype(jnp.result_type(r), jnp.inexact):
            checks.append(lambda hh: jax.jvp(jax.grad(lambda r, x: jnp.sum(jnp.real(hh(r, x))), 1), (r, x),
                                             (jnp.ones_like(r), tx)))
        for case in checks:
            _same(case(h), case(mul), tol=1e-2)


def test_outer_tracer_closures_fail_exactly_where_jax_linear_call_fails():
    """A transpose closing over a jit tracer that is transposed outside that jit (grad(jit(...)), vjp of a jit,
    a scan over the closed value, jax.checkpoint) fails in JAX's own linear_call too (the transpose is traced
    lazily, like JAX's). linear_map raises in exactly those cases and agrees where both run."""
    def mk(call):
        def g(x, c):
            return call(lambda rr, xx: c * jnp.sin(rr) * xx, lambda rr, ct: 2 * c * jnp.sin(rr) * ct, R, x)
        return g
    c = jnp.float32(1.5)
    cases = [
        lambda g: jax.grad(jax.jit(lambda x, c: jnp.sum(g(x, c))))(X, c),
        lambda g: jax.jit(jax.grad(lambda x, c: jnp.sum(g(x, c))))(X, c),
        lambda g: jax.vjp(jax.jit(lambda x: g(x, c * 1.0)), X)[1](X),
        lambda g: jax.grad(lambda x: lax.scan(lambda a, cc: (a + jnp.sum(g(x, cc)), None), 0.,
                                              jnp.array([1.5, 3.]))[0])(X),
        lambda g: jax.grad(jax.checkpoint(lambda x, c: jnp.sum(g(x, c))))(X, c),
        lambda g: [jax.jit(jax.vjp(lambda x: g(x, c), X)[1])(X) for _ in range(2)],
        lambda g: jax.jit(jax.linear_transpose(jax.linearize(lambda x: g(x, c), X)[1], X))(X),
    ]
    for case in cases:
        outcome = []
        for call in (linear_call, lm):
            try:
                outcome.append(case(mk(call)))
            except Exception as e:   # noqa: BLE001
                outcome.append(type(e))
        if not isinstance(outcome[0], type):   # where JAX's runs, linear_map runs and agrees
            assert not isinstance(outcome[1], type), f"linear_map raised {outcome[1]} where JAX's linear_call runs"
            _same(outcome[1], outcome[0])
        # where JAX's raises (a transpose closing over a tracer of a finished trace), linear_map may raise too


def test_errors_of_a_wrong_transpose_are_raised():
    """A transpose with the wrong tree or shape is refused (as JAX's linear_call refuses it)."""
    with pytest.raises(TypeError, match="transpose returned"):
        jax.grad(lambda x: jnp.sum(lm(lambda r, x: r * x, lambda r, c: (r * c,), R, x)))(X)
    with pytest.raises(ValueError, match="cotangent"):
        jax.grad(lambda x: jnp.sum(lm(lambda r, x: r * x, lambda r, c: jnp.sum(r * c), R, x)))(X)


# ---- JAX's own linear_call stays JAX's -----------------------------------------------------------------------

_USER_SCRIPT = textwrap.dedent("""
    import sys, warnings
    warnings.simplefilter("ignore")
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.custom_derivatives import linear_call
    if sys.argv[1] == "after":
        import jaxform
        from jaxform.passes import decisions    # revolve as the model schedules it, unmeasured (tests/conftest.py,
        decisions.install("fit_loops", lambda g, memory, schedule, warn=True: (schedule(g, memory), g)[1])  # revolve_as_scheduled)
        from jax._src.interpreters import ad, batching
        from jax._src import custom_derivatives as cd
        def rnn(w, xs):
            def body(h, x):
                h = jnp.tanh(h @ w + x)
                return h, h
            h, ys = lax.scan(body, jnp.zeros(xs.shape[1:]), xs)
            return jnp.sum(ys ** 2) + jnp.sum(h)
        W = np.eye(4, dtype=np.float32) * 0.5
        XS = np.linspace(-1, 1, 240, dtype=np.float32).reshape(20, 3, 4)
        opt = jaxform.optimize(rnn, passes=["hoist_loop_invariants", "dce"], memory=1, strict=True)
        assert "custom_jvp" in str(jaxform.trace(opt, W, XS))
        jax.vmap(jax.grad(opt), (None, 0))(W, np.stack([XS, XS]))
        jax.jvp(lambda v: jax.grad(opt)(v, XS), (W,), (W,))
        wl = jaxform.optimize(lambda x: lax.while_loop(lambda y: y < 5., lambda y: 1.5 * y + .1, x),
                              max_steps=4, memory="min")
        jax.vmap(lambda x: jax.jvp(wl, (x,), (x,)))(jnp.array([1., 2.]))
        assert (ad.primitive_jvps[cd.linear_call_p] is cd._linear_call_jvp_rule
                and ad.primitive_transposes[cd.linear_call_p] is cd._linear_call_transpose_rule
                and cd.linear_call_p not in batching.fancy_primitive_batchers), \
            "jaxform registered rules for linear_call"
    def user(r, x):
        return linear_call(lambda r, x: jnp.sin(r) * x, lambda r, ct: 3.0 * jnp.sin(r) * ct, r, x)
    r, x = jnp.array([1., 2., 3.]), jnp.array([4., 5., 6.])
    cases = [
        lambda: jax.grad(lambda v: jnp.sum(user(r, v)))(x),
        lambda: jax.jit(jax.grad(lambda v: jnp.sum(user(r, v))))(x),
        lambda: jax.jvp(lambda v: user(r, v), (x,), (x,)),
        lambda: jax.jvp(user, (r, x), (r, x)),
        lambda: jax.grad(lambda a, v: jnp.sum(user(a, v)), (0, 1))(r, x),
        lambda: jax.vmap(user, (None, 0))(r, jnp.stack([x, x])),
        lambda: jax.vmap(lambda v: jax.grad(lambda u: jnp.sum(user(r, u)))(v))(jnp.stack([x, x])),
        lambda: jax.jvp(lambda a: jax.linear_transpose(lambda v: user(a, v), x)(x), (r,), (r,)),
        lambda: jax.linear_transpose(lambda c: jax.linear_transpose(lambda v: user(r, v), x)(c)[0], x)(x),
    ]
    for case in cases:
        try:
            out = case()
            print("ok", [np.asarray(v).tolist() for v in jax.tree_util.tree_leaves(out)],
                  [(str(v.dtype), v.weak_type) for v in jax.tree_util.tree_leaves(out)])
        except Exception as e:
            print("raised", type(e).__name__, str(e).splitlines()[0] if str(e) else "")
""")


def test_user_linear_call_is_plain_jax_after_revolve_and_while_forward_mode():
    """A user's linear_call (grad, jit, jvp, residual tangents, vmap, transposed twice) gives the same values and
    raises the same errors in a process that never imported jaxform and in one where revolve (vmap of grad,
    forward over reverse) and a bounded while's forward mode under vmap ran first; jaxform registered no rule
    for JAX's primitive."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    outs = [subprocess.run([sys.executable, "-c", _USER_SCRIPT, mode], capture_output=True, text=True, env=env,
                           timeout=300) for mode in ("before", "after")]
    for o in outs:
        assert o.returncode == 0, o.stderr[-3000:]
    assert outs[0].stdout == outs[1].stdout
    assert "raised NotImplementedError Batching rule for 'linear_call' not implemented" in outs[0].stdout
    assert "raised AssertionError" in outs[0].stdout


# ---- revolve (scan_revolve; optimize(memory=tiny)) ------------------------------------------------------------

def _step(k, c, x):
    (w,), (h,) = k, c
    h = jnp.tanh(h @ w + x[0])
    return [h], [h * 2.0]


_W = np.eye(4, dtype=np.float32) * 0.5 + 0.1
_H0 = np.full((3, 4), 0.1, np.float32)


def _revolve_pair(length, slots):
    def make(revolve):
        def f(w, h0, xs):
            if revolve:
                c, ys = scan_revolve(_step, [w], [h0], [xs], length, slots)
            else:
                c, ys = lax.scan(lambda c, x: _step([w], c, [x]), [h0], xs)
            return jnp.sum(ys[0] ** 2) + jnp.sum(jnp.sin(c[0]))
        return f
    return make(True), make(False)


def _short_loop_cases(length):
    xs = np.linspace(-1, 1, length * 12, dtype=np.float32).reshape(length, 3, 4)
    return xs, {
        "grad": lambda f: jax.jit(jax.grad(f, (0, 1, 2)))(_W, _H0, xs),
        "grad_xs": lambda f: jax.jit(jax.grad(f, 2))(_W, _H0, xs),
        "grad_h0": lambda f: jax.jit(jax.grad(f, 1))(_W, _H0, xs),
        "jvp": lambda f: jax.jit(jax.jvp, static_argnums=0)(
            f, (_W, _H0, xs), (jnp.ones_like(_W), jnp.ones_like(_H0), jnp.ones_like(xs))),
        "hessian": lambda f: jax.jit(jax.hessian(f, 0))(_W, _H0, xs),
        "vmap_grad": lambda f: jax.jit(jax.vmap(jax.grad(f, (0, 1, 2)), (None, 0, 1)))(
            _W, jnp.stack([_H0, -_H0]), jnp.stack([xs, 2 * xs], 1)),
        "grad_vmap": lambda f: jax.jit(jax.grad(lambda w, h, x: jnp.sum(jax.vmap(f, (0, None, None))(w, h, x)),
                                                (0, 1, 2)))(jnp.stack([_W, 2 * _W]), _H0, xs),
        "jvp_vmap": lambda f: jax.jvp(jax.vmap(f, (0, None, None)), (jnp.stack([_W, 2 * _W]), _H0, xs),
                                      (jnp.ones((2, 4, 4)), jnp.ones_like(_H0), jnp.ones_like(xs))),
    }


def test_scan_revolve_two_steps_one_slot():
    """Length 2 with 1 slot (the planner revolves loops from 16 steps on: scan_revolve is called directly): grad
    of all arguments, jvp, vmap(grad) with xs batched on axis 1, grad(vmap) equal lax.scan's."""
    opt, ref = _revolve_pair(2, 1)
    _, cases = _short_loop_cases(2)
    for name in ("grad", "jvp", "vmap_grad", "grad_vmap"):
        _same(cases[name](opt), cases[name](ref), tol=1e-4)


@pytest.mark.slow   # ~45 s
@pytest.mark.parametrize("length,slots", [(1, 1), (2, 1), (2, 2), (3, 1)])
def test_scan_revolve_short_loops(length, slots):
    """Lengths 1-3: grad of each argument alone and together, jvp, hessian, vmap(grad), grad(vmap), jvp(vmap)."""
    opt, ref = _revolve_pair(length, slots)
    _, cases = _short_loop_cases(length)
    for case in cases.values():
        _same(case(opt), case(ref), tol=1e-4)


def _opt(f, memory=1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return jaxform.optimize(f, passes=["hoist_loop_invariants", "dce"], memory=memory, strict=True)


def _is_revolve(opt, *args) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return "custom_jvp" in str(jaxform.trace(opt, *args))


def _rnn_b(w, b, xs):
    def body(h, x):
        h = jnp.tanh(h @ w + x + b)
        return h, h
    h, ys = lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    return jnp.sum(ys ** 2) + jnp.sum(h)


_B = np.full(4, 0.05, np.float32)
_XS20 = np.linspace(-1, 1, 20 * 12, dtype=np.float32).reshape(20, 3, 4)


@pytest.mark.usefixtures("revolve_as_scheduled")
def test_revolve_special_values_argnums_hessian_vmap():
    """optimize(memory=1) revolves a 20-step RNN; with NaN in xs and b (-0.0, inf: the slow test): grad w.r.t.
    each argument in turn (one optimized function, argnums 2, 0, 1, then all under jit), hessian and jacfwd
    w.r.t. b, vmap(grad) equal plain JAX, NaN pattern included."""
    opt = _opt(_rnn_b)
    assert _is_revolve(opt, _W, _B, _XS20)
    for val in (np.nan,):
        xs, b = _XS20.copy(), _B.copy()
        xs[5, 1, 2] = val
        b[1] = val
        for case in (lambda f: jax.grad(f, 2)(_W, b, xs), lambda f: jax.grad(f, 0)(_W, b, xs),
                     lambda f: jax.grad(f, 1)(_W, b, xs), lambda f: jax.jit(jax.grad(f, (0, 1, 2)))(_W, b, xs),
                     lambda f: jax.hessian(f, 1)(_W, b, xs), lambda f: jax.jacfwd(f, 1)(_W, b, xs),
                     lambda f: jax.vmap(jax.grad(f, (0, 1)), (None, 0, None))(_W, jnp.stack([b, _B]), xs)):
            _same(case(opt), case(_rnn_b), tol=1e-4)


@pytest.mark.usefixtures("revolve_as_scheduled")
@pytest.mark.slow   # ~25 s
@pytest.mark.filterwarnings("ignore:jaxform. remat_loops cannot fit")
def test_revolve_higher_order_compositions():
    """jacrev(jacfwd), grad of jvp, vmap(hessian), hessian of a vmapped sum, jit(vmap(jvp(grad))), jvp(vmap(grad)),
    grad(vmap(jvp)), checkpoint(grad), a scan of grads, grad of a scan, linear_transpose twice; inf/-inf/3e38/-0.0
    in xs and b for grad/jvp/hessian/vmap(grad): all equal plain JAX."""
    def rnn(w, xs):
        return _rnn_b(w, 0.0, xs)
    opt = _opt(rnn)
    assert _is_revolve(opt, _W, _XS20)
    WB, XB2 = jnp.stack([_W, 2 * _W]), jnp.stack([_XS20, -_XS20])
    cases = [
        lambda f: jax.jacrev(jax.jacfwd(f, 0), 0)(_W, _XS20),
        lambda f: jax.grad(lambda xs: jax.jvp(lambda q: f(_W, q), (xs,), (jnp.ones_like(xs),))[1])(_XS20),
        lambda f: jax.vmap(jax.hessian(f), (0, None))(WB, _XS20),
        lambda f: jax.hessian(lambda w: jnp.sum(jax.vmap(f, (None, 0))(w, XB2)))(_W),
        lambda f: jax.jit(jax.vmap(lambda w, xs: jax.jvp(lambda u: jax.grad(f)(u, xs), (w,), (w,))[1]))(WB, XB2),
        lambda f: jax.jvp(lambda w: jax.vmap(jax.grad(f), (None, 0))(w, XB2), (_W,), (_W,))[1],
        lambda f: jax.grad(lambda w: jnp.sum(jax.vmap(lambda xs: jax.jvp(lambda q: f(w, q), (xs,),
                                                                           (jnp.ones_like(xs),))[1])(XB2)))(_W),
        lambda f: jax.grad(jax.checkpoint(f), (0, 1))(_W, _XS20),
        lambda f: lax.scan(lambda c, x: (c + jax.grad(f)(_W, x), None), jnp.zeros_like(_W), XB2)[0],
        lambda f: jax.grad(lambda w: lax.scan(lambda c, x: (c + f(w, x), None), 0., XB2)[0])(_W),
        lambda f: jax.linear_transpose(jax.linear_transpose(jax.linearize(f, _W, _XS20)[1], _W, _XS20), 1.0)(
            (_W, _XS20)),
    ]
    for case in cases:
        _same(case(opt), case(rnn), tol=1e-4)
    opt3 = _opt(_rnn_b)
    for val in (np.inf, -np.inf, 3e38, -0.0):
        xs, b = _XS20.copy(), _B.copy()
        xs[5, 1, 2] = val
        b[1] = val if val != 3e38 else 1.0
        for case in (lambda f: jax.grad(f, (0, 1, 2))(_W, b, xs), lambda f: jax.grad(f, 1)(_W, b, xs),
                     lambda f: jax.jvp(f, (_W, b, xs), (jnp.ones_like(_W), jnp.ones_like(b), jnp.ones_like(xs))),
                     lambda f: jax.hessian(f, 1)(_W, b, xs),
                     lambda f: jax.vmap(jax.grad(f, (0, 1)), (None, 0, None))(_W, jnp.stack([b, _B]), xs)):
            _same(case(opt3), case(_rnn_b), tol=1e-4)


# ---- bounded while_loop forward mode --------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_bounded_while_forward_mode_under_at_and_past_the_bound(seed):
    """Issue 40's growth loop with per-lane trip counts; max_steps under, at and past the largest trip count:
    jvp w.r.t. k alone, jit(vmap(jacfwd)), jacfwd(vmap), vmap(jacfwd(jacfwd)), jvp of a vmap with both args
    batched, linearize of a vmap equal plain JAX's forward mode."""
    from fuzz.test_attack_issue40 import _program
    f, trips, _, k, xs = _program(seed)
    n = max(trips(k, x) for x in xs)
    cases = (lambda g: jax.vmap(lambda x: jax.jvp(lambda k: g(k, x), (k,), (jnp.float32(1.),))[1])(xs),
             lambda g: jax.jit(jax.vmap(jax.jacfwd(g, (0, 1)), (None, 0)))(k, xs),
             lambda g: jax.jacfwd(jax.vmap(g, (None, 0)), (0, 1))(k, xs),
             lambda g: jax.vmap(jax.jacfwd(jax.jacfwd(g, 1), 1), (None, 0))(k, xs),
             lambda g: jax.jvp(jax.vmap(g), (jnp.full_like(xs, k), xs), (jnp.ones_like(xs), jnp.ones_like(xs)))[1],
             lambda g: jax.linearize(jax.vmap(g, (None, 0)), k, xs)[1](jnp.float32(1.), jnp.ones_like(xs)))
    for bound in sorted({max(1, n - 1), n, n + 2}):
        opt = jaxform.optimize(f, max_steps=bound, memory="min")
        for case in cases:
            _same(case(opt), case(f), tol=1e-5)


# ---- bugs found ---------------------------------------------------------------------------------------------

def test_grad_of_vmap_with_transpose_closing_over_a_batched_value():
    """fun = c * sin(r) * x, fun_transpose = 2 * c * sin(r) * ct (marker), c a lane of vmap. vmap(grad) gives
    c * 2 sin(r) per lane; grad of the vmapped sum should be their sum (2 * 4.5 * sin(r)). JAX 0.10.2 and 0.12:
    UnexpectedTracerError 'BatchTracer ... escape the scope' (also under jit).
    Fixed: both functions are traced when the map is made, and what they close over is an operand of the primitive (batched with the rest)."""
    cs = jnp.array([1.5, 3.0])

    def g(x, c):
        return lm(lambda rr, xx: c * jnp.sin(rr) * xx, lambda rr, ct: 2 * c * jnp.sin(rr) * ct, R, x)
    per_lane = jax.vmap(lambda c: jax.grad(lambda x: jnp.sum(g(x, c)))(X))(cs)
    _same(per_lane, cs[:, None] * 2 * jnp.sin(R))
    _same(jax.grad(lambda x: jnp.sum(jax.vmap(lambda c: g(x, c))(cs)))(X), per_lane.sum(0))


def test_vmap_keeps_weak_type_under_jit():
    """fun(r, x) = r * x with r = 2.0 (Python float) and x = jnp.stack([3.0, 3.0]) (weak f32). Plain JAX: the
    vmapped output is weak (eager and jit); linear_map: weak eagerly, strong under jit / make_jaxpr / grad(vmap),
    so jax.jit(lambda x: vmap(h)(x) * bf16(1))(x).dtype is float32 where eagerly and in plain JAX it is
    bfloat16. JAX 0.10.2 and 0.12.
    Fixed: `_vmap_closed` keeps the inputs' weak types."""
    mul = lambda r, x: r * x   # noqa: E731
    xs = jnp.stack([3.0, 3.0])
    for h in (lambda x: lm(mul, mul, 2.0, x), lambda x: mul(2.0, x)):
        assert jax.jit(jax.vmap(h))(xs).weak_type
        assert jax.grad(lambda x: jnp.sum(jax.vmap(h)(x)))(xs).weak_type
        assert jax.jit(lambda x: jax.vmap(h)(x) * jnp.ones((), jnp.bfloat16))(xs).dtype == jnp.bfloat16


def test_residual_tangent_does_not_silently_drop_the_given_transpose():
    """fun = sin(r) * x, fun_transpose = 2 sin(r) ct (a marker). jax.grad w.r.t. x alone: 2 sin(r) (the given
    transpose). w.r.t. (r, x): x's cotangent becomes sin(r) (fun's own transpose), no error; the same with x used
    as residual and linear operand (cos(x) x + sin(x) instead of cos(x) x + 2 sin(x)) and with a closed-over c
    differentiated alongside x. Either refusing (as JAX does) or using the given transpose would be right.
    This is how while_grad's zero transpose is bypassed (reverse over forward, below). JAX 0.10.2 and 0.12.
    Fixed: the jvp rule sends the linear operands' tangents through the map itself (so reverse mode runs the given transpose) and differentiates the callee w.r.t. the residuals alone."""
    def g(r, x):
        return lm(_sin_map, _marked_t, r, x)
    np.testing.assert_allclose(jax.grad(_total(g), 1)(R, X), 2 * jnp.sin(R), rtol=1e-6)
    cases = [(lambda: jax.grad(_total(g), (0, 1))(R, X)[1], 2 * jnp.sin(R)),
             (lambda: jax.grad(lambda x: jnp.sum(g(x, x)))(X), jnp.cos(X) * X + 2 * jnp.sin(X)),
             (lambda: jax.grad(lambda x, c: jnp.sum(lm(lambda r, x: c * _sin_map(r, x),
                                                       lambda r, ct: c * _marked_t(r, ct), R, x)), (0, 1))(X, 1.5)[0],
              1.5 * 2 * jnp.sin(R))]
    for case, transpose_respecting in cases:
        try:
            got = case()
        except (AssertionError, TypeError, ValueError, NotImplementedError):
            continue   # refusing, as JAX's linear_call does, is fine
        np.testing.assert_allclose(got, transpose_respecting, rtol=1e-5)


def test_residual_tangent_jvp_runs_the_callee_once():
    """fun(r, x) = scan over r of c -> sin(r_i) c + r_i c (linear in x). With tangents on the residual only,
    jax.jit(jax.jvp(h, (r, x), (r, 0))) compiles one loop, as plain JAX: the jvp rule takes the primal output
    from `jax.jvp` of the callee (it ran the callee twice: p.bind for the primal, then jax.jvp, 2 while loops
    and 324 B against 196 B; revolve's reverse over forward 5 scans against 4). With tangents on both the
    residual and the linear operand the map runs on the linear tangents as well (two loops where plain JAX
    has one): that is what lets reverse mode run the given transpose (the test above), and it is kept."""
    def f(r, x):
        return lax.scan(lambda c, ri: (jnp.sin(ri) * c + ri * c, None), x, r)[0]

    def ft(r, ct):
        return lax.scan(lambda c, ri: (jnp.sin(ri) * c + ri * c, None), ct, r, reverse=True)[0]
    r, x = jnp.linspace(0.1, 1, 50), jnp.ones(3)
    zx = jnp.zeros_like(x)

    def whiles(h, tx):
        c = jax.jit(lambda r, x: jax.jvp(h, (r, x), (r, tx))).lower(r, x).compile()
        return c.as_text().count(" while(")
    h = lambda r, x: lm(f, ft, r, x)   # noqa: E731
    _same(jax.jvp(h, (r, x), (r, x)), jax.jvp(f, (r, x), (r, x)))
    _same(jax.jvp(lambda r: h(r, x), (r,), (r,)), jax.jvp(lambda r: f(r, x), (r,), (r,)))
    assert whiles(lambda r, x: h(r, jax.lax.stop_gradient(x)), zx) <= whiles(lambda r, x: f(r, jax.lax.stop_gradient(x)), zx)
    assert whiles(h, x) <= 2 * whiles(f, x)


def test_vmap_with_axis_name_and_a_collective_in_fun():
    """fun(r, x) = psum(r, 'i') * x, its own transpose. jax.vmap(h, axis_name='i') of the plain function gives
    [[4, 6], [8, 12]]; linear_map raises a bare AssertionError (JAX 0.10.2 and 0.12), also vmap(grad) and
    grad(vmap).
    Fixed: the batching rule is JAX's fancy form and re-vmaps both functions under the caller's axis name."""
    f = lambda r, x: lax.psum(r, "i") * x   # noqa: E731
    rr, xx = jnp.array([[1., 2.], [3., 4.]]), jnp.array([[1., 1.], [2., 2.]])
    h = lambda r, x: lm(f, f, r, x)   # noqa: E731
    _same(jax.vmap(h, axis_name="i")(rr, xx), jax.vmap(f, axis_name="i")(rr, xx))
    _same(jax.vmap(jax.grad(_total(h), 1), axis_name="i")(rr, xx),
          jax.vmap(jax.grad(_total(f), 1), axis_name="i")(rr, xx))


def _last_carry(w, xs):
    def body(h, x):
        return jnp.tanh(h @ w + x), None
    h, _ = lax.scan(body, jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(h ** 2)


@pytest.mark.usefixtures("revolve_as_scheduled")
@pytest.mark.xfail(strict=True, reason="revolve under reverse over forward (grad of jvp) takes more XLA temp than "
                                       "plain JAX: L=100 1,144,516 B vs 737,540 B (memory='min': 79,300 B); the "
                                       "map's residual tangents send reverse mode through jax.jvp of the plain "
                                       "scan's JVP, not the binomial schedule (also at 81ef049)")
def test_revolve_reverse_over_forward_memory_not_above_plain():
    """optimize(f, memory=1) revolves (grad w.r.t. w: 15,368 B); jax.jit(jax.grad(lambda u: jax.jvp(lambda q:
    opt(q, xs), (u,), (u,))[1])) at L=100, B=8, H=32: 1,144,516 B, plain JAX 737,540 B, memory='min' 79,300 B
    (JAX 0.10.2; L=1000: 11.28 MB vs 7.19 MB vs 187 KB, 0.12: 9.23 MB vs 6.16 MB). The values are right."""
    w = jnp.eye(32) * 0.1
    xs = jnp.asarray(np.random.RandomState(0).randn(100, 8, 32).astype(np.float32))
    tight = _opt(_last_carry)
    assert _is_revolve(tight, w, xs)

    def temp(f):
        fn = jax.jit(jax.grad(lambda u: jax.jvp(lambda q: f(q, xs), (u,), (u,))[1]))
        return fn.lower(w).compile().memory_analysis().temp_size_in_bytes
    assert temp(tight) <= temp(_last_carry)


def test_bounded_while_reverse_over_forward_refused_as_plain_jax():
    """Issue 40's loop, seed 0, x with 2 trips, max_steps 2 and 5: jvp-of-grad and hessian (forward over reverse)
    equal the scan of the actual trip count. Reverse over forward (grad of jvp, jacrev(jacfwd)) differentiates
    the while's exact forward-mode tangents, which no bound makes reverse-differentiable: JAX's own error, as
    plain JAX gives for the same program (docs/remat.md says so; the attack found the docstring claiming
    otherwise)."""
    from fuzz.test_attack_issue40 import _program
    f, trips, scan, k, xs = _program(0)
    x = xs[1]
    n = trips(k, x)
    ref = lambda k, x: scan(k, x, n)   # noqa: E731
    opt = jaxform.optimize(f, max_steps=n + 3, memory="min")
    _same(jax.hessian(opt, (0, 1))(k, x), jax.hessian(ref, (0, 1))(k, x), tol=1e-4)
    for g in (opt, f):
        with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
            jax.grad(lambda k, x: jax.jvp(g, (k, x), (1., 1.))[1], (0, 1))(k, x)


def test_bounded_while_tangent_keeps_weak_type():
    """lax.while_loop(lambda y: y < 10., lambda y: y * k + 0.1, x) with x = jnp.full((), 1.0), k = jnp.full((),
    1.5) (weak), max_steps=3 (past the bound: 4 trips): jax.jvp's primal is weak in both, the tangent weak in
    plain JAX only (JAX 0.10.2 and 0.12); values agree. (loop_jvp's `poison.astype(dtype)` is strong.)
    Fixed: the tangent gets its primal's weak type (`_jax.with_weak_type`)."""
    def f(x, k):
        return lax.while_loop(lambda y: y < 10., lambda y: y * k + 0.1, x)
    x, k = jnp.full((), 1.0), jnp.full((), 1.5)
    opt = jaxform.optimize(f, max_steps=3, memory="min")
    _same(jax.jvp(opt, (x, k), (x, k)), jax.jvp(f, (x, k), (x, k)))
    mult = lambda g: (jax.jvp(g, (x, k), (x, k))[1] * jnp.ones((), jnp.bfloat16)).dtype   # noqa: E731
    assert mult(opt) == mult(f) == jnp.bfloat16
