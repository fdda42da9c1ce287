"""Linearity, per primitive and dtype: in which operands is an equation linear over the steps of a loop?

A pass that rewrites `sum_t L(m_t)` as `L(sum_t m_t)` needs L to be linear *in the arithmetic the
program runs in*. That depends on the dtype: float `div` by a constant is linear (up to rounding),
integer `div` is not (`(1 + 1) // 3 != 1 // 3 + 1 // 3`); integer add/mul/dot are linear modulo 2^n
(wrap-around distributes), bool arithmetic is not. And the sum of the m_t must run in the dtype the
original accumulation ran in: an L that changes the dtype (a `convert_element_type` f16 -> f32, a
`dot_general` with `preferred_element_type` int8 -> int32) would move the sum into the narrow type
(3000 f16 steps of 1.0 give 2048; 100 int8 steps of 2 wrap), so such an L is not treated as linear.
One table here; every pass that needs linearity asks `linear_operands`.
"""
from __future__ import annotations

import jax.numpy as jnp

from typing import Callable

import numpy as np

from .graph import Node, Value

ALL = frozenset({"add", "add_any", "sub"})                              # linear in every operand
FIRST = frozenset({"neg", "transpose", "reshape", "reduce_sum", "broadcast_in_dim", "squeeze", "expand_dims",
                   "copy", "copy_p", "rev", "convert_element_type", "div"})   # in the first, the rest constant
ONE = frozenset({"mul", "dot_general"})                                 # in one operand, the other constant
FLOAT_ONLY = frozenset({"div", "convert_element_type"})                 # linear only over floating types


def _dtype(v: Value):
    return np.dtype(v.aval.dtype)


def dtype_preserving(node: Node) -> bool:
    """Every operand and result has one dtype: no widening or narrowing inside the equation."""
    ds = {_dtype(v) for v in node.inputs + node.outputs}
    return len(ds) == 1


def linear_operands(node: Node, const: Callable[[Value], bool]) -> list[Value] | None:
    """The operands `node` is linear in, given which operands are loop constants; None if it is not linear
    (in this dtype) in any non-constant operand, or if it changes the dtype the sum would run in."""
    p = node.name
    if node.effects or node.regions or not dtype_preserving(node):
        return None
    d = _dtype(node.outputs[0])
    if d == np.bool_ or not (jnp.issubdtype(d, np.number)):
        return None
    if p in FLOAT_ONLY and not jnp.issubdtype(d, np.inexact):
        return None
    if p in ALL and not any(const(x) for x in node.inputs):
        return list(node.inputs)
    if p in FIRST and node.inputs and not const(node.inputs[0]) and all(const(x) for x in node.inputs[1:]):
        return [node.inputs[0]]
    if p in ONE and len(node.inputs) == 2 and sum(map(const, node.inputs)) == 1:
        return [x for x in node.inputs if not const(x)]
    return None


__all__ = ["linear_operands", "dtype_preserving", "ALL", "FIRST", "ONE", "FLOAT_ONLY"]
