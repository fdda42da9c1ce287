"""Reduce a concatenation part by part, where one part is a scan's stacked output.

    sum(concatenate([x0[None], ys]) ** 2)   ->   sum(x0[None] ** 2) + sum(ys ** 2)

`jnp.concatenate([h0[None], hs])` (the states with the initial one) and
`stream_rows`' rebuilt buffers put a scan's `ys` inside a concatenation, where
fusion cannot follow it: its rows come from the loop and from outside. Pushing
the consumers into the parts (elementwise ops, with other operands sliced to
each part; then a reduction over the concatenated axis, combined across parts)
gives fusion `sum(ys ** 2)` to carry step by step.

Only single-user chains are split (nothing is computed twice), only where a part
is a scan's `ys`. A sum combines per-part sums (reassociated: fusion, which calls
this, is not exact); float16/bfloat16 parts sum in float32 and convert back once,
as XLA's reduction of the whole would. max/min combine exactly, NaN included.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..ir import Graph, Node, Value
from ..ir.regions import scan_roles
from ..ir.separability import ELEMENTWISE

COMBINE = {"reduce_sum": "add", "reduce_max": "max", "reduce_min": "min"}
LOW_PRECISION = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))


def split_concat_reductions(graph: Graph) -> bool:
    """Split every eligible chain in `graph` (not its sub-graphs); True if any changed."""
    changed = False
    for node in list(graph.nodes):
        if node.name == "concatenate" and not node.dead and any(_is_ys(v) for v in node.inputs) and \
                _ends_in_reduction(node):
            changed |= _split(graph, node)
    return changed


def _is_ys(v: Value) -> bool:
    p = v.producer
    return p is not None and p.name == "scan" and v.index >= scan_roles(p.params)["ys"].start


def _single_user(v: Value) -> Node | None:
    users = v.users
    return users[0] if len(users) == 1 and len(v.uses) == 1 and not v.is_output else None


def _elementwise_over(u: Node, v: Value) -> bool:
    """Is `u` elementwise in `v`, its other operands literals or of `v`'s shape (sliced per part)?"""
    return u.name in ELEMENTWISE and len(u.outputs) == 1 and u.outputs[0].aval.shape == v.aval.shape and \
        all(w is v or w.is_literal or w.aval.shape == v.aval.shape for w in u.inputs)


def _ends_in_reduction(cat: Node) -> bool:
    v, d = cat.outputs[0], cat.params["dimension"]
    while (u := _single_user(v)) is not None and not u.effects:
        if u.name in COMBINE:
            return d in tuple(u.params["axes"])
        if not _elementwise_over(u, v):
            return False
        v = u.outputs[0]
    return False


def _split(graph: Graph, cat: Node) -> bool:
    d, changed = cat.params["dimension"], False
    while (u := _single_user(cat.outputs[0])) is not None and not u.effects:
        parts = cat.inputs
        bounds = np.cumsum([0] + [p.aval.shape[d] for p in parts])
        info = dict(source_info=u.source_info, ctx=u.ctx)
        if u.name in COMBINE and d in tuple(u.params["axes"]):
            low = u.outputs[0].aval.dtype in LOW_PRECISION
            sums = []
            for p in parts:
                if low:
                    p = graph.add("convert_element_type", [p], {"new_dtype": np.dtype("float32"),
                                                                "weak_type": p.aval.weak_type}, **info).outputs[0]
                sums.append(graph.add(u.name, [p], dict(u.params), **info).outputs[0])
            total = sums[0]
            for s in sums[1:]:
                total = graph.add(COMBINE[u.name], [total, s], **info).outputs[0]
            if low:
                total = graph.add("convert_element_type", [total], {"new_dtype": u.outputs[0].aval.dtype,
                                                                    "weak_type": u.outputs[0].aval.weak_type},
                                  **info).outputs[0]
            if total.aval != u.outputs[0].aval:
                return changed
            graph.replace_uses(u.outputs[0], total)
            return True
        if not _elementwise_over(u, cat.outputs[0]):
            return changed
        pieces = []
        for p, a, b in zip(parts, bounds[:-1], bounds[1:]):
            ins = [p if v is cat.outputs[0] else v if v.is_literal else _rows(graph, v, d, int(a), int(b), info)
                   for v in u.inputs]
            pieces.append(graph.add(u.prim, ins, dict(u.params), **info).outputs[0])
        new = graph.add("concatenate", pieces, {"dimension": d}, **info)
        if new.outputs[0].aval != u.outputs[0].aval:
            return changed
        graph.replace_uses(u.outputs[0], new.outputs[0])
        cat, changed = new, True
    return changed


def _rows(graph: Graph, v: Value, d: int, a: int, b: int, info) -> Value:
    shape = v.aval.shape
    start = tuple(a if i == d else 0 for i in range(len(shape)))
    limit = tuple(b if i == d else s for i, s in enumerate(shape))
    return graph.add("slice", [v], {"start_indices": start, "limit_indices": limit, "strides": None},
                     **info).outputs[0]
