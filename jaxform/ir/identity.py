"""Identity and order: when two nodes compute the same thing, and what may move.

Every code path that merges (CSE, LICM's dedup, the body sharing in
`Graph.to_jaxpr`) or reorders (`to_jaxpr`'s emission, loop fusion) asks here,
so the rules live once:

- `node_key(node, name)` is a hashable key; equal keys mean "computes the
  same values from the same operands". Callables, custom_jvp/vjp rules,
  jaxprs and the equation context (`eqn.ctx`: threefry mode, compute type,
  mesh, XLA metadata) compare by *identity*; plain values (numbers, strings,
  dtypes, shardings, NumPy arrays by dtype+shape+bytes) by value; effects and
  output types are part of the key. Printed text is never a key: JAX prints
  callbacks with masked addresses and custom rules by name only.
  Unhashable params raise TypeError: such nodes are not mergeable.
- `structure(graph)` is a body up to renaming of its values.
- `is_impure(node)`: never merged, never reordered against each other.
- `may_move_across(node, others)` / `effect_free(values)`: what a pass may
  reorder without proof of its own.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

from .. import _jax

if TYPE_CHECKING:
    from .graph import Graph, Node, Value

__all__ = ["IMPURE_PRIMITIVES", "node_key", "structure", "program_identity", "UNSHARED", "param_key", "is_impure",
           "is_ordered",
           "effect_free", "may_move_across", "rules_impure"]

# Primitives whose result is not a function of their operands alone, or that do something
# besides computing it. Effects already mark most of them (io_callback, debug_callback and
# debug_print carry effects, ref ops carry Read/Write/Accum effects); this table also covers
# the ones JAX gives no effect:
#   rng_uniform      draws from XLA's hidden RNG state: two equal-looking draws differ.
#                    (random_bits / random_seed / random_wrap / threefry2x32 /
#                    rng_bit_generator are pure functions of their key: mergeable, with
#                    their ctx, which holds `jax_threefry_partitionable`.)
#   pure_callback    JAX allows merging or dropping it, but users count calls (caches,
#                    logging) and differential tests compare call sequences; we never merge
#                    callbacks and keep their order.
#   new_ref / empty_ref
#                    each call makes a fresh buffer: merging two would alias them.
#   get / swap / addupdate / freeze
#                    read or write a ref: the value depends on the writes before it.
IMPURE_PRIMITIVES = frozenset({
    "rng_uniform",
    "pure_callback", "io_callback", "debug_callback", "debug_print",
    "new_ref", "empty_ref", "get", "swap", "addupdate", "freeze",
})


class _Id:
    """A key part compared by object identity (and holding the object, so its id is not reused)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __eq__(self, other):
        return isinstance(other, _Id) and other.obj is self.obj

    def __hash__(self):
        return id(self.obj)

    def __repr__(self):
        return f"_Id({type(self.obj).__name__}@{id(self.obj):#x})"


_PLAIN = (int, float, complex, bool, str, bytes, type(None), np.dtype, np.generic)
_BY_IDENTITY = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, _jax.Jaxpr, _jax.ClosedJaxpr)


def param_key(v: Any):
    """Hashable key of one param value (TypeError if it cannot be compared safely)."""
    if isinstance(v, _PLAIN):
        return (type(v), v)
    if isinstance(v, tuple):
        return (type(v), tuple(param_key(x) for x in v))
    if isinstance(v, (frozenset,)):
        return (frozenset, frozenset(param_key(x) for x in v))
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, _BY_IDENTITY) or callable(v):
        return _Id(v)   # user functions, custom rules, jaxprs: the same object or not equal
    if isinstance(v, (list, dict, set)):
        raise TypeError(f"unhashable param {type(v).__name__}")
    hash(v)             # shardings, enums, dimension numbers, effects...: value equality
    return (type(v), v)


def _literal_key(v: "Value"):
    a = np.asarray(v.literal)
    return ("lit", v.aval, a.dtype.str, a.tobytes())


def _ctx_key(ctx):
    # JAX interns equation contexts: equal settings give the same object.
    return None if ctx is None else _Id(ctx)


def _effects_key(node: "Node", name: Callable):
    return frozenset((type(e), name(t)) if t is not None else e for e, t in node.effects)


def node_key(node: "Node", name: Callable = lambda v: v.id, memo: dict | None = None):
    """Hashable identity of what a node computes; `name(v)` names its non-literal operands.

    TypeError if a param is unhashable (the node is then not mergeable).
    """
    ins = tuple(_literal_key(v) if v.is_literal else name(v) for v in node.inputs)
    params = tuple(sorted((k, param_key(p)) for k, p in node.params.items()))
    return (_Id(node.prim), ins, params, tuple(o.aval for o in node.outputs), _ctx_key(node.ctx),
            _effects_key(node, name), tuple(structure(g, memo) for g in node.subgraphs()))


def structure(g: "Graph", memo: dict | None = None):
    """A body up to renaming: inputs by position (with types), constants by identity.

    `memo` (id(graph) -> structure) avoids recomputing nested bodies; only valid
    while the graphs are alive and unchanged.
    """
    if memo is not None and id(g) in memo:
        return memo[id(g)]
    local = {v.id: ("in", i) for i, v in enumerate(g.inputs)}
    local.update((v.id, ("const", _Id(v.const))) for v in g.consts)
    name = lambda v: local.get(v.id, ("free", v.id))
    nodes = []
    for k, n in enumerate(g.nodes):
        nodes.append(node_key(n, name, memo))
        local.update((o.id, ("node", k, j)) for j, o in enumerate(n.outputs))
    outs = tuple(_literal_key(v) if v.is_literal else name(v) for v in g.outputs)
    key = (tuple(v.aval for v in g.inputs), tuple(v.aval for v in g.consts), tuple(nodes), outs)
    if memo is not None:
        memo[id(g)] = key
    return key


UNSHARED = "unshared"    # the first element of a program_identity equal only to its owner


def program_identity(g: "Graph", owner: object):
    """A whole program's key for caches: `structure(g)`, hashable; a program with an unhashable param is
    equal only to itself, `("unshared", id(owner))` (the cache entry must hold `owner`, so the id is not
    reused)."""
    try:
        key = structure(g)
        hash(key)
        return key
    except TypeError:
        return (UNSHARED, id(owner))


# ---- purity and order -----------------------------------------------------------

_REF_TYPES: dict[type, bool] = {}


def _is_ref(aval) -> bool:
    t = type(aval)
    if t not in _REF_TYPES:
        _REF_TYPES[t] = _jax.is_ref_aval(aval)
    return _REF_TYPES[t]


def is_impure(node: "Node", memo: dict | None = None) -> bool:
    """True if the node (or anything in its bodies) has effects, is in `IMPURE_PRIMITIVES`,
    or takes or makes a Ref: it is never merged and keeps its order among such nodes."""
    if memo is not None and id(node) in memo:
        return memo[id(node)]
    out = bool(node.effects) or node.prim.name in IMPURE_PRIMITIVES or \
        any(_is_ref(v.aval) for v in node.inputs) or any(_is_ref(v.aval) for v in node.outputs) or \
        any(is_impure(n, memo) for g in node.subgraphs() for n in g.nodes) or rules_impure(node)
    if memo is not None:
        memo[id(node)] = out
    return out


is_ordered = is_impure   # the nodes whose relative order `to_jaxpr` and every pass keep


# ---- effects inside custom derivative rules ------------------------------------------
# A `custom_jvp`'s jvp rule and a `custom_vjp`'s fwd and bwd are callables, not regions: JAX types the
# call by its primal body's effects only, so a `jax.debug.callback` in a rule was invisible here and
# remat recomputed it (11 calls per grad where plain JAX makes 6, issue 38). Each rule is traced once,
# on its signature (cached by the rule object's identity: it lives once in the IR).
_RULE_IMPURE: dict[int, tuple[object, bool]] = {}
_DEPTH = [0]


def _jaxpr_impure(jaxpr) -> bool:
    """Effects, or an impure primitive, anywhere in `jaxpr` (open or closed), rules of nested calls included."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    if getattr(jaxpr, "effects", None):
        return True
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in IMPURE_PRIMITIVES or eqn.effects or _eqn_rules_impure(eqn.primitive.name, eqn.params,
                                                                                        eqn.invars, eqn.outvars):
            return True
        for v in eqn.params.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if hasattr(x, "eqns") or hasattr(getattr(x, "jaxpr", None), "eqns"):
                    if _jaxpr_impure(x):
                        return True
    return False


def _trace_rules(name: str, params: dict, in_avals: list, out_avals: list) -> bool:
    import jax   # (tracing a rule on its signature: public API only)
    nc = params.get("num_consts", 0)
    if name == "custom_jvp_call":
        jaxpr, _, _ = params["jvp_jaxpr_fun"].call_wrapped(*[False] * len(in_avals))
        return _jaxpr_impure(jaxpr)
    # custom_vjp_call: fwd (nonzero tangents for the non-const inputs), then bwd on fwd's residuals
    fwd, _ = params["fwd_jaxpr_thunk"].call_wrapped(*[True] * (len(in_avals) - nc))
    if _jaxpr_impure(fwd):
        return True
    _, res_tree, fwds = params["out_trees"]()
    primal_avals = in_avals[nc:]
    stored = iter(getattr(fwd, "out_avals", None) or [v.aval for v in fwd.outvars])
    res = [primal_avals[f] if f is not None else next(stored) for f in fwds]
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (*res, *out_avals)]
    bwd = jax.make_jaxpr(lambda *a: params["bwd"].call_wrapped(*a))(*specs)
    return _jaxpr_impure(bwd)


def _eqn_rules_impure(name: str, params: dict, invars, outvars) -> bool:
    if name not in ("custom_jvp_call", "custom_vjp_call"):
        return False
    key = params.get("jvp_jaxpr_fun" if name == "custom_jvp_call" else "fwd_jaxpr_thunk")
    if key is None:
        return False
    hit = _RULE_IMPURE.get(id(key))
    if hit is not None and hit[0] is key:
        return hit[1]
    if _DEPTH[0] >= 2:   # a rule's rule's rule (relu's jvp calls relu): higher orders only; not followed further
        return False
    _DEPTH[0] += 1
    try:
        out = _trace_rules(name, params, [v.aval for v in invars], [v.aval for v in outvars])
    except Exception:   # a rule we cannot trace on its signature: assume it may do anything
        out = True
    finally:
        _DEPTH[0] -= 1
    if len(_RULE_IMPURE) > 4096:
        _RULE_IMPURE.clear()
    _RULE_IMPURE[id(key)] = (key, out)
    return out


def rules_impure(node: "Node") -> bool:
    """True if `node` is a custom_jvp/custom_vjp call whose rules (jvp; fwd and bwd) have effects or call
    impure primitives: they run when the program is differentiated, so the call must not be recomputed,
    merged or reordered any more than an effect in its body."""
    return _eqn_rules_impure(node.prim.name, node.params, node.inputs, node.outputs)


def effect_free(values: Iterable["Value"]) -> bool:
    """True if computing `values` (their producers, transitively) involves no impure node.

    Such a computation reads no ref and runs no callback, so it may be moved
    anywhere its operands are available (e.g. into a loop that writes refs).
    """
    seen, stack = set(), [v.producer for v in values if v.producer is not None]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if is_impure(n):
            return False
        stack.extend(v.producer for v in n.inputs if v.producer is not None)
    return True


_READ = "ReadEffect"


def _only_reads(n: "Node") -> bool:
    return bool(n.effects) and n.prim.name not in IMPURE_PRIMITIVES - {"get"} and \
        all(type(e).__name__ == _READ for e, _ in n.effects) and \
        all(not is_impure(m) for g in n.subgraphs() for m in g.nodes)


def may_move_across(node: "Node", others: Iterable["Node"]) -> bool:
    """May `node` be reordered relative to each of `others` (data dependencies aside)?

    Proven only when one of each pair is pure (pure code cannot observe an
    effect) or both only read refs (reads commute). Everything else (a ref read
    against a write, callbacks, debug prints, RNG state) keeps its order.
    Passes that move code across a loop or another node ask this first.
    """
    if not is_impure(node):
        return True
    return all(not is_impure(o) or (_only_reads(node) and _only_reads(o)) for o in others)
