"""Issue 37's cases, decided on measurement: original, `optimize`d and hand-written versions in one run.

1. a `jax.checkpoint`ed scan body recomputing `W @ W.T` (T=300, 128x128): `jax.grad(optimize(f))` and
   `optimize(jax.grad(f))` against the hand-hoisted gradient;
2. `max(ys * 2) + sum(ys)` over a 512-step scan under `jax.jit`, at two sizes (the fused loop pays only at the
   larger one, and the planner keeps it only there).
Interleaved min-of-N time (`jaxform.inspect.program.min_time`), XLA `memory_analysis()` temp bytes.
Run: .venv/bin/python benchmarks/planner_measured.py [--reps N]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.inspect.program import min_time

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 7
T, H = 300, 128


def f(w, xs):
    @jax.checkpoint
    def body(h, x):
        return jnp.tanh(h @ (w @ w.T) + x), None
    return jnp.sum(lax.scan(body, jnp.zeros((8, H)), xs)[0] ** 2)


def hand(w, xs):
    m = w @ w.T

    @jax.checkpoint
    def body(h, x):
        return jnp.tanh(h @ m + x), None
    return jnp.sum(lax.scan(body, jnp.zeros((8, H)), xs)[0] ** 2)


def max_sum(w, xs):
    _, ys = lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(xs.shape[1:]), xs)
    return jnp.max(ys * 2) + jnp.sum(ys)


def temp(g, *args) -> int:
    return jax.jit(g).lower(*args).compile().memory_analysis().temp_size_in_bytes


def row(name, fns, args):
    t = min_time([jax.jit(g) for g in fns], args, REPS)
    m = [temp(g, *args) for g in fns]
    print(f"{name:<34}" + "  ".join(f"{x * 1e3:8.2f} ms {y / 2 ** 20:8.2f} MiB" for x, y in zip(t, m)) +
          f"   optimized {t[0] / t[1]:.2f}x faster than plain")


r = np.random.default_rng(0)
w = jnp.asarray(r.standard_normal((H, H)) * 0.05, jnp.float32)
xs = jnp.asarray(r.standard_normal((T, 8, H)), jnp.float32)
print(f"JAX {jax.__version__}, {jax.devices()[0].device_kind}; columns: plain, optimized[, hand-written]")
g1 = jax.grad(jaxform.optimize(f))
row("grad(optimize(f)) W@W.T", [jax.grad(f), g1, jax.grad(hand)], (w, xs))
g2 = jaxform.optimize(jax.grad(f))
row("optimize(grad(f)) W@W.T", [jax.grad(f), g2, jax.grad(hand)], (w, xs))
for b, h in ((16, 32), (64, 64)):
    v = jnp.asarray(r.standard_normal((h, h)) * 0.2, jnp.float32)
    ys = jnp.asarray(r.standard_normal((512, b, h)), jnp.float32)
    o = jaxform.optimize(max_sum)
    jax.jit(o)(v, ys)                           # under jit: planned for forward and gradient alike
    kept = {d.pass_name: d.kept for d in o.decisions()}.get("fuse_scan_reductions")
    row(f"max+sum B={b} H={h} (fusion {'kept' if kept else 'refused'})", [max_sum, o], (v, ys))
