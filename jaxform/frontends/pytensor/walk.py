"""Walking a PyTensor graph: `Converter` turns one node at a time into Builder calls (fold what is known,
else the registered converter, else PyTensor's own JAX code traced and spliced in); the static shapes
of the inputs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import numpy as np

from ...ir.build import Builder, BuildError, Var
from .registry import CONVERTERS, ConversionError, Known, _NoConverter, _check_dtype, _lookup, _where


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
