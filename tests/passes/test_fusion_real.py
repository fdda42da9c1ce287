"""fuse_scan_reductions on real scan programs adapted from public repositories (issue 17).

Each program cites the repository and path it is adapted from; shapes are
small for CPU. The default pipeline must fuse (no stacked `[length, ...]`
value of the loss's scan left) on at least 8 of them, and values and gradients
must match the original under jit, grad and vmap (rtol 1e-5, float32).
`benchmarks/scan_reductions.py --corpus` prints the memory/time table of
docs/scan_reductions.md from the same programs.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.ir import Graph
from jaxform.optimize import run_passes
from jaxform.passes import DEFAULT
from jaxform.testing import assert_same

T, B, F, H, V = 7, 3, 4, 6, 5
KEY = jax.random.PRNGKey(0)


def _rand(i, *shape, scale=1.0):
    return jax.random.normal(jax.random.fold_in(KEY, i), shape, jnp.float32) * scale


def _labels(i, *shape, n=V):
    return jax.random.randint(jax.random.fold_in(KEY, i), shape, 0, n)


# ---- 1. Flax nn.RNN (batch-major), Dense, log-softmax cross-entropy -----------------------
# google/flax flax/linen/recurrent.py (nn.RNN over a GRUCell, time_major=False) and
# google/flax examples/seq2seq/train.py (cross_entropy_loss: -mean(sum(log_softmax(logits) * labels)))
def flax_rnn_ce():
    import flax.linen as nn

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(V)(nn.RNN(nn.GRUCell(features=H))(x))   # [batch, time, vocab]
    x, labels = _rand(1, B, T, F), jax.nn.one_hot(_labels(2, B, T), V)
    params = Model().init(KEY, x)

    def loss(params, x):
        return -jnp.mean(jnp.sum(nn.log_softmax(Model().apply(params, x)) * labels, axis=-1))
    return loss, (params, x)


# ---- 2. Flax nn.scan(OptimizedLSTMCell), decoder, optax integer-label cross-entropy --------
# ChanBong/s4-jax s4/lstm.py (LSTMRecurrentModel: nn.scan over nn.OptimizedLSTMCell, time-major)
def flax_scan_lstm_ce():
    import flax.linen as nn
    import optax

    class Model(nn.Module):
        @nn.compact
        def __call__(self, xs):
            lstm = nn.scan(nn.OptimizedLSTMCell, in_axes=0, out_axes=0, variable_broadcast="params",
                           split_rngs={"params": False})(features=H)
            c0 = nn.OptimizedLSTMCell(features=H, parent=None).initialize_carry(KEY, xs.shape[1:])
            return nn.Dense(V)(lstm(c0, xs)[1])
    xs, labels = _rand(3, T, B, F), _labels(4, T, B)
    params = Model().init(KEY, xs)

    def loss(params, xs):
        return optax.softmax_cross_entropy_with_integer_labels(Model().apply(params, xs), labels).mean()
    return loss, (params, xs)


# ---- 3. Flax scan with in_axes=1/out_axes=1, mean over time, sigmoid BCE ---------------------
# google-research/runtime-error-prediction core/modules/rnn/lstm.py (SimpleLSTM: nn.transforms.scan,
# in_axes=1, out_axes=1, batch-major outputs)
def flax_batch_major_pool():
    import flax.linen as nn
    import optax

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            lstm = nn.scan(nn.OptimizedLSTMCell, in_axes=1, out_axes=1, variable_broadcast="params",
                           split_rngs={"params": False})(features=H)
            c0 = nn.OptimizedLSTMCell(features=H, parent=None).initialize_carry(KEY, (x.shape[0], x.shape[2]))
            hs = lstm(c0, x)[1]                   # [batch, time, hidden]
            return nn.Dense(1)(hs.mean(axis=1))[:, 0]
    x, y = _rand(5, B, T, F), (jnp.arange(B) % 2).astype(jnp.float32)
    params = Model().init(KEY, x)

    def loss(params, x):
        return optax.sigmoid_binary_cross_entropy(Model().apply(params, x), y).mean()
    return loss, (params, x)


# ---- 4. Equinox GRU, vmap of a per-example loss with per-example targets ---------------------
# patrick-kidger/equinox examples/train_rnn.py (RNN: eqx.nn.GRUCell in lax.scan, Linear, sigmoid,
# loss = -mean(y log p + (1 - y) log(1 - p)) over jax.vmap(model)(x)); adapted to score every step
def equinox_gru_vmap():
    import equinox as eqx

    class RNN(eqx.Module):
        cell: eqx.Module
        linear: eqx.nn.Linear

        def __init__(self, key):
            ck, lk = jax.random.split(key)
            self.cell, self.linear = eqx.nn.GRUCell(F, H, key=ck), eqx.nn.Linear(H, 1, key=lk)

        def __call__(self, xs):
            hs = lax.scan(lambda h, x: (self.cell(x, h),) * 2, jnp.zeros(H), xs)[1]   # [time, hidden]
            return jax.nn.sigmoid(jax.vmap(self.linear)(hs))[:, 0]
    model = RNN(KEY)
    params, static = eqx.partition(model, eqx.is_array)
    x, y = _rand(6, B, T, F), (_labels(7, B, T, n=2)).astype(jnp.float32)

    def loss(params, x):
        pred = jax.vmap(eqx.combine(params, static))(x)
        return -jnp.mean(y * jnp.log(pred) + (1 - y) * jnp.log(1 - pred))
    return loss, (params, x)


# ---- 5. Seq2seq decoder: scan, output projection, cross-entropy (teacher forcing) ------------
# google/flax examples/seq2seq/train.py (Decoder: scan_in_dim over an LSTMCell along axis 1, then
# nn.Dense to the vocabulary; cross_entropy_loss), written with lax.scan and plain weights
def seq2seq_decoder():
    def lstm(p, carry, x):
        c, h = carry
        z = x @ p["wi"] + h @ p["wh"] + p["b"]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (c, h), h
    p = {"wi": _rand(8, V, 4 * H, scale=0.3), "wh": _rand(9, H, 4 * H, scale=0.3), "b": jnp.zeros(4 * H),
         "wo": _rand(10, H, V, scale=0.3), "bo": jnp.zeros(V)}
    dec_in = jax.nn.one_hot(_labels(11, B, T + 1), V)
    carry = (jnp.zeros((B, H)), _rand(12, B, H))

    def loss(p, dec_in):
        _, hs = lax.scan(lambda c, x: lstm(p, c, x), carry, jnp.swapaxes(dec_in[:, :-1], 0, 1))
        logits = jnp.swapaxes(hs, 0, 1) @ p["wo"] + p["bo"]        # [batch, time, vocab]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * dec_in[:, 1:], axis=-1))
    return loss, (p, dec_in)


# ---- 6. HMM filter: expected log-likelihood under the filtered posteriors --------------------
# probml/dynamax ssm_jax/hmm/messages.py (hmm_filter: lax.scan, renormalized p_tt as ys)
def hmm_filter():
    K = 4
    obs = _rand(13, T, 2)
    means = _rand(14, K, 2)

    def loss(logits_A, means):
        A = jax.nn.softmax(logits_A, axis=-1)
        lls = -0.5 * jnp.sum((obs[:, None, :] - means[None]) ** 2, -1)      # [time, states]

        def step(carry, ll):
            log_norm, p = carry
            ll_max = ll.max()
            p_tt = p * jnp.exp(ll - ll_max)
            norm = p_tt.sum()
            p_tt /= norm
            return (log_norm + jnp.log(norm) + ll_max, A.T @ p_tt), p_tt
        (ll, _), filtered = lax.scan(step, (0.0, jnp.ones(K) / K), lls)
        return -ll - jnp.sum(filtered * lls) / T
    return loss, (_rand(15, K, K), means)


# ---- 7. HMM two-filter smoother: product of a forward and a backward scan's ys ---------------
# probml/dynamax ssm_jax/hmm/messages.py (hmm_two_filter_smoother: filtered * reverse-filtered,
# renormalized per step)
def hmm_two_filter():
    K = 3
    lls = _rand(16, T, K)

    def loss(logits_A, lls):
        A = jax.nn.softmax(logits_A, axis=-1)

        def fwd(p, ll):
            p = p * jnp.exp(ll - ll.max())
            p = p / p.sum()
            return A.T @ p, p

        def bwd(beta, ll):
            b = A @ (beta * jnp.exp(ll - ll.max()))
            b = b / b.sum()
            return b, b
        _, filtered = lax.scan(fwd, jnp.ones(K) / K, lls)
        _, back = lax.scan(bwd, jnp.ones(K), lls, reverse=True)
        post = filtered * back
        post = post / post.sum(axis=1, keepdims=True)
        return jnp.sum(post * lls)
    return loss, (_rand(17, K, K), lls)


# ---- 8. S4 recurrent view: scan_SSM outputs, MSE -----------------------------------------------
# srush/annotated-s4 s4/s4.py (scan_SSM: x_k = Ab x_{k-1} + Bb u_k, y_k = Cb x_k, stacked ys)
def s4_scan_ssm():
    N = 8
    u, target = _rand(18, T * 3, 1), _rand(19, T * 3, 1)

    def loss(Ab, Bb, Cb):
        def step(x_k_1, u_k):
            x_k = Ab @ x_k_1 + Bb @ u_k
            return x_k, (Cb @ x_k).real
        return jnp.mean((lax.scan(step, jnp.zeros(N), u)[1] - target) ** 2)
    return loss, (jnp.eye(N) * 0.9 + _rand(20, N, N, scale=0.05), _rand(21, N, 1), _rand(22, 1, N))


# ---- 9. Kalman filter: energy (negative log marginal likelihood) and fit of filtered means ----
# AaltoML/kalman-jax kalmanjax/archive/kf_no_jit.py (kalman_filter: predict/update per step,
# store=True returns filtered means and the per-step energy terms)
def kalman_filter():
    y = jnp.sin(jnp.arange(T * 2) * 0.4)[:, None] + 0.1 * _rand(23, T * 2, 1)
    Hm = jnp.array([[1.0, 0.0]])

    def loss(log_q, log_r, a):
        Fm = jnp.array([[1.0, 1.0], [0.0, 1.0]]) * a
        Q, R = jnp.exp(log_q) * jnp.eye(2), jnp.exp(log_r) * jnp.eye(1)

        def step(carry, yt):
            m, P = carry
            m, P = Fm @ m, Fm @ P @ Fm.T + Q
            S = Hm @ P @ Hm.T + R
            K = P @ Hm.T @ jnp.linalg.inv(S)
            v = yt - Hm @ m
            nll = 0.5 * (jnp.log(2 * jnp.pi * S[0, 0]) + v[0] ** 2 / S[0, 0])
            m, P = m + K @ v, P - K @ S @ K.T
            return (m, P), (m, nll)
        _, (ms, nlls) = lax.scan(step, (jnp.zeros(2), jnp.eye(2)), y)
        return jnp.sum(nlls) + jnp.mean((ms @ Hm.T - y) ** 2)
    return loss, (jnp.float32(-2.0), jnp.float32(-1.0), jnp.float32(0.95))


# ---- 10. Recurrent state-space trajectory loss under vmap over initial conditions -----------
# srush/annotated-s4 s4/s4.py (run_SSM/scan_SSM), used as in s4/train.py: a batch of sequences
# through jax.vmap, per-example targets, mean squared error
def s4_vmap_targets():
    N = 4
    u = _rand(24, B, T * 2, 1)
    target = _rand(25, B, T * 2)

    def loss(Ab, Cb):
        def one(u_i, t_i):
            ys = lax.scan(lambda x, uk: (Ab @ x + uk, (Cb @ (Ab @ x + uk))[0]), jnp.zeros(N), u_i)[1]
            return jnp.mean((ys - t_i) ** 2)
        return jnp.mean(jax.vmap(one)(u, target))
    return loss, (jnp.eye(N) * 0.8 + _rand(26, N, N, scale=0.05), _rand(27, 1, N))


PROGRAMS = {f.__name__: f for f in (flax_rnn_ce, flax_scan_lstm_ce, flax_batch_major_pool, equinox_gru_vmap,
                                     seq2seq_decoder, hmm_filter, hmm_two_filter, s4_scan_ssm, kalman_filter,
                                     s4_vmap_targets)}
EXPECTED_UNFUSED: set[str] = set()   # programs where the pipeline is expected not to fuse (documented)
# With jax_scan3 on (`make test-scan3`): what JAX itself cannot trace, or runs differently, on JAX 0.12
SCAN3_LIMITS = {"equinox_gru_vmap": "JAX cannot vmap a Scan3 (no batch rule)",
                "s4_vmap_targets": "JAX cannot vmap a Scan3 (no batch rule)",
                "hmm_two_filter": "a reverse Scan3, which JAX runs forward: jaxform keeps it as it is"}


def scan3_limited() -> dict[str, str]:
    return SCAN3_LIMITS if _jax.loop_flags().get("jax_scan3") else {}


def stacked_outputs(closed, length_of=None) -> list:
    """Shapes of the ys of every scan (at any depth)."""
    return [tuple(o.aval.shape) for n, _ in Graph.from_jaxpr(closed).walk()
            for o in (n.outputs[n.params["num_carry"]:] if n.name == "scan" else
                      n.outputs if _jax.scan3_loop(n.params) else ())]   # jax_scan3: every output is a ys


@functools.cache
def fuses(name) -> tuple[bool, list, list]:
    loss, args = PROGRAMS[name]()
    before = jax.make_jaxpr(loss)(*args)
    after = run_passes(before, DEFAULT, strict=True)
    return stacked_outputs(after) != stacked_outputs(before) and len(stacked_outputs(after)) < len(
        stacked_outputs(before)) or sum(map(np.prod, stacked_outputs(after))) < sum(
        map(np.prod, stacked_outputs(before))), stacked_outputs(before), stacked_outputs(after)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_real_program_fuses(name):
    """The default pipeline fuses; the jitted value matches (gradients and vmap: the slow test below)."""
    if name in scan3_limited():
        pytest.skip(f"jax_scan3: {SCAN3_LIMITS[name]}")
    loss, args = PROGRAMS[name]()
    did, before, after = fuses(name)
    assert did != (name in EXPECTED_UNFUSED), (before, after)
    opt = jaxform.optimize(loss)
    np.testing.assert_allclose(jax.jit(opt)(*args), jax.jit(loss)(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_real_program_same(name):
    """Values (eager, jit), gradients of all float args, and vmap over a batch of inputs."""
    loss, args = PROGRAMS[name]()
    assert_same(loss, jaxform.optimize(loss), *args)


def test_fuses_on_at_least_8():
    limited = scan3_limited()
    assert sum(fuses(n)[0] for n in PROGRAMS if n not in limited) >= 8 - len(limited)
