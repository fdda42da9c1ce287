"""Thin residual stacks: what a forward loop stacks for the loop that reads it backwards.

`jax.grad` of a scan is a forward scan that stacks residuals (`ys`) and a
reverse scan that reads them back (`xs`). For the README's RNN + MSE,
`h' = tanh(h @ W + x @ U)`, JAX stacks four `[L, B, H]` buffers: `h'` for the
loss, `h'` again and `1 - h'` for tanh's derivative, the carry-in `h` for `dW`;
after the loop it builds `2 (h' - t) / n`, another, for the reverse loop. One is
enough. Rules, in order, each exact (same primitives on the same values):

- *one stack per value*: a body value stacked twice is stacked once;
- *sink elementwise*: an xs built outside a loop by a few cheap elementwise
  ops of another loop's stacked results, other `[L, ...]` buffers and
  constants, read by nothing else, is computed row by row inside the loop that
  reads it (loop to loop only: batching a loop's own inputs is `fission`'s call);
- *recompute cheap*: a residual that is a few cheap ops of rows its consumers
  read anyway (`1 - h'`) is recomputed there;
- *shifted carry*: row t of a carry's carry-out stack is row t+1 of its
  carry-in stack (its last row: the final carry). A consumer running the other
  way meets row t+1 just before it needs row t, so it carries it. If the
  carry-out stack must stay (the loss reads it), the consumers instead read
  the carry-in rows from it, one step back (`dynamic_slice` at the position
  before, the initial carry at the first step).

The forward loop's body is not touched; `dce` then drops what nobody reads.
Nothing moves across an effect: recomputed ops are pure (`identity.is_impure`);
effectful consumers are left alone (they keep every input, `dce.shrink_unused`,
so they would keep the stack anyway). Works on any program holding such a
pair, which in practice means a program already differentiated:
`optimize(jax.grad(f))`. Numbers: `benchmarks/training_memory.py`, `benchmarks/loops.py`.
"""
from __future__ import annotations

import numpy as np

from ..ir import Graph, Node, ScanLoop, Value
from ..ir.graph import OUT
from ..ir.identity import is_impure
from ..ir.regions import scan_roles
from ..ir.toposort import producers_first
from .registry import register
from .dce import dce

# Ops worth recomputing instead of stacking: a stacked row costs a write and a read of the whole
# row; these cost about one pass over it in registers (transcendentals like tanh stay stacked).
CHEAP = frozenset({"add", "add_any", "sub", "mul", "neg", "square", "integer_pow", "one_minus_square", "max",
                   "min", "abs", "sign", "select_n", "convert_element_type", "eq", "ne", "lt", "le", "gt", "ge",
                   "and", "or", "not"})
MAX_RECOMPUTE = 8   # nodes per recomputed residual


@register(loops=True)
def thin_residuals(graph: Graph) -> Graph:
    """Drop the stacks a consumer loop can rebuild per step (see the module docstring)."""
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            thin_residuals(sub)
    # A loop of no steps stacks nothing to thin (and a step-back read of its [0, ...] stack does not exist).
    scans = lambda: [n for n in graph.nodes if n.name == "scan" and not n.dead and n.params["length"] > 0]  # noqa: E731
    changed = False
    for n in scans():
        changed |= stack_once(graph, n)
    for n in scans():
        changed |= sink_elementwise(n)
    for n in scans():
        changed |= read_once(n)
    for n in scans():
        changed |= recompute_cheap(n) | shift_carries(n)
    if changed:
        dce(graph)
    return graph


def stack_once(graph: Graph, node: Node) -> bool:
    """A body value stacked as two ys (JAX stacks an RNN's state for the user and again as a residual): once."""
    loop, first, changed = ScanLoop(node), {}, False
    for inner, outer in zip(loop.body_ys, loop.ys):
        if inner.id in first and outer.uses:
            graph.replace_uses(outer, first[inner.id])
            changed = True
        first.setdefault(inner.id, outer)
    return changed


def read_once(node: Node) -> bool:
    """A buffer read as two xs of one loop: read once."""
    loop, first, changed = ScanLoop(node), {}, False
    for inner, outer in zip(loop.body_xs, loop.xs):
        if outer.id in first and inner.uses:
            loop.body.replace_uses(inner, first[outer.id])
            changed = True
        first.setdefault(outer.id, inner)
    return changed


def sink_elementwise(node: Node) -> bool:
    """An xs computed outside by cheap elementwise ops of `[L, ...]` buffers and constants, read only by this
    loop: compute its rows in the loop from rows of those buffers (the `[L, ...]` result is never built)."""
    loop, changed = ScanLoop(node), False
    if node.effects:   # it keeps all its inputs (dce.shrink_unused): the [L, ...] buffer would stay
        return False
    for inner, outer in zip(loop.body_xs, loop.xs):
        if not inner.uses or any(u is not node for u, _ in _live_uses(outer)):
            continue
        recipe = _batched_recipe(outer, loop.length)
        if recipe is None:
            continue
        row = _replay_rows(loop, recipe, outer)
        if row is not None:
            loop.body.replace_uses(inner, row)
            changed = True
    return changed


def _per_row(n: Node, L: int) -> bool:
    """Does `n` compute row t of its `[L, ...]` result from row t of its `[L, ...]` operands alone?"""
    if not n.outputs or any(o.aval.shape[:1] != (L,) for o in n.outputs) or is_impure(n) or n.effects or n.regions:
        return False
    if n.name == "broadcast_in_dim":
        return 0 not in n.params["broadcast_dimensions"] and n.params.get("sharding") is None
    return n.name in CHEAP and all(v.is_literal or v.aval.shape == n.outputs[0].aval.shape for v in n.inputs)


def _batched_recipe(x: Value, L: int) -> list[Node] | None:
    """The per-row nodes computing `x` that nothing else needs (topological order), or None."""
    nodes: dict[int, Node] = {}
    todo = [x]
    while todo:
        v = todo.pop()
        n = v.producer
        if n is None or id(n) in nodes or not _per_row(n, L):
            continue
        nodes[id(n)] = n
        if len(nodes) > MAX_RECOMPUTE:
            return None
        todo.extend(n.inputs)
    changed = True
    while changed:   # a node whose result is also needed elsewhere stays outside: its buffer exists anyway
        changed = False
        for k, n in list(nodes.items()):
            if n.outputs[0] is not x and any(u is OUT or (id(u) not in nodes and not _dead(u))
                                             for o in n.outputs for u, _ in o.uses):
                del nodes[k]
                changed = True
    if x.producer is None or id(x.producer) not in nodes:
        return None
    leaves = [v for n in nodes.values() for v in n.inputs if v.producer is None or id(v.producer) not in nodes]
    if not any(_from_loop(v, L) for v in leaves):
        return None   # loop to loop only: a loop's own batched elementwise input is fission's decision
    return producers_first(nodes.values())


def _live_uses(v: Value) -> list:
    """`v.uses` without dead code's (dce runs after this pass)."""
    return [(u, i) for u, i in v.uses if u is OUT or not (_dead(u) or _unread(u, i))]


def _unread(n: Node, i: int) -> bool:
    """Is operand i of `n` a scan's const or xs that its body no longer reads? (dce drops it later.)"""
    return n.name == "scan" and i not in range(*scan_roles(n.params)["carry"].indices(len(n.inputs))) \
        and not n.regions["body"].inputs[i].uses


def _dead(n: Node, seen: set[int] | None = None) -> bool:
    """Is `n` dead code (pure, and all its results unused or used only by dead code)? dce removes it later."""
    seen = set() if seen is None else seen
    if id(n) in seen:
        return True
    seen.add(id(n))
    return not n.effects and not is_impure(n) and all(
        u is not OUT and (_dead(u, seen) or _unread(u, i)) for o in n.outputs for u, i in o.uses)


def _from_loop(v: Value, L: int, depth: int = MAX_RECOMPUTE) -> bool:
    """Is `v` a loop's stacked result, or per-row work on one?"""
    n = v.producer
    if n is None or depth == 0:
        return False
    return n.name == "scan" or (_per_row(n, L) and any(_from_loop(u, L, depth - 1) for u in n.inputs))


def _replay_rows(loop: ScanLoop, recipe: list[Node], x: Value) -> Value | None:
    """Rebuild `recipe` per row in `loop`'s body; `[L, ...]` leaves become xs rows, others loop constants."""
    def leaf(v: Value, n: Node) -> Value:
        if n.name != "broadcast_in_dim" and v.aval.shape[:1] == (loop.length,):
            return _row_of(loop, v) or loop.add_xs([v])[0]
        return loop.add_consts([v])[0]
    return _rebuild(loop, recipe, x, leaf, per_row=True)


def _rebuild(loop: ScanLoop, recipe: list[Node], x: Value, leaf, per_row: bool) -> Value | None:
    """Add `recipe`'s nodes (producers first) to `loop`'s body, with their line and equation context;
    `leaf(v, node)` gives the body's value for an operand the recipe does not compute. Returns the body's
    `x`, or None where a rebuilt node's type differs from the original's (its row's, if `per_row`)."""
    ids, new = {id(n) for n in recipe}, {}
    for n in recipe:
        ins = []
        for v in n.inputs:
            if v.is_literal:
                ins.append(Value(v.aval, literal=v.literal))
                continue
            if v.id not in new:
                assert v.producer is None or id(v.producer) not in ids, "recipe out of order"
                new[v.id] = leaf(v, n)
            ins.append(new[v.id])
        m = loop.body.add(n.prim, ins, _row_params(n) if per_row else n.params, source_info=n.source_info,
                          ctx=n.ctx)
        for o, p in zip(n.outputs, m.outputs):
            if _kind(p) != ((o.aval.shape[1:] if per_row else o.aval.shape), o.aval.dtype, o.aval.weak_type):
                return None
            new[o.id] = p
    return new[x.id]


def _row_params(n: Node) -> dict:
    """`n`'s params for one row of its `[L, ...]` result (only broadcast_in_dim names its shape)."""
    params = dict(n.params)
    if n.name == "broadcast_in_dim":
        params["shape"] = tuple(params["shape"][1:])
        params["broadcast_dimensions"] = tuple(d - 1 for d in params["broadcast_dimensions"])
    return params


def _xs_reads(stack: Value) -> list[tuple[ScanLoop, Value]] | None:
    """(consumer, its per-step body input) for every use of `stack`, if all are xs of same-length scans."""
    reads = []
    for user, i in _live_uses(stack):
        # An effectful consumer keeps all its inputs (dce.shrink_unused), so it would keep reading the stack:
        # rewriting it would only add a carry and recomputation.
        if user is OUT or user.name != "scan" or user.effects:
            return None
        roles = scan_roles(user.params)
        if not (roles["xs"].start <= i < len(user.inputs)) or user.params["length"] != stack.aval.shape[0]:
            return None
        reads.append((ScanLoop(user), user.regions["body"].inputs[i]))
    return reads or None


def _row_of(loop: ScanLoop, stack: Value) -> Value | None:
    """The consumer's body input reading `stack` as xs, if it reads it."""
    for inner, outer in zip(loop.body_xs, loop.xs):
        if outer is stack:
            return inner
    return None


def _kind(v: Value) -> tuple:
    return v.aval.shape, v.aval.dtype, v.aval.weak_type


def _stacked(f: ScanLoop) -> list[tuple[Value, Value]]:
    """(body value, its [L, ...] stack outside) for the forward loop's ys and xs: the rows a consumer may read."""
    return list(zip(f.body_ys, f.ys)) + list(zip(f.body_xs, f.xs))


def _stack_of(f: ScanLoop) -> dict[int, Value]:
    """Forward body value id -> its stack: the first, the one `stack_once` left the readers on."""
    out: dict[int, Value] = {}
    for inner, outer in zip(f.body_ys, f.ys):
        out.setdefault(inner.id, outer)
    return out


def shift_carries(node: Node) -> bool:
    """A carry stacked both as it enters and as it leaves each step: consumers read one stack, not two."""
    f, changed = ScanLoop(node), False
    stack_of = _stack_of(f)
    for cin, cout, init, final in zip(f.body_carry, f.body_carry_out, f.carry, f.carry_out):
        if cin is cout or cin.id not in stack_of or cout.id not in stack_of:
            continue
        s_in, s_out = stack_of[cin.id], stack_of[cout.id]
        reads = _xs_reads(s_out)
        if reads is not None and all(c.reverse != f.reverse for c, _ in reads) and _kind(final) == _kind(cout):
            for c, row in reads:   # the consumer meets row t+1 of s_in just before it needs row t of s_out
                c.body.replace_uses(row, _carried_row(c, s_in, final))
            changed = True
            continue
        reads = _xs_reads(s_in)   # s_out stays (read after the loop): s_in's rows are s_out's, one step back
        if reads is not None and _kind(init) == _kind(cin):
            for c, row in reads:
                c.body.replace_uses(row, _row_before(c, s_out, init, f.reverse))
            changed = True
    return changed


def _row_before(c: ScanLoop, stack: Value, init: Value, reverse: bool) -> Value:
    """In consumer `c`'s body at row t: the forward loop's carry entering step t, read from its carry-out
    `stack` (row t-1, or t+1 for a reverse loop) and `init` at the loop's first step."""
    i32, body = np.int32, c.body
    where = {"source_info": c.node.source_info, "ctx": c.node.ctx}   # the consumer's line and equation context

    def add(prim, ins, params=None):
        return body.add(prim, ins, params, **where).outputs[0]
    pos = c.position()
    buf, first = c.add_consts([stack, init])
    prev = add("add" if reverse else "sub", [pos, Graph.literal(1, i32)])   # dynamic_slice clamps at the ends
    rows = add("dynamic_slice", [buf, prev, *[Graph.literal(0, i32) for _ in stack.aval.shape[1:]]],
               {"slice_sizes": (1, *stack.aval.shape[1:])})
    at_first = add("eq", [pos, Graph.literal(c.length - 1 if reverse else 0, i32)])
    return add("select_n", [at_first, add("squeeze", [rows], {"dimensions": (0,)}), first])


def recompute_cheap(node: Node) -> bool:
    """Residuals that are a few cheap ops of rows every consumer reads anyway: recompute them there."""
    f, changed = ScanLoop(node), False
    consts_outer = {v.id: o for v, o in zip(f.body_consts, f.consts)}
    made: dict = {}   # (consumer, carry-out) -> its carried row, made once per consumer
    stack_of = _stack_of(f)
    for r, stack in zip(f.body_ys, f.ys):
        reads = _xs_reads(stack) if stack.uses else None
        if reads is None or r.producer is None:
            continue
        rows = [_rows(f, c, stack, stack_of, made) for c, _ in reads]
        recipe = _recipe(f, r, set.intersection(*(set(rw) for rw in rows)))
        if recipe is None:
            continue
        for (c, row), rw in zip(reads, rows):
            if (got := _replay(c, recipe, r, rw, consts_outer)) is not None:
                c.body.replace_uses(row, got)
                changed = True
    return changed


def _rows(f: ScanLoop, c: ScanLoop, stack: Value, stack_of: dict[int, Value], made: dict) -> dict:
    """Forward body value id -> a maker of consumer `c`'s row of it: the rows `c` reads (but `stack`'s),
    and, for a consumer running the other way, carry-outs whose carry-in is stacked (as a carry, see
    `shift_carries`; made only if used)."""
    out = {inner.id: (lambda row=row: row) for inner, outer in _stacked(f)
           if outer is not stack and (row := _row_of(c, outer)) is not None}
    if c.reverse != f.reverse:
        for cin, cout, final in zip(f.body_carry, f.body_carry_out, f.carry_out):
            if cin is not cout and cin.id in stack_of and stack_of[cin.id] is not stack and \
                    cout.producer is not None and _kind(final) == _kind(cout):
                def carried(key=(id(c.node), cout.id), s_in=stack_of[cin.id], final=final):
                    if key not in made:
                        made[key] = _carried_row(c, s_in, final)
                    return made[key]
                out.setdefault(cout.id, carried)
    return out


def _carried_row(c: ScanLoop, s_in: Value, final: Value) -> Value:
    """Consumer `c` (running the other way) carries the carry-in row it read last: the next carry-out row."""
    nxt = c.add_carry(final)
    nxt.set_next(_row_of(c, s_in) or c.add_xs([s_in])[0])
    return nxt.inner


def _recipe(f: ScanLoop, r: Value, readable: set[int]) -> list[Node] | None:
    """The cheap pure nodes computing `r` from `readable` rows, constants and literals; or None."""
    consts = {v.id for v in f.body_consts} | {v.id for v in f.body.consts}
    nodes: dict[int, Node] = {}
    todo = [r]
    while todo:
        v = todo.pop()
        if v.is_literal or v.id in consts or (v is not r and v.id in readable):
            continue
        n = v.producer
        if n is None or n.name not in CHEAP or is_impure(n) or n.regions or n.effects:
            return None
        if id(n) not in nodes:
            nodes[id(n)] = n
            if len(nodes) > MAX_RECOMPUTE:
                return None
            todo.extend(n.inputs)
    return producers_first(nodes.values())


def _replay(c: ScanLoop, recipe: list[Node], r: Value, rows: dict,
            consts_outer: dict[int, Value]) -> Value | None:
    """Rebuild `recipe` in consumer `c`'s body from `rows` (forward body value id -> maker of its row)."""
    def leaf(v: Value, n: Node) -> Value:
        if v.is_const:
            return c.body.add_const(v.const)
        if v.id in consts_outer:
            return c.add_consts([consts_outer[v.id]])[0]
        return rows[v.id]()
    return _rebuild(c, recipe, r, leaf, per_row=False)
