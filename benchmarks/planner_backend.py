"""Is the planned program never slower than plain `jax.jit` on this backend? And if not, which rewrite?

For the planner's loop programs (tests/plan/programs.py), the real programs of
tests/passes/test_fusion_real.py and the seed's cumsum (benchmarks/stream_rows.py), in one run:
min-of-N time, forward and `grad`, of plain `jax.jit` and of

    planned   optimize(f)                       (the default: planned, memory="auto")
    no-remat  optimize(f, memory=None)          (planned, no loop memory planning)
    fusion    optimize(f, passes=["fuse_scan_reductions"])            (unplanned, one rewrite)
    no-kahan  the same with compensation off   (what the compensated sum costs)

as ratios plain/variant (> 1: faster), the kernels XLA emits (fusions, library calls and copies in the
optimized HLO: on a GPU a loop step costs a launch per kernel) and the planner's decisions.
Written for the GPU, where a loop step is launch-bound (benchmarks/calibrate.py); runs anywhere.

    .venv/bin/python benchmarks/planner_backend.py [--reps N] [NAME ...]
"""
import re
import sys

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jaxform  # noqa: E402
from jaxform.inspect.program import min_time  # noqa: E402
from jaxform.passes import scan_reductions  # noqa: E402

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 5
PICKED = [a for a in sys.argv[1:] if not a.startswith("--") and not a.isdigit()]


def scalar(fn):
    def loss(*a):
        out = jax.tree_util.tree_leaves(fn(*a))
        return out[0] + sum(jnp.sum(o) for o in out[1:])
    return loss


def programs():
    import plan.programs as pp
    from passes.test_fusion_real import PROGRAMS as REAL
    out = {k: (scalar(f), a) for k, (f, a) in pp.programs().items()}
    out.update({k: make() for k, make in REAL.items()})

    def prefix_sums(x):
        def body(i, r):
            r[i + 1] += r[i]
        return jnp.sum(jaxform.for_loop(x.shape[0] - 1, body, x) ** 2)
    out["seed_cumsum"] = (prefix_sums, (jnp.linspace(0.0, 1.0, 20_000),))
    return out


KERNEL = re.compile(r"=\s*\S+\s+(fusion|custom-call|copy|copy-start|dynamic-update-slice|sort|reduce)\(")


def kernels(f, args) -> int:
    return len(KERNEL.findall(jax.jit(f).lower(*args).compile().as_text()))


def no_kahan(f):
    g = jaxform.optimize(f, passes=["fuse_scan_reductions"])

    def run(*a):
        old, scan_reductions.COMPENSATE_AFTER = scan_reductions.COMPENSATE_AFTER, 10**12
        try:
            return g(*a)
        finally:
            scan_reductions.COMPENSATE_AFTER = old
    return run


def main():
    print(f"jax {jax.__version__}, {jax.default_backend()} ({jax.devices()[0].device_kind}); min of {REPS}; "
          f"plain/variant time (>1 faster) and kernels in the compiled program")
    names = ["planned", "no-remat", "fusion", "no-kahan"]
    print(f"{'program':<22} {'':<4} {'plain ms':>9} " + " ".join(f"{n:>14}" for n in names))
    worst = []
    for name, (loss, args) in programs().items():
        if PICKED and name not in PICKED:
            continue
        variants = [jaxform.optimize(loss), jaxform.optimize(loss, memory=None),
                    jaxform.optimize(loss, passes=["fuse_scan_reductions"]), no_kahan(loss)]
        for mode, wrap in (("fwd", lambda f: f), ("grad", jax.grad)):
            fs = [wrap(loss)] + [wrap(v) for v in variants]
            try:
                t = min_time([jax.jit(f) for f in fs], args, REPS)
                k = [kernels(f, args) for f in fs]
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"{name:<22} {mode:<4} failed: {type(e).__name__}: {str(e)[:120]}")
                continue
            worst.append((t[0] / t[1], name, mode))
            print(f"{name:<22} {mode:<4} {t[0] * 1e3:>9.3f} {k[0]:>3}k " +
                  " ".join(f"{t[0] / ti:>8.2f}x {ki:>3}k" for ti, ki in zip(t[1:], k[1:])), flush=True)
        rep = jaxform.explain(loss, *args, memory=False)
        for d in rep.decisions:
            print(f"    {str(d)[:150]}")
    worst.sort()
    print("slowest planned/plain:", ", ".join(f"{n} {m} {r:.2f}x" for r, n, m in worst[:5]))


if __name__ == "__main__":
    main()
