"""Hypothesis strategy for random JAX programs, generated as Python source.

A program is the text of a function `f(...)` built from typed statements:
elementwise math with broadcasting, reductions, dot_general, slicing,
gather/scatter, reshapes, jit/checkpoint calls, scan/fori/while/cond/switch
nested up to three levels (bodies close over outer values), pytree arguments,
carries and results, and `jax.Ref`s updated inside loops. Source text makes a
shrunk failure readable and lets it be pasted into test_regressions.py as is.

Every choice is an integer draw whose 0 is the simplest option, so Hypothesis
shrinks towards short programs of plain ops.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st
from jax import lax

SHAPES = [(3,), (2, 3), (), (3, 3), (2,), (3, 2)]
MAX_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class Program:
    """Source of `f` plus the shapes of its arguments; `tree`: args are (x0, {'a': x1, 'b': (x2,)})."""
    source: str
    shapes: tuple
    tree: bool = False
    reverse_diff: bool = True   # False if it has a while_loop (no reverse-mode gradient)

    @property
    def fn(self):
        ns = {"jax": jax, "jnp": jnp, "lax": lax, "np": np}
        exec(compile(self.source, "<fuzz program>", "exec"), ns)
        return ns["f"]

    def args(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        xs = [jnp.asarray(rng.uniform(-2, 2, s).astype(np.float32)) for s in self.shapes]
        if self.tree:
            return (xs[0], {"a": xs[1], "b": tuple(xs[2:])})
        return tuple(xs)

    def __str__(self):
        return f"{self.source}\n# shapes={self.shapes} tree={self.tree}"


@dataclasses.dataclass(frozen=True)
class V:
    name: str
    shape: tuple
    kind: str = "f"  # f: float32, i: int32 scalar index, r: Ref{float32}


UNARY = ["jnp.sin({})", "jnp.tanh({})", "{0} * 2.0", "jnp.cos({})", "jnp.exp(jnp.tanh({}))",
         "jnp.log1p({0} * {0})", "jnp.abs({})", "-{}", "{0} * {0}", "jnp.sqrt({0} * {0} + 1.0)",
         "jax.nn.relu({})", "jax.nn.sigmoid({})", "{} + 0.0", "{} * 1.0", "{} * 0.0", "{0} - {0}",
         "{} / 2.0", "jax.nn.softplus({})", "lax.stop_gradient({})",
         "jnp.cumsum({}, axis=-1)", "jnp.sort({}, axis=-1)"]
BINARY = ["{} + {}", "{} * {}", "{} - {}", "jnp.maximum({}, {})", "jnp.minimum({}, {})",
          "{0} / (1.0 + {1} * {1})", "jnp.where({0} > {1}, {0}, {1})"]
REDUCE = ["jnp.sum", "jnp.max", "jnp.mean", "jnp.min", "jnp.prod"]
GATHER_IDX = ["[2, 0]", "[1, 1, 0]", "[0]"]


class _Gen:
    def __init__(self, draw):
        self.draw, self.n, self.reverse_diff = draw, 0, True
        self.in_remat = 0  # inside jax.checkpoint: no Refs (JAX's remat partial eval fails on them)
        self.exprs: list[tuple[str, V, int]] = []  # (expression, its variable, depth), for dup

    def pick(self, n):
        return self.draw(st.integers(0, n - 1))

    def fresh(self, prefix="v"):
        self.n += 1
        return f"{prefix}{self.n}"

    def choose(self, vs):
        """The latest first (0 = most recent): chains of dependent statements, little dead code."""
        return vs[len(vs) - 1 - self.pick(len(vs))]

    # -- helpers ------------------------------------------------------------------
    @staticmethod
    def coerce(v: V, shape) -> str:
        """An expression of float32 `shape` computed from v (reduce, then broadcast)."""
        if v.shape == shape:
            return v.name
        s = f"jnp.mean({v.name})" if v.shape else v.name
        return f"jnp.broadcast_to({s}, {shape})" if shape else s

    def block(self, env: list[V], lines: list[str], ind: str, depth: int, lo: int, hi: int) -> list[V]:
        env = list(env)
        for _ in range(self.draw(st.integers(lo, hi))):
            env += self.stmt(env, lines, ind, depth)
        return env

    def floats(self, env):
        return [v for v in env if v.kind == "f"]

    # -- statements ---------------------------------------------------------------
    def stmt(self, env, lines, ind, depth) -> list[V]:
        kinds = [self.unary, self.binary, self.reduce, self.dot, self.slice, self.gather, self.scatter,
                 self.reshape, self.dup, self.index, self.call]
        if depth < MAX_DEPTH:
            kinds += [self.scan, self.fori, self.cond, self.while_,
                      self.fori if self.in_remat else self.ref_loop, self.switch]
        return kinds[self.pick(len(kinds))](env, lines, ind, depth)

    def emit(self, lines, ind, expr, shape, kind="f", depth=MAX_DEPTH) -> list[V]:
        v = V(self.fresh(), tuple(shape), kind)
        lines.append(f"{ind}{v.name} = {expr}")
        self.exprs.append((expr, v, depth))
        return [v]

    def unary(self, env, lines, ind, depth):
        x = self.choose(self.floats(env))
        op = UNARY[self.pick(len(UNARY))]
        if "axis=-1" in op and not x.shape:
            op = "jnp.sin({})"
        return self.emit(lines, ind, op.format(x.name), x.shape)

    def binary(self, env, lines, ind, depth):
        fl = self.floats(env)
        x = self.choose(fl)
        ok = [y for y in fl if _bshape(x.shape, y.shape) is not None]
        y = self.choose(ok)
        return self.emit(lines, ind, BINARY[self.pick(len(BINARY))].format(x.name, y.name),
                         _bshape(x.shape, y.shape))

    def reduce(self, env, lines, ind, depth):
        x = self.choose(self.floats(env))
        op = REDUCE[self.pick(len(REDUCE))]
        if not x.shape or self.pick(3) == 0:
            return self.emit(lines, ind, f"{op}({x.name})", ())
        ax, keep = self.pick(len(x.shape)), bool(self.pick(2))
        shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i != ax)
        return self.emit(lines, ind, f"{op}({x.name}, axis={ax}, keepdims={keep})", shape)

    def dot(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if 1 <= len(v.shape) <= 2]
        pairs = [(a, b) for a in fl for b in fl if a.shape[-1] == b.shape[0]]
        if not pairs:
            return self.unary(env, lines, ind, depth)
        a, b = self.choose(pairs)
        shape = a.shape[:-1] + b.shape[1:]
        if self.pick(2) and len(a.shape) == 2 and len(b.shape) == 2:
            return self.emit(lines, ind, f"lax.dot_general({b.name}, {a.name}, (((0,), (1,)), ((), ())))",
                             b.shape[1:] + a.shape[:1])
        return self.emit(lines, ind, f"{a.name} @ {b.name}", shape)

    def slice(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if v.shape]
        if not fl:
            return self.unary(env, lines, ind, depth)
        x = self.choose(fl)
        d0, rest = x.shape[0], x.shape[1:]
        opts = [(f"{x.name}[::-1]", x.shape), (f"{x.name}[1:]", (d0 - 1,) + rest),
                (f"{x.name}[-1]", rest), (f"{x.name}[..., :1]", x.shape[:-1] + (1,)),
                (f"lax.dynamic_slice_in_dim({x.name}, 1, 1, 0)", (1,) + rest)]
        ints = [v for v in env if v.kind == "i"]
        if ints:
            i = self.choose(ints)
            opts.append((f"lax.dynamic_index_in_dim({x.name}, {i.name}, 0, keepdims=False)", rest))
        e, shape = self.choose([o for o in opts if all(o[1])])
        return self.emit(lines, ind, e, shape)

    def gather(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if v.shape]
        if not fl:
            return self.unary(env, lines, ind, depth)
        x = self.choose(fl)
        idx = GATHER_IDX[self.pick(len(GATHER_IDX))]
        k = idx.count(",") + 1
        idx = "[" + ", ".join(str(int(i) % x.shape[0]) for i in idx[1:-1].split(",")) + "]"
        return self.emit(lines, ind, f"{x.name}[jnp.array({idx})]", (k,) + x.shape[1:])

    def scatter(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if v.shape]
        if not fl:
            return self.unary(env, lines, ind, depth)
        x = self.choose(fl)
        op = ["add", "set", "mul", "max"][self.pick(4)]
        idx = [int(i) % x.shape[0] for i in GATHER_IDX[self.pick(len(GATHER_IDX))][1:-1].split(",")]
        unique = op in ("set", "mul")  # duplicates: set is order-dependent, mul has no derivative
        if unique:
            idx = list(dict.fromkeys(idx))
        y = self.choose(self.floats(env))
        upd = self.coerce(y, (len(idx),) + x.shape[1:])
        flag = ", unique_indices=True" if unique else ""
        return self.emit(lines, ind, f"{x.name}.at[jnp.array({idx})].{op}({upd}{flag})", x.shape)

    def reshape(self, env, lines, ind, depth):
        x = self.choose(self.floats(env))
        size = math.prod(x.shape)
        opts = [(f"{x.name}.reshape(-1)", (size,)), (f"jnp.concatenate([{x.name}, {x.name}], 0)",
                                                      (2 * x.shape[0],) + x.shape[1:]) if x.shape else None,
                (f"{x.name}.T", x.shape[::-1]), (f"jnp.expand_dims({x.name}, 0)", (1,) + x.shape)]
        opts = [o for o in opts if o is not None and len(o[1]) <= 3 and math.prod(o[1]) <= 18]
        if not opts:
            return self.unary(env, lines, ind, depth)
        e, shape = self.choose(opts)
        return self.emit(lines, ind, e, shape)

    def dup(self, env, lines, ind, depth):
        """Repeat an earlier statement in scope: common subexpressions for CSE."""
        names = {v.name for v in env}
        # an expression calling a body defined at depth d repeats only at depth <= d (nesting stays bounded)
        seen = [(e, v, d) for e, v, d in self.exprs if v.name in names and depth <= d
                and not (self.in_remat and any(w in e for w in ("sub", "branch", "lax.")))]
        if not seen:
            return self.unary(env, lines, ind, depth)
        e, v, d = self.choose(seen)
        return self.emit(lines, ind, e, v.shape, v.kind, d)

    def index(self, env, lines, ind, depth):
        """An int32 scalar in [0, 1] computed from data (used by dynamic slicing and switch)."""
        x = self.choose(self.floats(env))
        return self.emit(lines, ind, f"jnp.clip(jnp.argmax({x.name}.reshape(-1)), 0, 1).astype(jnp.int32)", (),
                         "i")

    def call(self, env, lines, ind, depth):
        """A jit- or checkpoint-wrapped sub-function (a call region; jax.nn.relu gives custom_jvp calls)."""
        x = self.choose(self.floats(env))
        name = self.fresh("sub")
        deco = ["@jax.jit", "@jax.checkpoint", "@jax.jit"][self.pick(3)]
        lines.append(f"{ind}{deco}")
        a = V(self.fresh("a"), x.shape)
        lines.append(f"{ind}def {name}({a.name}):")
        self.in_remat += deco == "@jax.checkpoint"
        benv = self.block([a] + env, lines, ind + "    ", depth + 1, 1, 3)
        self.in_remat -= deco == "@jax.checkpoint"
        out = self.choose(self.floats(benv))
        lines.append(f"{ind}    return {self.coerce(out, x.shape)}")
        return self.emit(lines, ind, f"{name}({x.name})", x.shape, depth=depth)

    # -- control flow -------------------------------------------------------------
    def _carry(self, env):
        fl = self.floats(env)
        cs = [self.choose(fl)]
        if self.pick(3) == 2:
            cs.append(self.choose(fl))
        return cs

    def _body_result(self, benv, carries):
        fl = self.floats(benv)
        return [f"0.5 * {c.name} + 0.5 * jnp.tanh({self.coerce(self.choose(fl), c.shape)})" for c in carries]

    def scan(self, env, lines, ind, depth):
        fl = self.floats(env)
        xs = [v for v in fl if v.shape]
        x = self.choose(xs) if xs and self.pick(4) else None
        cs = self._carry(env)
        name = self.fresh("body")
        cn = [V(self.fresh("c"), c.shape) for c in cs]
        xn = V(self.fresh("x"), x.shape[1:]) if x is not None else None
        lines.append(f"{ind}def {name}(carry, {xn.name if xn else '_'}):")
        lines.append(f"{ind}    {', '.join(c.name for c in cn)}, = carry")
        benv = self.block(env + cn + ([xn] if xn else []), lines, ind + "    ", depth + 1, 0, 3)
        y = self.choose(self.floats(benv))
        lines.append(f"{ind}    return ({', '.join(self._body_result(benv, cn))},), {y.name}")
        outs = [V(self.fresh(), c.shape) for c in cs]
        ys = V(self.fresh(), ((x.shape[0],) if x is not None else (3,)) + y.shape)
        rev = bool(self.pick(2))
        xarg = x.name if x is not None else "None, length=3"
        lines.append(f"{ind}({', '.join(o.name for o in outs)},), {ys.name} = lax.scan({name}, "
                     f"({', '.join(c.name for c in cs)},), {xarg}, reverse={rev})")
        return outs + [ys]

    def fori(self, env, lines, ind, depth):
        cs = self._carry(env)
        name = self.fresh("body")
        i = V(self.fresh("i"), (), "i")
        cn = [V(self.fresh("c"), c.shape) for c in cs]
        lines.append(f"{ind}def {name}({i.name}, carry):")
        lines.append(f"{ind}    {', '.join(c.name for c in cn)}, = carry")
        lines.append(f"{ind}    {i.name} = jnp.clip({i.name}, 0, 1)")
        benv = self.block(env + cn + [i], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return ({', '.join(self._body_result(benv, cn))},)")
        outs = [V(self.fresh(), c.shape) for c in cs]
        n = 1 + self.pick(3)
        lines.append(f"{ind}{', '.join(o.name for o in outs)}, = lax.fori_loop(0, {n}, {name}, "
                     f"({', '.join(c.name for c in cs)},))")
        return outs

    def while_(self, env, lines, ind, depth):
        self.reverse_diff = False
        c = self.choose(self.floats(env))
        name = self.fresh("body")
        k, cn = V(self.fresh("k"), (), "i"), V(self.fresh("c"), c.shape)
        lines.append(f"{ind}def {name}(s):")
        lines.append(f"{ind}    {k.name}, {cn.name} = s")
        benv = self.block(env + [cn], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return {k.name} + 1, {self._body_result(benv, [cn])[0]}")
        out = V(self.fresh(), c.shape)
        n = 1 + self.pick(3)
        lines.append(f"{ind}_, {out.name} = lax.while_loop(lambda s: s[0] < {n}, {name}, (0, {c.name}))")
        return [out]

    def _branch(self, env, lines, ind, depth, x: V, shape):
        name = self.fresh("branch")
        a = V(self.fresh("a"), x.shape)
        lines.append(f"{ind}def {name}({a.name}):")
        benv = self.block(env + [a], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return {self.coerce(self.choose(self.floats(benv)), shape)}")
        return name

    def cond(self, env, lines, ind, depth):
        fl = self.floats(env)
        p, x = self.choose(fl), self.choose(fl)
        shape = self.choose(fl).shape
        b1 = self._branch(env, lines, ind, depth, x, shape)
        b2 = self._branch(env, lines, ind, depth, x, shape)
        return self.emit(lines, ind, f"lax.cond(jnp.sum({p.name}) > 0, {b1}, {b2}, {x.name})", shape, depth=depth)

    def switch(self, env, lines, ind, depth):
        ints = [v for v in env if v.kind == "i"]
        if not ints:
            return self.index(env, lines, ind, depth)
        i, x = self.choose(ints), self.choose(self.floats(env))
        bs = [self._branch(env, lines, ind, depth, x, x.shape) for _ in range(2 + self.pick(2))]
        return self.emit(lines, ind, f"lax.switch({i.name}, [{', '.join(bs)}], {x.name})", x.shape, "f", depth)

    def ref_loop(self, env, lines, ind, depth):
        """Accumulate into a jax.Ref from inside a fori/scan/while body (a ref closed over by the loop)."""
        shape = self.choose(self.floats(env)).shape
        r = V(self.fresh("r"), shape, "r")
        lines.append(f"{ind}{r.name} = jax.new_ref(jnp.zeros({shape}, jnp.float32))")
        name, i = self.fresh("body"), V(self.fresh("i"), (), "i")
        loop = self.pick(3)
        if loop == 2:
            self.reverse_diff = False
        head = [f"def {name}({i.name}, acc):", f"def {name}(acc, {i.name}):", f"def {name}(s):"][loop]
        lines.append(f"{ind}{head}")
        if loop == 2:
            lines.append(f"{ind}    {i.name}, acc = s")
        benv = self.block(env + [i], lines, ind + "    ", depth + 1, 0, 2)
        v = self.choose(self.floats(benv))
        op = ["+=", "="][self.pick(2)]
        lines.append(f"{ind}    {r.name}[...] {op} jnp.sin({self.coerce(v, shape)}) + acc")
        lines.append(f"{ind}    return " + ["acc * 0.5", "acc * 0.5, acc", f"{i.name} + 1, acc * 0.5"][loop])
        n = 1 + self.pick(3)
        out = V(self.fresh(), shape)
        call = [f"lax.fori_loop(0, {n}, {name}, jnp.float32(1.0))",
                f"lax.scan({name}, jnp.float32(1.0), jnp.arange({n}))",
                f"lax.while_loop(lambda s: s[0] < {n}, {name}, (0, jnp.float32(1.0)))"][loop]
        lines.append(f"{ind}{call}")
        lines.append(f"{ind}{out.name} = {r.name}[...]")
        return [out]


def _bshape(a, b):
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


@st.composite
def programs(draw, max_stmts: int = 6) -> Program:
    """A random program: 1-3 arguments (maybe a pytree), 1-max_stmts statements, pytree results."""
    g = _Gen(draw)
    n_args = draw(st.integers(1, 3))
    shapes = tuple(SHAPES[draw(st.integers(0, len(SHAPES) - 1))] for _ in range(n_args))
    tree = n_args >= 2 and draw(st.booleans())
    env = [V(f"x{i}", s) for i, s in enumerate(shapes)]
    lines = []
    if tree:
        head = "def f(x0, t):"
        lines += ["    x1 = t['a']"] + [f"    x{i} = t['b'][{i - 2}]" for i in range(2, n_args)]
    else:
        head = f"def f({', '.join(v.name for v in env)}):"
    env = g.block(env, lines, "    ", 0, 1, max_stmts)
    fl = [v for v in env if v.kind in "fi"]
    last = fl[-1]
    extra = sorted({fl[draw(st.integers(0, len(fl) - 1))].name for _ in range(draw(st.integers(0, 2)))})
    if extra:
        lines.append(f"    return {{'out': {last.name}, 'aux': ({', '.join(extra)},)}}")
    else:
        lines.append(f"    return {last.name}")
    return Program("\n".join([head] + lines) + "\n", shapes, tree, g.reverse_diff)
