"""stream_rows (issue 29): in-place loops over a buffer, original vs optimize vs hand-written lax.scan, in one run.

    orig   the program as written (a for_loop over a ref, or lax.fori_loop + .at[]): the loop carries the
           whole [N, ...] buffer and, under grad, builds a zero-padded [N, ...] cotangent every step
    opt    jax.jit(optimize(f)) (forward) and jax.grad(optimize(f)) / optimize(jax.grad(f)) (gradient)
    hand   the same computation written as a lax.scan over rows, then optimize()d like the user's

Times: interleaved min of --reps rounds (ms). Memory: XLA temp bytes (`memory_analysis()`).
Ratios: orig/opt (above 1: optimize is faster / smaller) and hand/opt.
Run: .venv/bin/python benchmarks/stream_rows.py [--reps 15] [--n 20000]
"""
import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.inspect.program import min_time


def prefix_sums(x):                               # the seed's cumsum (seed 000), then a loss
    def body(i, r):
        r[i + 1] += r[i]
    return jnp.sum(jaxform.for_loop(x.shape[0] - 1, body, x) ** 2)


def prefix_sums_hand(x):
    c, ys = lax.scan(lambda c, xi: (c + xi, c), x[0], x[1:])
    return jnp.sum(jnp.concatenate([ys, c[None]]) ** 2)


def fori_cumsum(x):                               # the same in plain JAX's idiom
    return jnp.sum(lax.fori_loop(1, x.shape[0], lambda i, r: r.at[i].add(r[i - 1]), x) ** 2)


def rows_rnn(w, xs):                              # an output matrix filled row by row
    def body(i, refs):
        h, out = refs
        h[...] = jnp.tanh(h[...] @ w + xs[i])
        out[i] = h[...]
    _, out = jaxform.for_loop(xs.shape[0], body, (jnp.zeros(xs.shape[1:]), jnp.zeros_like(xs)))
    return jnp.mean(out ** 2)


def rows_rnn_hand(w, xs):
    _, hs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(xs.shape[1:]), xs)
    return jnp.mean(hs ** 2)


def timed(fns, args, reps):
    return min_time([jax.jit(f) for f in fns], args, reps)


def temp(f, args):
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--n", type=int, default=20000)
    a = ap.parse_args()
    rs = np.random.RandomState(0)
    x = jnp.asarray(rs.randn(a.n).astype(np.float32) / a.n)
    w = jnp.asarray(rs.randn(64, 64).astype(np.float32) / 8)
    xs = jnp.asarray(rs.randn(a.n // 20, 16, 64).astype(np.float32))
    opt = jaxform.optimize
    cases = [
        ("seed cumsum fwd", prefix_sums, opt(prefix_sums), opt(prefix_sums_hand), (x,)),
        ("seed cumsum grad(optimize(f))", jax.grad(prefix_sums), jax.grad(opt(prefix_sums)),
         jax.grad(opt(prefix_sums_hand)), (x,)),
        ("seed cumsum optimize(grad(f))", jax.grad(prefix_sums), opt(jax.grad(prefix_sums)),
         opt(jax.grad(prefix_sums_hand)), (x,)),
        ("fori_loop .at[].add fwd", fori_cumsum, opt(fori_cumsum), opt(prefix_sums_hand), (x,)),
        ("fori_loop .at[].add grad", jax.grad(fori_cumsum), jax.grad(opt(fori_cumsum)),
         jax.grad(opt(prefix_sums_hand)), (x,)),
        ("rows RNN fwd", rows_rnn, opt(rows_rnn), opt(rows_rnn_hand), (w, xs)),
        ("rows RNN grad(optimize(f))", jax.grad(rows_rnn), jax.grad(opt(rows_rnn)), jax.grad(opt(rows_rnn_hand)),
         (w, xs)),
    ]
    print(f"jax {jax.__version__}, {jax.default_backend()}, N={a.n} (rows RNN: L={a.n // 20}, B=16, H=64), "
          f"interleaved min of {a.reps}")
    print(f"{'case':32s} {'orig ms':>9s} {'opt ms':>8s} {'hand ms':>8s} {'orig/opt':>8s} {'hand/opt':>8s}"
          f"  {'temp orig/opt/hand (KiB)':>26s}")
    for name, orig, ours, hand, args in cases:
        want = orig(*args)
        for f in (ours, hand):
            np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(want), rtol=2e-3, atol=1e-6)
        t = timed([orig, ours, hand], args, a.reps)
        m = [temp(f, args) / 1024 for f in (orig, ours, hand)]
        print(f"{name:32s} {t[0] * 1e3:9.3f} {t[1] * 1e3:8.3f} {t[2] * 1e3:8.3f} {t[0] / t[1]:8.2f} "
              f"{t[2] / t[1]:8.2f}  {m[0]:8.1f}/{m[1]:.1f}/{m[2]:.1f}", flush=True)


if __name__ == "__main__":
    main()
