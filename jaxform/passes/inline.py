"""Inline call bodies (jit/pjit, closed_call, core_call) into their caller.

Undoes `outline`; lets other passes see across call boundaries. A jit call
that pins shardings or layouts, or donates buffers, is kept: inlining it
would drop that request. Exact.
"""
from __future__ import annotations

from .. import _jax
from ..ir import Graph, Node
from ..ir.regions import CALLS, regions_of
from .registry import register


def inlinable(node: Node) -> bool:
    """A call that pins nothing (no shardings, layouts, donation, effects): its body can merge into the caller."""
    p = node.params
    return (node.name in CALLS and not node.effects
            and all(_jax.is_unspecified(s) for s in p.get("in_shardings", ()) + p.get("out_shardings", ()))
            and all(l is None for l in p.get("in_layouts", ()) + p.get("out_layouts", ()))
            and not any(p.get("donated_invars", ())))


@register()
def inline(graph: Graph, *, consts_ok: bool = True) -> Graph:
    """`consts_ok=False` for the body of an open-jaxpr primitive (remat, shard_map, core_call):
    it cannot hold constants, so a call whose body closes over one (a NumPy array) stays a call."""
    nodes = []
    for node in graph.nodes:
        for r in regions_of(node.prim.name):
            subs = node.regions[r.name]
            for sub in (subs if isinstance(subs, tuple) else (subs,)):
                inline(sub, consts_ok=r.kind != "open")
        if not inlinable(node) or (node.regions["body"].consts and not consts_ok):
            nodes.append(node)
            continue
        nodes.extend(inline_call(graph, node))
    graph._nodes = nodes
    return graph


def inline_call(graph: Graph, node: Node) -> list[Node]:
    """Splice one call's body in place of `node`; returns the spliced nodes (in order)."""
    body: Graph = node.regions["body"]
    for c in body.consts:
        graph.consts.append(c)
    outer_of = {id(inner): outer for inner, outer in zip(body.inputs, node.inputs)}
    outs = [outer_of.get(id(v), v) for v in body.outputs]  # a body input returned as is: the caller's value
    body.set_outputs([])
    for inner, outer in zip(body.inputs, node.inputs):
        body.replace_uses(inner, outer)
    for old, new in zip(node.outputs, outs):
        graph.replace_uses(old, new)
    for i, v in enumerate(node.inputs):
        v.uses.remove((node, i))
    node.dead = True
    for inner in body.nodes:        # (the call's name stack kept: "transpose(jvp(...))" says a backward made it)
        inner.source_info = _jax.inlined_source_info(node.source_info, inner.source_info)
    return body.nodes
