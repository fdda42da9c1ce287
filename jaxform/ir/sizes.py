"""Bytes of values: what the memory rules of passes measure.

LICM's expansion limit, fission's stacked-buffer budget and remat_loops'
residual count all compare sizes; they use this one count so that a value
costs the same in each of them.
"""
from __future__ import annotations

import math

__all__ = ["nbytes", "value_bytes"]


def nbytes(aval) -> float:
    """Bytes of one value of type `aval`; `inf` for types without a shape and dtype (tokens).

    A dtype without an item size (a typed PRNG key) counts 8 bytes per element.
    """
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return math.inf
    return math.prod(shape) * getattr(dtype, "itemsize", 8)


def value_bytes(v) -> float:
    """Bytes of a value (a Graph `Value` or a jaxpr var); 0 for a size XLA does not know."""
    b = nbytes(v.aval)
    return 0.0 if math.isinf(b) else float(b)
