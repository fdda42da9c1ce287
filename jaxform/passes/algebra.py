"""Algebraic simplifications, written as Rules (a first rule set and a model for your own).

Exact rules (bit-for-bit equal, also in `algebra_exact`):
    x*1, x/1, x-(+0), --x, x**1 -> x;     (not x-(-0.0): -0.0 - -0.0 is +0.0)  x + -y -> x - y;  x - -y -> x + y;
    transpose(transpose(x)) -> one transpose (or x);  reshape(reshape(x)) -> one reshape (or x);
    convert_element_type(x) to x's own dtype -> x.
Not exact (so `algebra` is exact=False):
    x+0 -> x                 (-0.0 + 0.0 is +0.0)
    log(exp(x)) -> x         (no overflow to inf for large x; real floats only: complex log wraps the imaginary part)
    log(1+x) -> log1p(x)     (more accurate for small x)
    exp(x)/sum(exp(x)) -> exp(x-max)/sum(exp(x-max))   (stable softmax: no inf/inf = nan)
Identity rules fire only when x has exactly the result's type (no broadcasting or weak-type change).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..rewrite import Pat, Rules
from ..rewrite.pattern import const_value
from .registry import register

x, y = Pat.any("x"), Pat.any("y")


def _identity(x, ctx):
    """Replace the root by x itself, when that does not change the type."""
    return x if x.aval == ctx.root.outputs[0].aval else None


def _plus_zero(v) -> bool:
    """A constant +0 (x - (-0.0) is x + 0.0, which turns x = -0.0 into +0.0)."""
    c = const_value(v)
    return c is not None and not np.signbit(np.real(c)) and not np.signbit(np.imag(c))


def _transpose2(x, p, q):
    perm = tuple(p[i] for i in q)
    return x if perm == tuple(range(x.ndim)) else lax.transpose(x, perm)


def _reshape2(x, shape):
    return x if tuple(x.shape) == tuple(shape) else lax.reshape(x, tuple(shape))


def _softmax(x, axes, shape=None, bdims=None):
    """Stable softmax over `axes`, if the matched division really is one (keepdims-style broadcast)."""
    keep = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    if shape is None and len(axes) != x.ndim:
        return None   # e / sum(e, some axes) without keepdims broadcasts differently: not a softmax
    if shape is not None and (tuple(shape) != keep or tuple(bdims) != tuple(i for i in range(x.ndim) if i not in axes)):
        return None
    m = lax.stop_gradient(jnp.max(x, axis=axes, keepdims=True))
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=axes, keepdims=True)


# exp's argument, unless it is already shifted by a (stop-gradient) max: that one is stable.
_shifted = Pat("sub", Pat.any(), Pat({"stop_gradient", "broadcast_in_dim"}))
_exp = Pat("exp", Pat.any("x", dtype=jnp.inexact, where=lambda v: _shifted.match(v) is None))
_sum = Pat("reduce_sum", _exp, params={"axes": Pat.bind("axes")})

RULES = Rules([
    (Pat("mul", x, Pat.const(1)), _identity, "x*1 -> x", True),
    (Pat("div", x, Pat.const(1)), _identity, "x/1 -> x", True),
    (Pat("sub", x, Pat.const(0, where=_plus_zero)), _identity, "x-0 -> x", True),
    (Pat({"add", "add_any"}, x, Pat.const(0)), _identity, "x+0 -> x", False),
    (Pat("neg", Pat("neg", x)), _identity, "--x -> x", True),
    (Pat("integer_pow", x, params={"y": 1}), _identity, "x**1 -> x", True),
    (Pat("convert_element_type", x, params={"sharding": None}), _identity, "convert to own dtype -> x", True),
    (Pat("add", x, Pat("neg", y)), lambda x, y, ctx: ctx.sub(x, y), "x + -y -> x - y", True),
    (Pat("sub", x, Pat("neg", y)), lambda x, y, ctx: ctx.add(x, y), "x - -y -> x + y", True),
    (Pat("transpose", Pat("transpose", x, params={"permutation": Pat.bind("p")}),
         params={"permutation": Pat.bind("q")}), _transpose2, "transpose(transpose(x))", True),
    (Pat("reshape", Pat("reshape", x, params={"dimensions": None, "sharding": None}),
         params={"dimensions": None, "sharding": None, "new_sizes": Pat.bind("shape")}),
     _reshape2, "reshape(reshape(x))", True),
    (Pat("reshape", x, params={"dimensions": None, "sharding": None}), _identity, "reshape to own shape -> x",
     True),
    (Pat("log", Pat("exp", Pat.any("x", dtype=jnp.floating))), _identity, "log(exp(x)) -> x", False),
    (Pat("log", Pat("add", Pat.any("x", dtype=jnp.inexact), Pat.const(1))), lambda x: jnp.log1p(x),
     "log(1+x) -> log1p(x)", False),
    (Pat("div", _exp, Pat("broadcast_in_dim", _sum, params={"shape": Pat.bind("shape"),
                                                               "broadcast_dimensions": Pat.bind("bdims")})),
     _softmax, "softmax -> stable softmax", False),
    (Pat("div", _exp, _sum), _softmax, "softmax (all axes) -> stable softmax", False),
], name="algebra")

EXACT_RULES = RULES.only_exact("algebra_exact")


@register(exact=False)
def algebra(graph):
    """All algebra rules (some reassociate or change rounding: see the module doc)."""
    RULES.apply(graph)
    return graph


@register(exact=True)
def algebra_exact(graph):
    """Only the bit-for-bit exact algebra rules."""
    EXACT_RULES.apply(graph)
    return graph


algebra.rules, algebra_exact.rules = RULES, EXACT_RULES
