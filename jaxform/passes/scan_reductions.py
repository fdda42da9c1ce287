"""Fuse reductions of scan outputs into the scan body (seed 001).

    ys = scan(step, h0, xs)[1]            # [length, batch, hidden], stacked
    loss = mean((ys - targets) ** 2)      # ... only to be reduced

A model that returns its stacked per-step outputs serves inference; the
training loss then reduces them, so `length x batch x hidden` values live in
memory at once. This pass moves the elementwise chain and the reduction into
the body, where a new carry accumulates it step by step:

    scan(step', (h0, 0.0), (xs, targets))   # step' also does acc += sum((h - t) ** 2)

What fuses. Starting from a scan's `ys`, follow users that are
- elementwise (ELEMENTWISE: unary/binary/ternary lax ops, `convert_element_type`):
  their other operands must not depend on the scan and be literals, scalars
  (become new scan consts), broadcasts of arrays along non-scan axes (the
  broadcast operand becomes a const and the broadcast moves into the body,
  so nothing `[length, ...]` is materialized), or arrays with the scan's
  length on axis 0 (become new `xs`: the seed's `ys - targets`);
- reductions (`reduce_sum`, `reduce_max`, `reduce_min`, `reduce_prod`):
  over the scan axis 0 they end the chain and become carried accumulators
  (init = the reduction's identity: 0, 1, -inf/+inf or the integer extremes);
  over other axes only they reduce per step and may feed more of the chain
  (also through a `broadcast_in_dim` that keeps axis 0, as in
  `ys - ys.mean(-1, keepdims=True)`); if used outside it, they leave the
  scan as a new, smaller `ys`.
`mean` is `reduce_sum` then `div`: the division stays after the scan.
Several reductions of the same `ys`, several `ys`, `reverse`, `unroll` and
nested scans (bodies of scan/while/cond/jit, walked recursively, outer scans
first so that a reduction moved into a body can fuse with an inner scan)
are handled.

What does not fuse (left exactly as is): a `ys` any of whose elementwise
descendants has another consumer (a graph output, a matmul, the backward
scan of a grad, an operand computed from the scan's own results such as
`ys - ys.mean(0)`). Fusing such an output and keeping it too would only
duplicate work. Elementwise helpers wrapped in `jit` (`jnp.where`,
`jnp.clip`) fuse once `inline` has run (it does, first, in the default
pipeline). Gradients at ties of max/min may be split differently between
the tied elements (both are valid subgradients).

Not exact: per-step partial sums reassociate floating point additions (XLA
reorders reductions too), so the pass is registered with exact=False.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..ir import Graph, Node, Value
from ..ir.graph import OUT
from . import register
from .dce import shrink_unused

UNARY = frozenset({
    "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "abs",
    "sqrt", "rsqrt", "cbrt", "square", "integer_pow", "not", "real", "imag", "conj", "lgamma", "digamma", "erf",
    "erfc", "erf_inv", "bessel_i0e", "bessel_i1e", "convert_element_type", "reduce_precision", "copy", "copy_p",
    "population_count", "clz"})
BINARY = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "and", "or", "xor",
    "eq", "ne", "lt", "le", "gt", "ge", "shift_left", "shift_right_logical", "shift_right_arithmetic", "complex",
    "igamma", "igammac", "polygamma", "zeta"})
TERNARY = frozenset({"select_n", "clamp"})
ELEMENTWISE = UNARY | BINARY | TERNARY

# reduction -> (the binary op that accumulates it, its identity for a dtype)
REDUCTIONS = {
    "reduce_sum": ("add", lambda d: 0),
    "reduce_prod": ("mul", lambda d: 1),
    "reduce_max": ("max", lambda d: -np.inf if jnp.issubdtype(d, jnp.floating) else
                   False if d == np.bool_ else jnp.iinfo(d).min),
    "reduce_min": ("min", lambda d: np.inf if jnp.issubdtype(d, jnp.floating) else
                   True if d == np.bool_ else jnp.iinfo(d).max),
}


@register(exact=False)
def fuse_scan_reductions(graph: Graph) -> Graph:
    """Move elementwise-then-reduce consumers of scan `ys` into the body as carried accumulators."""
    for node in list(graph.nodes):
        if node.dead:
            continue
        if node.name == "scan":
            fuse_scan(graph, node)
        for sub in node.subgraphs():
            fuse_scan_reductions(sub)
    return graph


# ---- planning: which consumers of which ys can move --------------------------------

class Plan:
    """The part of `graph` downstream of a scan's `ys` that moves into its body."""

    def __init__(self):
        self.nodes: list[Node] = []     # elementwise and per-step reductions, in topological order
        self.terms: list[Node] = []     # reductions over the scan axis: become carries
        self.exports: list[Value] = []  # per-step reductions used outside: become new ys
        self.bad: set[int] = set()      # roots (ids) that cannot fuse


def _downstream(graph: Graph, node: Node) -> set[int]:
    """ids of the values of `graph` computed from `node`'s results."""
    seen, todo = set(), list(node.outputs)
    while todo:
        v = todo.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        todo.extend(o for u in v.users for o in u.outputs)
    return seen


def _liftable(v: Value, shape: tuple, after: set[int]) -> bool:
    """Can this operand of a moved elementwise node be brought into the body?

    lax elementwise ops take scalars and same-rank operands with size-1 dims
    broadcast implicitly; axis 0 of size 1 is the same at every step.
    """
    s = v.aval.shape
    return v.is_literal or (v.id not in after and (
        s == () or (len(s) == len(shape) and all(a in (1, b) for a, b in zip(s, shape)))))


def _axes(n: Node) -> tuple:
    return tuple(n.params["axes"])


def _plan(roots: dict[int, Value], after: set[int], length: int) -> Plan:
    plan = Plan()
    inside: dict[int, Value] = dict(roots)          # values that will be computed per step
    origin: dict[int, set[int]] = {i: {i} for i in roots}
    taken: set[int] = set()
    changed = True
    while changed:
        changed = False
        for v in list(inside.values()):
            for n in v.users:
                if id(n) in taken or n.effects or len(n.outputs) != 1:
                    continue
                shape = n.outputs[0].aval.shape
                if n.name in ELEMENTWISE:
                    if shape[:1] != (length,) or any(
                            u.id not in inside and not _liftable(u, shape, after) for u in n.inputs):
                        continue   # maybe later, once another input is inside
                elif n.name == "broadcast_in_dim":
                    if tuple(n.params["broadcast_dimensions"])[:1] != (0,) or shape[:1] != (length,):
                        continue
                elif n.name in REDUCTIONS and _axes(n):
                    if 0 in _axes(n):
                        taken.add(id(n))
                        plan.terms.append(n)
                        changed = True
                        continue
                else:
                    continue
                taken.add(id(n))
                plan.nodes.append(n)
                o = n.outputs[0]
                inside[o.id] = o
                origin[o.id] = set().union(*(origin[u.id] for u in n.inputs if u.id in inside))
                changed = True
    for v in inside.values():
        external = any(u is OUT or id(u) not in taken for u, _ in v.uses)
        if external and v.producer is not None and v.producer.name in REDUCTIONS and v.id not in roots:
            plan.exports.append(v)
        elif external:
            plan.bad |= origin[v.id]
    return plan


# ---- rewriting ---------------------------------------------------------------------

def fuse_scan(graph: Graph, scan: Node) -> bool:
    """Fuse what can be fused of this scan's ys consumers; True if the scan changed."""
    if any(t is not None for _, t in scan.effects):
        return False
    k = scan.params["num_carry"]
    after = _downstream(graph, scan)
    roots = {o.id: o for o in scan.outputs[k:] if o.uses}
    while roots:
        plan = _plan(roots, after, scan.params["length"])
        if not plan.bad:
            break
        roots = {i: v for i, v in roots.items() if i not in plan.bad}
    if not roots or not (plan.terms or plan.exports):
        return False
    _rewrite(graph, scan, roots, plan)
    return True


class _Body:
    """Builds the additions to a scan body: new consts, xs, carries, ys."""

    def __init__(self, graph: Graph, scan: Node):
        self.graph, self.scan, self.body = graph, scan, scan.regions["body"]
        p = scan.params
        c, k = p["num_consts"], p["num_carry"]
        self.length = p["length"]
        ins, bins = scan.inputs, self.body.inputs
        self.consts = {ins[i].id: bins[i] for i in range(c) if not ins[i].is_literal}
        self.xs = {ins[i].id: bins[i] for i in range(c + k, len(ins)) if not ins[i].is_literal}
        self.new_consts: list[tuple[Value, Value]] = []   # (outer operand, body input)
        self.new_xs: list[tuple[Value, Value]] = []
        self.lifted: dict[int, Value] = {}

    def const(self, v: Value) -> Value:
        if v.is_literal:
            return Value(v.aval, literal=v.literal)
        if v.id not in self.consts:
            self.consts[v.id] = Value(v.aval)
            self.new_consts.append((v, self.consts[v.id]))
        return self.consts[v.id]

    def x(self, v: Value) -> Value:
        if v.id not in self.xs:
            self.xs[v.id] = Value(v.aval.update(shape=v.aval.shape[1:]))
            self.new_xs.append((v, self.xs[v.id]))
        return self.xs[v.id]

    def lift(self, v: Value) -> Value:
        """The per-step value, inside the body, of an outside operand of a moved node."""
        if v.is_literal:
            return Value(v.aval, literal=v.literal)
        if v.id in self.lifted:
            return self.lifted[v.id]
        if v.aval.shape == ():
            out = self.const(v)
        elif (b := v.producer) is not None and b.name == "broadcast_in_dim" and (per := self._broadcast(b)):
            out = per
        elif v.aval.shape[0] == self.length:
            out = self.x(v)     # an array with the scan's length on axis 0
        else:                   # axis 0 of size 1: the same at every step
            out = self.body.add("squeeze", [self.const(v)], {"dimensions": (0,)}).outputs[0]
        self.lifted[v.id] = out
        return out

    def _broadcast(self, b: Node) -> Value | None:
        """broadcast_in_dim(o) -> [length, ...]: broadcast o (or its per-step slice) in the body instead."""
        o, dims, shape = b.inputs[0], tuple(b.params["broadcast_dimensions"]), tuple(b.params["shape"])
        if 0 not in dims:
            base = self.const(o)
        elif o.aval.shape[0] == self.length:
            base = self.x(o)
        elif o.aval.shape[0] == 1:
            base = self.body.add("squeeze", [self.const(o)], {"dimensions": (0,)},
                                 source_info=b.source_info).outputs[0]
        else:
            return None
        step_dims = tuple(d - 1 for d in dims if d != 0)
        return self.body.add("broadcast_in_dim", [base], {**b.params, "shape": shape[1:],
                             "broadcast_dimensions": step_dims}, source_info=b.source_info).outputs[0]


def _rewrite(graph: Graph, scan: Node, roots: dict[int, Value], plan: Plan) -> None:
    body: Graph = scan.regions["body"]
    p = scan.params
    c, k = p["num_consts"], p["num_carry"]
    b = _Body(graph, scan)
    env = {o.id: bo for o, bo in zip(scan.outputs[k:], body.outputs[k:]) if o.id in roots}
    for n in plan.nodes:
        ins = [env[v.id] if v.id in env else b.lift(v) for v in n.inputs]
        params = dict(n.params)
        if n.name in REDUCTIONS:
            params["axes"] = tuple(a - 1 for a in _axes(n))
        elif n.name == "broadcast_in_dim":
            params["shape"] = tuple(params["shape"])[1:]
            params["broadcast_dimensions"] = tuple(d - 1 for d in params["broadcast_dimensions"][1:])
        env[n.outputs[0].id] = body.add(n.prim, ins, params, source_info=n.source_info).outputs[0]

    inits, carries_in, carries_out, finals = [], [], [], []
    for t in plan.terms:
        out = t.outputs[0]
        step = env[t.inputs[0].id]
        axes = tuple(a - 1 for a in _axes(t) if a != 0)
        if axes:
            step = body.add(t.prim, [step], {**t.params, "axes": axes}, source_info=t.source_info).outputs[0]
        acc_op, identity = REDUCTIONS[t.name]
        dtype = np.dtype(out.aval.dtype)
        lit = Graph.literal(identity(dtype), dtype, weak_type=out.aval.weak_type)
        inits.append(graph.add("broadcast_in_dim", [lit], {"shape": out.aval.shape, "broadcast_dimensions": ()},
                               out_avals=[out.aval], source_info=t.source_info).outputs[0])
        carries_in.append(Value(out.aval))
        carries_out.append(body.add(acc_op, [carries_in[-1], step], out_avals=[out.aval],
                                    source_info=t.source_info).outputs[0])
        finals.append(out)

    ins, bins, bouts, outs = scan.inputs, body.inputs, body.outputs, scan.outputs
    nc = len(b.new_consts)
    scan.set_inputs(ins[:c] + [o for o, _ in b.new_consts] + ins[c:c + k] + inits + ins[c + k:]
                    + [o for o, _ in b.new_xs])
    body.inputs = bins[:c] + [i for _, i in b.new_consts] + bins[c:c + k] + carries_in + bins[c + k:] \
        + [i for _, i in b.new_xs]
    body.set_outputs(bouts[:k] + carries_out + bouts[k:] + [env[v.id] for v in plan.exports])
    new_carry = [Value(v.aval) for v in finals]
    new_ys = [Value(v.aval) for v in plan.exports]
    scan.set_outputs(outs[:k] + new_carry + outs[k:] + new_ys)
    p["num_consts"], p["num_carry"] = c + nc, k + len(finals)
    for old, new in zip(finals + plan.exports, new_carry + new_ys):
        graph.replace_uses(old, new)
    for n in plan.terms + plan.nodes[::-1]:   # consumers first
        if not n.dead and all(not o.uses for o in n.outputs):
            graph.remove(n)
    shrink_unused(scan)   # the fused ys (now unused) and unread inputs leave the scan
