"""Rules and the rewrite driver: patterns + replacement functions, applied to a fixpoint.

A rule is a (Pat, fn) pair. When the pattern matches a node's result, `fn` is
called with the captures as keyword arguments and returns the replacement
value (or None: no rewrite). It builds new nodes in one of two ways:

* ordinary JAX code (`lambda x: jnp.log1p(x)`): fn is traced with
  `jax.make_jaxpr` on the captured values' avals (literals arrive as concrete
  numpy scalars, `Pat.bind` params as Python values) and the traced nodes are
  spliced in. Traces are cached per rule and input signature, so fn must
  decide only from shapes, dtypes and static captures.
* the builder: if fn takes a `ctx` argument it gets the captured Values and a
  `Ctx` bound to the graph (`ctx.exp(x)`, `ctx.add(x, y)`, `ctx.bind("reduce_sum", x, axes=(0,))`,
  `ctx.literal(1.0, x.aval.dtype)`).

New nodes take the matched root's source_info, so reports point at user lines.
The driver keeps a worklist: after a rewrite only the new nodes and the users
above the changed value (up to the deepest pattern) are looked at again, and
rules are found by the root's primitive name. Bodies of scan/while/cond/jit...
are rewritten too; a rewrite never changes a body's signature.
"""
from __future__ import annotations

import collections
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np

from .. import _jax
from ..ir import Graph, Node, Value
from ..ir.graph import gc_paused
from ..ir.regions import regions_of
from .pattern import Pat


class RewriteError(RuntimeError):
    """A rule is broken: it cycles, or its replacement has the wrong type."""


@dataclass(eq=False)
class Rule:
    """One rewrite: where `pat` matches, replace the root by `fn(**captures)`."""
    pat: Pat
    fn: Callable
    name: str = ""
    exact: bool = False                                   # bit-for-bit equal results?
    check: Callable[[dict, Value], bool] | None = None   # extra test on a match (by-example rules)
    uses_ctx: bool = field(init=False)
    _traces: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.pat, Pat):
            raise TypeError(f"jaxform: a rule needs a Pat, got {self.pat!r}")
        if not self.pat.prims:
            raise ValueError(f"jaxform: the root of a rule's pattern must name primitive(s): {self.pat!r}")
        if not self.name:
            fn_name = getattr(self.fn, "__name__", "<lambda>")
            self.name = f"{self.pat} -> " + ("..." if fn_name == "<lambda>" else fn_name)
        try:
            self.uses_ctx = "ctx" in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            self.uses_ctx = False


class Ctx:
    """Builds nodes into the graph being rewritten (each with the matched root's source info).

    `ctx.bind(prim, *inputs, **params)`, or `ctx.<prim>(*inputs, **params)` for short.
    """

    def __init__(self, graph: Graph, root: Node):
        self.graph, self.root, self.created = graph, root, []

    def bind(self, prim, *inputs, **params) -> Value | list[Value]:
        """Add `prim(*inputs, **params)`; Python scalars become literals of the first value's dtype."""
        dtype = next((v.aval.dtype for v in inputs if isinstance(v, Value)), None)
        ins = [v if isinstance(v, Value) else self.literal(v, dtype) for v in inputs]
        node = self.graph.add(prim, ins, params, source_info=self.root.source_info, ctx=self.root.ctx)
        self.created.append(node)
        return node.outputs if node.prim.multiple_results else node.outputs[0]

    def literal(self, value, dtype) -> Value:
        return Graph.literal(value, dtype)

    def __getattr__(self, prim: str):
        if prim.startswith("_"):
            raise AttributeError(prim)
        return lambda *inputs, **params: self.bind(prim, *inputs, **params)


@dataclass
class RewriteStats:
    """Which rule fired how often, and where (user source lines)."""
    events: list = field(default_factory=list)   # (rule name, source_info of the rewritten node)

    def record(self, rule: Rule, node: Node) -> None:
        self.events.append((rule.name, node.source_info))

    @property
    def total(self) -> int:
        return len(self.events)

    @property
    def fired(self) -> collections.Counter:
        """rule name -> number of firings."""
        return collections.Counter(r for r, _ in self.events)

    def where(self, rule: str | None = None) -> collections.Counter:
        """'file.py:12 (fn)' -> firings (of one rule, or all)."""
        return collections.Counter(_jax.source_summary(si) or "<unknown>" for r, si in self.events
                                   if rule is None or r == rule)

    def __str__(self) -> str:
        if not self.events:
            return "no rewrites fired"
        lines = []
        for rule, n in self.fired.most_common():
            at = ", ".join(f"{loc}" + (f" x{k}" if k > 1 else "") for loc, k in self.where(rule).most_common(3))
            lines.append(f"{n:6d}  {rule}  at {at}")
        return "\n".join(lines)


class Rules:
    """A rule set, dispatched by root primitive name; also a pass (`rules(graph) -> graph`).

        rules = Rules([(Pat("neg", Pat("neg", Pat.any("x"))), lambda x: x)])
        stats = rules.apply(graph)          # or optimize(fn, passes=[rules])
    """

    def __init__(self, rules: Iterable = (), *, name: str = "rules", max_firings: int | None = None):
        self.rules: list[Rule] = []
        self.pass_name, self.max_firings = name, max_firings
        self._index: dict[str, list[Rule]] = {}
        if isinstance(rules, (Pat, Rule)) or not isinstance(rules, Iterable):
            raise TypeError(f"jaxform: Rules takes a list of rules, got {rules!r}: "
                            "Rules([(Pat(...), replacement_fn), ...]) or Rules([rule_by_example(...)])")
        for r in rules:
            if isinstance(r, Rule):
                self.add(r)
            elif isinstance(r, tuple) and 2 <= len(r) <= 4 and isinstance(r[0], Pat) and callable(r[1]):
                self.add(*r)
            else:
                raise TypeError(f"jaxform: a rule is a Rule (from rule_by_example) or a tuple (Pat(...), "
                                f"replacement_fn[, name[, exact]]), got {r!r}" +
                                (" (the class Pat itself: did you mean Pat('prim', ...)?)" if r is Pat else ""))

    def add(self, pat: Pat | Rule, fn: Callable | None = None, name: str = "", exact: bool = False):
        """Add a rule; without `fn`, a decorator: `@rules.add(Pat(...))`."""
        if isinstance(pat, Rule):
            rule = pat
        elif fn is None:
            return lambda f: (self.add(pat, f, name=name, exact=exact), f)[1]
        else:
            rule = Rule(pat, fn, name, exact)
        self.rules.append(rule)
        for p in rule.pat.prims:
            self._index.setdefault(p, []).append(rule)
        self.depth = max(r.pat.depth() for r in self.rules)
        return rule

    def __iter__(self):
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __add__(self, other: "Rules") -> "Rules":
        return Rules([*self.rules, *other.rules], name=f"{self.pass_name}+{other.pass_name}")

    @property
    def exact(self) -> bool:
        return all(r.exact for r in self.rules)

    def only_exact(self, name: str | None = None) -> "Rules":
        return Rules([r for r in self.rules if r.exact], name=name or f"{self.pass_name}_exact")

    def apply(self, graph: Graph, stats: RewriteStats | None = None) -> RewriteStats:
        """Rewrite `graph` in place to a fixpoint (bodies included); returns the stats."""
        stats = RewriteStats() if stats is None else stats
        if self.rules:
            with gc_paused():
                _Driver(self, stats).run(graph, consts_ok=True)
        return stats

    def __call__(self, graph: Graph) -> Graph:
        self.apply(graph)
        return graph

    def __repr__(self):
        return f"Rules<{self.pass_name}: {', '.join(r.name for r in self.rules)}>"


# ---- the driver -----------------------------------------------------------------

class _Driver:
    MAX_GENERATION = 500   # a node rebuilt this many times in a row: the rules cycle

    def __init__(self, rules: Rules, stats: RewriteStats):
        self.rules, self.stats, self.index, self.depth = rules, stats, rules._index, rules.depth
        self.firings, self.budget = 0, rules.max_firings
        self.recent: collections.deque = collections.deque(maxlen=64)
        self.gen: dict[Node, int] = {}

    def run(self, graph: Graph, consts_ok: bool) -> None:
        if self.budget is None:
            self.budget = 10_000 + 20 * len(graph)
        work = collections.deque(graph.nodes)
        queued, seen_regions = set(work), set()
        index, gen = self.index, self.gen
        while work:
            node = work.popleft()
            queued.discard(node)
            if node.dead:
                continue
            if node.regions and node not in seen_regions:
                seen_regions.add(node)
                for r in regions_of(node.prim.name):
                    subs = node.regions[r.name]
                    for sub in (subs if isinstance(subs, tuple) else (subs,)):
                        self.run(sub, consts_ok=consts_ok and r.kind != "open")
            rules = index.get(node.prim.name)
            if not rules:
                continue
            root = node.outputs[0]
            for rule in rules:
                try:
                    caps = rule.pat.match(root)
                    if caps is None or (rule.check is not None and not rule.check(caps, root)):
                        continue
                except RewriteError:
                    raise
                except Exception as e:
                    raise _rule_error(rule, node, "pattern (a where=/params predicate)", e) from e
                new = self.fire(graph, node, rule, caps, consts_ok)
                if new is None:
                    continue
                new_nodes, new_values = new
                g = gen.get(node, 0) + 1
                for n in new_nodes:
                    gen[n] = g
                    if n not in queued:
                        queued.add(n)
                        work.append(n)
                if g > self.MAX_GENERATION or self.firings > self.budget:
                    self.cycle_error(node)
                for n in _users_above(new_values, self.depth):
                    if n not in queued:
                        queued.add(n)
                        work.append(n)
                break

    def fire(self, graph: Graph, node: Node, rule: Rule, caps: dict, consts_ok: bool):
        """Build the replacement and re-point the root's users; None if the rule declines."""
        kwargs = {k: v for k, v in caps.items() if not k.startswith("_")}
        if rule.uses_ctx:
            ctx = Ctx(graph, node)
            try:
                out = rule.fn(**kwargs, ctx=ctx)
            except RewriteError:
                raise
            except Exception as e:
                _remove_unused(graph, reversed(ctx.created))
                raise _rule_error(rule, node, "replacement", e, kwargs) from e
            created = ctx.created
            if out is None:
                _remove_unused(graph, reversed(created))
                return None
        else:
            spliced = _splice_traced(graph, node, rule, kwargs, consts_ok)
            if spliced is None:
                return None
            out, created = spliced
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        _check_types(rule, node, outs)
        if all(o is r for o, r in zip(outs, node.outputs)):
            _remove_unused(graph, reversed(created))
            return None
        for old, new in zip(node.outputs, outs):
            graph.replace_uses(old, new)
        _remove_unused(graph, [node])
        _remove_unused(graph, reversed(created))
        self.firings += 1
        self.recent.append(rule.name)
        self.stats.record(rule, node)
        return [n for n in created if not n.dead], outs

    def cycle_error(self, node: Node):
        counts = collections.Counter(self.recent).most_common()
        names = ", ".join(f"{r!r} (x{k})" for r, k in counts)
        raise RewriteError(
            f"jaxform: the rewrite rules do not terminate: after {self.firings} rewrites they keep rewriting "
            f"the code at {node.location() or 'an unknown location'}. The last {sum(k for _, k in counts)} "
            f"rewrites were by {names}. Make sure no rule undoes another (e.g. a -> b and b -> a) and that "
            f"each replacement is not itself matched by the same rule.")


def _rule_error(rule: Rule, node: Node, part: str, e: Exception, caps: dict | None = None) -> RewriteError:
    """A rule's own code raised: say which rule, on what, at which user line."""
    on = ""
    if caps:
        a = lambda v: v.aval if isinstance(v, Value) else v
        show = lambda v: a(v).str_short(short_dtypes=True) if hasattr(a(v), "str_short") else repr(v)
        on = " on captures {" + ", ".join(f"{k}: {show(v)}" for k, v in caps.items()) + "}"
    return RewriteError(f"jaxform: the {part} of rule {rule.name!r} failed{on} (matched {node.prim.name} at "
                        f"{node.location() or '?'}): {type(e).__name__}: {e}")


def _users_above(values: Sequence[Value], depth: int) -> list[Node]:
    """Nodes whose patterns (at most `depth` deep) can see `values`."""
    out, frontier = [], [v for v in values if isinstance(v, Value)]
    for _ in range(max(depth - 1, 1)):
        nxt = []
        for v in frontier:
            for n, _ in v.uses:
                if n is not None:
                    out.append(n)
                    nxt.extend(n.outputs)
        frontier = nxt
    return out


def _remove_unused(graph: Graph, nodes: Iterable[Node]) -> None:
    """Remove dead effect-free nodes, and then their producers that died with them."""
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n.dead or n.effects or any(o.uses for o in n.outputs):
            continue
        producers = [v.producer for v in n.inputs if v.producer is not None]
        graph.remove(n)
        stack.extend(producers)


def _check_types(rule: Rule, node: Node, outs: list) -> None:
    bad = len(outs) != len(node.outputs) or any(
        not isinstance(o, Value) or o.aval.shape != r.aval.shape or o.aval.dtype != r.aval.dtype
        for o, r in zip(outs, node.outputs))
    if bad:
        got = [o.aval.str_short(short_dtypes=True) if isinstance(o, Value) else type(o).__name__ for o in outs]
        raise RewriteError(
            f"jaxform: rule {rule.name!r} replaced {node.prim.name} at {node.location() or '?'} "
            f"({[o.aval.str_short(short_dtypes=True) for o in node.outputs]}) by values of type {got}; "
            f"a replacement must have the same shapes and dtypes (return None to decline).")


# ---- traced replacements ---------------------------------------------------------

_DECLINED = object()


def _splice_traced(graph: Graph, node: Node, rule: Rule, kwargs: dict, consts_ok: bool):
    """Trace `rule.fn` on the captures (cached) and splice its nodes in; (outputs, new nodes) or None."""
    dyn = [k for k, v in kwargs.items() if isinstance(v, Value) and not v.is_literal]
    static = {k: (_literal_arg(v) if isinstance(v, Value) else v) for k, v in kwargs.items() if k not in dyn}
    avals = tuple(kwargs[k].aval for k in dyn)
    try:
        key = (tuple(dyn), avals, tuple(sorted((k, _static_key(v)) for k, v in static.items())))
        hash(key)
    except TypeError:
        key = None
    closed = rule._traces.get(key) if key is not None else None
    if closed is None:
        closed = _trace(rule, node, dyn, static, avals)
        if key is not None:
            rule._traces[key] = closed
    if closed is _DECLINED:
        return None
    if closed.consts and not consts_ok:
        raise RewriteError(
            f"jaxform: rule {rule.name!r} builds an array constant, which cannot live inside the body of "
            f"this primitive (at {node.location() or '?'}); build it with jnp ops (jnp.full, jnp.arange) instead.")
    sub = Graph.from_jaxpr(closed)
    outs = list(sub.outputs)
    sub.set_outputs([])
    for inner, k in zip(sub.inputs, dyn):
        sub.replace_uses(inner, kwargs[k])
    outs = [kwargs[dyn[sub.inputs.index(o)]] if o in sub.inputs else o for o in outs]
    graph.consts.extend(sub.consts)
    created = sub.nodes
    for n in created:
        n.source_info = node.source_info
        graph.append(n)
    return (outs[0] if len(outs) == 1 and not node.prim.multiple_results else outs), created


def _literal_arg(v: Value):
    """A literal as a concrete scalar: a Python number if weakly typed (so it keeps promoting weakly)."""
    x = np.asarray(v.literal, v.aval.dtype)[()]
    return x.item() if getattr(v.aval, "weak_type", False) else x


def _static_key(v):
    if isinstance(v, np.generic):
        return (v.dtype, v.item())
    return (type(v), v) if isinstance(v, (bool, int, float, complex)) else v


def _trace(rule: Rule, node: Node, dyn, static, avals):
    declined = False

    def f(*arrays):
        nonlocal declined
        out = rule.fn(**static, **dict(zip(dyn, arrays)))
        if out is None:
            declined = True
            return []
        return out

    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)) for a in avals]
    try:
        closed = jax.make_jaxpr(f)(*specs)
    except Exception as e:
        raise _rule_error(rule, node, "replacement", e, dict(zip(dyn, avals))) from e
    if declined:
        return _DECLINED
    if closed.effects:
        raise RewriteError(f"jaxform: the replacement of rule {rule.name!r} has side effects; "
                           "replacements must be pure.")
    return closed
