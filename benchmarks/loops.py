"""Faster loops (issue 19): original vs optimized vs hand-written, forward and grad, in one run.

Cases: the seed's 3-D sin/cos (seed 001), an RNN with an input projection,
the README's RNN + MSE, an RNN + output projection + MSE, and
`benchmarks/licm.py`'s `grad scan(checkpoint(body))`. For each: min-of-N wall
time of `jax.jit` of the original, of `optimize(f)` (for grad: both
`grad(optimize(f))` and `optimize(grad(f))`) and of a hand-written program,
interleaved; the ratios orig/opt (> 1: faster) and hand/opt (1: as fast as
by hand); XLA temp memory of original and optimized. The pipeline is
`passes.DEFAULT` with `sum_then_pull_back` after `hoist_loop_invariants` and `fission` after
`fuse_scan_reductions` (where DEFAULT does not list them yet).
Also the seed itself returning (carry, ys), and an RNN returning its states
and a projection of them (post-loop fission; on CPU the projection stays in
the loop unless --batch-matmuls forces the batched rule).
Run: .venv/bin/python benchmarks/loops.py [--quick] [--reps N] [--only NAME] [--without PASS ...] [--batch-matmuls]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform import passes
from jaxform.inspect.program import min_time

QUICK = "--quick" in sys.argv
REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else (3 if QUICK else 9)
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
L, B, H, D = (100, 64, 64, 16) if QUICK else (400, 128, 128, 32)
T = 100 if QUICK else 1000
PIPE = list(passes.DEFAULT)
if "fission" not in PIPE:
    PIPE.insert(PIPE.index("fuse_scan_reductions") + 1 if "fuse_scan_reductions" in PIPE else len(PIPE) - 1, "fission")
if "sum_then_pull_back" not in PIPE:
    PIPE.insert(PIPE.index("hoist_loop_invariants") + 1, "sum_then_pull_back")
if "--batch-matmuls" in sys.argv:   # force the GPU rule (matmuls batched before/after the loop) on CPU
    import importlib
    importlib.import_module("jaxform.passes.fission").BATCH_MATMULS = True
for drop in [sys.argv[i + 1] for i, a in enumerate(sys.argv) if a == "--without"]:
    PIPE.remove(drop)
R = np.random.RandomState(0)


def arr(*s, k=1.0):
    return jnp.asarray(R.randn(*s).astype(np.float32) * k)


# ---- the seed's sin/cos: carry-free cos(xs) --------------------------------------------
def sincos(x1, x2, y):
    return jnp.square(y - lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)[1]).mean()


def sincos_hand(x1, x2, y):
    c = lax.scan(lambda c, _: (jnp.sin(c), None), x1, None, length=x2.shape[0])[0]
    return jnp.square(y - jnp.cos(x2)).mean() + 0 * jnp.sum(c)


def seed_ys(x1, x2):                     # the seed itself: final carry and stacked cos
    return lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), x1, x2)


def seed_ys_hand(x1, x2):
    return lax.scan(lambda c, _: (jnp.sin(c), None), x1, None, length=x2.shape[0])[0], jnp.cos(x2)


def seed_ys_loss(x1, x2):
    c, ys = seed_ys(x1, x2)
    return jnp.sum(c) + jnp.sum(ys * ys)


def seed_ys_loss_hand(x1, x2):
    c, ys = seed_ys_hand(x1, x2)
    return jnp.sum(c) + jnp.sum(ys * ys)


# ---- RNN with an input projection -------------------------------------------------------
def rnn_last(W, U, h0, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U), None), h0, xs)[0]


def rnn_last_hand(W, U, h0, xs):
    return lax.scan(lambda h, xu: (jnp.tanh(h @ W + xu), None), h0, xs @ U)[0]


def rnn_loss(W, U, h0, xs):
    return jnp.sum(rnn_last(W, U, h0, xs) ** 2)


def rnn_loss_hand(W, U, h0, xs):
    return jnp.sum(rnn_last_hand(W, U, h0, xs) ** 2)


# ---- README: RNN + MSE ------------------------------------------------------------------
def mse(W, U, h0, xs, t):
    return jnp.mean((lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1] - t) ** 2)


def mse_hand(W, U, h0, xs, t):
    def step(c, xt):
        h, acc = c
        xu, tt = xt
        h = jnp.tanh(h @ W + xu)
        return (h, acc + jnp.sum((h - tt) ** 2)), None
    (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs @ U, t))
    return acc / t.size


# ---- RNN + output projection + MSE ------------------------------------------------------
def proj(W, U, V, h0, xs, t):
    ys = lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x @ U)), h2 @ V), h0, xs)[1]
    return jnp.mean((ys - t) ** 2)


def proj_hand(W, U, V, h0, xs, t):
    hs = lax.scan(lambda h, xu: ((h2 := jnp.tanh(h @ W + xu)), h2), h0, xs @ U)[1]
    return jnp.mean((hs @ V - t) ** 2)


# ---- RNN returning states and their projection (post-loop fission: hs are stacked anyway) ---------
def states(W, V, h0, xs):
    return lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), (h2, h2 @ V)), h0, xs)[1]


def states_hand(W, V, h0, xs):
    hs = lax.scan(lambda h, x: ((h2 := jnp.tanh(h @ W + x)), h2), h0, xs)[1]
    return hs, hs @ V


def states_loss(W, V, h0, xs):
    hs, ps = states(W, V, h0, xs)
    return jnp.sum(hs) + jnp.sum(ps ** 2)


def states_loss_hand(W, V, h0, xs):
    hs, ps = states_hand(W, V, h0, xs)
    return jnp.sum(hs) + jnp.sum(ps ** 2)


# ---- licm.py: grad of a checkpointed scan recomputing W @ W.T ---------------------------
def ck_loss(W, x):
    body = jax.checkpoint(lambda c, _: (jnp.tanh((W @ W.T) @ c), None))
    return jnp.sum(lax.scan(body, x, None, length=T)[0] ** 2)


def ck_loss_hand(W, x):
    G = W @ W.T
    body = jax.checkpoint(lambda c, G: (jnp.tanh(G @ c), None))
    return jnp.sum(lax.scan(lambda c, _: body(c, G), x, None, length=T)[0] ** 2)


def cases():
    x1, x2, y = arr(10, 5, 8), arr(L, B, H), arr(L, B, H)
    W, U, V = arr(H, H, k=1 / np.sqrt(H)), arr(D, H, k=1 / np.sqrt(D)), arr(H, H, k=1 / np.sqrt(H))
    h0, xs, t, xh = arr(B, H), arr(L, B, D), arr(L, B, H), arr(L, B, H)
    Wc, xc = arr(128, 128, k=1 / np.sqrt(128)), arr(128)
    g = lambda f, n: jax.grad(f, argnums=tuple(range(n)))  # noqa: E731
    return [
        ("sin/cos forward", sincos, sincos_hand, (x1, x2, y), False),
        ("sin/cos grad", sincos, sincos_hand, (x1, x2, y), 2),
        ("seed (c, ys) forward", seed_ys, seed_ys_hand, (x1, x2), False),
        ("seed (c, ys) grad", seed_ys_loss, seed_ys_loss_hand, (x1, x2), 2),
        ("RNN input proj forward", rnn_last, rnn_last_hand, (W, U, h0, xs), False),
        ("RNN input proj grad", rnn_loss, rnn_loss_hand, (W, U, h0, xs), 2),
        ("RNN + MSE forward", mse, mse_hand, (W, U, h0, xs, t), False),
        ("RNN + MSE grad", mse, mse_hand, (W, U, h0, xs, t), 2),
        ("RNN + out proj forward", proj, proj_hand, (W, U, V, h0, xs, t), False),
        ("RNN + out proj grad", proj, proj_hand, (W, U, V, h0, xs, t), 3),
        ("RNN states + proj forward", states, states_hand, (W, V, h0, xh), False),
        ("RNN states + proj grad", states_loss, states_loss_hand, (W, V, h0, xh), 2),
        ("grad scan(checkpoint(body))", ck_loss, ck_loss_hand, (Wc, xc), 1),
    ], g


def temp(f, args) -> int:
    return f.lower(*args).compile().memory_analysis().temp_size_in_bytes


def main():
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, L={L}, B={B}, H={H}, D={D}, T={T}, "
          f"min of {REPS}, passes={PIPE}")
    print(f"{'case':30s} {'orig ms':>8s} {'opt ms':>8s} {'hand ms':>8s} {'orig/opt':>8s} {'hand/opt':>8s} "
          f"{'temp MiB orig/opt':>18s}")
    table, g = cases()
    for name, f, hand, args, grad in table:
        if ONLY and ONLY not in name:
            continue
        if grad:
            variants = [("grad(optimize(f))", g(jaxform.optimize(f, passes=PIPE, strict=True), grad)),
                        ("optimize(grad(f))", jaxform.optimize(g(f, grad), passes=PIPE, strict=True))]
            f, hand = g(f, grad), g(hand, grad)
        else:
            variants = [("optimize(f)", jaxform.optimize(f, passes=PIPE, strict=True))]
        jf, jh = jax.jit(f), jax.jit(hand)
        jo = [jax.jit(v) for _, v in variants]
        ref = jf(*args)
        for j in jo:
            for a, b in zip(jax.tree_util.tree_leaves(ref), jax.tree_util.tree_leaves(j(*args))):
                # relative to the output's scale: a GPU's default float32 matmul rounds to TF32 (1e-3 of
                # the operands' magnitude), differently for a batched matmul than for one per loop step
                np.testing.assert_allclose(a, b, rtol=2e-3, atol=2e-3 * max(1.0, float(np.max(np.abs(a)))))
        times = min_time([jf, *jo, jh], args, REPS)
        to, th = times[0], times[-1]
        for (vname, _), tu, j in zip(variants, times[1:-1], jo):
            print(f"{(name + ' ' + vname if grad else name):48s} {to * 1e3:8.2f} {tu * 1e3:8.2f} {th * 1e3:8.2f} "
                  f"{to / tu:8.2f} {th / tu:8.2f} {temp(jf, args) / 2**20:8.1f}/{temp(j, args) / 2**20:<8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
