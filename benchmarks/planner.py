"""The planner (issue 27): plain `jax.jit` vs the passes deciding alone vs the planned default pipeline.

For each program of issue 27's table (tests/plan/programs.py at the issue's sizes, L=1000, B=H=64), in one run:
XLA temp memory (`memory_analysis()`) forward and under `jax.grad(optimize(f))` for
  plain       `jax.jit(f)`
  unplanned   every pass of the default pipeline applied as it proposes (`passes=DEFAULT`, memory="auto"),
              i.e. each pass deciding alone, as before the planner
  planned     `optimize(f)` (the planner judges every loop proposal)
and the planned program's time against plain (interleaved min-of-N; > 1: faster).
Then the planner's own cost: planning time per 1k equations on a loop program, and the compile time of
`jax.jit(optimize(step))` vs `jax.jit(step)` on a ~6k-equation Flax transformer train step (target <= 1.1x, issue 37).
Run: .venv/bin/python benchmarks/planner.py [--quick] [--reps N] [--no-transformer]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import jax
import jax.numpy as jnp

import jaxform
from jaxform import passes
from jaxform.inspect.program import min_time
from jaxform.ir import Graph

import plan.programs as pp

QUICK = "--quick" in sys.argv
REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else (3 if QUICK else 7)
pp.L, pp.B, pp.H = (200, 16, 32) if QUICK else (1000, 64, 64)
MiB = 2.0 ** 20


def temp(f, args) -> float:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes / MiB


def scalar(fn):
    def loss(*a):
        out = jax.tree_util.tree_leaves(fn(*a))
        return out[0] + sum(jnp.sum(o) for o in out[1:])
    return loss


def table():
    print(f"L={pp.L}, B={pp.B}, H={pp.H}; XLA temp MiB (plain / unplanned / planned), planned time vs plain "
          f"(min of {REPS}, interleaved; >1 faster)")
    print(f"{'program':<12} {'forward MiB':>28} {'fwd x':>6} {'grad(optimize(f)) MiB':>30} {'grad x':>7}")
    worst = []
    for name, (fn, args) in pp.programs().items():
        loss = scalar(fn)
        unplanned = jaxform.optimize(fn, passes=list(passes.DEFAULT), memory=None)
        unplanned_auto = jaxform.optimize(loss, passes=list(passes.DEFAULT), memory="auto")
        planned, planned_loss = jaxform.optimize(fn), jaxform.optimize(loss)
        fwd = [temp(f, args) for f in (fn, unplanned, planned)]
        grad = [temp(jax.grad(f), args) for f in (loss, unplanned_auto, planned_loss)]
        t = min_time([jax.jit(fn), jax.jit(planned)], args, REPS)
        tg = min_time([jax.jit(jax.grad(loss)), jax.jit(jax.grad(planned_loss))], args, REPS)
        worst += [t[0] / t[1], tg[0] / tg[1]]
        print(f"{name:<12} {fwd[0]:>8.2f} /{fwd[1]:>8.2f} /{fwd[2]:>8.2f} {t[0] / t[1]:>6.2f} "
              f"{grad[0]:>9.2f} /{grad[1]:>9.2f} /{grad[2]:>9.2f} {tg[0] / tg[1]:>7.2f}")
    print(f"slowest planned/plain ratio: {min(worst):.2f}x (target >= 0.95; repeat a low one: the machine is shared)")


def real_programs():
    """tests/passes/test_fusion_real.py's programs (dynamax, annotated-s4, Flax, Equinox; cited there)."""
    from passes.test_fusion_real import PROGRAMS as REAL
    print(f"real programs (tests/passes/test_fusion_real.py), time plain / planned (min of {REPS}; >1 faster), "
          f"XLA temp KiB plain -> planned")
    worst = []
    for name, make in REAL.items():
        loss, args = make()
        opt = jaxform.optimize(loss)
        t = min_time([jax.jit(loss), jax.jit(opt)], args, REPS)
        tg = min_time([jax.jit(jax.grad(loss)), jax.jit(jax.grad(opt))], args, REPS)
        m = [temp(f, args) * 1024 for f in (loss, opt)]
        mg = [temp(jax.grad(f), args) * 1024 for f in (loss, opt)]
        worst += [t[0] / t[1], tg[0] / tg[1]]
        print(f"  {name:<22} fwd {t[0] / t[1]:5.2f}x {m[0]:8.1f} -> {m[1]:8.1f}   "
              f"grad {tg[0] / tg[1]:5.2f}x {mg[0]:8.1f} -> {mg[1]:8.1f}")
    print(f"slowest: {min(worst):.2f}x")


def planning_cost():
    fn, args = pp.programs()["lstm_tanh"]
    closed = jax.make_jaxpr(fn)(*args)
    n = sum(1 for _ in Graph.from_jaxpr(closed).walk())
    from jaxform.optimize import run_passes
    from jaxform.passes.remat_loops import with_memory
    pipe = passes.default_pipeline(False) + [with_memory("auto")]
    from jaxform.plan import plan
    t_run = min(_timed(lambda: run_passes(closed, pipe)) for _ in range(3))
    t_plan = min(_timed(lambda: plan(closed, pipe, memory="auto")) for _ in range(3))
    print(f"planning an LSTM loss ({n} equations): passes alone {t_run * 1e3:.0f} ms, planned {t_plan * 1e3:.0f} ms "
          f"({t_plan / n * 1e6:.0f} ms per 1k equations)")


def _timed(f) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def transformer_compile():
    """A Flax transformer LM train step (12 blocks, d=256, 8 heads, 4 x 257 tokens, AdamW) as in issue 30."""
    import flax.linen as nn
    import optax

    d, heads, layers, vocab, T = 256, 8, 12, 1024, 257
    if QUICK:
        layers = 4

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.LayerNorm()(x)
            h = nn.SelfAttention(num_heads=heads, qkv_features=d, deterministic=True)(h, mask=nn.make_causal_mask(x[..., 0]))
            x = x + h
            h = nn.Dense(4 * d)(nn.LayerNorm()(x))
            return x + nn.Dense(d)(nn.gelu(h))

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tok):
            x = nn.Embed(vocab, d)(tok)
            for _ in range(layers):
                x = Block()(x)
            return nn.Dense(vocab)(nn.LayerNorm()(x))

    model, opt = LM(), optax.adamw(1e-3)
    tok = jnp.zeros((4, T), jnp.int32)
    params = model.init(jax.random.key(0), tok[:, :-1])
    state = opt.init(params)

    def step(params, state, tok):
        def loss(p):
            logits = model.apply(p, tok[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean()
        l, g = jax.value_and_grad(loss)(params)
        upd, state = opt.update(g, state, params)
        return optax.apply_updates(params, upd), state, l

    n = len(jax.make_jaxpr(step)(params, state, tok).jaxpr.eqns)
    args = (params, state, tok)

    def compile_time(f):
        return min(_timed(lambda: jax.jit(f()).lower(*args).compile()) for _ in range(2))
    tj = compile_time(lambda: lambda *a: step(*a))        # fresh function objects: no trace cache
    to = compile_time(lambda: jaxform.optimize(lambda *a: step(*a)))
    print(f"transformer train step ({n} top-level equations): compile jax.jit {tj:.2f} s, "
          f"jax.jit(optimize) {to:.2f} s ({to / tj:.2f}x; target <= 1.1x, issue 37)")


if __name__ == "__main__":
    table()
    real_programs()
    planning_cost()
    if "--no-transformer" not in sys.argv:
        transformer_compile()
