"""Converters of the tensor ops every graph has: Elemwise (through the scalar ops), DimShuffle,
reductions, dot, softmax and logsumexp, shapes, reshape, alloc, join, make_vector.
"""
from __future__ import annotations

import jax
import numpy as np

from ...ir.build import Var
from .registry import Known, _NoConverter, register
from .walk import Converter
from .scalar import _scalar_op


def _register_tensor_ops():
    """Tensor ops of every graph: elementwise, reductions, dot, softmax, shapes, alloc, join. Returns PyTensor's
    basic and subtensor modules (the indexing converters need them)."""
    from pytensor.compile.ops import DeepCopyOp, TypeCastingOp
    import importlib
    # by module path: the attribute pytensor.tensor.shape is a function, not the module
    tb, te, ts, special, st = (importlib.import_module(f"pytensor.tensor.{m}")
                               for m in ("basic", "elemwise", "shape", "special", "subtensor"))
    from pytensor.tensor.blockwise import Blockwise
    from pytensor.tensor.math import Dot

    register(TypeCastingOp, DeepCopyOp, ts.SpecifyShape, tb.TensorFromScalar, tb.ScalarFromTensor)(
        lambda cv, node, x, *rest: x)

    @register(te.Elemwise)
    def elemwise(cv, node, *ins):
        shape = tuple(np.broadcast_shapes(*[np.shape(i) if not isinstance(i, Var) else i.shape for i in ins]))
        vals = [_small_literal(cv, i) for i in ins]
        outs = _scalar_op(cv, node.op.scalar_op, vals, [o.type.dtype for o in node.outputs], node)
        outs = [cv.b.broadcast_to(o, shape) for o in outs]
        return outs if len(outs) > 1 else outs[0]

    @register(te.DimShuffle)
    def dimshuffle(cv, node, x):
        op, x = node.op, cv.value(x)
        x = cv.b.transpose(x, tuple(op.shuffle) + tuple(op.drop))
        shape = list(x.shape[:len(op.shuffle)])
        for a in op.augment:
            shape.insert(a, 1)
        return cv.b.reshape(x, shape)

    @register(te.CAReduce)
    def careduce(cv, node, x):
        op, b = node.op, cv.b
        name = _REDUCERS.get(type(op.scalar_op).__name__)
        if name is None:
            raise _NoConverter
        x = cv.value(x)
        if type(op).__name__ in ("All", "Any") and x.dtype != np.bool_:
            x = b.ne(x, 0)
        acc = getattr(op, "acc_dtype", None) or node.outputs[0].type.dtype
        if name in ("reduce_and", "reduce_or") and x.dtype != np.bool_:
            raise _NoConverter  # bitwise reductions of ints: leave to the fallback
        axes = tuple(range(x.ndim) if op.axis is None else op.axis)
        if all(x.shape[a] == 1 for a in axes):  # over no axes or size-1 axes (PyMC's scalar logps): a reshape
            keep = [n for d, n in enumerate(x.shape) if d not in {a % x.ndim for a in axes}]
            return b.convert(b.reshape(b.convert(x, acc), keep), node.outputs[0].type.dtype)
        return b.convert(getattr(b, name)(b.convert(x, acc), axes), node.outputs[0].type.dtype)

    @register(Dot)
    def dot(cv, node, x, y):
        dt = node.outputs[0].type.dtype
        return cv.b.dot(cv.value(x, dt), cv.value(y, dt))

    @register(special.Softmax, special.LogSoftmax)
    def softmax(cv, node, x):
        b, x = cv.b, cv.value(x)
        axes = tuple(range(x.ndim)) if node.op.axis is None else tuple(
            np.atleast_1d(node.op.axis).tolist())
        m = b.reduce_max(x, axes)
        keep = [1 if d in [a % x.ndim for a in axes] else s for d, s in enumerate(x.shape)]
        z = x - b.broadcast_to(b.reshape(m, keep), x.shape)
        e = b.exp(z)
        s = b.broadcast_to(b.reshape(b.reduce_sum(e, axes), keep), x.shape)
        return e / s if isinstance(node.op, special.Softmax) else z - b.log(s)

    if hasattr(special, "LogSumExp"):  # pytensor >= 3: an op (before, log(sum(exp(x))) stabilized by rewrites)
        @register(special.LogSumExp)
        def logsumexp(cv, node, x):
            """max + log(sum(exp(x - max))), max held constant for autodiff (its total derivative is 0):
            jax.nn.logsumexp's form, whose gradient is softmax(x) as PyTensor's pullback."""
            b, dt = cv.b, node.outputs[0].type.dtype
            x = cv.value(x, dt)
            axes = tuple(range(x.ndim)) if node.op.axis is None else tuple(int(a) % x.ndim for a in node.op.axis)
            keep = [1 if d in axes else n for d, n in enumerate(x.shape)]
            if not axes:
                return x
            m = b.reduce_max(x, axes)
            m = b.select_n(b.eq(b.abs(m), b.const(np.array(np.inf, dt))), m, b.const(np.array(0.0, dt)))
            m = b.trace(jax.lax.stop_gradient, m)   # all -inf (or +inf): no offset, as PyTensor's inner graph
            s = b.reduce_sum(b.exp(x - b.broadcast_to(b.reshape(m, keep), x.shape)), axes)
            return b.log(s) + m

    @register(ts.Shape)
    def shape(cv, node, x):
        return np.asarray(_shape_of(x), dtype=node.outputs[0].type.dtype)

    @register(ts.Shape_i)
    def shape_i(cv, node, x):
        return np.asarray(_shape_of(x)[node.op.i], dtype=node.outputs[0].type.dtype)

    @register(ts.Reshape)
    def reshape(cv, node, x, shape):
        return cv.b.reshape(cv.value(x), [int(d) for d in cv.static(shape, node, "the target shape")])

    @register(tb.Alloc)
    def alloc(cv, node, value, *shape):
        shape = tuple(int(cv.static(s, node, "the shape")) for s in shape)
        return cv.b.broadcast_to(cv.value(value, node.outputs[0].type.dtype), shape)

    @register(tb.Join)
    def join(cv, node, *inputs):
        # pytensor <= 3.0: the axis is the first (symbolic) input; later versions: a property of the op
        if getattr(node.op, "axis", None) is not None:
            axis, xs = node.op.axis, inputs
        else:
            axis, xs = int(cv.static(inputs[0], node, "the axis")), inputs[1:]
        dt = node.outputs[0].type.dtype
        if len(xs) == 1:
            return cv.value(xs[0], dt)
        return cv.b.concatenate([cv.value(x, dt) for x in xs], axis)

    @register(tb.MakeVector)
    def make_vector(cv, node, *xs):
        dt = node.outputs[0].type.dtype
        if not xs:
            return np.zeros((0,), dt)
        if len(xs) == 1:
            return cv.b.reshape(cv.value(xs[0], dt), (1,))
        return cv.b.concatenate([cv.b.reshape(cv.value(x, dt), (1,)) for x in xs], 0)

    return tb, st


_REDUCERS = {"Add": "reduce_sum", "Mul": "reduce_prod", "ScalarMaximum": "reduce_max", "Maximum": "reduce_max",
             "ScalarMinimum": "reduce_min", "Minimum": "reduce_min", "AND": "reduce_and", "OR": "reduce_or"}


def _shape_of(x) -> tuple:
    return tuple(x.shape) if isinstance(x, Var) else np.shape(x)


def _small_literal(cv: Converter, x: Known) -> Var:
    """Known single-element operands become scalar literals (lax ops broadcast rank-0 operands)."""
    if not isinstance(x, Var) and np.size(x) == 1:
        return cv.value(np.asarray(x).reshape(()))
    return cv.value(x)
