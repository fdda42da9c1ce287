"""Common subexpression elimination, within each graph and each body.

Two pure nodes with the same key (`ir.identity.node_key`: primitive, params,
operands, equation context, effects, bodies' structure; callables and custom
rules by identity) compute the same values; the later one is replaced by the
earlier. Impure nodes (`ir.identity.is_impure`: effects, callbacks, stateful
RNG, refs) are never merged. Exact: results are bit for bit equal.
"""
from __future__ import annotations

from ..ir import Graph
from ..ir.graph import gc_paused
from ..ir.identity import is_impure, node_key, structure
from .registry import register

__all__ = ["cse", "node_key", "structure"]


@register()
@gc_paused()
def cse(graph: Graph) -> Graph:
    seen: dict = {}
    for node in graph.nodes:
        for sub in node.subgraphs():
            cse(sub)
        if is_impure(node) or node.params.get("prevent_cse"):
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
