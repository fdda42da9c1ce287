"""How the rewrite driver scales: 50 rules over synthetic programs of 1k, 10k and 100k equations.

The program is a random DAG of elementwise ops in which ~10% of the nodes
are rewrite opportunities (--x, x*1, x+0, log(exp x), log(1+x), x + -y,
transpose(transpose x)); rewrites expose further ones. The 50 rules are the
16 `algebra` rules plus 34 deeper rules on the same primitives that almost
never match, so dispatch has to reject them. Timed: `Rules.apply(graph)` (min
of N interleaved runs, a fresh Graph each run); also shown: the jaxpr -> Graph -> jaxpr round
trip around it, for scale. Target: 100k equations < 2 s, 100k/10k ratio <= 12.

    .venv/bin/python benchmarks/rewrite_scaling.py [--sizes 1000 10000 100000] [--reps 5]
"""
from __future__ import annotations

import argparse
import random
import time

import jax
import jax.numpy as jnp
from jax import lax

from jaxform import Pat, Rules
from jaxform.ir import Graph
from jaxform.passes.algebra import RULES as ALGEBRA


def program(n_eqns: int, seed: int = 0):
    """A random elementwise DAG with about `n_eqns` equations, as a ClosedJaxpr."""
    rnd = random.Random(seed)
    unary = [lax.sin, lax.cos, lax.tanh, lax.exp, lax.log, lax.neg, lax.abs]
    binary = [lax.add, lax.mul, lax.sub, lax.max]
    opportunities = [lambda a, b: -(-a), lambda a, b: a * 1.0, lambda a, b: a + 0.0,
                     lambda a, b: lax.log(lax.exp(a)), lambda a, b: lax.log(1.0 + a),
                     lambda a, b: a + (-b), lambda a, b: a.T.T]

    def f(x):
        vals, count = [x], 0
        while count < n_eqns:
            a, b = vals[-1], vals[rnd.randrange(max(0, len(vals) - 20), len(vals))]
            r = rnd.random()
            if r < 0.1:
                vals.append(rnd.choice(opportunities)(a, b))
                count += 2
            elif r < 0.55:
                vals.append(rnd.choice(unary)(a))
                count += 1
            else:
                vals.append(rnd.choice(binary)(a, b))
                count += 1
        return vals[-1]

    return jax.make_jaxpr(f)(jnp.ones((4, 4), jnp.float32))


def fifty_rules() -> Rules:
    x, y = Pat.any("x"), Pat.any("y")
    extra = []
    unary = ["sin", "cos", "tanh", "exp", "log", "neg", "abs"]
    for i, (u, v) in enumerate((u, v) for u in unary for v in unary if u != v):
        if len(extra) == 30:
            break
        extra.append((Pat(u, Pat(v, Pat("mul", x, Pat.const(float(i + 3))))), lambda x: x, f"{u}({v}(x*{i + 3}))"))
    for b in ["add", "mul", "sub", "max"]:
        extra.append((Pat(b, Pat("sin", x), Pat("cos", x)), lambda x: x, f"{b}(sin x, cos x)"))
    rules = Rules([*ALGEBRA.rules, *extra], name="bench50")
    assert len(rules) == 50, len(rules)
    return rules


def bench(closed, rules: Rules):
    """One timed run: (equations after, rewrites, apply seconds, jaxpr -> Graph -> jaxpr seconds)."""
    t0 = time.perf_counter()
    g = Graph.from_jaxpr(closed)
    t1 = time.perf_counter()
    stats = rules.apply(g)
    t2 = time.perf_counter()
    out = g.to_jaxpr()
    t3 = time.perf_counter()
    return len(out.jaxpr.eqns), stats.total, t2 - t1, (t1 - t0) + (t3 - t2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rules = fifty_rules()
    bench(program(500), rules)   # warm up (traced replacements are cached per rule)
    programs = {size: program(size) for size in args.sizes}
    best: dict = {}
    for _ in range(args.reps):   # interleaved, so that every size sees the same machine load
        for size, closed in programs.items():
            after, fired, t, rt = bench(closed, rules)
            b = best.get(size, (after, fired, float("inf"), float("inf")))
            best[size] = (after, fired, min(b[2], t), min(b[3], rt))
    print(f"{'eqns':>8} {'after':>8} {'fired':>7} {'apply s':>9} {'us/eqn':>7} {'round trip s':>13}")
    for size, closed in programs.items():
        n = len(closed.jaxpr.eqns)
        after, fired, t, rt = best[size]
        print(f"{n:8d} {after:8d} {fired:7d} {t:9.3f} {1e6 * t / n:7.2f} {rt:13.3f}")
    sizes = sorted(best)
    for a, b in zip(sizes, sizes[1:]):
        print(f"ratio {b}/{a}: apply {best[b][2] / best[a][2]:.2f}, round trip {best[b][3] / best[a][3]:.2f} "
              f"(sizes x{b / a:.0f})")
    if 100_000 in best:
        print(f"100k equations: apply {best[100_000][2]:.3f} s (target < 2 s)")


if __name__ == "__main__":
    main()
