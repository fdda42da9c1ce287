"""Hypothesis strategy for random JAX programs, generated as Python source.

A program is the text of a function `f(...)` built from typed statements:
elementwise math with broadcasting, reductions, dot_general, slicing,
gather/scatter, reshapes, jit/checkpoint calls, scan/fori/while/cond/switch
nested up to three levels (bodies close over outer values), pytree arguments,
carries and results, and `jax.Ref`s updated inside loops. Source text makes a
shrunk failure readable and lets it be pasted into test_regressions.py as is.

Issue 15/17/19 constructs (the classes of bug a pure-float32 generator cannot see):
host callbacks (`pure_callback`, ordered/unordered `io_callback`, `jax.debug.callback`
and `jax.debug.print`) in loop and branch bodies, made by `make_cb`/`make_dbg` so
that distinct callables print identically; `custom_jvp`/`custom_vjp` functions with
the same primal body and different rules (`make_cjvp`/`make_cvjp`); RNG (typed
`jax.random.key`, legacy `PRNGKey`, draws under both `threefry_partitionable`
settings, pairs of stateful `lax.rng_uniform` draws whose difference is observed);
float16/bfloat16/complex64 values; programs run under `jax.enable_x64`; and `rnn`,
an RNN-like scan whose stacked outputs feed a loss (transposes, output projections,
`stop_gradient`, log-softmax/logsumexp, relu, `vmap` of a per-example loss,
carry-independent body work, `jax.Ref` writes inside the scan read after it,
ordered callbacks after it, 4096-step float16 sums, slices of ys along the scan axis:
`ys[k:]`, `ys[::-2]`, `ys[-1]`, `jnp.take(ys, -1, axis)`, the empty `ys[3:1]`). `Program.features` names the
constructs a program contains (for the per-category report).

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
from jax.experimental import io_callback

CALLS: list = []  # (tag, array) per host callback invocation; the runner clears and reads it


def make_cb(tag: str, k: float):
    """A host callback that records its call. Every one prints as `make_cb.<locals>.cb`:
    distinct callables with identical printed form (never merge them by text)."""
    def cb(v):
        v = np.asarray(v)
        CALLS.append((tag, v.copy()))
        return (np.sin(v.astype(np.float32)) + k).astype(v.dtype)
    return cb


def make_dbg(tag: str):
    """A `jax.debug.callback` target that records its call (same printed form for every tag)."""
    def cb(v):
        CALLS.append((tag, np.asarray(v).copy()))
    return cb


def make_cjvp(k: float):
    """custom_jvp with the same primal body for every k and a rule scaled by k (a 'wrong' rule on purpose:
    a pass that swaps two such functions' rules changes the gradient)."""
    @jax.custom_jvp
    def fn(a):
        return jnp.sin(a) + 0.5 * a

    @fn.defjvp
    def rule(primals, tangents):
        (a,), (t,) = primals, tangents
        return jnp.sin(a) + 0.5 * a, t * (k * jnp.cos(a) + 0.5)
    return fn


def make_cvjp(k: float):
    """custom_vjp, same primal body for every k, backward rule scaled by k."""
    @jax.custom_vjp
    def fn(a):
        return jnp.sin(a) + 0.5 * a
    fn.defvjp(lambda a: (jnp.sin(a) + 0.5 * a, a), lambda a, g: (g * (k * jnp.cos(a) + 0.5),))
    return fn


NAMESPACE = {"jax": jax, "jnp": jnp, "lax": lax, "np": np, "io_callback": io_callback, "make_cb": make_cb,
             "make_dbg": make_dbg, "make_cjvp": make_cjvp, "make_cvjp": make_cvjp}


def weights(shape) -> jax.Array:
    """A fixed, non-uniform, well-conditioned weighting of an output (see differential.probe)."""
    return jnp.cos(jnp.arange(int(np.prod(shape)), dtype=jnp.float32) + 0.5).reshape(shape)


def functional(outs) -> jax.Array:
    """sum(o * weights(o.shape)) over the real floating leaves of `outs` (float32): a linear loss."""
    return sum((jnp.sum(jnp.asarray(o).astype(jnp.float32) * weights(jnp.shape(o)))
                for o in jax.tree_util.tree_leaves(outs) if jnp.issubdtype(jnp.result_type(o), jnp.floating)),
               jnp.float32(0.0))


def grad_program(f, mode: str, nargs: int):
    """The program a user differentiates then optimizes: `optimize(jax.grad(f))`. mode 'grad' or
    'value_and_grad' of `functional(f(...))` w.r.t. every argument (all float32)."""
    loss = lambda *a: functional(f(*a))   # noqa: E731
    return getattr(jax, mode)(loss, argnums=tuple(range(nargs)))


SHAPES = [(3,), (2, 3), (), (3, 3), (2,), (3, 2)]
MAX_DEPTH = 3


@dataclasses.dataclass(frozen=True)
class Program:
    """Source of `f` plus the shapes of its arguments; `tree`: args are (x0, {'a': x1, 'b': (x2,)}),
    then one flat argument per shape in `extra` (weights and targets of `rnn`)."""
    source: str
    shapes: tuple
    tree: bool = False
    reverse_diff: bool = True   # False if it has a while_loop (no reverse-mode gradient)
    forward_diff: bool = True   # False if it has a custom_vjp (no forward mode either)
    vmap: bool = True           # False if it has an io_callback (JAX cannot vmap ordered ones, nor any in a cond)
    x64: bool = False           # traced and run under jax.enable_x64(True)
    extra: tuple = ()
    features: frozenset = frozenset()
    grad: str = ""              # "grad"/"value_and_grad": the program under test is grad_program(f)
    special: tuple = ()         # (flat argument index, flat position, kind): a special value put in args()
    weak_args: tuple = ()       # flat argument indices passed as Python floats (weakly typed scalars)
    api_checks: bool = False    # also: repeated grads with alternating argnums / stop_gradient, jvp per schedule

    @property
    def nargs(self) -> int:
        return (2 if self.tree else len(self.shapes)) + len(self.extra)

    @property
    def fn(self):
        ns = dict(NAMESPACE)
        exec(compile(self.source, "<fuzz program>", "exec"), ns)
        return grad_program(ns["f"], self.grad, self.nargs) if self.grad else ns["f"]

    def args(self, seed: int = 0):
        rng = np.random.default_rng(seed)
        xs = [jnp.asarray(rng.uniform(-2, 2, s).astype(np.float32)) for s in self.shapes]
        ws = tuple(jnp.asarray(rng.uniform(-1, 1, s).astype(np.float32)) for s in self.extra)
        if self.special or self.weak_args:
            flat = [np.array(x) for x in xs + list(ws)]
            for i, pos, kind in self.special:
                if kind in FILL:
                    flat[i][...] = FILL[kind]
                elif flat[i].size:
                    v = flat[i].reshape(-1)
                    v[pos % v.size] = SPECIAL[kind]
                    if kind == "near_overflow":   # two of one sign: their sum overflows in any order
                        v[(pos + 1) % v.size] = SPECIAL[kind]
            flat = [(float(x) if np.ndim(x) == 0 else _weak_array(x)) if i in self.weak_args else jnp.asarray(x)
                    for i, x in enumerate(flat)]
            xs, ws = flat[:len(xs)], tuple(flat[len(xs):])
        if self.tree:
            return (xs[0], {"a": xs[1], "b": tuple(xs[2:])}) + ws
        return tuple(xs) + ws

    @property
    def effects(self) -> bool:
        """Has host callbacks or prints whose invocations are compared."""
        return any(f.startswith(("callback", "debug_print")) for f in self.features)

    def __str__(self):
        flags = "".join(f" {k}={v}" for k, v in (("extra", self.extra), ("x64", self.x64), ("grad", self.grad))
                        if v)
        return f"{self.source}\n# shapes={self.shapes} tree={self.tree}{flags}"


@dataclasses.dataclass(frozen=True)
class V:
    name: str
    shape: tuple
    kind: str = "f"  # f: real float, i: int scalar index, r: Ref{float32}, c: complex64
    dtype: str = "float32"
    weak: bool = False


SPECIAL = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan, "-0.0": -0.0, "near_overflow": 3.0e38,
           "subnormal": 1e-40, "zero": 0.0}
FILL = {"ones": 1.0}   # special kinds that fill the whole argument


def _weak_array(x) -> jax.Array:
    """x as a weakly typed array (what `jnp.full((3,), 0.4)` gives a user)."""
    from jaxform import _jax
    return _jax.with_weak_type(jnp.asarray(x), True)


def _promote(x: V, y: V) -> str:
    if x.weak != y.weak:
        return y.dtype if x.weak else x.dtype
    return str(jnp.promote_types(x.dtype, y.dtype))


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
    def __init__(self, draw, x64: bool = False, grad_mode: bool = False):
        self.draw, self.n, self.reverse_diff, self.forward_diff, self.vmap = draw, 0, True, True, True
        self.x64 = x64
        self.grad_mode = grad_mode  # the program will be differentiated: no while loops, more RNN shapes
        self.in_remat = 0  # inside jax.checkpoint: no Refs/effects (JAX's remat partial eval fails on them)
        self.in_vmap = 0   # inside a vmapped function: no ordered effects, no Refs
        self.exprs: list[tuple[str, V, int]] = []  # (expression, its variable, depth), for dup
        self.extra: list[tuple] = []               # shapes of extra arguments (w0, w1, ...)
        self.features: set[str] = set()

    def pick(self, n):
        return self.draw(st.integers(0, n - 1))

    def fresh(self, prefix="v"):
        self.n += 1
        return f"{prefix}{self.n}"

    def choose(self, vs):
        """The latest first (0 = most recent): chains of dependent statements, little dead code."""
        return vs[len(vs) - 1 - self.pick(len(vs))]

    def arg(self, shape) -> str:
        """A new flat float32 argument (weights, targets) appended to f's signature."""
        self.extra.append(tuple(shape))
        return f"w{len(self.extra) - 1}"

    @property
    def pure_only(self):
        return self.in_remat > 0

    # -- helpers ------------------------------------------------------------------
    @staticmethod
    def coerce(v: V, shape, dtype: str = "float32") -> str:
        """An expression of `shape` and `dtype` computed from v (reduce, then broadcast, then cast)."""
        e = v.name
        if v.shape != shape:
            s = f"jnp.mean({v.name})" if v.shape else v.name
            e = f"jnp.broadcast_to({s}, {shape})" if shape else s
        return e if v.dtype == dtype and not v.weak else f"{e}.astype(jnp.{dtype})"

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
                 self.reshape, self.dup, self.index, self.call, self.cast, self.custom, self.callback,
                 self.rng, self.complex_, self.inner_grad]
        if depth > 0:  # callbacks and custom rules in loop and branch bodies, not only at top level
            kinds += [self.callback, self.custom]
        if depth < MAX_DEPTH:
            kinds += [self.scan, self.fori, self.cond, self.fori if self.grad_mode else self.while_,
                      self.fori if self.in_remat or self.in_vmap else self.ref_loop, self.switch]
        return kinds[self.pick(len(kinds))](env, lines, ind, depth)

    def emit(self, lines, ind, expr, shape, kind="f", depth=MAX_DEPTH, dtype="float32", weak=False) -> list[V]:
        v = V(self.fresh(), tuple(shape), kind, dtype, weak)
        lines.append(f"{ind}{v.name} = {expr}")
        self.exprs.append((expr, v, depth))
        if dtype not in ("float32", "int32"):
            self.features.add(dtype)
        return [v]

    def unary(self, env, lines, ind, depth):
        x = self.choose(self.floats(env))
        op = UNARY[self.pick(len(UNARY))]
        if "axis=-1" in op and not x.shape:
            op = "jnp.sin({})"
        if "stop_gradient" in op:
            self.features.add("stop_gradient")
        return self.emit(lines, ind, op.format(x.name), x.shape, dtype=x.dtype, weak=x.weak)

    def binary(self, env, lines, ind, depth):
        fl = self.floats(env)
        x = self.choose(fl)
        ok = [y for y in fl if _bshape(x.shape, y.shape) is not None]
        y = self.choose(ok)
        return self.emit(lines, ind, BINARY[self.pick(len(BINARY))].format(x.name, y.name),
                         _bshape(x.shape, y.shape), dtype=_promote(x, y), weak=x.weak and y.weak)

    def reduce(self, env, lines, ind, depth):
        x = self.choose(self.floats(env))
        op = REDUCE[self.pick(len(REDUCE))]
        if not x.shape or self.pick(3) == 0:
            return self.emit(lines, ind, f"{op}({x.name})", (), dtype=x.dtype, weak=x.weak)
        ax, keep = self.pick(len(x.shape)), bool(self.pick(2))
        shape = tuple(1 if i == ax else d for i, d in enumerate(x.shape)) if keep else \
            tuple(d for i, d in enumerate(x.shape) if i != ax)
        return self.emit(lines, ind, f"{op}({x.name}, axis={ax}, keepdims={keep})", shape, dtype=x.dtype)

    def dot(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if 1 <= len(v.shape) <= 2]
        pairs = [(a, b) for a in fl for b in fl if a.shape[-1] == b.shape[0]]
        if not pairs:
            return self.unary(env, lines, ind, depth)
        a, b = self.choose(pairs)
        shape = a.shape[:-1] + b.shape[1:]
        dt = _promote(a, b)
        if self.pick(2) and len(a.shape) == 2 and len(b.shape) == 2:
            return self.emit(lines, ind, f"lax.dot_general({b.name}, {a.name}, (((0,), (1,)), ((), ())))",
                             b.shape[1:] + a.shape[:1], dtype=dt)
        return self.emit(lines, ind, f"{a.name} @ {b.name}", shape, dtype=dt)

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
        return self.emit(lines, ind, e, shape, dtype=x.dtype)

    def gather(self, env, lines, ind, depth):
        fl = [v for v in self.floats(env) if v.shape]
        if not fl:
            return self.unary(env, lines, ind, depth)
        x = self.choose(fl)
        idx = GATHER_IDX[self.pick(len(GATHER_IDX))]
        k = idx.count(",") + 1
        idx = "[" + ", ".join(str(int(i) % x.shape[0]) for i in idx[1:-1].split(",")) + "]"
        return self.emit(lines, ind, f"{x.name}[jnp.array({idx})]", (k,) + x.shape[1:], dtype=x.dtype)

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
        upd = self.coerce(y, (len(idx),) + x.shape[1:], x.dtype)
        flag = ", unique_indices=True" if unique else ""
        return self.emit(lines, ind, f"{x.name}.at[jnp.array({idx})].{op}({upd}{flag})", x.shape, dtype=x.dtype)

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
        return self.emit(lines, ind, e, shape, dtype=x.dtype, weak=x.weak)

    def dup(self, env, lines, ind, depth):
        """Repeat an earlier statement in scope: common subexpressions for CSE."""
        names = {v.name for v in env}
        # an expression calling a body defined at depth d repeats only at depth <= d (nesting stays bounded)
        seen = [(e, v, d) for e, v, d in self.exprs if v.name in names and depth <= d
                and not (self.in_remat and any(w in e for w in ("sub", "branch", "lax.", "callback", "make_")))
                and not (self.in_vmap and "ordered=True" in e)]
        if not seen:
            return self.unary(env, lines, ind, depth)
        e, v, d = self.choose(seen)
        return self.emit(lines, ind, e, v.shape, v.kind, d, v.dtype, v.weak)

    def index(self, env, lines, ind, depth):
        """An int scalar in [0, 1] computed from data (used by dynamic slicing and switch); under x64 it is
        sometimes left in the default int type (int64 there: output dtypes must follow the config)."""
        x = self.choose(self.floats(env))
        cast = "" if self.x64 and self.pick(2) else ".astype(jnp.int32)"
        return self.emit(lines, ind, f"jnp.clip(jnp.argmax({x.name}.reshape(-1)), 0, 1){cast}", (), "i",
                         dtype="int32" if cast else "int64")

    def call(self, env, lines, ind, depth):
        """A jit- or checkpoint-wrapped sub-function (a call region; jax.nn.relu gives custom_jvp calls)."""
        x = self.choose(self.floats(env))
        name = self.fresh("sub")
        deco = ["@jax.jit", "@jax.checkpoint", "@jax.jit"][self.pick(3)]
        lines.append(f"{ind}{deco}")
        a = V(self.fresh("a"), x.shape, dtype=x.dtype)
        lines.append(f"{ind}def {name}({a.name}):")
        self.in_remat += deco == "@jax.checkpoint"
        benv = self.block([a] + env, lines, ind + "    ", depth + 1, 1, 3)
        self.in_remat -= deco == "@jax.checkpoint"
        out = self.choose(self.floats(benv))
        lines.append(f"{ind}    return {self.coerce(out, x.shape, x.dtype)}")
        return self.emit(lines, ind, f"{name}({x.name})", x.shape, depth=depth, dtype=x.dtype)

    # -- issue 15 constructs ----------------------------------------------------------
    def cast(self, env, lines, ind, depth):
        """Low precision (and float64 under x64): XLA accumulates f16/bf16 reductions in f32."""
        x = self.choose(self.floats(env))
        dts = ["float16", "bfloat16", "float32"] + (["float64"] if self.x64 else [])
        dt = dts[self.pick(len(dts))]
        return self.emit(lines, ind, f"{x.name}.astype(jnp.{dt})", x.shape, dtype=dt)

    def custom(self, env, lines, ind, depth):
        """A custom_jvp/custom_vjp function: same primal body as every other, its own rule."""
        x = self.choose(self.floats(env))
        kind = ["cjvp", "cvjp"][self.pick(2)]
        k = [1.0, 2.0, 3.0][self.pick(3)]
        name = self.fresh("cj" if kind == "cjvp" else "cv")
        self.features.add("custom_jvp" if kind == "cjvp" else "custom_vjp")
        if kind == "cvjp":
            self.forward_diff = False
        lines.append(f"{ind}{name} = make_{kind}({k})")
        return self.emit(lines, ind, f"{name}({x.name})", x.shape, dtype=x.dtype, weak=x.weak)

    def callback(self, env, lines, ind, depth):
        """A host callback; its invocations (tag, argument) are recorded and compared."""
        x = self.choose(self.floats(env))
        if self.pure_only:
            return self.unary(env, lines, ind, depth)
        kinds = ["pure", "io", "oio", "dbg", "odbg", "print", "oprint"]
        if self.in_vmap:
            kinds = [k for k in kinds if not k.startswith("oio")]
        kind = kinds[self.pick(len(kinds))]
        tag = f"{kind}{self.n + 1}"
        k = float(self.n % 7)
        sd = f"jax.ShapeDtypeStruct({x.name}.shape, {x.name}.dtype)"
        arg = f"lax.stop_gradient({x.name})"  # callbacks have no derivative rule
        self.features.add({"pure": "callback:pure_callback", "io": "callback:io_unordered",
                           "oio": "callback:io_ordered", "dbg": "callback:debug", "odbg": "callback:debug",
                           "print": "debug_print", "oprint": "debug_print"}[kind])
        if depth > 0:
            self.features.add("callback:in_body")
        if kind == "pure":
            vm = ["sequential", "expand_dims", "broadcast_all"][self.pick(3)]
            return self.emit(lines, ind, f"jax.pure_callback(make_cb('{tag}', {k}), {sd}, {arg}, vmap_method='{vm}')",
                             x.shape, dtype=x.dtype)
        if kind in ("io", "oio"):
            self.vmap = False  # JAX: no vmap of an ordered io_callback, nor of any io_callback in a cond
            return self.emit(lines, ind, f"io_callback(make_cb('{tag}', {k}), {sd}, {arg}, "
                             f"ordered={kind == 'oio'})", x.shape, dtype=x.dtype)
        ordered = kind.startswith("o")
        if kind.endswith("dbg"):
            lines.append(f"{ind}jax.debug.callback(make_dbg('{tag}'), {x.name}, ordered={ordered})")
        else:
            lines.append(f"{ind}jax.debug.print('{tag} {{}}', {x.name}, ordered={ordered})")
        self.n += 1
        return []

    def rng(self, env, lines, ind, depth):
        """Random numbers: typed or legacy keys folded with data, draws under both threefry_partitionable
        settings, or two stateful lax.rng_uniform draws whose difference is observed (never merge them)."""
        x = self.choose(self.floats(env))
        opt = self.pick(3)
        if opt == 2 and self.pure_only:
            opt = 0
        ints = [v for v in env if v.kind == "i"]
        legacy = bool(self.pick(2))
        self.features.add("rng:PRNGKey" if legacy else "rng:key")
        key = f"jax.random.{'PRNGKey' if legacy else 'key'}({self.pick(4)})"
        if ints and self.pick(2):
            key = f"jax.random.fold_in({key}, {self.choose(ints).name})"
        if opt == 0:
            dist = ["uniform", "normal"][self.pick(2)]
            return self.emit(lines, ind, f"{x.name} * jax.random.{dist}({key}, {x.name}.shape, {x.name}.dtype)",
                             x.shape, dtype=x.dtype)
        if opt == 1:
            self.features.add("rng:threefry_partitionable")
            shape = x.shape or (3,)
            a, b = self.fresh(), self.fresh()
            for v, flag in ((a, True), (b, bool(self.pick(2)))):
                lines.append(f"{ind}with jax.threefry_partitionable({flag}):")
                # float32 draws: under x64 the default is float64, which the float32 value it is added to
                # would silently become (a float32 loop carry then no longer typechecks)
                lines.append(f"{ind}    {v} = jax.random.uniform({key}, {shape}, jnp.float32)")
            return self.emit(lines, ind, f"{self.coerce(x, shape)} + {a} - 2.0 * {b}", shape)
        self.features.add("rng:rng_uniform")
        a, b = self.fresh("u"), self.fresh("u")
        for v in (a, b):
            lines.append(f"{ind}{v} = lax.rng_uniform(0.0, 1.0, {x.shape})")
        return self.emit(lines, ind, f"jnp.where({a} != {b}, {x.name}, -{x.name})", x.shape, dtype=x.dtype)

    def complex_(self, env, lines, ind, depth):
        """complex64 values (log(exp(z)) != z across the branch cut), back to real via real/abs/imag."""
        cs = [v for v in env if v.kind == "c"]
        if cs and self.pick(3):
            z = self.choose(cs)
            ops = ["jnp.exp({})", "{0} * {0}", "jnp.log(jnp.exp({}))", "jnp.conj({})", "{} * (0.5 - 1.0j)",
                   "jnp.sin({})", "jnp.real({})", "jnp.abs({})", "jnp.imag({})"]
            op = ops[self.pick(len(ops))]
            if op[4:8] in ("real", "abs(", "imag"):
                return self.emit(lines, ind, op.format(z.name), z.shape)
            return self.emit(lines, ind, op.format(z.name), z.shape, "c", dtype="complex64")
        x = self.choose(self.floats(env))
        return self.emit(lines, ind, f"{x.name}.astype(jnp.complex64) * (1.0 + 2.0j)", x.shape, "c",
                         dtype="complex64")

    def inner_grad(self, env, lines, ind, depth):
        """A gradient computed inside the program (transposed code: scans, hoisted residuals, weak types)."""
        fl = self.floats(env)
        x, y = self.choose(fl), self.choose(fl)
        self.features.add("inner_grad")
        return self.emit(lines, ind, f"jax.grad(lambda a: jnp.sum(jnp.sin(a) * {self.coerce(y, x.shape, x.dtype)}))"
                         f"({x.name})", x.shape, dtype=x.dtype)

    def rnn(self, env, lines, ind, depth):
        """Scan then reduce: an RNN over xs whose stacked outputs feed a loss (fusion and fission targets).

        Body: carry-independent work (x @ U, cos(xs)), a step h = act(h @ W + u) with act tanh, relu
        (custom_jvp) or a make_cjvp function, maybe a callback or a Ref write; after the scan a chain of
        consumers of ys: transpose (batch-major), output projection ys @ V, then a loss (sum of an
        elementwise map, MSE against targets, logsumexp, log-softmax cross-entropy, the manual
        stop_gradient(max) form, relu, times a Ref read or an ordered callback made after the scan).
        Variants: vmap of a per-example loss with per-example targets; a 4096-step scan (float16 sums).
        """
        self.features.add("rnn")
        dt = ["float32", "float32", "float32", "float16", "bfloat16"][self.pick(5)]
        f32 = dt == "float32"
        cast = "" if f32 else f".astype(jnp.{dt})"
        H, D, O, B, L = 3, 2, [3, 4][self.pick(2)], 2, [3, 4][self.pick(2)]
        variant = ["plain", "plain", "batched", "vmap", "long"][self.pick(5)]
        self.features.add(f"rnn:{variant}")
        if not f32:
            self.features.add(dt)
        W = self.fresh("W")
        lines.append(f"{ind}{W} = {self.arg((H, H))}{cast}")
        hshape = (B, H) if variant == "batched" else (H,)
        h0 = self.fresh("h")
        lines.append(f"{ind}{h0} = {self.coerce(self.choose(self.floats(env)), hshape, dt)}")
        # body
        body, h, x = self.fresh("body"), self.fresh("h"), self.fresh("x")
        has_x = variant != "long"
        U = None
        if has_x and self.pick(3):
            U = self.fresh("U")
            lines.append(f"{ind}{U} = {self.arg((D, H))}{cast}")
            self.features.add("rnn:x@U")
        acts = ["jnp.tanh({})", "jax.nn.relu({})", "jnp.sin({})", "CJ({})"]
        if self.grad_mode:   # stacked carries under grad: tanh and sigmoid keep 1 - h' style residuals
            acts += ["jnp.tanh({})", "jax.nn.sigmoid({})"]
        act = acts[self.pick(len(acts))]
        if "sigmoid" in act:
            self.features.add("rnn:sigmoid")
        # A checkpointed body with a loop-invariant residual (W @ W.T): under grad, JAX recomputes it and
        # pulls its cotangent back at every step (hoist_loop_invariants + sum_then_pull_back's target).
        ckpt = self.grad_mode and variant in ("plain", "batched") and self.pick(3) == 0
        if ckpt:
            self.features.add("rnn:checkpoint_gram")
            self.in_remat += 1
        if act.startswith("CJ"):
            cj = self.fresh("cj")
            lines.append(f"{ind}{cj} = make_cjvp({[1.0, 2.0][self.pick(2)]})")
            act = cj + "({})"
            self.features.add("custom_jvp")
        elif "relu" in act:
            self.features.add("relu")
        ref = None
        if variant != "vmap" and not self.in_vmap and not self.pure_only and self.pick(3) == 0:
            ref = self.fresh("r")
            lines.append(f"{ind}{ref} = jax.new_ref(jnp.zeros((), jnp.float32))")
            self.features.add("rnn:ref")
        proj_in_body = self.pick(4) == 0
        V_ = None
        if proj_in_body or self.pick(2):
            V_ = self.fresh("V")
            lines.append(f"{ind}{V_} = {self.arg((H, O))}{cast}")
        bi = ind + "    "
        if ckpt:
            lines.append(f"{ind}@jax.checkpoint")
        lines.append(f"{ind}def {body}({h}, {x if has_x else '_'}):")
        pre = f"{h} @ {W}"
        if ckpt:
            pre = [f"{h} @ ({W} @ {W}.T)", f"{h} @ (2.0 * ({W}.T @ {W}) - 0.5 * {W})"][self.pick(2)]
        if U is not None:
            pre += f" + {x} @ {U}"
        if has_x and self.pick(2):
            self.features.add("rnn:cos(xs)")
            pre += f" + jnp.sum(jnp.cos({x}), axis=-1, keepdims=True)"
        step = act.format(pre)
        if variant == "long":
            step = f"0.5 * jnp.tanh({pre}) + 1.0"
        lines.append(f"{bi}{h} = {step}")
        if not self.pure_only and variant != "long" and self.pick(3) == 0:  # not 4096 host calls
            kinds = ["dbg"] if variant == "vmap" or self.in_vmap else ["dbg", "odbg", "io", "oio"]
            kind = kinds[self.pick(len(kinds))]
            self.features.add("callback:in_body")
            tag = self.fresh(kind)
            if kind.endswith("dbg"):
                self.features.add("callback:debug")
                lines.append(f"{bi}jax.debug.callback(make_dbg('{tag}'), {h}, ordered={kind == 'odbg'})")
            else:
                self.features.add("callback:io_ordered" if kind == "oio" else "callback:io_unordered")
                self.vmap = False
                lines.append(f"{bi}{h} = {h} + 0.01 * io_callback(make_cb('{tag}', 1.0), "
                             f"jax.ShapeDtypeStruct({h}.shape, {h}.dtype), lax.stop_gradient({h}), "
                             f"ordered={kind == 'oio'})")
        if ref is not None:
            lines.append(f"{bi}{ref}[...] += jnp.sum({h}).astype(jnp.float32)")
        y = f"{h} @ {V_}" if proj_in_body else h
        lines.append(f"{bi}return {h}, {y}")
        self.in_remat -= ckpt
        yshape_step = hshape[:-1] + ((O,) if proj_in_body else (H,))
        out_h, ys = self.fresh("hT"), self.fresh("ys")
        loss = self.fresh("loss")
        if variant == "vmap":
            self.features.add("vmap_loss")
            X = self.fresh("X")
            lines.append(f"{ind}{X} = {self.arg((B, L, D))}{cast}")
            T = self.fresh("T")
            lines.append(f"{ind}{T} = {self.arg((B, L) + yshape_step)}{cast}")
            pe, xa, ta = self.fresh("per_example"), self.fresh("x"), self.fresh("t")
            lines.append(f"{ind}def {pe}({xa}, {ta}):")
            lines.append(f"{bi}_, {ys} = lax.scan({body}, {h0}, {xa})")
            lines.append(f"{bi}return jnp.mean(({ys} - {ta}) ** 2)")
            lines.append(f"{ind}{loss} = jnp.mean(jax.vmap({pe})({X}, {T}))")
            return [V(loss, (), dtype=dt)]
        if variant == "long":
            lines.append(f"{ind}{out_h}, {ys} = lax.scan({body}, {h0}, None, length=4096)")
            shape = (4096,) + yshape_step
        else:
            X = self.fresh("X")
            lines.append(f"{ind}{X} = {self.arg((L,) + hshape[:-1] + (D,))}{cast}")
            rev = bool(self.pick(4) == 0)
            lines.append(f"{ind}{out_h}, {ys} = lax.scan({body}, {h0}, {X}{', reverse=True' if rev else ''})")
            shape = (L,) + yshape_step
        z, sa = ys, 0   # sa: where the scan axis is in z
        if len(shape) == 3 and self.pick(2):
            self.features.add("rnn:transpose_ys")
            z2 = self.fresh("z")
            lines.append(f"{ind}{z2} = jnp.swapaxes({z}, 0, 1)")
            z, shape, sa = z2, (shape[1], shape[0], shape[2]), 1
        elif len(shape) == 2 and self.pick(4) == 0:
            self.features.add("rnn:transpose_ys")
            z2 = self.fresh("z")
            lines.append(f"{ind}{z2} = {z}.T")
            z, shape, sa = z2, shape[::-1], 1
        if not proj_in_body and V_ is not None and shape[-1] == H:
            self.features.add("rnn:matmul_ys")
            z2 = self.fresh("z")
            lines.append(f"{ind}{z2} = {z} @ {V_}")
            z, shape = z2, shape[:-1] + (O,)
            sa = None if sa == len(shape) - 1 else sa   # (z.T @ V contracted the steps)
        if sa is not None and self.pick(3) == 0:   # a slice along the scan axis (step predicates, picks)
            self.features.add("rnn:slice_ys")
            sls = ["{h}:", "-2:", "::2", "::-2", "1:-1", "3:1", "-1", "1", "take"]
            sl = sls[self.pick(len(sls))].format(h=shape[sa] // 2)
            z2 = self.fresh("z")
            if sl == "take":
                lines.append(f"{ind}{z2} = jnp.take({z}, -1, axis={sa})")
                shape = shape[:sa] + shape[sa + 1:]
            else:
                lines.append(f"{ind}{z2} = {z}[{':, ' * sa}{sl}]")
                idx = eval(f"range({shape[sa]})[{sl}]")   # noqa: S307 (our own literal)
                shape = shape[:sa] + (() if isinstance(idx, int) else (len(idx),)) + shape[sa + 1:]
            z = z2
        opts = ["sin", "mse", "logsumexp", "log_softmax", "manual_lse", "relu"]
        if ref is not None:
            opts += ["ref", "ref"]
        if not self.pure_only and not self.in_vmap:
            opts += ["oio_after"]
        kind = opts[self.pick(len(opts))]
        self.features.add(f"rnn:loss_{kind}")
        if kind == "sin":
            e = f"jnp.sum(jnp.sin({z}) * 2.0)"
        elif kind == "mse":
            T = self.fresh("T")
            lines.append(f"{ind}{T} = {self.arg(shape)}{cast}")
            e = f"jnp.mean(({z} - {T}) ** 2)"
        elif kind == "logsumexp":
            e = f"jnp.sum(jax.nn.logsumexp({z}, axis=-1))"
        elif kind == "log_softmax":
            T = self.fresh("T")
            lines.append(f"{ind}{T} = jax.nn.softmax({self.arg(shape)}, axis=-1){cast}")
            e = f"-jnp.mean(jnp.sum(jax.nn.log_softmax({z}, axis=-1) * {T}, axis=-1))"
        elif kind == "manual_lse":
            self.features.add("stop_gradient")
            m = self.fresh("m")
            lines.append(f"{ind}{m} = lax.stop_gradient(jnp.max({z}, axis=-1, keepdims=True))")
            e = f"jnp.sum(jnp.log(jnp.sum(jnp.exp({z} - {m}), axis=-1)) + {m}[..., 0])"
        elif kind == "relu":
            self.features.add("relu")
            e = f"jnp.sum(jax.nn.relu({z}) * 2.0)"
        elif kind == "ref":
            rv = self.fresh("rv")
            lines.append(f"{ind}{rv} = {ref}[...]")
            e = f"jnp.sum({z} * {rv}{cast})"
        else:
            self.features.add("callback:io_ordered")
            self.vmap = False
            w = self.fresh("w")
            tag = f"oio{self.n}"
            lines.append(f"{ind}{w} = io_callback(make_cb('{tag}', 1.0), jax.ShapeDtypeStruct((), jnp.{dt}), "
                         f"lax.stop_gradient({out_h}[..., 0].sum()), ordered=True)")
            e = f"jnp.sum({z} * {w})"
        if variant == "long":   # a mean: a 4096-step sum is ~1e4, and a later sin() of it would turn
            e = f"({e}) / 4096"  # float rounding (fusion reassociates the sum) into O(1e-3) differences
        lines.append(f"{ind}{loss} = {e}")
        out = [V(loss, (), dtype=dt), V(out_h, hshape, dtype=dt)]
        if ref is not None and kind != "ref":
            rv = self.fresh("rv")
            lines.append(f"{ind}{rv} = {ref}[...]")
            out.append(V(rv, ()))
        return out

    # -- control flow -------------------------------------------------------------
    def _carry(self, env):
        fl = self.floats(env)
        cs = [self.choose(fl)]
        if self.pick(3) == 2:
            cs.append(self.choose(fl))
        return cs

    def _body_result(self, benv, carries):
        fl = self.floats(benv)
        return [f"0.5 * {c.name} + 0.5 * jnp.tanh({self.coerce(self.choose(fl), c.shape, c.dtype)})"
                for c in carries]

    def scan(self, env, lines, ind, depth):
        fl = self.floats(env)
        xs = [v for v in fl if v.shape]
        x = self.choose(xs) if xs and self.pick(4) else None
        cs = [V(c.name, c.shape, c.kind, c.dtype) for c in self._carry(env)]  # a weak carry would change type
        name = self.fresh("body")
        cn = [V(self.fresh("c"), c.shape, dtype=c.dtype) for c in cs]
        xn = V(self.fresh("x"), x.shape[1:], dtype=x.dtype) if x is not None else None
        lines.append(f"{ind}def {name}(carry, {xn.name if xn else '_'}):")
        lines.append(f"{ind}    {', '.join(c.name for c in cn)}, = carry")
        benv = self.block(env + cn + ([xn] if xn else []), lines, ind + "    ", depth + 1, 0, 3)
        y = self.choose(self.floats(benv))
        lines.append(f"{ind}    return ({', '.join(self._body_result(benv, cn))},), {y.name}")
        outs = [V(self.fresh(), c.shape, dtype=c.dtype) for c in cs]
        ys = V(self.fresh(), ((x.shape[0],) if x is not None else (3,)) + y.shape, dtype=y.dtype)
        rev = bool(self.pick(2))
        xarg = x.name if x is not None else "None, length=3"
        init = ", ".join(self.coerce(c, c.shape, c.dtype) for c in cs)
        lines.append(f"{ind}({', '.join(o.name for o in outs)},), {ys.name} = lax.scan({name}, "
                     f"({init},), {xarg}, reverse={rev})")
        return outs + [ys]

    def fori(self, env, lines, ind, depth):
        cs = [V(c.name, c.shape, c.kind, c.dtype) for c in self._carry(env)]
        name = self.fresh("body")
        i = V(self.fresh("i"), (), "i")
        cn = [V(self.fresh("c"), c.shape, dtype=c.dtype) for c in cs]
        lines.append(f"{ind}def {name}({i.name}, carry):")
        lines.append(f"{ind}    {', '.join(c.name for c in cn)}, = carry")
        lines.append(f"{ind}    {i.name} = jnp.clip({i.name}, 0, 1)")
        benv = self.block(env + cn + [i], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return ({', '.join(self._body_result(benv, cn))},)")
        outs = [V(self.fresh(), c.shape, dtype=c.dtype) for c in cs]
        n = 1 + self.pick(3)
        init = ", ".join(self.coerce(c, c.shape, c.dtype) for c in cs)
        lines.append(f"{ind}{', '.join(o.name for o in outs)}, = lax.fori_loop(0, {n}, {name}, ({init},))")
        return outs

    def while_(self, env, lines, ind, depth):
        self.reverse_diff = False
        c = self.choose(self.floats(env))
        c = V(c.name, c.shape, c.kind, c.dtype)
        name = self.fresh("body")
        k, cn = V(self.fresh("k"), (), "i"), V(self.fresh("c"), c.shape, dtype=c.dtype)
        lines.append(f"{ind}def {name}(s):")
        lines.append(f"{ind}    {k.name}, {cn.name} = s")
        benv = self.block(env + [cn], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return {k.name} + 1, {self._body_result(benv, [cn])[0]}")
        out = V(self.fresh(), c.shape, dtype=c.dtype)
        n = 1 + self.pick(3)
        # the trip count: static (`i < n`, a bound memory planning reads), data-dependent under that bound,
        # or data-dependent with no bound it can read (jax.grad of it then raises jaxform's error)
        kind = self.pick(3)
        self.features.add(["while:static", "while:bounded", "while:unbounded"][kind])
        stop = f"jnp.max(jnp.abs(s[1])) < {1.0 + self.pick(4)}"
        test = [f"s[0] < {n}", f"(s[0] < {n}) & ({stop})", f"({stop}) & (s[0] * 2 < {2 * n})"][kind]
        lines.append(f"{ind}_, {out.name} = lax.while_loop(lambda s: {test}, {name}, "
                     f"(0, {self.coerce(c, c.shape, c.dtype)}))")
        return [out]

    def _branch(self, env, lines, ind, depth, x: V, shape, dtype):
        name = self.fresh("branch")
        a = V(self.fresh("a"), x.shape, dtype=x.dtype, weak=x.weak)
        lines.append(f"{ind}def {name}({a.name}):")
        benv = self.block(env + [a], lines, ind + "    ", depth + 1, 0, 3)
        lines.append(f"{ind}    return {self.coerce(self.choose(self.floats(benv)), shape, dtype)}")
        return name

    def cond(self, env, lines, ind, depth):
        fl = self.floats(env)
        p, x = self.choose(fl), self.choose(fl)
        o = self.choose(fl)
        b1 = self._branch(env, lines, ind, depth, x, o.shape, o.dtype)
        b2 = self._branch(env, lines, ind, depth, x, o.shape, o.dtype)
        return self.emit(lines, ind, f"lax.cond(jnp.sum({p.name}) > 0, {b1}, {b2}, {x.name})", o.shape,
                         depth=depth, dtype=o.dtype)

    def switch(self, env, lines, ind, depth):
        ints = [v for v in env if v.kind == "i"]
        if not ints:
            return self.index(env, lines, ind, depth)
        i, x = self.choose(ints), self.choose(self.floats(env))
        bs = [self._branch(env, lines, ind, depth, x, x.shape, x.dtype) for _ in range(2 + self.pick(2))]
        return self.emit(lines, ind, f"lax.switch({i.name}, [{', '.join(bs)}], {x.name})", x.shape, "f", depth,
                         x.dtype)

    def ref_loop(self, env, lines, ind, depth):
        """Accumulate into a jax.Ref from inside a fori/scan/while body (a ref closed over by the loop)."""
        shape = self.choose(self.floats(env)).shape
        r = V(self.fresh("r"), shape, "r")
        lines.append(f"{ind}{r.name} = jax.new_ref(jnp.zeros({shape}, jnp.float32))")
        name, i = self.fresh("body"), V(self.fresh("i"), (), "i")
        loop = self.pick(2 if self.grad_mode else 3)   # no while_loop in a program to differentiate
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
    """A random program: 1-3 arguments (maybe a pytree), 1-max_stmts statements, pytree results.

    About half start with `rnn` (scan-then-reduce, issues 17/19); one in eight runs under enable_x64.
    About 35% are *grad programs* (`Program.grad`): the program under test is `jax.grad` (or
    `value_and_grad`) of a fixed linear functional of f's outputs, i.e. what `optimize(jax.grad(f))`
    sees: forward scans stacking residuals and reverse scans reading them. Those are generated
    without while loops (JAX cannot reverse-differentiate them), start with `rnn` three times in four,
    and their RNNs also get sigmoid steps and checkpointed bodies with a loop-invariant W @ W.T.
    """
    x64 = draw(st.integers(0, 7)) == 7
    grad = draw(st.integers(0, 19)) >= 13
    g = _Gen(draw, x64, grad)
    n_args = draw(st.integers(1, 3))
    shapes = tuple(SHAPES[draw(st.integers(0, len(SHAPES) - 1))] for _ in range(n_args))
    tree = n_args >= 2 and draw(st.booleans())
    env = [V(f"x{i}", s) for i, s in enumerate(shapes)]
    lines = []
    if tree:
        lines += ["    x1 = t['a']"] + [f"    x{i} = t['b'][{i - 2}]" for i in range(2, n_args)]
    must = []   # returned whatever else is: in a grad program, the RNN's loss (else its scan pair is dead)
    if draw(st.integers(0, 3 if grad else 1)) <= (2 if grad else 0):
        made = g.rnn(env, lines, "    ", 0)
        env += made
        must = [made[0].name] if grad else []
    if draw(st.integers(0, 3)) == 0:  # a weak-typed value (a constant, or a loop carry started from a literal)
        g.features.add("weak_type")
        w = g.fresh()
        lines.append(f"    {w} = " + ["jnp.asarray(1.5)", f"lax.fori_loop(0, 2, lambda i, c: c * 0.5 + 1.0, 3.0)"]
                     [draw(st.integers(0, 1))])
        env.append(V(w, (), weak=True))
    env = g.block(env, lines, "    ", 0, 1, max_stmts)
    fl = [v for v in env if v.kind in "fic"]
    last = fl[-1]
    extra = sorted({fl[draw(st.integers(0, len(fl) - 1))].name for _ in range(draw(st.integers(0, 2)))}
                   | ({*must} - {last.name}))
    args = [v.name for v in env[:n_args]] if not tree else ["x0", "t"]
    args += [f"w{i}" for i in range(len(g.extra))]
    head = f"def f({', '.join(args)}):"
    if extra:
        lines.append(f"    return {{'out': {last.name}, 'aux': ({', '.join(extra)},)}}")
    else:
        lines.append(f"    return {last.name}")
    if x64:
        g.features.add("x64")
    mode = ""
    outs = [last] + [v for v in env if v.name in extra]
    if grad and g.reverse_diff and any(v.kind == "f" for v in outs):  # else it has nothing to differentiate
        mode = ["grad", "value_and_grad"][draw(st.integers(0, 1))]
        g.features |= {"grad_program", f"grad_program:{mode}"}
    return Program("\n".join([head] + lines) + "\n", shapes, tree, g.reverse_diff, g.forward_diff, g.vmap, x64,
                   tuple(g.extra), frozenset(g.features), mode)


# ---- issue 26: edge programs (special values, mixed precision, integer bodies, lengths 0/1, weak scalars) ----

# issue 29's in-place row sweeps: (first i, the step's statement on buffer r); rows up to i + 2 exist
ROW_SWEEPS = [(0, "r = r.at[i + 1].add(r[i])"),
              (1, "r = r.at[i].set(jnp.tanh(r[i - 1] * w0 + r[i]))"),
              (0, "r = r.at[i + 2].set(0.5 * r[i] + jnp.sin(r[i + 1]) * w0)"),
              (0, "r = r.at[i + 1].set(r[i + 1] + r[i]); r = r.at[i].set(r[i + 1] * w0)"),
              (1, "r = lax.dynamic_update_slice_in_dim(r, lax.dynamic_slice_in_dim(r, i - 1, 1) * w0 + 1.0, i, 0)")]
ROW_REDS = ["jnp.sum(r ** 2)", "jnp.max(r)", "jnp.sum(jnp.log1p(jnp.abs(r)))", "r"]
EDGE_LENGTHS = [0, 1, 2, 65, 130]   # 65 > fuse_scan_reductions.COMPENSATE_AFTER: compensated sums
EDGE_TERMS = ["jnp.log(jnp.abs(x))", "x * w0", "jnp.exp(x * 40.0)", "x * 1e30", "jnp.sqrt(x)", "x / (x - x)"]
EDGE_REDS = ["jnp.sum(ys)", "jnp.mean(ys)", "jnp.max(ys)", "jnp.sum(ys * ys)", "jnp.sum(ys[1:])", "ys[-1:].sum()"]
MIXED = {   # name: (m from x0, W from w0, the step's L(m_t), the accumulator's start)
    "f16_dot_f32": ("x0.astype(jnp.float16)", "w0.astype(jnp.float16)",
                    "lax.dot_general(mt, W, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)",
                    "jnp.zeros((1, 2), jnp.float32)"),
    "bf16_dot_f32": ("x0.astype(jnp.bfloat16)", "w0.astype(jnp.bfloat16)",
                     "lax.dot_general(mt, W, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)",
                     "jnp.zeros((1, 2), jnp.float32)"),
    "f16_convert_f32": ("x0.astype(jnp.float16)", "w0.astype(jnp.float16)", "(mt @ W).astype(jnp.float32)",
                        "jnp.zeros((1, 2), jnp.float32)"),
    "int8_dot_int32": ("jnp.round(x0 * 3).astype(jnp.int8)", "jnp.round(w0 * 3).astype(jnp.int8)",
                       "lax.dot_general(mt, W, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)",
                       "jnp.zeros((1, 2), jnp.int32)"),
    "int16_dot_int32": ("jnp.round(x0 * 100).astype(jnp.int16)", "jnp.round(w0 * 100).astype(jnp.int16)",
                        "lax.dot_general(mt, W, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)",
                        "jnp.zeros((1, 2), jnp.int32)"),
    "int32_div": ("jnp.round(x0 * 3).astype(jnp.int32)", "jnp.round(w0 * 3).astype(jnp.int32)",
                  "lax.div(mt @ W, 3)", "jnp.zeros((1, 2), jnp.int32)"),
    "f32_div": ("x0", "w0", "(mt @ W) / 3.0", "jnp.zeros((1, 2), jnp.float32)"),
}
INT_OPS = ["lax.div(c * 3 + k, 2)", "lax.rem(c + k, 5)", "lax.shift_left(c, 1) ^ k",
           "lax.shift_right_arithmetic(c, 1) + k",
           "lax.shift_right_logical(c + k, 2)", "(c * 7 + k) // 3", "(c - k) % 4"]


def edge_program(kind: str, L: int, variant: int = 0, special: str = "", pos: int = 0, grad: str = "",
                 api: bool = False, fill: bool = False) -> Program:
    """One issue 26 program: `kind` special | mixed | int_body | weak_scalar | rnn, loop length L, `variant`
    picks the term/reduction (special), accumulation (mixed) or integer op (int_body); `special` a SPECIAL
    kind put at flat position `pos` of the loop's input; `grad` makes it a grad program; `api` adds the
    API checks (repeated grads with alternating argnums / stop_gradient, jvp per memory schedule)."""
    feats = {"edge", f"edge:{kind}", f"length:{L if L < 3 else 'long'}"}
    specials, weak = (), ()
    if kind == "special":
        term, red = EDGE_TERMS[variant % len(EDGE_TERMS)], EDGE_REDS[(variant // len(EDGE_TERMS)) % len(EDGE_REDS)]
        if L == 0 and red == "jnp.max(ys)":
            red = "jnp.max(ys, initial=-jnp.inf)"   # max of nothing is an error in JAX itself
        wide = variant % 2 == 1
        shapes = ((L, 3) if wide else (L,), (3,) if wide else ())
        src = f"""def f(x0, w0):
    def body(c, x):
        t = {term}
        return c + t, t
    c, ys = lax.scan(body, {'jnp.zeros(3)' if wide else '0.0'}, x0)
    return {{'out': {red}, 'aux': (c,)}}
"""
        feats |= {f"term:{term}", f"reduce:{red}"}
    elif kind == "mixed":
        name = list(MIXED)[variant % len(MIXED)]
        m, W, step, init = MIXED[name]
        shapes = ((L, 1, 3), (3, 2))
        src = f"""def f(x0, w0):
    m = {m}
    W = {W}
    def body(acc, mt):
        return acc + {step}, None
    acc, _ = lax.scan(body, {init}, m)
    return {{'out': acc, 'aux': (jnp.sum(m.astype(jnp.float32)) * 0.5,)}}
"""
        feats |= {f"mixed:{name}"} | ({"float16"} if "f16" in name else {"bfloat16"} if "bf16" in name else set())
        if fill:   # ones: 3000 float16 steps of 1.0 saturate a float16 sum at 2048
            specials = ((0, 0, "ones"),)
            feats.add("special:ones")
    elif kind == "int_body":
        op = INT_OPS[variant % len(INT_OPS)]
        shapes = ((L,),)
        src = f"""def f(x0):
    ks = jnp.round(x0 * 7).astype(jnp.int32)
    def body(c, k):
        c = {op}
        return c, c * 2 - k
    c, ys = lax.scan(body, jnp.int32(1), ks)
    return {{'out': jnp.sum(ys), 'aux': (c, jnp.sum(x0 * x0), jnp.max(ys, initial=-5))}}
"""
        feats |= {f"int_op:{op}"}
    elif kind == "weak_scalar":
        shapes = ((L,), (), (3,))
        src = """def f(x0, s, w):
    def body(c, x):
        return c * s + (w @ jnp.ones(3)) * x, (x * s).astype(jnp.bfloat16) * s
    c, ys = lax.scan(body, 0.0, x0)
    return {'out': c, 'aux': (ys.sum(), s * 2.0, jnp.full((3,), 0.4) * s)}
"""
        weak = () if grad else (1, 2)   # s a Python float, w a weakly typed array (issue 26, finding 6)
        feats |= {"weak_type", "weak_type:python_scalar", "bfloat16"}
    elif kind == "rows":   # issue 29: an in-place row sweep over a buffer (stream_rows' target)
        lo, stmt = ROW_SWEEPS[variant % len(ROW_SWEEPS)]
        red = ROW_REDS[(variant // len(ROW_SWEEPS)) % len(ROW_REDS)]
        wide = variant % 2 == 1
        n = L + lo + 2                                  # rows; the sweep touches rows up to i + 2
        shapes = ((n, 3) if wide else (n,), (3,) if wide else ())
        src = f"""def f(x0, w0):
    def body(i, r):
        {stmt}
        return r
    r = lax.fori_loop({lo}, {lo} + {L}, body, x0)
    return {{'out': {red}, 'aux': (r[0] * 1.0,)}}
"""
        feats |= {f"rows:{stmt}", f"reduce:{red}"}
    else:   # a carry large next to revolve's schedule table (16 bytes a step), so a 1-byte budget picks revolve
        shapes = ((16, 16), (L, 4, 16))
        src = """def f(w0, x0):
    def cell(h, x):
        h = jnp.tanh(h @ (w0 * 0.1) + x)
        return h, h
    h, ys = lax.scan(cell, jnp.zeros(x0.shape[1:]), x0)
    return jnp.sum(ys ** 2) + jnp.sum(h)
"""
    if special:
        specials = ((0 if kind != "rnn" else 1, pos, special),)
        feats.add(f"special:{special}")
    if grad:
        feats |= {"grad_program", f"grad_program:{grad}"}
        api = False   # a grad program differentiates every argument as an array
    if api:
        feats.add("api_checks")
    return Program(src, shapes, False, True, True, True, False, (), frozenset(feats), grad, specials, weak, api)


def edge_catalog() -> list[Program]:
    """The fixed-seed CI share of issue 26's classes: every special value (in the inputs and along a loop,
    under grad too), every mixed-precision accumulation, every integer op, lengths 0 and 1, weakly typed
    scalars, and the API checks (alternating argnums, stop_gradient, jvp over every memory schedule)."""
    out = [edge_program("special", [65, 2, 130, 1, 65, 70, 66][k], variant=k * 7 + k, special=sk, pos=3 * k + 1)
           for k, sk in enumerate(SPECIAL)]
    out += [edge_program("special", 0, variant=2, special="inf", grad="grad"),
            edge_program("special", 65, variant=0, special="zero", pos=5, grad="value_and_grad")]
    out += [edge_program("mixed", 3 if k != 0 else 3000, variant=k, fill=k == 0) for k in range(len(MIXED))]
    out += [edge_program("int_body", [5, 1, 0, 9, 4, 7, 6][k], variant=k) for k in range(len(INT_OPS))]
    out += [edge_program("weak_scalar", 4, api=True), edge_program("weak_scalar", 1)]
    out += [edge_program("rnn", 65, api=True), edge_program("rnn", 0, grad="value_and_grad"),
            edge_program("rnn", 1, grad="grad", special="nan", pos=2)]
    out += [edge_program("rows", [65, 2, 70, 1, 0][k], variant=k + 5 * (k % 4), special=["", "inf", "", "nan",
                                                                                     ""][k], pos=k,
                         grad="grad" if k == 2 else "") for k in range(len(ROW_SWEEPS))]
    return out


@st.composite
def edge_programs(draw) -> Program:
    """A random issue 26 program (see edge_program), for campaigns."""
    kind = ["special", "mixed", "int_body", "weak_scalar", "rnn", "rows"][draw(st.integers(0, 5))]
    L = EDGE_LENGTHS[draw(st.integers(0, len(EDGE_LENGTHS) - 1))]
    variant = draw(st.integers(0, 99))
    special, pos, fill = "", 0, False
    if kind in ("special", "rnn", "rows") and (kind == "special" or draw(st.integers(0, 2)) == 0):
        special = list(SPECIAL)[draw(st.integers(0, len(SPECIAL) - 1))]
        pos = draw(st.integers(0, 1000))
    if kind == "mixed" and list(MIXED)[variant % len(MIXED)].startswith(("f16", "bf16", "int8")):
        L = [0, 1, 3, 300, 3000][draw(st.integers(0, 4))]
        fill = draw(st.booleans())
    grad = ""
    if kind in ("special", "rnn", "weak_scalar", "rows") and draw(st.integers(0, 2)) == 0:
        grad = ["grad", "value_and_grad"][draw(st.integers(0, 1))]
    api = kind in ("rnn", "weak_scalar") or draw(st.integers(0, 3)) == 0
    return edge_program(kind, L, variant, special, pos, grad, api, fill)
