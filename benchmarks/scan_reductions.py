"""fuse_scan_reductions: original vs optimize()d vs hand-fused, forward and grad, in one run.

(a) the seed's RNN + MSE loss (length 1000, batch 256, hidden 128),
(b) the seed's 3-D sin/cos example (carry [10, 5, 8], ys [length, 256, 128]).
For each: XLA temp memory (`memory_analysis().temp_size_in_bytes`) and
min-of-N wall time after warmup, of `jax.jit(f)` for the original,
`jax.jit(jaxform.optimize(f))` and a hand-written fused scan, forward and
`jax.grad`, with the ratios; for grad also `optimize(jax.grad(f))`. Then temp memory of (a) at lengths 100, 1000,
10000 (compiled only, nothing allocated).
Run: .venv/bin/python benchmarks/scan_reductions.py [--quick]
"""
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform

QUICK = "--quick" in sys.argv
L, B, H, D = (200, 64, 64, 16) if QUICK else (1000, 256, 128, 32)
REPS = 3 if QUICK else 9
MiB = 2 ** 20


# ---- (a) RNN + MSE ---------------------------------------------------------------------
def rnn(W, U, h0, xs):
    """The model: stacked hidden states, serves inference."""
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1]


def mse(W, U, h0, xs, t):
    return jnp.mean((rnn(W, U, h0, xs) - t) ** 2)


def mse_hand(W, U, h0, xs, t):
    """The second implementation users write today: the loss accumulated in the carry."""
    def step(c, xt):
        h, acc = c
        x, tt = xt
        h = jnp.tanh(h @ W + x @ U)
        return (h, acc + jnp.sum((h - tt) ** 2)), None
    (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs, t))
    return acc / t.size


def rnn_args(length, abstract=False):
    shapes = [(H, H), (D, H), (B, H), (length, B, D), (length, B, H)]
    if abstract:
        return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    r = np.random.RandomState(0)
    scale = [1 / np.sqrt(H), 1 / np.sqrt(D), 1, 1, 1]
    return [jnp.asarray(r.randn(*s).astype(np.float32) * k) for s, k in zip(shapes, scale)]


# ---- (b) the seed's 3-D sin/cos --------------------------------------------------------
def sincos(x1, x2, y):
    return jnp.square(y - lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)[1]).mean()


def sincos_hand(x1, x2, y):
    def step(c, xy):
        c, acc = c
        x, yy = xy
        return (jnp.sin(c), acc + jnp.sum(jnp.square(yy - jnp.cos(x)))), None
    (_, acc), _ = lax.scan(step, (x1, jnp.float32(0)), (x2, y))
    return acc / y.size


def sincos_args():
    r = np.random.RandomState(1)
    return [jnp.asarray(r.randn(*s).astype(np.float32)) for s in [(10, 5, 8), (L, B, H), (L, B, H)]]


# ---- measuring -------------------------------------------------------------------------
def temp(f, args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def hlo(f, args) -> str:
    """Lowered StableHLO without module name and source locations (to compare programs)."""
    text = jax.jit(f).lower(*args).as_text()
    return re.sub(r"module @\S+|loc\(.*?\)|#loc\d*( = .*)?", "", text)


def runtimes(fs: dict, args) -> dict:
    """Min-of-REPS wall time of each jitted f; the versions take turns so that load drift hits all alike."""
    jfs = {k: jax.jit(f) for k, f in fs.items()}
    for jf in jfs.values():
        jax.block_until_ready(jf(*args))
    best = dict.fromkeys(fs, np.inf)
    for _ in range(REPS):
        for k, jf in jfs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(jf(*args))
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


def compare(title, orig, hand, args, argnums):
    opt = jaxform.optimize(orig)
    versions = {"original": orig, "optimized": opt, "hand-fused": hand}
    ref = None
    for mode in ("forward", "grad"):
        fs = {k: (f if mode == "forward" else jax.grad(f, argnums)) for k, f in versions.items()}
        if mode == "grad":   # optimizing the grad program instead: the ys are residuals of the backward scan
            fs["optimize(grad)"] = jaxform.optimize(jax.grad(orig, argnums))
        vals = {k: jax.jit(f)(*args) for k, f in fs.items()}
        ref = vals["original"]
        err = max(float(jnp.max(jnp.abs(a - b) / (jnp.abs(b) + 1e-6)))
                  for k in fs if k != "original"
                  for a, b in zip(jax.tree_util.tree_leaves(vals[k]), jax.tree_util.tree_leaves(ref)))
        mem = {k: temp(f, args) for k, f in fs.items()}
        tim = runtimes(fs, args)
        same = hlo(fs["optimized"], args) == hlo(fs["hand-fused"], args)
        print(f"\n{title}, {mode}   (max rel. diff vs original: {err:.1e}; "
              f"optimized StableHLO {'==' if same else '!='} hand-fused)")
        print(f"  {'':14s} {'temp MiB':>10s} {'time ms':>9s}")
        for k in fs:
            print(f"  {k:14s} {mem[k] / MiB:10.2f} {tim[k] * 1e3:9.2f}")
        o, p, h = (tim[k] for k in versions)
        mo, mp, mh = (mem[k] for k in versions)
        print(f"  speedup original/optimized {o / p:.2f}x   hand-fused/optimized time {h / p:.3f}   "
              f"(original/hand {o / h:.2f}x)")
        print(f"  memory  original/optimized {mo / max(mp, 1):.1f}x   optimized/hand-fused "
              f"{mp / max(mh, 1):.3f}")


def scaling():
    print(f"\n(a) temp memory (MiB) vs length, batch {B}, hidden {H}")
    print(f"  {'length':>7s} {'orig fwd':>10s} {'opt fwd':>9s} {'hand fwd':>9s} {'orig grad':>10s} {'opt grad':>9s}"
          f" {'hand grad':>10s}")
    opt = jaxform.optimize(mse)
    for n in ((50, 200, 1000) if QUICK else (100, 1000, 10000)):
        a = rnn_args(n, abstract=True)
        g = lambda f: jax.grad(f, (0, 1))  # noqa: E731
        row = [temp(f, a) for f in (mse, opt, mse_hand, g(mse), g(opt), g(mse_hand))]
        print(f"  {n:7d} " + " ".join(f"{m / MiB:{w}.2f}" for m, w in zip(row, (10, 9, 9, 10, 9, 10))))


if __name__ == "__main__":
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; min of {REPS} runs")
    t0 = time.perf_counter()
    compare(f"(a) RNN + MSE, length {L}, batch {B}, hidden {H}", mse, mse_hand, rnn_args(L), (0, 1))
    compare(f"(b) 3-D sin/cos, length {L}, ys [{B}, {H}]", sincos, sincos_hand, sincos_args(), (0, 1))
    scaling()
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
