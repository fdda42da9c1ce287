"""FLOPs of a graph: what recomputing it costs (remat's choice) and what the cost model's roofline reads.

One count, shared by the memory pass that measures a loop body and the planner that prices it, so that
a body costs the same in both.
"""
from __future__ import annotations

import numpy as np

from .graph import Graph, Node

__all__ = ["graph_flops", "contraction_flops", "MATMULS"]

MATMULS = frozenset({"dot_general", "conv_general_dilated"})   # the contractions: costed as such, kept by dots_saveable


def _size(v) -> int:
    return int(np.prod(getattr(v.aval, "shape", ()) or (1,)))


def contraction_flops(n: Node, out: int) -> int:
    """2·M·N·K for a dot_general (out = M·N), 2·out·(kernel size) for a convolution."""
    if n.name == "dot_general":
        (lc, _), _ = n.params["dimension_numbers"]
        return 2 * out * int(np.prod([n.inputs[0].aval.shape[d] for d in lc]))
    return 2 * out * int(np.prod(n.inputs[1].aval.shape[1:]))


def graph_flops(g: Graph) -> int:
    """FLOPs of one run of `g`, unweighted: contractions as `contraction_flops`, one per output element
    elsewhere, loops times their length (what recomputing a loop body costs, for `plan.memory`)."""
    total = 0
    for n in g.nodes:
        out = sum(_size(o) for o in n.outputs)
        if n.name in MATMULS:
            total += contraction_flops(n, out)
        elif n.name == "scan":
            total += n.params["length"] * graph_flops(n.regions["body"])
        else:
            total += out + sum(graph_flops(sub) for sub in n.subgraphs())
    return total
