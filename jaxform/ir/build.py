"""Builder: construct a Graph directly, without tracing Python code.

A symbolic front end (PyTensor, a DSL, a code generator) already knows the
whole program, so re-tracing `jax.numpy` code is wasted work. `Builder`
appends primitives to a Graph one by one; each result's shape and dtype come
from the primitive's own abstract evaluation (the same rule JAX uses while
tracing), so a wrong shape fails right where it is built, naming the
primitive and the operands.

    b = Builder()
    x = b.arg((3, 4), "float32", name="x")
    w = b.arg((4,), "float32", name="w")
    y = b.tanh(x @ w) + 1.0
    f = jaxform.to_function(b.build(y))     # composes with jit, grad, vmap

Values are `Var` handles (a Graph `Value` plus its Builder) with arithmetic
operators. Loops and branches take sub-graphs: a Graph, or a function
`body(builder, *vars) -> vars` built on a nested Builder; outer Vars used
inside a body are captured as loop constants automatically.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _jax
from .graph import Graph, Node, Value
from .regions import regions_of

Shape = Sequence[int]


class BuildError(TypeError):
    """A primitive was applied to operands it does not accept (shape, dtype, arity...)."""


def _dtype(dtype) -> np.dtype:
    return jax.dtypes.canonicalize_dtype(np.dtype(dtype))


class Var:
    """A value being built: a Graph `Value` and the Builder it belongs to."""
    __slots__ = ("builder", "value")
    __array_priority__ = 100  # numpy scalars/arrays on the left defer to our operators

    def __init__(self, builder: "Builder", value: Value):
        self.builder, self.value = builder, value

    aval = property(lambda self: self.value.aval)
    shape = property(lambda self: tuple(self.value.aval.shape))
    dtype = property(lambda self: self.value.aval.dtype)
    ndim = property(lambda self: len(self.value.aval.shape))
    T = property(lambda self: self.builder.transpose(self, tuple(reversed(range(self.ndim)))))

    def __repr__(self):
        return f"Var<{self.builder.describe(self.value)}>"

    def __add__(self, o): return self.builder.add(self, o)
    def __radd__(self, o): return self.builder.add(o, self)
    def __sub__(self, o): return self.builder.sub(self, o)
    def __rsub__(self, o): return self.builder.sub(o, self)
    def __mul__(self, o): return self.builder.mul(self, o)
    def __rmul__(self, o): return self.builder.mul(o, self)
    def __truediv__(self, o): return self.builder.div(self, o)
    def __rtruediv__(self, o): return self.builder.div(o, self)
    def __pow__(self, o): return self.builder.pow(self, o)
    def __neg__(self): return self.builder.neg(self)
    def __matmul__(self, o): return self.builder.matmul(self, o)
    def __rmatmul__(self, o): return self.builder.matmul(o, self)
    def __lt__(self, o): return self.builder.lt(self, o)
    def __le__(self, o): return self.builder.le(self, o)
    def __gt__(self, o): return self.builder.gt(self, o)
    def __ge__(self, o): return self.builder.ge(self, o)
    def __getitem__(self, idx): return self.builder.index(self, idx)
    def reshape(self, *shape): return self.builder.reshape(self, shape[0] if len(shape) == 1 and
                                                           not isinstance(shape[0], int) else shape)
    def astype(self, dtype): return self.builder.convert(self, dtype)
    def sum(self, axes=None): return self.builder.reduce_sum(self, axes)


Operand = Any  # Var | Value | Python scalar | numpy/JAX array

_EVAL_CACHE: dict = {}  # (primitive, operand avals, params) -> result avals


def _unary(name: str, doc: str):
    def op(self, x: Operand) -> Var:
        return self.bind(name, x)
    op.__name__, op.__doc__ = name, doc
    return op


def _binary(name: str):
    def op(self, x: Operand, y: Operand) -> Var:
        x, y = self._pair(x, y)
        return self.bind(name, x, y)
    op.__name__, op.__doc__ = name, f"Elementwise `{name}` (equal shapes; a scalar operand broadcasts)."
    return op


class Builder:
    """Appends primitives to a Graph; call `build(outputs)` once at the end."""

    def __init__(self, *, parent: "Builder | None" = None):
        self.graph = Graph()
        self.parent = parent
        self._names: dict[int, str] = {}
        self._captured: dict[int, tuple[Var, Value]] = {}  # outer Value id -> (outer Var, our input)
        self._built = False

    # ---- values -----------------------------------------------------------------
    def arg(self, shape: Shape, dtype=np.float32, name: str | None = None) -> Var:
        """A new graph input of this shape and dtype (64-bit types need jax_enable_x64)."""
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise BuildError(f"jaxform.Builder.arg: shape must be non-negative ints, got {shape!r}"
                             f"{' for ' + repr(name) if name else ''} (symbolic dimensions are not supported)")
        v = self.graph.add_input(_jax.ShapedArray(tuple(int(d) for d in shape), _dtype(dtype)))
        return self._named(v, name)

    def const(self, value, dtype=None, name: str | None = None) -> Var:
        """A constant: scalars become inline literals, arrays graph constants."""
        arr = np.asarray(value, dtype=None if dtype is None else _dtype(dtype))
        if dtype is None and arr.dtype.kind in "biufc":
            arr = arr.astype(_dtype(arr.dtype))
        if arr.ndim == 0:
            return self._named(Graph.literal(arr[()], arr.dtype), name)
        # eagerly, even inside jit: under a trace jnp.asarray makes a tracer, and a graph kept (cached) past
        # that trace would hold it (UnexpectedTracerError when the graph runs under the next trace)
        with jax.ensure_compile_time_eval():
            arr = jax.numpy.asarray(arr)
        return self._named(self.graph.add_const(arr), name)

    def name(self, x: Var, name: str) -> Var:
        """Give `x` a name used in error messages."""
        self._names[x.value.id] = name
        return x

    def _axes(self, v: Value, axes, what: str, ndim: int | None = None) -> tuple[int, ...]:
        """Axes normalized to [0, ndim) as numpy does; out of range or repeated is a BuildError (never wrapped)."""
        ndim = v.aval.ndim if ndim is None else ndim
        axes = list(axes) if isinstance(axes, (tuple, list, range)) else [axes]
        out = []
        for a in axes:
            if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
                raise BuildError(f"jaxform.Builder.{what}: axis {a!r} is out of range for {self.describe(v)} "
                                 f"(rank {ndim}: axes are -{ndim}..{ndim - 1})" if ndim else
                                 f"jaxform.Builder.{what}: axis {a!r} given for the scalar {self.describe(v)}")
            out.append(int(a) % ndim)
        if len(set(out)) != len(out):
            raise BuildError(f"jaxform.Builder.{what}: repeated axis in {tuple(axes)} for {self.describe(v)}")
        return tuple(out)

    def describe(self, v: Value) -> str:
        """'x: f32[3,4]' or 'result of mul: f32[3]' for error messages."""
        what = self._names.get(v.id) or (f"result of {v.producer.prim.name}" if v.producer else
                                         f"literal {v.literal}" if v.is_literal else
                                         "constant" if v.is_const else "input")
        return f"{what}: {v.aval.str_short()}"

    def _named(self, v: Value, name):
        if name:
            self._names[v.id] = name
        return Var(self, v)

    def _value(self, x: Operand, like: Value | None = None) -> Value:
        """The Value of an operand; Python scalars take the dtype of `like` (the other operand)."""
        if isinstance(x, Var):
            if x.builder is self:
                return x.value
            return self._capture(x)
        if isinstance(x, Value):
            return x
        if isinstance(x, (bool, int, float, complex)) and like is not None:
            return Graph.literal(x, like.aval.dtype)
        if isinstance(x, (bool, int, float, complex, np.ndarray, np.generic, jax.Array)):
            return self.const(x).value
        raise BuildError(f"jaxform.Builder: cannot use a {type(x).__name__} as an operand")

    def _capture(self, x: Var) -> Value:
        """An outer builder's Var used in a body: becomes a body input fed by the outer value."""
        b = self.parent
        while b is not None and b is not x.builder:
            b = b.parent
        if b is None:
            raise BuildError(f"jaxform.Builder: {x!r} belongs to another Builder; "
                             "pass it as an operand instead")
        if x.value.id not in self._captured:
            v = self.graph.add_input(x.aval, index=len(self._captured))
            self._captured[x.value.id] = (x, v)
            if x.value.id in x.builder._names:
                self._names[v.id] = x.builder._names[x.value.id]
        return self._captured[x.value.id][1]

    def _pair(self, x, y):
        if isinstance(x, (Var, Value)) or not isinstance(y, (Var, Value)):
            xv = self._value(x)
            return xv, self._value(y, like=xv)
        yv = self._value(y)
        return self._value(x, like=yv), yv

    # ---- binding primitives ----------------------------------------------------------
    def bind(self, prim, *operands: Operand, **params) -> Var | list[Var]:
        """Apply a primitive (or its name); results' avals come from its abstract evaluation.

        Region params (scan's `jaxpr`, cond's `branches`, ...) may be Graphs or jaxprs.
        Returns one Var, or a list for multiple-result primitives.
        """
        if self._built:
            raise BuildError("jaxform.Builder: this builder already built its graph; start a new Builder")
        if isinstance(prim, str):
            prim = _jax.primitive(prim)
        values = [self._value(x) for x in operands]
        params = _jax.complete_params(prim, params)
        regions = {}
        for r in regions_of(prim.name):
            if r.param in params:
                p = params.pop(r.param)
                regions[r.name] = tuple(_as_graph(g) for g in p) if r.kind == "closed_tuple" else _as_graph(p)
        try:
            node = self._add(prim, values, params, regions)
        except Exception as e:
            ops = "\n".join(f"  operand {i} ({self.describe(v)})" for i, v in enumerate(values))
            shown = {k: v for k, v in params.items() if not isinstance(v, (Graph, _jax.ClosedJaxpr))}
            raise BuildError(f"jaxform.Builder: {prim.name} cannot take these operands: {e}\n{ops}"
                             + (f"\n  params: {shown}" if shown else "")) from None
        outs = [Var(self, o) for o in node.outputs]
        return outs if prim.multiple_results else outs[0]

    def _add(self, prim, values: list[Value], params: dict, regions: dict) -> Node:
        """Graph.add, with abstract evaluation memoized for region-free, effect-free nodes.

        Symbolic front ends repeat the same op on the same shapes many times
        (jax.numpy gets the same effect from its jit cache), so this halves build time.
        """
        if regions:
            return self.graph.add(prim, values, params, regions=regions)
        params = _jax.complete_params(prim, params)
        key = (prim, tuple(v.aval for v in values), tuple(sorted(params.items())))
        try:
            avals = _EVAL_CACHE.get(key)
        except TypeError:  # unhashable params
            return self.graph.add(prim, values, params)
        if avals is None:
            avals, effs = _jax.abstract_eval(prim, list(key[1]), params)
            if effs:
                return self.graph.add(prim, values, params)
            if len(_EVAL_CACHE) > 100_000:
                _EVAL_CACHE.clear()
            _EVAL_CACHE[key] = avals
        return self.graph.append(Node(prim, values, avals, params))

    # elementwise --------------------------------------------------------------
    add, sub, mul, div, rem, pow = (_binary(n) for n in ("add", "sub", "mul", "div", "rem", "pow"))
    max, min, atan2, nextafter = (_binary(n) for n in ("max", "min", "atan2", "nextafter"))
    eq, ne, lt, le, gt, ge = (_binary(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
    and_, or_, xor = (_binary(n) for n in ("and", "or", "xor"))
    neg, not_, sign, abs = (_unary(n, f"Elementwise `{n}`.") for n in ("neg", "not", "sign", "abs"))
    floor, ceil, is_finite = (_unary(n, f"Elementwise `{n}`.") for n in ("floor", "ceil", "is_finite"))
    exp, log, log1p, expm1 = (_unary(n, f"Elementwise `{n}`.") for n in ("exp", "log", "log1p", "expm1"))
    exp2, sqrt, rsqrt, cbrt = (_unary(n, f"Elementwise `{n}`.") for n in ("exp2", "sqrt", "rsqrt", "cbrt"))
    sin, cos, tan, tanh = (_unary(n, f"Elementwise `{n}`.") for n in ("sin", "cos", "tan", "tanh"))
    asin, acos, atan = (_unary(n, f"Elementwise `{n}`.") for n in ("asin", "acos", "atan"))
    sinh, cosh, asinh, acosh, atanh = (_unary(n, f"Elementwise `{n}`.")
                                       for n in ("sinh", "cosh", "asinh", "acosh", "atanh"))
    logistic, erf, erfc, erf_inv = (_unary(n, f"Elementwise `{n}`.") for n in ("logistic", "erf", "erfc", "erf_inv"))
    lgamma, digamma, square = (_unary(n, f"Elementwise `{n}`.") for n in ("lgamma", "digamma", "square"))

    def integer_pow(self, x: Operand, y: int) -> Var:
        return self.bind("integer_pow", x, y=int(y))

    def round(self, x: Operand, *, to_even: bool = True) -> Var:
        from jax.lax import RoundingMethod
        return self.bind("round", x, rounding_method=RoundingMethod.TO_NEAREST_EVEN if to_even
                         else RoundingMethod.AWAY_FROM_ZERO)

    def convert(self, x: Operand, dtype) -> Var:
        """Cast to `dtype` (no-op if it already has it)."""
        v, dtype = self._value(x), _dtype(dtype)
        if v.aval.dtype == dtype:
            return Var(self, v) if not isinstance(x, Var) or x.builder is not self else x
        if v.is_literal and _exact_cast(v.literal, v.aval.dtype, dtype):
            return Var(self, Graph.literal(np.asarray(v.literal, v.aval.dtype).astype(dtype)[()], dtype))
        return self.bind("convert_element_type", v, new_dtype=dtype, weak_type=False)

    def select_n(self, which: Operand, *cases: Operand) -> Var:
        """cases[which] elementwise (`which` bool or int32, same shape as the cases or scalar)."""
        first = next((self._value(c) for c in cases if isinstance(c, (Var, Value))), None)
        wv, vals = self._value(which), [self._value(c, like=first) for c in cases]
        shape = max([v.aval.shape for v in vals + [wv]], key=len)
        vals = [self.broadcast_to(v, shape).value if v.aval.ndim == 0 else v for v in vals]  # scalars broadcast
        return self.bind("select_n", wv, *vals)

    def where(self, pred: Operand, x: Operand, y: Operand) -> Var:
        """x where pred else y (numpy's argument order)."""
        return self.select_n(pred, y, x)

    def clamp(self, lo: Operand, x: Operand, hi: Operand) -> Var:
        xv = self._value(x)
        return self.bind("clamp", self._value(lo, like=xv), xv, self._value(hi, like=xv))

    # shapes ------------------------------------------------------------------------
    def broadcast_in_dim(self, x: Operand, shape: Shape, dims: Sequence[int]) -> Var:
        return self.bind("broadcast_in_dim", x, shape=tuple(shape), broadcast_dimensions=tuple(dims))

    def broadcast_to(self, x: Operand, shape: Shape) -> Var:
        """numpy-style broadcast (trailing dims aligned, size-1 dims stretched)."""
        v = self._value(x)
        shape, s = tuple(shape), tuple(v.aval.shape)
        if s == shape:
            return Var(self, v)
        lead = len(shape) - len(s)
        if lead < 0 or any(d not in (1, t) for d, t in zip(s, shape[lead:])):
            raise BuildError(f"jaxform.Builder: cannot broadcast {self.describe(v)} to shape {shape}")
        keep = [i for i, d in enumerate(s) if d == shape[lead + i]]
        if len(keep) != len(s):
            v = self.reshape(v, [s[i] for i in keep]).value
        return self.broadcast_in_dim(v, shape, [lead + i for i in keep])

    def reshape(self, x: Operand, shape: Shape) -> Var:
        v = self._value(x)
        shape = list(shape)
        if shape.count(-1) == 1:
            known = int(np.prod([d for d in shape if d != -1]))
            shape[shape.index(-1)] = int(np.prod(v.aval.shape)) // max(known, 1)
        p = v.producer
        if p is not None and p.prim.name == "reshape" and p.params.get("dimensions") is None and \
                p.inputs[0].aval.dtype == v.aval.dtype:
            v = p.inputs[0]  # a reshape of a reshape is one reshape (the first becomes dead if unused)
        if tuple(shape) == tuple(v.aval.shape):
            return Var(self, v)
        if int(np.prod(shape)) != int(np.prod(v.aval.shape)):
            raise BuildError(f"jaxform.Builder: reshape cannot turn {self.describe(v)} into shape {tuple(shape)}")
        return self.bind("reshape", v, new_sizes=tuple(int(d) for d in shape), dimensions=None)

    def transpose(self, x: Operand, perm: Sequence[int]) -> Var:
        if tuple(perm) == tuple(range(len(perm))):
            return x if isinstance(x, Var) and x.builder is self else Var(self, self._value(x))
        return self.bind("transpose", x, permutation=tuple(perm))

    def expand_dims(self, x: Operand, axes: Sequence[int]) -> Var:
        v = self._value(x)
        axes = sorted(self._axes(v, axes, "expand_dims", v.aval.ndim + len(axes)))
        shape = list(v.aval.shape)
        for a in axes:
            shape.insert(a, 1)
        return self.reshape(v, shape)

    def squeeze(self, x: Operand, axes: Sequence[int]) -> Var:
        v = self._value(x)
        dims = self._axes(v, axes, "squeeze")
        if any(v.aval.shape[d] != 1 for d in dims):
            raise BuildError(f"jaxform.Builder.squeeze: axes {tuple(axes)} of {self.describe(v)} are not all size 1")
        return self.bind("squeeze", v, dimensions=dims)

    def concatenate(self, xs: Sequence[Operand], axis: int) -> Var:
        vals = [self._value(x) for x in xs]
        return self.bind("concatenate", *vals, dimension=self._axes(vals[0], axis, "concatenate")[0])

    def slice(self, x: Operand, start: Shape, limit: Shape, strides: Shape | None = None) -> Var:
        return self.bind("slice", x, start_indices=tuple(start), limit_indices=tuple(limit),
                         strides=None if strides is None else tuple(strides))

    def dynamic_slice(self, x: Operand, starts: Sequence[Operand], sizes: Shape) -> Var:
        return self.bind("dynamic_slice", x, *[self.convert(s, np.int32) for s in starts],
                         slice_sizes=tuple(sizes))

    def dynamic_update_slice(self, x: Operand, update: Operand, starts: Sequence[Operand]) -> Var:
        return self.bind("dynamic_update_slice", x, update, *[self.convert(s, np.int32) for s in starts])

    def rev(self, x: Operand, dims: Sequence[int]) -> Var:
        return self.bind("rev", x, dimensions=tuple(dims))

    def pad(self, x: Operand, value: Operand, config: Sequence[tuple[int, int, int]]) -> Var:
        xv = self._value(x)
        return self.bind("pad", xv, self._value(value, like=xv), padding_config=tuple(map(tuple, config)))

    def iota(self, dtype, shape: Shape, dimension: int = 0) -> Var:
        return self.bind("iota", dtype=_dtype(dtype), shape=tuple(shape), dimension=dimension, sharding=None)

    def index(self, x: Operand, idx) -> Var:
        """Basic indexing: ints, slices (any step), None, Ellipsis; static only."""
        v = self._value(x)
        idx = idx if isinstance(idx, tuple) else (idx,)
        if Ellipsis in idx:
            i = idx.index(Ellipsis)
            fill = v.aval.ndim - sum(1 for t in idx if t is not None and t is not Ellipsis)
            idx = idx[:i] + (slice(None),) * fill + idx[i + 1:]
        start, limit, strides, flip, out_shape, dim = [], [], [], [], [], 0
        for t in idx:
            if t is None:
                out_shape.append(("new", None))
                continue
            n = v.aval.shape[dim]
            if isinstance(t, (int, np.integer)):
                if not -n <= t < n:
                    raise BuildError(f"jaxform.Builder: index {t} out of range for axis {dim} of {self.describe(v)}")
                t = int(t) % n
                start.append(t), limit.append(t + 1), strides.append(1)
            elif isinstance(t, slice):
                lo, hi, st = t.indices(n)
                if st < 0:  # x[a:b:-s] == rev(x)[n-1-a : n-1-b : s]
                    flip.append(dim)
                    lo, hi, st = n - 1 - lo, n - 1 - hi, -st
                cnt = max(0, -(-(hi - lo) // st))
                start.append(lo), limit.append(lo + max(cnt - 1, 0) * st + (1 if cnt else 0)), strides.append(st)
                out_shape.append(("keep", dim))
            else:
                raise BuildError(f"jaxform.Builder.index: only static ints/slices/None/..., got {type(t).__name__}"
                                 " (use b.bind('gather', ...) or b.trace(fn, ...) for array indices)")
            dim += 1
        for d in range(dim, v.aval.ndim):
            start.append(0), limit.append(v.aval.shape[d]), strides.append(1), out_shape.append(("keep", d))
        if flip:
            v = self.rev(v, flip).value
        if start != [0] * len(start) or limit != list(v.aval.shape) or strides != [1] * len(strides):
            v = self.slice(v, start, limit, None if all(s == 1 for s in strides) else strides).value
        shape = [1 if k == "new" else v.aval.shape[d] for k, d in out_shape]
        return self.reshape(v, shape)

    # reductions and contractions ---------------------------------------------------
    def _reduce(self, name: str, x: Operand, axes) -> Var:
        v = self._value(x)
        axes = range(v.aval.ndim) if axes is None else axes
        return self.bind(name, v, axes=tuple(sorted(self._axes(v, axes, name))))

    def reduce_sum(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_sum", x, axes)

    def reduce_max(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_max", x, axes)

    def reduce_min(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_min", x, axes)

    def reduce_prod(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_prod", x, axes)

    def reduce_and(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_and", x, axes)

    def reduce_or(self, x: Operand, axes: int | Sequence[int] | None = None) -> Var:
        return self._reduce("reduce_or", x, axes)

    def argmax(self, x: Operand, axis: int, index_dtype=np.int32) -> Var:
        v = self._value(x)
        return self.bind("argmax", v, axes=self._axes(v, axis, "argmax"), index_dtype=_dtype(index_dtype))

    def argmin(self, x: Operand, axis: int, index_dtype=np.int32) -> Var:
        v = self._value(x)
        return self.bind("argmin", v, axes=self._axes(v, axis, "argmin"), index_dtype=_dtype(index_dtype))

    def dot_general(self, x: Operand, y: Operand, contract: tuple[Sequence[int], Sequence[int]],
                    batch: tuple[Sequence[int], Sequence[int]] = ((), ()), preferred_element_type=None) -> Var:
        """lax.dot_general: result dims are batch, x's free dims, y's free dims."""
        xv, yv = self._value(x), self._value(y)
        dn = ((tuple(contract[0]), tuple(contract[1])), (tuple(batch[0]), tuple(batch[1])))
        pet = preferred_element_type
        if pet is None and xv.aval.dtype == yv.aval.dtype:
            pet = xv.aval.dtype
        return self.bind("dot_general", xv, yv, dimension_numbers=dn, precision=None,
                         preferred_element_type=None if pet is None else _dtype(pet), out_sharding=None)

    def dot(self, x: Operand, y: Operand) -> Var:
        """numpy.dot for 1-D and 2-D operands (scalars multiply)."""
        xv, yv = self._value(x), self._value(y)
        if xv.aval.ndim == 0 or yv.aval.ndim == 0:
            return self.mul(xv, yv)
        if xv.aval.ndim > 2 or yv.aval.ndim > 2:
            raise BuildError(f"jaxform.Builder.dot: operands must be 1-D or 2-D, got {self.describe(xv)} and "
                             f"{self.describe(yv)}; use matmul or dot_general")
        return self.dot_general(xv, yv, ((xv.aval.ndim - 1,), (0,)))

    def matmul(self, x: Operand, y: Operand) -> Var:
        """numpy.matmul: batch dims broadcast, 1-D operands promoted and squeezed back."""
        xv, yv = self._value(x), self._value(y)
        if xv.aval.ndim <= 2 and yv.aval.ndim <= 2:
            return self.dot(xv, yv)
        xs, ys = xv.aval.shape, yv.aval.shape
        vx = xv if len(xs) > 1 else self.reshape(xv, (1,) + tuple(xs)).value
        vy = yv if len(ys) > 1 else self.reshape(yv, tuple(ys) + (1,)).value
        bx, by = vx.aval.shape[:-2], vy.aval.shape[:-2]
        batch = tuple(np.broadcast_shapes(bx, by))
        vx = self.broadcast_to(vx, batch + vx.aval.shape[-2:]).value
        vy = self.broadcast_to(vy, batch + vy.aval.shape[-2:]).value
        nb = len(batch)
        out = self.dot_general(vx, vy, ((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb))))
        shape = list(out.shape)
        if len(ys) == 1:
            shape.pop(-1)
        if len(xs) == 1:
            shape.pop(-2 if len(ys) > 1 else -1)
        return self.reshape(out, shape)

    # control flow ---------------------------------------------------------------
    def _region(self, body, in_avals, what: str) -> tuple[Graph, list[Var]]:
        """A sub-graph taking `in_avals` (+ leading captured inputs), and the outer Vars it captured."""
        if callable(body) and not isinstance(body, Graph):
            sub = Builder(parent=self)
            args = [Var(sub, sub.graph.add_input(a)) for a in in_avals]
            out = body(sub, *args)
            g = sub.build(list(out) if isinstance(out, (list, tuple)) else [out])
            captured = [x for x, _ in sub._captured.values()]
        else:
            g, captured = _as_graph(body).copy(), []
            got = [a.strip_weak_type() for a in g.in_avals]
            want = [a.strip_weak_type() for a in in_avals]
            if got != want:
                raise BuildError(f"jaxform.Builder: {what} takes {_avals(got)} but must take {_avals(want)}")
        # constants inside a body become leading operands (loop constants), like JAX's tracing does
        for i, c in enumerate(list(g.consts)):
            v = g.add_input(c.aval, index=len(captured))
            g.replace_uses(c, v)
            captured.append(Var(self, self.graph.add_const(c.const)))
        g.consts = []
        g.in_tree = g.out_tree = None
        return g, captured

    def scan(self, body, consts: Sequence[Operand], init: Sequence[Operand], xs: Sequence[Operand],
             length: int | None = None, reverse: bool = False, unroll: int = 1) -> tuple[list[Var], list[Var]]:
        """lax.scan over the leading axis of `xs`: body(consts..., carry..., x...) -> (carry..., y...).

        Returns (final carry, stacked ys) as lists of Vars.
        """
        consts, init, xs = ([self._value(v) for v in vs] for vs in (consts, init, xs))
        lengths = {v.aval.shape[0] for v in xs if v.aval.ndim}
        if any(v.aval.ndim == 0 for v in xs):
            raise BuildError("jaxform.Builder.scan: xs must have a leading axis to scan over")
        if length is None:
            if len(lengths) != 1:
                raise BuildError("jaxform.Builder.scan: give length= (no xs)" if not lengths else
                                 f"jaxform.Builder.scan: xs have different leading sizes {sorted(lengths)}")
            length = lengths.pop()
        elif lengths - {length}:
            raise BuildError(f"jaxform.Builder.scan: length={length} but xs have leading sizes {sorted(lengths)}")
        x_avals = [v.aval.update(shape=v.aval.shape[1:]) for v in xs]
        g, captured = self._region(body, [v.aval for v in consts + init] + x_avals, "the scan body")
        carry_in = [v.aval.strip_weak_type() for v in init]
        carry_out = [a.strip_weak_type() for a in g.out_avals[:len(init)]]
        if carry_in != carry_out:
            raise BuildError(f"jaxform.Builder.scan: the body returns carry {_avals(carry_out)} "
                             f"but the carry is {_avals(carry_in)}; they must match")
        ops = [self._value(c) for c in captured] + consts + init + xs
        outs = self.bind("scan", *ops, jaxpr=g, length=int(length), reverse=bool(reverse), unroll=int(unroll),
                         num_consts=len(captured) + len(consts), num_carry=len(init))
        return outs[:len(init)], outs[len(init):]

    def cond(self, index: Operand, branches: Sequence, *operands: Operand) -> list[Var]:
        """branches[index](*operands) (like lax.switch: an int index is clamped; a bool picks 1 for True)."""
        iv = self._value(index)
        if iv.aval.shape != ():
            raise BuildError(f"jaxform.Builder.cond: the index must be a scalar, got {self.describe(iv)}")
        if iv.aval.dtype == np.bool_:
            iv = self.convert(iv, np.int32).value
        else:
            iv = self.convert(iv, np.int32).value
            if len(branches) > 1:
                iv = self.clamp(0, iv, len(branches) - 1).value
        ops = [self._value(o) for o in operands]
        regions = [self._region(br, [o.aval for o in ops], f"cond branch {i}") for i, br in enumerate(branches)]
        outs = [[a.strip_weak_type() for a in g.out_avals] for g, _ in regions]
        for i, o in enumerate(outs[1:], 1):
            if o != outs[0]:
                raise BuildError(f"jaxform.Builder.cond: branch {i} returns {_avals(o)} but branch 0 returns "
                                 f"{_avals(outs[0])}; all branches must return the same types")
        # every branch takes every branch's captured values as leading operands
        extra = [c for _, cap in regions for c in cap]
        graphs, offset = [], 0
        for g, cap in regions:
            for j, c in enumerate(extra):
                if not offset <= j < offset + len(cap):
                    g.add_input(c.aval, index=j)
            offset += len(cap)
            graphs.append(g)
        return self.bind("cond", iv, *[self._value(c) for c in extra], *ops, branches=tuple(graphs))

    def while_loop(self, cond, body, init: Sequence[Operand]) -> list[Var]:
        """lax.while_loop: cond(carry...) -> bool[], body(carry...) -> carry...; returns the final carry."""
        init = [self._value(v) for v in init]
        avals = [v.aval for v in init]
        cg, ccap = self._region(cond, avals, "the while cond")
        if len(cg.outputs) != 1 or cg.out_avals[0].shape != () or cg.out_avals[0].dtype != np.bool_:
            raise BuildError(f"jaxform.Builder.while_loop: cond must return one bool[] scalar, "
                             f"got {_avals(cg.out_avals)}")
        bg, bcap = self._region(body, avals, "the while body")
        got = [a.strip_weak_type() for a in bg.out_avals]
        if got != [a.strip_weak_type() for a in avals]:
            raise BuildError(f"jaxform.Builder.while_loop: the body returns {_avals(got)} but the carry is "
                             f"{_avals(avals)}; they must match")
        ops = [self._value(c) for c in ccap + bcap] + init
        return self.bind("while", *ops, cond_jaxpr=cg, body_jaxpr=bg,
                         cond_nconsts=len(ccap), body_nconsts=len(bcap))

    # splicing whole programs ---------------------------------------------------------
    def call(self, graph: Graph, *operands: Operand) -> list[Var]:
        """Inline a copy of `graph` applied to `operands`; returns its outputs."""
        g = _as_graph(graph)
        vals = [self._value(o) for o in operands]
        got, want = [v.aval.strip_weak_type() for v in vals], [a.strip_weak_type() for a in g.in_avals]
        if got != want:
            raise BuildError(f"jaxform.Builder.call: the graph takes {_avals(want)}, got {_avals(got)}")
        return self._splice(g.to_jaxpr(), vals)

    def trace(self, fn: Callable, *operands: Operand, **static) -> Any:
        """Trace a JAX function on these operands and splice its equations in.

        The escape hatch for what has no convenience method: returns fn's output
        pytree with Vars as leaves. `static` keyword arguments are passed through.
        """
        vals = [self._value(o) for o in operands]
        structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in vals]
        closed, out_shape = jax.make_jaxpr(lambda *a: fn(*a, **static), return_shape=True)(*structs)
        outs = self._splice(closed, vals)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    def _splice(self, closed, vals: Sequence[Value]) -> list[Var]:
        g = Graph.from_jaxpr(closed)
        for v_in, v in zip(g.inputs, vals):
            g.replace_uses(v_in, v)
        self.graph.consts.extend(g.consts)
        outs = list(g.outputs)
        g.set_outputs([])
        for n in g.nodes:
            self.graph.append(n)
        return [Var(self, o) for o in outs]

    # finishing ----------------------------------------------------------------
    def build(self, outputs) -> Graph:
        """The finished Graph computing `outputs` (a Var or a list/tuple of them).

        Nodes that do not contribute to an output are dropped. `to_function` of
        the result returns a single array for a single Var, else a list/tuple.
        """
        if self._built:
            raise BuildError("jaxform.Builder: build() was already called on this builder")
        single = not isinstance(outputs, (list, tuple))
        outs = [outputs] if single else list(outputs)
        values = []
        for i, o in enumerate(outs):
            if isinstance(o, Var) and o.builder is not self and self.parent is None:
                raise BuildError(f"jaxform.Builder.build: output {i} ({o!r}) belongs to another Builder")
            values.append(self._value(o))
        g = self.graph
        g.set_outputs(values)
        live, stack = set(), [v.producer for v in values if v.producer is not None]
        stack += [n for n in g.nodes if n.effects]
        while stack:
            n = stack.pop()
            if id(n) not in live:
                live.add(id(n))
                stack.extend(v.producer for v in n.inputs if v.producer is not None)
        for n in reversed(g.nodes):
            if id(n) not in live:
                g.remove(n)
        used = {id(v) for n in g.nodes for v in n.inputs} | {id(v) for v in values}
        g.consts = [c for c in g.consts if id(c) in used]
        g.in_tree = jax.tree_util.tree_structure((tuple(0 for _ in g.inputs), {}))
        g.out_tree = jax.tree_util.tree_structure(0 if single else type(outputs)(0 for _ in outs))
        self._built = True
        return g


def _exact_cast(value, src: np.dtype, dst: np.dtype) -> bool:
    """Whether numpy casts this scalar literal exactly as XLA's convert does: to a float from a bool, int or
    float (round to nearest even), or to an int from a bool or an int it fits in; not float -> int (NaN,
    overflow) nor to/from complex."""
    if dst.kind == "f" and src.kind in "biuf":
        return True
    if dst.kind in "iu" and src.kind in "biu":
        return np.iinfo(dst).min <= int(value) <= np.iinfo(dst).max
    return dst.kind == "b" and src.kind == "b"


def _as_graph(x) -> Graph:
    if isinstance(x, Graph):
        return x
    if isinstance(x, _jax.ClosedJaxpr):
        return Graph.from_jaxpr(x)
    if isinstance(x, _jax.Jaxpr):
        return Graph.from_jaxpr(x, ())
    raise BuildError(f"jaxform.Builder: expected a Graph (or jaxpr) for a sub-program, got {type(x).__name__}")


def _avals(avals) -> str:
    return "(" + ", ".join(a.str_short() for a in avals) + ")"
