"""Outline: wrap some nodes of a graph into one `closed_call` (the inverse of `inline`).

`closed_call` (jax.extend.core.primitives.closed_call_p, params: just
`call_jaxpr`, a ClosedJaxpr) is JAX's plain call whose body carries its own
constants; JAX added it so that a rule could emit several equations plus new
constants as one equation (hoisting invariant residuals out of a scan). Here
it lets a pass or a user treat a sub-graph as a unit, e.g. to name it, to
move it, or to hand it to another tool. `inline` splices it back:
`inline(outline(g, nodes))` gives the same program as `g`.
"""
from __future__ import annotations

from typing import Iterable

from jax.extend.core import DebugInfo

from .. import _jax
from ..ir import Graph, Node, Value
from ..ir.graph import OUT


def outline(graph: Graph, nodes: Iterable[Node], name: str = "outlined", *, close_consts: bool = False) -> Node:
    """Replace `nodes` (pure nodes of `graph`) by one `closed_call` node computing the same; returns it.

    The call takes the values the nodes read from the rest of the graph and
    returns the values the rest of the graph reads from them. `name` goes into
    the body's debug info (closed_call has no name param). With
    close_consts=True, graph constants used only by these nodes move into the
    body as its closed constants; `inline` then appends them to the end of the
    graph's constants (same program, constants reordered). With the default,
    constants are passed as operands and the round trip is exact.
    The nodes must be *convex*: no path leaves the set and comes back.
    """
    order = list(graph.nodes)
    pos = {id(n): i for i, n in enumerate(order)}
    chosen = list(dict.fromkeys(nodes))
    if not chosen:
        raise ValueError("jaxform.outline: no nodes to outline")
    for n in chosen:
        if id(n) not in pos:
            raise ValueError(f"jaxform.outline: {n} ({n.location() or 'no source'}) is not a node of this graph")
        if n.effects:
            raise ValueError(f"jaxform.outline: {n.name} at {n.location() or '?'} has effects "
                             f"({', '.join(str(e) for e, _ in n.effects)}); only pure nodes can be outlined "
                             "(inline does not splice effectful calls back)")
    chosen.sort(key=lambda n: pos[id(n)])
    ids = {id(n) for n in chosen}
    _check_convex(chosen, ids)

    inside_only = lambda v: all(u is not OUT and id(u) in ids for u, _ in v.uses)  # noqa: E731
    free: dict[int, Value] = {}
    for n in chosen:
        for v in n.inputs:
            if not v.is_literal and (v.producer is None or id(v.producer) not in ids):
                free.setdefault(v.id, v)
    closed = [v for v in graph.consts if close_consts and v.id in free and inside_only(v)]
    operands = [v for v in free.values() if not any(v is c for c in closed)]
    escaping = [o for n in chosen for o in n.outputs if not inside_only(o)]
    outer_uses = [[(u, i) for u, i in o.uses if u is OUT or id(u) not in ids] for o in escaping]

    body = Graph(debug_info=DebugInfo("jaxform.outline", name, None, None))
    inner = {v.id: body.add_input(v.aval) for v in operands}
    for v in closed:
        graph.consts.remove(v)
        body.consts.append(v)
    for n in chosen:
        for i, v in enumerate(n.inputs):
            if v.id in inner:
                n.set_input(i, inner[v.id])
    body._nodes = chosen
    graph._nodes = [n for n in graph.nodes if id(n) not in ids]
    body.set_outputs(escaping)
    call = graph.add(_jax.CALL_PRIMITIVE, operands, {}, regions={"body": body}, source_info=chosen[0].source_info,
                     ctx=chosen[0].ctx)
    graph._nodes.pop()
    graph._nodes.insert(sum(1 for n in order[:pos[id(chosen[0])]] if id(n) not in ids), call)
    for k, uses in enumerate(outer_uses):
        for u, i in uses:
            if u is OUT:
                graph.set_output(i, call.outputs[k])
            else:
                u.set_input(i, call.outputs[k])
    return call


def _check_convex(chosen: list[Node], ids: set[int]) -> None:
    """Raise if some node outside the set reads from the set and feeds back into it."""
    seen, stack = set(), [u for n in chosen for o in n.outputs for u in o.users if id(u) not in ids]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for o in n.outputs:
            for u in o.users:
                if id(u) in ids:
                    raise ValueError(f"jaxform.outline: the nodes are not convex: {n.name} at {n.location() or '?'} "
                                     f"reads from them and feeds {u.name} at {u.location() or '?'}, which is "
                                     "among them; add it to the set or outline less")
                stack.append(u)
