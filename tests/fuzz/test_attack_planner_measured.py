"""Findings of an attack on the planner as measured by XLA (JAXFORM_MEASURE=memory, the suite's default).

One test per finding. A bug is an xfail(strict=True) test asserting the correct behaviour: it passes while
the bug exists and alerts when fixed. A promise that held up under a nontrivial attack is a plain test.

Held up without a test here (CPU, JAX 0.10.2, XLA temp bytes against plain jax.jit, values at rtol 1e-5):
known-use gradients (grad for argnums 0/1/2/(0,1)/(1,2)/(0,1,2), value_and_grad, jacrev, hessian, jacfwd,
vmap(grad), grad(vmap), per-example grads, grad of a checkpointed call, a scan of training steps) over an
RNN, hoisting, two loops, nested scans, a scan in a cond, in checkpoint, in a custom_vjp, fori/while loops;
one object used forward -> grad -> vmap -> jit -> forward (a plan per use, one signature); length 0/1/2
scans, f16/bf16 carries with f32 sums, int bodies, weak scalars, NaN/inf inputs, PRNGKey and key arguments;
debug.callback/io_callback order and counts (also with JAXFORM_MEASURE=1: planning runs none); memory=0/1
warn, 10**12 equals None; the edge catalog of tests/fuzz/programs.py and ~40 random programs.
"""
from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform

H, L = 16, 64
XS = jnp.asarray(np.random.default_rng(0).standard_normal((L, H)) * 0.3, jnp.float32)
W = jnp.asarray(np.random.default_rng(1).standard_normal((H, H)) * 0.3, jnp.float32)


def _temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _cumsum_loss(xs, w):
    def body(c, x):
        c = c + x * w[0]
        return c, c
    _, ys = lax.scan(body, jnp.zeros(H), xs)
    return jnp.sum(jnp.sin(ys) ** 2) + jnp.sum(ys)


def _rnn(xs, w):
    def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = lax.scan(body, jnp.zeros(H), xs)
    return jnp.sum(jnp.sin(ys) ** 2)


# ---- findings -----------------------------------------------------------------------------------------

def test_typed_key_constant_in_a_loop():
    """Forward, jit and grad all raised `TypeError: JAX array with PRNGKey dtype cannot be converted to a
    NumPy array` from `plan/measure.py:program_key` (JAXFORM_MEASURE=0 worked). Fixed: a key's bits are hashed. High severity: a crash on
    an ordinary program (new-style keys are JAX's recommended API). `stream_rows` also fails on it and is
    skipped with a warning (`Cannot interpret 'key<fry>' as a data type`)."""
    key = jax.random.key(0)

    def f(xs):
        def body(c, x):
            k, h = c
            k, sub = jax.random.split(k)
            h = jnp.tanh(h + x * jax.random.normal(sub, x.shape))
            return (k, h), h
        _, ys = lax.scan(body, (key, jnp.zeros(H)), xs)
        return jnp.sum(jnp.sin(ys) ** 2)

    xs = XS[:10]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = jaxform.optimize(f)(xs)
    np.testing.assert_allclose(got, f(xs), rtol=1e-5)


@pytest.mark.parametrize("through_jit", [False, True])
def test_grad_through_a_closed_over_parameter_not_bigger(through_jit):
    """`use_of` read the use from the call's inputs only; a parameter closed over (a tracer constant, the
    usual `optimize(partial(loss, params))` / closure-in-a-training-step pattern) was differentiated with
    no input telling. The forward plan (fused loss) then doubled the gradient's temp memory: 16816 vs 8388 B
    (same on rnn 21124 vs 20676 B, hoisting 9840 vs 9448 B, two loops 33476 vs 33412 B). Fixed: such
    constants are inputs of the program planned (`optimize._build_open`), so their use is planned for."""
    g_plain = jax.grad(lambda w: _cumsum_loss(XS, w))
    inner = (lambda f: jax.jit(f)) if through_jit else (lambda f: f)
    g_opt = jax.grad(inner(lambda w: jaxform.optimize(lambda xs: _cumsum_loss(xs, w))(XS)))
    np.testing.assert_allclose(g_opt(W), g_plain(W), rtol=1e-5, atol=1e-6)    # values hold
    t_plain, t_opt = _temp(g_plain, W), _temp(g_opt, W)
    assert t_opt <= t_plain, (t_opt, t_plain)


def _maml(xs, w):
    w2 = w - 0.1 * jax.grad(_cumsum_loss, 1)(xs, w)      # an inner gradient step (MAML, PINNs, ...)
    return _cumsum_loss(xs, w2)


def test_program_with_an_inner_grad_is_still_differentiable_for_free():
    """`planner._is_gradient` says a program with `add_any` is one JAX differentiated already and plans it as
    `FORWARD_OF_GRADIENT` (no gradient view), but user code calls jax.grad inside a loss too. Under
    `jax.grad(jax.jit(optimize(maml)))` (use unknown: the jit trace hides the grad) the gradient grows 1.6x
    over plain JAX's; `jax.grad(optimize(maml))` (use known) is fine (17540 B). Values agree.
    Fixed: under jit, a program taken for a gradient gets its derivatives as traced (`plan.derivatives`)."""
    opt = jaxform.optimize(_maml)
    g_plain, g_opt = jax.grad(_maml, 1), jax.grad(jax.jit(opt), 1)
    a, b = g_plain(XS, W), g_opt(XS, W)
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(jnp.abs(a).max()))
    t_plain, t_opt = _temp(g_plain, XS, W), _temp(g_opt, XS, W)
    assert t_opt <= t_plain, (t_opt, t_plain)


def _sincos(xs, w):
    def body(c, x):
        c = c + jnp.cos(x) * w[0]
        return c, jnp.sin(c)
    c, ys = lax.scan(body, jnp.zeros(H), xs)
    return jnp.sum(ys ** 2) + jnp.sum(c)


def test_grad_of_jit_wrt_a_later_argument_not_bigger():
    """A jit trace hides the use, so the planner weighs the forward, the gradient of every float input (1%)
    and, in the final guard, the gradient of the first argument. `jax.grad(jax.jit(opt), argnums=1)` runs the
    gradient w.r.t. `w` alone, which no view covers: fusion + fission shrink the all-floats gradient
    (20.3 -> 12.4 KiB) while the w-only one grows, past even the 1% the docs allow a hypothetical gradient.
    The same on a nested scan: 164292 vs 164228 B, and for per-example gradients of the sin/cos scan,
    `jax.vmap(jax.grad(jax.jit(opt), 1), (0, None))` over 4 examples: 82544 vs 66372 B (1.24x).
    `jax.grad(optimize(f), 1)` and `jax.vmap(jax.grad(optimize(f), 1))` (use known) are fine.
    Fixed: the final guard checks jax.grad(f, argnums=k) for each of the first 4 arguments, and undoes the
    latest kept rewrites one at a time before it gives every one up."""
    opt = jaxform.optimize(_sincos)
    g_plain, g_opt = jax.grad(_sincos, 1), jax.grad(jax.jit(opt), 1)
    a, b = g_plain(XS, W), g_opt(XS, W)      # (fusion reorders a sum: 4e-4 on 5.2 among entries up to 1331)
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6 * float(jnp.abs(a).max()))
    t_plain, t_opt = _temp(g_plain, XS, W), _temp(g_opt, XS, W)
    assert t_opt <= t_plain, (t_opt, t_plain)


def _in_cond(xs, w):
    def branch(xs):
        def body(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h
        _, ys = lax.scan(body, jnp.zeros(H), xs)
        return jnp.sum(jnp.sin(ys) ** 2)
    return lax.cond(jnp.sum(xs) > 0, branch, lambda xs: jnp.sum(xs ** 2), xs)


def test_memory_min_forward_under_jit_not_above_memory_none():
    """`jax.jit(optimize(f, memory="min"))(xs, w)` runs the forward program; "min" asks for the least memory
    and must not be above what memory=None gives in the view that runs. Under an unknown use remat_loops'
    checkpoints (judged on the hypothetical gradient) cost the forward 64-128 B. Low severity: both are
    within plain jit's forward (8488 B) and the gradient shrinks 2.5x. Settled: under the default a memory pass may not cost a forward view a byte over the program it got;
    under "min" (memory first, as asked) it may, within the traced program's (docs/planner.md)."""
    t_min = _temp(jaxform.optimize(_in_cond, memory="min"), XS, W)
    t_auto = _temp(jaxform.optimize(_in_cond), XS, W)
    t_none = _temp(jaxform.optimize(_in_cond, memory=None), XS, W)
    assert t_auto <= t_none, (t_auto, t_none)       # the default gives back no forward byte
    assert t_min <= _temp(_in_cond, XS, W)          # "min" trades forward bytes for gradient memory, within plain


def _hoist(xs, w):
    def body(c, x):
        c = jnp.tanh(c + jnp.exp(w) @ x)
        return c, c
    _, ys = lax.scan(body, jnp.zeros(w.shape[0]), xs)
    return jnp.sum(jnp.cos(ys) ** 2)


def _best_of(fns, args, reps=30):
    from jaxform.inspect.program import min_time
    return min_time([jax.jit(f) for f in fns], args, reps)


@pytest.mark.skipif(not os.environ.get("JAXFORM_ATTACK_TIMING"),
                    reason="timing (about 15 s, noise-sensitive): run with JAXFORM_ATTACK_TIMING=1")
@pytest.mark.xfail(jaxform._jax.JAX_VERSION < (0, 11), strict=True,
                   reason="with timing on (JAXFORM_MEASURE=1, the users' default) jax.grad(optimize(f)) of an RNN "
                          "with exp(W) @ x in the body runs 1.18x slower than jax.grad(f) (0.53 vs 0.45 ms, L=500, "
                          "H=64, CPU, JAX 0.10.2, 3 repeats; 1.11-1.14x under the suite's 8 host "
                          "devices) for 3.6x less memory; memory='auto' promises no time (JAX 0.12: within 5%, 2 runs)")
def test_measured_default_grad_not_slower(monkeypatch, tmp_path):
    """Kept: hoisting (measured 1.15x), fusion (fusion alone: 1.43x slower, judged 0.93x 'once loop memory
    planning has run', i.e. against hoisted + remat, a remat that 'auto' would never keep on the hoisted
    program), then remat (measured 1.19x faster than the fused program, not than plain). Each step passes
    its own test; the whole is 18% slower than plain. Under JAXFORM_MEASURE=memory the model keeps only
    hoisting: 0.87x (faster)."""
    monkeypatch.setenv("JAXFORM_MEASURE", "1")
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.standard_normal((500, 64)) * 0.3, jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 64)) * 0.1, jnp.float32)
    g_opt = jax.grad(jaxform.optimize(_hoist), 1)
    jax.jit(g_opt).lower(xs, w)                                    # plan (timing candidates) first
    t_plain, t_opt = _best_of([jax.grad(_hoist, 1), g_opt], (xs, w))
    assert t_opt <= t_plain * 1.05, (t_opt, t_plain)      # measure.NOISE


def my_loss(xs, w):
    return _rnn(xs, w)


def test_explain_bad_loop_memory_names_the_function():
    with pytest.raises((TypeError, ValueError), match="my_loss"):
        jaxform.explain(my_loss, XS, W, loop_memory="x")


def test_explain_bad_argument_names_the_function():
    with pytest.raises(TypeError, match="my_loss"):
        jaxform.explain(my_loss, "a", W)


def test_optimize_errors_name_the_function():
    """Held up: optimize's own checks name the function and the argument or option."""
    with pytest.raises(TypeError, match=r"argument xs of my_loss"):
        jaxform.optimize(my_loss)("a", W)
    for bad in (-1, float("nan"), "max"):
        with pytest.raises(ValueError, match="my_loss"):
            jaxform.optimize(my_loss, memory=bad)
    with pytest.raises(TypeError, match="my_loss"):
        jaxform.optimize(my_loss, memory=True)


def _custom_jvp_rnn(big_rule: bool):
    @jax.custom_jvp
    def act(x):
        return jnp.tanh(x)

    @act.defjvp
    def _(p, t):
        (x,), (tx,) = p, t
        y = jnp.tanh(x)
        extra = 0 * jnp.outer(y, y).sum(0) * tx if big_rule else 0.0   # a rule that keeps an outer product
        return y, (1 - y ** 2) * tx + extra

    def f(xs, w):
        def body(h, x):
            h = act(h @ w + x)
            return h, h
        _, ys = lax.scan(body, jnp.zeros(H), xs)
        return jnp.sum(jnp.sin(ys) ** 2)
    return f


def test_cache_tells_apart_programs_printed_alike(monkeypatch, tmp_path):
    """Held up: two programs whose forward jaxprs print identically (same-named custom_jvp, different rules:
    their gradients differ: 16580 vs 20736 B plain at L=64) share one disk cache, planned a, b, then a
    again (from the cache): each gradient is right and no bigger than plain JAX's."""
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    fa, fb = _custom_jvp_rnn(False), _custom_jvp_rnn(True)
    xs = XS[:24]
    assert str(jax.make_jaxpr(fa)(xs, W)) == str(jax.make_jaxpr(fb)(xs, W))
    plain = {f: _temp(jax.grad(f, 1), xs, W) for f in (fa, fb)}
    assert plain[fa] < plain[fb]
    for f in (fa, fb, fa):
        g_opt = jax.grad(jaxform.optimize(f), 1)
        np.testing.assert_allclose(g_opt(xs, W), jax.grad(f, 1)(xs, W), rtol=1e-5, atol=1e-6)
        assert _temp(g_opt, xs, W) <= plain[f]


def test_jit_forward_never_above_plain_jit_at_all():
    """Under jit the use is unknown; fusion is kept for the forward (125 KiB -> 1.3 KiB), then fission 'faster
    for memory an earlier pass won' gives it back to 126.3 KiB, 960 B above plain, allowed because the
    hypothetical gradient wins big (512388 -> 385028 B). Low severity (by design per docs/planner.md), but the
    promise as stated is to the byte. Fixed: no big-win allowance in a view the call runs."""
    rng = np.random.default_rng(0)
    xs = jnp.asarray(rng.standard_normal((500, 64)) * 0.3, jnp.float32)
    w = jnp.asarray(rng.standard_normal((64, 64)) * 0.1, jnp.float32)

    def sincos(xs, w):
        def body(c, x):
            c = c + jnp.cos(x) * w[0]
            return c, jnp.sin(c)
        c, ys = lax.scan(body, jnp.zeros(64), xs)
        return jnp.sum(ys ** 2) + jnp.sum(c)

    opt = jaxform.optimize(sincos)
    np.testing.assert_allclose(jax.jit(opt)(xs, w), sincos(xs, w), rtol=1e-5)
    assert _temp(opt, xs, w) <= _temp(sincos, xs, w), (_temp(opt, xs, w), _temp(sincos, xs, w))


def test_x64_toggled_one_object_one_cache():
    """Held up: the same optimized function and disk cache under x64 off, then on: dtypes, gradients and
    XLA temp (no bigger than plain) right each time (keys include x64 and dtypes)."""
    rng = np.random.default_rng(0)
    xs, w = rng.standard_normal((24, H)) * 0.3, rng.standard_normal((H, H)) * 0.3

    def rnn(xs, w):
        def body(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h
        _, ys = lax.scan(body, jnp.zeros(H, xs.dtype), xs)
        return jnp.sum(jnp.sin(ys) ** 2)

    opt = jaxform.optimize(rnn)
    for x64 in (False, True):
        with jax.enable_x64(x64):
            a = (jnp.asarray(xs), jnp.asarray(w))
            r0, r1 = jax.grad(rnn, 1)(*a), jax.grad(opt, 1)(*a)
            assert r0.dtype == r1.dtype == (jnp.float64 if x64 else jnp.float32)
            # (f32: the rewritten gradient sums in another order; 1.5e-6 off on an entry of 0.011 beside entries
            # of 3, JAX 0.12: an absolute tolerance on the gradient's scale)
            np.testing.assert_allclose(r1, r0, rtol=1e-5, atol=(1e-12 if x64 else 1e-6) * float(np.abs(r0).max()))
            assert _temp(jax.grad(opt, 1), *a) <= _temp(jax.grad(rnn, 1), *a)


def _rng_scan(xs, key):
    def body(c, x):
        k, h = c
        k, sub = jax.random.split(k)
        h = jnp.tanh(h + x * jax.random.normal(sub, (4096,))[:H])
        return (k, h), h
    _, ys = lax.scan(body, (key, jnp.zeros(H)), xs)
    return jnp.sum(jnp.sin(ys) ** 2)


def test_cache_answer_is_the_programs_under_threefry_partitionable(monkeypatch, tmp_path):
    """`measure.temp_bytes` of the program (printed alike) traced first with partitionable threefry, then
    without: the second answer came from the disk cache (same `program_key`) and was the first setting's
    bytes. Fixed: the key holds the configuration jax.jit keys its caches on. Every
    memory verdict of a process with the other setting (and the final 'never bigger' guard) then rests on
    another program's numbers. Medium severity (the setting differs between JAX releases' defaults)."""
    from jaxform.plan import measure
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    xs, key = XS[:32], jax.random.PRNGKey(0)
    answers, actual = [], []
    for partitionable in (True, False):
        with jax.threefry_partitionable(partitionable):
            closed = jax.make_jaxpr(_rng_scan)(xs, key)     # traced under the setting, as `optimize` does
            answers.append(measure.temp_bytes(closed, measure.Budget()))
            actual.append(_temp(_rng_scan, xs, key))
    assert actual[0] != actual[1]            # the setting matters to XLA
    assert answers == actual, (answers, actual)
