"""The planner's memory decisions: which schedule each loop gets (`loop_schedules`, for
`passes.remat_loops`) and, for straight-line programs, which recomputation schedule, if any.

Loops, from `remat_loops.plan`'s measurements (R residual and C carry bytes per step, F FLOPs per step):
`"auto"` remats where R >= 2 C and F <= MAX_FLOPS_PER_SAVED_BYTE per byte no longer stored; `"min"`
takes √L checkpointing from SQRT_MIN_LENGTH steps (remat below); a byte budget upgrades the loops that
save the most (keep -> remat -> sqrt) until the predicted total fits, then binomial checkpointing.

Straight-line programs:

`passes.remat_program` and `passes.recompute` know *how* to make a program remember less under
`grad` (segment checkpointing; recomputation inside an already differentiated program); whether it
pays, and which candidate, is decided here, with XLA's own numbers:

* a byte budget: the fastest candidate (by the cost model's time) whose gradient XLA measures within
  it, for the gradient of every float input and for `jax.grad`'s default (the first argument's);
  else a warning, and the least-memory candidate if it saves MIN_SAVING, else the program as it is;
* `"min"`: the least memory;
* `"auto"` (the default): a budget only where the gradient might not fit the device
  (`cost.device_memory()`), AUTO_SHARE of it less the arguments and their gradients; the gate is the
  bytes the program makes (no compile), so a program that fits pays nothing.

Memory is measured, not predicted: the liveness model ranked checkpointed gradients wrongly (off by up
to 2x on an MLP, docs/remat.md), so each candidate's gradient is compiled, paid only under a budget.
"""
from __future__ import annotations

import math
import os
import warnings

import jax
import numpy as np

from .. import _jax
from ..passes import decisions as _decisions
from ..passes.pipeline import run_passes, user_stacklevel as pipeline_stacklevel
from ..ir import Graph
from ..passes.recompute import is_gradient, recomputed
from ..passes.remat_loops import TABLE_BYTES_PER_STEP
from ..passes.remat_program import candidates, recomputed_eqns, schedules
from . import cost, measure as _measure
from .use import aux_losses, batched_program, loss_and_aux, scalar_outputs

SQRT_MIN_LENGTH = 16
# "auto" remats a loop body only where recomputing it costs at most this many FLOPs per byte it stops
# storing. Measured on CPU (benchmarks/training_memory.py --sweep, docs/remat.md): at 37-81 FLOP/B
# remat took 0.81-1.04x the time of keeping everything (JAX 0.10.2 and 0.12.0.1), at 137-529 FLOP/B
# 1.13-1.31x: the body is then compute-bound. Untested on GPU, where the balance point is higher.
MAX_FLOPS_PER_SAVED_BYTE = 100
MIN_SAVING = 0.25           # under a budget that cannot be met, the best candidate must save this much
ORDERS_APART = 0.9          # the other order is named where it reaches this share of this one's memory or less
OTHER_ORDER_CLEANUPS = ("inline", "cse", "dce")   # what the other order runs over the gradient before budgeting it
GIVE_UP_AFTER = 3           # a budget's candidates compiled before giving up where none saves MIN_SAVING / 2
AUTO_SHARE = 0.75           # memory="auto": a straight-line gradient is fitted into this share of the device
AUTO_GATE = 4               # ... checked by XLA only where AUTO_GATE x the bytes the program makes exceed it


def loop_schedules(plans: list, memory) -> None:
    """Set each `remat_loops.LoopPlan`'s schedule (and revolve's slots) for `memory`: "auto", "min" or a
    byte budget (`plans`: `remat_loops.plan(graph)`, innermost loops first)."""
    loops = [p for *_, p in plans]
    for p in loops:
        if memory == "auto":
            cheap = p.flops <= MAX_FLOPS_PER_SAVED_BYTE * (p.residual_bytes - p.carry_bytes)
            p.schedule = "remat" if p.residual_bytes >= 2 * p.carry_bytes and cheap else "keep"
        elif memory == "min":
            p.schedule = "sqrt" if p.length >= SQRT_MIN_LENGTH else "remat"
        elif memory == EACH_STEP:
            p.schedule = "remat"
        else:
            p.schedule = "keep"
    if memory in ("auto", "min", EACH_STEP):
        return
    total = lambda: sum(p.predicted_bytes() for p in loops)  # noqa: E731
    # a budget: upgrade the loops that save the most bytes until the total fits
    for target in ("remat", "sqrt"):
        for p in sorted(loops, key=lambda p: p.predicted_bytes() - p.predicted_bytes(target), reverse=True):
            if total() <= memory:
                return
            if target != "sqrt" or p.length >= SQRT_MIN_LENGTH:
                p.schedule = target
    # still over: binomial checkpointing, sharing what is left of the budget by loop length
    over = [p for p in loops if p.schedule == "sqrt" and p.all_float]
    if not over or total() <= memory:
        return
    rest = memory - sum(p.predicted_bytes() for p in loops if p not in over)
    steps = sum(p.length for p in over)
    for p in over:
        share = max(rest, 0) * p.length / steps - p.residual_bytes - TABLE_BYTES_PER_STEP * p.length
        p.slots = int(max(1, min(share // max(2 * p.carry_bytes, 1), 2 * math.isqrt(p.length))))
        if p.predicted_bytes("revolve") < p.predicted_bytes("sqrt"):
            p.schedule = "revolve"


FIT_TRIES = 4       # gradients compiled to fit a byte budget on a program with loops, then, if it is unmet,
FALLBACKS = ("min", "each step")    # ... these uniform schedules ("min"'s, and remat of every step)
EACH_STEP = FALLBACKS[1]            # (no user setting: `check_memory` refuses it)


def fit_loops(graph: Graph, memory, schedule, warn: bool = True) -> Graph:
    """A byte budget (or "min") on a program with loops. The loops get the model's schedules for `memory`,
    then XLA measures the gradient the user will run (`budgeted_temp`) and an unmet budget is tried again with
    the loops' share cut by the bytes XLA found over: the model sees only what the loops store across steps,
    not each step's backward or the work around the loops (an LSTM LM at 50% measured 9.4 MiB against
    7.5 MiB, where 25% fitted at 1.9 MiB). At most FIT_TRIES compiles, then, unmet, the FALLBACKS' (the least
    measured is kept); never bigger than the program as it came; an unmet budget is said (`warn`), never
    silent (issue 38). "min" measures the FALLBACKS alone and keeps the least: √L checkpointing stores more
    than remat of every step on short loops (rnn_mse, 16 steps: 12676 B against 11396 B, round 15's D)."""
    least = memory == "min"
    closed = graph.to_jaxpr()
    if budget_is_own(closed):          # its loops' residuals are ordinary values now: one try, then say so
        plans = schedule(graph, memory)
        if warn and not least:         # ("min": remat_program says it, once)
            loop_budget_check(graph, memory, plans)
        return graph
    try:
        plain, plain_which = budgeted_temp(closed, over=None if least else memory)
    except Exception:   # noqa: BLE001 - a proposal that does not compile alone (the planner's per-loop views)
        plain = None
    if plain is None:          # nothing XLA can differentiate here: the model's schedules
        schedule(graph, memory)
        return graph
    if not least and plain <= memory:
        return graph
    best, seen = [graph, plain, [], plain_which], set()

    def tried(setting):
        """The loops scheduled for `setting` (a target of bytes, or a fallback), measured and kept if least;
        their plans and XLA's bytes (None where already tried or nothing to measure)."""
        g = Graph.from_jaxpr(closed)
        plans = schedule(g, setting)
        key = tuple((p.schedule, p.slots) for p in plans)
        if key in seen:
            return plans, None
        seen.add(key)
        got, which = budgeted_temp(g.to_jaxpr(), over=None if least else memory)
        if got is not None and got < best[1]:
            best[:] = g, got, plans, which
        return plans, got

    target = memory
    for _ in range(0 if least else FIT_TRIES):
        plans, got = tried(target)
        if got is None or got <= memory:
            break
        target = sum(p.predicted_bytes() for p in plans) - (got - memory)   # what the loops must store less
    for fallback in FALLBACKS:
        # unmet: the model's walk ends at its tightest (revolve, 1 slot: 13056 B predicted, 28416 B measured on
        # an RNN with MLP layers), where "min"'s sqrt or plain remat measures less (17232 B; round 15's A)
        if not least and best[1] <= memory:
            break
        tried(fallback)
    g, got, plans, which = best
    if warn and not least and got > memory:
        got, which = budgeted_temp(g.to_jaxpr())   # (in full for the warning: value_and_grad's too)
        _loops_over(memory, got, _subject() + which, plans, gradient=False)
    return g


WITH_VALUE = " with its value (jax.value_and_grad's program, which XLA schedules bigger here)"


def budgeted_temp(closed, over: float | None = None) -> tuple[int | None, str]:
    """What a byte budget must hold, in XLA's bytes, and which program takes it (words for a warning, "" for
    `jax.grad`'s): the most any way of running the gradient takes, `jax.grad`'s program (`user_grad_run`) or
    `jax.value_and_grad`'s (a train step's: the README's RNN + MSE under a budget between the two, 422020 and
    424192 B, fit grad's and missed value_and_grad's, silently); for a function with several outputs, with
    has_aux (`gradient_runs`). over: a budget `jax.grad`'s program already misses is not measured further."""
    got, which = user_grad_run(closed)
    if got is None or over is not None and got > over:
        return got, which
    valued, vwhich = _most(closed, _first_argument_floats(closed) or None, True)
    return (valued, vwhich) if valued is not None and valued > got else (got, which)


def gradient_runs(closed, wrt=None, with_value: bool = False) -> list:
    """The gradient programs of `closed` a budget is for, with words naming each: `jax.grad`'s (with_value:
    `jax.value_and_grad`'s); for a function with several outputs among which scalar floats
    (`use.aux_losses`), the has_aux program of each of those, the only gradient `jax.grad` takes of such a
    function: not the VJP of every output (a tighter budget fitted that one and made has_aux's grow, 14600 B
    where a looser budget's plan ran 11968 B; a met has_aux budget was warned unmet, round 17's H and I). The
    gradient comes first in has_aux's program, as JAX returns it: XLA schedules by output order (9376 B; 8800 B
    with the aux first, which left a 9000 B budget missed unsaid, round 15's C)."""
    ks = aux_losses(closed)
    if not ks:
        return [(_gradient(closed, wrt, with_value), WITH_VALUE if with_value else "")]
    return [(_gradient(closed, wrt, with_value, outs=(k,)), _has_aux(k, with_value)) for k in ks]


def _most(closed, wrt, with_value: bool) -> tuple[int | None, str]:
    """The most XLA temp any of `gradient_runs` takes, and its words; (None, "") where there is none."""
    return _largest(gradient_runs(closed, wrt, with_value))


def _largest(runs: list) -> tuple[int | None, str]:
    """The most XLA temp any of `runs` ((program or None, words) pairs) takes, and its words; (None, "")."""
    out: tuple = (None, "")
    for gp, words in runs:
        if gp is not None and (t := _xla_temp(gp)) is not None and (out[0] is None or t > out[0]):
            out = (t, words)
    return out


def _has_aux(k: int, valued: bool) -> str:
    """How a warning names the has_aux gradient of output `k` (`budgeted_temp`)."""
    return (f" with output #{k} as the loss and the others as its aux (jax.{'value_and_grad' if valued else 'grad'}"
            f"(f, has_aux=True)'s program, which XLA schedules bigger here)")


def other_runs(closed) -> list:
    """For a function with several outputs among which scalar floats, the ways to differentiate it that a budget
    is not fitted to (`gradient_runs` fits has_aux's) but that the chosen plan is checked against, so that one
    missing it is said (round 18's M and N: the loss alone, the aux dropped, ran 18768 B of a 16641 B budget
    unsaid; the VJP of every output 524288 B of 413204 B): the VJP of every output (`jax.vjp` with a cotangent
    on each, `jax.grad` of their sum), with its value too, and each scalar output alone, the others dropped
    (every scalar, also where has_aux's loss is known to be output 0: `jax.grad(lambda *a: f(*a)[1][0])`)."""
    ks = scalar_outputs(closed)
    if not ks:
        return []
    wrt = _first_argument_floats(closed) or None
    every = " as the VJP of every output (jax.vjp with a cotangent on each, or jax.grad of their sum)"
    return [(_gradient(closed, wrt), every), (_gradient(closed, wrt, True), every + " with the values")] + \
        [(_gradient(closed, wrt, outs=(k,), aux=False), f" of output #{k} alone, the others dropped "
          f"(jax.grad(lambda *a: f(*a)[{k}]))") for k in ks]


def missed_otherwise(closed, memory) -> tuple[int | None, str]:
    """The most bytes any of `other_runs` takes over `memory`, and its words; (None, "") where none misses."""
    most = _largest(other_runs(closed))
    return most if most[0] is not None and most[0] > memory else (None, "")


def _gradient(closed, wrt=None, with_value: bool = False, outs=None, aux: bool = True):
    """The gradient program a budget measures: as `use.gradient_program`, behind a jit boundary where the
    call was traced under `jax.jit` with its use unknown (`cost.gradient_behind_jit`: what JAX then runs); of
    the batched program where `jax.vmap` comes before `jax.grad` (`cost.gradient_batched`)."""
    batch = cost.batched_gradient()
    if batch is not None and batch[1]:
        closed = _batched(closed, batch[0])
    return cost.gradient_program(closed, wrt=wrt, with_value=with_value, outs=outs, aux=aux,
                                 through_jit=cost.gradient_behind_jit())


def _batched(closed, steps):
    """`closed` under each of the `jax.vmap` steps, innermost first (`use.batched_program` traces each once per
    plan); `closed` itself where a step's axes are not its inputs (a program with other inputs, a gradient's own:
    judged unbatched)."""
    out = closed
    for axes, size in steps:
        if len(axes) != len(out.in_avals):
            return closed
        out = batched_program(out, axes, size)
    return out


def budget_is_own(closed) -> bool:
    """Whether a budget is about this program's own temp: a program that is itself a gradient, run as it is
    (`optimize(jax.grad(f), memory=...)` called). Traced under `jax.grad` (`cost.gradient_known`) it is
    differentiated again, a force field trained by its own gradient, and that gradient is what runs and what a
    budget must hold: 1081348 B, plain's, against a 50% budget, silently, when its own 262144 B was judged
    (round 19's F)."""
    return is_gradient(closed) and not cost.gradient_known()


def loop_budget_check(graph: Graph, memory, plans: list | None) -> None:
    """A byte budget on a program with loops whose loops are scheduled: XLA measures the gradient the user
    will run (a program that is itself a gradient: its own temp) and a budget it does not meet is said."""
    try:
        closed = graph.to_jaxpr()
        own = budget_is_own(closed)
        if own:
            got, subject = _xla_temp(closed), _own_subject()
        else:
            got, which = budgeted_temp(closed)
            subject = _subject() + which
    except Exception:   # noqa: BLE001 - a proposal that does not compile alone (the planner's per-loop views)
        return
    if got is not None and (memory == "min" or got > memory):     # ("min": only a gradient program's loops)
        _loops_over(memory, got, subject, plans, gradient=own)


def _loops_over(memory, got, subject: str, plans: list | None, gradient: bool) -> None:
    """plans None: the loops' schedules were given before (remat_program sees the loops remat_loops left)."""
    scheds = "as remat_loops gave them" if plans is None else ", ".join(
        f"{p.schedule}" + (f" ({p.slots} slots)" if p.schedule == "revolve" else "") + f" for {p.length} steps"
        for p in plans) or "none (no loop here can be rescheduled)"
    stored = "" if plans is None else f" (predicted {_mib(sum(p.predicted_bytes() for p in plans))})"
    plans = plans or []
    if gradient:
        why = ("this program is already differentiated: its loops' residuals are ordinary values that "
               "jax.checkpoint cannot change; put the budget on the function before differentiation, "
               "jax.grad(optimize(f, memory=...)).")
    else:
        why = (f"loop schedules change only what the loops store across steps{stored}; the "
               "rest of the gradient (work outside the loops, each step's own backward, the inputs' gradients) "
               "is what is left." +
               ("" if any(p.schedule in ("sqrt", "revolve") for p in plans) or not plans else
                " memory='min' checkpoints the loops too (√L, or every step, whichever XLA measures less)."))
    asked = "memory='min'" if memory == "min" else f"memory={memory} bytes ({_mib(memory)})"
    warnings.warn(f"jaxform: remat_loops cannot {'reduce' if memory == 'min' else 'fit'} {subject} "
                  f"{'under' if memory == 'min' else 'in'} {asked}: XLA measures {_mib(got)} with the loops' "
                  f"schedules {scheds}; {why}", stacklevel=user_stacklevel())


def auto_budget(graph: Graph) -> tuple[int | None, str]:
    """memory="auto" on a straight-line program: (the byte budget the device sets, how to name it) where
    the gradient might not fit it, else (None, ""): left alone, recomputing there only costs time."""
    cap = cost.device_memory()
    if cap is None:
        return None, ""
    budget = int(AUTO_SHARE * cap - 2 * sum(cost.value_bytes(v) for v in graph.inputs))   # arguments and gradients
    made = sum(cost.value_bytes(o) for n in graph.nodes for o in n.outputs)
    if budget <= 0 or AUTO_GATE * made < budget:
        return None, ""
    return budget, f"memory='auto' ({AUTO_SHARE:.0%} of the device's {_mib(cap)}, less the arguments)"


def choose(closed, memory, asked: str | None = None):
    """(name, program, XLA grad temp bytes, predicted grad seconds or None) for `memory`, or None to leave
    the program as it is. Memory is XLA's (each candidate's gradient program compiled): the liveness
    model is off by up to 2x on checkpointed gradients (docs/remat.md). A budget takes the candidate that
    recomputes least among those that fit (compiling no more than it must); "min" the least memory. A budget
    is met by the gradient with respect to every float input and, where `optimize` knows it, by
    `jax.grad`'s default, the first argument's (XLA gives the two different temp: 8 KiB on an MLP).

    Never bigger than plain: a candidate is kept only where neither gradient grows; warnings quote the
    gradient the user asked for (`jax.grad`'s default: the first argument's), numbers they can match."""
    asked = asked or (f"memory={memory!r}" if isinstance(memory, str) else
                      f"memory={memory} bytes ({_mib(memory)})")
    own, stop = recompute_choice(closed, memory, asked)
    if own is not None or stop:
        return own
    # traced under the gradient (`cost.gradient_known`): that one is all this trace runs, the only one compiled
    measure = user_grad_temp if cost.gradient_known() and _first_argument_floats(closed) else xla_grad_temp
    base = cost.traced_baseline(closed)    # (plain: the program as traced, where only cleanups came before)
    plain, quoted = user_grad_run(base) if measure is user_grad_temp else (measure(base), "")
    if plain is None:
        return None
    plain_user, user_words = first_argument_grad_run(base) if measure is xla_grad_temp else (None, "")
    user = (lambda prog, m: first_argument_grad_temp(prog)) if plain_user is not None else (lambda prog, m: m)
    quoted = quoted if plain_user is None else user_words
    plain_user = plain if plain_user is None else plain_user
    # (where the number quoted is a has_aux program's, the output it takes for the loss is named: the warning quoted
    # output #1's 2.57 MiB as "the gradient of its first argument" where the user's loss ran 1.58, round 21's B)
    subject = _subject() + quoted
    budget = not isinstance(memory, str)
    if budget and plain <= memory and plain_user <= memory and value_and_grad_temp(base) <= memory:
        return None
    # a budget takes the first candidate that fits in the order of what they recompute (`by_recompute`): each
    # compiled only if the ones recomputing less did not fit; "min" takes the least, so compiles them all
    # a budget is met by `jax.value_and_grad`'s program too (train steps take the value; XLA may schedule it bigger)
    scored, tried, widest = [], 0, False    # (widest: a schedule that recomputes everything was tried)
    with_value = {}                         # name -> value_and_grad temp, where jax.grad's fit and it did not
    for name, prog in candidates(closed, order=by_recompute(closed) if budget else None):
        m = measure(prog)
        tried += 1
        if m is not None and m < plain:
            mu = user(prog, m)
            if mu is not None and mu <= plain_user:      # never bigger than plain, in either gradient
                if budget and m <= memory and mu <= memory:
                    if (mv := value_and_grad_temp(prog)) <= memory:
                        return name, prog, m, None
                    with_value[name] = mv
                scored.append((name, prog, m, None, mu))    # (its predicted time: only to break a tie, below)
        widest |= name.startswith("all")
        if budget and tried >= GIVE_UP_AFTER and widest and all(s[2] > (1 - MIN_SAVING / 2) * plain for s in scored):
            break   # XLA reuses nothing from recomputation here (docs/remat.md): stop compiling. Not under "min",
            # which asks for the least, so compiles every candidate: no cut predicts what another saves (a
            # 32-layer stack: all-4, nothing-4 and checkpoint_dots save < 12.5%, 8 segments 20%; round 12's E)
    # a warning quotes the gradient asked for; where that fits and the one w.r.t. every float input (a jit trace's
    # other argnums) does not, that one: "cannot fit ... it takes 18.5 KiB" of a 19.5 KiB budget (round 17's J)
    every = budget and plain_user <= memory < plain
    if every:
        plain_user, subject = plain, "this program's gradient (w.r.t. every float input)"
    if not scored:
        if budget or memory == "min":
            vg = value_and_grad_temp(base) if budget else 0     # (compiled above: the answer is cached)
            valued = f", and jax.value_and_grad's program, which also returns the value, at {_mib(vg)}" \
                if budget and vg > memory else ""     # (what misses the budget where the gradient alone fits it)
            _cannot_fit(asked, plain_user, "no segment checkpointing makes it smaller (XLA measured each "
                                           f"candidate); the program is left as it is, its gradient stays at "
                                           f"{_mib(plain_user)}{valued}." +
                                           _other_order(base, memory, plain_user, vg if budget else None),
                        subject=subject, traced=base is not closed)
        return None
    if every:     # (ranked by the gradient quoted)
        scored = [(*s[:4], s[2]) for s in scored]
    least = min(scored, key=lambda s: (s[4], s[2]))
    ties = [s for s in scored if (s[4], s[2]) == (least[4], least[2])]
    if len(ties) > 1:   # the model's time, traced only here: a GPT's gradient traced for it took 0.5 s a candidate
        least = min(((*s[:3], cost.estimate(s[1], grad=True).grad_seconds or 0.0, s[4]) for s in ties),
                    key=lambda s: s[3])
    if memory == "min":
        other = _other_order(base, memory, least[4], chosen=least[1])
        if other:       # nothing to say where this order reaches the least (within 10%)
            warnings.warn(f"jaxform: memory='min' brings {subject} to {_mib(least[4])} with {describe(least[0])}."
                          + other, stacklevel=user_stacklevel())
        return least[:4]
    useful = least[4] <= (1 - MIN_SAVING) * plain_user
    mv = with_value.get(least[0]) or value_and_grad_temp(least[1])
    fits_grad = "" if mv <= least[4] else (
        (" (that fits jax.grad's gradient, but " if least[0] in with_value else " (") +
        f"jax.value_and_grad's program, which also returns the value, takes {_mib(mv)} there)")
    _cannot_fit(asked, plain_user, f"the least any segment checkpointing reaches is {_mib(least[4])} with "
                f"{describe(least[0])}{fits_grad}; " +
                ("using that." if useful else
                 f"the program is left as it is, its gradient stays at {_mib(plain_user)} (a saving under "
                 f"{MIN_SAVING:.0%} is not worth the recomputation).") +
                _other_order(base, memory, least[4] if useful else plain_user,    # (what this order runs)
                             mv if useful else value_and_grad_temp(base), chosen=least[1] if useful else None),
                subject=subject, helped=useful, traced=base is not closed)
    return least[:4] if useful else None


def by_recompute(closed) -> list:
    """`remat_program.schedules` in the order of the work each one's backward pass recomputes, in the cost
    model's seconds per equation (ties in the pass's own order). A budget takes the first that fits, so the
    one recomputing least must come first: the pass's fixed order puts `checkpoint_dots` first, which holds
    where matmuls and convolutions are the work, not where elementwise work is (there it recomputes about
    as much as every segment does)."""
    specs = schedules(closed, cheapest_first=True)
    try:
        m = cost.machine()
        per = [cost.node_seconds(n, m) for n in Graph.from_jaxpr(closed).nodes]
    except Exception:   # noqa: BLE001 - a node the model cannot cost: the pass's order stands
        return specs
    if len(per) != len(closed.jaxpr.eqns):     # (one node per equation; else the pass's order stands)
        return specs
    return sorted(specs, key=lambda s: sum(per[i] for i in recomputed_eqns(closed, s[1], s[2])))


def _other_order(closed, memory, reached: int, reached_valued: int | None = None, chosen=None) -> str:
    """Where this order falls short (a budget unmet, or "min"), what the other one reaches, measured: the
    gradient program (`jax.grad`'s, the first argument's where known) with its residuals recomputed in its
    backward (`recompute_choice`). Said only where it is 10% less than `reached` (issue 38: the LM at 25%
    reached 23.00 MiB this way and 18.07 MiB the other).
    A function with several outputs is claimed only where it returns what `jax.grad(f, has_aux=True)` takes
    (`use.loss_and_aux`: a pair, a float scalar first): that program, output 0 the loss, against what this
    order's `chosen` program (None: `closed` as it is) takes with that loss, not the most of any output's. A
    dict's loss flattens anywhere, and the VJP of every output is not the has_aux program (claims 1.74x off,
    and an order 10% worse named: round 21's A). Not for a gradient w.r.t. values `f` closes over, which
    `jax.grad(f)` cannot take. Per-example gradients (`jax.vmap(jax.grad(...))`) are claimed batched (round
    21's E and F). Under argnums other than the default, the advice keeps them (round 21's D).
    `reached_valued`: what this order's `jax.value_and_grad` program takes, where it takes more than `reached`:
    then the other order is also judged as `optimize(jax.value_and_grad(f), ...)` runs it (the MLP at 25%:
    1.50 MiB this way, 1.25 MiB that way, unnamed where both `jax.grad` programs took 1.25; round 21's G)."""
    asked = cost.asked_gradient() or ""
    batch = cost.batched_gradient()
    if asked == cost.ASKED_CLOSED_OVER or batch is not None and batch[1]:   # (nor for jax.grad of a batched loss:
        return ""       # the other order differentiates that loss, which `f` alone is not)
    outs, losses = None, aux_losses(closed)
    if losses:
        if not loss_and_aux() or 0 not in losses:
            return ""
        outs, ran, wrt = (0,), closed if chosen is None else chosen, _first_argument_floats(closed) or None
        reached = _xla_temp(_gradient(ran, wrt, outs=outs))
        if reached is None:
            return ""
        if reached_valued is not None:
            reached_valued = _xla_temp(_gradient(ran, wrt, True, outs=outs))
    flags = ", has_aux=True" if outs else ""
    grad = f"jax.grad(f, argnums=...{flags}) (with your argnums)" if asked else f"jax.grad(f{flags})"
    said = _other_reaches(closed, memory, reached, False, grad, outs)
    if not said and reached_valued is not None and reached_valued > reached:
        said = _other_reaches(closed, memory, reached_valued, True, grad.replace("jax.grad", "jax.value_and_grad"),
                              outs)
    return said


def _advised(gradient: str, memory) -> str:
    """The other order as the user writes it: under per-example gradients, inside their `jax.vmap` (which since
    session 22 plans the batched program: round 21's E and F)."""
    call = f"optimize({gradient}, memory={memory!r})"
    batch = cost.batched_gradient()
    return call if batch is None else "jax.vmap(" * len(batch[0]) + call + ")" * len(batch[0]) + \
        " (with your in_axes)"


def _other_reaches(closed, memory, reached: int, with_value: bool, gradient: str, outs=None) -> str:
    """`_other_order` for one of the two gradient programs (`jax.grad`'s, or with its value returned; `outs`
    (0,): has_aux's, output 0 the loss): the other order's least, said where it is 10% under `reached`, else ""."""
    gp = cost.gradient_program(closed, wrt=_first_argument_floats(closed) or None, with_value=with_value, outs=outs)
    if gp is None:
        return ""
    # ... after the cleanups that order runs first: CSE merges what JAX's JVP and transpose recompute, and moves
    # the turn (a ResNet's gradient: 1063 -> 996 equations, its forward 556 -> 443; unclean, this order's
    # 8 segments took 72.4 MiB where the other order's own plan reached 56.4, and the warning kept quiet)
    gp = run_passes(gp, OTHER_ORDER_CLEANUPS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        choice, _ = recompute_choice(gp, memory, "", own=True)   # (that order runs it as it is, whatever this
        # trace's use: under jax.grad `budget_is_own` says no, and from 815f0e5 to session 20 nothing was named)
    if choice is None or choice[2] > ORDERS_APART * reached:
        return ""
    program = (" in jax.value_and_grad's program" if with_value else "") + \
        (" with output #0 as the loss (has_aux=True's, if that is your loss)" if outs else "")
    program += f", where this order's takes {_mib(reached)}" if program else ""
    return (f" The other order, {_advised(gradient, memory)}, reaches {_mib(choice[2])} here{program} "
            f"(XLA measured; {describe(choice[0])}): use that one (docs/remat.md, both orders).")


def describe(name: str) -> str:
    """A candidate's name (`remat_program.candidates`, `recompute_choice`) in words a user can act on."""
    if name == "checkpoint_dots":
        return "the whole program under jax.checkpoint(policy=dots_saveable) (matmul and convolution results " \
               "stored, the rest recomputed in the backward pass)"
    policy, _, k = name.partition(", ")
    k = k.split()[0] if k else "?"
    if policy == "all":
        return f"the program cut into {k} segments (at the points where the fewest bytes are alive), each under " \
               "jax.checkpoint: only the values crossing a cut are stored, the rest recomputed in the backward pass"
    if policy == "nothing":
        return f"the program cut into {k} segments (at the points where the fewest bytes are alive), all but the " \
               "last under jax.checkpoint: only the values crossing a cut are stored, the rest recomputed"
    if policy == "recompute":
        return f"its forward cut into {k} segments, the residuals of all but the last recomputed in its " \
               "backward pass from the values crossing the cuts"
    return name


def _subject() -> str:
    """How warnings name the gradient they quote: the one `jax.grad(f)` takes by default where `optimize`
    told the planner which inputs are the first argument, else the gradient w.r.t. every float input."""
    wrt = cost.first_argument()
    return (cost.asked_gradient() or ("the gradient of its first argument (what jax.grad takes by default)" if wrt
                                      else "this program's gradient (w.r.t. every float input)")) + _batched_words()


def _own_subject() -> str:
    """How warnings name a gradient program's own temp (`budget_is_own`), batched where it runs under `jax.vmap`."""
    return "this gradient program's own memory" + _batched_words()


def _batched_words() -> str:
    batched = cost.batched_gradient()
    if not batched:
        return ""
    sizes = [size for _, size in batched[0]]
    many = f"{math.prod(sizes)} examples" + (f" ({' x '.join(map(str, sizes[::-1]))}, nested jax.vmap)"
                                             if len(sizes) > 1 else " (jax.vmap)")
    return f", of the program batched over {many}" if batched[1] else f", batched over {many}"


def user_grad_temp(closed) -> int | None:
    """XLA temp of the gradient the user will run: `jax.grad`'s default where known, else every float input's."""
    return user_grad_run(closed)[0]


def user_grad_run(closed) -> tuple[int | None, str]:
    """`user_grad_temp`, and the words naming the program (`gradient_runs`)."""
    return _most(closed, _first_argument_floats(closed) or None, False)


def _first_argument_floats(closed) -> list:
    """The float inputs of the first argument, where `optimize` told the planner which inputs those are."""
    wrt = cost.first_argument()
    return [i for i in wrt if jax.numpy.issubdtype(closed.in_avals[i].dtype, np.inexact)] if wrt else []


def first_argument_grad_temp(closed) -> int | None:
    """XLA temp of the gradient `jax.grad(f)` takes by default (the first argument's floats), where
    `optimize` told the planner which inputs those are and they are not all of them; else None."""
    return first_argument_grad_run(closed)[0]


def first_argument_grad_run(closed) -> tuple[int | None, str]:
    """`first_argument_grad_temp`, and the words naming the program (`gradient_runs`); (None, "")."""
    floats = _first_argument_floats(closed)
    if not floats or len(floats) == sum(jax.numpy.issubdtype(a.dtype, np.inexact) for a in closed.in_avals):
        return None, ""
    return _most(closed, floats, False)


def value_and_grad_temp(closed) -> int:
    """XLA temp of `jax.value_and_grad`'s program (the gradient `user_grad_temp` measures, its value returned
    too); 0 where there is no gradient to take."""
    return _most(closed, _first_argument_floats(closed) or None, True)[0] or 0


def _cannot_fit(asked: str, plain: int, what: str, subject: str = "this program's gradient", helped: bool = False,
                traced: bool = False) -> None:
    """traced: `plain` is the program as traced (`cost.traced_baseline`), not as jaxform's other passes left it."""
    cannot = f"cannot make {subject} smaller under {asked}" if asked == "memory='min'" else \
        f"cannot fit {subject} in {asked}"
    baseline = "as traced" if traced else "after jaxform's other passes"
    warnings.warn(f"jaxform: remat_program {cannot}: without recomputation ({baseline}) it takes "
                  f"{_mib(plain)} of XLA temp memory; " + what + _advice(helped),
                  stacklevel=user_stacklevel())


def unmet_without(memory, left: float, view: str, measured: bool, why: str) -> None:
    """Say a byte budget that the plan leaves unmet where no kept pass said so: `left` bytes in the gradient
    `view` the call runs. Without this the budget was missed silently (round 10: sincos w.r.t. an input its
    loop does not read, judged as `jax.value_and_grad` runs it, has no loop to schedule)."""
    warnings.warn(f"jaxform: cannot fit {_subject()} in memory={int(memory)} bytes ({_mib(memory)}): the plan "
                  f"leaves {_mib(left)} of XLA temp memory ({'measured' if measured else 'predicted'}) in the "
                  f"gradient's view '{view}'; {why}." + _advice(helped=True), stacklevel=user_stacklevel())


def recompute_choice(closed, memory, asked: str, own: bool | None = None):
    """For a program that is itself a gradient (`optimize(jax.grad(f), memory=...)`): its residuals
    recomputed in its backward (`passes.recompute`), k segments, judged on the program's own XLA temp.
    Returns (choice or None, stop): a gradient program's own temp is what a budget is about, so its
    gradient's candidates (the other order's) are not measured after it. `own`: whether the budget is about
    its own temp, where the caller knows better than this trace's use (`_other_order` asks of a gradient
    program the other order would run as it is, while this trace runs under `jax.grad`)."""
    if not (budget_is_own(closed) if own is None else own):
        return None, False
    base = cost.traced_baseline(closed)     # (the program as traced: the final guard's, one compile)
    plain = _xla_temp(base)
    if plain == 0 or (not isinstance(memory, str) and plain <= memory):
        return None, True
    progs = [(k, p) for k in (4, 2, 8, 16) if (p := recomputed(closed, k)) is not None]
    # a budget takes the fastest (by the model) that fits: compiled fastest first, up to the first that fits
    # (nanoGPT at 50%: 4 candidates compiled -> 1); "min" the least, so compiles them all
    timed = sorted(((k, p, cost.estimate(p, grad=False).seconds) for k, p in progs), key=lambda c: c[2] or 0.0)
    scored = []
    for k, p, seconds in timed:
        scored.append((f"recompute, {k} segments", p, _xla_temp(p), seconds))
        if memory != "min" and scored[-1][2] <= min(memory, (1 - MIN_SAVING / 2) * plain):
            return scored[-1], True
    saving = [s for s in scored if s[2] <= (1 - MIN_SAVING / 2) * plain]
    least = min(saving, key=lambda s: (s[2], s[3] or 0.0)) if saving else None
    if least is not None and memory == "min":
        return least, True
    if memory != "min":
        reached = min((s[2] for s in scored), default=plain)
        how = f" with {describe(least[0])}" if least else ""
        _cannot_fit(asked, plain, f"the least recomputation in its backward reaches is {_mib(reached)}{how}; " +
                    ("using that." if least else f"the program is left as it is, at {_mib(plain)}.") +
                    " The other order plans before JAX decides what the backward pass stores, and often reaches "
                    "less: jax.grad(optimize(f, memory=...)) (docs/remat.md, both orders).",
                    subject=_own_subject(), helped=least is not None,
                    traced=base is not closed)
    return least, True


def _xla_temp(closed) -> int:
    """XLA's temp bytes of `closed` as the call runs it (batched under `jax.vmap(jax.grad(f))`,
    `cost.gradient_batched`), through the planner's caches (`measure.temp_bytes`: a budget's candidates are
    compiled once per machine, however often the pipeline is replayed)."""
    batch = cost.batched_gradient()
    if batch is not None and not batch[1]:      # (batched before the gradient: `_gradient` batched it)
        closed = _batched(closed, batch[0])
    t = _measure.temp_bytes(closed, _measure.Budget(math.inf), memory_only=True)    # (never timed)
    return cost.xla_temp(closed) if t is None else t


def xla_grad_temp(closed) -> int | None:
    """XLA's temp bytes for the gradient program of `closed` w.r.t. every float input (compiled here), or None."""
    return _most(closed, None, False)[0]


def user_stacklevel() -> int:
    return pipeline_stacklevel() - 1     # the user's line, not the planner's


def _advice(helped: bool = False) -> str:
    """What to try when a budget is not met. XLA:CPU before JAX 0.12 (its concurrency-optimized
    scheduler) reuses none of the memory recomputation frees: a transformer's gradient stayed at 76.8 MiB
    under any checkpointing, 37 MiB with `jax.checkpoint` per block once the flag below was off."""
    if not helped and jax.default_backend() == "cpu" and _jax.JAX_VERSION < (0, 12) and \
            "concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
        return (" XLA:CPU before JAX 0.12 frees nothing by recomputation unless its memory scheduler is on: "
                "XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false (set before JAX starts; "
                "docs/remat.md), or a newer JAX.")
    return " A smaller batch, or jax.checkpoint by hand at finer points (docs/remat.md)."


def _mib(n) -> str:
    """Bytes as a person reads them: MiB from 0.1 MiB up, KiB or bytes below (a budget of 64 bytes is not
    "0.00 MiB")."""
    return f"{n / 2 ** 20:.2f} MiB" if n >= 2 ** 20 / 10 else f"{n / 1024:.1f} KiB" if n >= 1024 else f"{int(n)} B"


__all__ = ["choose", "describe", "unmet_without", "recompute_choice", "auto_budget", "xla_grad_temp",
           "first_argument_grad_temp", "AUTO_SHARE", "AUTO_GATE"]


# The memory passes ask for these decisions by name (`passes.decisions`: imports run plan -> passes).
for _name, _fn in (("loop_schedules", loop_schedules), ("auto_budget", auto_budget), ("choose", choose),
                   ("loop_budget_check", loop_budget_check), ("fit_loops", fit_loops),
                   ("budget_is_own", budget_is_own)):
    _decisions.install(_name, _fn)
