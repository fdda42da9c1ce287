"""fuse_scan_reductions on slices of ys along the scan axis (issue 17): step predicates and picked steps.

`ys[k:]`, `ys[::2]`, `ys[::-2]`, `ys[:k]`, `ys[-1]`, `jnp.take(ys, k, 0)`, `ys[jnp.array(k)]`, a slice of
a batch-major `ys.transpose(1, 0, 2)`, on forward and reverse scans: the reduction moves into the body
and counts only the selected steps; a single step becomes a carry. Differential: values and gradients
(rtol 1e-5, float32) under jit, grad and vmap, and no stacked ys is left.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.ir.steps import Steps
from jaxform.optimize import run_passes
from jaxform.passes import DEFAULT, fuse_scan_reductions, inline
from jaxform.testing import assert_pass_ok

L, B, H, O = 6, 3, 4, 5
W = jnp.linspace(-1.0, 1.0, H * H).reshape(H, H) / 2
H0 = jnp.linspace(-0.5, 0.7, B * H).reshape(B, H)
XS = jnp.sin(jnp.arange(L * B * H, dtype=jnp.float32)).reshape(L, B, H)
T = jnp.cos(jnp.arange(L * B * H, dtype=jnp.float32) * 0.7).reshape(L, B, H)
VO = jnp.linspace(-1.0, 1.0, H * O).reshape(H, O)
LAB = (jnp.arange(L * B) % O).reshape(L, B)


def rnn(W, h0, xs, reverse=False):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x),) * 2, h0, xs, reverse=reverse)[1]


def ce(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))


def stacked(closed) -> list:
    g = Graph.from_jaxpr(closed)
    return [tuple(o.aval.shape) for n, _ in g.walk() if n.name == "scan" for o in n.outputs[n.params["num_carry"]:]]


def inline_then_fuse(g):
    return fuse_scan_reductions(inline(g))


# name -> (loss, args); every one fuses completely (no stacked ys left)
PROGRAMS = {
    "tail_half_sq": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[L // 2:] ** 2), (W, H0, XS)),
    "tail_targets": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs)[2:] - t[2:]) ** 2), (W, H0, XS, T)),
    "tail_own_targets": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs)[2:] - t) ** 2), (W, H0, XS, T[:L - 2])),
    "reverse_negative_start": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs, True)[-4:] - t[:4]) ** 2),
                               (W, H0, XS, T)),
    "head_max": (lambda W, h0, xs: jnp.max(rnn(W, h0, xs)[:4]), (W, H0, XS)),
    "stride": (lambda W, h0, xs, t: jnp.sum(rnn(W, h0, xs)[1::2] * t[::2]), (W, H0, XS, T)),
    "negative_stride": (lambda W, h0, xs, t: jnp.sum(rnn(W, h0, xs)[::-2] * t[:3]), (W, H0, XS, T)),
    "reverse_stride_min": (lambda W, h0, xs: jnp.min(rnn(W, h0, xs, True)[-5::3], (0, 2)), (W, H0, XS)),
    "slice_of_slice": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[1:][::2][1:] ** 2), (W, H0, XS)),
    "slice_with_other_axes": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[2:, 1:, ::2] ** 2), (W, H0, XS)),
    "two_selections": (lambda W, h0, xs: (lambda y: jnp.sum(y[:2]) + jnp.sum(y[2:] ** 2) + y.max())(
        rnn(W, h0, xs)), (W, H0, XS)),
    "batch_major_tail": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs).transpose(1, 0, 2)[:, 3:] - t) ** 2),
                         (W, H0, XS, T.transpose(1, 0, 2)[:, 3:])),
    "batch_major_last": (lambda W, h0, xs: jnp.sum(jnp.swapaxes(rnn(W, h0, xs), 0, 1)[:, -1] ** 2), (W, H0, XS)),
    "projection_ce_tail": (lambda W, h0, xs, V: ce(rnn(W, h0, xs)[1:] @ V, LAB[1:]), (W, H0, XS, VO)),
    "empty": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[4:2] ** 2) + jnp.sum(rnn(W, h0, xs)), (W, H0, XS)),
    "last": (lambda W, h0, xs, t: jnp.sum((rnn(W, h0, xs)[-1] - t[0]) ** 2), (W, H0, XS, T)),
    "index_reverse": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs, True)[2] ** 2), (W, H0, XS)),
    "take_negative": (lambda W, h0, xs: jnp.sum(jnp.take(rnn(W, h0, xs), -2, axis=0) ** 2), (W, H0, XS)),
    "take_clip": (lambda W, h0, xs: jnp.sum(jnp.take(rnn(W, h0, xs), 9, axis=0, mode="clip") ** 2), (W, H0, XS)),
    "dynamic_index": (lambda W, h0, xs: jnp.sum(lax.dynamic_index_in_dim(rnn(W, h0, xs), 3, keepdims=False) ** 3),
                      (W, H0, XS)),
    "array_index": (lambda W, h0, xs: jnp.sum(jnp.exp(rnn(W, h0, xs)[jnp.array(-1)])), (W, H0, XS)),
    "dynamic_slice_clamped": (lambda W, h0, xs: jnp.sum(lax.dynamic_slice_in_dim(rnn(W, h0, xs), 5, 3) ** 2),
                              (W, H0, XS)),
    "last_and_sum": (lambda W, h0, xs: (lambda e: (e.sum(), e[0]))(jnp.exp(rnn(W, h0, xs))), (W, H0, XS)),
    "vmap_per_example_tail": (lambda W, h0, xs: jnp.mean(jax.vmap(
        lambda h, x: jnp.sum(rnn(W, h[None], x[:, None])[3:] ** 2), (0, 1))(h0, xs)), (W, H0, XS)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_slice_fuses_and_matches(name):
    fn, args = PROGRAMS[name]
    before = jax.make_jaxpr(fn)(*args)
    after = assert_pass_ok(inline_then_fuse, fn, *args, rtol=1e-5, atol=1e-6)
    assert stacked(before) and stacked(after) == [], (stacked(before), stacked(after))


@pytest.mark.parametrize("name", ["tail_targets", "reverse_negative_start", "last", "batch_major_tail"])
def test_through_optimize(name):
    """The default pipeline fuses it; optimize(loss) under jit, grad and vmap equals the original."""
    fn, args = PROGRAMS[name]
    opt = jaxform.optimize(fn)
    np.testing.assert_allclose(jax.jit(opt)(*args), fn(*args), rtol=1e-5)
    for a, b in zip(jax.jit(jax.grad(opt, (0, 1)))(*args), jax.grad(fn, (0, 1))(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    h0s = jnp.stack([H0, -H0])
    np.testing.assert_allclose(jax.vmap(opt, (None, 0) + (None,) * (len(args) - 2))(args[0], h0s, *args[2:]),
                               jax.vmap(fn, (None, 0) + (None,) * (len(args) - 2))(args[0], h0s, *args[2:]),
                               rtol=1e-5)
    closed = jax.make_jaxpr(fn)(*args)
    assert stacked(run_passes(closed, DEFAULT, strict=True)) == []


def test_pass_removes_the_stacked_ys_and_adds_a_position():
    """ys[k:] -> a carried accumulator with a predicate on an int32 position carry; ys[-1] -> a picked carry."""
    fn, args = PROGRAMS["tail_half_sq"]
    after = run_passes(jax.make_jaxpr(fn)(*args), [fuse_scan_reductions, "dce"], strict=True)
    (s,) = [n for n, _ in Graph.from_jaxpr(after).walk() if n.name == "scan"]
    carries = [(tuple(v.aval.shape), str(v.aval.dtype)) for v in s.outputs[:s.params["num_carry"]]]
    assert ((), "int32") in carries and stacked(after) == []
    assert "select_n" in [n.name for n in s.regions["body"].nodes]
    fn, args = PROGRAMS["last"]
    after = run_passes(jax.make_jaxpr(fn)(*args), [fuse_scan_reductions, "dce"], strict=True)
    (s,) = [n for n, _ in Graph.from_jaxpr(after).walk() if n.name == "scan"]
    assert stacked(after) == [] and (B, H) in [tuple(v.aval.shape) for v in s.outputs]


def test_unselected_steps_never_reach_a_gradient():
    """Consumers of ys[k:] run at every step in the body; at the unselected steps they may compute log(0)
    or read NaN padding of the targets. The original never computes those; its gradient is finite and so
    must the fused one's be (the inputs of moved consumers are masked by select + stop_gradient)."""
    xs = jnp.arange(1.0, 7.0)

    def logs(xs):   # ys[0] == 0: log(0) at step 0, which ys[1:] skips
        ys = lax.scan(lambda c, x: (c + 1.0, c * x), 0.0, xs)[1]
        return jnp.sum(jnp.log(ys[1:]))

    t = jnp.where(jnp.arange(L) < 2, jnp.nan, 1.0)[:, None, None] * T

    def nan_targets(W, h0, xs, t):   # burn-in targets marked NaN, never used by the original
        return jnp.mean((rnn(W, h0, xs)[2:] - t[2:]) ** 2)
    for fn, args in ((logs, (xs,)), (nan_targets, (W, H0, XS, t))):
        after = assert_pass_ok(inline_then_fuse, fn, *args, rtol=1e-5, atol=1e-6, vmap=False)
        assert stacked(after) == []
        g = jax.grad(jaxform.optimize(fn))(*args)
        assert np.isfinite(g).all()


def test_low_precision_and_int():
    """bf16 sums of a slice accumulate in float32; integer max of a strided slice is exact."""
    fn = lambda xs: jnp.sum(lax.scan(lambda c, x: (c + x, c * x), jnp.bfloat16(0), xs)[1][100:])  # noqa: E731
    xs = jnp.ones(600, jnp.bfloat16)
    after = run_passes(jax.make_jaxpr(fn)(xs), [fuse_scan_reductions, "dce"], strict=True)
    assert stacked(after) == []
    assert float(jaxform.optimize(fn)(xs)) == float(jax.jit(fn)(xs))
    fi = lambda n: lax.scan(lambda c, x: (c + x, c * x - 3), jnp.int32(1), n)[1][1::3].max()  # noqa: E731
    n = jnp.arange(11, dtype=jnp.int32)
    assert int(jaxform.optimize(fi)(n)) == int(fi(n))
    assert stacked(run_passes(jax.make_jaxpr(fi)(n), [fuse_scan_reductions, "dce"], strict=True)) == []


BLOCKED = {   # name -> (loss, what explain says)
    "differences": (lambda W, h0, xs: (lambda y: jnp.sum((y[1:] - y[:-1]) ** 2))(rnn(W, h0, xs)),
                    "different steps"),
    "traced_index": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[jnp.argmax(xs[:, 0, 0])]), "not static"),
    "slice_returned": (lambda W, h0, xs: (lambda y: (y.sum(), y[2:]))(rnn(W, h0, xs)), "result of the program"),
    "per_step_export": (lambda W, h0, xs: (lambda y: jnp.sum(y[2:], (1, 2)))(rnn(W, h0, xs)),
                        "slice along the scan axis is used outside"),
}


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_slices_stay_and_explain_says_why(name):
    fn, why = BLOCKED[name]
    before = jax.make_jaxpr(fn)(W, H0, XS)
    after = assert_pass_ok(inline_then_fuse, fn, W, H0, XS, rtol=1e-5, atol=1e-6)
    assert (L, B, H) in stacked(after)
    r = jaxform.explain(fn, W, H0, XS, memory=False)
    assert r.unfused and any(why in u["why"] for u in r.unfused), r.unfused
    assert all("test_scan_slices.py" in u["where"] for u in r.unfused)
    assert stacked(before)


def test_steps_algebra():
    s = Steps.full(10)
    assert s.slice(2, 10, 3) == Steps(2, 3, 3)
    assert s.slice(2, 10, 3).rev() == Steps(8, -3, 3) and Steps(8, -3, 3).first == 2
    assert s.rev().slice(0, 10, 2) == Steps(9, -2, 5)
    assert s.slice(4, 2, 1).count == 0 and s.slice(7, 8, 1) == Steps(7, 1, 1)
    assert s.rev().is_all(10) and not s.slice(1, 10, 1).is_all(10)
