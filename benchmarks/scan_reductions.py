"""fuse_scan_reductions: original vs optimize()d vs hand-fused, forward and grad, in one run.

(a) the seed's RNN + MSE loss (length 1000, batch 256, hidden 128),
(b) the seed's 3-D sin/cos example (carry [10, 5, 8], ys [length, 256, 128]),
(c) an RNN language model: output projection to the vocabulary + log-softmax
    cross-entropy (issue 17's target: >= 100x less forward temp memory, within 5%
    of the hand-fused time).
`--defer`: eager vs deferred accumulators (issue 19) on (a) and (c).
`--slices`: sum(ys[L//2:]**2) and a ys[-1] loss: original / optimized (step predicate) / hand-written.
`--dce`: cost of an extra dce before fusion in the default pipeline.
`--corpus`: the per-program table of tests/passes/test_fusion_real.py.
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
from jaxform.inspect.program import min_time

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


# ---- (c) RNN language model: projection + log-softmax cross-entropy -----------------------
LM_L, LM_B, VOCAB = (100, 32, 256) if QUICK else (200, 64, 1024)


def lm(W, U, Vp, h0, xs, labels):
    logits = rnn(W, U, h0, xs) @ Vp                                   # [length, batch, vocab]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], -1))


def lm_hand(W, U, Vp, h0, xs, labels):
    def step(c, xl):
        h, acc = c
        x, lab = xl
        h = jnp.tanh(h @ W + x @ U)
        logp = jax.nn.log_softmax(h @ Vp)
        return (h, acc + jnp.sum(jnp.take_along_axis(logp, lab[..., None], -1))), None
    (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs, labels))
    return -acc / labels.size


def lm_args(length):
    r = np.random.RandomState(2)
    W, U, h0, xs, _ = rnn_args(length)
    h0, xs = h0[:LM_B], xs[:, :LM_B]
    Vp = jnp.asarray(r.randn(H, VOCAB).astype(np.float32) / np.sqrt(H))
    labels = jnp.asarray(r.randint(0, VOCAB, (length, LM_B)).astype(np.int32))
    return [W, U, Vp, h0, xs, labels]


# ---- measuring -------------------------------------------------------------------------
def temp(f, args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def hlo(f, args) -> str:
    """Lowered StableHLO without module name and source locations (to compare programs)."""
    text = jax.jit(f).lower(*args).as_text()
    return re.sub(r"module @\S+|loc\(.*?\)|#loc\d*( = .*)?", "", text)


def runtimes(fs: dict, args) -> dict:
    """Min-of-REPS wall time of each jitted f; the versions take turns so that load drift hits all alike."""
    return dict(zip(fs, min_time([jax.jit(f) for f in fs.values()], args, REPS)))


def compare(title, orig, hand, args, argnums, extra=None):
    opt = jaxform.optimize(orig)
    versions = {"original": orig, "optimized": opt, "hand-fused": hand}
    versions.update(extra or {})
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
        o, p, h = (tim[k] for k in ("original", "optimized", "hand-fused"))
        mo, mp, mh = (mem[k] for k in ("original", "optimized", "hand-fused"))
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


def with_defer(f, defer: bool):
    """optimize(f) with fuse_scan_reductions' accumulators forced eager or deferred."""
    from jaxform.passes import DEFAULT, fuse_scan_reductions

    def fuse(g):
        return fuse_scan_reductions(g, defer=defer)
    fuse.pass_name, fuse.exact = "fuse_scan_reductions", False
    return jaxform.optimize(f, passes=[fuse if p == "fuse_scan_reductions" else p for p in DEFAULT])


def defer_table():
    print(f"\ndeferred vs eager accumulators (issue 19), forward, min of {REPS}")
    for title, f, args in ((f"(a) RNN + MSE L={L} B={B} H={H}", mse, rnn_args(L)),
                           (f"(c) RNN LM L={LM_L} B={LM_B} V={VOCAB}", lm, lm_args(LM_L))):
        fs = {"original": f, "eager": with_defer(f, False), "deferred": with_defer(f, True)}
        tim = runtimes(fs, args)
        mem = {k: temp(g, args) for k, g in fs.items()}
        print(f"  {title}: " + "  ".join(f"{k} {tim[k] * 1e3:.2f} ms / {mem[k] / MiB:.2f} MiB" for k in fs)
              + f"   eager/deferred time {tim['eager'] / tim['deferred']:.3f}")


def slices_table():
    """Slices of ys along the scan axis, then reduced (issue 17): original (the slice outside the scan),
    optimized (fuse_scan_reductions: a step predicate / a picked carry) and hand-written (the predicate in
    plain JAX). Forward temp memory, and interleaved min-of-REPS time, forward and grad."""
    k = L // 2
    args = rnn_args(L)

    def tail(W, U, h0, xs, t):          # sum(ys[L//2:] ** 2)
        return jnp.sum(rnn(W, U, h0, xs)[k:] ** 2)

    def tail_hand(W, U, h0, xs, t):
        def step(c, xi):
            h, acc = c
            x, i = xi
            h = jnp.tanh(h @ W + x @ U)
            return (h, jnp.where(i >= k, acc + jnp.sum(h ** 2), acc)), None
        (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs, jnp.arange(L)))
        return acc

    def last(W, U, h0, xs, t):          # a loss on ys[-1]
        return jnp.mean((rnn(W, U, h0, xs)[-1] - t[0]) ** 2)

    def last_hand(W, U, h0, xs, t):
        def step(c, xi):
            h, y = c
            x, i = xi
            h = jnp.tanh(h @ W + x @ U)
            return (h, jnp.where(i == L - 1, h, y)), None
        (_, y), _ = lax.scan(step, (h0, jnp.zeros_like(h0)), (xs, jnp.arange(L)))
        return jnp.mean((y - t[0]) ** 2)

    print(f"\nslices of ys along the scan axis, length {L}, batch {B}, hidden {H}; min of {REPS}, interleaved")
    for title, orig, hand in ((f"sum(ys[{k}:] ** 2)", tail, tail_hand), ("mean((ys[-1] - t) ** 2)", last, last_hand)):
        opt = jaxform.optimize(orig)
        for mode in ("forward", "grad"):
            fs = {"original": orig, "optimized": opt, "hand-written": hand}
            if mode == "grad":
                fs = {n: jax.grad(f, (0, 1)) for n, f in fs.items()}
            vals = {n: jax.jit(f)(*args) for n, f in fs.items()}
            err = max(float(jnp.max(jnp.abs(a - b) / (jnp.abs(b) + 1e-6))) for n in fs for a, b in zip(
                jax.tree_util.tree_leaves(vals[n]), jax.tree_util.tree_leaves(vals["original"])))
            mem = {n: temp(f, args) for n, f in fs.items()}
            tim = runtimes(fs, args)
            print(f"  {title:26s} {mode:8s} " + "  ".join(f"{n} {mem[n] / MiB:7.2f} MiB {tim[n] * 1e3:8.2f} ms"
                                                          for n in fs) + f"   (max rel. diff {err:.1e})")


def dce_cost():
    """Time of the default pipeline with and without an extra dce before fusion, on the corpus programs."""
    sys.path.insert(0, "tests/passes")
    from test_fusion_real import PROGRAMS
    from jaxform.optimize import run_passes
    from jaxform.passes import DEFAULT
    i = DEFAULT.index("fuse_scan_reductions")
    pipes = {"default": list(DEFAULT), "dce before too": DEFAULT[:i] + ["dce"] + DEFAULT[i:]}
    tot = dict.fromkeys(pipes, 0.0)
    for name, make in PROGRAMS.items():
        f, args = make()
        closed = jax.make_jaxpr(f)(*args)
        for k, pipe in pipes.items():
            best = min(_timed(lambda: run_passes(closed, pipe)) for _ in range(3))
            tot[k] += best
    print("\npipeline time over the corpus (10 programs): " + "  ".join(f"{k} {v * 1e3:.0f} ms" for k, v in tot.items()))


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def corpus_table():
    sys.path.insert(0, "tests/passes")
    from test_fusion_real import PROGRAMS, fuses
    print("\n| program | fused | fwd temp before -> after | grad temp before -> after | fwd time | grad time |")
    print("|---|---|---|---|---|---|")
    for name, make in PROGRAMS.items():
        f, args = make()
        opt = jaxform.optimize(f)
        g0, g1 = jax.grad(f), jax.grad(opt)
        m = [temp(h, args) for h in (f, opt, g0, g1)]
        t = runtimes({"f": f, "o": opt, "g0": g0, "g1": g1}, args)
        kib = lambda b: f"{b / 1024:.1f}"  # noqa: E731
        print(f"| {name} | {'yes' if fuses(name)[0] else 'no'} | {kib(m[0])} -> {kib(m[1])} KiB | "
              f"{kib(m[2])} -> {kib(m[3])} KiB | {t['f'] * 1e6:.0f} -> {t['o'] * 1e6:.0f} us | "
              f"{t['g0'] * 1e6:.0f} -> {t['g1'] * 1e6:.0f} us |")


if __name__ == "__main__":
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; min of {REPS} runs")
    t0 = time.perf_counter()
    modes = {a for a in sys.argv[1:] if a != "--quick"}
    if not modes or "--main" in modes:
        compare(f"(a) RNN + MSE, length {L}, batch {B}, hidden {H}", mse, mse_hand, rnn_args(L), (0, 1))
        compare(f"(b) 3-D sin/cos, length {L}, ys [{B}, {H}]", sincos, sincos_hand, sincos_args(), (0, 1))
    if not modes or "--lm" in modes:
        compare(f"(c) RNN LM, length {LM_L}, batch {LM_B}, hidden {H}, vocab {VOCAB}", lm, lm_hand, lm_args(LM_L),
                (0, 1, 2))
    if "--defer" in modes:
        defer_table()
    if "--slices" in modes:
        slices_table()
    if "--dce" in modes:
        dce_cost()
    if "--corpus" in modes:
        corpus_table()
    if not modes:
        scaling()
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
