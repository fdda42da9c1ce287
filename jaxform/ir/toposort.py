"""Topological order of nodes: producers before their users.

Node order in a Graph need not be topological after edits (`to_jaxpr` sorts
when it emits). A pass that walks a body deciding what may move, or that
rebuilds a set of nodes elsewhere, needs each node after its producers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from .graph import Node

__all__ = ["producers_first"]


def producers_first(nodes: Iterable["Node"]) -> list["Node"]:
    """`nodes` (e.g. `graph.nodes`, or a subset) reordered so that each comes after those of
    its producers that are among them; otherwise in the given order. Iterative (deep graphs)."""
    nodes = list(nodes)
    mine, done, order = {id(n) for n in nodes}, set(), []
    for root in nodes:
        stack = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if id(n) in done:
                continue
            if ready:
                done.add(id(n))
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((v.producer, False) for v in n.inputs
                         if v.producer is not None and id(v.producer) in mine and id(v.producer) not in done)
    return order
