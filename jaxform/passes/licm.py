"""Loop-invariant code motion: compute once what a loop body recomputes every step.

A node in a `scan` or `while` body whose inputs are all *loop constants*
(scan consts, while body/cond consts, carries the body passes through
unchanged, literals) or results of other such nodes gives the same value at
every step. It moves in front of the loop; its results enter the body as new
loop constants (`num_consts`, `body_nconsts`, `cond_nconsts` grow). Bodies are
processed inner-first, so work climbs out of nested loops level by level. In
a loop body, the invariant part of a `remat`/`checkpoint`, `jit` or
`closed_call` body is pulled out too: this is what removes the per-step
recomputation of invariant residuals in the transposed scan of
`jax.grad(scan(jax.checkpoint(body)))`, which XLA cannot do itself (remat's
optimization barrier hides the work from XLA's own loop-invariant motion).
Work that every branch of a `cond` does identically, on the same operands,
moves in front of the cond.

Policy (what never moves):
- effectful nodes and nodes whose bodies hold effects; loops, conds and calls
  with effects that name their inputs (refs) are left alone;
- *expanding* nodes: output bytes > max(input bytes, 1 MiB). A broadcast or
  iota that XLA would fuse into its consumer would be materialized and kept
  alive through the whole loop, raising peak memory;
- *trivial* nodes, unless they feed moved work: layout and shape ops that
  grow their input (broadcast, pad, iota, ...) and anything computed from
  literals alone. XLA fuses or constant-folds them; as loop constants they
  would only become materialized buffers carried through the loop. Layout ops
  that do not grow (transpose, reshape, slice, convert) do move.
Moving work out of a `while` whose body runs zero times computes it anyway:
harmless for pure JAX ops (nothing traps: x/0 is inf, gathers clamp), it
only costs that work once. Exact: the same ops on the same values.
"""
from __future__ import annotations

import jax.numpy as jnp

from ..ir import Graph, Node, ScanLoop, Value
from ..ir.identity import is_impure
from ..ir.sizes import nbytes
from ..ir.toposort import producers_first
from ..ir.linearity import linear_operands
from ..ir.graph import OUT
from ..ir.regions import CALLS
from .registry import register
from .cse import cse, node_key
from .inline import inlinable   # a jit that pins nothing: new operands can be unpinned too

EXPANSION_LIMIT = 1 << 20   # bytes a moved node may produce beyond its inputs' size
TRIVIAL = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "convert_element_type",
                     "iota", "copy", "copy_p", "rev", "slice", "pad", "concatenate", "select_n", "stop_gradient"})
PEEL = frozenset({"remat2", "checkpoint"}) | CALLS   # calls of every JAX version (regions.CALLS)


@register(exact=True, loops=True)
def hoist_loop_invariants(graph: Graph) -> Graph:
    """Move loop-invariant work out of scan/while bodies and shared work out of cond branches.

    If anything moved, CSE then merges moved work with identical work already
    outside (e.g. the forward pass's copy of a residual the transposed scan recomputed).
    """
    if _hoist(graph):
        cse(graph)
    return graph


def _hoist(graph: Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            changed |= _hoist(sub)
        if _input_effects(node):
            continue
        if node.name == "scan":
            changed |= _from_scan(graph, node)
        elif node.name == "while":
            changed |= _from_while(graph, node)
        elif node.name == "cond":
            changed |= _from_cond(graph, node)
    return changed


# ---- what may move -------------------------------------------------------------

def _input_effects(node: Node) -> bool:
    return any(t is not None for _, t in node.effects)


def _movable(node: Node, known: set[int]) -> bool:
    """Pure, all inputs available outside, and not expanding (see the module policy)."""
    if not all(v.is_literal or v.id in known for v in node.inputs) or is_impure(node):
        return False
    out = sum(nbytes(o.aval) for o in node.outputs)
    return out <= max(sum(nbytes(v.aval) for v in node.inputs), EXPANSION_LIMIT)


def _work(node: Node) -> bool:
    """Worth moving on its own: not computed from literals alone, and not a layout op that grows its input.

    A transpose/reshape/convert/slice of a loop constant is moved: one buffer no
    larger than its input, instead of a copy every step (XLA does not always fold
    it into the consumer: a transposed `inv(W)` in a scan body cost 1.5x runtime).
    """
    if not node.regions and all(v.is_literal for v in node.inputs):
        return False
    if node.name not in TRIVIAL:
        return True
    return sum(nbytes(o.aval) for o in node.outputs) <= max((nbytes(v.aval) for v in node.inputs
                                                              if not v.is_literal), default=0)


def _worth(cands: list[Node]) -> list[Node]:
    """The candidates that are work, plus the candidates feeding them (topological order kept)."""
    made = {id(o): n for n in cands for o in n.outputs}
    keep: set[int] = set()
    for n in reversed(cands):
        if id(n) in keep or _work(n):
            keep.add(id(n))
            keep.update(id(made[id(v)]) for v in n.inputs if id(v) in made)
    return [n for n in cands if id(n) in keep]


# ---- moving nodes out of one region ----------------------------------------------

def _move_out(target: Graph, owner: Node, region: Graph, outer_of: dict[int, Value], add_inputs,
              keep_weak: bool = False) -> list[Node]:
    """Move the invariant nodes of `region` (a body of `owner`, itself a node of `target`) into `target`.

    outer_of maps region values known invariant (by id) to the `target` value they equal.
    add_inputs(values) makes each value a new constant operand of `owner` and returns
    the region inputs that receive them. Returns the moved nodes, now in `target`.
    keep_weak (scan): work reading a weakly typed float loop constant stays. `grad` gives such a
    constant a weakly typed cotangent only through the scan's transpose (which accumulates it in
    the constant's type); work moved out is transposed on its own (a matmul's is strong), so
    `grad(optimize(f))` would change type (~float32[3] -> float32[3]). No other op restores it.
    """
    known = {k for k, v in outer_of.items() if not (keep_weak and not v.is_literal and _weak_float(v))}
    cands = []
    for n in producers_first(region.nodes):
        if _movable(n, known):
            cands.append(n)
        elif n.name in PEEL and not is_impure(n) and any(v.id in known for v in n.inputs):
            cands.extend(_peel(region, n, known))   # now nodes of `region`, in front of n, all movable
        else:
            continue
        known.update(o.id for m in cands for o in m.outputs)
    moved = _worth(cands)
    if not moved:
        return []
    ids = {id(n) for n in moved}
    region._nodes = [n for n in region.nodes if id(n) not in ids]
    for n in moved:
        for i, v in enumerate(n.inputs):
            if v.id in outer_of:
                n.set_input(i, outer_of[v.id])
    frontier = [o for n in moved for o in n.outputs if any(u is OUT or id(u) not in ids for u, _ in o.uses)]
    uses = [[(u, i) for u, i in o.uses if u is OUT or id(u) not in ids] for o in frontier]
    for p, us in zip(add_inputs(frontier), uses):
        for u, i in us:
            if u is OUT:
                region.set_output(i, p)
            else:
                u.set_input(i, p)
    at = target.nodes.index(owner)
    target.nodes[at:at] = moved
    return moved


def _peel(region: Graph, call: Node, known: set[int]) -> list[Node]:
    """Pull the part of a call body that depends only on `known` operands in front of the call."""
    body: Graph = call.regions["body"]
    if call.name in ("jit", "pjit") and not _plain_jit(call):
        return []
    outer_of = {b.id: v for b, v in zip(body.inputs, call.inputs) if v.is_literal or v.id in known}

    def add_inputs(values):
        call.set_inputs(list(call.inputs) + list(values))
        new = [body.add_input(v.aval) for v in values]
        p = call.params
        if "in_shardings" in p:
            p["in_shardings"] += (p["in_shardings"][0],) * len(values)
            p["in_layouts"] += (None,) * len(values)
            p["donated_invars"] += (False,) * len(values)
        return new

    return _move_out(region, call, body, outer_of, add_inputs)


def _plain_jit(call: Node) -> bool:
    return bool(call.inputs) and inlinable(call)


# ---- loops and conds --------------------------------------------------------------

def _insert(seq, at, values):
    return list(seq[:at]) + list(values) + list(seq[at:])


def _from_scan(graph: Graph, node: Node) -> bool:
    body: Graph = node.regions["body"]
    c, k = node.params["num_consts"], node.params["num_carry"]
    outer_of = {body.inputs[i].id: node.inputs[i] for i in range(c)}
    outer_of.update((body.inputs[c + j].id, node.inputs[c + j]) for j in range(k)
                    if body.outputs[j] is body.inputs[c + j])   # carried through unchanged

    def add_inputs(values):
        at = node.params["num_consts"]
        node.set_inputs(_insert(node.inputs, at, values))
        new = [Value(v.aval) for v in values]
        body.inputs[at:at] = new
        node.params["num_consts"] = at + len(values)
        return new

    return bool(_move_out(graph, node, body, outer_of, add_inputs, keep_weak=True))


def _weak_float(v: Value) -> bool:
    import numpy as np
    return bool(getattr(v.aval, "weak_type", False)) and jnp.issubdtype(v.aval.dtype, np.inexact)


def _from_while(graph: Graph, node: Node) -> bool:
    cond, body = node.regions["cond"], node.regions["body"]
    c, b = node.params["cond_nconsts"], node.params["body_nconsts"]
    carry = node.inputs[c + b:]
    same = [j for j in range(len(carry)) if body.outputs[j] is body.inputs[b + j]]
    cond_of = {cond.inputs[i].id: node.inputs[i] for i in range(c)}
    cond_of.update((cond.inputs[c + j].id, carry[j]) for j in same)
    body_of = {body.inputs[i].id: node.inputs[c + i] for i in range(b)}
    body_of.update((body.inputs[b + j].id, carry[j]) for j in same)

    def add_to(region: Graph, key: str):
        def add_inputs(values):
            p = node.params
            at_op = p["cond_nconsts"] + (p["body_nconsts"] if key == "body_nconsts" else 0)
            at_in = p[key]
            node.set_inputs(_insert(node.inputs, at_op, values))
            new = [Value(v.aval) for v in values]
            region.inputs[at_in:at_in] = new
            p[key] = at_in + len(values)
            return new
        return add_inputs

    moved_c = _move_out(graph, node, cond, cond_of, add_to(cond, "cond_nconsts"))
    if moved_c:
        _drop_unused_consts(node, cond, 0, "cond_nconsts")
    moved_b = _move_out(graph, node, body, body_of, add_to(body, "body_nconsts"))
    if moved_b:
        _drop_unused_consts(node, body, node.params["cond_nconsts"], "body_nconsts")
    return bool(moved_c or moved_b)


def _drop_unused_consts(node: Node, region: Graph, first: int, key: str) -> None:
    """Constants of a while region that nothing reads any more (dce shrinks scans, not whiles)."""
    n = node.params[key]
    dead = [i for i in range(n) if not region.inputs[i].uses]
    if dead:
        region.inputs = [v for i, v in enumerate(region.inputs) if i not in dead]
        node.set_inputs([v for i, v in enumerate(node.inputs) if i - first not in dead])
        node.params[key] = n - len(dead)


def _from_cond(graph: Graph, node: Node) -> bool:
    """Move work that all branches do identically on the same operands in front of the cond."""
    branches: tuple[Graph, ...] = node.regions["branches"]
    names = [{v.id: ("in", i) for i, v in enumerate(br.inputs)} for br in branches]
    known = [set(n) for n in names]
    matched: list[tuple[Node, ...]] = []
    taken: set[int] = set()
    progress = True
    while progress:
        progress = False
        keyed = []
        for b, br in enumerate(branches[1:], 1):
            table: dict = {}
            for n in br.nodes:
                if id(n) not in taken and _movable(n, known[b]):
                    k = _safe_key(n, names[b])
                    if k is not None:
                        table.setdefault(k, []).append(n)
            keyed.append(table)
        for n in producers_first(branches[0].nodes):
            if id(n) in taken or not _movable(n, known[0]):
                continue
            k = _safe_key(n, names[0])
            group = [n] + [(t.get(k) or [None])[0] for t in keyed]
            if k is None or any(m is None for m in group):
                continue
            for b, m in enumerate(group):
                taken.add(id(m))
                if b:
                    keyed[b - 1][k].remove(m)
                for j, o in enumerate(m.outputs):
                    names[b][o.id] = ("moved", len(matched), j)
                    known[b].add(o.id)
            matched.append(tuple(group))
            progress = True
    keep = {id(n) for n in _worth([g[0] for g in matched])}
    groups = [g for g in matched if id(g[0]) in keep]
    if not groups:
        return False
    ops = node.inputs[1:]
    ids = [{id(g[b]) for g in groups} for b in range(len(branches))]
    outside = lambda b, o: [(u, i) for u, i in o.uses if u is OUT or id(u) not in ids[b]]  # noqa: E731
    frontier = [(g, j) for g in groups for j in range(len(g[0].outputs))
                if any(outside(b, g[b].outputs[j]) for b in range(len(branches)))]
    for b, br in enumerate(branches):
        for g, j in frontier:
            p = br.add_input(g[b].outputs[j].aval)
            for u, i in outside(b, g[b].outputs[j]):
                br.set_output(i, p) if u is OUT else u.set_input(i, p)
    for b, br in enumerate(branches[1:], 1):
        for g in reversed(groups):
            br.remove(g[b])
    moved = [g[0] for g in groups]
    branches[0]._nodes = [n for n in branches[0].nodes if id(n) not in ids[0]]
    ins0 = {v.id: i for i, v in enumerate(branches[0].inputs)}
    for n in moved:
        for i, v in enumerate(n.inputs):
            if v.id in ins0:
                n.set_input(i, ops[ins0[v.id]])
    node.set_inputs(list(node.inputs) + [g[0].outputs[j] for g, j in frontier])
    at = graph.nodes.index(node)
    graph.nodes[at:at] = moved
    return True


def _safe_key(node: Node, names: dict):
    """The CSE key of a node with inputs named by `names` (None if unnamed or unhashable)."""
    if not all(v.is_literal or v.id in names for v in node.inputs):
        return None
    try:
        return node_key(node, lambda v: names[v.id])
    except TypeError:
        return None


# ---- sum first, pull back once: linear accumulations in scan carries ----------------------

@register(exact=False, loops=True)
def sum_then_pull_back(graph: Graph) -> Graph:
    """Rewrite a scan carry `acc + L(m_t)`, L linear with loop-constant coefficients, as `acc + L(sum_t m_t)`.

    This is the transposed scan of a gradient whose loop-invariant residual
    (`G = W @ W.T`) was computed inside the loop: every step pulls its cotangent
    back through the residual's computation (two H x H x H products) and adds
    it to the carried gradient. Summing the per-step cotangents `m_t` in a new
    carry and pulling back once after the loop does the same work once, as JAX
    does when `G` is a loop constant. Reassociates sums (not exact).
    """
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            sum_then_pull_back(sub)
        if node.name == "scan" and not _input_effects(node):
            while _defer_one(graph, node):
                pass
    return graph


def _defer_one(graph: Graph, node: Node) -> bool:
    loop = ScanLoop(node)
    body = loop.body
    outer_of = {v.id: o for v, o in zip(loop.body_consts, loop.consts)}
    outer_of.update((v.id, v) for v in body.consts)
    for j, (cin, cout) in enumerate(zip(loop.body_carry, loop.body_carry_out)):
        add = cout.producer
        if (add is None or add.name not in ("add", "add_any") or cin not in add.inputs
                or len(cin.uses) != 1 or cout.uses != [(OUT, j)]):
            continue
        r = add.inputs[1 - add.inputs.index(cin)]
        if r.producer is None or len(r.uses) != 1:
            continue
        owner, call, rr, consts = body, None, r, outer_of
        if r.producer.name in PEEL and not is_impure(r.producer) and r.producer.name not in ("jit", "pjit"):
            call = r.producer
            owner, rr = call.regions["body"], call.regions["body"].outputs[r.index]
            if sum(1 for o in owner.outputs if o is rr) != 1 or len(rr.uses) != 1:
                continue
            consts = {b.id: outer_of[v.id] for b, v in zip(owner.inputs, call.inputs) if v.id in outer_of}
            consts.update((v.id, v) for v in owner.consts)
        region = _linear_region(rr, consts)
        if region is None:
            continue
        nodes, m = region
        _rewrite(graph, node, loop, j, add, call, owner, rr, r, nodes, m, consts)
        return True
    return False


def _linear_region(r: Value, consts: dict[int, Value]):
    """(nodes computing r linearly from one source value m, m), or None."""
    nodes: dict[int, Node] = {}
    sources: dict[int, Value] = {}
    const = lambda v: v.is_literal or v.id in consts  # noqa: E731

    def visit(v: Value, root: bool) -> None:
        p = v.producer
        lin = None
        if p is not None and (root or all(u is not OUT for u, _ in v.uses)):
            lin = linear_operands(p, const)   # per primitive and dtype; no dtype change inside L
        if lin is None:
            sources[v.id] = v
            return
        if id(p) not in nodes:
            nodes[id(p)] = p
            for x in lin:
                visit(x, False)

    visit(r, True)
    if len(sources) != 1 or not any(n.name == "dot_general" for n in nodes.values()):
        return None
    region = {id(n) for n in nodes.values()}
    for n in nodes.values():   # nothing but the region (and r's one user) reads the region's values
        for o in n.outputs:
            if o is not r and any(u is OUT or id(u) not in region for u, _ in o.uses):
                return None
    (m,) = sources.values()
    return producers_first(nodes.values()), m


def _rewrite(graph, node, loop, j, add, call, owner, rr, r, nodes, m, consts) -> None:
    body = loop.body
    if call is not None:   # the call returns m instead of L(m)
        k = r.index
        owner.set_output(k, m)
        new = Value(m.aval, call, k)
        outs = list(call.outputs)
        outs[k] = new
        call.set_outputs(outs)
        m_body = new
    else:
        m_body = m
    cin = loop.body_carry[j]
    # acc_m: a new carry summing m over the steps
    zero = Graph.literal(0, m.aval.dtype)
    # every node made here stands for the user's accumulation `acc + L(m)`: its line and context
    init = graph.add("broadcast_in_dim", [zero], {"shape": m.aval.shape, "broadcast_dimensions": (),
                                                "sharding": None}, source_info=add.source_info, ctx=add.ctx)
    graph._nodes.pop()
    acc = loop.add_carry(init.outputs[0])
    step = body.add("add_any", [acc.inner, m_body], source_info=add.source_info, ctx=add.ctx)
    acc.set_next(step.outputs[0])
    body.set_output(j, cin)    # the old carry passes through unchanged
    body.remove(add)
    for n in reversed(nodes):  # L is now dead in the loop body
        if all(not o.uses for o in n.outputs):
            owner.remove(n)
    # after the loop: result_j + L(acc_m)
    env = {m.id: acc.result}
    after = []
    for n in nodes:
        ins = []
        for v in n.inputs:
            if v.id in env:
                ins.append(env[v.id])
            elif v.is_literal:
                ins.append(v)
            elif consts[v.id].is_const and not any(consts[v.id] is c for c in graph.consts):
                ins.append(graph.add_const(consts[v.id].const))   # a constant of an inner body
            else:
                ins.append(consts[v.id])
        c = graph.add(n.prim, ins, n.params, source_info=n.source_info, ctx=n.ctx)
        graph._nodes.pop()
        after.append(c)
        env.update((o.id, co) for o, co in zip(n.outputs, c.outputs))
    res = node.outputs[j]
    uses = list(res.uses)
    fin = graph.add("add_any", [node.inputs[loop.num_consts + j], env[rr.id]],   # the carry's start value
                    source_info=add.source_info, ctx=add.ctx)
    graph._nodes.pop()
    for u, i in uses:
        graph.set_output(i, fin.outputs[0]) if u is OUT else u.set_input(i, fin.outputs[0])
    at = graph.nodes.index(node)
    graph._nodes[at:at] = [init]
    graph._nodes[at + 2:at + 2] = after + [fin]
