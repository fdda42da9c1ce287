"""Thin residual stacks: what a forward loop stacks for the loop that reads it backwards.

`jax.grad` of a scan is a forward scan that stacks residuals (`ys`) and a
reverse scan that reads them back (`xs`). For an RNN step `h' = tanh(h @ W + x @ U)`
JAX stacks three `[L, B, H]` buffers: the carry-in `h` (for `dW`), the carry-out
`h'` and `1 - h'` (for tanh's derivative). Two of them are redundant:

- *shifted carry*: row t of the carry-out stack is row t+1 of the carry-in stack,
  and its last row is the loop's final carry. A consumer running the other way
  round meets the rows in the order t+1, t, so it keeps the previous row it
  read in a carry (starting at the final carry) instead of reading a second stack;
- *cheap recompute*: a residual that is a few elementwise arithmetic ops of
  other stacked rows and loop constants (`1 - h'`) is recomputed per step by
  the consumer from the rows it already reads.

The forward loop's body is not touched: consumers stop reading the stack, and
`dce.shrink_unused` then drops it from the forward scan. Memory and traffic
fall by a `[L, ...]` buffer each (RNN under grad: 3 stacks -> 1,
`benchmarks/loops.py`). The same primitives run on the same values, so results are
bit-identical op by op (registered exact). Nothing moves across an effect:
the recomputed ops are pure (`identity.is_impure`), and effectful consumers are
left alone (they keep every input, so they would keep the stack anyway).
Works on any program holding such a pair, which in practice means a program
already differentiated: `optimize(jax.grad(f))`.
"""
from __future__ import annotations

from ..ir import Graph, Node, ScanLoop, Value
from ..ir.graph import OUT
from ..ir.identity import is_impure
from ..ir.regions import scan_roles
from . import register
from .dce import shrink_unused

# Ops worth recomputing instead of stacking: a stacked row costs a write and a read of the whole
# row; these cost about one pass over it in registers (transcendentals like tanh stay stacked).
CHEAP = frozenset({"add", "add_any", "sub", "mul", "neg", "square", "integer_pow", "max", "min", "abs",
                   "sign", "select_n", "convert_element_type", "eq", "ne", "lt", "le", "gt", "ge",
                   "and", "or", "not"})
MAX_RECOMPUTE = 8   # nodes per recomputed residual


@register()
def thin_residuals(graph: Graph) -> Graph:
    """Drop stacks a reverse-reading consumer can rebuild per step (see module docstring)."""
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            thin_residuals(sub)
    for node in list(graph.nodes):
        if node.dead or node.name != "scan":
            continue
        consumers = {id(u): u for u in _stack_readers(node)}
        changed = recompute_cheap(node) | shift_carries(node)
        if changed:
            for c in consumers.values():
                shrink_unused(c)
            shrink_unused(node)
    return graph


def _stack_readers(node: Node) -> list[Node]:
    return [u for o in ScanLoop(node).ys for u in o.users if u.name == "scan"]


def _xs_reads(stack: Value) -> list[tuple[ScanLoop, Value]] | None:
    """(consumer, its per-step body input) for every use of `stack`, if all are xs of same-length scans."""
    reads = []
    for user, i in stack.uses:
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


def shift_carries(node: Node) -> bool:
    """Carry-out stacks read by reverse-running consumers: carry the previous carry-in row instead."""
    f, changed = ScanLoop(node), False
    stack_of = {}
    for inner, outer in zip(f.body_ys, f.ys):
        stack_of.setdefault(inner.id, outer)
    for cin, cout, final in zip(f.body_carry, f.body_carry_out, f.carry_out):
        if cin is cout or cin.id not in stack_of or cout.id not in stack_of:
            continue
        s_in = stack_of[cin.id]
        for s_out in [o for i, o in zip(f.body_ys, f.ys) if i is cout and o.uses]:
            reads = _xs_reads(s_out)
            if reads is None or any(c.reverse == f.reverse for c, _ in reads) or _kind(final) != _kind(cout):
                continue
            for c, row in reads:
                nxt = c.add_carry(final)
                prev = _row_of(c, s_in) or c.add_xs([s_in])[0]
                nxt.set_next(prev)
                c.body.replace_uses(row, nxt.inner)
            changed = True
    return changed


def recompute_cheap(node: Node) -> bool:
    """Residuals that are a few cheap ops of rows every consumer reads anyway: recompute them there."""
    f, changed = ScanLoop(node), False
    consts_outer = {v.id: o for v, o in zip(f.body_consts, f.consts)}
    for r, stack in zip(f.body_ys, f.ys):
        reads = _xs_reads(stack) if stack.uses else None
        if reads is None or r.producer is None:
            continue
        recipe = _recipe(f, r, reads, stack)
        if recipe is None:
            continue
        for c, row in reads:
            rows: dict[int, Value] = {}
            for inner, outer in _stacked(f):   # a value stacked twice: the copy this consumer reads
                if (got := _row_of(c, outer)) is not None:
                    rows.setdefault(inner.id, got)
            c.body.replace_uses(row, _replay(c, recipe, r, rows, consts_outer))
        changed = True
    return changed


def _recipe(f: ScanLoop, r: Value, reads, stack: Value) -> list[Node] | None:
    """The cheap pure nodes computing `r` from rows all consumers read, constants and literals; or None."""
    readable = None
    for c, _ in reads:
        rows = {inner.id for inner, outer in _stacked(f) if outer is not stack and _row_of(c, outer)}
        readable = rows if readable is None else readable & rows
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
    order = {id(n): i for i, n in enumerate(f.body.nodes)}
    return sorted(nodes.values(), key=lambda n: order[id(n)])


def _replay(c: ScanLoop, recipe: list[Node], r: Value, rows: dict[int, Value],
            consts_outer: dict[int, Value]) -> Value:
    """Rebuild `recipe` in consumer `c`'s body from its `rows` (forward body value id -> row); returns `r`."""
    new: dict[int, Value] = {}

    def operand(v: Value) -> Value:
        if v.id in new:
            return new[v.id]
        if v.is_literal:
            return Value(v.aval, literal=v.literal)
        if v.is_const:
            new[v.id] = c.body.add_const(v.const)
        elif v.id in consts_outer:
            new[v.id] = c.add_consts([consts_outer[v.id]])[0]
        else:
            new[v.id] = rows[v.id]
        return new[v.id]

    for n in recipe:
        m = c.body.add(n.prim, [operand(v) for v in n.inputs], n.params, out_avals=[o.aval for o in n.outputs],
                       source_info=n.source_info, ctx=n.ctx)
        new.update((o.id, p) for o, p in zip(n.outputs, m.outputs))
    return new[r.id]
