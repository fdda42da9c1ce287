"""The values a Builder hands out: `Var` (a Graph Value plus its Builder, with Python operators),
the errors it raises, and the checks shared by its methods."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import jax
import numpy as np

from .. import _jax
from .graph import Graph, Value

if TYPE_CHECKING:  # types only: build.py imports this module
    from .build import Builder


Shape = Sequence[int]


class BuildError(TypeError):
    """A primitive was applied to operands it does not accept (shape, dtype, arity...)."""
    __module__ = "jaxform.ir.build"  # its public home (re-exported there): reprs and pickles as before the split


def _dtype(dtype) -> np.dtype:
    return jax.dtypes.canonicalize_dtype(np.dtype(dtype))


class Var:
    """A value being built: a Graph `Value` and the Builder it belongs to."""
    __module__ = "jaxform.ir.build"  # its public home (re-exported there): reprs and pickles as before the split
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
