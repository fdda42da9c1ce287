"""remat_loops: what loops remember under grad. Original vs optimize(memory=...) vs hand-placed checkpoints.

(a) the README's RNN + MSE (L=1000, B=256, H=128): gradient temp memory and time,
(b) RNN + output projection (O = 4H) + MSE,
(c) gradient temp memory at lengths 1,000 / 10,000 / 100,000 under memory="min" (compile only),
(d) the seed's figure of merit: the largest batch whose gradient fits a 1 GiB temp budget.
--sweep: the measurements behind memory="auto"'s FLOPs-per-saved-byte threshold (RNN + MSE at
compute-bound and memory-bound sizes; remat time vs original at each intensity).
Rows `memory=...` are `grad(optimize(f, memory=...))`; `optimize(grad)` is the default pipeline on the
gradient program, where `thin_residuals` can drop JAX's own residual stacks.
Memory is XLA's `memory_analysis().temp_size_in_bytes` of the jitted gradient; time is
min-of-N wall time, the versions taking turns. "hand" is plain JAX with `jax.checkpoint`
placed by hand on the hand-fused scan body (what a user would write to get the same).
Run: .venv/bin/python benchmarks/training_memory.py [--quick]
"""
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.inspect.program import min_time

QUICK = "--quick" in sys.argv
REPS = 3 if QUICK else 7
MiB = 2 ** 20
NOTHING = jax.checkpoint_policies.nothing_saveable


def rnn_mse(W, U, h0, xs, t):
    ys = lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1]
    return jnp.mean((ys - t) ** 2)


def rnn_mse_hand(W, U, h0, xs, t):
    @jax.checkpoint
    def step(c, xt):
        h, acc = c
        x, tt = xt
        h = jnp.tanh(h @ W + x @ U)
        return (h, acc + jnp.sum((h - tt) ** 2)), None
    (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs, t))
    return acc / t.size


def proj_mse(W, U, V, h0, xs, t):
    ys = lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1]
    return jnp.mean((ys @ V - t) ** 2)


def proj_mse_hand(W, U, V, h0, xs, t):
    @jax.checkpoint
    def step(c, xt):
        h, acc = c
        x, tt = xt
        h = jnp.tanh(h @ W + x @ U)
        return (h, acc + jnp.sum((h @ V - tt) ** 2)), None
    (_, acc), _ = lax.scan(step, (h0, jnp.float32(0)), (xs, t))
    return acc / t.size


def args_for(shapes, abstract=False, seed=0):
    if abstract:
        return [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    r = np.random.RandomState(seed)
    return [jnp.asarray(r.randn(*s).astype(np.float32) / (np.sqrt(s[0]) if len(s) == 2 else 1)) for s in shapes]


def temp(f, args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def runtimes(fs: dict, args) -> dict:
    """Min-of-REPS wall time of each jitted f; the versions take turns so that load drift hits all alike."""
    return dict(zip(fs, min_time([jax.jit(f) for f in fs.values()], args, REPS)))


def compare(title, orig, hand, args, argnums):
    versions = {"original": orig, "memory=None": jaxform.optimize(orig, memory=None),
                'memory="auto"': jaxform.optimize(orig, memory="auto"),
                'memory="min"': jaxform.optimize(orig, memory="min"), "hand": hand}
    fs = {k: jax.grad(f, argnums) for k, f in versions.items()}
    fs["optimize(grad)"] = jaxform.optimize(jax.grad(orig, argnums))   # thin_residuals sees JAX's residual stacks
    ref = jax.jit(fs["original"])(*args)
    err = {k: max(float(jnp.max(jnp.abs(a - b)) / (jnp.max(jnp.abs(b)) + 1e-12))
                  for a, b in zip(jax.jit(f)(*args), ref)) for k, f in fs.items()}
    mem = {k: temp(f, args) for k, f in fs.items()}
    tim = runtimes(fs, args)
    print(f"\n{title}: gradient")
    print(f"  {'':16s} {'temp MiB':>10s} {'vs orig':>8s} {'time ms':>9s} {'time/orig':>9s} {'rel.err':>8s}")
    for k in fs:
        print(f"  {k:16s} {mem[k] / MiB:10.2f} {mem['original'] / max(mem[k], 1):7.1f}x {tim[k] * 1e3:9.1f} "
              f"{tim[k] / tim['original']:9.3f} {err[k]:8.1e}")


def scaling(B=256, H=128, D=32):
    print(f'\n(c) gradient temp memory (MiB) vs length under memory="min" (RNN + MSE, B={B}, H={H}; compile only)')
    print(f"  {'length':>8s} {'original':>10s} {'min':>8s} {'ratio':>7s}")
    g = lambda f: jax.grad(f, (0, 1))  # noqa: E731
    mins = []
    for L in ((1000, 4000, 16000) if QUICK else (1000, 10000, 100000)):
        a = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)], abstract=True)
        o, m = temp(g(rnn_mse), a), temp(g(jaxform.optimize(rnn_mse, memory="min")), a)
        mins.append(m)
        print(f"  {L:8d} {o / MiB:10.1f} {m / MiB:8.1f} {o / m:6.0f}x")
    print(f"  min grows {mins[-1] / mins[0]:.1f}x over a {100 if not QUICK else 16}x longer loop "
          f"(√ would be {10 if not QUICK else 4}x)")
    L, B = (4000, 16) if QUICK else (10000, 32)
    a = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)])
    t = runtimes({"original": g(rnn_mse), "min": g(jaxform.optimize(rnn_mse, memory="min"))}, a)
    print(f"  time at length {L} (batch {B}): original {t['original'] * 1e3:.0f} ms, min {t['min'] * 1e3:.0f} ms "
          f"({t['min'] / t['original']:.2f}x the original's time)")


def budgets(B=256, H=128, D=32):
    print(f"\n(e) a byte budget below what √L needs: binomial (revolve) checkpointing (RNN + MSE, B={B}, H={H})")
    g = lambda f: jax.grad(f, (0, 1))  # noqa: E731
    L = 20000 if QUICK else 100000
    a = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)], abstract=True)
    print(f"  length {L}: memory='min' {temp(g(jaxform.optimize(rnn_mse, memory='min')), a) / MiB:.1f} MiB; " + "; ".join(
        f"budget {m} MiB -> {temp(g(jaxform.optimize(rnn_mse, memory=m * MiB)), a) / MiB:.1f} MiB" for m in (16, 32)))
    L, B = 2000, 32
    a = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)])
    fs = {"original": g(rnn_mse), "min": g(jaxform.optimize(rnn_mse, memory="min")),
          "budget 1 MiB": g(jaxform.optimize(rnn_mse, memory=MiB))}
    m, t = {k: temp(f, a) for k, f in fs.items()}, runtimes(fs, a)
    print(f"  length {L}, batch {B}: " + "; ".join(f"{k} {m[k] / MiB:.1f} MiB {t[k] * 1e3:.0f} ms "
                                                    f"({t[k] / t['original']:.2f}x)" for k in fs))


def largest_batch(f, budget, L=1000, H=128, D=32, hi=1 << 16):
    """Largest batch (power-of-two search, then bisection) whose gradient's temp memory fits `budget`."""
    def fits(B):
        a = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)], abstract=True)
        return temp(jax.grad(f, (0, 1)), a) <= budget
    lo, b = 0, 1
    while b <= hi and fits(b):
        lo, b = b, b * 2
    hi_ = min(b, hi + 1)
    while hi_ - lo > max(1, lo // 16):
        mid = (lo + hi_) // 2
        lo, hi_ = (mid, hi_) if fits(mid) else (lo, mid)
    return lo


def batch_figure(budget=2 ** 30):
    print(f"\n(d) largest batch whose gradient fits {budget / MiB:.0f} MiB of temp memory (RNN + MSE, L=1000, H=128)")
    res = {k: largest_batch(f, budget) for k, f in [
        ("original", rnn_mse), ("memory=None", jaxform.optimize(rnn_mse, memory=None)),
        ('memory="auto"', jaxform.optimize(rnn_mse, memory="auto")),
        ('memory="min"', jaxform.optimize(rnn_mse, memory="min"))]}
    for k, b in res.items():
        print(f"  {k:16s} batch {b:6d}   {b / max(res['original'], 1):6.1f}x the original")


def sweep():
    from jaxform.passes.remat_loops import plan
    from jaxform.plan.memory import MAX_FLOPS_PER_SAVED_BYTE
    print(f"\n(sweep) carry-only remat vs keep, RNN + MSE gradient; 'auto' remats at <= {MAX_FLOPS_PER_SAVED_BYTE} "
          "FLOP per saved byte")
    print(f"  {'L, B, H':>16s} {'FLOP/B':>7s} {'keep ms':>8s} {'remat ms':>9s} {'remat/keep':>10s} {'auto':>6s}")
    for L, B, H, D in [(200, 8, 1024, 32), (300, 32, 512, 32), (1000, 16, 128, 16), (1000, 256, 128, 32)]:
        args = args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)])
        (*_, p), = plan(jaxform.trace(jaxform.optimize(rnn_mse, memory=None), *args))
        ratio = p.flops / (p.residual_bytes - p.carry_bytes)
        fs = {"keep": jax.grad(jaxform.optimize(rnn_mse, memory=None), (0, 1)), "remat": jax.grad(rnn_mse_hand, (0, 1))}
        t = runtimes(fs, args)
        print(f"  {f'{L}, {B}, {H}':>16s} {ratio:7.0f} {t['keep'] * 1e3:8.1f} {t['remat'] * 1e3:9.1f} "
              f"{t['remat'] / t['keep']:10.2f} {'remat' if ratio <= MAX_FLOPS_PER_SAVED_BYTE else 'keep':>6s}")


if __name__ == "__main__":
    if "--sweep" in sys.argv:
        sweep()
        sys.exit()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}; min of {REPS} runs")
    t0 = time.perf_counter()
    L, B, H, D = (200, 64, 64, 16) if QUICK else (1000, 256, 128, 32)
    compare(f"(a) RNN + MSE, L={L}, B={B}, H={H}", rnn_mse, rnn_mse_hand,
            args_for([(H, H), (D, H), (B, H), (L, B, D), (L, B, H)]), (0, 1))
    L, B, H, D, O = (200, 32, 64, 16, 256) if QUICK else (500, 64, 128, 32, 512)
    compare(f"(b) RNN + output projection + MSE, L={L}, B={B}, H={H}, O={O}", proj_mse, proj_mse_hand,
            args_for([(H, H), (D, H), (H, O), (B, H), (L, B, D), (L, B, O)]), (0, 1, 2))
    scaling()
    budgets()
    batch_figure()
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
