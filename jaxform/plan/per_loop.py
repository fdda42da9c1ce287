"""Per-loop proposals: a pass's rewrite of one loop at a time, the other loops hidden from it.

A pass rewrites every loop it can; a rewrite that helps one loop may hurt another, and judged on the
sum the planner would keep both or neither. `only_loop(p, k)` is the pass `p` run with every top-level
loop but the k-th turned into an opaque node (`hidden_loop_p`, a primitive no pass knows, so each leaves
it as it is), then turned back: the proposal for loop k alone. Its `positions` say where each other loop
is after it (a rewrite may add loops: `thin_residuals` splits one), so the next loop is found again. A
pass that cannot run that way (it traces the program through the hidden node) proposes nothing for that
loop.
"""
from __future__ import annotations

import functools

import jax.extend.core as jex

from ..ir import Graph
from ..ir.graph import Node

LOOPS = frozenset({"scan", "while"})

hidden_loop_p = jex.Primitive("jaxform_hidden_loop")
hidden_loop_p.multiple_results = True
hidden_loop_p.def_abstract_eval(lambda *avals, out_avals, key: list(out_avals))


def top_loops(g: Graph) -> list[Node]:
    """The loops of the program itself (a loop nested in another is part of that one)."""
    return [n for n in g.nodes if n.name in LOOPS]


def only_loop(p, k: int):
    """The pass `p` applied to the k-th top-level loop only (and what it does outside loops)."""
    @functools.wraps(p)
    def run(graph: Graph) -> Graph:
        work = Graph.from_jaxpr(graph.to_jaxpr())
        stash = {}
        for j, n in enumerate(top_loops(work)):
            if j != k:
                stash[j] = (n.prim, n.params, n.regions)
                n.prim, n.regions = hidden_loop_p, {}
                n.params = {"out_avals": tuple(o.aval for o in n.outputs), "key": j}
        try:
            out = p(work)
        except Exception:  # noqa: BLE001 - the pass needs to see through the hidden loops: no proposal
            return graph
        # where each other loop is now (the rewrite of loop k may have added or removed loops around it), in
        # the order the program is emitted in (a pass may append nodes out of order: `to_jaxpr` sorts them)
        emitted = [n for n in Graph.from_jaxpr(out.to_jaxpr()).nodes if n.name in LOOPS or n.prim is hidden_loop_p]
        run.positions = {n.params["key"]: i for i, n in enumerate(emitted) if n.prim is hidden_loop_p}
        for n, _ in out.walk():
            if n.prim is hidden_loop_p:
                n.prim, n.params, n.regions = stash[n.params["key"]]
        return out
    run.pass_name = f"{getattr(p, 'pass_name', p.__name__)}"
    run.exact = getattr(p, "exact", False)
    run.positions = {}
    return run
