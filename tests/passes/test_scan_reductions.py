"""fuse_scan_reductions: differential tests on scan programs, and that the reductions really moved."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.optimize import run_passes
from jaxform.passes import fuse_scan_reductions, inline
from jaxform.passes.scan_reductions import REDUCTIONS
from jaxform.testing import assert_pass_ok

L, B, H = 6, 3, 4
W = jnp.linspace(-1.0, 1.0, H * H).reshape(H, H) / 2
H0 = jnp.linspace(-0.5, 0.7, B * H).reshape(B, H)
XS = jnp.sin(jnp.arange(L * B * H, dtype=jnp.float32)).reshape(L, B, H)
T = jnp.cos(jnp.arange(L * B * H, dtype=jnp.float32) * 0.7).reshape(L, B, H)
V = jnp.linspace(0.5, 1.5, H)


def rnn(W, h0, xs, reverse=False, unroll=1):
    """The seed's model: returns the stacked hidden states."""
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x),) * 2, h0, xs, reverse=reverse, unroll=unroll)[1]


def two_ys(W, h0, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x), (jnp.sin(h), h.sum(-1))), h0, xs)[1]


# ---- inspecting the result ---------------------------------------------------------

def scans(closed) -> list:
    return [n for n, _ in Graph.from_jaxpr(closed).walk() if n.name == "scan"]


def reductions_in_scans(closed) -> int:
    n = 0
    for s in scans(closed):
        n += sum(m.name in REDUCTIONS for m, _ in s.regions["body"].walk())
    return n


def reductions_outside_scans(g) -> int:
    """Reductions not inside any scan body (at any depth of jit/cond/while)."""
    g = Graph.from_jaxpr(g) if not isinstance(g, Graph) else g
    return sum(n.name in REDUCTIONS for n in g.nodes) + sum(
        reductions_outside_scans(sub) for n in g.nodes if n.name != "scan" for sub in n.subgraphs())


def stacked(closed) -> list:
    """Shapes of the ys outputs of every scan (what the scan materializes)."""
    return [tuple(o.aval.shape) for s in scans(closed) for o in s.outputs[s.params["num_carry"]:]]


def fused(fn, *args, p=None, check=True, **kw):
    """Run the pass (through assert_pass_ok if check); return (before, after) jaxprs."""
    p = p or eager
    before = jax.make_jaxpr(fn)(*args)
    return before, assert_pass_ok(p, fn, *args, **kw) if check else run_passes(before, [p], strict=True)


def eager(g):
    """The pass with per-step reductions (not deferred), whatever the backend's default."""
    return fuse_scan_reductions(g, defer=False)


def inline_then_fuse(g):
    return eager(inline(g))


# ---- programs that fuse completely: no [length, ...] ys is left ---------------------

FULL = {
    "seed_rnn_mse": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs) - t) ** 2), (W, H0, XS, T)),
    "seed_sin_cos_3d": (lambda x1, x2, y: jnp.square(y - lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)[1])
                        .mean(), (H0, XS, T)),
    "sum_all": (lambda W, h0, xs: rnn(W, h0, xs).sum(), (W, H0, XS)),
    "sum_axis0": (lambda W, h0, xs: rnn(W, h0, xs).sum(0), (W, H0, XS)),
    "mean_axis01": (lambda W, h0, xs: rnn(W, h0, xs).mean((0, 1)), (W, H0, XS)),
    "max_all": (lambda W, h0, xs: rnn(W, h0, xs).max(), (W, H0, XS)),
    "min_axis02": (lambda W, h0, xs: rnn(W, h0, xs).min((0, 2)), (W, H0, XS)),
    "prod_axis0": (lambda W, h0, xs: (1 + 0.1 * rnn(W, h0, xs)).prod(0), (W, H0, XS)),
    "linf_abs_max": (lambda W, h0, xs: jnp.max(jnp.abs(rnn(W, h0, xs) - 0.1)), (W, H0, XS)),
    "l2_norm": (lambda W, h0, xs: jnp.sqrt(jnp.sum(rnn(W, h0, xs) ** 2)), (W, H0, XS)),
    "several_of_same": (lambda W, h0, xs: (lambda y: (y.sum(), y.max(0), jnp.mean(y ** 2), y.min()))(rnn(W, h0, xs)),
                        (W, H0, XS)),
    "two_ys": (lambda W, h0, xs: (lambda a, b: (a.sum(), jnp.max(b)))(*two_ys(W, h0, xs)), (W, H0, XS)),
    "two_ys_mixed": (lambda W, h0, xs: (lambda a, b: jnp.sum(a * b[..., None]))(*two_ys(W, h0, xs)), (W, H0, XS)),
    "reverse": (lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs, reverse=True) - t) ** 2), (W, H0, XS, T)),
    "unroll3": (lambda W, h0, xs, t: jnp.mean(jnp.abs(rnn(W, h0, xs, unroll=3) - t)), (W, H0, XS, T)),
    "scalar_arg": (lambda W, h0, xs, s: jnp.sum(rnn(W, h0, xs) * s + s ** 2), (W, H0, XS, jnp.float32(0.7))),
    "broadcast_vector": (lambda W, h0, xs, v: jnp.mean((rnn(W, h0, xs) - v) ** 2), (W, H0, XS, V)),
    "broadcast_per_step": (lambda W, h0, xs, t: jnp.sum(rnn(W, h0, xs) * t[:, None, :]), (W, H0, XS, T[:, 0])),
    "broadcast_leading_one": (lambda W, h0, xs, t: jnp.sum(rnn(W, h0, xs) * t[None]), (W, H0, XS, T[0])),
    "count_positive": (lambda W, h0, xs: jnp.sum((rnn(W, h0, xs) > 0).astype(jnp.float32)), (W, H0, XS)),
    "select_leaky": (lambda W, h0, xs: (lambda y: jnp.sum(lax.select(y > 0, y, 0.1 * y)))(rnn(W, h0, xs)),
                     (W, H0, XS)),
    "clamp": (lambda W, h0, xs: jnp.sum(lax.clamp(-0.3, rnn(W, h0, xs), 0.4)), (W, H0, XS)),
    "reduce_then_reduce": (lambda W, h0, xs: jnp.sum(jnp.sum(rnn(W, h0, xs), axis=2) ** 2), (W, H0, XS)),
    "keepdims_center": (lambda W, h0, xs: jnp.sum((lambda y: (y - y.mean(-1, keepdims=True)) ** 2)(rnn(W, h0, xs))),
                        (W, H0, XS)),
    "with_carry_used": (lambda W, h0, xs: (lambda c, y: (c, jnp.mean(y)))(
        *lax.scan(lambda h, x: (jnp.tanh(h @ W + x),) * 2, h0, xs)), (W, H0, XS)),
    "ys_minus_own_xs": (lambda W, h0, xs: jnp.sum((rnn(W, h0, xs) - xs) ** 2), (W, H0, XS)),
    "rank1_ys": (lambda W, h0, xs: jnp.mean(lax.scan(lambda h, x: (jnp.tanh(h @ W + x), jnp.sum(h)), h0, xs)[1]),
                 (W, H0, XS)),
    "other_scan_operand": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs) * rnn(W.T, h0, xs)), (W, H0, XS)),
    "int_sum_max": (lambda n: (lambda y: (y.sum(), y.max(), y.min(0)))(
        lax.scan(lambda c, x: (c + x, c * x - 3), jnp.int32(1), n)[1]), (jnp.arange(7, dtype=jnp.int32),)),
    "bf16_max_min": (lambda W, h0, xs: (lambda y: (y.max(), y.min(0)))(rnn(W, h0, xs.astype(jnp.bfloat16))),
                     (W.astype(jnp.bfloat16), H0.astype(jnp.bfloat16), XS)),
    "uint8_max": (lambda n: lax.scan(lambda c, x: (c + x, c * x), jnp.uint8(1), n)[1].max(),
                  (jnp.arange(9, dtype=jnp.uint8),)),
    "ys_into_matmul": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs) @ W), (W, H0, XS)),
    "length_zero": (lambda h0, xs: jnp.sum(lax.scan(lambda h, x: (h + x, h * x), h0, xs)[1]),
                    (H0, XS[:0])),
}


@pytest.mark.parametrize("name", sorted(FULL))
def test_fuses_completely(name):
    fn, args = FULL[name]
    before, after = fused(fn, *args)
    assert reductions_outside_scans(after) < reductions_outside_scans(before)
    assert len(scans(after)) == len(scans(before))
    if name == "other_scan_operand":   # the first scan reads the second one's ys as xs
        assert stacked(before) == [(L, B, H)] * 2 and stacked(after) == [(L, B, H)]
    else:
        assert stacked(before) and stacked(after) == []


@pytest.mark.parametrize("name", sorted(FULL))
def test_fuses_completely_deferred(name):
    """Deferred accumulators (the CPU/GPU default): same values, no stacked ys either."""
    fn, args = FULL[name]
    # two_ys_mixed: the checker differentiates sin(S) with S = 23.46, where cos(S) ~ 0.1 amplifies float32
    # rounding of S (1.4e-6) ~10x in relative terms; any reassociation shows up there (eager happens to pass)
    tol = dict(rtol=1e-4, atol=1e-4) if name == "two_ys_mixed" else {}
    before, after = fused(fn, *args, p=lambda g: fuse_scan_reductions(g, defer=True), **tol)
    if name != "other_scan_operand":
        assert stacked(before) and stacked(after) == []


def test_seed_rnn_body_shape():
    """The seed's MSE: one new f32[] carry, no ys, mean's division stays outside."""
    fn, args = FULL["seed_rnn_mse"]
    _, after = fused(fn, *args, p=eager, check=False)   # values checked in test_fuses_completely
    (s,) = scans(after)
    assert s.params["num_carry"] == 2 and len(s.outputs) == 2
    assert s.outputs[1].aval.shape == ()
    assert [n.name for n in Graph.from_jaxpr(after).nodes] == ["broadcast_in_dim", "scan", "div"]
    body = [n.name for n in s.regions["body"].nodes]
    assert body[-4:] == ["sub", "integer_pow", "reduce_sum", "add"]
    assert s.inputs[-1].aval.shape == (L, B, H)   # the targets became xs


def test_broadcast_is_not_materialized():
    """A [H] vector broadcast against ys enters as a const; the broadcast happens per step."""
    fn, args = FULL["broadcast_vector"]
    _, after = fused(fn, *args, check=False)   # values checked in test_fuses_completely
    (s,) = scans(after)
    c = s.params["num_consts"]
    assert (H,) in [v.aval.shape for v in s.inputs[:c]]
    assert all(v.aval.shape[0] != L or v.aval.shape == (L, B, H) for v in s.inputs[c + s.params["num_carry"]:])
    assert len(s.inputs) - c - s.params["num_carry"] == 1    # only the original xs


def test_own_xs_is_reused():
    fn, args = FULL["ys_minus_own_xs"]
    before, after = fused(fn, *args, check=False)   # values checked in test_fuses_completely
    (s0,), (s1,) = scans(before), scans(after)
    n_xs = lambda s: len(s.inputs) - s.params["num_consts"] - s.params["num_carry"]  # noqa: E731
    assert n_xs(s1) == n_xs(s0) == 1


# ---- partial fusion: per-step reductions keep a smaller ys ---------------------------

def test_reduce_non_scan_axis_keeps_smaller_ys():
    fn = lambda W, h0, xs: jnp.sum(rnn(W, h0, xs), axis=(1, 2))  # noqa: E731
    before, after = fused(fn, W, H0, XS)
    assert stacked(before) == [(L, B, H)] and stacked(after) == [(L,)]


def test_per_step_reduction_exported_and_reused():
    fn = lambda W, h0, xs: (lambda r: (r, jnp.max(r)))(jnp.sum(rnn(W, h0, xs) ** 2, axis=-1))  # noqa: E731
    before, after = fused(fn, W, H0, XS)
    assert stacked(after) == [(L, B)]
    (s,) = scans(after)
    assert s.params["num_carry"] == 2


# ---- not fused: ys (or something elementwise from it) has another consumer ----------

NOT_FUSED = {
    "ys_also_returned": (lambda W, h0, xs: (lambda y: (y, y.sum()))(rnn(W, h0, xs)), (W, H0, XS)),
    "center_over_scan_axis": (lambda W, h0, xs: (lambda y: jnp.sum((y - y.mean(0)) ** 2))(rnn(W, h0, xs)),
                              (W, H0, XS)),
    "divide_by_own_total": (lambda W, h0, xs: (lambda y: jnp.sum(y / y.sum()))(rnn(W, h0, xs)), (W, H0, XS)),
    "minus_final_carry": (lambda W, h0, xs: (lambda c, y: jnp.sum(y - c))(
        *lax.scan(lambda h, x: (jnp.tanh(h @ W + x),) * 2, h0, xs)), (W, H0, XS)),
    "elementwise_escapes": (lambda W, h0, xs: (lambda e: (e.sum(), e[::2]))(jnp.exp(rnn(W, h0, xs))), (W, H0, XS)),
}


@pytest.mark.parametrize("name", sorted(NOT_FUSED))
def test_not_fused(name):
    """Left exactly as it was (so values are trivially the same)."""
    fn, args = NOT_FUSED[name]
    before, after = fused(fn, *args, check=False)
    assert str(after) == str(before)


def test_only_the_reducible_ys_fuses():
    fn = lambda W, h0, xs: (lambda a, b: (a.sum(), b))(*two_ys(W, h0, xs))  # noqa: E731
    before, after = fused(fn, W, H0, XS)
    assert stacked(before) == [(L, B, H), (L, B)] and stacked(after) == [(L, B)]


def test_mixed_ys_with_escaping_partner_does_not_fuse():
    """a * b is reduced, but b also escapes: neither fuses (a cannot read b per step)."""
    fn = lambda W, h0, xs: (lambda a, b: (jnp.sum(a * b[..., None]), b))(*two_ys(W, h0, xs))  # noqa: E731
    before, after = fused(fn, W, H0, XS, check=False)
    assert str(after) == str(before)


# ---- nesting --------------------------------------------------------------------------

def test_inside_jit():
    fn = jax.jit(lambda W, h0, xs, t: jnp.mean((rnn(W, h0, xs) - t) ** 2))
    before, after = fused(fn, W, H0, XS, T)
    assert reductions_in_scans(after) == 1 and (L, B, H) not in stacked(after)


def test_inside_cond_branch():
    def fn(p, W, h0, xs):
        return lax.cond(p > 0, lambda: jnp.sum(rnn(W, h0, xs) ** 2), lambda: jnp.max(rnn(W.T, h0, xs)))
    before, after = fused(fn, jnp.float32(1.0), W, H0, XS)
    assert reductions_in_scans(after) == 2 and (L, B, H) not in stacked(after)


def test_inside_while_body():
    def fn(W, h0, xs):
        return lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + jnp.mean(rnn(W, h0 * c[1], xs) ** 2)),
                              (0, jnp.float32(1.0)))[1]
    before, after = fused(fn, W, H0, XS, grad=False)   # while loops have no reverse-mode rule
    assert reductions_in_scans(after) == 1 and (L, B, H) not in stacked(after)


def test_scan_in_scan_body():
    def fn(W, h0, xss):
        return lax.scan(lambda c, xs: (c + 1, jnp.sum(rnn(W, h0 * c, xs) ** 2)), 1.0, xss)[1]
    before, after = fused(fn, W, H0, jnp.stack([XS, XS * 0.5]))
    assert (L, B, H) not in stacked(after) and (2,) in stacked(after)


def test_nested_stacked_ys_fuses_both_levels():
    """Outer ys stack the inner ys ([2, L, B, H]); the sum moves into the outer, then the inner body."""
    def fn(W, h0, xss):
        return jnp.mean(lax.scan(lambda c, xs: (c, rnn(W, h0, xs)), 0.0, xss)[1] ** 2)
    before, after = fused(fn, W, H0, jnp.stack([XS, XS * 0.5]))
    assert stacked(before) == [(2, L, B, H), (L, B, H)] and stacked(after) == []
    assert reductions_outside_scans(after) == 0


def test_jnp_where_with_and_without_inline():
    fn = lambda W, h0, xs: (lambda y: jnp.sum(jnp.where(y > 0, y, 0.1 * y)))(rnn(W, h0, xs))  # noqa: E731
    before, after = fused(fn, W, H0, XS, p=inline_then_fuse)
    assert (L, B, H) not in stacked(after)
    alone = run_passes(jax.make_jaxpr(fn)(W, H0, XS), [fuse_scan_reductions], strict=True)
    assert (L, B, H) not in stacked(alone)   # the jit around jnp.where moves into the body whole


# ---- through optimize -----------------------------------------------------------------

def seed_loss(W, h0, xs, t):
    return jnp.mean((rnn(W, h0, xs) - t) ** 2)


def test_in_default_pipeline_not_exact():
    assert "fuse_scan_reductions" in jaxform.passes.DEFAULT
    assert jaxform.passes.DEFAULT.index("fuse_scan_reductions") < jaxform.passes.DEFAULT.index("dce")
    assert not fuse_scan_reductions.exact
    assert fuse_scan_reductions not in jaxform.passes.default_pipeline(exact=True)


def test_grad_of_optimized():
    opt = jaxform.optimize(seed_loss)
    g0 = jax.jit(jax.grad(seed_loss, argnums=(0, 1)))(W, H0, XS, T)
    g1 = jax.jit(jax.grad(opt, argnums=(0, 1)))(W, H0, XS, T)
    for a, b in zip(g0, g1):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    fwd = run_passes(jax.make_jaxpr(seed_loss)(W, H0, XS, T), jaxform.passes.DEFAULT, strict=True)
    assert stacked(fwd) == []


def test_optimize_of_grad_keeps_residual_ys():
    """In grad's jaxpr the stacked ys also feed the backward scan: not fusable, and values stay right."""
    g = jax.grad(seed_loss)
    closed = jax.make_jaxpr(g)(W, H0, XS, T)
    after = run_passes(closed, ["inline", "fuse_scan_reductions", "dce"], strict=True)
    assert (L, B, H) in stacked(after)
    np.testing.assert_allclose(jaxform.optimize(g)(W, H0, XS, T), g(W, H0, XS, T), rtol=1e-5, atol=1e-6)


def test_value_and_forward_through_optimize():
    opt = jaxform.optimize(seed_loss)
    np.testing.assert_allclose(opt(W, H0, XS, T), seed_loss(W, H0, XS, T), rtol=1e-5)
    np.testing.assert_allclose(jax.vmap(opt, (None, 0, None, None))(W, jnp.stack([H0, -H0]), XS, T),
                               jax.vmap(seed_loss, (None, 0, None, None))(W, jnp.stack([H0, -H0]), XS, T), rtol=1e-5)


# ---- issue 17: what is computed step by step fuses, wherever the scan axis goes ------------

O = 5
VO = jnp.linspace(-1.0, 1.0, H * O).reshape(H, O)
LAB = (jnp.arange(L * B) % O).reshape(L, B)


def ce(logits, labels):
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))


STEPWISE = {
    "log_softmax_ce_projection": (lambda W, h0, xs, V: ce(rnn(W, h0, xs) @ V, LAB), (W, H0, XS, VO)),
    "logsumexp_stop_gradient": (lambda W, h0, xs: jnp.sum(jax.nn.logsumexp(rnn(W, h0, xs), -1)), (W, H0, XS)),
    "swapaxes_batch_major": (lambda W, h0, xs, t: jnp.mean((jnp.swapaxes(rnn(W, h0, xs), 0, 1) - t) ** 2),
                             (W, H0, XS, jnp.swapaxes(T, 0, 1))),
    "transpose_last": (lambda W, h0, xs: jnp.sum(jnp.transpose(rnn(W, h0, xs), (2, 1, 0)) * V[:, None, None]),
                       (W, H0, XS)),
    "vmap_per_example_targets": (lambda W, h0, xs, t: jnp.mean(jax.vmap(
        lambda h, x, tt: jnp.mean((rnn(W, h[None], x[:, None])[:, 0] - tt) ** 2), (0, 1, 1))(h0, xs, t)),
        (W, H0, XS, T)),
    "relu_custom_jvp": (lambda W, h0, xs: jnp.sum(jax.nn.relu(rnn(W, h0, xs) - 0.1)), (W, H0, XS)),
    "softplus_logaddexp": (lambda W, h0, xs: jnp.mean(jax.nn.softplus(rnn(W, h0, xs))), (W, H0, XS)),
    "jit_helper": (lambda W, h0, xs: jax.jit(lambda y: jnp.sum(jnp.cumsum(y, -1) ** 2))(rnn(W, h0, xs)),
                   (W, H0, XS)),
    "checkpoint_helper": (lambda W, h0, xs: jnp.sum(jax.checkpoint(lambda y: jnp.sin(y) @ W)(rnn(W, h0, xs))),
                          (W, H0, XS)),
    "reshape_keep_axis": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs).reshape(L, B * H) ** 2), (W, H0, XS)),
    "batched_matmul": (lambda W, h0, xs: jnp.sum(jnp.einsum("lbh,lbk->lhk", rnn(W, h0, xs), xs)), (W, H0, XS)),
    "slice_other_axis": (lambda W, h0, xs: jnp.sum(rnn(W, h0, xs)[:, 1:, ::2]), (W, H0, XS)),
}


@pytest.mark.parametrize("name", sorted(STEPWISE))
def test_stepwise_consumers_fuse(name):
    fn, args = STEPWISE[name]
    before, after = fused(fn, *args, p=inline_then_fuse)
    assert stacked(before) and all(s[0] != L or len(s) == 1 for s in stacked(after)), stacked(after)


def test_custom_jvp_rule_kept():
    """A custom_jvp function moved into the body keeps its rule (not the derivative of its primal)."""
    @jax.custom_jvp
    def f(y):
        return jnp.sin(y)

    @f.defjvp
    def f_jvp(p, t):
        return f(p[0]), 3.0 * t[0]   # deliberately not cos: the rule must survive
    loss = lambda W, h0, xs: jnp.sum(f(rnn(W, h0, xs)))  # noqa: E731
    before, after = fused(loss, W, H0, XS, check=False)
    assert stacked(after) == []
    opt = jaxform.optimize(loss)
    np.testing.assert_allclose(jax.grad(opt)(W, H0, XS), jax.grad(loss)(W, H0, XS), rtol=1e-5, atol=1e-6)


SLICED = {   # what needs other steps stays outside (slices along the scan axis fuse: tests/passes/test_scan_slices.py)
    "differences": lambda W, h0, xs: (lambda y: jnp.sum((y[1:] - y[:-1]) ** 2))(rnn(W, h0, xs)),
    "center_over_steps": lambda W, h0, xs: (lambda y: jnp.sum(jnp.cumsum(y, 0) ** 2))(rnn(W, h0, xs)),
}


@pytest.mark.parametrize("name", sorted(SLICED))
def test_scan_axis_slices_block(name):
    before, after = fused(SLICED[name], W, H0, XS)
    assert (L, B, H) in stacked(after)


# ---- issue 15: effects, low precision, shard_map ---------------------------------------

def test_ref_read_after_scan_is_not_lifted():
    """15.2: a ref read after a scan that writes the ref stays after it (was 9.94 instead of 201.2)."""
    def g(xs):
        r = jax.new_ref(jnp.zeros(()))

        def body(c, x):
            r[...] += x
            return c, x * 2
        ys = lax.scan(body, 0.0, xs)[1]
        return jnp.sum(ys * r[...]) + jnp.sum(ys)
    xs = jnp.arange(1.0, 21.0)
    np.testing.assert_allclose(jaxform.optimize(g)(xs), g(xs), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jaxform.optimize(g))(xs), jax.jit(g)(xs), rtol=1e-6)


def test_ordered_callback_after_scan_stays_after():
    """15.2: an ordered io_callback after the scan runs after the scan's own callbacks."""
    from jax.experimental import io_callback
    log = []

    def g(xs):
        def body(c, x):
            io_callback(lambda v: log.append(("in", float(v))), None, x, ordered=True)
            return c, x * 2
        ys = lax.scan(body, 0.0, xs)[1]
        t = io_callback(lambda: (log.append(("after",)), np.float32(3))[1],
                        jax.ShapeDtypeStruct((), jnp.float32), ordered=True)
        return jnp.sum(ys * t)
    xs = jnp.arange(1.0, 4.0)
    want = g(xs)
    expected, log[:] = list(log), []
    np.testing.assert_allclose(jaxform.optimize(g)(xs), want)
    assert log == expected and log[-1] == ("after",)


def test_effect_free():
    from jaxform.ir.separability import effect_free
    from jax.experimental import io_callback
    g = jaxform.trace(lambda x: jnp.sin(x) + io_callback(lambda v: v, x, x), jnp.ones(3))
    add = [n for n in g.nodes if n.name == "add"][0]
    sin = [n for n in g.nodes if n.name == "sin"][0]
    assert effect_free(sin.outputs[0]) and not effect_free(add.outputs[0])


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_low_precision_sum_accumulates_in_f32(dtype):
    """15.3: 5000 ones sum to ~5000 as XLA gives (f16 accumulation gave 2048, bf16 256)."""
    f = lambda xs: jnp.sum(lax.scan(lambda c, x: (c, x), 0.0, xs)[1])  # noqa: E731
    xs = jnp.ones((5000,), dtype)
    before, after = fused(f, xs, check=False)
    assert stacked(after) == []
    got = _jax_eval(after, xs)
    assert got.dtype == dtype
    assert float(got) == float(jax.jit(f)(xs)) and abs(float(got) - 5000) <= 8


@pytest.mark.parametrize("defer", [False, True])
def test_long_float32_sum_is_compensated(defer):
    """A 4096-step float32 loss: a plain running sum in the carry was 2.5e-5 relative off the float64 value (the
    fuzzer's campaign seed 3101 found it against XLA's reduction); compensated, it is within a few ulps."""
    def f(W, h0):
        def body(h, _):
            h = 0.5 * jnp.tanh(h @ W) + 1.0
            return h, h
        return jnp.sum(jax.nn.relu(lax.scan(body, h0, None, length=4096)[1]) * 2.0)
    W3, h3 = jnp.linspace(-1, 1, 9, dtype=jnp.float32).reshape(3, 3), jnp.array([0.3, -0.2, 0.9], jnp.float32)
    closed = jax.make_jaxpr(f)(W3, h3)
    after = run_passes(closed, [lambda g: fuse_scan_reductions(g, defer=defer)], strict=True)
    assert stacked(after) == []
    got = float(jax.jit(lambda *a: _jax_eval(after, *a))(W3, h3))
    with jax.enable_x64(True):
        want = float(f(np.asarray(W3, np.float64), np.asarray(h3, np.float64)))
    assert abs(got - want) <= 4 * np.spacing(np.float32(want)), (got, want)


def test_low_precision_mean_2d():
    f = lambda xs: jnp.mean(lax.scan(lambda c, x: (c, x * jnp.ones((3, 7), x.dtype)), 0.0, xs)[1])  # noqa: E731
    xs = jnp.linspace(0, 1, 3000).astype(jnp.bfloat16)
    before, after = fused(f, xs, check=False)
    np.testing.assert_allclose(np.float32(_jax_eval(after, xs)), np.float32(jax.jit(f)(xs)), rtol=1e-2)


def _jax_eval(closed, *args):
    from jaxform import _jax
    return _jax.eval_jaxpr(closed, *args)[0]


def test_shard_map_device_varying_carry():
    """15.12: inside shard_map the accumulator is device-varying like the ys it accumulates."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((8,), ("b",), axis_types=(jax.sharding.AxisType.Explicit,))

    def loss(w, h0, xs):
        def per(h0, xs):
            ys = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, h0, xs)[1]
            return lax.psum(jnp.sum(ys ** 2) + jnp.max(ys), "b")
        return jax.shard_map(per, mesh=mesh, in_specs=(P("b"), P(None, "b")), out_specs=P())(h0, xs)
    w = jnp.eye(4) * 0.5
    h0 = jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P("b")))
    xs = jax.device_put(jnp.sin(jnp.arange(6 * 16 * 4.0)).reshape(6, 16, 4), NamedSharding(mesh, P(None, "b")))
    closed = jax.make_jaxpr(loss)(w, h0, xs)
    after = run_passes(closed, ["fuse_scan_reductions"], strict=True)
    assert stacked(after) == []
    np.testing.assert_allclose(jax.jit(jaxform.optimize(loss))(w, h0, xs), jax.jit(loss)(w, h0, xs), rtol=1e-5)


def test_moved_nodes_keep_source_and_ctx():
    """15.20: nodes moved into the body keep their equation context and user source line."""
    fn, args = FULL["seed_rnn_mse"]
    before = jax.make_jaxpr(fn)(*args)
    ctx = {n.name: n.ctx for n in Graph.from_jaxpr(before).nodes}
    after = run_passes(before, [fuse_scan_reductions], strict=True)
    (s,) = scans(after)
    moved = [n for n in s.regions["body"].nodes if n.name in ("sub", "integer_pow")]
    assert moved and all(n.ctx is ctx[n.name] for n in moved)
    assert all("test_scan_reductions.py" in n.location() for n in moved)


# ---- issue 19: deferred accumulators -----------------------------------------------------

@pytest.mark.parametrize("defer", [False, True])
def test_deferred_and_eager_accumulators(defer):
    fn, args = FULL["seed_rnn_mse"]
    p = lambda g: fuse_scan_reductions(g, defer=defer)  # noqa: E731
    before, after = fused(fn, *args, p=p)
    (s,) = scans(after)
    carries = [v.aval.shape for v in s.outputs[:s.params["num_carry"]]]
    assert carries == [(B, H), (B, H) if defer else ()]
    assert stacked(after) == []


def test_dead_consumer_does_not_block():
    """An unused value computed from ys (left by inlining a library helper) does not block fusion."""
    def fn(W, h0, xs):
        ys = rnn(W, h0, xs)
        _unused = jnp.exp(ys[0])   # noqa: F841  (dead, like an unused field of a NamedTuple)
        return jnp.sum(ys ** 2)
    before = jax.make_jaxpr(fn)(W, H0, XS)
    assert "exp" in [n.name for n in Graph.from_jaxpr(before).nodes]   # the dead consumer is there
    after = run_passes(before, [fuse_scan_reductions, "dce"], strict=True)
    assert stacked(after) == []


def test_explain_names_the_blocking_consumer():
    """explain: a scan whose outputs did not fuse names the consumer, why, and the user's line."""
    def fn(W, h0, xs):
        ys = rnn(W, h0, xs)
        return jnp.sum((ys[1:] - ys[:-1]) ** 2)   # two different steps at once
    r = jaxform.explain(fn, W, H0, XS, memory=False)
    (u,) = r.unfused
    assert u["consumer"] == "sub" and "different steps" in u["why"]
    assert "test_scan_reductions.py" in u["where"] and "fn" in u["where"]
    assert "blocks it" in str(r) and "test_scan_reductions.py" in str(r)
    assert jaxform.explain(seed_loss, W, H0, XS, T, memory=False).unfused == []


# issue 26, finding 1: a compensated sum computed (total - acc) - y = inf - inf once a term was infinite, so a
# log-likelihood with one zero-probability step (log 0 = -inf) became NaN instead of -inf.
@pytest.mark.parametrize("case", ["neg_inf_term", "pos_inf_term", "overflow", "nan_term", "inf_then_neg_inf"])
@pytest.mark.parametrize("defer", [False, True])
def test_compensated_sum_keeps_inf_and_nan(case, defer):
    n = 200   # > COMPENSATE_AFTER: the sum is compensated
    xs = np.linspace(0.1, 0.9, n).astype(np.float32)
    if case == "neg_inf_term":
        xs[37] = 0.0                        # log 0 = -inf
    elif case == "pos_inf_term":
        xs[37] = np.inf
    elif case == "overflow":
        xs[:] = 1e38                        # the running sum overflows to inf
    elif case == "nan_term":
        xs[37] = np.nan
    else:
        xs[37], xs[90] = np.inf, 0.0        # inf then -inf: NaN in the plain sum too
    term = (lambda x: x) if case == "overflow" else jnp.log
    f = lambda xs: jnp.sum(lax.scan(lambda c, x: (c, term(x)), 0.0, xs)[1])  # noqa: E731
    closed = jax.make_jaxpr(f)(xs)
    after = run_passes(closed, [lambda g: fuse_scan_reductions(g, defer=defer)], strict=True)
    assert stacked(after) == []
    want = f(xs)
    for got in (_jax_eval(after, xs), jax.jit(lambda a: _jax_eval(after, a))(xs)):
        assert np.isnan(got) == np.isnan(want) and np.isinf(got) == np.isinf(want), (got, want)
        if not np.isfinite(want):
            assert np.isnan(want) or got == want, (got, want)
