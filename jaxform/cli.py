"""The `jaxform` command.

    jaxform demo                       the built-in example, end to end (RNN + MSE loss through optimize)
    jaxform inspect FILE.py:FN --arg 'f32[1000,256,128]' --arg '(f32[8,8], i32[])' [--passes a,b] [--html out.html]
    jaxform passes                     the passes, with one-line docs

Argument specs are dtype[shape] (f32 bf16 f16 f64 i8 i16 i32 i64 u8 u32 bool c64 ...), or tuples of
specs in parentheses for pytree arguments. Usage errors print one line and exit with status 2.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import re
import sys
from typing import Callable

DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8", "i16": "int16",
          "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
          "bool": "bool", "pred": "bool", "c64": "complex64", "c128": "complex128"}


class UsageError(Exception):
    """A bad command line: one line on stderr, exit status 2."""


class Failure(Exception):
    """The user's code failed (import or trace): one line on stderr, exit status 1."""


# ---- argument specs -----------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(?P<arr>[a-z]+[0-9]*)\[(?P<dims>[0-9,\s]*)\]|(?P<p>[(),]))")


def parse_spec(spec: str):
    """'f32[3,4]' -> ShapeDtypeStruct; '(f32[3], (i32[], bool[2]))' -> nested tuples of them."""
    import jax
    pos, toks = 0, []
    while pos < len(spec.rstrip()):
        m = _TOKEN.match(spec, pos)
        if not m:
            raise UsageError(f"bad --arg {spec!r} at {spec[pos:pos + 12]!r}: expected dtype[shape] "
                             "such as f32[1000,256] or i32[], or a tuple (spec, spec)")
        pos = m.end()
        if m["arr"]:
            name = m["arr"]
            if name not in DTYPES and name in ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
                                               "int64", "uint8", "uint16", "uint32", "uint64", "complex64",
                                               "complex128"):
                name = next(k for k, v in DTYPES.items() if v == name)
            if name not in DTYPES:
                close = difflib.get_close_matches(m["arr"], DTYPES, n=1)
                raise UsageError(f"bad --arg {spec!r}: unknown dtype {m['arr']!r}"
                                 + (f" (did you mean {close[0]}?)" if close else f"; known: {' '.join(DTYPES)}"))
            dims = [d.strip() for d in m["dims"].split(",")] if m["dims"].strip() else []
            if not all(d.isdigit() for d in dims):
                raise UsageError(f"bad --arg {spec!r}: shape {m['dims']!r} must be comma-separated integers")
            toks.append(jax.ShapeDtypeStruct(tuple(map(int, dims)), jax.numpy.dtype(DTYPES[name])))
        else:
            toks.append(m["p"])

    def item(i):
        if i >= len(toks):
            raise UsageError(f"bad --arg {spec!r}: unexpected end")
        t = toks[i]
        if t == "(":
            out, i = [], i + 1
            while i < len(toks) and toks[i] != ")":
                x, i = item(i)
                out.append(x)
                if i < len(toks) and toks[i] == ",":
                    i += 1
                elif i < len(toks) and toks[i] != ")":
                    raise UsageError(f"bad --arg {spec!r}: expected ',' or ')'")
            if i >= len(toks):
                raise UsageError(f"bad --arg {spec!r}: missing ')'")
            return tuple(out), i + 1
        if isinstance(t, str):
            raise UsageError(f"bad --arg {spec!r}: unexpected {t!r}")
        return t, i + 1

    value, end = item(0)
    if end != len(toks):
        raise UsageError(f"bad --arg {spec!r}: one value per --arg (wrap several in parentheses)")
    return value


def load_function(target: str) -> Callable:
    """'path/to/file.py:name' (or 'file.py:Class.method') -> the function."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise UsageError(f"expected FILE.py:FUNCTION, got {target!r}")
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(f"_jaxform_inspect_{os.path.splitext(os.path.basename(path))[0]}", path)
    if spec is None:
        raise UsageError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise Failure(f"importing {path} failed: {type(e).__name__}: {_first_line(e)}") from e
    obj = module
    for part in name.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
            close = difflib.get_close_matches(part, names, n=3)
            raise UsageError(f"{path} has no function {name!r}" + (f"; did you mean {', '.join(close)}?" if close
                             else f"; it defines: {', '.join(names) or 'no functions'}"))
        obj = getattr(obj, part)
    if not callable(obj):
        raise UsageError(f"{path}:{name} is a {type(obj).__name__}, not a function")
    return obj


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0]


# ---- commands -------------------------------------------------------------------------------

def cmd_passes(ns) -> int:
    from . import passes
    order = {n: i for i, n in enumerate(passes.DEFAULT)}
    print("passes (default pipeline in order, marked 1..n; exact = results bit for bit equal):")
    for name, p in sorted(passes.PASSES.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])):
        doc = (p.__doc__ or sys.modules[p.__module__].__doc__ or "").strip().splitlines()
        mark = f"{order[name] + 1:>2}" if name in order else "  "
        print(f"  {mark} {name:24s} {'exact' if p.exact else 'reassoc.':8s} {doc[0] if doc else ''}")
    return 0


def cmd_inspect(ns) -> int:
    from . import inspect as jfi
    from .inspect import program
    from .inspect.draw import plan
    fn = load_function(ns.target)
    args = [parse_spec(s) for s in ns.arg]
    try:
        pipe = program.pipeline(ns.passes)
    except ValueError as e:
        raise UsageError(_first_line(e).removeprefix("jaxform: ")) from None
    try:
        for path, engine in ((ns.html, "builtin"), (ns.svg, "graphviz")):
            if path:
                plan(path, engine)
    except jfi.DrawError as e:
        raise UsageError(_first_line(e).removeprefix("jaxform.draw: ")) from None
    try:
        report = jfi.explain(fn, *args, passes=pipe, memory=not ns.no_memory, measure=ns.measure, reps=ns.reps,
                             progress=True)
        shown = jfi.show(fn, *args, passes=pipe)
        for path, engine in ((ns.html, "builtin"), (ns.svg, "graphviz")):
            if path:
                jfi.draw(fn, *args, path=path, passes=pipe, engine=engine)
                print(f"jaxform: wrote {path}", file=sys.stderr)
    except Exception as e:
        if ns.traceback:
            raise
        raise Failure(f"{ns.target}: {type(e).__name__}: {_first_line(e)} (--traceback for details)") from e
    if ns.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
        return 0
    print(report)
    print()
    print(shown if ns.full else (shown.diff or "(the passes did not change the program)"))
    return 0


# The demo's model: an RNN whose inference output is the stacked states, and a training loss on top.
def rnn(params, h0, xs):
    import jax.numpy as jnp
    from jax import lax
    W, U = params
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, h0, xs)[1]


def mse_loss(params, h0, xs, targets):
    import jax.numpy as jnp
    return jnp.mean((rnn(params, h0, xs) - targets) ** 2)


def cmd_demo(ns) -> int:
    import jax
    import numpy as np
    from . import optimize, passes
    from .inspect import explain
    from .inspect.explain import fmt_bytes
    from .inspect.program import Progress, min_time
    step = Progress(True)
    L, B, H, F = ns.length, ns.batch, ns.hidden, ns.features
    r = np.random.RandomState(0)
    f = lambda *s, k=1.0: jax.numpy.asarray(r.randn(*s).astype(np.float32) * k)  # noqa: E731
    args = ((f(H, H, k=H ** -0.5), f(F, H, k=F ** -0.5)), f(B, H), f(L, B, F), f(L, B, H))
    print(f"jaxform demo: a tanh RNN (hidden {H}, {F} input features) over {L} steps, batch {B}, "
          "and its MSE loss on the stacked states.")
    print("  loss = mean((scan(cell, h0, xs)[1] - targets) ** 2), run through jaxform.optimize "
          f"(default pipeline: {', '.join(passes.DEFAULT)})\n")
    report = explain(mse_loss, *args, measure=True, reps=ns.reps, progress=True)
    print(report)
    print("\nThe program, before -> after (as the plan runs it forward):")
    print(report.diff or "(unchanged)")
    opt = optimize(mse_loss)
    grad, grad_opt = jax.jit(jax.grad(mse_loss)), jax.jit(jax.grad(opt))
    with step("compiling the gradient, original and optimized, for XLA's memory analysis"):
        gmem = [g.lower(*args).compile().memory_analysis().temp_size_in_bytes for g in (grad, grad_opt)]
    print("\nThe gradient's plan (jax.grad(optimize(loss)) is planned for the gradient it runs):")
    for d in opt.decisions():
        print(f"  {d.pass_name}: {'kept' if d.kept else 'rejected'} ({d.why})")
    with step(f"measuring the gradient (jit, min of {ns.reps})"):
        gtime = min_time([grad, grad_opt], args, ns.reps)
    loss0, loss1 = float(jax.jit(mse_loss)(*args)), float(jax.jit(opt)(*args))
    g0, g1 = jax.tree_util.tree_leaves(grad(*args)), jax.tree_util.tree_leaves(grad_opt(*args))
    gerr = max(float(jax.numpy.max(abs(a - b)) / (float(jax.numpy.max(abs(a))) + 1e-30)) for a, b in zip(g0, g1))
    lerr = abs(loss0 - loss1) / max(abs(loss0), 1e-30)
    print(f"\n{'':10s}{'XLA temp memory':>36s}   {'time (jit, min of ' + str(ns.reps) + ')':>34s}")
    rows = [("loss", report.temp_bytes, report.time_s), ("grad", gmem, gtime)]
    for name, (m0, m1), (t0, t1) in rows:
        print(f"  {name:8s}{fmt_bytes(m0):>12s} -> {fmt_bytes(m1):>10s} {_ratio(m0, m1):>12s}   "
              f"{t0 * 1e3:9.1f} ms -> {t1 * 1e3:7.1f} ms ({t0 / t1:.2f}x)")
    ok = lerr < 1e-4 and gerr < 1e-3
    print(f"\ncorrectness: loss {loss0:.6f} vs {loss1:.6f} (rel. diff {lerr:.1e}); gradients max rel. error "
          f"{gerr:.1e} (relative to the largest entry): {'OK' if ok else 'MISMATCH'}")
    ok &= demo_tour()
    return 0 if ok else 1


def demo_tour() -> bool:
    """One line per capability beyond the flagship, each checked against plain JAX."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from . import Builder, Rules, autograph, for_loop, optimize, rewrite, rule_by_example, to_function, trace
    from .inspect.program import min_time
    r = np.random.RandomState(1)
    results = []
    rnd = lambda *s, k=1.0: jnp.asarray(r.randn(*s).astype(np.float32) * k)  # noqa: E731

    def line(what: str, detail: str, ok: bool) -> None:
        results.append(ok)
        print(f"  {what:34s} {detail}  {'OK' if ok else 'MISMATCH'}")

    print("\nThe rest of the toolbox, each checked against plain JAX:")
    # loop-invariant hoisting: exp(W) @ c, done by both branches of a cond in a loop, computed once per step
    W = jnp.asarray(r.randn(128, 128).astype(np.float32) / 16)
    x0 = jnp.asarray(r.randn(128).astype(np.float32))

    def branchy(W, x):
        body = lambda c, i: (lax.cond(i % 2 == 0, lambda: jnp.tanh(jnp.exp(W) @ c),  # noqa: E731
                                      lambda: jnp.sin(jnp.exp(W) @ c)), None)
        return lax.scan(body, x, jnp.arange(1000))[0]
    opt = optimize(branchy)
    # (the first scan anywhere: under a trace the forward plan sits inside a custom_jvp, docs/planner.md)
    body = lambda g: sum(1 for _ in next(n for n, _ in g.walk() if n.name == "scan").regions["body"].walk())  # noqa
    before, after = body(trace(branchy, W, x0)), body(trace(opt, W, x0))
    t0, t1 = min_time([jax.jit(branchy), jax.jit(opt)], (W, x0), 5)
    line("hoist_loop_invariants", f"exp(W) leaves a loop, shared work leaves a cond: {before} -> {after} "
         f"equations in the loop, {t0 * 1e3:.1f} -> {t1 * 1e3:.1f} ms ({t0 / t1:.1f}x)",
         bool(jnp.allclose(branchy(W, x0), opt(W, x0), atol=1e-5)))
    # a user rule written as two ordinary functions
    log1p = rule_by_example(lambda x: jnp.log(1 + x), lambda x: jnp.log1p(x), name="log(1+x) -> log1p(x)")
    f = lambda x: jnp.log(1 + x * x)  # noqa: E731
    g = rewrite(f, Rules([log1p]))
    x = jnp.float32(1e-4)
    line("rule_by_example", f"log(1 + x*x) at x=1e-4: {float(f(x)):.3e} (plain) vs {float(g(x)):.3e} "
         f"(rewritten; exact 1.000e-08)", abs(float(g(x)) - 1e-8) < 1e-12 and g.stats.total == 1)

    # AutoGraph: Python while/if on traced values
    @autograph
    def gcd(a, b):   # Euclid by subtraction
        while b != 0:
            if a > b:
                a = a - b
            else:
                b = b - a
        return a
    prims = {e.primitive.name for e in jax.make_jaxpr(gcd)(1071, 462).eqns}
    g = int(jax.jit(gcd)(1071, 462))
    line("autograph", f"Python while/if -> {'+'.join(sorted(prims & {'while', 'cond'}))}; "
         f"gcd(1071, 462) = {g} under jit", g == int(np.gcd(1071, 462)))

    # a stateful loop over refs, differentiated
    def prefix_sums(xs):
        def step(i, refs):
            acc, out = refs
            acc[...] += xs[i]
            out[i] = acc[...]
        return for_loop(xs.shape[0], step, (jnp.zeros(()), jnp.zeros_like(xs)))[1]
    v = jnp.asarray(r.randn(6).astype(np.float32))
    ok = bool(jnp.allclose(prefix_sums(v), jnp.cumsum(v), atol=1e-5)) and bool(jnp.allclose(
        jax.grad(lambda v: (prefix_sums(v) ** 2).sum())(v), jax.grad(lambda v: (jnp.cumsum(v) ** 2).sum())(v),
        atol=1e-4))
    line("for_loop over refs", "prefix sums by in-place writes = jnp.cumsum, values and gradients", ok)
    # a graph built without tracing
    b = Builder()
    a = b.arg((3, 4), "float32", name="a")
    w = b.arg((4,), "float32", name="w")
    built = to_function(b.build(b.reduce_sum(b.tanh(a @ w) + 1.0)))
    A, w_ = jnp.asarray(r.randn(3, 4).astype(np.float32)), jnp.ones(4)
    want = jax.grad(lambda w: (jnp.tanh(A @ w) + 1.0).sum())(w_)
    line("Builder", "sum(tanh(a @ w) + 1) built node by node; jax.grad through it",
         bool(jnp.allclose(jax.grad(lambda w: built(A, w))(w_), want, atol=1e-5)))
    # training memory: the largest batch whose gradient fits a fixed budget (seed 001's figure of merit)
    budget, L, H = 64 * 2 ** 20, 500, 64

    def grad_temp(f, batch):
        shapes = [(H, H), (H, H)], (batch, H), (L, batch, H), (L, batch, H)
        sds = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes,
                                     is_leaf=lambda s: isinstance(s, tuple) and all(isinstance(i, int) for i in s))
        return jax.jit(jax.grad(f)).lower(*sds).compile().memory_analysis().temp_size_in_bytes

    def largest(f):   # powers of two
        b = 1
        while b <= 1 << 14 and grad_temp(f, 2 * b) <= budget:
            b *= 2
        return b if grad_temp(f, b) <= budget else 0
    sizes = {m: largest(optimize(mse_loss, memory=m) if m else mse_loss) for m in (None, "auto", "min")}
    small = ((rnd(H, H, k=H ** -0.5), rnd(H, H, k=H ** -0.5)), rnd(4, H), rnd(L, 4, H), rnd(L, 4, H))
    g0 = jax.tree_util.tree_leaves(jax.jit(jax.grad(mse_loss))(*small))
    g1 = jax.tree_util.tree_leaves(jax.jit(jax.grad(optimize(mse_loss, memory="min")))(*small))
    line('optimize(memory="min")', f"largest batch whose gradient fits {budget >> 20} MiB (L={L}, H={H}): "
         f"{sizes[None]} plain, {sizes['auto']} 'auto', {sizes['min']} 'min' "
         f"({sizes['min'] // max(sizes[None], 1)}x)",
         all(bool(jnp.allclose(a, b, rtol=1e-4, atol=1e-6)) for a, b in zip(g0, g1)) and sizes["min"] > sizes[None])
    return all(results)


def _ratio(before: int, after: int) -> str:
    if before == after:
        return "(same)"
    if after == 0 or before > after:
        return "(all gone)" if after == 0 else f"({before / after:.{0 if before >= 10 * after else 2}f}x less)"
    return f"({after / max(before, 1):.2f}x more)"


# ---- entry point --------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="jaxform", description="jaxform: a user-malleable compiler layer over JAX.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{demo,inspect,passes}")
    d = sub.add_parser("demo", help="run the built-in example end to end and show what was optimized")
    d.add_argument("--length", type=int, default=1000)
    d.add_argument("--batch", type=int, default=256)
    d.add_argument("--hidden", type=int, default=128)
    d.add_argument("--features", type=int, default=32)
    d.add_argument("--reps", type=int, default=5, help="timing: min of this many runs")
    d.set_defaults(run=cmd_demo)
    i = sub.add_parser("inspect", help="show what the passes do to FILE.py:FUNCTION")
    i.add_argument("target", metavar="FILE.py:FUNCTION")
    i.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="one per positional argument: dtype[shape], e.g. f32[1000,256,128], or (spec, spec)")
    i.add_argument("--passes", default=None, help="comma-separated pass names (default: the default pipeline)")
    i.add_argument("--html", metavar="PATH", help="write a self-contained before/after page (.html; .svg: one SVG), no Graphviz needed")
    i.add_argument("--svg", metavar="PATH", help="write before/after graphs with Graphviz (.svg/.png/.pdf)")
    i.add_argument("--measure", action="store_true", help="also time before/after (jit, min of --reps)")
    i.add_argument("--reps", type=int, default=5)
    i.add_argument("--no-memory", action="store_true", help="skip compiling for XLA's memory analysis")
    i.add_argument("--full", action="store_true", help="print the whole program before and after, not just the diff")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.add_argument("--traceback", action="store_true", help="show the full error if the function fails")
    i.set_defaults(run=cmd_inspect)
    s = sub.add_parser("passes", help="list the passes with one-line docs")
    s.set_defaults(run=cmd_passes)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        ns = parser().parse_args(argv)
        return ns.run(ns)
    except UsageError as e:
        print(f"jaxform: error: {e}", file=sys.stderr)
        return 2
    except Failure as e:
        print(f"jaxform: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
