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


def fused(fn, *args, p=fuse_scan_reductions, check=True, **kw):
    """Run the pass (through assert_pass_ok if check); return (before, after) jaxprs."""
    before = jax.make_jaxpr(fn)(*args)
    return before, assert_pass_ok(p, fn, *args, **kw) if check else run_passes(before, [p], strict=True)


def inline_then_fuse(g):
    return fuse_scan_reductions(inline(g))


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


def test_seed_rnn_body_shape():
    """The seed's MSE: one new f32[] carry, no ys, mean's division stays outside."""
    fn, args = FULL["seed_rnn_mse"]
    _, after = fused(fn, *args, check=False)   # values checked in test_fuses_completely
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
    "elementwise_escapes": (lambda W, h0, xs: (lambda e: (e.sum(), e[0]))(jnp.exp(rnn(W, h0, xs))), (W, H0, XS)),
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
