"""Pat: a compact pattern language over Graph values (in the spirit of tinygrad's UPat).

A pattern matches a Value by looking *down* at what produced it:

    Pat("log", Pat("exp", Pat.any("x")))          # log(exp(x)), captures x
    Pat("mul", Pat.any("x"), Pat.const(1))        # x * 1 (either operand order: mul is commutative)
    Pat({"max", "min"}, name="m", dtype=jnp.floating)
    Pat("transpose", Pat.any("x"), params={"permutation": Pat.bind("p")})

`match(value)` returns the captures (name -> Value, or the param value for
`Pat.bind`) or None. A name used twice must capture the same value, so
`Pat("sub", Pat.any("x"), Pat.any("x"))` matches `x - x` only.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import _jax

COMMUTATIVE = frozenset({"add", "add_any", "mul", "max", "min", "and", "or", "xor", "eq", "ne"})
_MISSING = object()


class Bind:
    """Capture a param's value under a name: `params={"axes": Pat.bind("axes")}`."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"Pat.bind({self.name!r})"


def _prim_names(prim) -> frozenset | None:
    """Primitive names; a misspelled name is an error (a pattern that can never match is a silent no-op)."""
    if prim is None:
        return None
    prims = prim if isinstance(prim, (set, frozenset, tuple, list)) else (prim,)
    names = []
    for p in prims:
        if isinstance(p, str):
            _jax.primitive(p)    # raises ValueError: no JAX primitive named 'sinn'. Did you mean sin?
            names.append(p)
        elif isinstance(getattr(p, "name", None), str):
            names.append(p.name)
        else:
            raise TypeError(f"jaxform: Pat expects a primitive (a name like 'sin' or a Primitive), got {p!r}")
    return frozenset(names)


def _as_tuple(x) -> tuple | None:
    return None if x is None else tuple(x) if isinstance(x, (tuple, list, set, frozenset)) else (x,)


def const_value(v) -> Any:
    """The scalar a value holds everywhere if it is a literal, an all-equal constant,
    or a broadcast / dtype conversion of one; else None."""
    for _ in range(4):
        if v.is_literal:
            return v.literal.item() if hasattr(v.literal, "item") else v.literal
        if v.is_const:
            c = np.asarray(v.const)
            if c.size == 0 or c.size > 4096:
                return None
            flat = c.reshape(-1)
            return flat[0].item() if (flat == flat[0]).all() else None
        p = v.producer
        if p is None or p.prim.name not in ("broadcast_in_dim", "convert_element_type", "reshape") \
                or len(p.inputs) != 1:
            return None
        v = p.inputs[0]
    return None


def _bind(caps: dict, name: str, v) -> dict | None:
    have = caps.get(name, _MISSING)
    if have is _MISSING:
        caps = dict(caps)
        caps[name] = v
        return caps
    if have is v:
        return caps
    same_literal = getattr(have, "is_literal", False) and getattr(v, "is_literal", False) and \
        have.aval.dtype == v.aval.dtype and have.literal == v.literal
    if same_literal:
        return caps
    try:
        return caps if (not hasattr(have, "aval") and not hasattr(v, "aval") and bool(have == v)) else None
    except Exception:
        return None


class Pat:
    """Matches a Value by its producer's primitive, params, inputs and aval.

    prim: a primitive name/object or a set of them; None matches any value
        (graph inputs, constants and literals included).
    *src: patterns for the producer's inputs (none given: inputs unconstrained).
    name: capture the matched value under this name.
    params: {param: value | predicate | Pat.bind(name)}, or a predicate on the params dict.
    dtype: a dtype, a dtype kind (jnp.floating) or a tuple of them.
    rank: an int or a tuple of allowed ranks. shape: a tuple (None = any size) or a predicate.
    where: a predicate on the matched Value (for anything else).
    commutative: try both operand orders (default: on for add/mul/max/min/and/or/...).
    """
    __slots__ = ("prims", "src", "name", "params", "dtype", "rank", "shape", "where", "commutative", "value",
                 "_checks_aval", "_src_prims")

    def __init__(self, prim=None, *src: "Pat", name: str | None = None,
                 params: dict | Callable[[dict], bool] | None = None, dtype=None, rank=None,
                 shape=None, where: Callable[[Any], bool] | None = None, commutative: bool | None = None):
        self.prims = _prim_names(prim)
        self.src = tuple(src)
        for s in self.src:
            if not isinstance(s, Pat):
                raise TypeError(f"jaxform: Pat sources must be Pats, got {s!r} (use Pat.any(name) or Pat.const(v))")
        self.name, self.params, self.where = name, params, where
        self.dtype, self.rank, self.shape = _as_tuple(dtype), _as_tuple(rank), shape
        if commutative is None:
            commutative = bool(self.prims) and self.prims <= COMMUTATIVE and len(self.src) == 2
        self.commutative = commutative
        self.value = _MISSING
        self._checks_aval = dtype is not None or rank is not None or shape is not None
        self._src_prims = tuple(p.prims for p in self.src)

    # ---- constructors -------------------------------------------------------------
    @classmethod
    def any(cls, name: str | None = None, **constraints) -> "Pat":
        """A wildcard: any value (optionally named and constrained by dtype/rank/shape/where)."""
        return cls(None, name=name, **constraints)

    @classmethod
    def const(cls, value, name: str | None = None, **constraints) -> "Pat":
        """A value equal to the scalar `value` everywhere (a literal, a filled constant, or a broadcast of one)."""
        p = cls(None, name=name, **constraints)
        p.value = value
        return p

    @staticmethod
    def bind(name: str) -> Bind:
        return Bind(name)

    # ---- matching -----------------------------------------------------------------
    def depth(self) -> int:
        return 1 + max((s.depth() for s in self.src), default=0)

    def match(self, v, caps: dict | None = None) -> dict | None:
        """The captures if `v` matches (extending `caps`), else None."""
        node = v.producer
        prims = self.prims
        if prims is not None and (node is None or node.prim.name not in prims):
            return None
        if caps is None:
            caps = {}
        if self._checks_aval and not self._aval_ok(v.aval):
            return None
        if self.value is not _MISSING:
            c = const_value(v)
            if c is None or c != self.value:
                return None
        if self.params is not None:
            caps = self._match_params(node, caps)
            if caps is None:
                return None
        src = self.src
        if src:
            ins = node.inputs
            if len(ins) != len(src):
                return None
            out = self._match_src(src, ins, caps)
            if out is None:
                if not self.commutative:
                    return None
                out = self._match_src(src, ins[::-1], caps)
                if out is None:
                    return None
            caps = out
        if self.where is not None and not self.where(v):
            return None
        if self.name is not None:
            caps = _bind(caps, self.name, v)
        return caps

    def _match_src(self, src, ins, caps):
        # cheap reject on the inputs' producers before recursing
        for ps, a in zip(self._src_prims, ins):
            if ps is not None:
                n = a.producer
                if n is None or n.prim.name not in ps:
                    return None
        for p, a in zip(src, ins):
            caps = p.match(a, caps)
            if caps is None:
                return None
        return caps

    def _aval_ok(self, aval) -> bool:
        if self.dtype is not None and not _dtype_ok(aval.dtype, self.dtype):
            return False
        if self.rank is not None and aval.ndim not in self.rank:
            return False
        return self.shape is None or _shape_ok(aval.shape, self.shape)

    def _match_params(self, node, caps):
        params = node.params if node is not None else {}
        if callable(self.params):
            return caps if self.params(params) else None
        for k, want in self.params.items():
            have = params.get(k, _MISSING)
            if isinstance(want, Bind):
                if have is _MISSING:
                    return None
                caps = _bind(caps, want.name, have)
                if caps is None:
                    return None
            elif callable(want) and not isinstance(want, type):
                if have is _MISSING or not want(have):
                    return None
            elif have is _MISSING or not _eq(have, want):
                return None
        return caps

    def captures(self) -> set[str]:
        """Every name this pattern binds (values and params)."""
        out = {self.name} if self.name else set()
        if isinstance(self.params, dict):
            out |= {w.name for w in self.params.values() if isinstance(w, Bind)}
        for s in self.src:
            out |= s.captures()
        return out

    def __str__(self):
        """Compact form used in rule names: 'log(add(x, 1))'."""
        if self.value is not _MISSING:
            return repr(self.value)
        if self.prims is None:
            return self.name or "_"
        head = "|".join(sorted(self.prims))
        return f"{head}({', '.join(map(str, self.src))})" if self.src else head

    def __repr__(self):
        if self.value is not _MISSING:
            head = f"Pat.const({self.value!r}"
        elif self.prims is None:
            head = "Pat.any("
        else:
            head = f"Pat({'|'.join(sorted(self.prims))!r}"
        parts = [repr(s) for s in self.src]
        if self.name:
            parts.append(f"name={self.name!r}")
        if self.params is not None:
            parts.append(f"params={self.params!r}")
        body = ", ".join(parts)
        return head + (", " if body and not head.endswith("(") else "") + body + ")"


def _eq(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _dtype_ok(dtype, allowed: tuple) -> bool:
    import jax.numpy as jnp
    return any(jnp.issubdtype(dtype, d) for d in allowed)


def _shape_ok(shape, want) -> bool:
    if callable(want):
        return bool(want(shape))
    return len(shape) == len(want) and all(w is None or w == s for s, w in zip(shape, want))
