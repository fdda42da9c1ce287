"""Fuse reductions of scan outputs into the scan body (seed 001, issue 17).

    ys = scan(step, h0, xs)[1]                       # [length, batch, hidden], stacked
    loss = cross_entropy(ys @ V, labels)             # ... only to be reduced

A model that returns its stacked per-step outputs serves inference; the
training loss then reduces them, so `length x batch x ...` values live in
memory at once. This pass moves whatever is computed *step by step* from the
`ys` into the body, and the final reduction over the scan axis becomes a
carried accumulator:

    scan(step', (h0, 0.0), (xs, labels))    # step' also does acc += sum(ce(h @ V, label_t))

What moves: every consumer that `ir/separability.py` proves separable (step t
of its result needs only step t of its operands: elementwise ops incl.
stop_gradient/select_n/clamp/convert, matmuls with the scan axis free or batch,
transposes/reshapes/broadcasts keeping it whole, reductions, cumulative ops,
slices and gathers over other axes, and jit / remat / custom_jvp calls whose
bodies are all that, custom rules kept). The scan axis is followed wherever it
goes (`ys.transpose(1, 0, 2)`, vmap of a per-example loss). Operands from
outside the scan enter as loop constants (whole), as new `xs` (those with the
scan's length on the scan axis, moved to axis 0 first), or are re-broadcast
per step (a broadcast of something smaller is never materialized).
Reductions over the scan axis (sum, max, min, prod) end the chain and become
carries; per-step reductions used outside leave as new, smaller `ys`.
float16/bfloat16 sums accumulate in float32 as XLA's reductions do (converted
back once after the loop), and sums over more than 64 steps into small accumulators
(<= 1024 elements) are compensated (Kahan), so a long loss stays as accurate as
XLA's reduction of the stack; an accumulator in `shard_map` gets the
device-varying type of what it accumulates.

`defer`: a reduction over the scan axis *and* other axes (the usual scalar
loss) either reduces each step to a scalar and adds it (eager), or adds the
step's elementwise values into a carried buffer and reduces once after the loop
(deferred; one step's size of memory). `DEFER` picks per backend (see
docs/scan_reductions.md for the measurements).

Slices along the scan axis (`ys[k:]`, `ys[::2]`, `ys[::-2]`, static
`dynamic_slice`) keep their consumers step by step over fewer steps
(`ir/steps.py`): the accumulator is updated only where the step's position is
selected (`select_n` on a predicate of `ScanLoop.position()`), and the inputs
of consumers after the slice are masked (`select_n(p, stop_gradient(x), x)`) so
that what they compute at unselected steps (log 0, NaN padding) never reaches a
gradient. One step (`ys[-1]`, `ys[k]`, `jnp.take(ys, k, 0)`) becomes a carry
that takes the step's value at its position.

What does not move (left exactly as is): a `ys` any of whose step-by-step
descendants has a consumer that is not separable along the scan axis (a graph
output, the backward scan of a grad, `ys[1:] - ys[:-1]`, `ys - ys.mean(0)`,
`ys[i]` at a traced i; see `blockers`), and anything whose operands are computed with effects: a value
that reads a ref or follows a callback is never made a scan input, so nothing
crosses an effect. Gradients at ties of max/min may be split differently
between the tied elements (both are valid subgradients).

Not exact: per-step partial sums reassociate floating point additions (XLA
reorders reductions too), so the pass is registered with exact=False.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax
from ..ir import Graph, Node, Value
from ..ir.graph import OUT
from ..ir.loops import ScanLoop
from ..ir.steps import Steps, predicate, selects
from ..ir.separability import (ELEMENTWISE, NotSeparable, drop_invariant_axis, effect_free, emit_step,
                               keep_varying, like_varying, operand_axes, out_axes, varying, why_not)
from .registry import register
from .concat_parts import split_concat_reductions
from .dce import shrink_unused

# reduction over the scan axis -> (the binary op that accumulates it, its identity for a dtype)
REDUCTIONS = {
    "reduce_sum": ("add", lambda d: 0),
    "reduce_prod": ("mul", lambda d: 1),
    "reduce_max": ("max", lambda d: -np.inf if jnp.issubdtype(d, jnp.floating) else
                   False if d == np.bool_ else jnp.iinfo(d).min),
    "reduce_min": ("min", lambda d: np.inf if jnp.issubdtype(d, jnp.floating) else
                   True if d == np.bool_ else jnp.iinfo(d).max),
}
LOW_PRECISION = (jnp.float16, jnp.bfloat16)
# Sums over more steps than this are compensated (`_kahan_sum`): a plain running sum's error grows with length.
# Only accumulators of at most COMPENSATE_UP_TO elements: in a small one (a scalar loss, a [3] buffer) each element
# carries a long biased sum, whose error reaches the result; a large deferred buffer ([256, 128]) sums few steps per
# element relative to its size and XLA's final reduction averages the independent errors out (RNN + MSE, L=1000:
# 9.3e-8 relative off float64 either way), while compensating it cost 1.77x the forward time (measured, CPU).
COMPENSATE_AFTER = 64
COMPENSATE_UP_TO = 1024

# backend -> defer accumulation? CPU: measured here, deferred 1.06-3.5x faster than eager (docs/scan_reductions.md).
# GPU: issue 19's plain-JAX H100 numbers (deferred 1.16x, eager 0.92x of the original); not re-measured by
# this pass's benchmark (no GPU in that session). Others: unmeasured, eager.
DEFER = {"cpu": True, "gpu": True, "cuda": True, "rocm": True}


@register(exact=False, loops=True)
def fuse_scan_reductions(graph: Graph, defer: bool | None = None) -> Graph:
    """Move step-by-step consumers of scan `ys` into the body; reductions over steps become carries."""
    if defer is None:
        defer = DEFER.get(jax.default_backend(), False)
    split_concat_reductions(graph)      # sum(concat([h0[None], ys])) -> ... + sum(ys): a ys fusion can reach
    for node in list(graph.nodes):
        if node.dead:
            continue
        if node.name == "scan":
            fuse_scan(graph, node, defer=defer)
        for sub in node.subgraphs():
            fuse_scan_reductions(sub, defer=defer)
    return graph


# ---- planning: which consumers of which ys can move --------------------------------

class Plan:
    """The part of `graph` downstream of a scan's `ys` that moves into its body."""

    def __init__(self):
        self.nodes: list[Node] = []         # separable consumers, in topological order
        self.axes: dict[int, int] = {}      # value id -> its scan axis (inside values)
        self.steps: dict[int, Steps] = {}   # value id -> the scan steps it holds (ys[k:] holds some)
        self.operand_axes: dict[int, list] = {}   # id(node) -> the scan axis of each operand (None: whole)
        self.selects: dict[int, tuple] = {}       # id(node) -> per-step equation of a slice along the scan axis
        self.terms: list[Node] = []         # reductions over the scan axis: become carries
        self.picks: list[tuple[Node, int, tuple | None]] = []   # one step picked (ys[-1]): a carried value
        self.exports: list[Value] = []      # per-step reductions used outside: become new ys
        self.bad: set[int] = set()          # roots (ids) that cannot fuse
        self.blockers: list[tuple[Node | None, str]] = []   # (consumer, why) for explain


def _downstream(node: Node) -> set[int]:
    """ids of the values computed from `node`'s results."""
    seen, todo = set(), list(node.outputs)
    while todo:
        v = todo.pop()
        if v.id in seen:
            continue
        seen.add(v.id)
        todo.extend(o for u in v.users for o in u.outputs)
    return seen


def _liftable(v: Value, a, length: int, after: set[int]) -> str:
    """'' if this outside operand can enter the body (sliced along axis a, or whole if a is None), else why not."""
    if v.is_literal:
        return ""
    if v.id in after:
        return "it is computed from this scan's results"
    if _jax.is_ref_aval(v.aval):
        return "it is a mutable ref"
    if not effect_free(v):
        return "it is computed with effects (a ref read, callback or print must keep its place)"
    if a is not None and v.aval.ndim and v.aval.shape[a] not in (1, length):
        return "its size on the scan axis differs from the scan's length"
    return ""


MIXED = "it combines different steps of the scan (as ys[1:] - ys[:-1] does): no step has both"


def _plan(roots: dict[int, Value], after: set[int], length: int) -> Plan:
    plan = Plan()
    inside: dict[int, Value] = dict(roots)
    plan.axes = {i: 0 for i in roots}
    plan.steps = {i: Steps.full(length) for i in roots}
    origin: dict[int, set[int]] = {i: {i} for i in roots}
    taken: set[int] = set()
    waiting: dict[int, tuple[Node, str]] = {}
    changed = True
    while changed:
        changed = False
        for v in list(inside.values()):
            for n in v.users:
                if id(n) in taken:
                    continue
                known = {i: plan.axes[u.id] for i, u in enumerate(n.inputs) if u.id in inside}
                doms = {plan.steps[u.id] for u in n.inputs if u.id in inside}
                if len(doms) > 1:
                    waiting[id(n)] = (n, MIXED)
                    continue
                (dom,) = doms
                if n.name in REDUCTIONS and len(known) == 1 and known[0] in tuple(n.params["axes"]):
                    taken.add(id(n))
                    plan.terms.append(n)
                    changed = True
                    waiting.pop(id(n), None)
                    continue
                src = set().union(*(origin[u.id] for u in n.inputs if u.id in inside))
                try:
                    sel = selects(n, [known.get(i) for i in range(len(n.inputs))], dom, length)
                except NotSeparable as e:
                    waiting[id(n)] = (n, str(e))
                    continue
                if sel is not None:   # a slice along the scan axis: fewer steps (or one, picked)
                    kind, what, step = sel
                    taken.add(id(n))
                    waiting.pop(id(n), None)
                    changed = True
                    if kind == "pick":
                        plan.picks.append((n, what, step))
                        continue
                    plan.nodes.append(n)
                    plan.selects[id(n)] = step
                    o = n.outputs[0]
                    inside[o.id], plan.axes[o.id], plan.steps[o.id], origin[o.id] = o, known[0], what, src
                    continue
                try:
                    axes = operand_axes(n, known, dom.count)
                except NotSeparable as e:
                    waiting[id(n)] = (n, str(e))
                    continue
                why = next((f"operand {i} cannot enter the loop: {w}" for i, u in enumerate(n.inputs)
                            if i not in known and (w := _liftable(u, axes[i], dom.count, after))), "")
                if why or (why := why_not(n, axes, dom.count)):
                    waiting[id(n)] = (n, why)   # maybe later, once another operand is inside
                    continue
                oax = out_axes(n, axes, dom.count)
                taken.add(id(n))
                waiting.pop(id(n), None)
                plan.nodes.append(n)
                plan.operand_axes[id(n)] = axes
                for o, a in zip(n.outputs, oax):
                    inside[o.id] = o
                    plan.axes[o.id] = a
                    plan.steps[o.id] = dom
                    origin[o.id] = src
                changed = True
    for v in inside.values():
        uses = [u for u, _ in v.uses if u is OUT or (id(u) not in taken and not _dead(u, {}))]
        if not uses:
            continue
        if v.producer is not None and v.producer.name in REDUCTIONS and v.id not in roots:
            if plan.steps[v.id] == Steps.full(length):
                plan.exports.append(v)
                continue
            plan.bad |= origin[v.id]
            plan.blockers.append((v.producer, "a per-step value of a slice along the scan axis is used outside"))
            continue
        plan.bad |= origin[v.id]
        for u in uses:
            if u is OUT:
                plan.blockers.append((v.producer, "its stacked value is a result of the program"))
            else:
                plan.blockers.append((u, waiting.get(id(u), (u, "not step-by-step"))[1]))
    return plan


def _dead(n: Node, memo: dict) -> bool:
    """Is `n` effect-free with results nobody (transitively) reads? Such a consumer does not block:
    the dce after fusion removes it (an unused `x[0]` of a library NamedTuple left by inlining)."""
    if id(n) not in memo:
        memo[id(n)] = False   # (cycles cannot occur; this only guards re-entry)
        memo[id(n)] = not n.effects and not any(m.effects for g in n.subgraphs() for m, _ in g.walk()) and all(
            u is not OUT and _dead(u, memo) for o in n.outputs for u, _ in o.uses)
    return memo[id(n)]


def blockers(graph: Graph) -> list[tuple[Node, Node | None, str]]:
    """(scan, consumer, why) for each scan of `graph` (bodies included) whose ys did not all fuse."""
    found = []
    for n, _ in graph.walk():
        if n.name != "scan":
            continue
        k = n.params["num_carry"]
        roots = {o.id: o for o in n.outputs[k:] if o.uses}
        if roots:
            plan = _plan(roots, _downstream(n), n.params["length"])
            found.extend((n, b, why) for b, why in plan.blockers)
    return found


# ---- rewriting ---------------------------------------------------------------------

def fuse_scan(graph: Graph, scan: Node, defer: bool = False) -> bool:
    """Fuse what can be fused of this scan's ys consumers; True if the scan changed."""
    k = scan.params["num_carry"]
    after = _downstream(scan)
    roots = {o.id: o for o in scan.outputs[k:] if o.uses}
    while roots:
        plan = _plan(roots, after, scan.params["length"])
        if not plan.bad:
            break
        roots = {i: v for i, v in roots.items() if i not in plan.bad}
    if not roots or not (plan.terms or plan.exports or plan.picks):
        return False
    _rewrite(graph, scan, roots, plan, defer)
    return True


class _Lifter:
    """Brings outside operands into the body: whole (consts), sliced per step (xs), or re-broadcast."""

    def __init__(self, graph: Graph, loop: ScanLoop):
        self.graph, self.loop, self.body = graph, loop, loop.body
        self.consts = {v.id: b for v, b in zip(loop.consts, loop.body_consts) if not v.is_literal}
        self.xs = {(v.id, 0, None): b for v, b in zip(loop.xs, loop.body_xs) if not v.is_literal}

    def const(self, v: Value) -> Value:
        if v.is_literal:
            return Value(v.aval, literal=v.literal)
        if v.id not in self.consts:
            self.consts[v.id] = self.loop.add_consts([v])[0]
        return self.consts[v.id]

    def lift(self, v: Value, a, steps: Steps | None = None) -> Value:
        """The per-step value of outside operand `v` (sliced along axis a; whole if a is None).
        `steps`: the scan steps that v's entries along a stand for (None: all, in order)."""
        if v.is_literal or a is None or v.aval.ndim == 0:
            return self.const(v)
        s = v.aval.shape
        b = v.producer
        if b is not None and b.name == "broadcast_in_dim" and len(b.inputs) == 1 and effect_free(v):
            dims = tuple(b.params["broadcast_dimensions"])
            base = b.inputs[0]
            base = self.lift(base, dims.index(a), steps) if a in dims else self.const(base)
            rest = tuple(d for i, d in enumerate(dims) if d != a)
            new = self.body.add("broadcast_in_dim", [base], {
                **b.params, "shape": tuple(x for i, x in enumerate(b.params["shape"]) if i != a),
                "broadcast_dimensions": tuple(d - (d > a) for d in rest)}, source_info=b.source_info)
            new.ctx = b.ctx
            return new.outputs[0]
        if s[a] == 1:
            return drop_invariant_axis(self.body, v, self.const(v), a, self.loop.length)
        if steps is not None and steps == Steps.full(self.loop.length):
            steps = None
        if (v.id, a, steps) not in self.xs:
            outer = v if steps is None else self._spread(v, a, steps)
            if a != 0:   # the scan slices axis 0: move the scan axis there, outside
                perm = (a, *(i for i in range(v.aval.ndim) if i != a))
                scan = self.loop.node
                outer = self.graph.add("transpose", [outer], {"permutation": perm}, source_info=scan.source_info,
                                       ctx=scan.ctx).outputs[0]
            self.xs[(v.id, a, steps)] = self.loop.add_xs([outer])[0]
        return self.xs[(v.id, a, steps)]

    def _spread(self, v: Value, a: int, steps: Steps) -> Value:
        """`v`, whose entries along a are the selected steps, spread over all steps (`t[k:]` -> `t`, else
        padded with zeros at unselected steps, which the step predicate never lets count)."""
        n, length = steps.count, self.loop.length
        b = v.producer
        if b is not None and b.name == "slice" and steps.stride > 0 and effect_free(v):   # t[k:] of a t we have
            src = b.inputs[0]
            lo, hi = tuple(b.params["start_indices"]), tuple(b.params["limit_indices"])
            st = tuple(b.params["strides"] or (1,) * len(lo))
            whole = all((lo[d], hi[d], st[d]) == (0, src.aval.shape[d], 1) for d in range(len(lo)) if d != a)
            if whole and src.aval.shape[a] == length and (lo[a], st[a]) == (steps.start, steps.stride):
                return src
        if steps.stride < 0:
            v = self.graph.add("rev", [v], {"dimensions": (a,)}).outputs[0]
        last = steps.first + (n - 1) * abs(steps.stride)
        cfg = [(0, 0, 0)] * v.aval.ndim
        cfg[a] = (steps.first, length - 1 - last, abs(steps.stride) - 1)
        zero = Graph.literal(0, v.aval.dtype, weak_type=v.aval.weak_type)
        return self.graph.add("pad", [v, zero], {"padding_config": tuple(cfg)}).outputs[0]


def _vary(graph: Graph, init: Value, like, t: Node) -> Value:
    """`init` with the device-varying type of `like`, so that the accumulator's carry type checks."""
    missing = varying(like) - varying(init.aval)
    if not missing:
        return init
    aval = like_varying(init.aval, like)   # pvary's abstract evaluation needs shard_map's axis env
    n = graph.append(Node(_jax.primitive("pvary"), [init], [aval], {"axes": tuple(sorted(missing))},
                          source_info=t.source_info, ctx=t.ctx))
    return n.outputs[0]


def _rewrite(graph: Graph, scan: Node, roots: dict[int, Value], plan: Plan, defer: bool) -> None:
    loop = ScanLoop(scan)
    body = loop.body
    lift = _Lifter(graph, loop)
    k = loop.num_carry
    full = Steps.full(loop.length)
    preds: dict[Steps, Value] = {}

    def pred(steps: Steps) -> Value | None:
        """`this step is one of steps` in the body (None: every step is)."""
        if steps.is_all(loop.length):
            return None
        if steps not in preds:
            preds[steps] = predicate(body, loop.position(), steps)
        return preds[steps]

    masked: dict[tuple, Value] = {}

    def mask(w: Value, steps: Steps) -> Value:
        """w at selected steps; at the others a value that no gradient flows into (stop_gradient), so
        that what a consumer of `ys[k:]` computes at steps outside k: (log of 0, NaN targets) cannot
        reach a derivative: the classic double `where`. Values are unchanged."""
        p = pred(steps)
        if p is None or w.is_literal:
            return w
        if (w.id, steps) not in masked:
            sg = body.add("stop_gradient", [w]).outputs[0]
            masked[(w.id, steps)] = body.add("select_n", [p, sg, w]).outputs[0]
        return masked[(w.id, steps)]

    env = {o.id: bo for o, bo in zip(scan.outputs[k:], body.outputs[k:]) if o.id in roots}
    chain: set[int] = set()   # ids of values computed by moved consumers of a selection (already masked)
    for n in plan.nodes:
        steps = plan.steps[n.outputs[0].id]
        if id(n) in plan.selects:   # a slice along the scan axis: per step, the value itself
            w, step = env[n.inputs[0].id], plan.selects[id(n)]
            if step is not None:
                w = _add(body, step[0], [w], n, **step[1])
            env[n.outputs[0].id] = w
            continue
        axes = plan.operand_axes[id(n)]
        ins = []
        for v, a in zip(n.inputs, axes):
            w = env[v.id] if v.id in env else lift.lift(v, a, steps)
            ins.append(w if v.id in chain else mask(w, steps))
        outs, _ = emit_step(body, n, ins, axes, steps.count)
        env.update({o.id: w for o, w in zip(n.outputs, outs)})
        if steps != full:
            chain.update(o.id for o in n.outputs)

    for t in plan.terms:
        out = t.outputs[0]
        a = plan.axes[t.inputs[0].id]
        step = env[t.inputs[0].id]
        p = pred(plan.steps[t.inputs[0].id])
        other = tuple(x - (x > a) for x in t.params["axes"] if x != a)   # per-step axes
        dtype = np.dtype(out.aval.dtype)
        wide = t.name in ("reduce_sum", "reduce_prod") and dtype in map(np.dtype, LOW_PRECISION)
        if wide:   # accumulate as XLA does: per-step partials and the carry in float32
            step = _add(body, "convert_element_type", [step], t, new_dtype=np.dtype(np.float32), weak_type=False,
                        sharding=None)
        deferred = defer and other and t.name in ("reduce_sum", "reduce_max", "reduce_min")
        if other and not deferred:
            step = _add(body, t.prim, [step], t, **{**t.params, "axes": other})
        acc_op, identity = REDUCTIONS[t.name]
        acc_dtype = step.aval.dtype
        lit = Graph.literal(identity(np.dtype(acc_dtype)), acc_dtype, weak_type=step.aval.weak_type)
        init = _add(graph, "broadcast_in_dim", [lit], t, shape=step.aval.shape, broadcast_dimensions=(),
                    sharding=None)
        init = _vary(graph, init, step.aval, t)
        compensate = (t.name == "reduce_sum" and jnp.issubdtype(acc_dtype, jnp.inexact)
                      and loop.length > COMPENSATE_AFTER and int(np.prod(step.aval.shape)) <= COMPENSATE_UP_TO)
        final = (_kahan_sum if compensate else _accumulate)(loop, init, step, acc_op, t, p)
        if deferred:
            final = _add(graph, t.prim, [final], t, **{**t.params, "axes": other})
        if wide:
            final = _add(graph, "convert_element_type", [final], t, new_dtype=dtype, weak_type=out.aval.weak_type,
                         sharding=None)
        graph.replace_uses(out, final)

    for n, at, step in plan.picks:   # ys[k]: a carry that takes the step's value at step k
        w = env[n.inputs[0].id]
        if step is not None:
            w = _add(body, step[0], [w], n, **step[1])
        lit = Graph.literal(0, w.aval.dtype, weak_type=w.aval.weak_type)
        init = _vary(graph, _add(graph, "broadcast_in_dim", [lit], n, shape=w.aval.shape, broadcast_dimensions=(),
                                 sharding=None), w.aval, n)
        carry = loop.add_carry(init)
        p = predicate(body, loop.position(), Steps(at, 1, 1))
        carry.set_next(_add(body, "select_n", [p, carry.inner, w], n))
        graph.replace_uses(n.outputs[0], carry.result)

    if plan.exports:
        stacked = loop.add_ys([env[v.id] for v in plan.exports])
        for v, s in zip(plan.exports, stacked):
            a = plan.axes[v.id]
            if a != 0:   # stacked on axis 0; the consumers want the scan axis at a
                perm = tuple(range(1, a + 1)) + (0,) + tuple(range(a + 1, v.aval.ndim))
                s = graph.add("transpose", [s], {"permutation": perm}, source_info=scan.source_info,
                              ctx=scan.ctx).outputs[0]
            graph.replace_uses(v, s)
    for n in plan.terms + [n for n, _, _ in plan.picks] + plan.nodes[::-1]:   # consumers first
        if not n.dead and all(not o.uses for o in n.outputs):
            graph.remove(n)
    shrink_unused(scan)   # the fused ys (now unused) and unread inputs leave the scan


def _accumulate(loop: ScanLoop, init: Value, step: Value, acc_op: str, t: Node, p: Value | None) -> Value:
    """acc = acc (op) step, carried, at the steps where `p` holds (all if None: ys[k:] selects some)."""
    carry = loop.add_carry(init)
    carry.set_next(_where(loop.body, p, carry.inner, _add(loop.body, acc_op, [carry.inner, step], t), t))
    return carry.result


def _where(body: Graph, p: Value | None, old: Value, new: Value, t: Node) -> Value:
    return new if p is None else _add(body, "select_n", [p, old, new], t)


def _kahan_sum(loop: ScanLoop, init: Value, step: Value, acc_op: str, t: Node, p: Value | None) -> Value:
    """A compensated (Kahan) running sum: a long chain of float adds loses ~length ulps, where XLA's own
    reduction of the stacked values adds in vector lanes and trees (fuzzing found 4096-step float32 sums
    1-3e-5 off XLA's). The second carry holds the low-order bits each add drops: error O(ulp), not
    O(length ulp), for 3 more elementwise ops per step. XLA does not reassociate float adds, so it stays."""
    body = loop.body
    acc, comp = loop.add_carry(init), loop.add_carry(init)
    y = _add(body, "sub", [step, comp.inner], t)
    total = _add(body, "add", [acc.inner, y], t)
    low = _add(body, "sub", [_add(body, "sub", [total, acc.inner], t), y], t)
    # IEEE semantics: once the sum is inf or NaN, (total - acc) - y is inf - inf = NaN, which would poison every
    # later step (a -inf log-likelihood term would give NaN). Where the sum is not finite there are no dropped
    # low-order bits to keep: the compensation is 0 and the running sum lands exactly where the plain one does.
    zero = Graph.literal(0, low.aval.dtype, weak_type=low.aval.weak_type)
    zero = _vary(body, _add(body, "broadcast_in_dim", [zero], t, shape=low.aval.shape, broadcast_dimensions=(),
                            sharding=None), low.aval, t)
    low = _add(body, "select_n", [_add(body, "is_finite", [total], t), zero, low], t)
    # The compensation is a rounding correction: its tangent is (acc' + y' - acc') - y' = 0. Without the tangent,
    # grad keeps no per-step residual for the select (the planner measured +7 KiB on a 200-step RNN loss).
    low = _add(body, "stop_gradient", [low], t)
    comp.set_next(_where(body, p, comp.inner, low, t))
    acc.set_next(_where(body, p, acc.inner, total, t))
    return acc.result


def _add(g: Graph, prim, ins, like: Node, **params) -> Value:
    """A node standing for (part of) user node `like`: its source line and context."""
    n = g.add(prim, ins, params, source_info=like.source_info)
    n.ctx = like.ctx
    keep_varying(n)
    return n.outputs[0]


__all__ = ["fuse_scan_reductions", "fuse_scan", "blockers", "REDUCTIONS", "ELEMENTWISE", "DEFER"]
