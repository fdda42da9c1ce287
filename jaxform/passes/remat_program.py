"""Plan what a straight-line program (no loops) remembers under `grad`: segment checkpointing.

`jax.grad` of a program without loops stores every forward value its backward
pass reads: for an MLP or a transformer, every layer's activations. Under a byte
budget (`optimize(fn, memory=N)`) or `memory="min"`, this pass cuts the program's
equations into k contiguous segments at narrow points (where the bytes alive
across the cut are least: a layer's output, not its hidden activations) and wraps
them in `jax.checkpoint`:

    all, k      every segment under `nothing_saveable`: AD stores the values crossing
                the k - 1 cuts, and the backward pass recomputes one segment at a time
    nothing, k  the same with the last segment left plain (its backward runs right
                after it: recomputing it buys little)
    dots        the whole program under `checkpoint_dots` (`dots_saveable`): matmul and
                convolution results are stored, the work between them recomputed

Which candidate, if any, is the planner's decision (`plan.memory.choose`: each
candidate's gradient compiled and measured by XLA, the fastest that fits a budget,
the least for `"min"`; `"auto"` only where the gradient might not fit the device).
A program that is itself a gradient gets `passes.recompute`'s schedules instead.
Under a byte budget, a program with loops comes here after `remat_loops` gave its loops
schedules: what they left over is this pass's (segments around and across the loops: one owner of
the budget, issue 38), and under "min" too (a length-1 scan before MLP layers: "min" left 8704 B, plain's,
where a 90% budget's segments reached 6656 B; round 15's D). Programs with effects (callbacks,
RNG state, refs) are left alone (recomputing would repeat them). Forward cost is
unchanged: `jax.checkpoint` only changes what differentiation stores.
"""
from __future__ import annotations

import functools
import warnings

import jax
import numpy as np

from .. import _jax
from ..ir import Graph
from ..ir.identity import is_impure
from ..ir.sizes import value_bytes
from .decisions import decider
from .recompute import recomputed
from .registry import register
from .segments import MATMULS, MIN_EQNS_PER_SEGMENT, boundaries, cuts  # noqa: F401 (re-exported)

POLICIES = {"nothing": jax.checkpoint_policies.nothing_saveable, "all": jax.checkpoint_policies.nothing_saveable,
            "dots": jax.checkpoint_policies.dots_saveable}


@register(exact=False)
def remat_program(graph: Graph, memory=None, schedule: tuple | None = None) -> Graph:
    """Checkpoint segments of a loop-free program to fit `memory` ("min" or bytes) under grad.

    schedule=(policy, k) forces one candidate without measuring (the fuzzer's way to reach every one);
    policy "recompute": `passes.recompute` (for a program that is itself a gradient).
    """
    if memory is None and schedule is None:
        return graph
    asked = None
    if memory == "auto" and schedule is None:
        memory, asked = decider("auto_budget")(graph)
        if memory is None:
            return graph
    loops = any(n.name in ("scan", "while") for n, _ in graph.walk())
    if loops and schedule is not None:
        return graph
    if loops and decider("budget_is_own")(graph.to_jaxpr()):    # (a gradient run as it is: the planner knows the use)
        decider("loop_budget_check")(graph, memory, None)   # its loops' residuals are values now: said, not fitted
        return graph
    if not _eligible(graph):
        if loops and memory != "min":   # a budget remat_loops left over (it does not warn in `optimize`): said here
            decider("loop_budget_check")(graph, memory, None)
        return graph
    closed = graph.to_jaxpr()
    if schedule is not None:
        policy, k = schedule
        if policy == "recompute":        # a gradient program's residuals recomputed in its backward
            out = recomputed(closed, k) if k > 1 else None
            return graph if out is None else Graph.from_jaxpr(out)
        return Graph.from_jaxpr(checkpointed(closed, boundaries(closed.jaxpr, k) if k > 1 else [], policy))
    with warnings.catch_warnings():
        if loops and memory == "min":    # segments beside the loops remat_loops scheduled: nothing to warn of
            warnings.simplefilter("ignore")    # where they do not help (the loops' schedules did, or said so)
        choice = decider("choose")(closed, memory, asked)   # whether recomputation pays: plan.memory
    if choice is None:
        return graph
    return Graph.from_jaxpr(choice[1])


def with_memory(memory, schedule: tuple | None = None):
    """`remat_program` with fixed options, as a pass (what `optimize(memory=...)` appends)."""
    p = functools.partial(remat_program, memory=memory, schedule=schedule)
    p.pass_name, p.exact = f"remat_program(memory={memory!r}" + (f", schedule={schedule!r})" if schedule else ")"), False
    return p


def _eligible(graph: Graph) -> bool:
    # loops (under a byte budget, what their schedules from remat_loops left over) are equations like others:
    # a segment holding one is recomputed whole in the backward pass, its own schedule inside
    if any(is_impure(n) for n, _ in graph.walk()):
        return False
    return len(graph.nodes) >= 2 * MIN_EQNS_PER_SEGMENT


# ---- candidates ------------------------------------------------------------------------

def checkpointed(closed, bounds: list[int], policy: str):
    """`closed` with its equations cut at `bounds`; segments under `jax.checkpoint(policy)`: "dots"
    (`dots_saveable`), "all" (`nothing_saveable`) or "nothing" (the same, but the last segment is left
    plain: its backward runs right after it, so recomputing it buys little)."""
    jaxpr = closed.jaxpr
    eqns, n = jaxpr.eqns, len(jaxpr.eqns)
    edges = [0, *bounds, n]
    used_after = {v for v in jaxpr.outvars if not _jax.is_literal(v)}
    dbg = jaxpr.debug_info      # the program's (names dropped: they do not fit a segment): no DebugInfo warning
    dbg = dbg._replace(arg_names=None, result_paths=None) if hasattr(dbg, "_replace") else None
    segs = []
    for a, b in reversed(list(zip(edges, edges[1:]))):
        defined = {v for e in eqns[a:b] for v in e.outvars}
        outs = [v for e in eqns[a:b] for v in e.outvars if v in used_after]
        free: dict = {}
        for e in eqns[a:b]:
            for v in e.invars:
                if not _jax.is_literal(v) and v not in defined:
                    free.setdefault(v, None)
        ins = list(free)
        sub = _jax.closed_jaxpr([], ins, outs, eqns[a:b], _jax.jaxpr_effects([], ins, outs, eqns[a:b]), dbg, [])
        segs.append(sub)
        used_after |= set(ins)
    segs.reverse()
    consts = dict(zip(jaxpr.constvars, closed.consts))
    pol = POLICIES[policy]

    def program(*args):
        env = dict(consts)
        env.update(zip(jaxpr.invars, args))
        for i, sub in enumerate(segs):
            fn = functools.partial(_jax.eval_jaxpr, sub)
            if policy != "nothing" or i < len(segs) - 1:
                fn = jax.checkpoint(fn, policy=pol)
            env.update(zip(sub.jaxpr.outvars, fn(*[env[v] for v in sub.jaxpr.invars])))
        return [v.val if _jax.is_literal(v) else env[v] for v in jaxpr.outvars]

    return jax.make_jaxpr(program)(*[_jax.spec_of(a) for a in closed.in_avals])


def schedules(closed, cheapest_first: bool = False) -> list[tuple[str, str, tuple]]:
    """(name, policy, cut points) of each distinct candidate, untraced: the likeliest to save first, or with
    cheapest_first the one recomputing least first by a fixed rule (matmul results kept; then all but the
    last of 2, 4, 8, 16 segments: half, 3/4, ... of the forward; then all of it). The planner orders them by
    what each recomputes (`recomputed_eqns`): the rule is wrong where the work is neither matmuls nor convolutions."""
    n = len(closed.jaxpr.eqns)
    order = [("dots", 1), ("nothing", 2), ("nothing", 4), ("nothing", 8), ("nothing", 16), ("all", 4), ("all", 8)] \
        if cheapest_first else \
        [("all", 4), ("nothing", 4), ("dots", 1), ("nothing", 2), ("all", 8), ("nothing", 8), ("nothing", 16)]
    out, seen = [], set()
    for policy, k in order:
        if k > 1 and n < k * MIN_EQNS_PER_SEGMENT:
            continue
        b = tuple(boundaries(closed.jaxpr, k)) if k > 1 else ()
        if (k > 1 and not b) or (policy, b) in seen:
            continue
        seen.add((policy, b))
        out.append(("checkpoint_dots" if policy == "dots" else f"{policy}, {len(b) + 1} segments", policy, b))
    return out


def recomputed_eqns(closed, policy: str, bounds: tuple) -> list[int]:
    """The indices of `closed`'s equations a schedule's backward pass computes again: all but the matmuls and
    convolutions (`dots_saveable` keeps both), every segment's but the last ("nothing"), or all of them
    ("all"). An upper bound: JAX drops what the backward does not read, and "dots" also keeps the matmuls
    inside a loop or branch, which count here with the rest of their equation."""
    eqns = closed.jaxpr.eqns
    if policy == "dots":
        return [i for i, e in enumerate(eqns) if e.primitive.name not in MATMULS]
    return list(range(bounds[-1] if policy == "nothing" and bounds else len(eqns)))


def candidates(closed, cheapest_first: bool = False, order: list | None = None):
    """(name, program) for each schedule worth measuring (`schedules`, or `order`: some of them in the
    planner's order), a generator: each is traced only when asked for."""
    for name, policy, b in schedules(closed, cheapest_first) if order is None else order:
        yield name, checkpointed(closed, list(b), policy)


__all__ = ["remat_program", "with_memory", "candidates", "schedules", "recomputed_eqns", "checkpointed", "boundaries",
           "cuts"]
