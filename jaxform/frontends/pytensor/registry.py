"""The tables a PyTensor op is looked up in: `CONVERTERS` (op class -> converter, along the MRO) and
`SCALARS` (scalar op name -> builder function), `register` / `register_scalar`, and the errors with
the user's line.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np



class ConversionError(TypeError):
    """A PyTensor graph cannot be turned into a static JAX graph (and why)."""
    __module__ = "jaxform.frontends.pytensor"  # its public home (re-exported there): reprs and pickles as before the split


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


Known = Any  # a Var (built) or a numpy array (value known at conversion time)


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
            skip = (os.path.dirname(os.path.dirname(os.path.dirname(__file__))), os.sep + "pytensor" + os.sep)  # jaxform/
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
