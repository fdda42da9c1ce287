"""Loops over refs: with `jax_scan3` (and `jax_remat3`) on, the loop passes work as with them off.

JAX 0.12 traces `lax.scan` to `new_ref` + `Scan3` under `jax_scan3`; jaxform reads such a loop as
the `scan` it stands for (`state/ref_loops.py`), so fusion, hoisting, fission, `thin_residuals` and
`memory="auto"` must give the same programs and the same XLA temp memory as with the flag off.
Values are compared with plain JAX under the flag; gradients and vmap with plain JAX without it
(JAX 0.12 cannot differentiate or batch a Scan3: the optimized program, a `scan`, can).
"""
import contextlib
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.ir import Graph
from jaxform.passes import scans_from_ref_loops

pytestmark = pytest.mark.skipif("jax_scan3" not in _jax.loop_flags(),
                                reason=f"JAX {jax.__version__} has no jax_scan3 (0.12+)")
# The slowest comparisons run in the fast tier only where the flag is the point (`make test-scan3`);
# elsewhere (the JAX 0.10.2 fast tier) in the slow tier.
SCAN3_RUN = pytest.mark.slow if not os.environ.get("JAXFORM_TEST_SCAN3") else pytest.mark.usefixtures()


@contextlib.contextmanager
def flags(on: bool, names=("jax_scan3", "jax_remat3")):
    old = {n: getattr(jax.config, n) for n in names if hasattr(jax.config, n)}
    for n in old:
        jax.config.update(n, on)
    try:
        yield
    finally:
        for n, v in old.items():
            jax.config.update(n, v)


# ---- programs ------------------------------------------------------------------------------

def rnn_mse(w, xs, targets):                     # the README's
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = lax.scan(cell, jnp.zeros(xs.shape[1:]), xs)
    return jnp.mean((ys - targets) ** 2)


def sincos(x1, x2, y):                            # the seed's: cos(xs) is carry-free (fission)
    return jnp.square(y - lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)[1]).mean()


def gram(w, h0, xs):                              # W @ W.T in the body (hoisting)
    def cell(h, x):
        h = jnp.tanh((w @ w.T) @ h + x)
        return h, jnp.sum(h * h)
    h, ys = lax.scan(cell, h0, xs)
    return h.sum() + ys.sum()


def nested(w, xs):                                # a scan in a scan: both read as scans
    def outer(c, x):
        c2, ys = lax.scan(lambda d, y: (jnp.sin(d @ w + y), d), c, x)
        return c2, jnp.sum(ys ** 2)
    return lax.scan(outer, jnp.zeros(xs.shape[-1]), xs)[1].sum()


K = jax.random.split(jax.random.key(0), 4)
L, B, H = 60, 8, 16
W = jax.random.normal(K[0], (H, H)) * 0.2
XS = jax.random.normal(K[1], (L, B, H))
TS = jax.random.normal(K[2], (L, B, H))
CASES = {"rnn_mse": (rnn_mse, (W, XS, TS)), "sincos": (sincos, (jnp.ones((B, H)), XS, TS)),
         "gram": (gram, (W, jnp.ones(H), XS[:, 0])), "nested": (nested, (W, XS[:6, :5]))}

# the passes of issue 29, each run as optimize runs them
PIPELINES = {
    "default": lambda f: jaxform.optimize(f),                                    # planned, memory="auto"
    "grad_of_default": lambda f: jax.grad(jaxform.optimize(f)),                 # remat planning under grad
    "fusion": lambda f: jaxform.optimize(f, passes=["fuse_scan_reductions", "dce"]),
    "hoisting": lambda f: jaxform.optimize(f, passes=["hoist_loop_invariants", "dce"]),
    "fission": lambda f: jax.grad(jaxform.optimize(f, passes=["fission", "dce"])),
    "memory_auto": lambda f: jax.grad(jaxform.optimize(f, passes=["dce"], memory="auto")),
    "memory_min": lambda f: jax.grad(jaxform.optimize(f, passes=["dce"], memory="min")),
    # JAX 0.12 cannot differentiate a Scan3, but it can the scan jaxform made of it
    "thin_residuals": lambda f: jaxform.optimize(jax.grad(jaxform.optimize(f, memory=None)),
                                                 passes=["thin_residuals", "dce"]),
}


# the same programs without the passes: each pipeline must change these (else equality proves nothing)
BASELINES = {
    "default": lambda f: f, "fusion": lambda f: f, "hoisting": lambda f: f,
    "grad_of_default": jax.grad, "fission": jax.grad, "memory_auto": jax.grad, "memory_min": jax.grad,
    "thin_residuals": lambda f: jaxform.optimize(jax.grad(jaxform.optimize(f, memory=None)), passes=["dce"]),
}
CHANGES = {("rnn_mse", "default"), ("rnn_mse", "fusion"), ("rnn_mse", "grad_of_default"), ("rnn_mse", "memory_min"),
           ("rnn_mse", "thin_residuals"), ("sincos", "fission"), ("sincos", "default"), ("gram", "hoisting"),
           ("gram", "memory_auto")}


def _text(closed) -> str:
    """The printed jaxpr without scan's pytree layout hints (ft_in/ft_out: how the user's carry was
    nested, which a scan rebuilt from a Scan3 does not know; XLA never sees them)."""
    return re.sub(r"ft_(in|out)=\(.*\)\n", "", str(closed))


def _program(make, fn, args, on: bool):
    with flags(on):
        return jax.make_jaxpr(make(fn))(*args)


def _temp(make, fn, args, on: bool) -> int:
    with flags(on):
        return jax.jit(make(fn)).lower(*args).compile().memory_analysis().temp_size_in_bytes


# ---- reading ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_scan3_is_read_as_the_scan_it_stands_for(name):
    fn, args = CASES[name]
    with flags(True):
        g = jaxform.trace(fn, *args)
        assert any(_jax.scan3_loop(n.params) for n, _ in g.walk()), "the flag did not make a Scan3"
        read = scans_from_ref_loops(g)
        names = {n.name for n, _ in read.walk()}
        assert "scan" in names and not names & {"new_ref", "get", "swap", _jax.HI_PRIMITIVE}, names
        np.testing.assert_allclose(jaxform.to_function(read)(*args), fn(*args), rtol=1e-6)
    with flags(False):
        want = jax.make_jaxpr(fn)(*args)
    assert _text(read.to_jaxpr()) == _text(want)


# ---- the passes: the same program, the same memory ---------------------------------------------

@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("name", ["rnn_mse", "sincos", "gram", "nested"])
def test_passes_make_the_same_program_with_the_flag_on(name, pipeline):
    fn, args = CASES[name]
    make = PIPELINES[pipeline]
    off, on = _program(make, fn, args, False), _program(make, fn, args, True)
    assert _text(on) == _text(off)
    if (name, pipeline) in CHANGES:
        assert _text(off) != _text(_program(BASELINES[pipeline], fn, args, False)), "the passes did nothing"
    assert _jax.HI_PRIMITIVE not in {e.primitive.name for e in on.eqns}


MEMORY = [("rnn_mse", "default", "forward"), ("rnn_mse", "grad_of_default", "grad"),
          ("gram", "memory_auto", "grad"), ("nested", "memory_auto", "grad"), ("rnn_mse", "memory_min", "grad"),
          ("rnn_mse", "thin_residuals", None), ("sincos", "fission", None), ("sincos", "default", "forward")]


@pytest.mark.parametrize("name, pipeline, plain", MEMORY, ids=[f"{a}-{b}" for a, b, _ in MEMORY])
def test_same_xla_temp_memory_with_the_flag_on(name, pipeline, plain):
    fn, args = CASES[name]
    make = PIPELINES[pipeline]
    off, on = _temp(make, fn, args, False), _temp(make, fn, args, True)
    assert on == off
    if plain is not None:   # and the passes did something (vs plain JAX, flag off)
        base = fn if plain == "forward" else jax.grad(fn)
        with flags(False):
            want = jax.jit(base).lower(*args).compile().memory_analysis().temp_size_in_bytes
        assert on < want, (on, want)


# ---- values, gradients, vmap, callbacks ------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_values_equal_plain_jax_and_gradients_now_exist(name):
    fn, args = CASES[name]
    with flags(True):
        opt = jaxform.optimize(fn)
        np.testing.assert_allclose(jax.jit(opt)(*args), jax.jit(fn)(*args), rtol=1e-5, atol=1e-6)
        with pytest.raises(NotImplementedError):   # JAX's limitation (see tests/test_jax_flags.py)
            jax.grad(fn)(*args)
        got_g = jax.grad(opt)(*args)
        got_v = jax.vmap(opt, (None,) * (len(args) - 1) + (0,))(*args[:-1], jnp.stack([args[-1]] * 2))
    with flags(False):   # the reference: the same program without the flag
        want_g = jax.grad(fn)(*args)
        want_v = jax.vmap(fn, (None,) * (len(args) - 1) + (0,))(*args[:-1], jnp.stack([args[-1]] * 2))
    np.testing.assert_allclose(got_g, want_g, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5, atol=1e-6)


def test_callbacks_in_the_loop_keep_their_order():
    calls = []

    def f(w, xs):
        def cell(h, x):
            jax.debug.callback(lambda v: calls.append(("in", float(v))), h.sum(), ordered=True)
            h = jnp.tanh(h @ w + x)
            return h, h
        jax.debug.callback(lambda: calls.append(("before",)), ordered=True)
        h, ys = lax.scan(cell, jnp.zeros(xs.shape[1:]), xs)
        jax.debug.callback(lambda v: calls.append(("after", float(v))), h.sum(), ordered=True)
        return jnp.sum(ys ** 2)

    args = (W, XS[:5])
    with flags(True):
        want = float(f(*args))
        want_calls, calls[:] = list(calls), []
        g = scans_from_ref_loops(jaxform.trace(f, *args))
        assert "scan" in {n.name for n in g.nodes}
        got = float(jaxform.optimize(f)(*args))
        jax.effects_barrier()
    assert got == pytest.approx(want, rel=1e-5)
    assert calls == want_calls and len(calls) == 7


# ---- what stays a Scan3 (never wrong) --------------------------------------------------------------

def _written_before(xs):
    r = jax.new_ref(jnp.zeros(xs.shape[1:]))
    r[0] = 1.0                                     # a write before the loop

    def body(c, x):
        r[...] = r[...] + x * c
        return c + 1.0, r[...]
    c, ys = lax.scan(body, 0.5, xs)
    return c + ys.sum() + r[...].sum()


def _escapes(xs):
    r = jax.new_ref(jnp.zeros(xs.shape[1:]))

    def body(c, x):
        r[...] = r[...] + x
        return c, r[...]
    ys = lax.scan(body, 0.0, xs)[1]
    r[1] = 5.0                                     # written again after the loop, then read
    return ys.sum() + r[...].sum()


def _reverse(xs):                                  # JAX 0.12 runs a Scan3 forward whatever reverse says
    return lax.scan(lambda c, x: (c + x, c), jnp.zeros(xs.shape[1:]), xs, reverse=True)


@pytest.mark.parametrize("fn", [_written_before, _escapes, _reverse], ids=lambda f: f.__name__)
def test_refs_not_provably_local_stay_a_scan3(fn):
    xs = jnp.arange(12.0).reshape(4, 3)
    with flags(True):
        g = scans_from_ref_loops(jaxform.trace(fn, xs))
        left = [n for n, _ in g.walk() if _jax.scan3_loop(n.params)]
        want = fn(xs)
        got = jaxform.optimize(fn)(xs)
    assert left, "a Scan3 whose refs are not provably local was rewritten"
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_a_user_ref_carried_by_the_loop_is_read_as_a_carry():
    """A ref made in the function, written only by the loop and read whole after it, is a carry."""
    def f(xs):
        r = jax.new_ref(jnp.zeros(xs.shape[1:]))

        def body(c, x):
            r[...] = r[...] * 0.5 + x
            return c, jnp.sum(r[...] ** 2)
        ys = lax.scan(body, 0.0, xs)[1]
        return ys.sum() + r[...].sum()

    xs = jnp.arange(12.0).reshape(4, 3)
    with flags(True):
        g = scans_from_ref_loops(jaxform.trace(f, xs))
        assert not [n for n, _ in g.walk() if _jax.scan3_loop(n.params) or n.name == "new_ref"]
        np.testing.assert_allclose(jaxform.to_function(g)(xs), f(xs), rtol=1e-6)


# ---- jaxform.for_loop programs ------------------------------------------------------------------
# A for_loop is a `scan` over its discharged body (state/for_loop.py); under the flag that scan is a
# Scan3 too, read back the same way. Each program: the same optimized program with the flag on as
# off, and the optimization the equivalent `lax.scan` gets.

from test_stream_rows import in_place_rows, prefix_sums, scan_prefix_sums  # noqa: E402  (the seed's cumsum,
# in place; a matrix filled row by row with W @ W.T in the body; prefix_sums by hand as a lax.scan)


def for_loop_rnn_mse(w, xs, targets):              # jaxform.scan (a for_loop) in the README program
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = jaxform.scan(cell, jnp.zeros(xs.shape[1:]), xs)
    return jnp.mean((ys - targets) ** 2)


FOR_LOOPS = {"prefix_sums": (prefix_sums, (XS[:, 0, 0],), "default"),
             "in_place_rows": (in_place_rows, (W, XS[:, 0]), "hoisting"),
             "for_loop_rnn_mse": (for_loop_rnn_mse, (W, XS, TS), "default")}


@pytest.mark.parametrize("name", sorted(FOR_LOOPS))
def test_for_loop_programs_get_the_same_passes_with_the_flag_on(name):
    fn, args, pipeline = FOR_LOOPS[name]
    make = PIPELINES[pipeline]
    with flags(True):
        assert any(_jax.scan3_loop(n.params) for n, _ in jaxform.trace(fn, *args).walk())
        np.testing.assert_allclose(jax.jit(make(fn))(*args), fn(*args), rtol=1e-5)
    off, on = _program(make, fn, args, False), _program(make, fn, args, True)
    assert _text(on) == _text(off)
    assert _temp(make, fn, args, True) == _temp(make, fn, args, False)


def test_for_loop_hoisting_changes_the_program():
    fn, args, pipeline = FOR_LOOPS["in_place_rows"]
    with flags(True):
        assert _text(_program(PIPELINES[pipeline], fn, args, True)) != _text(jax.make_jaxpr(
            jaxform.optimize(fn, passes=["dce"]))(*args))


@SCAN3_RUN
def test_for_loop_prefix_sums_streams_as_the_hand_written_scan():
    """The seed's cumsum: stream_rows carries one row instead of the buffer and fusion reduces the rest,
    so forward and gradient temp memory equal the optimized hand-written scan's, flag on and off; plain
    JAX's gradient of the in-place loop builds a zero-padded [N] cotangent per step."""
    x = jnp.arange(2000.0) / 2000
    for on in (False, True):
        for view in (lambda f: f, jax.grad):
            got = _temp(lambda f: view(jaxform.optimize(f)), prefix_sums, (x,), on)
            want = _temp(lambda f: view(jaxform.optimize(f)), scan_prefix_sums, (x,), on)
            assert got <= want * 1.01 + 256, (on, got, want)
        assert _temp(lambda f: jax.grad(jaxform.optimize(f)), prefix_sums, (x,), on) < \
            _temp(jax.grad, prefix_sums, (x,), False)
        with flags(False):                         # JAX 0.12 cannot differentiate a Scan3: plain JAX, flag off
            want = jax.grad(prefix_sums)(x)
        with flags(on):
            np.testing.assert_allclose(jax.grad(jaxform.optimize(prefix_sums))(x), want, rtol=1e-5)


def test_for_loop_scan_fuses_as_lax_scan_does():
    """jaxform.scan's RNN + MSE: the forward temp memory optimize leaves equals lax.scan's, flag on and off."""
    fn, args, _ = FOR_LOOPS["for_loop_rnn_mse"]
    for on in (False, True):
        got = _temp(PIPELINES["default"], fn, args, on)
        want = _temp(PIPELINES["default"], rnn_mse, args, on)
        plain = _temp(lambda f: f, fn, args, False)
        assert got == want < plain / 10, (on, got, want, plain)


# ---- the real programs of test_fusion_real.py ---------------------------------------------------

from test_fusion_real import PROGRAMS as REAL, SCAN3_LIMITS, stacked_outputs  # noqa: E402


@SCAN3_RUN
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_programs_same_program_and_memory_with_the_flag_on(name):
    if name in SCAN3_LIMITS:
        pytest.skip(f"jax_scan3: {SCAN3_LIMITS[name]}")
    loss, args = REAL[name]()
    make = PIPELINES["default"]
    off, on = _program(make, loss, args, False), _program(make, loss, args, True)
    # the same loops with the same stacked outputs (the text may differ by a weak-type convert: lax.scan
    # promotes a weak init, Scan3's ref does not need to)
    assert stacked_outputs(on) == stacked_outputs(off)
    assert "Scan3" not in str(on) and "Scan3" in str(_program(lambda f: f, loss, args, True))
    assert _temp(make, loss, args, True) == _temp(make, loss, args, False)
    with flags(True):
        np.testing.assert_allclose(jax.jit(make(loss))(*args), jax.jit(loss)(*args), rtol=1e-5, atol=1e-6)


def test_a_reverse_scan3_is_left_as_jax_runs_it():
    """hmm_two_filter's backward pass is a reverse scan: JAX 0.12 runs its Scan3 forward, so the value
    under the flag differs from the flag off. jaxform keeps that loop as it is (its value is JAX's)."""
    loss, args = REAL["hmm_two_filter"]()
    with flags(True):
        want = jax.jit(loss)(*args)
        got = jax.jit(jaxform.optimize(loss))(*args)
        left = [n for n, _ in jaxform.trace(jaxform.optimize(loss), *args).walk() if _jax.scan3_loop(n.params)]
    assert len(left) == 1 and _jax.scan3_loop(left[0].params)[3]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_carry_only_loop_keeps_running_under_jit():
    """JAX 0.12 under jit drops a Scan3 that has no stacked outputs (its dead-code rule sees no used
    output and no effect, though the loop writes the carry refs read after it): `jit(f)` returns the
    initial carry (0.10.2 keeps it). jaxform reads the loop as a scan, which jit keeps: the value of
    `f` run eagerly and of `f` with the flag off."""
    def f(w, x):
        return lax.fori_loop(0, 4, lambda i, c: jnp.cos(w @ c) * i, x)

    args = (W[:8, :8], jnp.linspace(0.5, 1.5, 8))
    with flags(True):
        eager = f(*args)
        assert not np.allclose(eager, args[1])
        got = jax.jit(jaxform.optimize(f))(*args)
    with flags(False):
        want = jax.jit(f)(*args)
    np.testing.assert_allclose(got, eager, rtol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-6)
