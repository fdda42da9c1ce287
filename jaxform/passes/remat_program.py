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
    dots        the whole program under `checkpoint_dots` (`dots_saveable`): matmul
                results are stored, the elementwise work between them recomputed

Each candidate's gradient program (the one `jax.grad` would run) is compiled and its
memory read from XLA's `memory_analysis()`; its time is the planner's cost model's
(`plan.cost`, roofline seconds, recomputation included). `"min"` takes the least
memory; a budget the fastest candidate that fits, else (with a warning) the least memory
if it saves at least 25%, else nothing (recomputing for a few percent only costs time). (The cost
model's liveness estimate ranked checkpointed gradients wrongly, off by up to 2x on
an MLP, so memory is measured: a few compiles, paid only when a budget is given.)

`memory="auto"` (the default) plans a straight-line program only where its gradient
might not fit the device (`plan.cost.device_memory()`: the allocator's limit, the
host's RAM on CPU): the budget is then AUTO_SHARE of it, less the arguments and their
gradients. Elsewhere it leaves the program alone: in a loop the smaller working set
can pay for the recomputation, in straight-line code it only costs time, and the
gate (bytes the program makes, no compile) costs an optimized program nothing.
Programs with loops are left to `remat_loops`; programs with effects (callbacks,
RNG state, refs) are left alone (recomputing would repeat them). Forward cost is
unchanged: `jax.checkpoint` only changes what differentiation stores.
"""
from __future__ import annotations

import functools
import math
import os
import warnings

import jax
import numpy as np

from .. import _jax
from ..ir import Graph
from ..ir.identity import is_impure
from ..ir.sizes import nbytes
from ..plan.cost import device_memory
from . import register

MIN_SAVING = 0.25           # under a budget that cannot be met, the best candidate must save this much
GIVE_UP_AFTER = 3           # candidates compiled before giving up on a program where none saves MIN_SAVING / 2
MIN_EQNS_PER_SEGMENT = 4
AUTO_SHARE = 0.75           # memory="auto": a straight-line gradient is fitted into this share of the device
AUTO_GATE = 4               # ... checked by XLA only where AUTO_GATE x the bytes the program makes exceed it
MATMULS = frozenset({"dot_general", "conv_general_dilated"})
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
        memory = auto_budget(graph)
        if memory is None:
            return graph
        asked = f"memory='auto' ({AUTO_SHARE:.0%} of the device's {_mib(device_memory())}, less the arguments)"
    if not _eligible(graph):
        return graph
    closed = graph.to_jaxpr()
    if schedule is not None:
        policy, k = schedule
        if policy == "recompute":        # a gradient program's residuals recomputed in its backward
            from .recompute import recomputed
            out = recomputed(closed, k) if k > 1 else None
            return graph if out is None else Graph.from_jaxpr(out)
        return Graph.from_jaxpr(checkpointed(closed, boundaries(closed.jaxpr, k) if k > 1 else [], policy))
    choice = choose(closed, memory, asked)
    if choice is None:
        return graph
    return Graph.from_jaxpr(choice[1])


def auto_budget(graph: Graph) -> int | None:
    """memory="auto" on a straight-line program: the byte budget the device sets where the gradient
    might not fit it, else None (left alone: recomputing in straight-line code only costs time)."""
    cap = device_memory()
    if cap is None:
        return None
    budget = int(AUTO_SHARE * cap - 2 * sum(_var_bytes(v) for v in graph.inputs))   # arguments and gradients
    made = sum(_var_bytes(o) for n in graph.nodes for o in n.outputs)
    return budget if budget > 0 and AUTO_GATE * made >= budget else None


def _user_stacklevel() -> int:
    from ..optimize import _user_stacklevel as level     # the user's line, not this pass's
    return level() - 1


def _advice() -> str:
    """What to try when a budget is not met. XLA:CPU before JAX 0.12 (its concurrency-optimized
    scheduler) reuses none of the memory recomputation frees: a transformer's gradient stayed at 76.8 MiB
    under any checkpointing, 37 MiB with `jax.checkpoint` per block once the flag below was off."""
    if jax.default_backend() == "cpu" and _jax.JAX_VERSION < (0, 12) and \
            "concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
        return (" XLA:CPU before JAX 0.12 frees nothing by recomputation unless its memory scheduler is on: "
                "XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false (set before JAX starts; "
                "docs/remat.md), or a newer JAX.")
    return " A smaller batch, or jax.checkpoint by hand at finer points (docs/remat.md)."


def _mib(n) -> str:
    return f"{n / 2 ** 20:.2f} MiB"


def with_memory(memory, schedule: tuple | None = None):
    """`remat_program` with fixed options, as a pass (what `optimize(memory=...)` appends)."""
    p = functools.partial(remat_program, memory=memory, schedule=schedule)
    p.pass_name, p.exact = f"remat_program(memory={memory!r}" + (f", schedule={schedule!r})" if schedule else ")"), False
    return p


def _eligible(graph: Graph) -> bool:
    if any(n.name in ("scan", "while") for n, _ in graph.walk()):
        return False           # loops: remat_loops plans them
    if any(is_impure(n) for n in graph.nodes):
        return False
    return len(graph.nodes) >= 2 * MIN_EQNS_PER_SEGMENT


# ---- candidates ------------------------------------------------------------------------

def _var_bytes(v) -> float:
    b = nbytes(v.aval)
    return 0.0 if math.isinf(b) else float(b)


def cuts(jaxpr) -> tuple[list[float], list[float]]:
    """Per equation index i: bytes alive across a cut before equation i (made earlier, read at or
    after i), and bytes made by equations before i (a proxy for what AD stores up to there)."""
    eqns = jaxpr.eqns
    made_at, last = {}, {}
    for i, e in enumerate(eqns):
        for v in e.invars:
            if not _jax.is_literal(v):
                last[v] = i
        for v in e.outvars:
            made_at[v] = i
    for v in jaxpr.outvars:
        if not _jax.is_literal(v):
            last[v] = len(eqns)
    delta = [0.0] * (len(eqns) + 2)
    for v, i in made_at.items():
        if v in last and not _jax.is_dropvar(v):
            delta[i + 1] += _var_bytes(v)
            delta[last[v] + 1] -= _var_bytes(v)
    across, made, live, total = [], [], 0.0, 0.0
    for i in range(len(eqns) + 1):
        live += delta[i]
        across.append(live)
        made.append(total)
        if i < len(eqns):
            total += sum(_var_bytes(v) for v in eqns[i].outvars if not _jax.is_dropvar(v))
    return across, made


def boundaries(jaxpr, k: int) -> list[int]:
    """k - 1 cut points: near equal shares of the bytes made, each at the narrowest cut nearby."""
    across, made = cuts(jaxpr)
    n = len(jaxpr.eqns)
    total = made[-1] or 1.0
    window = max(1, n // (4 * k))
    out: list[int] = []
    for j in range(1, k):
        target = next((i for i in range(n + 1) if made[i] >= total * j / k), n)
        lo, hi = max(out[-1] + MIN_EQNS_PER_SEGMENT if out else MIN_EQNS_PER_SEGMENT, target - window), \
            min(n - MIN_EQNS_PER_SEGMENT, target + window)
        if lo > hi:
            continue
        # ties: cut just before a matmul (its input is stored for the weight gradient anyway; measured on
        # an MLP, a cut after the matmul instead kept 5.5 of 5.5 MiB, before it 4.5)
        out.append(min(range(lo, hi + 1), key=lambda i: (across[i], i >= n or jaxpr.eqns[i].primitive.name
                                                         not in MATMULS, abs(i - target))))
    return out


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


def candidates(closed):
    """(name, program) for each schedule worth measuring, the likeliest first (a generator: each is
    traced only when asked for)."""
    n = len(closed.jaxpr.eqns)
    order = [("all", 4), ("nothing", 4), ("dots", 1), ("nothing", 2), ("all", 8), ("nothing", 8), ("nothing", 16)]
    seen = set()
    for policy, k in order:
        if k > 1 and n < k * MIN_EQNS_PER_SEGMENT:
            continue
        b = tuple(boundaries(closed.jaxpr, k)) if k > 1 else ()
        if (k > 1 and not b) or (policy, b) in seen:
            continue
        seen.add((policy, b))
        name = "checkpoint_dots" if policy == "dots" else f"{policy}, {len(b) + 1} segments"
        yield name, checkpointed(closed, list(b), policy)


def xla_grad_temp(closed) -> int | None:
    """XLA's temp bytes for the gradient program of `closed` (compiled here), or None."""
    from ..plan.cost import gradient_program
    gp = gradient_program(closed)
    return None if gp is None else xla_temp(gp)


def choose(closed, memory, asked: str | None = None):
    """(name, program, XLA grad temp bytes, predicted grad seconds) for `memory`, or None to leave
    the program as it is. Memory is XLA's (each candidate's gradient program compiled): the liveness
    model is off by up to 2x on checkpointed gradients (docs/remat.md), time is the model's. A budget
    is met by the gradient with respect to every float input and, where `optimize` knows it, by
    `jax.grad`'s default, the first argument's (XLA gives the two different temp: 8 KiB on an MLP)."""
    from ..plan import cost
    asked = asked or (f"memory={memory!r}" if isinstance(memory, str) else
                      f"memory={memory} bytes ({_mib(memory)})")
    own, stop = _recompute_choice(closed, memory, asked)
    if own is not None or stop:
        return own
    plain = xla_grad_temp(closed)
    if plain is None:
        return None
    budget = not isinstance(memory, str)
    if budget and plain <= memory and (first_argument_grad_temp(closed) or 0) <= memory:
        return None
    scored, tried = [], 0
    for name, prog in candidates(closed):
        m = xla_grad_temp(prog)
        tried += 1
        if m is not None and m < plain:
            scored.append((name, prog, m, cost.estimate(prog, grad=True).grad_seconds or 0.0))
        if tried == GIVE_UP_AFTER and all(s[2] > (1 - MIN_SAVING / 2) * plain for s in scored):
            break   # XLA reuses nothing from recomputation here (docs/remat.md): stop compiling
    if not scored:
        if budget:
            _cannot_fit(asked, plain, "no segment checkpointing saves memory here (XLA measured each); left "
                                      "as it is.")
        return None
    least = min(scored, key=lambda s: (s[2], s[3]))
    if memory == "min":
        return least
    for s in sorted((s for s in scored if s[2] <= memory), key=lambda s: (s[3], s[2])):
        if (first_argument_grad_temp(s[1]) or 0) <= memory:
            return s                     # the fastest that fits both gradients
    useful = least[2] <= (1 - MIN_SAVING) * plain
    _cannot_fit(asked, plain, f"the least any segment checkpointing reaches is {_mib(least[2])} ({least[0]}); " +
                ("using that." if useful else
                 f"left as it is (saving under {MIN_SAVING:.0%} is not worth the recomputation)."))
    return least if useful else None


def first_argument_grad_temp(closed) -> int | None:
    """XLA temp of the gradient `jax.grad(f)` takes by default (the first argument's floats), where
    `optimize` told the planner which inputs those are and they are not all of them; else None."""
    from ..plan import cost
    wrt = cost.first_argument()
    floats = [i for i in wrt if np.issubdtype(closed.in_avals[i].dtype, np.inexact)] if wrt else []
    if not floats or len(floats) == sum(np.issubdtype(a.dtype, np.inexact) for a in closed.in_avals):
        return None
    gp = cost.gradient_program(closed, wrt=floats)
    return None if gp is None else xla_temp(gp)


def _cannot_fit(asked: str, plain: int, what: str) -> None:
    warnings.warn(f"jaxform: remat_program cannot fit this program's gradient in {asked}: plain {_mib(plain)}, "
                  + what + _advice(), stacklevel=_user_stacklevel())


def xla_temp(closed) -> int:
    from ..plan.cost import xla_temp
    return xla_temp(closed)


def _recompute_choice(closed, memory, asked: str):
    """For a program that is itself a gradient (`optimize(jax.grad(f), memory=...)`): its residuals
    recomputed in its backward (`passes.recompute`), k segments, judged on the program's own XLA temp.
    Returns (choice or None, stop): a gradient program's own temp is what a budget is about, so its
    gradient's candidates (the other order's) are not measured after it."""
    from ..plan import cost
    from .recompute import is_gradient, recomputed
    if not is_gradient(closed):
        return None, False
    plain = xla_temp(closed)
    if plain == 0 or (not isinstance(memory, str) and plain <= memory):
        return None, True
    progs = [(k, p) for k in (4, 2, 8, 16) if (p := recomputed(closed, k)) is not None]
    scored = [(f"recompute, {k} segments", p, xla_temp(p), cost.estimate(p, grad=False).seconds) for k, p in progs]
    saving = [s for s in scored if s[2] <= (1 - MIN_SAVING / 2) * plain]
    least = min(saving, key=lambda s: (s[2], s[3])) if saving else None
    fits = [s for s in saving if memory == "min" or s[2] <= memory]
    if fits:
        return (least if memory == "min" else min(fits, key=lambda s: (s[3], s[2]))), True
    if memory != "min":
        reached = min((s[2] for s in scored), default=plain)
        warnings.warn(
            f"jaxform: remat_program cannot fit this gradient program in {asked}: plain {_mib(plain)}, "
            f"the least recomputation in its backward "
            f"reaches is {reached / 2 ** 20:.2f} MiB; " + ("using that." if least else "left as it is.") +
            _advice(), stacklevel=_user_stacklevel())
    return least, True


__all__ = ["remat_program", "with_memory", "choose", "candidates", "checkpointed", "boundaries"]
