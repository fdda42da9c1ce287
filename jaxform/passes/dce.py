"""Dead code elimination, recursing into bodies.

Removes effect-free nodes whose results are unused, then shrinks loops and
calls: unused `ys` of a scan and unused results of a call leave the body, and
body inputs that nothing reads leave the operand list.
"""
from __future__ import annotations

from ..ir import Graph, Node
from ..ir.regions import CALLS, scan_roles
from .registry import register


@register()
def dce(graph: Graph) -> Graph:
    changed = True
    while changed:
        changed = False
        for node in reversed(graph.nodes):
            if node.dead:
                continue
            if not node.effects and all(not o.uses for o in node.outputs):
                graph.remove(node)
                changed = True
                continue
            if node.name == "scan" or node.name in CALLS:
                changed |= shrink_unused(node)
            for sub in node.subgraphs():
                dce(sub)
    return graph


def _drop(seq, keep):
    return type(seq)(x for x, k in zip(seq, keep) if k)


def shrink_unused(node: Node) -> bool:
    """Drop unused results and unread inputs of a scan's ys/consts/xs or a call."""
    body: Graph = node.regions["body"]
    n_out, n_in = len(node.outputs), len(node.inputs)
    if node.name == "scan":
        roles = scan_roles(node.params)
        keep_out = [True] * roles["ys"].start + [bool(o.uses) for o in node.outputs[roles["ys"]]]
    else:
        keep_out = [bool(o.uses) for o in node.outputs]
    if not all(keep_out):
        body.set_outputs(_drop(body.outputs, keep_out))
        node.set_outputs(_drop(node.outputs, keep_out))
        if "out_shardings" in node.params:
            node.params["out_shardings"] = _drop(node.params["out_shardings"], keep_out)
            node.params["out_layouts"] = _drop(node.params["out_layouts"], keep_out)
        dce(body)
    if node.name == "scan":
        roles = scan_roles(node.params)
        keep_in = [True] * n_in
        for i in list(range(n_in))[roles["consts"]] + list(range(n_in))[roles["xs"]]:
            keep_in[i] = bool(body.inputs[i].uses)
    else:
        keep_in = [bool(v.uses) for v in body.inputs]
    drop_in = not all(keep_in) and not node.effects
    if drop_in:
        if node.name == "scan":
            node.params["num_consts"] -= sum(not k for k in keep_in[roles["consts"]])
        for key in ("in_shardings", "in_layouts", "donated_invars"):
            if key in node.params:
                node.params[key] = _drop(node.params[key], keep_in)
        body.inputs = _drop(body.inputs, keep_in)
        node.set_inputs(_drop(node.inputs, keep_in))
    return not all(keep_out) or drop_in

