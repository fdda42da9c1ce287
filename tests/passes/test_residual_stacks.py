"""thin_residuals on differentiated scan programs: same values, fewer residual stacks.

Each program is a loss whose gradient JAX computes with a forward scan stacking
residuals and a reverse scan reading them. For every program we compare
`jax.jit(g)` with `jax.jit(optimize(g, passes=["thin_residuals", "dce"]))`
(values, dtypes, weak types; under `vmap` too; and the default pipeline), and
we assert whether the pass fired: the bytes of all scans' stacked `ys` must
fall where it should fire and stay put where it must not (the baseline is
`passes=["dce"]`, so a drop by dce alone does not count).
Programs adapted from public repositories cite repository and path.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import jaxform
from jaxform.ir import Graph, ScanLoop

L, B, F, H = 6, 3, 2, 4
KEY = jax.random.PRNGKey(7)
THIN = ["thin_residuals", "dce"]


def _r(i, *shape, dtype=jnp.float32, scale=1.0):
    return (jax.random.normal(jax.random.fold_in(KEY, i), shape, jnp.float32) * scale).astype(dtype)


@contextlib.contextmanager
def _x64():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


@dataclasses.dataclass
class Case:
    g: Callable            # the differentiated program (what the user passes to optimize)
    args: tuple
    fires: bool            # must thin_residuals drop stacked bytes?
    vmap: bool = True      # also compare under vmap over [a, 0.5 a] of every argument
    x64: bool = False
    fires_on_lean_jax: bool | None = None   # where JAX stacks less (LEAN_JAX), if that differs from `fires`

    def expect_fire(self) -> bool:
        return self.fires if not LEAN_JAX or self.fires_on_lean_jax is None else self.fires_on_lean_jax


# JAX 0.12's AD stacks one residual per tanh (`one_minus_square(h')`, not h' and 1 - h'), so in some
# programs it already leaves nothing to thin: those cases say so with `fires_on_lean_jax`.
LEAN_JAX = "one_minus_square" in str(jax.make_jaxpr(jax.grad(jnp.tanh))(1.0))


# ---- the stacks: bytes of every scan's ys, nested scans included ---------------------------

def _scans(closed) -> list[ScanLoop]:
    """Every scan in `closed`, bodies included, through jaxform's canonical view (any JAX version's params)."""
    return [ScanLoop(n) for n, _ in Graph.from_jaxpr(closed.jaxpr, closed.consts).walk() if n.name == "scan"]


def stacks(closed) -> list[tuple[tuple, str]]:
    """(shape, dtype) of every stacked output of every scan in `closed`, walking into bodies."""
    return [(tuple(o.aval.shape), str(o.aval.dtype)) for loop in _scans(closed) for o in loop.ys]


def scan_shapes(closed) -> list[tuple[bool, int, int, int]]:
    """(reverse, num_carry, number of xs, body equations) of every scan: did a pass touch the loops at all?"""
    return [(loop.reverse, loop.num_carry, len(loop.xs), len(loop.body.nodes)) for loop in _scans(closed)]


def stacked_bytes(closed) -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in stacks(closed))


def _opt(g, passes=THIN):
    return jaxform.optimize(g, passes=passes, strict=True)


# ---- comparison -----------------------------------------------------------------------------

def _tol(dtype):
    d = np.dtype(dtype)
    return {8: 1e-12, 4: 1e-6}.get(d.itemsize, 1e-2)


def _close_typed(a, b, what):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b), what
    for x, y in zip(la, lb):
        assert (x.shape, x.dtype) == (y.shape, y.dtype), f"{what}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}"
        assert x.weak_type == y.weak_type, f"{what}: weak type {x.weak_type} vs {y.weak_type}"
        t = _tol(x.dtype)
        xf, yf = np.asarray(x, np.float64), np.asarray(y, np.float64)
        scale = float(np.max(np.abs(xf))) if xf.size else 0.0
        np.testing.assert_allclose(yf, xf, rtol=t, atol=t * scale, err_msg=what)


def _batch(args):
    def two(x):
        x = jnp.asarray(x)
        return jnp.stack([x, x * 0.5 if jnp.issubdtype(x.dtype, jnp.inexact) else x])
    return tuple(jax.tree_util.tree_map(two, a) for a in args)


# ---- programs -------------------------------------------------------------------------------

def _rnn_loss(act, dtype=jnp.float32, unroll=1, reverse=False, remat=False):
    def loss(W, U, xs, h0):
        def step(h, x):
            return act(h @ W + x @ U), None
        body = jax.checkpoint(step) if remat else step
        h, _ = lax.scan(body, h0, xs, unroll=unroll, reverse=reverse)
        return jnp.sum(h.astype(jnp.float32) ** 2)
    args = (_r(1, H, H, dtype=dtype, scale=0.4), _r(2, F, H, dtype=dtype), _r(3, L, B, F, dtype=dtype),
            _r(4, B, H, dtype=dtype, scale=0.1))
    return loss, args


def rnn_tanh():
    loss, args = _rnn_loss(jnp.tanh)
    return Case(jax.grad(loss, argnums=(0, 1, 3)), args, fires=True)


def rnn_relu():
    """Must not fire: JAX stacks the carry-in and the mask `pre > 0` (pre is a matmul: not cheap), no carry-out."""
    loss, args = _rnn_loss(jax.nn.relu)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=False)


def rnn_sigmoid():
    """JAX stacks the carry-in and s' = h'(1 - h') but not the carry-out h' itself: the reverse loop carries
    h' (the carry-in row it read last) and recomputes s' from it: 2 stacks -> 1."""
    loss, args = _rnn_loss(jax.nn.sigmoid)
    case = Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)
    case.left = 1
    return case


# patrick-kidger/equinox equinox/nn/_rnn.py (GRUCell.__call__: reset/input gates, new = tanh(...),
# h' = new + inp * (hidden - new)), batched over rows instead of eqx.filter_vmap
def gru_equinox():
    def cell(p, x, h):
        wih, whh, b, bn = p
        ig = jnp.split(x @ wih.T + b, 3, axis=-1)
        hg = jnp.split(h @ whh.T, 3, axis=-1)
        reset = jax.nn.sigmoid(ig[0] + hg[0])
        inp = jax.nn.sigmoid(ig[1] + hg[1])
        new = jnp.tanh(ig[2] + reset * (hg[2] + bn))
        return new + inp * (h - new)

    def loss(p, xs):
        h, _ = lax.scan(lambda h, x: (cell(p, x, h), None), jnp.zeros((B, H)), xs)
        return jnp.mean(h ** 2)
    p = (_r(10, 3 * H, F, scale=0.5), _r(11, 3 * H, H, scale=0.5), _r(12, 3 * H, scale=0.1), _r(13, H, scale=0.1))
    return Case(jax.grad(loss), (p, _r(14, L, B, F)), fires=True)


# google/flax flax/linen/recurrent.py (GRUCell: r, z sigmoid gates, n = tanh(W_in x + b + r * (W_hn h + b_hn)),
# h' = (1 - z) * n + z * h), unrolled over time with lax.scan as nn.RNN does
def gru_flax():
    def loss(p, xs, ys):
        wi, wh, bi, bhn = p

        def step(h, x):
            xi, xz, xn = jnp.split(x @ wi + bi, 3, axis=-1)
            hr, hz, hn = jnp.split(h @ wh, 3, axis=-1)
            r, z = jax.nn.sigmoid(xi + hr), jax.nn.sigmoid(xz + hz)
            n = jnp.tanh(xn + r * (hn + bhn))
            h = (1.0 - z) * n + z * h
            return h, h
        _, hs = lax.scan(step, jnp.zeros((B, H)), xs)
        return jnp.mean((hs - ys) ** 2)
    p = (_r(20, F, 3 * H, scale=0.5), _r(21, H, 3 * H, scale=0.5), _r(22, 3 * H, scale=0.1), _r(23, H, scale=0.1))
    return Case(jax.grad(loss), (p, _r(24, L, B, F), _r(25, L, B, H)), fires=True)


# patrick-kidger/equinox equinox/nn/_rnn.py (LSTMCell.__call__: lin = W_ih x + W_hh h + b; i, f, g, o;
# c' = f * c + i * g; h' = o * tanh(c')), carry is the tuple (h, c)
def lstm_equinox():
    def loss(p, xs):
        wih, whh, b = p

        def step(hc, x):
            h, c = hc
            i, f, g, o = jnp.split(x @ wih.T + h @ whh.T + b, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), None
        (h, c), _ = lax.scan(step, (jnp.zeros((B, H)), jnp.zeros((B, H))), xs)
        return jnp.sum(h ** 2) + 0.1 * jnp.sum(c)
    p = (_r(30, 4 * H, F, scale=0.5), _r(31, 4 * H, H, scale=0.5), _r(32, 4 * H, scale=0.1))
    return Case(jax.grad(loss), (p, _r(33, L, B, F)), fires=True)


# ChanBong/s4-jax s4/lstm.py (LSTMRecurrentModel: nn.scan over nn.OptimizedLSTMCell, time-major, every
# step's h is returned) and google/flax flax/linen/recurrent.py (OptimizedLSTMCell gate order i, f, g, o),
# with a linear decoder and squared error on every step
def lstm_flax_seq():
    def loss(p, xs, ys):
        wi, wh, b, V = p

        def step(hc, x):
            c, h = hc
            i, f, g, o = jnp.split(x @ wi + h @ wh + b, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (c, h), h
        _, hs = lax.scan(step, (jnp.zeros((B, H)), jnp.zeros((B, H))), xs)
        return jnp.mean((hs @ V - ys) ** 2)
    p = (_r(40, F, 4 * H, scale=0.5), _r(41, H, 4 * H, scale=0.5), _r(42, 4 * H, scale=0.1), _r(43, H, F))
    return Case(jax.grad(loss), (p, _r(44, L, B, F), _r(45, L, B, F)), fires=True)


def elman_projection():
    """Elman RNN with an output projection and a per-step loss (ys read by the loss)."""
    def loss(W, U, V, b, xs, ts):
        def step(h, x):
            h = jnp.tanh(h @ W + x @ U + b)
            return h, h @ V
        _, ys = lax.scan(step, jnp.zeros((B, H)), xs)
        return jnp.mean((ys - ts) ** 2)
    args = (_r(50, H, H, scale=0.4), _r(51, F, H), _r(52, H, F), _r(53, H, scale=0.1), _r(54, L, B, F),
            _r(55, L, B, F))
    return Case(jax.grad(loss, argnums=(0, 1, 2, 3)), args, fires=True)


# srush/annotated-s4 s4/s4.py (scan_SSM: x_k = Ab x_{k-1} + Bb u_k, y_k = Cb x_k, ys stacked)
def s4_scan_ssm():
    def loss(Ab, Bb, Cb, u):
        def step(x, uk):
            x = Ab @ x + Bb @ uk
            return x, Cb @ x
        _, ys = lax.scan(step, jnp.zeros((H,)), u)
        return jnp.sum(jnp.sin(ys))
    args = (_r(60, H, H, scale=0.3), _r(61, H, 1), _r(62, 1, H), _r(63, L, 1))
    return Case(jax.grad(loss, argnums=(0, 1, 2)), args, fires=True)


# probml/dynamax dynamax/linear_gaussian_ssm/inference.py (lgssm_filter._step: ll += MVN log-prob of y under
# the predicted emission; _condition_on: S = R + H P H^T, K = psd_solve(S, H P)^T, then _predict), float64
# (dynamax runs in x64); the carry (ll, mean, cov) starts with the Python float 0.0, a weak-typed scalar
def dynamax_lgssm_filter():
    def loss(Fd, Q, Hm, R, emissions):
        def step(carry, y):
            ll, m, P = carry
            S = R + Hm @ P @ Hm.T
            r = y - Hm @ m
            Lc = jnp.linalg.cholesky(S)
            z = jax.scipy.linalg.solve_triangular(Lc, r, lower=True)
            ll += -0.5 * jnp.sum(z ** 2) - jnp.sum(jnp.log(jnp.diag(Lc))) - 0.5 * r.shape[0] * jnp.log(2 * jnp.pi)
            K = jax.scipy.linalg.cho_solve((Lc, True), Hm @ P).T
            m, P = m + K @ r, P - K @ S @ K.T
            P = 0.5 * (P + P.T)
            return (ll, Fd @ m, Fd @ P @ Fd.T + Q), None
        (ll, _, _), _ = lax.scan(step, (0.0, jnp.zeros(H), jnp.eye(H)), emissions)
        return -ll
    with _x64():
        A = jnp.asarray(0.9 * np.eye(H) + 0.05 * np.asarray(_r(70, H, H)), jnp.float64)
        args = (A, 0.1 * jnp.eye(H, dtype=jnp.float64), jnp.asarray(_r(71, 2, H), jnp.float64),
                0.2 * jnp.eye(2, dtype=jnp.float64), jnp.asarray(_r(72, L, 2), jnp.float64))
    # Must not fire: the residuals are Cholesky/solve results and the carry-in (ll, m, P); no carry-out is stacked
    return Case(jax.grad(loss, argnums=(0, 2)), args, fires=False, x64=True)


# pnkraemer/code-robust-state-estimation-singular-noise src/ckf/ckf.py (kalman_filter: predict m = A m,
# C = A C A^T + Q; update with K = C A^T inv(S); the filtered (m, C) is both carry and stacked output)
def ckf_kalman():
    def loss(A, Q, data):
        def step(rv, d):
            m, C = rv
            m, C = A @ m, A @ C @ A.T + Q
            S = A @ C @ A.T + Q
            K = C @ A.T @ jnp.linalg.inv(S)
            m = m - K @ (A @ m - d)
            C = C - K @ A @ C
            return (m, C), (m, C)
        _, (ms, cs) = lax.scan(step, (jnp.zeros(H), jnp.eye(H)), data)
        return jnp.sum(ms ** 2) + jnp.sum(jnp.tanh(cs))
    args = (jnp.eye(H) * 0.8 + _r(80, H, H, scale=0.05), jnp.eye(H) * 0.3, _r(81, L, H))
    # The carry-out stacks (ms, cs) stay (the loss reads them after the loop); the carry-in stacks go:
    # the reverse loop reads carry-in rows from them one step back
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)


def multi_carry():
    """Three carries: hidden state, a running sum of squares and a decaying scale."""
    def loss(W, xs):
        def step(c, x):
            h, acc, s = c
            h = jnp.tanh(s * (h @ W) + x)
            return (h, acc + h * h, s * 0.95), None
        (h, acc, s), _ = lax.scan(step, (jnp.zeros((B, H)), jnp.zeros((B, H)), jnp.ones(())), xs)
        return jnp.sum(h) + jnp.sum(acc) * s
    return Case(jax.grad(loss), (_r(90, H, H, scale=0.5), _r(91, L, B, H)), fires=True)


def rnn_reverse_scan():
    """grad of a reverse=True scan: the residual loop runs backwards, its consumer forwards."""
    loss, args = _rnn_loss(jnp.tanh, reverse=True)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)


def nested_scan():
    """An RNN over chunks whose per-chunk cell is itself an inner RNN scan."""
    def loss(W, V, xs):                                   # xs [L, 2, B, F]
        def inner(h, x):
            return jnp.tanh(h @ W + x @ V), None

        def outer(h, chunk):
            h, _ = lax.scan(inner, h, chunk)
            return jnp.tanh(h @ W.T), None
        h, _ = lax.scan(outer, jnp.zeros((B, H)), xs)
        return jnp.sum(h ** 2)
    # Lean JAX: the outer loop stacks one_minus_square of its carry-out but not its carry-in (the inner
    # loops stack theirs inside), so no rule applies
    return Case(jax.grad(loss, argnums=(0, 1)), (_r(100, H, H, scale=0.4), _r(101, F, H), _r(102, L, 2, B, F)),
                fires=True, fires_on_lean_jax=False)


def rnn_checkpoint_body():
    """jax.checkpoint'ed step: JAX stacks only the carry-in and recomputes the rest; nothing to thin."""
    loss, args = _rnn_loss(jnp.tanh, remat=True)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=False)


def rnn_float64():
    with _x64():
        loss, args = _rnn_loss(jnp.tanh, dtype=jnp.float64)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True, x64=True)


def rnn_bfloat16():
    loss, args = _rnn_loss(jnp.tanh, dtype=jnp.bfloat16)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)


def rnn_float16():
    loss, args = _rnn_loss(jnp.tanh, dtype=jnp.float16)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)


def weak_scalar_carry():
    """A weak-typed Python-float scalar in the carry (decay 1.0 -> 0.9 s) multiplies the state."""
    def loss(W, xs):
        def step(c, x):
            h, s = c
            return (jnp.tanh(s * h @ W + x), s * 0.9), None
        (h, s), _ = lax.scan(step, (jnp.zeros((B, H)), 1.0), xs)
        return jnp.sum(h ** 2) * s
    # Lean JAX stacks s, s * h and one_minus_square(h'): nothing cheap of a stacked row is left
    return Case(jax.grad(loss), (_r(110, H, H, scale=0.5), _r(111, L, B, H)), fires=True, fires_on_lean_jax=False)


def rnn_unroll2():
    loss, args = _rnn_loss(jnp.tanh, unroll=2)
    return Case(jax.grad(loss, argnums=(0, 1)), args, fires=True)


def grad_subset():
    """Gradient w.r.t. U only: no dW, so the carry-in stack is not needed by the reverse loop."""
    loss, args = _rnn_loss(jnp.tanh)
    # lean JAX stacks only one_minus_square(h') here: nothing to thin
    return Case(jax.grad(loss, argnums=1), args, fires=True, fires_on_lean_jax=False)


def value_and_grad_rnn():
    loss, args = _rnn_loss(jnp.tanh)
    return Case(jax.value_and_grad(loss, argnums=(0, 1)), args, fires=True)


# jax-ml/jax README.md ("per-example gradients": jit(vmap(grad(loss), in_axes=(None, 0, 0)))),
# here with an RNN loss per sequence
def per_example_grads():
    def loss(W, xs, t):
        def step(h, x):
            return jnp.tanh(h @ W + x), None
        h, _ = lax.scan(step, jnp.zeros(H), xs)
        return jnp.sum((h - t) ** 2)
    g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))
    return Case(g, (_r(120, H, H, scale=0.5), _r(121, B, L, H), _r(122, B, H)), fires=True)


def rnn_training_loop():
    """A minimal RNN training loop: SGD steps in a scan, each taking grad of an RNN loss (grad inside a loop)."""
    def rnn_loss(W, xs):
        h, _ = lax.scan(lambda h, x: (jnp.tanh(h @ W + x), None), jnp.zeros((B, H)), xs)
        return jnp.mean(h ** 2)

    def train(W, batches):
        def sgd(W, xs):
            l, gW = jax.value_and_grad(rnn_loss)(W, xs)
            return W - 0.1 * gW, l
        return lax.scan(sgd, W, batches)
    return Case(train, (_r(130, H, H, scale=0.5), _r(131, 3, L, B, H)), fires=True)


def debug_callback_rnn():
    """jax.debug.callback in the body: the forward scan is effectful, the callback sequence must not change."""
    seen = []

    def loss(W, xs):
        def step(h, x):
            h = jnp.tanh(h @ W + x)
            jax.debug.callback(lambda v: seen.append(np.asarray(v).item()), jnp.sum(h), ordered=True)
            return h, None
        h, _ = lax.scan(step, jnp.zeros((B, H)), xs)
        return jnp.sum(h ** 2)
    case = Case(jax.grad(loss), (_r(140, H, H, scale=0.5), _r(141, L, B, H)), fires=True, vmap=False)
    case.seen = seen
    return case


@jax.custom_jvp
def _half_grad_tanh(x):
    return jnp.tanh(x)


@_half_grad_tanh.defjvp
def _half_grad_tanh_jvp(primals, tangents):
    y = jnp.tanh(primals[0])
    return y, 0.5 * (1 - y ** 2) * tangents[0]   # the residual is cheap in y, the carry-out: it thins


def rnn_custom_jvp():
    """A custom_jvp activation whose rule is not tanh's derivative (half of it): the thinned gradient must
    keep the user's rule, not JAX's own."""
    def loss(W, xs):
        h, _ = lax.scan(lambda h, x: (_half_grad_tanh(h @ W + x), None), jnp.zeros((B, H)), xs)
        return jnp.sum(h ** 2)
    return Case(jax.grad(loss), (_r(145, H, H, scale=0.5), _r(146, L, B, H)), fires=True)


def rnn_dropout():
    """Dropout drawn per step from a threefry key (fold_in of the step): the random draws are pure
    functions of their keys; the thinned gradient must see the same masks."""
    def loss(W, key, xs):
        def step(h, tx):
            t, x = tx
            keep = jax.random.bernoulli(jax.random.fold_in(key, t), 0.8, h.shape)
            return jnp.where(keep, jnp.tanh(h @ W + x), 0.0) / 0.8, None
        h, _ = lax.scan(step, jnp.zeros((B, H)), (jnp.arange(L), xs))
        return jnp.sum(h ** 2)
    # Lean JAX stacks one_minus_square(tanh(pre)), the mask and h: the carry-out is the masked value, so the
    # tanh residual is not cheap in any stacked row
    return Case(jax.grad(loss), (_r(147, H, H, scale=0.5), jax.random.PRNGKey(3), _r(148, L, B, H)),
                fires=True, fires_on_lean_jax=False, vmap=False)


# must not fire: sin's derivative cos(pre) is stacked (not cheap), and no carry-out is stacked
def sin_cell():
    def loss(W, xs):
        h, _ = lax.scan(lambda h, x: (jnp.sin(h @ W + x), None), jnp.zeros((B, H)), xs)
        return jnp.sum(h ** 2)
    return Case(jax.grad(loss), (_r(150, H, H, scale=0.5), _r(151, L, B, H)), fires=False)


# must not fire: exp's residual is exp itself (a transcendental, stays stacked); the carry-out is not stacked
def exp_decay_cell():
    def loss(W, xs):
        def step(h, x):
            return h * jnp.exp(-jnp.abs(x @ W)) + x, None
        h, _ = lax.scan(step, jnp.ones((B, H)), xs)
        return jnp.sum(h ** 2)
    return Case(jax.grad(loss), (_r(160, H, H, scale=0.5), _r(161, L, B, H)), fires=False)


# ---- hand-built residual pairs (no grad): the pass's refusals, one at a time ---------------------
# `_fwd` stacks what grad of a tanh RNN stacks: carry-in h, carry-out h' and 1 - h'^2.

def _fwd(W, h0, xs, extra=None):
    def step(h, x):
        hn = jnp.tanh(h @ W + x)
        return hn, (h, hn, 1.0 - hn * hn) if extra is None else (h, hn, extra(hn))
    return lax.scan(step, h0, xs)


def _hb_args():
    return _r(200, H, H, scale=0.5), _r(201, B, H, scale=0.1), _r(202, L, B, H)


def _bwd_step(W):
    def step(g, row):
        h_in, h_out, d = row
        g = (g * d) @ W.T + 0.1 * h_in + h_out
        return g, None
    return step


def hb_reverse_consumer():
    """The pattern itself: a reverse loop reads all three stacks -> only the carry-in stack is left."""
    def f(W, h0, xs):
        hT, rows = _fwd(W, h0, xs)
        g, _ = lax.scan(_bwd_step(W), hT, rows, reverse=True)
        return g
    return Case(f, _hb_args(), fires=True)


def hb_same_direction():
    """The consumer runs forward like the producer, so it cannot carry h' (row t+1 of h, read later); it
    reads row t of h from h' one step back instead: 2 stacks -> 1."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)
        g, _ = lax.scan(lambda g, r: (jnp.tanh(g @ W) + r[0] * r[1], None), hT, (h_in, h_out))
        return g
    case = Case(f, _hb_args(), fires=True)
    case.left = 1
    return case


def hb_carry_out_returned():
    """The carry-out stack is also returned to the user, so it stays; the carry-in rows come from it."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)
        g, _ = lax.scan(lambda g, r: (g @ W.T + r[0] * r[1], None), hT, (h_in, h_out), reverse=True)
        return g, h_out
    case = Case(f, _hb_args(), fires=True)
    case.left = 1
    return case


def hb_carry_out_read_outside():
    """Non-loop code reads the carry-out stack after the loops: it stays, the carry-in stack goes."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)
        g, _ = lax.scan(lambda g, r: (g @ W.T + r[0] * r[1], None), hT, (h_in, h_out), reverse=True)
        return g + jnp.sum(h_out, axis=0)
    case = Case(f, _hb_args(), fires=True)
    case.left = 1
    return case


def hb_other_length():
    """Must not fire: the consumer has another length (it reads pairs of rows, [L/2, 2, ...])."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)
        pairs = lambda s: s.reshape(L // 2, 2, *s.shape[1:])
        g, _ = lax.scan(lambda g, r: (g @ W.T + jnp.sum(r[0] * r[1], 0), None), hT, (pairs(h_in), pairs(h_out)),
                        reverse=True)
        return g
    return Case(f, _hb_args(), fires=False)


def hb_stack_as_const():
    """Must not fire: a reverse loop of another length indexes the carry-out stack (a loop constant, not xs)."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)

        def step(g, t):
            return g @ W.T + h_in[2 * t] * h_out[2 * t + 1], None
        g, _ = lax.scan(step, hT, jnp.arange(L // 2), reverse=True)
        return g
    return Case(f, _hb_args(), fires=False)


def hb_ref_consumer():
    """Must not fire: the consumer writes a mutable ref (an effect targeting an input)."""
    def f(W, h0, xs):
        hT, (h_in, h_out, _) = _fwd(W, h0, xs)
        acc = jax.new_ref(jnp.zeros((B, H)))

        def step(g, r):
            g = g @ W.T + r[0] * r[1]
            acc[...] += g
            return g, None
        g, _ = lax.scan(step, hT, (h_in, h_out), reverse=True)
        return g + acc[...]
    return Case(f, _hb_args(), fires=False, vmap=False)


def hb_io_callback_consumer():
    """Must not fire: an effectful consumer (ordered io_callback) keeps every input, so it is left alone."""
    seen = []

    def f(W, h0, xs):
        hT, rows = _fwd(W, h0, xs)
        bwd = _bwd_step(W)

        def step(g, row):
            g, _ = bwd(g, row)
            io_callback(lambda v: seen.append(np.asarray(v).item()), None, jnp.sum(g), ordered=True)
            return g, None
        g, _ = lax.scan(step, hT, rows, reverse=True)
        return g
    case = Case(f, _hb_args(), fires=False, vmap=False)
    case.seen = seen
    return case


def hb_expensive_residual():
    """The carry-out shifts, but exp(h') (a transcendental) must stay stacked: 3 stacks -> 2, exp's kept."""
    def f(W, h0, xs):
        hT, rows = _fwd(W, h0, xs, extra=jnp.exp)
        g, _ = lax.scan(_bwd_step(W), hT, rows, reverse=True)
        return g
    case = Case(f, _hb_args(), fires=True)
    case.left = 2          # stacks left after the pass: carry-in and exp(h')
    return case


def hb_value_stacked_twice():
    """The carry-in is stacked twice and the consumer reads only the first copy (regression: KeyError)."""
    def f(W, h0, xs):
        def fwd(h, x):
            hn = jnp.tanh(h @ W + x)
            return hn, (h, h, 1.0 - h * h)
        hT, (a, b, r) = lax.scan(fwd, h0, xs)
        g, _ = lax.scan(lambda g, row: (g @ W.T * row[1] + row[0], None), hT, (a, r), reverse=True)
        return g, b
    case = Case(f, _hb_args(), fires=True)
    case.left = 1          # one copy of h (read for both); 1 - h^2 is recomputed from it
    return case


PROGRAMS = {f.__name__: f for f in [
    rnn_tanh, rnn_relu, rnn_sigmoid, gru_equinox, gru_flax, lstm_equinox, lstm_flax_seq, elman_projection,
    s4_scan_ssm, dynamax_lgssm_filter, ckf_kalman, multi_carry, rnn_reverse_scan, nested_scan,
    rnn_checkpoint_body, rnn_float64, rnn_bfloat16, rnn_float16, weak_scalar_carry, rnn_unroll2, grad_subset,
    value_and_grad_rnn, per_example_grads, rnn_training_loop, debug_callback_rnn, rnn_custom_jvp, rnn_dropout, sin_cell, exp_decay_cell,
    hb_reverse_consumer, hb_same_direction, hb_carry_out_returned, hb_carry_out_read_outside, hb_other_length,
    hb_stack_as_const, hb_ref_consumer, hb_io_callback_consumer, hb_expensive_residual, hb_value_stacked_twice]}


# ---- tests ----------------------------------------------------------------------------------

@functools.cache
def _case(name) -> Case:
    """Built once per session, so the jitted original and the optimized wrappers are compiled once."""
    case = PROGRAMS[name]()
    case.jit = jax.jit(case.g)
    case.thin = _opt(case.g)
    case.jit_thin = jax.jit(case.thin)
    return case


def _build(name):
    case = _case(name)
    return case, (_x64() if case.x64 else contextlib.nullcontext())


HEAVY = {"dynamax_lgssm_filter", "ckf_kalman"}   # linalg in the body: seconds per compile on CPU


# vmap and the default pipeline in the fast tier for a representative set (every carry shape, dtype,
# direction, nesting); all programs under slow
FAST = {"rnn_tanh", "lstm_equinox", "gru_flax", "s4_scan_ssm", "multi_carry", "rnn_reverse_scan",
             "rnn_float64", "weak_scalar_carry", "per_example_grads", "rnn_training_loop", "hb_reverse_consumer",
             "hb_value_stacked_twice"}


def _params(names, fast=None):
    return [n if (n not in HEAVY if fast is None else n in fast) else pytest.param(n, marks=pytest.mark.slow)
            for n in names]


def test_at_least_20_programs_and_both_outcomes():
    fire = [n for n in PROGRAMS if _case(n).fires]
    assert len(PROGRAMS) >= 20 and len(fire) >= 15 and len(PROGRAMS) - len(fire) >= 8


@pytest.mark.parametrize("name", PROGRAMS)
def test_same_values_under_jit(name):
    """jit(original) vs jit(thinned): values, dtypes, weak types, output structure."""
    case, ctx = _build(name)
    with ctx:
        _close_typed(case.jit(*case.args), case.jit_thin(*case.args), f"{name} under jit")
        assert jax.eval_shape(case.g, *case.args) == jax.eval_shape(case.thin, *case.args)


@pytest.mark.parametrize("name", ["rnn_tanh", "lstm_equinox", "rnn_float64", "weak_scalar_carry",
                                  "hb_reverse_consumer", "hb_value_stacked_twice"])
def test_same_values_eagerly(name):
    case, ctx = _build(name)
    with ctx:
        _close_typed(case.g(*case.args), case.thin(*case.args), f"{name} eagerly")


@pytest.mark.parametrize("name", _params([n for n in PROGRAMS if _case(n).vmap], FAST))
def test_same_under_vmap(name):
    case, ctx = _build(name)
    with ctx:
        args = _batch(case.args)
        v = lambda g: jax.jit(jax.vmap(g))(*args)
        _close_typed(v(case.g), v(case.thin), f"{name} under vmap")


@pytest.mark.parametrize("name", _params(PROGRAMS, FAST | {"debug_callback_rnn", "hb_io_callback_consumer"}))
def test_default_pipeline(name):
    case, ctx = _build(name)
    with ctx:
        _close_typed(case.jit(*case.args), jax.jit(jaxform.optimize(case.g))(*case.args),
                     f"{name} default pipeline")


@pytest.mark.parametrize("name", PROGRAMS)
def test_fires_exactly_where_it_should(name):
    """The stacked bytes fall where the pass should fire and stay put (same stacks) where it must not."""
    case, ctx = _build(name)
    with ctx:
        base = jax.make_jaxpr(_opt(case.g, ["dce"]))(*case.args)
        thin = jax.make_jaxpr(case.thin)(*case.args)
    if case.expect_fire():
        assert stacked_bytes(thin) < stacked_bytes(base), (stacks(base), stacks(thin))
        if hasattr(case, "left"):
            assert len(stacks(thin)) == case.left, stacks(thin)
    else:   # nothing dropped, and no loop gained a carry, an input or work for nothing
        assert sorted(stacks(thin)) == sorted(stacks(base))
        assert scan_shapes(thin) == scan_shapes(base)


def test_rnn_three_stacks_to_one():
    """The motivating case, exactly: tanh RNN under grad stacks [L, B, H] three times (lean JAX: twice),
    once after."""
    case = _case("rnn_tanh")
    before = stacks(jax.make_jaxpr(case.g)(*case.args))
    after = stacks(jax.make_jaxpr(case.thin)(*case.args))
    assert before == [((L, B, H), "float32")] * (2 if LEAN_JAX else 3) and after == [((L, B, H), "float32")]


def test_expensive_residual_stays_stacked():
    """exp(h') is not in CHEAP: after the pass its stack is still produced and read by the reverse loop."""
    case = hb_expensive_residual()
    thin = jax.make_jaxpr(_opt(case.g))(*case.args)
    fwd = next(loop for loop in _scans(thin) if not loop.reverse)
    assert any(v.producer is not None and v.producer.name == "exp" for v in fwd.body_ys)


def test_compiled_temp_memory_drops():
    """XLA's own accounting agrees: the thinned RNN gradient needs less temporary memory."""
    loss, _ = _rnn_loss(jnp.tanh)
    args = (_r(1, 64, 64, scale=0.1), _r(2, 8, 64), _r(3, 128, 16, 8), _r(4, 16, 64, scale=0.1))
    g = jax.grad(loss, argnums=(0, 1))
    mem = lambda f: jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes
    a, b = mem(g), mem(_opt(g))
    stack = 128 * 16 * 64 * 4
    assert b <= a - 0.9 * stack, (a, b)   # JAX 0.12: 98.9% of a stack (the consumer gains a [B, H] carry)


def test_impure_draw_is_never_replayed():
    """An `rng_uniform` draw (XLA's hidden RNG state: impure) stacked for a reverse loop stays one draw in
    the forward loop; the cheap residual computed from it (`2 u`) is rebuilt from u's row, never by
    drawing again."""
    def f(W, h0, xs):
        def step(h, x):
            u = lax.rng_uniform(jnp.float32(0), jnp.float32(1), h.shape)
            hn = jnp.tanh(h @ W + x) * u
            return hn, (u, 2.0 * u)
        hT, (us, twice) = lax.scan(step, h0, xs)
        g, _ = lax.scan(lambda g, r: ((g * r[1]) @ W.T + r[0], None), hT, (us, twice), reverse=True)
        return g
    args = _hb_args()
    before = jax.make_jaxpr(f)(*args)
    thin = jax.make_jaxpr(_opt(f))(*args)
    draws = lambda c: [loop.reverse for loop in _scans(c)  # noqa: E731
                       for n in loop.body.nodes if n.name == "rng_uniform"]
    assert draws(before) == draws(thin) == [False]           # one draw, in the forward loop
    assert stacked_bytes(thin) < stacked_bytes(before)       # 2 u is rebuilt from u's row


@pytest.mark.parametrize("name", ["debug_callback_rnn", "hb_io_callback_consumer"])
def test_callback_sequence_unchanged(name):
    """The callbacks run the same number of times with the same values, eagerly and under jit."""
    case = PROGRAMS[name]()     # fresh: its own list of calls
    runs = {}
    for label, fn in [("orig", case.g), ("thin", _opt(case.g))]:
        for mode, call in [("eager", fn), ("jit", jax.jit(fn))]:
            case.seen.clear()
            jax.block_until_ready(call(*case.args))
            jax.effects_barrier()
            runs[label, mode] = list(case.seen)
    assert len(runs["orig", "eager"]) == L
    for mode in ("eager", "jit"):
        np.testing.assert_allclose(runs["thin", mode], runs["orig", mode], rtol=1e-6)
        assert len(runs["thin", mode]) == len(runs["orig", mode])


# issue 26, finding 7: a length-0 scan under value_and_grad whose loss reads the states: shift_carries built a
# size-1 dynamic_slice of the [0, ...] stack, so the pass failed (skipped with a warning on every call).
@pytest.mark.parametrize("length", [0, 1, 2])
def test_empty_and_one_step_loops(length):
    def loss(w, xs):
        def cell(h, x):
            h = jnp.tanh(h * w + x)
            return h, h
        h, ys = lax.scan(cell, jnp.zeros(3), xs)
        return jnp.sum(ys ** 2) + jnp.sum(h)
    g = jax.value_and_grad(loss, argnums=(0, 1))
    args = (jnp.float32(0.5), jnp.linspace(-1.0, 1.0, 3 * length, dtype=jnp.float32).reshape(length, 3))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no pass skipped with a warning
        opt = jaxform.optimize(g, passes=["thin_residuals", "dce"], strict=True)
        for run in (opt, jax.jit(opt)):
            _close_typed(g(*args), run(*args), f"length {length}")
