"""fission: differential tests (values, gradients, jit, vmap) and that carry-free work really leaves the body."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.passes import fission
fission_mod = importlib.import_module("jaxform.passes.fission")   # the module (the package attribute is the pass)
from jaxform.testing import assert_pass_ok

@pytest.fixture(autouse=True)
def batch_matmuls(monkeypatch):
    """Differential tests batch matmuls too (the CPU default keeps them in the loop, see test_cpu_default)."""
    monkeypatch.setattr(fission_mod, "BATCH_MATMULS", True)


R = np.random.RandomState(0)
L_, B_, D_, H_ = 6, 3, 6, 5   # inputs a little wider than the state, as usual


def a(*s, k=0.5):
    return jnp.asarray(R.randn(*s).astype(np.float32) * k)


W, U, V = a(H_, H_), a(D_, H_), a(H_, 2)
H0, XS, T = a(B_, H_), a(L_, B_, D_), a(L_, B_, H_)
X1, X2 = a(2, 3), a(L_, 2, 3)


# ---- programs fission changes -----------------------------------------------------------
def seed_sincos(x1, x2):                     # seed 001: cos(xs) is carry-free
    return lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)


def seed_sincos_mse(x1, x2):
    return jnp.square(1.0 - lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)[1]).mean()


def rnn_inproj(W, U, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U), None), h, xs)[0]


def rnn_inproj_ys(W, U, h, xs):
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x @ U)), h2), h, xs)


def rnn_reverse(W, U, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + jnp.sin(x) @ U), h * 2), h, xs, reverse=True)


def rnn_bias_chain(W, U, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + jnp.exp(x @ U) * 0.1 - 1.0), None), h, xs)[0]


def two_xs(W, U, h, xs, t):
    return lax.scan(lambda h, xt: (jnp.tanh(h @ W + xt[0] @ U + jnp.sin(xt[1])), h.sum()), h, (xs, t))


def embedding(E, h, ids):                    # gather rows of an embedding table per step; hs stacked anyway
    return lax.scan(lambda h, i: ((h2 := jnp.tanh(h + E[i])), h2), h, ids)


def gru_like(W, U, h, xs):                   # z and 1 - z both stacked: fits as xs are wider than h
    def step(h, x):
        z = jax.nn.sigmoid(x @ U)            # gate from the input only
        return z * h + (1 - z) * jnp.tanh(h @ W), None
    return lax.scan(step, h, xs)[0]


def carry_free_ys_only(W, U, h, xs):
    return lax.scan(lambda h, x: (h @ W, jnp.tanh(x @ U)), h, xs)


def carry_free_reduce(h, xs):
    return lax.scan(lambda h, x: (h + jnp.sum(jnp.cos(x), axis=-1, keepdims=True), None), h, xs)[0]


def nested_scans(W, U, h, xs):
    def outer(h, x):
        inner = lax.scan(lambda c, y: (c * 0.9 + jnp.cos(y), None), h, jnp.stack([x @ U] * 3))[0]
        return jnp.tanh(inner @ W), None
    return lax.scan(outer, h, xs)[0]


def checkpointed_step(W, U, h, xs):          # carry-free work inside a checkpoint call: remat bodies stay whole
    return lax.scan(jax.checkpoint(lambda h, x: (jnp.tanh(h @ W + x @ U), None)), h, xs)[0]


def with_const_work(W, U, h, xs):            # U * 2 is constant work the batched part needs, also used by h
    def step(h, x):
        U2 = U * 2.0
        return jnp.tanh(h @ W + x @ U2 + U2.sum()), None
    return lax.scan(step, h, xs)[0]


def int_xs_index(W, U, h, xs):               # rows of a constant by an int xs: [L] ids -> [L, B, H], too big
    return lax.scan(lambda h, i: (jnp.tanh(h @ W + xs[i] @ U), None), h, jnp.arange(L_))[0]


def fori_like(W, U, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + jnp.log1p(x ** 2) @ U), None), h, xs, unroll=2)[0]


def pytree_carry(W, U, h, xs):
    def step(c, x):
        h, n = c
        return (jnp.tanh(h @ W + x @ U), n + jnp.sum(x ** 2)), None
    return lax.scan(step, (h, jnp.float32(0)), xs)[0]


def f64_like_weak(W, U, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + 2.0 * (x @ U)), None), h, xs)[0]


def mse_after(W, U, h, xs, t):
    hs = lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x @ U)), h2), h, xs)[1]
    return jnp.mean((hs - t) ** 2)


CHANGED = [
    (seed_sincos, (X1, X2)), (seed_sincos_mse, (X1, X2)), (rnn_inproj, (W, U, H0, XS)),
    (rnn_inproj_ys, (W, U, H0, XS)), (rnn_reverse, (W, U, H0, XS)), (rnn_bias_chain, (W, U, H0, XS)),
    (two_xs, (W, U, H0, XS, T)), (embedding, (a(7, H_), H0, jnp.array([1, 3, 0, 6, 2, 2]))),
    (gru_like, (W, a(12, H_), H0, a(L_, B_, 12))), (carry_free_ys_only, (W, U, H0, XS)), (carry_free_reduce, (H0, XS)),
    (nested_scans, (W, U, H0, XS)), (with_const_work, (W, U, H0, XS)),
    (fori_like, (W, U, H0, XS)), (pytree_carry, (W, U, H0, XS)),
    (f64_like_weak, (W, U, H0, XS)), (mse_after, (W, U, H0, XS, T)),
]


# ---- programs fission must leave alone --------------------------------------------------
def all_carry(W, h, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x), None), h, xs)[0]


def layout_only(W, h, xs):                   # only a reshape of xs: nothing to batch
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x.reshape(h.shape)), None), h, xs)[0]


def cond_in_body(W, U, h, xs):               # the predicate moves; the cond stays (batched it runs both branches)
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + lax.cond(x.sum() > 0, lambda: x @ U, lambda: -(x @ U))),
                                  None), h, xs)[0]


def callback_in_body(W, U, h, xs):           # x @ U moves (pure); the callback stays in the loop
    def step(h, x):
        p = x @ U
        jax.debug.callback(lambda v: None, p)
        return jnp.tanh(h @ W + p), None
    return lax.scan(step, h, xs)[0]


def too_big(h, xs):                          # the batched result would be 64x the loop's own buffers
    return lax.scan(lambda h, x: (h + jnp.sum(jnp.outer(jnp.cos(x), jnp.ones(64 * x.size)).mean()), None),
                    h, xs)[0]


def embedding_no_ys(E, h, ids):              # gathered rows would outgrow the loop's own buffers (ids only)
    return lax.scan(lambda h, i: (jnp.tanh(h + E[i]), None), h, ids)[0]


CHANGED += [(cond_in_body, (W, U, H0, XS)), (callback_in_body, (W, U, H0, XS))]
UNCHANGED = [
    (all_carry, (W, H0, a(L_, B_, H_))), (layout_only, (W, H0, a(L_, B_ * H_))),
    (checkpointed_step, (W, U, H0, XS)), (int_xs_index, (W, U, H0, XS)), (too_big, (H0, a(L_, 8))),
    (embedding_no_ys, (a(7, H_), H0, jnp.array([1, 3, 0, 6, 2, 2]))),
]


# ---- post-loop fission: carry-dependent work that feeds only ys, on values stacked anyway -----------
def out_proj_both(W, V, h, xs):              # hs returned and projected: hs @ V runs once after the loop
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 @ V)), h, xs)


def out_proj_reverse(W, V, h, xs):
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 @ V)), h, xs, reverse=True)


def out_elementwise(W, h, xs):               # a gate of the stacked state: elementwise, moves on CPU too
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, jax.nn.sigmoid(h2) * 2.0)), h, xs)


def out_times_xs(W, h, xs):                  # reads the stacked state and the xs row
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 * x + 1.0)), h, xs)


def out_logits_chain(W, V, b, h, xs):        # logits stacked too; bias and log-softmax after the loop
    def step(h, x):
        h2 = jnp.tanh(h @ W + x)
        return h2, (h2, (p := h2 @ V), jax.nn.log_softmax(p + b))
    return lax.scan(step, h, xs)


def out_several(W, V, h, xs):                # two ys from one projection
    def step(h, x):
        h2 = jnp.tanh(h @ W + x)
        p = h2 @ V
        return h2, (h2, p, jnp.exp(p))
    return lax.scan(step, h, xs)


def out_matmul_intermediate(W, V, h, xs):    # sigmoid(h2 @ V): the [L, ...] matmul result would be a new buffer
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, jax.nn.sigmoid(h2 @ V))), h, xs)


def out_pytree_carry(W, V, h, xs):           # a counter in the carry; the stacked state projected
    def step(c, x):
        h, n = c
        h2 = jnp.tanh(h @ W + x)
        return (h2, n + 1.0), (h2, h2 @ V)
    return lax.scan(step, (h, jnp.float32(0)), xs)


def out_nested(W, V, h, xs):                 # the inner scan's ys-only work moves inside the outer body
    def outer(h, x):
        hs = lax.scan(lambda c, y: ((c2 := jnp.tanh(c @ W + y)), (c2, c2 @ V)), h, jnp.stack([x] * 3))[1]
        return hs[0][-1], hs[1].sum(0)
    return lax.scan(outer, h, xs)


def out_then_loss(W, V, h, xs, t):           # projected ys and the states both used after the loop
    hs, ps = lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 @ V)), h, xs)[1]
    return jnp.mean((ps - t) ** 2) + jnp.mean(hs)


def out_and_pre(W, U, V, h, xs):             # both directions in one loop: x @ U before, h @ V after
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x @ U)), (h2, h2 @ V)), h, xs)


XH, T2 = a(L_, B_, H_), a(L_, B_, 2)
POST = [
    (out_proj_both, (W, V, H0, XH)), (out_proj_reverse, (W, V, H0, XH)), (out_elementwise, (W, H0, XH)),
    (out_times_xs, (W, H0, XH)), (out_logits_chain, (W, V, a(2), H0, XH)), (out_several, (W, V, H0, XH)),
    (out_pytree_carry, (W, V, H0, XH)), (out_nested, (W, V, H0, XH)), (out_then_loss, (W, V, H0, XH, T2)),
    (out_and_pre, (W, U, V, H0, XS)),
]
CHANGED += POST


def out_proj_not_stacked(W, V, h, xs):       # h2 is not stacked: moving h2 @ V would stack it anew
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), h2 @ V), h, xs)


def out_feeds_carry(W, V, h, xs):            # h2 @ V also feeds the carry: stays
    def step(c, x):
        h, s = c
        h2 = jnp.tanh(h @ W + x)
        p = h2 @ V
        return (h2, s + p.sum()), (h2, p)
    return lax.scan(step, (h, jnp.float32(0)), xs)


def out_callback(W, V, h, xs):               # an effect reads the projection: it stays in the loop
    def step(h, x):
        h2 = jnp.tanh(h @ W + x)
        p = h2 @ V
        jax.debug.callback(lambda v: None, p)
        return h2, (h2, p)
    return lax.scan(step, h, xs)


def out_dead_states(W, V, h, xs):            # the states are a ys nobody reads: not stacked anyway
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 @ V)), h, xs)[1][1]


UNCHANGED += [(out_proj_not_stacked, (W, V, H0, XH)), (out_feeds_carry, (W, V, H0, XH)),
              (out_callback, (W, V, H0, XH)), (out_dead_states, (W, V, H0, XH)),
              (out_matmul_intermediate, (W, V, H0, XH))]


def body_prims(closed) -> list[list[str]]:
    """Primitive names in each top-level scan body."""
    g = Graph.from_jaxpr(closed)
    return [[m.name for m in n.regions["body"].nodes] for n in g.nodes if n.name == "scan"]


def changed(fn, args) -> bool:
    closed = jax.make_jaxpr(fn)(*args)
    out = assert_pass_ok(fission, fn, *args, rtol=2e-5, atol=2e-5)
    return str(out) != str(closed)


@pytest.mark.parametrize("fn,args", CHANGED, ids=[f.__name__ for f, _ in CHANGED])
def test_fission_changes_and_agrees(fn, args):
    assert changed(fn, args)


@pytest.mark.parametrize("fn,args", UNCHANGED, ids=[f.__name__ for f, _ in UNCHANGED])
def test_fission_leaves_alone(fn, args):
    assert not changed(fn, args)


def test_input_projection_leaves_the_body():
    out = jaxform.trace(jaxform.optimize(rnn_inproj, passes=["fission", "dce"]), W, U, H0, XS).to_jaxpr()
    (body,) = body_prims(out)
    assert body.count("dot_general") == 1      # h @ W stays; x @ U runs once before the loop
    g = Graph.from_jaxpr(out)
    pre = [n for n in g.nodes if n.name == "dot_general"]
    assert len(pre) == 1 and pre[0].outputs[0].aval.shape == (L_, B_, H_)


def test_seed_sincos_ys_forwarded():
    """cos(xs) passed through to ys becomes the stacked cos itself: the scan keeps only sin."""
    out = jaxform.trace(jaxform.optimize(seed_sincos, passes=["fission", "dce"]), X1, X2).to_jaxpr()
    assert body_prims(out) == [["sin"]]


def test_effects_stay_in_the_loop():
    out = jaxform.trace(jaxform.optimize(callback_in_body, passes=["fission", "dce"]), W, U, H0, XS).to_jaxpr()
    (body,) = body_prims(out)
    assert "debug_callback" in body and "dot_general" in body and body.count("dot_general") == 1


def test_reverse_scan_rows_match():
    xs = jnp.arange(L_ * B_ * D_, dtype=jnp.float32).reshape(L_, B_, D_) / 50
    assert_pass_ok(fission, rnn_reverse, W, U, H0, xs)


def test_callback_order_kept():
    seen = []

    def f(h, xs):
        def step(h, x):
            jax.debug.callback(lambda v: seen.append(float(v)), x.sum(), ordered=True)
            return h + jnp.cos(x).sum(), None
        return lax.scan(step, h, xs)[0]
    xs = a(4, 3)
    f(1.0, xs)
    ref, seen[:] = list(seen), []
    jaxform.optimize(f, passes=["fission"], strict=True)(1.0, xs)
    assert seen == ref


def test_count_changed(capsys):
    n = sum(str(jax.make_jaxpr(f)(*a_)) != str(jaxform.trace(jaxform.optimize(f, passes=["fission"]), *a_)
                                                  .to_jaxpr()) for f, a_ in CHANGED + UNCHANGED)
    assert n == len(CHANGED)


def test_cpu_default_keeps_matmuls(monkeypatch):
    """By default on CPU an input projection stays in the loop (slower batched there); cos(xs) still moves."""
    monkeypatch.setattr(fission_mod, "BATCH_MATMULS", None)
    if jax.default_backend() != "cpu":
        pytest.skip("CPU rule")
    assert not changed(rnn_inproj, (W, U, H0, XS))
    assert changed(seed_sincos, (X1, X2))


def innermost_prims(closed) -> list[str]:
    """Primitive names in the bodies of scans that contain no scan (the loops that ran the moved work)."""
    out = []
    for n, _ in Graph.from_jaxpr(closed).walk():
        if n.name == "scan" and not any(m.name == "scan" for m, _ in n.regions["body"].walk()):
            out += [m.name for m in n.regions["body"].nodes]
    return out


@pytest.mark.parametrize("fn,args", POST, ids=[f.__name__ for f, _ in POST])
def test_post_loop_moves_out(fn, args):
    """The ys-only work has left the loop body (and is not dead work left behind)."""
    out = jaxform.trace(jaxform.optimize(fn, passes=["fission", "dce"], strict=True), *args).to_jaxpr()
    assert len(innermost_prims(out)) < len(innermost_prims(jax.make_jaxpr(fn)(*args)))


def test_post_loop_projection_after_scan():
    out = jaxform.trace(jaxform.optimize(out_proj_both, passes=["fission", "dce"]), W, V, H0, XH).to_jaxpr()
    (body,) = body_prims(out)
    assert body.count("dot_general") == 1      # h @ W stays; hs @ V runs once after the loop
    g = Graph.from_jaxpr(out)
    (scan,) = [n for n in g.nodes if n.name == "scan"]
    (post,) = [n for n in g.nodes if n.name == "dot_general"]
    assert g.nodes.index(post) > g.nodes.index(scan) and post.outputs[0].aval.shape == (L_, B_, 2)
    assert len(scan.outputs) == 2              # the final carry and the stacked states


def test_post_loop_keeps_fusion_memory_win():
    """With the default pipeline, a loss on the projected ys is fused into the loop first; fission must
    not stack the states again (no [L, ...] buffer leaves the scan)."""
    def loss(W, V, h, xs, t):
        ps = lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), h2 @ V), h, xs)[1]
        return jnp.mean((ps - t) ** 2)
    # 64 steps, not L_ = 6: at 6 steps the fused carries outweigh the stacked [6, 3, 2] outputs in the
    # gradient (+24 B), and the planner rightly keeps the program as traced.
    steps = 64
    xh, t2 = a(steps, B_, H_), a(steps, B_, 2)
    g = jaxform.trace(jaxform.optimize(loss, strict=True), W, V, H0, xh, t2)
    # (walk: under jit the plan may sit in a custom_jvp that differentiates as traced, plan/derivatives.py)
    (scan,) = [n for n, _ in g.walk() if n.name == "scan"]
    assert all(o.aval.shape[:1] != (steps,) for o in scan.outputs)
    np.testing.assert_allclose(jaxform.optimize(loss)(W, V, H0, XH, T2), loss(W, V, H0, XH, T2), rtol=1e-5)


def test_post_loop_cpu_default(monkeypatch):
    """On CPU by default a projection stays in the loop (slower batched there); elementwise ys work moves."""
    monkeypatch.setattr(fission_mod, "BATCH_MATMULS", None)
    if jax.default_backend() != "cpu":
        pytest.skip("CPU rule")
    assert not changed(out_proj_both, (W, V, H0, XH))
    assert changed(out_elementwise, (W, H0, XH))


def test_post_loop_under_grad_program():
    """optimize(grad(f)): the forward scan of the gradient stacks its residuals; ys-only work on them moves."""
    f = lambda W, V, h, xs: jnp.sum(out_proj_both(W, V, h, xs)[1][1] ** 2)  # noqa: E731
    gf = jax.grad(f, (0, 1))
    assert_pass_ok(fission, gf, W, V, H0, XH, rtol=2e-5, atol=2e-5)
