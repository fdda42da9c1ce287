"""Common subexpression elimination, within each graph and each body.

Two effect-free nodes with the same primitive, params and inputs compute the
same values; the later one is replaced by the earlier. Nodes with bodies are
compared by their bodies' structure. Exact: results are bit for bit equal.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from . import register


def node_key(node: Node, name=lambda v: v.id):
    """Hashable identity of what a node computes (TypeError if a param is unhashable)."""
    ins = tuple(("lit", str(v.aval), np.asarray(v.literal).tobytes()) if v.is_literal else name(v) for v in node.inputs)
    params = tuple(sorted(node.params.items()))
    hash(params)
    return (node.prim, ins, params, tuple(_structure(g) for g in node.subgraphs()))


def _structure(g: Graph):
    """A body up to renaming: values named by position, constants by identity."""
    local = {v.id: ("in", i) for i, v in enumerate(g.inputs)}
    local.update((v.id, ("const", id(v.const))) for v in g.consts)
    nodes = []
    for k, n in enumerate(g.nodes):
        nodes.append(node_key(n, lambda v: local.get(v.id, ("free", v.id))))
        local.update((o.id, ("node", k, j)) for j, o in enumerate(n.outputs))
    outs = tuple(("lit", str(v.aval), np.asarray(v.literal).tobytes()) if v.is_literal else local[v.id] for v in g.outputs)
    return tuple(nodes), outs


@register()
def cse(graph: Graph) -> Graph:
    seen: dict = {}
    for node in graph.nodes:
        for sub in node.subgraphs():
            cse(sub)
        if node.effects or node.params.get("prevent_cse"):
            continue
        try:
            key = node_key(node)
        except TypeError:  # unhashable params: leave the node alone
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            for old, new in zip(node.outputs, first.outputs):
                graph.replace_uses(old, new)
            graph.remove(node)
    return graph
