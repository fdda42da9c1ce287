"""Graph, Node, Value: an SSA graph with use lists, round-tripping with jaxprs.

A jaxpr is a list of equations over variables. Rewriting wants more: *who
uses this value?* and *replace this value everywhere*. So a Graph holds
Nodes (equations) whose inputs and outputs are Values, and each Value keeps
its list of uses. Bodies of known higher-order primitives (scan, while,
cond, jit, ... see regions.py) become sub-Graphs in `node.regions`;
everything else about an equation (params, effects, source info, context)
is kept as is, so `Graph.from_jaxpr(j).to_jaxpr()` is `j` up to renaming.
"""
from __future__ import annotations

import contextlib
import contextvars
import gc
import itertools
from typing import Any, Iterator, Sequence

from .. import _jax
from .identity import is_impure, structure
from .printing import format_graph
from .regions import Region, regions_of

_ids = itertools.count()
OUT = None  # the "user" recorded in Value.uses for a graph output


@contextlib.contextmanager
def gc_paused():
    """Pause Python's cyclic GC (also usable as a decorator). Building or rewriting a graph allocates
    many objects that refcounting frees; full collections walking a 100k-node graph were 60-70%
    of a round trip's time."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Value:
    """An SSA value: a graph input, a constant, a literal, or a node output."""
    __slots__ = ("aval", "producer", "index", "uses", "literal", "const", "id", "__weakref__")

    def __init__(self, aval, producer: "Node | None" = None, index: int = 0, *,
                 literal: Any = None, const: Any = None):
        self.aval, self.producer, self.index = aval, producer, index
        self.uses: list[tuple[Node | None, int]] = []
        self.literal, self.const = literal, const
        self.id = next(_ids)

    @property
    def is_literal(self) -> bool:
        return self.literal is not None

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def users(self) -> list["Node"]:
        """The nodes consuming this value (each once), excluding graph outputs."""
        seen: dict[int, Node] = {}
        for n, _ in self.uses:
            if n is not None:
                seen.setdefault(id(n), n)
        return list(seen.values())

    @property
    def is_output(self) -> bool:
        return any(n is None for n, _ in self.uses)

    def __repr__(self):
        what = f"lit {self.literal}" if self.is_literal else (f"{self.producer.prim.name}" if self.producer else "input")
        return f"Value#{self.id}<{self.aval.str_short()} {what}>"


class Node:
    """One equation: a primitive applied to input Values, producing output Values."""
    __slots__ = ("prim", "inputs", "outputs", "params", "regions", "effects", "source_info", "ctx", "dead")

    def __init__(self, prim, inputs: Sequence[Value], out_avals, params: dict, *,
                 regions: dict | None = None, effects=(), source_info=None, ctx=None):
        self.prim, self.params = prim, dict(params)
        self.regions: dict[str, Graph | tuple[Graph, ...]] = dict(regions or {})
        self.inputs: list[Value] = []
        for i, v in enumerate(inputs):
            self.inputs.append(v)
            v.uses.append((self, i))
        self.outputs = [Value(a, self, i) for i, a in enumerate(out_avals)]
        self.effects = tuple(effects)  # (effect, Value-it-targets-or-None)
        self.source_info = source_info if source_info is not None else _jax.new_source_info()
        self.ctx, self.dead = ctx, False

    @property
    def name(self) -> str:
        return self.prim.name

    def set_input(self, i: int, v: Value) -> None:
        old = self.inputs[i]
        old.uses.remove((self, i))
        self.inputs[i] = v
        v.uses.append((self, i))

    def set_inputs(self, values: Sequence[Value]) -> None:
        for i, v in enumerate(self.inputs):
            v.uses.remove((self, i))
        self.inputs = list(values)
        for i, v in enumerate(self.inputs):
            v.uses.append((self, i))

    def set_outputs(self, values: Sequence[Value]) -> None:
        """Replace the output list (results must be unused or re-pointed by the caller)."""
        self.outputs = list(values)
        for i, o in enumerate(self.outputs):
            o.producer, o.index = self, i

    def subgraphs(self) -> Iterator["Graph"]:
        for r in self.regions.values():
            yield from (r if isinstance(r, tuple) else (r,))

    def full_params(self) -> dict:
        """params with the regions turned back into (closed) jaxprs, as JAX expects them."""
        params = dict(self.params)
        for r in regions_of(self.prim.name):
            params[r.param] = _region_to_param(r, self.regions[r.name])
        return _jax.jax_params(self.prim, params)

    def location(self) -> str:
        """'file.py:12 (fn)' of the user code that produced this node, or ''."""
        return _jax.source_summary(self.source_info)

    def __repr__(self):
        return f"Node<{self.prim.name} {self.location()}>"


class Graph:
    """A program: inputs, constants, nodes in a valid order, outputs.

    Passes mutate graphs through `add`, `replace_uses` and `remove`, which keep
    the use lists right. Node order need not be topological after edits:
    `to_jaxpr` emits each node after its producers.
    """

    def __init__(self, inputs: Sequence[Value] = (), consts: Sequence[Value] = (),
                 outputs: Sequence[Value] = (), nodes: Sequence[Node] = (), *, debug_info=None):
        self.inputs, self.consts, self._nodes = list(inputs), list(consts), list(nodes)
        self.outputs: list[Value] = []
        for v in outputs:
            self._add_output(v)
        self.debug_info = debug_info
        self.in_tree = self.out_tree = None   # pytree structure, when traced from a Python function
        self._dirty = False

    # ---- reading ------------------------------------------------------------
    @property
    def nodes(self) -> list[Node]:
        if self._dirty:
            self._nodes = [n for n in self._nodes if not n.dead]
            self._dirty = False
        return self._nodes

    def walk(self) -> Iterator[tuple[Node, "Graph"]]:
        """Every (node, graph-that-holds-it), recursing into sub-graphs (pre-order)."""
        for n in self.nodes:
            yield n, self
            for g in n.subgraphs():
                yield from g.walk()

    def __len__(self) -> int:
        return sum(1 for _ in self.walk())

    @property
    def in_avals(self):
        return [v.aval for v in self.inputs]

    @property
    def out_avals(self):
        return [v.aval for v in self.outputs]

    # ---- editing ------------------------------------------------------------
    def _add_output(self, v: Value) -> None:
        v.uses.append((OUT, len(self.outputs)))
        self.outputs.append(v)

    def set_output(self, i: int, v: Value) -> None:
        self.outputs[i].uses.remove((OUT, i))
        self.outputs[i] = v
        v.uses.append((OUT, i))

    def set_outputs(self, values: Sequence[Value]) -> None:
        for i, v in enumerate(self.outputs):
            v.uses.remove((OUT, i))
        self.outputs = []
        for v in values:
            self._add_output(v)

    def add_output(self, v: Value) -> int:
        self._add_output(v)
        return len(self.outputs) - 1

    def add_input(self, aval, index: int | None = None) -> Value:
        v = Value(aval)
        self.inputs.insert(len(self.inputs) if index is None else index, v)
        return v

    def add_const(self, array) -> Value:
        v = Value(_jax.get_aval(array), const=array)
        self.consts.append(v)
        return v

    @staticmethod
    def literal(value, dtype, weak_type: bool = False) -> Value:
        """A scalar literal operand (not a graph member: literals are inlined into equations)."""
        import numpy as np
        return Value(_jax.ShapedArray((), np.dtype(dtype), weak_type=weak_type),
                     literal=np.array(value, dtype)[()])

    def add(self, prim, inputs: Sequence[Value], params: dict | None = None, *,
            regions: dict | None = None, out_avals=None, source_info=None, ctx=None,
            before: Node | None = None) -> Node:
        """Append a new node (or insert it `before` one: where an effectful node must keep its
        place in the effect order); output avals come from abstract evaluation unless given.

        A pass that rebuilds or moves a node passes its `source_info` and `ctx`
        (the equation context: threefry mode, compute type, mesh, XLA metadata)
        so the new node computes what the old one did and reports the same line.
        """
        if isinstance(prim, str):
            prim = _jax.primitive(prim)
        params = _jax.complete_params(prim, dict(params or {}))
        node = Node(prim, inputs, [], params, regions=regions, source_info=source_info, ctx=ctx)
        try:
            avals, effs = _jax.abstract_eval(prim, [v.aval for v in inputs], node.full_params())
        except Exception:
            node.set_inputs([])  # a node that was never added must not stay in its operands' use lists
            raise
        if out_avals is not None:
            avals = out_avals
        node.outputs = [Value(a, node, i) for i, a in enumerate(avals)]
        node.effects = tuple((e, inputs[t] if isinstance(t := _jax.input_effect_target(e), int) else None)
                             for e in effs)
        return self._insert(node, before)

    def _insert(self, node: Node, before: Node | None) -> Node:
        if before is None:
            self._nodes.append(node)
        else:
            nodes = self.nodes
            nodes.insert(nodes.index(before), node)
        return node

    def append(self, node: Node) -> Node:
        self._nodes.append(node)
        return node

    def copy_node(self, node: Node, inputs: Sequence[Value], *, before: Node | None = None) -> Node:
        """A second `node` reading `inputs`: the same primitive, params, regions (shared: bodies are
        read, not edited in place), source line and context; its effects' targets follow the inputs.
        Unlike `add`, no abstract evaluation: call-likes (`custom_jvp_call`) have none."""
        where = {id(v): i for i, v in enumerate(node.inputs)}
        effects = tuple((e, inputs[where[id(t)]] if t is not None else None) for e, t in node.effects)
        copy = Node(node.prim, inputs, [o.aval for o in node.outputs], node.params, regions=node.regions,
                    effects=effects, source_info=node.source_info, ctx=node.ctx)
        return self._insert(copy, before)

    def replace_uses(self, old: Value, new: Value) -> None:
        """Make every user of `old` (nodes and graph outputs) use `new` instead."""
        if old is new:
            return
        for user, i in list(old.uses):
            if user is OUT:
                self.set_output(i, new)
            else:
                user.set_input(i, new)

    def remove(self, node: Node) -> None:
        """Drop a node whose outputs are unused."""
        assert all(not o.uses for o in node.outputs), f"removing {node} whose outputs are still used"
        for i, v in enumerate(node.inputs):
            v.uses.remove((node, i))
        node.dead, self._dirty = True, True

    def copy(self) -> "Graph":
        g = Graph.from_jaxpr(self.to_jaxpr())
        g.in_tree, g.out_tree = self.in_tree, self.out_tree
        return g

    # ---- jaxpr round trip ---------------------------------------------------
    @classmethod
    @gc_paused()
    def from_jaxpr(cls, jaxpr, consts: Sequence[Any] | None = None) -> "Graph":
        """Build from a ClosedJaxpr (or an open Jaxpr plus its consts)."""
        if isinstance(jaxpr, _jax.ClosedJaxpr):
            jaxpr, consts = jaxpr.jaxpr, jaxpr.consts
        consts = list(consts or ())
        env: dict[Any, Value] = {}
        g = cls(debug_info=jaxpr.debug_info)
        for v, c in zip(jaxpr.constvars, consts):
            env[v] = Value(v.aval, const=c)
            g.consts.append(env[v])
        for v in jaxpr.invars:
            env[v] = Value(v.aval)
            g.inputs.append(env[v])

        def read(a):
            return Value(a.aval, literal=a.val) if _jax.is_literal(a) else env[a]

        for eqn in jaxpr.eqns:
            params, regions = _jax.canonical_params(eqn.primitive, eqn.params), {}
            for r in regions_of(eqn.primitive.name):
                regions[r.name] = _param_to_region(r, params.pop(r.param))
            effects = tuple((e, env.get(t) if (t := _jax.input_effect_target(e)) is not None else None)
                            for e in eqn.effects)
            node = Node(eqn.primitive, [read(a) for a in eqn.invars], [v.aval for v in eqn.outvars], params,
                        regions=regions, effects=effects, source_info=eqn.source_info, ctx=eqn.ctx)
            for v, out in zip(eqn.outvars, node.outputs):
                if not _jax.is_dropvar(v):
                    env[v] = out
            g._nodes.append(node)
        for a in jaxpr.outvars:
            g._add_output(read(a))
        return g

    @gc_paused()
    def to_jaxpr(self) -> "_jax.ClosedJaxpr":
        """Back to a ClosedJaxpr; unused node outputs become dropped vars (`_`)."""
        if _EMITTED.get() is None:   # the outermost call: bodies are shared within it
            token = _EMITTED.set({})   # {"bodies": ..., "structure": ..., "impure": ...}
            try:
                return self._to_jaxpr()
            finally:
                _EMITTED.reset(token)
        return self._to_jaxpr()

    def _to_jaxpr(self) -> "_jax.ClosedJaxpr":
        env: dict[int, Any] = {}
        constvars = [env.setdefault(v.id, _jax.Var(v.aval)) for v in self.consts]
        invars = [env.setdefault(v.id, _jax.Var(v.aval)) for v in self.inputs]

        def atom(v: Value):
            if v.is_literal:
                return _jax.Literal(v.literal, v.aval)
            if v.id not in env:
                raise ValueError(f"jaxform: {v} is used but not defined in this graph "
                                 "(a pass left a dangling value)")
            return env[v.id]

        eqns, emitted = [], set()

        def emit_one(n: Node):
            emitted.add(id(n))
            outvars = [env.setdefault(o.id, _jax.Var(o.aval)) if o.uses else _jax.DropVar(o.aval)
                       for o in n.outputs]
            effects = {e if t is None else e.replace(env.get(t.id, _jax.input_effect_target(e)))
                       for e, t in n.effects}
            eqns.append(_jax.new_jaxpr_eqn([atom(v) for v in n.inputs], outvars, n.prim, n.full_params(),
                                           effects, n.source_info, n.ctx))

        # Effectful (impure) nodes form a chain in node order: each also depends on the previous
        # one, so emitting a node's producers first never hoists a ref read, callback or RNG draw
        # above an effect that preceded it. A pass that made an earlier effect depend on a later
        # one has moved code across an effect: that is an error, never a silent reorder.
        nodes, memo = self.nodes, _memo("impure")
        after: dict[int, Node] = {}
        prev = None
        for n in nodes:
            if is_impure(n, memo):
                if prev is not None:
                    after[id(n)] = prev
                prev = n

        def deps(n: Node):
            ds = [v.producer for v in n.inputs if v.producer is not None]
            if id(n) in after:
                ds.append(after[id(n)])
            return ds

        def emit(node: Node):  # dependencies first (node order may be stale after edits)
            active: set[int] = set()
            stack = [(node, False)]
            while stack:
                n, ready = stack.pop()
                if id(n) in emitted:
                    continue
                if ready:
                    active.discard(id(n))
                    emit_one(n)
                    continue
                if id(n) in active:
                    raise ValueError(_order_error(n, node))
                active.add(id(n))
                stack.append((n, True))
                stack.extend((d, False) for d in reversed(deps(n)) if id(d) not in emitted)

        for n in nodes:
            if id(n) in emitted:
                continue      # already emitted as a dependency of an earlier node
            if all(id(d) in emitted for d in deps(n)):
                emit_one(n)   # the common case: already in order
            else:
                emit(n)
        outvars = [atom(v) for v in self.outputs]
        effects = _jax.jaxpr_effects(constvars, invars, outvars, eqns)
        debug = self.debug_info
        if debug is not None and (len(getattr(debug, "arg_names", ()) or ()) != len(invars) or
                                  len(getattr(debug, "result_paths", ()) or ()) not in (0, len(outvars))):
            debug = debug._replace(arg_names=None, result_paths=None) if hasattr(debug, "_replace") else None
        return _jax.closed_jaxpr(constvars, invars, outvars, eqns, effects, debug, [v.const for v in self.consts])

    # ---- running ------------------------------------------------------------
    def evaluate(self, *args):
        """Run the graph by binding its primitives: works under jit/grad/vmap traces."""
        return _jax.eval_jaxpr(self.to_jaxpr(), *args)

    def __str__(self) -> str:
        return format_graph(self)

    def __repr__(self) -> str:
        return f"Graph<{len(self.inputs)} in, {len(self.outputs)} out, {len(self.nodes)} nodes>"


def _param_to_region(r: Region, p):
    if r.kind == "closed_tuple":
        return tuple(Graph.from_jaxpr(b) for b in p)
    if r.kind == "open":
        return Graph.from_jaxpr(p, ())
    return Graph.from_jaxpr(p)


# Per top-level to_jaxpr: bodies emitted so far by structure (`identity.structure`: callables,
# custom rules, params and ctx by identity, never printed text), so call sites that shared a body
# in the original jaxpr (each got its own editable sub-Graph) share one again instead of one copy
# per site multiplying through nested calls (3 distinct jit bodies came back as 258); and memos
# of structures and purity (graphs do not change while they are emitted).
_EMITTED: contextvars.ContextVar = contextvars.ContextVar("jaxform_emitted_bodies", default=None)


def _memo(kind: str) -> dict:
    state = _EMITTED.get()
    return {} if state is None else state.setdefault(kind, {})


def _order_error(n: Node, root: Node) -> str:
    where = lambda m: f"{m.name}" + (f" at {m.location()}" if m.location() else "")
    return (f"jaxform: effect order violated: {where(n)} would have to run before an effect it follows "
            f"(reached from {where(root)}). A pass moved a computation across a ref read/write, callback, "
            "debug print or RNG draw without proving independence.")


def _body_jaxpr(g: "Graph"):
    closed = g.to_jaxpr()
    state = _EMITTED.get()
    if state is None:   # full_params() outside a to_jaxpr
        return closed
    try:
        key = structure(g, state.setdefault("structure", {}))
    except TypeError:   # unhashable params: keep it unshared
        return closed
    return state.setdefault("bodies", {}).setdefault(key, closed)


def _region_to_param(r: Region, g):
    if r.kind == "closed_tuple":
        return tuple(_body_jaxpr(b) for b in g)
    closed = _body_jaxpr(g)
    if r.kind == "open":
        if closed.consts:
            raise ValueError("jaxform: a pass gave constants to a region that cannot hold them "
                             f"({r.name} of an open-jaxpr primitive)")
        return closed.jaxpr
    return closed
