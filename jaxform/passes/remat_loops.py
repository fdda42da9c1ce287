"""Plan what loops remember under `grad`: carry-only remat and two-level √L checkpointing.

Reverse-mode AD of `scan` stores, for every step, the residuals its body's
transpose needs: for an RNN cell `tanh(h @ W + x @ U)` that is the pre- and
post-activation, `[length, batch, hidden]` each, while the carry alone is one
such buffer. This pass rewrites each scan (before AD sees it: it works for
`jax.grad(optimize(f))`) into one of three schedules:

    keep    unchanged: AD stores every residual of every step (L * R bytes).
    remat   the body runs under `jax.checkpoint(policy=nothing_saveable)`:
            per step only the body's inputs (the carry) are stored, and the
            backward pass recomputes the step first (L * C + R bytes,
            one extra forward of the body). Inputs that are loop constants or
            `xs` slices are read from where they are, never stacked again.
    sqrt    an outer scan over ceil(L / c) chunks of c ≈ √L steps whose body is a
            checkpointed inner scan of the remat'd step: the outer scan keeps a
            carry per chunk, the inner one a carry per step of one chunk
            (√L * C * 2 + R bytes, two extra forwards).

Which schedule each loop gets is the planner's decision (`plan.memory.loop_schedules`); this
module measures a loop (`plan`) and rewrites it. The cost model (R: residual bytes per step,
measured by asking JAX for the body's VJP residuals that are not loop constants or xs slices;
C: the same for the body under `jax.checkpoint`, i.e. the carries its recomputation reads — a
loss accumulator that is only added to is not one):

    memory="auto"  remat where R >= 2 C (the stored bytes at least halve) and the
                   recomputation is cheap: F <= 100 FLOPs per byte no longer
                   stored (F: the body's FLOPs per step). Below that the smaller
                   working set pays for the extra forward; above it the body is
                   compute-bound and remat costs time (docs/remat.md).
    memory="min"   sqrt for loops of length >= 16, remat below.
    memory=N bytes the cheapest schedule (keep < remat < sqrt) whose predicted
                   bytes fit N, summed over loops; if even √L does not fit,
                   binomial checkpointing (`revolve.py`) with as many stored
                   carries as the budget allows (float loops only).

Scans with effects (callbacks, refs) or whose operands carry shard_map's
varying-axes types are left unchanged. Nested scans are planned innermost
first. Numerics: recomputation binds the same primitives on the same values,
so forward values are bit-identical; gradients are bit-identical on CPU in the
tests, but XLA may fuse recomputed ops differently, so the pass is registered
as not exact.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import jax
import numpy as np
from jax import lax

from .. import _jax
from ..ir import Graph, Node, ScanLoop
from ..ir.identity import is_impure
from ..ir.separability import varying
from ..ir.sizes import nbytes
from ..ir.flops import graph_flops
from . import revolve
from .registry import register
from .decisions import decider

SCHEDULES = ("keep", "remat", "sqrt", "revolve")
TABLE_BYTES_PER_STEP = 16   # revolve's action table: about 4 int32 rows per step


@dataclass
class LoopPlan:
    """What one scan will remember under grad (also what `explain` reports)."""
    length: int
    residual_bytes: int     # R: per step, what AD stores without remat
    carry_bytes: int        # C: per step, what a remat'd step stores (the carries its recomputation reads)
    flops: int = 0          # F: per step, what recomputing the body costs
    schedule: str = "keep"
    slots: int = 0          # revolve: carries stored
    all_float: bool = False  # revolve needs inexact consts, carries, xs and ys

    def predicted_bytes(self, schedule: str | None = None) -> int:
        s, L, R, C = schedule or self.schedule, self.length, self.residual_bytes, self.carry_bytes
        if s == "keep":
            return L * R
        if s == "remat":
            return L * C + R
        if s == "sqrt":
            c = _chunk(L)
            return (math.ceil(L / c) + c) * C + R
        return 2 * max(self.slots, 1) * C + R + TABLE_BYTES_PER_STEP * L   # XLA double-buffers the slots

    def recompute(self, schedule: str | None = None) -> int:
        """Extra forward evaluations of the body per step in the backward pass (at most)."""
        s = schedule or self.schedule
        return revolve.repetitions(self.length, max(self.slots, 1)) + 1 if s == "revolve" else SCHEDULES.index(s)


def _chunk(length: int) -> int:
    """Steps per chunk: a divisor of `length` near √length (no copies of xs), else ⌈√length⌉."""
    root = math.sqrt(length)
    near = [d for d in range(max(1, int(root / 2)), int(2 * root) + 1) if length % d == 0]
    return min(near, key=lambda d: abs(d - root)) if near else max(1, math.ceil(root))


@register(exact=False, loops=True)
def remat_loops(graph: Graph, memory="auto", warn: bool = True) -> Graph:
    """Rewrite scans to remember less under grad (memory: "auto" | "min" | a byte budget).

    A byte budget (and "auto" where the gradient might not fit the device) is the planner's to meet
    (`plan.memory.fit_loops`: XLA measures, schedules tighten until it fits; "min": the least of its uniform
    schedules, measured); warn=False leaves an unmet
    budget's warning to the pass that owns the rest of it (`optimize`'s remat_program)."""
    if memory is None:
        return graph
    check_memory(memory)
    if memory == "auto":
        budget, _ = decider("auto_budget")(graph)       # a device limit the gradient might not fit
        memory = "auto" if budget is None else budget
    if memory != "auto" and any(n.name in ("scan", "while") for n, _ in graph.walk()):
        return decider("fit_loops")(graph, memory, schedule, warn)   # measured: never silent (issue 38)
    schedule(graph, memory)
    return graph


def schedule(graph: Graph, memory) -> list[LoopPlan]:
    """Give each loop of `graph` (in place) the schedule the planner picks for `memory`; their plans."""
    plans = plan(graph)
    decider("loop_schedules")(plans, memory)   # the decision is the planner's (plan.memory)
    for owner, node, p in plans:
        if p.schedule != "keep":
            _rewrite(owner, node, p)
    return [p for *_, p in plans]


def check_memory(memory, where: str = "jaxform") -> None:
    """Raise a ValueError that teaches unless `memory` is None, "auto", "min" or a finite byte count >= 0.

    `optimize` calls this eagerly: a bad setting found only when the pass runs would be skipped with
    a warning, and the program would run unplanned while the user believes planning is on.
    """
    if memory is None or memory in ("auto", "min") and isinstance(memory, str):
        return
    if isinstance(memory, str):
        hint = f" Did you mean {memory.strip().lower()!r}?" if memory.strip().lower() in ("auto", "min") else ""
        raise ValueError(f"{where}: memory={memory!r} is not a setting.{hint} Use None (store everything, as "
                         f"JAX does), 'auto', 'min', or a byte budget such as 2**30.")
    if isinstance(memory, bool) or not isinstance(memory, (int, float, np.integer, np.floating)):
        raise TypeError(f"{where}: memory must be None, 'auto', 'min' or a byte budget (a number), got "
                        f"{type(memory).__name__} {memory!r}")
    if not math.isfinite(memory) or memory < 0:
        raise ValueError(f"{where}: the memory budget must be a finite number of bytes >= 0, got {memory!r}")


def with_memory(memory, warn: bool = True):
    """`remat_loops` with a fixed `memory` setting, as a pass (what `optimize(memory=...)` appends)."""
    p = functools.partial(remat_loops, memory=memory, warn=warn)
    p.pass_name, p.exact = f"remat_loops(memory={memory!r})", False
    return p


# ---- planning --------------------------------------------------------------------------

def plan(graph: Graph) -> list[tuple[Graph, Node, LoopPlan]]:
    """Every scan that can be rescheduled (innermost first), the graph holding it, its measured costs."""
    out = []
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            out.extend(plan(sub))
        if node.name == "scan" and _reschedulable(node):
            loop = ScanLoop(node)
            out.append((graph, node, LoopPlan(loop.length, _residual_bytes(loop), _residual_bytes(loop, remat=True),
                                              graph_flops(loop.body), all_float=_all_float(loop))))
    return out


def _all_float(loop: ScanLoop) -> bool:
    inexact = lambda v: jax.numpy.issubdtype(v.aval.dtype, jax.numpy.inexact)  # noqa: E731 (typed keys: no)
    return all(map(inexact, loop.node.inputs + loop.node.outputs))


def _reschedulable(node: Node) -> bool:
    return not reschedulable_why(node)


def reschedulable_why(node: Node) -> str:
    """'' if remat_loops may reschedule this scan, else why not (what `explain` says)."""
    body = node.regions["body"]
    if is_impure(node):
        return ("it has effects or impure primitives (callbacks, refs, prints, rng_uniform): recomputing "
                "a step would repeat them or draw again")
    if any(varying(v.aval) for v in node.inputs + body.inputs):   # (re-tracing needs shard_map's axis env)
        return "its values vary across shard_map devices"
    if node.params["length"] <= 1:
        return "a single step"
    return ""


def _sds(aval):
    return _jax.spec_of(aval)


def _residual_bytes(loop: ScanLoop, remat: bool = False) -> int:
    """Per-step bytes AD would store for this body: its VJP residuals, less loop constants and xs slices.

    remat=True: of the body under `jax.checkpoint(policy=nothing_saveable)`, i.e. the inputs the
    recomputation needs (a carry used only linearly, such as a loss accumulator, is not one).
    """
    body = loop.body.to_jaxpr()
    nc, nk = loop.num_consts, loop.num_carry
    found = []

    def probe(*args):
        consts, rest = args[:nc], args[nc:]
        fn = lambda *r: _jax.eval_jaxpr(body, *consts, *r)  # noqa: E731
        floats = [i for i, a in enumerate(rest) if jax.numpy.issubdtype(a.dtype, jax.numpy.inexact)]
        if not floats:
            return 0

        def diff(*fl):
            full = list(rest)
            for i, v in zip(floats, fl):
                full[i] = v
            return fn(*full)
        if remat:
            diff = jax.checkpoint(diff, policy=jax.checkpoint_policies.nothing_saveable)
        _, vjp = jax.vjp(diff, *[rest[i] for i in floats])
        invariant = {id(c) for c in consts} | {id(x) for x in rest[nk:]}   # read in place, never stacked
        found.extend(_jax.get_aval(r) for r in jax.tree_util.tree_leaves(vjp) if id(r) not in invariant)
        return 0

    try:
        jax.eval_shape(probe, *[_sds(v.aval) for v in loop.body.inputs])
    except Exception:
        return 0   # cannot differentiate this body (integer-only, unusual primitives): keep it
    return int(sum(map(nbytes, found)))   # residuals are arrays: finite


# ---- rewriting -------------------------------------------------------------------------

def _rewrite(graph: Graph, node: Node, p: LoopPlan) -> None:
    """Replace the scan by the traced program of its new schedule, spliced in place."""
    loop = ScanLoop(node)
    body = loop.body.to_jaxpr()
    nc, nk, length = loop.num_consts, loop.num_carry, loop.length
    reverse, unroll = loop.reverse, node.params.get("unroll", 1)
    policy = jax.checkpoint_policies.nothing_saveable

    def scheduled(*ops):
        consts, carry, xs = ops[:nc], ops[nc:nc + nk], ops[nc + nk:]

        @functools.partial(jax.checkpoint, policy=policy, prevent_cse=False)
        def step(c, x):
            outs = _jax.eval_jaxpr(body, *consts, *c, *x)
            return list(outs[:nk]), list(outs[nk:])

        if p.schedule == "remat":
            c, ys = lax.scan(step, list(carry), list(xs), length=length, reverse=reverse, unroll=unroll)
            return [*c, *ys]
        if p.schedule == "revolve":
            def plain(k, c, x):
                outs = _jax.eval_jaxpr(body, *k, *c, *x)
                return list(outs[:nk]), list(outs[nk:])
            rx = [jax.numpy.flip(x, 0) for x in xs] if reverse else list(xs)
            c, ys = revolve.scan_revolve(plain, list(consts), list(carry), rx, length, p.slots)
            return [*c, *([jax.numpy.flip(y, 0) for y in ys] if reverse else ys)]
        return _two_level(step, list(carry), list(xs), length, reverse)

    closed = jax.make_jaxpr(scheduled)(*[_sds(v.aval) for v in node.inputs])
    _splice(graph, node, Graph.from_jaxpr(closed))


def _two_level(step, carry, xs, length, reverse):
    """scan(step) as an outer scan over chunks of c steps, each a checkpointed inner scan."""
    c = _chunk(length)
    n, r = divmod(length, c)   # n full chunks, then a tail of r steps

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def chunk(cr, xc):
        return lax.scan(step, cr, xc, length=c, reverse=reverse)

    def run_chunks(cr, xpart):
        xc = [x.reshape(n, c, *x.shape[1:]) for x in xpart]
        cr, ys = lax.scan(chunk, cr, xc, length=n, reverse=reverse)
        return cr, [y.reshape(n * c, *y.shape[2:]) for y in ys]

    def run_tail(cr, xpart):
        return lax.scan(step, cr, xpart, length=r, reverse=reverse)

    if r == 0:
        return _flat(run_chunks(carry, xs))
    head, tail = [x[:n * c] for x in xs], [x[n * c:] for x in xs]
    if not reverse:
        carry, ys_h = run_chunks(carry, head)
        carry, ys_t = run_tail(carry, tail)
        ys = [jax.numpy.concatenate([a, b]) for a, b in zip(ys_h, ys_t)]
    else:                      # a reverse scan meets the tail first
        carry, ys_t = run_tail(carry, tail)
        carry, ys_h = run_chunks(carry, head)
        ys = [jax.numpy.concatenate([a, b]) for a, b in zip(ys_h, ys_t)]
    return [*carry, *ys]


def _flat(carry_ys):
    return [*carry_ys[0], *carry_ys[1]]


def _splice(graph: Graph, node: Node, sub: Graph) -> None:
    """Put `sub`'s nodes where `node` was: its inputs are node's operands, its outputs node's results."""
    for c in sub.consts:
        graph.consts.append(c)
    for inner, outer in zip(sub.inputs, node.inputs):
        sub.replace_uses(inner, outer)
    outs = list(sub.outputs)
    sub.set_outputs([])
    for old, new in zip(node.outputs, outs):
        graph.replace_uses(old, new)
    here = os.path.dirname(os.path.abspath(__file__))
    for n, _ in sub.walk():   # the new loop structure stands where the user wrote the scan, in its context
        loc = n.location()   # '': made by JAX for the pass (jax.checkpoint's remat2), no user frame
        if not loc or loc.startswith(here):
            n.source_info, n.ctx = node.source_info, node.ctx
    at = graph._nodes.index(node)
    for i, v in enumerate(node.inputs):
        v.uses.remove((node, i))
    node.dead = True
    graph._nodes[at:at + 1] = sub.nodes
    graph._dirty = True
