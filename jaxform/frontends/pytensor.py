"""PyTensor graphs → jaxform Graphs, built directly with the Builder (seed 004).

PyTensor already holds the whole program as a graph, so there is no need to
generate `jax.numpy` code and trace it again: each PyTensor op is turned into
JAX primitives by a converter from `CONVERTERS` (keyed by op class, looked up
along the MRO). Elementwise scalar ops, including the fused `Composite` ones,
come from `SCALARS`. An op with no converter falls back to PyTensor's own
JAX dispatch (`jax_funcify`), traced on the operand avals and spliced in, so
any graph PyTensor's JAX backend runs converts.

Shapes are static: inputs need static shapes (`pt.tensor(shape=(3, 4))`) or
`shapes=`; integer values that only depend on shapes (`x.shape[0] * 2`) are
folded at conversion time, so reshape/alloc targets become static too.

    import pytensor.tensor as pt
    from jaxform.frontends import pytensor as jpt
    x = pt.tensor("x", shape=(3, 4))
    f = jpt.function([x], pt.exp(x).sum())    # jitted; composes with grad/vmap
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from ..ir import Graph
from ..ir.build import Builder, BuildError, Var
from ..ir.graph import gc_paused
from ..optimize import to_function


class ConversionError(TypeError):
    """A PyTensor graph cannot be turned into a static JAX graph (and why)."""


# ---- registries ------------------------------------------------------------------

CONVERTERS: dict[type, Callable] = {}   # op class -> conv(cv, node, *inputs) -> Var | list
SCALARS: dict[str, Callable] = {}       # scalar op class name -> fn(b, out_dtypes, *vals) -> Var


def register(*op_types: type):
    """Register a converter `conv(cv: Converter, node, *inputs)` for PyTensor op classes."""
    def deco(fn):
        for t in op_types:
            if t is not None:   # an op class this PyTensor version does not have
                CONVERTERS[t] = fn
        return fn
    return deco


def register_scalar(*names: str):
    """Register `fn(b, out_dtypes, *vals) -> Var` for scalar ops (by class name), used inside Elemwise."""
    def deco(fn):
        for n in names:
            SCALARS[n] = fn
        return fn
    return deco


def _lookup(table: dict, cls):
    for c in cls.__mro__:
        if c in table:
            return table[c]
    return None


# ---- the converter ----------------------------------------------------------------

Known = Any  # a Var (built) or a numpy array (value known at conversion time)


class Converter:
    """Walks a PyTensor FunctionGraph in topological order, building one Graph."""

    def __init__(self, builder: Builder, checks: str = "ninf"):
        self.b = builder
        self.checks = checks   # parameter checks: "ninf" (-inf where they fail) or "drop"
        self.env: dict[Any, Known] = {}
        self.direct = self.fallback = self.folded = 0   # how each node was converted (stats)
        self.fallback_ops: list[str] = []                  # which ops went through jax_funcify

    def get(self, var) -> Known:
        from pytensor.graph.basic import Constant
        if var in self.env:
            return self.env[var]
        if isinstance(var, Constant):
            return np.asarray(var.data)
        raise ConversionError(f"jaxform: PyTensor variable {var} is not computed from the given inputs; "
                              "list it in `inputs`")

    def value(self, x: Known, dtype=None) -> Var:
        """A Var for a converted value (known values become literals/constants), cast to `dtype`."""
        if not isinstance(x, Var):
            x = np.asarray(x)
            _check_dtype(x.dtype, "a constant")
            x = self.b.const(x)
        return x if dtype is None else self.b.convert(x, dtype)

    def static(self, x: Known, node, what: str) -> np.ndarray:
        """A value that must be known now (a shape, an axis); explain if it is not."""
        if isinstance(x, Var):
            raise ConversionError(f"jaxform: {what} of {_where(node)} depends on runtime values, but JAX needs "
                                  "it static. Compute it from shapes or constants only.")
        return np.asarray(x)

    def convert(self, node) -> None:
        ins = [self.get(v) for v in node.inputs]
        outs = None
        if all(not isinstance(i, Var) for i in ins) and _foldable(node):
            outs = _fold(node, ins)
            self.folded += outs is not None
        if outs is None:
            conv = _lookup(CONVERTERS, type(node.op))
            try:
                outs = conv(self, node, *ins) if conv is not None else None
            except _NoConverter:
                outs = None
            except (BuildError, ValueError) as e:
                raise ConversionError(f"jaxform: cannot convert {_where(node)}: {e}") from None
            if outs is None:
                outs = _fallback(self, node, ins)
                self.fallback += 1
                self.fallback_ops.append(str(node.op) if type(node.op).__name__ == "Blockwise"
                                         else type(node.op).__name__)
            else:
                self.direct += 1
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        for var, out in zip(node.outputs, outs):
            if isinstance(out, Var):
                want = tuple(var.type.shape) if hasattr(var.type, "shape") else ()
                if len(want) != out.ndim or any(w is not None and w != g for w, g in zip(want, out.shape)):
                    raise ConversionError(f"jaxform: {_where(node)} converted to shape {out.shape}, but PyTensor "
                                          f"says {want} (a bug in its converter)")
                if str(out.dtype) != var.type.dtype:
                    out = self.b.convert(out, var.type.dtype)
            self.env[var] = out


class _NoConverter(Exception):
    """Raised inside a converter to hand the node to the jax_funcify fallback."""


def _where(node) -> str:
    """'Op `Sum{axis=0}` producing `y` (created at model.py:12)' for error messages."""
    out = node.outputs[0]
    name = f" producing {out.name!r}" if getattr(out, "name", None) else ""
    trace = getattr(out.tag, "trace", None)
    loc = ""
    if trace:
        try:  # the user's frame: not jaxform's nor PyTensor's (a cloned graph's trace is our clone call)
            import os
            skip = (os.path.dirname(os.path.dirname(__file__)), os.sep + "pytensor" + os.sep)
            fr = [f for f in trace[0] if not any(k in f[0] for k in skip)][-1]
            loc = f" (created at {fr[0]}:{fr[1]})"
        except Exception:
            loc = ""
    return f"PyTensor op `{node.op}`{name}{loc}"


def _check_dtype(dtype, what: str) -> None:
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc" and jax.dtypes.canonicalize_dtype(dtype) != dtype:
        raise ConversionError(f"jaxform: {what} has dtype {dtype}, but JAX's 64-bit mode is off, so JAX would "
                              "silently compute in 32 bits. Call jax.config.update('jax_enable_x64', True) first, "
                              "or build the PyTensor graph in 32 bits (pytensor.config.floatX = 'float32').")


def _foldable(node) -> bool:
    """Fold what PyTensor's constant folding folds: small results computed from known values only
    (shape arithmetic, and elementwise ops on constants, computed by PyTensor's own `perform` so the
    unrewritten graph keeps the rewritten graph's numerics, e.g. float32 constants)."""
    small = all(getattr(o.type, "shape", None) is not None and None not in o.type.shape and
                int(np.prod(o.type.shape)) <= 64 for o in node.outputs)
    ints = all(getattr(o.type, "dtype", "") in ("bool",) or str(getattr(o.type, "dtype", "")).startswith(("int", "uint"))
               for o in node.outputs)
    # numpy computes log(int8) in float16 where PyTensor's C code uses float32: fold floats from floats only
    floats_in = all(str(getattr(i.type, "dtype", "")) in ("float32", "float64") for i in node.inputs)
    return small and (ints or (floats_in and type(node.op).__name__ in ("Elemwise", "DimShuffle")))


def _fold(node, ins):
    try:
        storage = [[None] for _ in node.outputs]
        node.op.perform(node, [np.asarray(i, dtype=v.type.dtype) for i, v in zip(ins, node.inputs)], storage)
        return [np.asarray(s[0], dtype=getattr(o.type, "dtype", None)) for s, o in zip(storage, node.outputs)]
    except Exception:
        return None


# ---- fallback: PyTensor's own JAX implementation, traced and spliced in ----------------

@functools.cache
def _jax_funcify():
    """PyTensor's JAX dispatch, imported without letting it flip JAX's global x64 flag."""
    before = jax.config.jax_enable_x64
    try:
        from pytensor.link.jax.dispatch import jax_funcify
    finally:
        jax.config.update("jax_enable_x64", before)
    return jax_funcify


def _fallback(cv: Converter, node, ins):
    try:
        fn = _jax_funcify()(node.op, node=node, storage_map=None)
    except NotImplementedError:
        raise ConversionError(f"jaxform: {_where(node)} has no jaxform converter and PyTensor's JAX backend "
                              f"does not support it either. Register one with "
                              f"@jaxform.frontends.pytensor.register({type(node.op).__name__}).") from None
    dyn = [i for i in ins if isinstance(i, Var)]
    # known values: integers as Python ints (axes, sizes: often static args of jitted jnp code),
    # the rest as numpy arrays
    statics = [None if isinstance(i, Var) else int(i) if np.ndim(i) == 0 and np.asarray(i).dtype.kind in "iu"
               else np.asarray(i) for i in ins]

    def run(*vals):
        it = iter(vals)
        out = fn(*[next(it) if s is None else s for s in statics])
        return tuple(out) if isinstance(out, (list, tuple)) else out

    try:
        out = cv.b.trace(run, *dyn)
    except Exception as e:
        raise ConversionError(f"jaxform: PyTensor's JAX implementation of {_where(node)} failed to trace on "
                              f"{[tuple(d.shape) for d in dyn]}: {type(e).__name__}: {e}") from None
    return list(out) if isinstance(out, tuple) else out


# ---- public API -------------------------------------------------------------------

def to_graph(inputs: Sequence, outputs, *, shapes: dict | Sequence | None = None,
             rewrite: bool = True, stats: dict | None = None, checks: str = "ninf") -> Graph:
    """Convert the PyTensor graph from `inputs` to `outputs` into a jaxform Graph.

    shapes: static shapes for inputs whose PyTensor type leaves dims unknown, as a
        list (one per input, None to keep) or a dict keyed by variable or name.
    rewrite: first apply the rewrites PyTensor's JAX mode applies (fusion,
        canonicalization); False converts the graph as written.
    stats: if a dict, receives counts of nodes converted directly / by fallback / folded.
    checks: "ninf" turns the parameter checks PyMC marks replaceable into -inf where they fail (PyMC's C
        backend does); "drop" drops them all, as PyTensor's JAX backend (hence PyMC's JAX samplers) does.
    Returns a Graph whose `to_function` takes the inputs in order and returns one
    array (single output) or a list.
    """
    from pytensor.graph.fg import FunctionGraph
    import pytensor.tensor as pt
    _ensure_registered()
    if checks not in ("ninf", "drop"):
        raise ValueError(f"jaxform.frontends.pytensor.to_graph: checks must be 'ninf' or 'drop', got {checks!r}")

    single = not isinstance(outputs, (list, tuple))
    outs = [outputs] if single else list(outputs)
    inputs = list(inputs)
    # the graph keeps its inputs' types (PyTensor's rewrites need no static shapes, and re-typing them
    # cloned the whole graph once more); the static shapes are the converted inputs'
    static = _static_shapes(inputs, shapes)
    t0 = time.perf_counter()
    with gc_paused():  # no cyclic garbage is made here; full collections over PyTensor's graph were 1/3 of it
        fg = FunctionGraph(inputs, [pt.as_tensor_variable(o) for o in outs], clone=rewrite)
    t1 = time.perf_counter()
    if rewrite:  # rewrites work in place on a clone; without them the graph is only read (clients live in fg)
        from pytensor.compile.mode import get_mode
        get_mode("JAX").optimizer.rewrite(fg)
    t2 = time.perf_counter()
    with gc_paused():
        b = Builder()
        cv = Converter(b, checks)
        for var, shape in zip(fg.inputs, static):
            _check_dtype(var.type.dtype, f"PyTensor input {var.name or var}")
            cv.env[var] = b.arg(shape, var.type.dtype, name=var.name)
        for node in fg.toposort():
            cv.convert(node)
        results = [cv.value(cv.get(o)) for o in fg.outputs]
        g = b.build(results[0] if single else results)
        if not rewrite:  # PyTensor's graph repeats subexpressions (log(sigma) per term) that its merge rewrite joins
            from ..passes.cse import cse
            cse(g)
    if stats is not None:
        stats.update(direct=cv.direct, fallback=cv.fallback, folded=cv.folded, fallback_ops=cv.fallback_ops,
                     nodes=len(fg.apply_nodes), time_graph_s=t1 - t0, time_rewrite_s=t2 - t1,
                     time_convert_s=time.perf_counter() - t2)
    return g


def function(inputs: Sequence, outputs, *, shapes: dict | Sequence | None = None, rewrite: bool = True,
             jit: bool = True) -> Callable:
    """A JAX callable for the PyTensor graph (jitted unless jit=False); composes with grad/vmap."""
    f = to_function(to_graph(inputs, outputs, shapes=shapes, rewrite=rewrite))
    return jax.jit(f) if jit else f


def _static_shapes(inputs, shapes) -> list[tuple[int, ...]]:
    """Each input's static shape: its PyTensor type's, or `shapes`' where given (checked against the type)."""
    from pytensor.graph.basic import Constant
    out = []
    for i, var in enumerate(inputs):
        if isinstance(var, Constant):
            raise ConversionError(f"jaxform: input {i} is a PyTensor constant; inputs must be variables")
        given = None
        if isinstance(shapes, dict):
            given = shapes.get(var, shapes.get(var.name) if var.name else None)
        elif shapes is not None:
            given = shapes[i]
        tshape = getattr(var.type, "shape", ())
        if given is None:
            if None in tshape:
                raise ConversionError(
                    f"jaxform: PyTensor input {var.name or i!r} has shape {tshape} with unknown dims; JAX needs "
                    f"static shapes. Declare it with pt.tensor({var.name!r}, shape=(...)) or pass "
                    f"shapes={{{var.name!r}: (...)}} to to_graph/function.")
            out.append(tuple(tshape))
            continue
        given = tuple(int(d) for d in given)
        if len(given) != len(tshape) or any(t is not None and t != g for t, g in zip(tshape, given)):
            raise ConversionError(f"jaxform: shapes gives {given} for PyTensor input {var.name or i!r} "
                                  f"of shape {tshape}")
        out.append(given)
    return out


# ---- converters -------------------------------------------------------------------

def _register_all():
    """Fill CONVERTERS (imports PyTensor, hence done on first use); user registrations win."""
    user = dict(CONVERTERS)
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

    _register_pymc_ops(tb, st)
    CONVERTERS.update(user)


def _trace(cv: Converter, fn: Callable, *ins: Known) -> Any:
    """Emit lax equations by tracing `fn` (lax / jnp-indexing code, no jit wrappers) on the runtime operands;
    known operands are passed to `fn` as numpy values."""
    dyn = [i for i in ins if isinstance(i, Var)]
    mask = [isinstance(i, Var) for i in ins]

    def run(*vals):
        it = iter(vals)
        return fn(*[next(it) if m else i for m, i in zip(mask, ins)])
    return cv.b.trace(run, *dyn)


def _index_parts(index):
    """jnp index components: None stays None, known integer arrays stay numpy, slices keep known bounds."""
    out = []
    for t in index:
        if isinstance(t, np.ndarray) and t.dtype == object and t.shape == () and t.item() is None:
            out.append(None)
        elif isinstance(t, slice):
            out.append(slice(*[None if p is None or (isinstance(p, np.ndarray) and p.dtype == object)
                               else p if isinstance(p, Var) else int(np.asarray(p))
                               for p in (t.start, t.stop, t.step)]))
        else:
            out.append(t)
    return out


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
        scv = Converter(sub, cv.checks)
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

    _register_scan()


def _ofg_has_own_jax(cls) -> bool:
    from pytensor.compile.builders import OpFromGraph
    jf = _jax_funcify()
    return jf.dispatch(cls) is not jf.dispatch(OpFromGraph)


def _register_scan():
    from pytensor.compile.builders import OpFromGraph
    from pytensor.scan.op import Scan
    from pytensor.tensor.type_other import MakeSlice

    @register(OpFromGraph)
    def op_from_graph(cv, node, *ins):
        """Inline the inner graph, converted node by node (XLogY, LogAddExp, KroneckerProduct, a user's
        OpFromGraph): its ops become plain primitives instead of one traced jax_funcify call. Subclasses that
        PyTensor's JAX backend implements on their own (Einsum, RandomVariableWithCoreShape) keep that."""
        if _ofg_has_own_jax(type(node.op)):
            raise _NoConverter
        icv = Converter(cv.b, cv.checks)
        for var, v in zip(node.op.fgraph.inputs, ins):
            icv.env[var] = v
        for nd in node.op.fgraph.toposort():
            icv.convert(nd)
        cv.direct += icv.direct
        cv.fallback += icv.fallback
        cv.folded += icv.folded
        cv.fallback_ops += icv.fallback_ops
        return [icv.get(o) for o in node.op.fgraph.outputs]

    register(MakeSlice)(lambda cv, node, *parts: slice(*parts))

    @register(Scan)
    def scan(cv, node, *ins):
        """A PyTensor Scan → one lax.scan whose body is the inner graph, converted node by node.

        Carries: mit-sot windows (the last -min(tap) values), sit-sot values, untraced sit-sots;
        xs: the sequences; ys: mit-sot, sit-sot and nit-sot traces, cut to PyTensor's buffer sizes.
        """
        op, b = node.op, cv.b
        info = op.info
        if info.as_while:
            raise ConversionError(f"jaxform: {_where(node)} is a while-scan (`until=`): the length of its results "
                                  "depends on the data, and a JAX program needs static shapes (PyTensor's JAX "
                                  "backend refuses it too). Write the loop with a fixed n_steps, masking the steps "
                                  "after the condition holds.")
        if info.n_mit_mot:
            raise _NoConverter  # gradient scans of pytensor.grad (mit-mot): PyTensor's JAX code, a counted fallback
        n = int(cv.static(ins[0], node, "the number of steps"))
        head = lambda x, k: b.slice(x, [0] * x.ndim, [k] + list(x.shape[1:]))
        at = lambda x, i: b.reshape(b.slice(x, [i] + [0] * (x.ndim - 1), [i + 1] + list(x.shape[1:])), x.shape[1:])
        seqs = [cv.value(x) for x in op.outer_seqs(list(ins))]
        seqs = [x if x.shape[0] == n else head(x, n) for x in seqs]
        taps = [list(t) for t in info.mit_sot_in_slices]
        mit_bufs = [cv.value(x) for x in op.outer_mitsot(list(ins))]
        windows = [head(x, -min(t)) for x, t in zip(mit_bufs, taps)]
        sit_bufs = [cv.value(x) for x in op.outer_sitsot(list(ins))]
        sits = [at(x, 0) for x in sit_bufs]
        untraced = [cv.value(x) for x in op.outer_untraced_sit_sot(list(ins))]
        nonseqs = list(op.outer_non_seqs(list(ins)))
        dyn = [x for x in nonseqs if isinstance(x, Var)]
        nw, ns, nu = len(windows), len(sits), len(untraced)

        def body(sb, *args):
            consts, carry, xs = args[:len(dyn)], args[len(dyn):len(args) - len(seqs)], args[len(args) - len(seqs):]
            wins, cur, unt = carry[:nw], carry[nw:nw + ns], carry[nw + ns:]
            icv = Converter(sb, cv.checks)
            vals = list(xs)
            for w, t in zip(wins, taps):
                vals += [sb.reshape(sb.slice(w, [-min(t) + k] + [0] * (w.ndim - 1),
                                             [-min(t) + k + 1] + list(w.shape[1:])), w.shape[1:]) for k in t]
            it = iter(consts)
            vals += list(cur) + list(unt) + [next(it) if isinstance(x, Var) else x for x in nonseqs]
            for var, v in zip(op.fgraph.inputs, vals):
                icv.env[var] = v
            for nd in op.fgraph.toposort():
                icv.convert(nd)
            outs = [icv.get(o) for o in op.fgraph.outputs]
            cv.direct += icv.direct
            cv.fallback += icv.fallback
            cv.folded += icv.folded
            cv.fallback_ops += icv.fallback_ops
            fit = lambda v, like: sb.broadcast_to(icv.value(v, like.dtype), tuple(like.shape))
            mit_new = [sb.broadcast_to(icv.value(v, w.dtype), tuple(w.shape[1:]))
                       for v, w in zip(op.inner_mitsot_outs(outs), wins)]
            sit_new = [fit(v, c) for v, c in zip(op.inner_sitsot_outs(outs), cur)]
            unt_new = [fit(v, u) for v, u in zip(op.inner_untraced_sit_sot_outs(outs), unt)]
            nit_new = [icv.value(v, o.type.dtype) for v, o in zip(op.inner_nitsot_outs(outs),
                                                                  op.inner_nitsot_outs(op.fgraph.outputs))]
            new_wins = [sb.concatenate([sb.slice(w, [1] + [0] * (w.ndim - 1), list(w.shape)),
                                        sb.reshape(v, (1,) + tuple(v.shape))], 0) for w, v in zip(wins, mit_new)]
            return new_wins + sit_new + unt_new + mit_new + sit_new + nit_new

        carry, ys = b.scan(body, dyn, windows + sits + untraced, seqs, length=n)
        final_unt = carry[nw + ns:]
        traces = []
        inits = windows + [b.reshape(s, (1,) + tuple(s.shape)) for s in sits]
        sizes = [x.shape[0] for x in mit_bufs + sit_bufs] + \
            [int(cv.static(x, node, "a nit-sot length")) for x in op.outer_nitsot(list(ins))]
        for k, (tr, size) in enumerate(zip(ys, sizes)):
            if tr.shape[0] > size:
                tr = b.slice(tr, [tr.shape[0] - size] + [0] * (tr.ndim - 1), list(tr.shape))
            elif tr.shape[0] < size:
                init = inits[k]
                need = size - tr.shape[0]
                init = b.slice(init, [init.shape[0] - need] + [0] * (init.ndim - 1), list(init.shape))
                tr = b.concatenate([init, tr], 0)
            traces.append(tr)
        return traces + final_unt


# Scalar ops' mathematical ranges (lo, hi, lo open, hi open) for every non-NaN input. Open ends are reached
# in floating point only by underflow (exp(-800) == 0), where a logp is already -inf or NaN.
_RANGES = {"Sigmoid": (0.0, 1.0, True, True), "Exp": (0.0, np.inf, True, False),
           "Softplus": (0.0, np.inf, True, False), "Abs": (0.0, np.inf, False, False),
           "Sqr": (0.0, np.inf, False, False), "Sqrt": (0.0, np.inf, False, False),
           "Erfc": (0.0, 2.0, True, True), "Cosh": (1.0, np.inf, False, False)}
_CMP = {"GE": lambda r, c: r[0] >= c, "GT": lambda r, c: r[0] > c or (r[0] == c and r[2]),
        "LE": lambda r, c: r[1] <= c, "LT": lambda r, c: r[1] < c or (r[1] == c and r[3])}
_FLIP = {"GE": "LE", "GT": "LT", "LE": "GE", "LT": "GT"}


def _producer(var, env=None):
    """(op name, inputs, env) of the op computing `var`, looking into fused Composites (pytensor 2.38's JAX
    mode fuses checks): an Elemwise is named by its scalar op; `env` maps a Composite's inner inputs to the
    outer variables. None for graph inputs and constants."""
    env = env or {}
    var = env.get(var, var)
    owner = var.owner
    if owner is None:
        return None
    name = type(owner.op).__name__
    if name == "Elemwise":
        sop = owner.op.scalar_op
        if type(sop).__name__ == "Composite":
            inner = sop.fgraph.outputs[owner.outputs.index(var)]
            return _producer(inner, dict(zip(sop.fgraph.inputs, [env.get(i, i) for i in owner.inputs])))
        return type(sop).__name__, owner.inputs, env
    return name, owner.inputs, env


def _value_range(var, env=None):
    """(lo, hi, lo open, hi open) bounding every non-NaN value of a PyTensor variable, or None if unknown."""
    k = _scalar_constant((env or {}).get(var, var))
    if k is not None:
        return (k, k, False, False)
    p = _producer(var, env)
    if p is None:
        return None
    name, ins, env = p
    if name in ("DimShuffle", "SpecifyShape", "Identity", "Cast", "ScalarFromTensor", "TensorFromScalar"):
        return _value_range(ins[0], env)
    return _RANGES.get(name)


def _always_holds(var, env=None) -> bool:
    """A boolean PyTensor condition that is true for every non-NaN input: comparisons of a bounded value
    with a constant (`exp(x) > 0` counts: mathematically true, false only once exp underflows), and
    all/and/stacks of such. Where an input is NaN (or underflows) the check would give -inf; without it the
    logp is NaN, as PyTensor's JAX backend gives (it drops every check). Samplers reject both."""
    from pytensor.graph.basic import Constant
    v = (env or {}).get(var, var)
    if isinstance(v, Constant):
        return bool(np.all(v.data))
    p = _producer(var, env)
    if p is None:
        return False
    name, ins, env = p
    if name in ("DimShuffle", "SpecifyShape", "MakeVector", "ScalarFromTensor", "TensorFromScalar", "AND",
                "Identity"):
        return all(_always_holds(i, env) for i in ins)
    if name == "Join":
        # pytensor <= 3.0: the axis is the first input; later a property of the op
        return all(_always_holds(i, env) for i in (ins[1:] if getattr(v.owner.op, "axis", None) is None else ins))
    if name in ("All", "CAReduce") and type(getattr(v.owner.op, "scalar_op", None)).__name__ == "AND":
        return _always_holds(ins[0], env)
    if name in _CMP:
        a, c = ins
        if _scalar_constant(env.get(c, c)) is None:
            a, c, name = c, a, _FLIP[name]
        k = _scalar_constant(env.get(c, c))
        r = _value_range(a, env)
        return k is not None and r is not None and bool(_CMP[name](r, k))
    return False


def _scalar_constant(var) -> float | None:
    """The value of a one-element constant (possibly broadcast by a DimShuffle), else None."""
    from pytensor.graph.basic import Constant
    while var.owner is not None and type(var.owner.op).__name__ == "DimShuffle":
        var = var.owner.inputs[0]
    if isinstance(var, Constant) and np.asarray(var.data).size == 1 and np.asarray(var.data).dtype.kind in "biuf":
        return float(np.asarray(var.data).reshape(()))
    return None


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


_REDUCERS = {"Add": "reduce_sum", "Mul": "reduce_prod", "ScalarMaximum": "reduce_max", "Maximum": "reduce_max",
             "ScalarMinimum": "reduce_min", "Minimum": "reduce_min", "AND": "reduce_and", "OR": "reduce_or"}


def _shape_of(x) -> tuple:
    return tuple(x.shape) if isinstance(x, Var) else np.shape(x)


def _small_literal(cv: Converter, x: Known) -> Var:
    """Known single-element operands become scalar literals (lax ops broadcast rank-0 operands)."""
    if not isinstance(x, Var) and np.size(x) == 1:
        return cv.value(np.asarray(x).reshape(()))
    return cv.value(x)


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


# ---- scalar ops (inside Elemwise and Composite) -----------------------------------------

def _scalar_op(cv: Converter, sop, vals: list[Var], out_dtypes: list[str], node) -> list[Var]:
    """Apply scalar op `sop` elementwise to `vals`: a Composite's inner graph is walked node by node."""
    b = cv.b
    if type(sop).__name__ == "Composite":
        env = dict(zip(sop.fgraph.inputs, vals))
        for n in sop.fgraph.toposort():
            ins = [env[v] if v in env else b.const(np.asarray(v.data, v.type.dtype)) for v in n.inputs]
            for o, r in zip(n.outputs, _scalar_op(cv, n.op, ins, [o.type.dtype for o in n.outputs], n)):
                env[o] = r
        return [env[o] if o in env else b.const(np.asarray(o.data, o.type.dtype)) for o in sop.fgraph.outputs]
    fn = SCALARS.get(type(sop).__name__)
    if fn is not None:
        try:
            out = fn(b, out_dtypes, *vals)
            return out if isinstance(out, list) else [out]
        except _NoConverter:
            pass
    # a scalar op we do not know: PyTensor's JAX implementation of it, applied elementwise
    cv.fallback += 1
    cv.fallback_ops.append(type(sop).__name__)
    jf = _jax_funcify()(sop, node=node)
    shape = tuple(np.broadcast_shapes(*[v.shape for v in vals]))
    out = b.trace(lambda *a: jf(*a), *[b.broadcast_to(v, shape) for v in vals])
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    return [b.convert(o, d) for o, d in zip(out, out_dtypes)]


def _full(b: Builder, vals):
    shape = tuple(np.broadcast_shapes(*[v.shape for v in vals]))
    return [b.broadcast_to(v, shape) for v in vals]


_BOOL_ARITH = {"add": "or", "mul": "and", "max": "or", "min": "and"}


def _arith(prim: str):
    def fn(b, dts, *vals):
        p = prim
        if dts[0] == "bool":  # PyTensor's boolean arithmetic: + is or, * is and (numpy's rules)
            p = _BOOL_ARITH.get(prim, prim if prim in ("and", "or", "xor") else None)
            if p is None:
                raise _NoConverter
        vals = [b.convert(v, dts[0]) for v in vals]
        out = vals[0]
        for v in vals[1:]:  # PyTensor's Add/Mul are n-ary
            out = b.bind(p, out, v)
        return out
    return fn


def _unary_float(prim: str):
    return lambda b, dts, x: b.bind(prim, b.convert(x, dts[0]))


def _compare(prim: str):
    def fn(b, dts, x, y):
        dt = np.result_type(x.dtype, y.dtype)
        return b.bind(prim, b.convert(x, dt), b.convert(y, dt))
    return fn


for _n, _p in [("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("TrueDiv", "div"), ("Maximum", "max"),
               ("Minimum", "min"), ("ScalarMaximum", "max"), ("ScalarMinimum", "min"), ("ArcTan2", "atan2"),
               ("AND", "and"), ("OR", "or"), ("XOR", "xor")]:
    register_scalar(_n)(_arith(_p))
for _n, _p in [("Exp", "exp"), ("Log", "log"), ("Log1p", "log1p"), ("Expm1", "expm1"), ("Exp2", "exp2"),
               ("Sqrt", "sqrt"), ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Tanh", "tanh"),
               ("Sinh", "sinh"), ("Cosh", "cosh"), ("ArcSin", "asin"), ("ArcCos", "acos"), ("ArcTan", "atan"),
               ("ArcSinh", "asinh"), ("ArcCosh", "acosh"), ("ArcTanh", "atanh"), ("Sigmoid", "logistic"),
               ("Erf", "erf"), ("Erfc", "erfc"), ("Erfinv", "erf_inv"), ("GammaLn", "lgamma"), ("Psi", "digamma"),
               ("Neg", "neg"), ("Abs", "abs"), ("Sign", "sign")]:
    register_scalar(_n)(_unary_float(_p))
for _n, _p in [("EQ", "eq"), ("NEQ", "ne"), ("LT", "lt"), ("LE", "le"), ("GT", "gt"), ("GE", "ge")]:
    register_scalar(_n)(_compare(_p))


@register_scalar("GammaInc")
def _gammainc(b, dts, k, x):
    """Regularized lower incomplete gamma P(k, x): lax.igamma, as jax.scipy.special.gammainc."""
    return b.bind("igamma", *_full(b, [b.convert(k, dts[0]), b.convert(x, dts[0])]))


@register_scalar("GammaIncC")
def _gammaincc(b, dts, k, x):
    """Regularized upper incomplete gamma Q(k, x) (hurdle and truncated Poisson): lax.igammac."""
    return b.bind("igammac", *_full(b, [b.convert(k, dts[0]), b.convert(x, dts[0])]))


@register_scalar("Floor")
def _floor(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.convert(x, dts[0])
    return b.convert(b.floor(x), dts[0])


@register_scalar("Ceil")
def _ceil(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.convert(x, dts[0])
    return b.convert(b.ceil(x), dts[0])


@register_scalar("Identity", "Cast")
def _cast(b, dts, x):
    return b.convert(x, dts[0])


@register_scalar("Sqr")
def _sqr(b, dts, x):
    return b.integer_pow(b.convert(x, dts[0]), 2)  # as jnp.square / x ** 2: one equation, a cheaper gradient


@register_scalar("Reciprocal")
def _reciprocal(b, dts, x):
    return b.div(1, b.convert(x, dts[0]))


@register_scalar("Pow")
def _pow(b, dts, x, y):
    if not np.issubdtype(np.dtype(dts[0]), np.inexact):
        raise _NoConverter  # integer powers: jnp.power semantics via the fallback
    k = y.value.literal if y.value.is_literal else None
    if k is not None and float(k) == int(k) and abs(int(k)) <= 4 and y.ndim == 0:
        return b.integer_pow(b.convert(x, dts[0]), int(k))  # x ** 2 as jnp writes it: integer_pow
    return b.pow(*_full(b, [b.convert(x, dts[0]), b.convert(y, dts[0])]))


@register_scalar("Switch")
def _switch(b, dts, c, t, f):
    c = c if c.dtype == np.bool_ else b.ne(c, 0)
    c, t, f = _full(b, [c, b.convert(t, dts[0]), b.convert(f, dts[0])])
    return b.select_n(c, f, t)


@register_scalar("Second")
def _second(b, dts, x, y):
    return b.broadcast_to(b.convert(y, dts[0]), tuple(np.broadcast_shapes(x.shape, y.shape)))


@register_scalar("Invert")
def _invert(b, dts, x):
    return b.not_(x)


@register_scalar("Clip")
def _clip(b, dts, x, lo, hi):
    x, lo, hi = _full(b, [b.convert(v, dts[0]) for v in (x, lo, hi)])
    # exactly PyTensor's `x < lo ? lo : x > hi ? hi : x` (its C code and JAX backend), not numpy.clip: where
    # lo > hi, lo below lo and hi from lo up; a NaN bound clips nothing; x's own zero sign at a bound; the
    # gradient reaches x in full at x == lo or hi. As max/min these all differed (found by an attack).
    # Under jit, XLA's reverse mode gives a GP's clipped squared distances a derivative of O(1) at exact
    # zeros (duplicated inputs, the diagonal) where the true one is 0, with a select (PyTensor's JAX backend
    # too) and with max/min alike: docs/builder.md
    return b.select_n(b.lt(x, lo), b.select_n(b.gt(x, hi), x, hi), lo)


@register_scalar("IsNan")
def _isnan(b, dts, x):
    return b.ne(x, x)


@register_scalar("Softplus")
def _softplus(b, dts, x):
    """PyTensor's piecewise formula (pytensor/scalar/math.py Softplus.static_impl), branch for branch."""
    x = b.convert(x, dts[0])
    c = lambda v: b.const(np.array(v, dts[0]))
    mid = b.log1p(b.exp(x))
    out = b.select_n(b.lt(x, c(33.3)), x, x + b.exp(b.neg(x)))
    out = b.select_n(b.lt(x, c(18.0)), out, mid)
    return b.select_n(b.lt(x, c(-37.0)), out, b.exp(x))


@register_scalar("IsInf")
def _isinf(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.broadcast_to(b.const(np.array(False)), tuple(x.shape))
    return b.eq(b.abs(x), b.const(np.array(np.inf, x.dtype)))


@register_scalar("Erfcx")
def _erfcx(b, dts, x):
    """exp(x²)·erfc(x), with its asymptotic series for x ≥ 12 where erfc underflows (error < 1e-15)."""
    x = b.convert(x, dts[0])
    c = lambda v: b.const(np.array(v, dts[0]))
    big = b.lt(x, c(12.0))
    xs = b.select_n(big, c(0.0), x)              # keep the unused branch finite (its gradient too)
    direct = b.exp(b.integer_pow(xs, 2)) * b.erfc(xs)
    xl = b.select_n(big, x, c(12.0))
    inv2 = b.div(c(1.0), b.integer_pow(xl, 2) * c(2.0))
    series, term = c(1.0), c(1.0)
    for k in range(1, 12):
        term = term * b.neg(inv2) * c(2 * k - 1)
        series = series + term
    asym = series / (xl * c(np.sqrt(np.pi)))
    return b.select_n(big, asym, direct)


@register_scalar("Log1mexp")
def _log1mexp(b, dts, x):
    """log(1 - exp(x)), PyTensor's switch at log(0.5) (pytensor/scalar/math.py Log1mexp)."""
    x = b.convert(x, dts[0])
    lo = b.lt(x, b.const(np.array(np.log(0.5), dts[0])))
    return b.select_n(lo, b.log(b.neg(b.expm1(x))), b.log1p(b.neg(b.exp(x))))


# Op classes whose converter handles the common cases and hands the rest to the fallback.
_PARTIAL = {"CAReduce": "bitwise and/or of integers", "Blockwise": "core ops without a converter",
            "AllocDiag": "offset != 0 or batched", "SolveTriangular": "transposed solves",
            "Scan": "mit-mot (gradient) scans", "OpFromGraph": "inner ops without a converter"}


def op_table() -> dict[str, str]:
    """What jaxform does with each op class PyTensor's JAX backend registers (and each scalar op PyMC-style
    graphs use inside Elemwise): 'native' (a jaxform converter), 'partial' (a converter for the common cases,
    the fallback for the rest), 'fallback' (PyTensor's jax_funcify, traced and spliced in) or 'unsupported'
    (jax_funcify raises here, e.g. ops needing tensorflow-probability). Keys are 'module.Class'.

    Lets tests (and users) see which ops a new PyTensor adds or changes before a model meets them.
    """
    import importlib
    from pytensor.graph.op import Op
    from pytensor.scalar.basic import ScalarOp
    for mod in ("pytensor.tensor", "pytensor.scan", "pytensor.ifelse", "pytensor.sparse", "pytensor.tensor.random"):
        importlib.import_module(mod)   # a fixed set of modules, so that the subclasses found do not vary
    from pytensor.tensor.random.op import RandomVariable
    _ensure_registered()
    jf = _jax_funcify()
    out: dict[str, str] = {}
    key = lambda c: f"{c.__module__}.{c.__qualname__}"
    # registered classes and PyTensor's own subclasses of them (dispatch follows the MRO: LogSumExp is an
    # OpFromGraph); the dozens of RandomVariables (never in a logp graph) as their base class only
    todo = [c for c in jf.registry if isinstance(c, type) and issubclass(c, Op) and not issubclass(c, ScalarOp)]
    seen: set = set()
    while todo:
        cls = todo.pop()
        if cls in seen or not cls.__module__.startswith("pytensor.") or cls.__module__.startswith("pytensor.link.") \
                and cls not in jf.registry or cls.__module__.startswith("pytensor.compile.debug"):
            continue   # (DebugMode's ops exist once a test imports it; never in a graph a mode compiles for JAX)
        seen.add(cls)
        owner = next((c for c in cls.__mro__ if c in CONVERTERS), None)   # the class whose converter applies
        if owner is not None and owner.__name__ == "OpFromGraph" and _ofg_has_own_jax(cls):
            owner = None
        out[key(cls)] = "fallback" if owner is None else "partial" if owner.__name__ in _PARTIAL else "native"
        if not issubclass(cls, RandomVariable):
            todo += cls.__subclasses__()
    scalars: dict[type, str] = {}
    for mod in ("pytensor.scalar.basic", "pytensor.scalar.math"):
        for v in vars(importlib.import_module(mod)).values():
            if isinstance(v, ScalarOp) and type(v) not in scalars:
                scalars[type(v)] = _scalar_status(jf, v)
    for cls in jf.registry:
        if isinstance(cls, type) and issubclass(cls, ScalarOp) and cls is not ScalarOp and cls not in scalars:
            scalars[cls] = "native" if cls.__name__ in SCALARS or cls.__name__ == "Composite" else "fallback"
    out.update({key(c): st for c, st in scalars.items()})
    return dict(sorted(out.items()))


def _scalar_status(jf, sop) -> str:
    if type(sop).__name__ in SCALARS or type(sop).__name__ == "Composite":
        return "native"
    import pytensor.scalar as ps
    n = sop.nin if sop.nin > 0 else 2
    for make in (ps.float64, ps.int64, ps.bool):
        try:
            node = sop.make_node(*[make() for _ in range(n)])
            break
        except Exception:
            node = None
    if node is None:
        return "unsupported"
    try:
        jf(sop, node=node)
    except Exception:
        return "unsupported"
    return "fallback"


_registered = False


def _ensure_registered():
    global _registered
    if not _registered:
        _register_all()
        _registered = True
