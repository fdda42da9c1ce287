"""The Builder's array operations (elementwise, casts and selects, shapes, indexing, reductions,
contractions), a mixin of `Builder`: each binds primitives through `self.bind`."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .graph import Graph, Value
from .build_var import BuildError, Operand, Shape, Var, _dtype, _exact_cast


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


class ArrayOps:
    """The Builder's array operations: each binds one primitive (or a few) through `self.bind`."""

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
