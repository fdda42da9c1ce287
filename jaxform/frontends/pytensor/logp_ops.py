"""Converters of the ops PyMC's logp graphs and their gradients contain: indexing (subtensors and
increments, static and dynamic), arange, split, cumulative ops, parameter checks, diagonals,
Cholesky and triangular solves, Blockwise (vmapped core ops).
"""
from __future__ import annotations

import jax
import numpy as np

from ...ir.build import Builder, Var
from ...optimize import to_function
from .registry import CONVERTERS, ConversionError, _NoConverter, _lookup, _where, register
from .walk import _index_parts, _trace
from .ranges import _always_holds
from .tensor import _shape_of


def _register_pymc_ops(tb, st):
    """Ops PyMC's logp graphs and their gradients contain: indexing, linear algebra, checks, scans."""
    import importlib
    from jax import lax
    slinalg, extra_ops, raise_op = (importlib.import_module(f"pytensor.{m}")
                                    for m in ("tensor.slinalg", "tensor.extra_ops", "raise_op"))
    from pytensor.tensor.blockwise import Blockwise

    def index_of(node, idx):
        return _index_parts(st.indices_from_subtensor(idx, getattr(node.op, "idx_list", None)))

    def dyn_index(cv, x, parts, body):
        """Trace body(x, index) with the runtime parts of the index (Vars, also inside slices) as operands."""
        flat = []
        for p in parts:
            flat += [p.start, p.stop, p.step] if isinstance(p, slice) else [p]
        vars_ = [v for v in flat if isinstance(v, Var)]

        def fn(xv, *vals):
            it = iter(vals)
            pick = lambda v: next(it) if isinstance(v, Var) else v
            idx = tuple(slice(pick(p.start), pick(p.stop), pick(p.step)) if isinstance(p, slice) else pick(p)
                        for p in parts)
            return body(xv, idx[0] if len(idx) == 1 else idx)
        return cv.b.trace(fn, cv.value(x), *vars_)

    @register(getattr(st, "AdvancedSubtensor1", None), st.AdvancedSubtensor)
    def adv_subtensor(cv, node, x, *idx):
        return dyn_index(cv, x, index_of(node, idx), lambda xv, i: xv[i])

    @register(st.Subtensor)
    def subtensor(cv, node, x, *idx):
        index = st.indices_from_subtensor(idx, node.op.idx_list)
        static = _static_index(index)
        if static is not None:
            return cv.b.index(cv.value(x), static)
        return dyn_index(cv, x, _index_parts(index), lambda xv, i: xv[i])  # runtime bounds: dynamic_slice

    @register(getattr(st, "AdvancedIncSubtensor1", None), st.AdvancedIncSubtensor, st.IncSubtensor)
    def adv_inc_subtensor(cv, node, x, y, *idx):
        if type(node.op) is st.IncSubtensor:
            out = _inc_subtensor_static(cv, node, x, y, idx)
            if out is not None:
                return out
        dt = node.outputs[0].type.dtype
        return _scatter(cv, cv.value(x, dt), cv.value(y, dt), index_of(node, idx),
                        getattr(node.op, "set_instead_of_inc", False))

    @register(tb.AllocEmpty)
    def alloc_empty(cv, node, *shape):
        shape = tuple(int(cv.static(s, node, "the shape")) for s in shape)
        return cv.b.broadcast_to(cv.value(np.zeros((), node.outputs[0].type.dtype)), shape)

    @register(tb.ARange)
    def arange(cv, node, start, stop, step):
        vals = [cv.static(v, node, "the range") for v in (start, stop, step)]
        return np.arange(*vals, dtype=node.outputs[0].type.dtype)

    @register(tb.Split)
    def split(cv, node, x, *rest):
        # pytensor < 3.1: inputs (x, axis, splits); later: (x, splits) with the axis a property of the op
        if len(rest) == 2:
            axis, splits = int(cv.static(rest[0], node, "the axis")), rest[1]
        else:
            axis, splits = int(node.op.axis), rest[0]
        sizes = [int(s) for s in cv.static(splits, node, "the split sizes")]
        x = cv.value(x)
        axis %= x.ndim
        if len(sizes) != node.op.len_splits or any(n < 0 for n in sizes) or sum(sizes) != x.shape[axis]:
            raise ConversionError(f"jaxform: {_where(node)} splits axis {axis} of length {x.shape[axis]} into "
                                  f"sizes {sizes}, which must be {node.op.len_splits} non-negative sizes summing "
                                  "to that length. Fix the split sizes.")
        if len(sizes) > 1:
            return cv.b.bind("split", x, sizes=tuple(sizes), axis=axis)
        return [x]

    @register(extra_ops.CumOp)
    def cumop(cv, node, x):
        x = cv.value(x, node.outputs[0].type.dtype)
        axis = node.op.axis
        if axis is None:
            x, axis = cv.b.reshape(x, (int(np.prod(x.shape)),)), 0
        prim = "cumsum" if node.op.mode == "add" else "cumprod"
        return cv.b.bind(prim, x, axis=int(axis) % x.ndim, reverse=False)

    @register(raise_op.CheckAndRaise)
    def check(cv, node, x, *conds):
        # PyMC's parameter checks that may become -inf do so (PyMC's JAX rewrite does the same);
        # other checks cannot raise inside JAX and are dropped, as PyTensor's JAX backend drops them.
        if cv.checks == "drop" or not getattr(node.op, "can_be_replaced_by_ninf", False) or not conds:
            return x
        b, xv = cv.b, cv.value(x)
        ok = None
        for c, var in zip(conds, node.inputs[1:]):
            if not isinstance(c, Var) and np.all(c):
                continue  # known to hold (e.g. a constant scale > 0): no select
            if _always_holds(var):
                continue  # e.g. 0 <= sigmoid(eta) <= 1 (Bernoulli(logit_p)): a select per row for nothing
            c = cv.value(c)
            if c.value.is_literal and bool(c.value.literal):
                continue
            c = b.reduce_and(c if c.dtype == np.bool_ else b.ne(c, 0), tuple(range(c.ndim))) if c.ndim else \
                (c if c.dtype == np.bool_ else b.ne(c, 0))
            ok = c if ok is None else b.and_(ok, c)
        if ok is None:
            return xv
        return b.select_n(b.broadcast_to(ok, xv.shape), b.broadcast_to(b.const(np.array(-np.inf, xv.dtype)), xv.shape),
                          xv)

    @register(tb.ExtractDiag)
    def extract_diag(cv, node, x):
        op, b, x = node.op, cv.b, cv.value(x)
        a1, a2, k = op.axis1 % x.ndim, op.axis2 % x.ndim, int(op.offset)
        rest = [d for d in range(x.ndim) if d not in (a1, a2)]
        x = b.transpose(x, rest + [a1, a2])
        n, m = x.shape[-2:]
        count = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
        batch = tuple(x.shape[:-2])
        flat = b.reshape(x, batch + (n * m,))
        start = k if k >= 0 else -k * m
        if count == 0:
            return b.broadcast_to(b.const(np.zeros((), x.dtype)), batch + (0,))
        stop = start + (count - 1) * (m + 1) + 1
        return b.slice(flat, [0] * len(batch) + [start], list(batch) + [stop], [1] * len(batch) + [m + 1])

    if hasattr(tb, "AllocDiag"):
        @register(tb.AllocDiag)
        def alloc_diag(cv, node, x):
            op = node.op
            k = int(op.offset)
            dt = node.outputs[0].type.dtype
            xv = cv.value(x, dt)
            if k != 0 or xv.ndim != 1:
                raise _NoConverter
            b, n = cv.b, xv.shape[0]
            on = b.eq(b.iota(np.int32, (n, n), 0), b.iota(np.int32, (n, n), 1))
            return b.select_n(on, b.broadcast_to(b.const(np.zeros((), dt)), (n, n)),
                              b.broadcast_in_dim(xv, (n, n), (1,)))

    @register(slinalg.Cholesky)
    def cholesky(cv, node, x):
        dt = node.outputs[0].type.dtype
        lo = lax.linalg.cholesky
        lower = getattr(node.op, "lower", True)
        return _trace(cv, lambda a: lo(a, symmetrize_input=False) if lower else
                      _jnp().swapaxes(lo(a, symmetrize_input=False), -1, -2).conj(), cv.value(x, dt))

    @register(slinalg.SolveTriangular)
    def solve_triangular(cv, node, a, y):
        op = node.op
        if getattr(op, "trans", 0) not in (0, "N"):
            raise _NoConverter
        dt = node.outputs[0].type.dtype
        vec = op.b_ndim == 1

        def fn(av, yv):
            yv = yv[..., None] if vec else yv
            out = lax.linalg.triangular_solve(av, yv, left_side=True, lower=op.lower,
                                              unit_diagonal=op.unit_diagonal)
            return out[..., 0] if vec else out
        return _trace(cv, fn, cv.value(a, dt), cv.value(y, dt))

    @register(Blockwise)
    def blockwise(cv, node, *ins):
        """A core op with no batch dims converts as the core op; otherwise vmap of the core conversion."""
        core = node.op.core_op
        if type(core).__name__ == "Dot" and len(ins) == 2:
            dt = node.outputs[0].type.dtype
            return cv.b.matmul(cv.value(ins[0], dt), cv.value(ins[1], dt))
        conv = _lookup(CONVERTERS, type(core))
        if conv is None:
            raise _NoConverter
        core_node = node.op._create_dummy_core_node(node.inputs) if hasattr(node.op, "_create_dummy_core_node") \
            else None
        if core_node is None:
            raise _NoConverter
        batch = node.outputs[0].type.ndim - core_node.outputs[0].type.ndim
        if batch == 0:
            return conv(cv, core_node, *ins)
        # batch dims: convert the core op once, on core shapes, and vmap it over the broadcast batch
        core_nd = [c.type.ndim for c in core_node.inputs]
        bshape = tuple(np.broadcast_shapes(*[_shape_of(i)[:len(_shape_of(i)) - k] for i, k in zip(ins, core_nd)]))
        vals = [cv.b.broadcast_to(cv.value(i), bshape + tuple(_shape_of(i)[len(_shape_of(i)) - k:]))
                for i, k in zip(ins, core_nd)]
        sub = Builder()
        scv = type(cv)(sub, cv.checks)
        args = [sub.arg(tuple(v.shape[len(bshape):]), v.dtype) for v in vals]
        outs = conv(scv, core_node, *args)
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        cv.fallback += scv.fallback
        cv.fallback_ops += scv.fallback_ops
        f = to_function(sub.build([scv.value(o) for o in outs]))
        for _ in bshape:
            f = jax.vmap(f)
        res = cv.b.trace(f, *vals)
        return res if len(res) > 1 else res[0]



def _jnp():
    import jax.numpy as jnp
    return jnp


def _inc_subtensor_static(cv, node, x, y, idx):
    index = _static_index(_indices(node, idx))
    b, xv = cv.b, cv.value(x)
    if index is None or any(isinstance(t, slice) and t.indices(n)[2] != 1 for t, n in zip(index, xv.shape)):
        return None
    starts, sizes, keep = [], [], []
    for d, n in enumerate(xv.shape):
        t = index[d] if d < len(index) else slice(None)
        if isinstance(t, slice):
            lo, hi, _ = t.indices(n)
            starts.append(lo), sizes.append(max(hi - lo, 0)), keep.append(max(hi - lo, 0))
        else:
            starts.append(t % n), sizes.append(1)
    yv = b.broadcast_to(cv.value(y, xv.dtype), tuple(keep))
    yv = b.reshape(yv, sizes)
    if not node.op.set_instead_of_inc:
        yv = b.slice(xv, starts, [s + z for s, z in zip(starts, sizes)]) + yv
    return b.dynamic_update_slice(xv, yv, [b.const(s, np.int32) for s in starts])


def _indices(node, idx):
    from pytensor.tensor.subtensor import indices_from_subtensor
    return indices_from_subtensor(idx, getattr(node.op, "idx_list", None))


def _scatter(cv, x: Var, y: Var, parts, set_: bool):
    """x.at[index].set/add(y), traced to a scatter with runtime index parts as operands."""
    flat = []
    for p in parts:
        flat += [p.start, p.stop, p.step] if isinstance(p, slice) else [p]
    vars_ = [v for v in flat if isinstance(v, Var)]

    def fn(xv, yv, *vals):
        it = iter(vals)
        pick = lambda v: next(it) if isinstance(v, Var) else v
        idx = tuple(slice(pick(p.start), pick(p.stop), pick(p.step)) if isinstance(p, slice) else pick(p)
                    for p in parts)
        idx = idx[0] if len(idx) == 1 else idx
        return xv.at[idx].set(yv) if set_ else xv.at[idx].add(yv)
    return cv.b.trace(fn, x, y, *vars_)


def _static_index(index) -> tuple | None:
    """The index with Python ints/slices if every component is known, else None."""
    out = []
    for t in index:
        if isinstance(t, slice):
            parts = [t.start, t.stop, t.step]
            if any(isinstance(p, Var) for p in parts):
                return None
            out.append(slice(*[None if p is None else int(np.asarray(p)) for p in parts]))
        elif isinstance(t, Var) or np.ndim(t) != 0 or np.asarray(t).dtype == np.bool_:
            return None  # a runtime or array index: advanced indexing
        else:
            out.append(int(np.asarray(t)))
    return tuple(out)
