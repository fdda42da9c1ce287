"""Scan fission: run a scan body's carry-free work for all steps at once, before the loop.

A body value that depends on `xs[t]` and loop constants but not on the carry
(an input projection `x_t @ U`, an embedding lookup, the seed's `cos(xs)`)
can be computed for every step in one batched computation over the whole
`xs`: one `[L*B, D] @ [D, H]` matmul instead of L small ones. The pass
outlines that carry-free part of the body (`ir.loops.ScanLoop.carry_dependent`),
batches it over the scan axis with `jax.vmap` (which knows how to batch every
primitive, so no per-primitive rules live here), splices the batched program
in front of the scan, and feeds its results back in as new `xs`
(`ScanLoop.add_xs`). A reverse scan needs nothing special: step t still reads
row t of every xs.

Cost rule (what never moves):
- effectful nodes (and anything reading them): their order is fixed;
- `cond`/`while` nodes: batched, a cond runs every branch and a while runs the
  longest trip count for all steps;
- on CPU, matmuls (`BATCH_MATMULS`, measured: a batched input projection made
  an RNN slower there, see below);
- parts that are only layout ops of `xs` (reshape, convert, ...): no work to batch;
- memory: the new stacked buffers (the results entering the loop, plus the
  largest intermediate of the batched part, for all steps) may add at most
  the bytes of the scan's own `xs` and `ys` buffers, after subtracting the
  `xs` that the move leaves unused: peak memory grows by at most what the
  loop already held.

Reassociating? No: the same primitives on the same values, batched; XLA may
pick a different matmul blocking, so results agree to float rounding
(registered `exact=False`).
"""
from __future__ import annotations

import jax

from .. import _jax
from ..ir import Graph, Node, ScanLoop, Value
from ..ir.flops import MATMULS
from ..ir.graph import OUT
from ..ir.identity import is_impure
from ..ir.separability import ELEMENTWISE
from ..ir.sizes import nbytes
from ..ir.toposort import producers_first
from .registry import register
from .inline import inline_call
from .licm import TRIVIAL
from .outline import outline

NO_BATCH = frozenset({"cond", "while"})   # (impure nodes, rng_uniform among them, never move: `identity.is_impure`)
# Batch matmuls (input projections) too? None: by backend, not on CPU. Measured on CPU (benchmarks/loops.py,
# L=400, B=H=128): a hand-batched `xs @ U` made the RNN 0.8-0.95x as fast forward and 0.5-0.8x under grad
# (D = 32..512): XLA:CPU runs the small per-step matmul from cache, the batched one streams a [L, B, H]
# buffer through memory. Elementwise work (the seed's cos) wins everywhere (grad 2.9-3.3x).
BATCH_MATMULS: bool | None = None


@register(exact=False, loops=True)
def fission(graph: Graph) -> Graph:
    """Move the carry-free work of every scan body in front of its loop, batched over the steps."""
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            fission(sub)
        if node.name == "scan" and not any(t is not None for _, t in node.effects):
            if split_before(graph, node):
                forward_xs(graph, node)
            split_after(graph, node)
    return graph


def forward_xs(graph: Graph, node: Node) -> None:
    """A ys that is just an xs passed through (row t out is row t in, either direction) is that xs."""
    loop = ScanLoop(node)
    xs_of = {v.id: o for v, o in zip(loop.body_xs, loop.xs)}
    for inner, outer in zip(loop.body_ys, loop.ys):
        if inner.id in xs_of and outer.aval.weak_type == xs_of[inner.id].aval.weak_type:
            graph.replace_uses(outer, xs_of[inner.id])


def carry_free(loop: ScanLoop) -> tuple[list[Node], set[int]]:
    """The body nodes fission may batch: carry-free, pure, reading xs (plus the constant work they need).

    Also returns the ids of the nodes among them that read xs (the others are constant work).
    """
    body, dep = loop.body, loop.carry_dependent()
    no_batch = NO_BATCH if _batch_matmuls() else NO_BATCH | MATMULS
    const_ids = {v.id for v in loop.body_consts} | {v.id for v in body.consts}
    xs_ids = {v.id for v in loop.body_xs}
    kind: dict[int, str] = {i: "c" for i in const_ids} | {i: "x" for i in xs_ids}
    nodes: list[Node] = []
    for n in producers_first(body.nodes):
        if (n.name in no_batch or is_impure(n) or any(o.id in dep for o in n.outputs)
                or not all(v.is_literal or v.id in kind for v in n.inputs)):
            continue
        k = "x" if any(kind.get(v.id) == "x" for v in n.inputs) else "c"
        kind.update((o.id, k) for o in n.outputs)
        nodes.append(n)
    # keep the xs-reading nodes and the constant nodes feeding them
    made = {o.id: n for n in nodes for o in n.outputs}
    keep: set[int] = set()
    for n in reversed(nodes):
        if id(n) in keep or kind[n.outputs[0].id] == "x":
            keep.add(id(n))
            keep.update(id(made[v.id]) for v in n.inputs if v.id in made)
    return [n for n in nodes if id(n) in keep], {id(n) for n in nodes if kind[n.outputs[0].id] == "x"}


def _batch_matmuls() -> bool:
    return jax.default_backend() != "cpu" if BATCH_MATMULS is None else BATCH_MATMULS


def split_before(graph: Graph, node: Node) -> bool:
    """Fission one scan node of `graph`; returns whether anything moved."""
    loop = ScanLoop(node)
    body = loop.body
    chosen, reads_xs = carry_free(loop)
    if not any((n.name not in TRIVIAL or n.regions) and id(n) in reads_xs for n in chosen):
        return False
    ids = {id(n) for n in chosen}
    # constant nodes also used by the rest of the body: the batched part gets its own copy
    for n in list(chosen):
        outside = [(u, i) for o in n.outputs for u, i in o.uses if u is OUT or id(u) not in ids]
        if outside and id(n) not in reads_xs:
            if n.regions:
                return False
            twin = body.append(Node(n.prim, n.inputs, [o.aval for o in n.outputs], n.params,
                                    effects=n.effects, source_info=n.source_info, ctx=n.ctx))
            for o, t in zip(n.outputs, twin.outputs):
                for u, i in [(u, i) for u, i in o.uses if u is OUT or id(u) not in ids]:
                    body.set_output(i, t) if u is OUT else u.set_input(i, t)
    escaping = [o for n in chosen for o in n.outputs if any(u is OUT or id(u) not in ids for u, _ in o.uses)]
    if not escaping or not _affordable(loop, chosen, escaping):
        return False
    call = outline(body, chosen, "fission", close_consts=True)
    outer_of = {v.id: o for v, o in zip(loop.body_consts, loop.consts)}
    outer_of |= {v.id: o for v, o in zip(loop.body_xs, loop.xs)}
    operands, axes = [], []
    for v in call.inputs:
        if v.id in outer_of:
            operands.append(outer_of[v.id])
        else:   # a constant of the body graph, still used elsewhere in the body
            assert v.is_const, v
            operands.append(graph.add_const(v.const))
        axes.append(0 if any(v is x for x in loop.body_xs) else None)
    stacked = _batched(graph, node, call.regions["body"], operands, axes)
    for old, new in zip(call.outputs, loop.add_xs(stacked)):
        body.replace_uses(old, new)
    body.remove(call)
    return True


def _affordable(loop: ScanLoop, chosen: list[Node], escaping: list[Value]) -> bool:
    """The memory rule: new stacked buffers minus the xs freed <= the loop's own xs + ys bytes.

    New buffers: the escaping values for all steps, plus (conservatively) the
    largest intermediate of the batched part for all steps, in case XLA does
    not fuse it away.
    """
    L, ids, esc = loop.length, {id(n) for n in chosen}, {v.id for v in escaping}
    inner = max((nbytes(o.aval) for n in chosen for o in n.outputs if o.id not in esc), default=0)
    added = L * (sum(nbytes(v.aval) for v in escaping) + inner)
    freed = sum(nbytes(o.aval) for v, o in zip(loop.body_xs, loop.xs)
                if v.uses and all(u is not OUT and id(u) in ids for u, _ in v.uses) and len(o.uses) == 1)
    budget = sum(nbytes(v.aval) for v in loop.xs) + sum(nbytes(v.aval) for v in loop.ys)
    return added - freed <= budget


def ys_only(loop: ScanLoop) -> list[Node]:
    """The body nodes post-loop fission may batch after the loop (topological order).

    A node qualifies when every use of its results is a `ys` output or another
    such node (so nothing carried, and nothing staying in the loop, needs it),
    and every operand is a literal, a loop constant, another such node's result,
    or a value the loop stacks anyway: an `xs` row, or a `ys` whose stacked
    result is read after the loop. So the move stacks nothing new, and
    `split_after` also refuses parts with an intermediate XLA would materialize
    for all steps (anything but elementwise and layout ops feeding another node
    of the part): memory stays within the original peak. Pure, not cond/while,
    and (on CPU) not a matmul, as for the pre-loop part.
    """
    body, k = loop.body, loop.num_carry
    no_batch = NO_BATCH if _batch_matmuls() else NO_BATCH | MATMULS
    stacked = {v.id for v, o in zip(loop.body_ys, loop.ys) if o.uses} | {v.id for v in loop.body_xs}
    const_ids = {v.id for v in loop.body_consts} | {v.id for v in body.consts}
    order = producers_first(body.nodes)
    cand = {id(n) for n in order if n.outputs and n.name not in no_batch and not is_impure(n)}
    changed = True
    while changed:
        changed = False
        for n in reversed(order):
            if id(n) not in cand:
                continue
            uses_ok = any(o.uses for o in n.outputs) and all(
                (u is OUT and i >= k) or (u is not OUT and id(u) in cand) for o in n.outputs for u, i in o.uses)
            ins_ok = all(v.is_literal or v.id in const_ids or v.id in stacked
                         or (v.producer is not None and id(v.producer) in cand) for v in n.inputs)
            if not (uses_ok and ins_ok):
                cand.discard(id(n))
                changed = True
    return [n for n in order if id(n) in cand]


def split_after(graph: Graph, node: Node) -> bool:
    """Post-loop fission of one scan: ys-only work runs once after the loop on the stacked values."""
    loop = ScanLoop(node)
    body = loop.body
    chosen = ys_only(loop)
    ids = {id(n) for n in chosen}
    live = [j for j, (v, o) in enumerate(zip(loop.body_ys, loop.ys))
            if o.uses and v.producer is not None and id(v.producer) in ids]
    if not live or not any(n.name not in TRIVIAL or n.regions for n in chosen):
        return False
    # never beyond the original peak: the stacked ys it computes replace the loop's own; an intermediate
    # is allowed only where XLA fuses it into its consumer (elementwise, layout), not a matmul's [L, ...]
    if any(n.name not in ELEMENTWISE | TRIVIAL and any(all(u is not OUT for u, _ in o.uses) for o in n.outputs)
           for n in chosen):
        return False
    call = outline(body, chosen, "fission_after", close_consts=True)
    outer_of = {v.id: o for v, o in zip(loop.body_consts, loop.consts)}
    outer_of |= {v.id: o for v, o in zip(loop.body_xs, loop.xs)}
    outer_of |= {v.id: o for v, o in zip(loop.body_ys, loop.ys) if o.uses}
    operands, axes = [], []
    for v in call.inputs:
        if v.id in outer_of:
            operands.append(outer_of[v.id])
            axes.append(None if any(v is c for c in loop.body_consts) else 0)
        else:   # a constant of the body graph, still used elsewhere in the body
            assert v.is_const, v
            operands.append(graph.add_const(v.const))
            axes.append(None)
    stacked = _batched(graph, node, call.regions["body"], operands, axes, after=True)
    result_of = {o.id: s for o, s in zip(call.outputs, stacked)}
    gone = []
    for j, (v, o) in enumerate(zip(loop.body_ys, loop.ys)):
        if v.id in result_of:
            new = result_of[v.id]
            if (new.aval.shape, new.aval.dtype) != (o.aval.shape, o.aval.dtype):
                raise AssertionError(f"jaxform.fission: batched {new.aval.str_short()} != ys {o.aval.str_short()}")
            graph.replace_uses(o, new)
            gone.append(j)
    loop.remove_ys(gone)
    body.remove(call)
    return True


def _batched(graph: Graph, scan: Node, part: Graph, operands: list[Value], axes: list,
             after: bool = False) -> list[Value]:
    """Splice `part` batched over axis 0 of the operands with axis 0 in front of (or after) `scan`;
    its stacked results."""
    closed = part.to_jaxpr()
    fn = jax.vmap(lambda *a: _jax.eval_jaxpr(closed, *a), in_axes=tuple(axes), out_axes=0,
                  axis_size=scan.params["length"])
    specs = [_jax.spec_of(v.aval) for v in operands]
    batched = Graph.from_jaxpr(jax.make_jaxpr(fn)(*specs))
    call = graph.add(_jax.CALL_PRIMITIVE, operands, {}, regions={"body": batched}, source_info=scan.source_info)
    graph._nodes.pop()
    ins = {id(i): o for i, o in zip(batched.inputs, operands)}
    outs = [ins.get(id(v), v) for v in batched.outputs]
    at = graph.nodes.index(scan) + after
    graph._nodes[at:at] = inline_call(graph, call)
    return outs
