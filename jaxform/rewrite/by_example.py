"""Rules written as two ordinary JAX functions (torch.fx `replace_pattern` style).

    rule = rule_by_example(lambda x: jnp.log(1 + x), lambda x: jnp.log1p(x))

The pattern function is traced on example arguments (default: f32[5, 7] each)
and turned into a Pat: its arguments become named wildcards, its literals
`Pat.const`s. It is traced a second time with the sizes changed; params that
differ between the two traces depend on the shapes (broadcast shapes, reshape
sizes, ...) and are left free (if it cannot be traced at other sizes, all stay pinned), so the rule matches programs of any shape
wherever the params do not pin it (reduction axes or permutations do). A
replacement that handles only some shapes returns None for the others. Each match is
then confirmed exactly: the pattern function is traced on the captured
values' avals and must give the matched sub-program, params and all, so a
loose pattern never rewrites something else. The replacement is traced on
the captured values at rewrite time, like any traced rule.
"""
from __future__ import annotations

import inspect
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..ir import Graph, Value
from ..ir.identity import structure
from .engine import Rule
from .pattern import COMMUTATIVE, Pat, const_value


def rule_by_example(pattern_fn: Callable, replacement_fn: Callable, *example_args, name: str = "",
                    exact: bool = False, where: Callable[..., bool] | None = None) -> Rule:
    """A Rule replacing `pattern_fn(*xs)` by `replacement_fn(*xs)` wherever it occurs.

    example_args: arrays or ShapeDtypeStructs fixing the ranks/dtypes the pattern is traced
    with (default f32[5, 7] for each argument). exact: the replacement is bit-for-bit equal.
    where: a predicate on the matched graph Values (one per argument, in order); the rule
    fires only where it is true, e.g. to keep it off its own output.
    """
    names = _arg_names(pattern_fn)
    specs = [_spec(a) for a in example_args] if example_args else \
        [jax.ShapeDtypeStruct((5, 7), jnp.float32)] * len(names)
    if len(specs) != len(names):
        raise TypeError(f"jaxform: {_label(pattern_fn)} takes {len(names)} arguments, got {len(specs)} examples")
    g1 = _graph(pattern_fn, specs)
    try:
        g2 = _graph(pattern_fn, [_grown(s) for s in specs])
    except Exception:   # only traceable at the example sizes: every param stays pinned
        g2 = g1
    pat = _Deriver(g1, g2, names, pattern_fn).pat(g1.outputs[0], g2.outputs[0])
    if pat.prims is None:
        raise ValueError(f"jaxform: pattern {_label(pattern_fn)} returns one of its inputs or a constant; "
                         "a pattern must compute something.")
    missing = set(names) - pat.captures()
    if missing:
        raise ValueError(f"jaxform: pattern {_label(pattern_fn)} does not use argument(s) {sorted(missing)}")
    traced: dict = {}

    def check(caps: dict, root: Value) -> bool:
        ins = [caps[n] for n in names]
        if where is not None and not where(*ins):
            return False
        key = tuple(v.aval for v in ins)
        if key not in traced:
            try:
                traced[key] = _graph(pattern_fn, [_spec_of(a) for a in key])
            except Exception:
                traced[key] = None
        g = traced[key]
        return g is not None and _same(g.outputs[0], root, dict(zip(map(id, g.inputs), ins)))

    def replace(**caps):
        return replacement_fn(*[caps[n] for n in names])

    rule_name = name or f"{_label(pattern_fn)} -> {_label(replacement_fn)}"
    return Rule(pat, replace, rule_name, exact, check)


class _Deriver:
    """Walks two traces of the pattern side by side and builds the Pat."""

    def __init__(self, g1: Graph, g2: Graph, names, fn):
        self.inputs = {id(v): Pat.any(n) for v, n in zip(g1.inputs, names)}
        self.memo: dict[int, Pat] = {}
        self.fn = fn

    def pat(self, v1: Value, v2: Value) -> Pat:
        if id(v1) in self.inputs:
            return self.inputs[id(v1)]
        if id(v1) in self.memo:
            return self.memo[id(v1)]
        if v1.is_literal or v1.is_const:
            c = const_value(v1)
            if c is None:
                raise ValueError(f"jaxform: pattern {_label(self.fn)} uses an array constant; "
                                 "pass it as an argument instead.")
            return Pat.const(c)
        n1, n2 = v1.producer, v2.producer
        if n2 is None or n1.prim is not n2.prim or len(n1.inputs) != len(n2.inputs) or v1.index != v2.index:
            raise ValueError(f"jaxform: pattern {_label(self.fn)} traces to different programs for "
                             "different input sizes; pass example_args with the shapes it is meant for.")
        params = {k: p for k, p in n1.params.items() if _eq(p, n2.params.get(k, _eq))}
        where = None if len(n1.outputs) == 1 else (lambda v, i=v1.index: v.index == i)
        p = Pat(n1.prim.name, *(self.pat(a, b) for a, b in zip(n1.inputs, n2.inputs)),
                params=params, where=where)
        self.memo[id(v1)] = p
        return p


def _same(p: Value, t: Value, env: dict) -> bool:
    """Does the target value `t` compute exactly what pattern value `p` does (inputs bound by env)?"""
    if id(p) in env:
        return env[id(p)] is t
    if p.is_literal or p.is_const:
        if not (t.is_literal or t.is_const) or t.aval.dtype != p.aval.dtype or t.aval.shape != p.aval.shape:
            return False
        a = p.literal if p.is_literal else p.const
        b = t.literal if t.is_literal else t.const
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    pn, tn = p.producer, t.producer
    if tn is None or pn.prim is not tn.prim or p.index != t.index or len(pn.inputs) != len(tn.inputs) \
            or p.aval.shape != t.aval.shape or p.aval.dtype != t.aval.dtype:
        return False
    if pn.params.keys() != tn.params.keys() or not all(_eq(pn.params[k], tn.params[k]) for k in pn.params):
        return False
    if pn.regions and _bodies(pn) != _bodies(tn):   # the identity rule: never by printed text
        return False
    if all(_same(a, b, env) for a, b in zip(pn.inputs, tn.inputs)):
        return True
    return pn.prim.name in COMMUTATIVE and len(pn.inputs) == 2 and \
        all(_same(a, b, env) for a, b in zip(pn.inputs, tn.inputs[::-1]))


def _bodies(n):
    try:
        return [structure(g) for g in n.subgraphs()]
    except TypeError:   # an unhashable param: equal to nothing
        return [object()]


def _eq(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return False


def _arg_names(fn) -> list[str]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        raise TypeError(f"jaxform: pattern {_label(fn)} must take plain positional arguments")
    return [p.name for p in params]


def _spec(a):
    return a if isinstance(a, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(np.shape(a), jnp.result_type(a))


def _spec_of(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False))


def _grown(s):
    return jax.ShapeDtypeStruct(tuple(d + 2 if d > 1 else d for d in s.shape), s.dtype)


def _graph(fn, specs) -> Graph:
    closed = jax.make_jaxpr(fn)(*specs)
    if len(closed.out_avals) != 1:
        raise ValueError(f"jaxform: pattern {_label(fn)} must return a single array")
    return Graph.from_jaxpr(closed)


def _label(fn) -> str:
    name = getattr(fn, "__name__", repr(fn))
    if name != "<lambda>":
        return name
    try:
        code = fn.__code__
        return f"<lambda at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}>"
    except AttributeError:
        return name
