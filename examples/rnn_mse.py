"""One RNN for inference and training: jaxform fuses the MSE loss into the scan (seed 001).

The model returns its stacked hidden states; the loss reduces them. Without
jaxform, training either materializes all `length x batch x hidden` states
or needs a second, hand-fused model. `jaxform.optimize(loss)` rewrites the
loss so that the scan carries the running sum instead.
Run: .venv/bin/python examples/rnn_mse.py
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.ir.printing import diff
from jaxform.optimize import run_passes


def rnn(params, h0, xs):
    """The model: one tanh RNN layer; returns every hidden state, [length, batch, hidden]."""
    W, U = params
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1]


def mse_loss(params, h0, xs, targets):
    """The training loss, written on top of the inference model."""
    return jnp.mean((rnn(params, h0, xs) - targets) ** 2)


def make_inputs(length: int = 1000, batch: int = 256, hidden: int = 128, features: int = 32, seed: int = 0):
    r = np.random.RandomState(seed)
    f = lambda *s, k=1.0: jnp.asarray(r.randn(*s).astype(np.float32) * k)  # noqa: E731
    params = (f(hidden, hidden, k=hidden ** -0.5), f(features, hidden, k=features ** -0.5))
    return params, f(batch, hidden), f(length, batch, features), f(length, batch, hidden)


def _time(f, args, reps: int = 5) -> float:
    jax.block_until_ready(f(*args))
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def demo_rnn_mse(length: int = 1000, batch: int = 256, hidden: int = 128, *, reps: int = 5,
                 verbose: bool = True) -> dict:
    """Optimize the RNN + MSE loss; report rewrites fired, memory and speed before/after, and correctness.

    Returns a dict: rewrites (names of passes that changed the program), diff
    (printed before/after of the program), temp_bytes and time_s as
    (before, after) pairs for forward and grad, loss (before, after) and
    max_rel_err of the gradients.
    """
    args = make_inputs(length, batch, hidden)
    leaves = jax.tree_util.tree_leaves(args)
    closed = jax.make_jaxpr(lambda *l: mse_loss(*jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(args), l)))(*leaves)
    fired = []
    after = run_passes(closed, jaxform.passes.DEFAULT,
                       on_change=lambda name, a, b: fired.append(name) if str(a) != str(b) else None)
    opt = jaxform.optimize(mse_loss)
    grad, grad_opt = jax.jit(jax.grad(mse_loss)), jax.jit(jax.grad(opt))
    fwd, fwd_opt = jax.jit(mse_loss), jax.jit(opt)
    mem = lambda f: jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    g0, g1 = grad(*args), grad_opt(*args)
    err = max(float(jnp.max(jnp.abs(a - b) / (jnp.abs(a) + 1e-6))) for a, b in zip(jax.tree_util.tree_leaves(g0),
                                                                                     jax.tree_util.tree_leaves(g1)))
    out = {
        "rewrites": fired,
        "diff": diff(str(Graph.from_jaxpr(closed)), str(Graph.from_jaxpr(after))),
        "temp_bytes": {"forward": (mem(mse_loss), mem(opt)), "grad": (mem(jax.grad(mse_loss)), mem(jax.grad(opt)))},
        "time_s": {"forward": (_time(fwd, args, reps), _time(fwd_opt, args, reps)),
                   "grad": (_time(grad, args, reps), _time(grad_opt, args, reps))},
        "loss": (float(fwd(*args)), float(fwd_opt(*args))),
        "max_rel_err": err,
    }
    if verbose:
        print(f"RNN + MSE, length {length}, batch {batch}, hidden {hidden}")
        print("rewrites fired:", ", ".join(fired) or "none")
        print(out["diff"])
        for mode in ("forward", "grad"):
            (m0, m1), (t0, t1) = out["temp_bytes"][mode], out["time_s"][mode]
            print(f"{mode:8s} temp memory {m0 / 2**20:8.2f} -> {m1 / 2**20:8.2f} MiB   "
                  f"time {t0 * 1e3:8.2f} -> {t1 * 1e3:8.2f} ms ({t0 / t1:.2f}x)")
        print(f"loss {out['loss'][0]:.6f} vs {out['loss'][1]:.6f}; gradients max rel. error {err:.1e}")
    return out


if __name__ == "__main__":
    demo_rnn_mse()
