"""`explain(fn, *args)`: which passes changed the program, where, and what it bought.

For each pass that changed the program: the user source lines of the nodes it
added, changed or removed, the equation count (bodies included) and XLA's
temp memory before/after it, and for rule-set passes (`algebra`, user
`Rules`) how often each rule fired. Totals for the whole pipeline, and with
`measure=True` the jit-compiled time before/after (min of N).
"""
from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from ..ir import Graph
from ..ir.printing import diff
from ..optimize import planning_contexts
from ..passes import memory_pipeline
from ..passes.remat_loops import check_memory, plan as loop_plan, reschedulable_why
from ..passes.scan_reductions import blockers
from ..plan import UNKNOWN, plan as plan_pipeline
from ..plan.memory import loop_schedules
from . import program
from .match import match
from .show import paired_text


@dataclass
class Change:
    """One pass that changed the program."""
    pass_name: str
    where: list                          # user 'file.py:12:4 (fn)' lines of the nodes it touched, most first
    eqns: tuple                          # equations before, after (bodies included)
    temp_bytes: tuple | None = None      # XLA temp memory before, after
    rules: dict | None = None            # rule name -> firings, for rule-set passes
    added: int = 0                       # nodes new or changed
    removed: int = 0
    diff: str = ""


@dataclass
class Report:
    """What the pipeline did to `function`; print it, or `.to_dict()` for JSON."""
    function: str
    passes: list
    changes: list = field(default_factory=list)
    eqns: tuple = (0, 0)
    temp_bytes: tuple | None = None
    time_s: tuple | None = None
    reps: int = 0
    unfused: list = field(default_factory=list)   # why a scan's stacked outputs stayed (fuse_scan_reductions)
    loops: list = field(default_factory=list)     # what each loop remembers under grad (remat_loops)
    grad_temp_bytes: tuple | None = None          # XLA temp memory of the gradient, before/after loop planning
    decisions: list = field(default_factory=list)  # the planner's verdict on each loop pass's proposal
    planning: str = ""                             # the use planned for and what planning spent
    derivatives: str = ""                          # where the program's derivatives are not the stages' own
    diff: str = ""                                 # the program as traced -> the one that runs (forward)

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        lines = [f"jaxform.explain: {self.function}",
                 f"  pipeline: {', '.join(self.passes) or '(none)'}"]
        if self.planning:
            lines.append(f"  planner: {self.planning}")
        for d in self.decisions:
            lines.append(f"  planner: {d}")
        if not self.changes:
            lines.append("  no pass changed the program")
        for c in self.changes:
            mem = f", temp memory {fmt_bytes(c.temp_bytes[0])} -> {fmt_bytes(c.temp_bytes[1])}" if c.temp_bytes else ""
            lines.append(f"  {c.pass_name}: equations {c.eqns[0]} -> {c.eqns[1]}{mem} "
                         f"(+{c.added} -{c.removed} nodes)")
            for loc in c.where[:5]:
                lines.append(f"      at {loc}")
            if len(c.where) > 5:
                lines.append(f"      ... and {len(c.where) - 5} more places")
            for rule, k in (c.rules or {}).items():
                lines.append(f"      rule {rule}: {k}x")
        for u in self.unfused:
            lines.append(f"  scan {u['scan'] or '(no source line)'}: stacked outputs not fused: "
                         f"{u['consumer']} at {u['where'] or '(no source line)'} blocks it: {u['why']}")
        for lp in self.loops:
            if lp["schedule"] is None:
                lines.append(f"  loop {lp['where'] or '(no source line)'}: left as is under grad: {lp['why']}")
                continue
            lines.append(f"  loop {lp['where'] or '(no source line)'} ({lp['length']} steps): under grad keeps "
                         f"{lp['schedule']}: predicted {fmt_bytes(lp['predicted'][0])} -> {fmt_bytes(lp['predicted'][1])}"
                         f", recompute {lp['recompute']}x the body")
        if self.derivatives:
            lines.append(f"  gradient: {self.derivatives}")
        if self.grad_temp_bytes:
            g0, g1 = self.grad_temp_bytes
            lines.append(f"  gradient (measured, XLA temp memory): {fmt_bytes(g0)} -> {fmt_bytes(g1)}")
        lines.append(f"  total: equations {self.eqns[0]} -> {self.eqns[1]}")
        if self.temp_bytes:
            lines[-1] += f", XLA temp memory {fmt_bytes(self.temp_bytes[0])} -> {fmt_bytes(self.temp_bytes[1])}"
        if self.time_s:
            t0, t1 = self.time_s
            lines.append(f"  time (jit, min of {self.reps}): {t0 * 1e3:.2f} ms -> {t1 * 1e3:.2f} ms ({t0 / t1:.2f}x)")
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


def fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def _with_stats(p, stats: dict):
    """A pass that is a rule set (a `Rules`, or a function with `.rules` applying exactly them) records firings."""
    rules = p if hasattr(p, "apply") and hasattr(p, "rules") else getattr(p, "rules", None)
    if rules is None or not hasattr(rules, "apply"):
        return p
    name = program.pass_name(p)

    def run(graph):
        stats[name] = rules.apply(graph)
        return graph
    run.pass_name, run.exact = name, getattr(p, "exact", False)
    return run


def explain(fn: Callable, *args, passes: Sequence | str | None = None, memory: bool = True,
            measure: bool = False, reps: int = 5, progress: bool = False, loop_memory="default",
            for_use=None, plan: bool | None = None) -> Report:
    """Run the pipeline on `fn(*args)` and report each pass that changed the program.

    args: arrays or `jax.ShapeDtypeStruct`s (pytrees of them); `measure=True`
    needs concrete values and draws random ones for ShapeDtypeStructs.
    memory: compile each changed stage to read XLA temp memory (one compile per stage), and
        the gradient before/after loop planning.
    loop_memory: `optimize`'s `memory=` setting; as there, "auto" with the default pipeline.
        Each loop's schedule, predicted bytes and recompute factor are reported.
    progress: print long steps (compile, measurement) on stderr.
    plan: plan the pipeline (default: only the default one), as `optimize(plan=...)`.
    for_use: the `plan.Use` to plan for (default: as `jax.jit(optimize(fn))` is planned, where nothing tells
        how the result will be used: the forward alone, its derivatives as traced; docs/planner.md).
    """
    settings = getattr(fn, "jaxform_settings", None)
    max_steps, exact = None, False
    if settings is not None:   # an `optimize` wrapper: explain its function under its settings (not a re-plan
        fn = fn.__wrapped__    # of what it traces to), unless the call says otherwise
        passes = settings["passes"] if passes is None else passes
        loop_memory = settings["memory"] if loop_memory == "default" else loop_memory
        plan = settings["plan"] if plan is None else plan
        max_steps, exact = settings["max_steps"], settings["exact"]
    if loop_memory != "default":
        check_memory(loop_memory, where=f"jaxform.explain({program.fn_name(fn)}, loop_memory=...)")
    step = program.Progress(progress)
    with step(f"tracing {program.fn_name(fn)}"):
        closed, flat = program.trace_flat(fn, args)
    stats: dict = {}
    if loop_memory == "default":
        loop_memory = "auto" if passes is None else None
    # as `optimize` builds it: exact=True keeps the exact passes and no memory pass
    pipe = [_with_stats(p, stats) for p in program.pipeline(passes) if not exact or getattr(p, "exact", False)]
    if loop_memory is not None and not exact:     # as `optimize(memory=...)` appends them
        pipe += memory_pipeline(loop_memory, max_steps, program.fn_name(fn))
    stages: list = []
    report = Report(program.fn_name(fn), [program.pass_name(p) for p in pipe], reps=reps)
    planned = passes is None if plan is None else bool(plan)
    use = for_use if planned and for_use is not None else UNKNOWN
    # planned and replayed under what `optimize` tells the planner of a call (its first argument, argnums,
    # batching): a budget's fit is of the gradient `optimize` fits
    if planned:              # the default pipeline is planned, as in `optimize`: report each verdict
        with step("planning"), planning_contexts(args, range(len(args)), use):
            chosen = plan_pipeline(closed, pipe, memory=loop_memory, use=use, example_args=flat)
        report.decisions = [str(d) for d in chosen.decisions]
        if chosen.budget is not None:
            report.planning = (f"planned for {chosen.use.label} in {chosen.seconds:.2f} s: {chosen.budget} "
                               "(~: memory predicted, else XLA's; *: time measured, else predicted)")
        pipe = [p for k, p in enumerate(pipe) if k not in chosen.skipped]
    with step("running passes"), planning_contexts(args, range(len(args)), use):
        after = program.run(closed, pipe, lambda name, b, a: stages.append((name, b, a)))
    # the totals are the program the plan runs, never a replay that differs from it (a GPU demo reported a
    # forward 0.63x slower: the replay ran a pass the forward plan had rejected)
    if planned and chosen.partial:   # a pass kept for some loops only: the stages replay it whole
        after = chosen.forward if chosen.forward is not None else chosen.closed
        report.decisions.append("some passes were kept for some loops only: the stages below apply them to "
                                "every loop; the totals are the planned program's")
    elif planned and chosen.forward is not None:
        after = chosen.forward
    if planned and chosen.forward is not None:
        report.derivatives = ("as traced: the forward is planned alone, and jax.grad (or jax.jvp) of it "
                              "differentiates the program as traced, as plain jax.jit would; to plan the "
                              "gradient, trace it inside the jit: jax.jit(jax.grad(optimize(f)))")
    report.diff = diff(*paired_text(Graph.from_jaxpr(closed), Graph.from_jaxpr(after)))
    mems: dict = {}

    def mem(c):
        key = program.program_key(c)
        if key not in mems:
            with step(f"compiling program {len(mems) + 1} of {len(stages) + 1} for XLA's memory analysis"):
                mems[key] = program.temp_bytes(c, flat)
        return mems[key]

    for name, b, a in stages:
        gb, ga = Graph.from_jaxpr(b), Graph.from_jaxpr(a)
        m = match(gb, ga)
        where = collections.Counter(program.short_location(loc) for n in (*m.new_nodes, *m.removed_nodes) if (loc := n.location()))
        rules = stats.get(name)
        report.changes.append(Change(
            name, [loc for loc, _ in where.most_common()], (len(gb), len(ga)),
            (mem(b), mem(a)) if memory else None,
            dict(rules.fired.most_common()) if rules is not None else None,
            len(m.new_nodes), len(m.removed_nodes), diff(*paired_text(gb, ga, m))))
    report.eqns = (len(Graph.from_jaxpr(closed)), len(Graph.from_jaxpr(after)))
    if "fuse_scan_reductions" in report.passes:
        report.unfused = unfused_scans(Graph.from_jaxpr(after))
    remat_kept = not planned or chosen.use.differentiated and not any(
        k in chosen.skipped for k, p in enumerate(pipe) if program.pass_name(p).startswith("remat_loops"))
    if loop_memory is not None and not report.derivatives and remat_kept:
        planned = [a for name, b, a in stages if name.startswith("remat_loops")]
        unplanned = next((b for name, b, a in stages if name.startswith("remat_loops")), after)
        report.loops = loop_plans(Graph.from_jaxpr(unplanned), loop_memory)
        if memory and planned:
            with step("compiling the gradient before/after loop planning for XLA's memory analysis"):
                report.grad_temp_bytes = (program.grad_temp_bytes(unplanned, flat),
                                          program.grad_temp_bytes(planned[0], flat))
    if memory:
        report.temp_bytes = (mem(closed), mem(after))
    if measure:
        import jax
        fns = [jax.jit(program.as_function(c)) for c in (closed, after)]
        values = program.concrete(flat)
        with step(f"measuring time (jit, min of {reps})"):
            report.time_s = tuple(program.min_time(fns, values, reps))
    return report


def loop_plans(graph: Graph, memory) -> list[dict]:
    """Per scan: the schedule `remat_loops` picks under `memory`, or why the loop is left as is."""
    plans = loop_plan(graph)
    loop_schedules(plans, memory)
    out = [{"where": program.short_location(n.location()) if n.location() else "", "length": p.length,
            "schedule": p.schedule, "predicted": (p.predicted_bytes("keep"), p.predicted_bytes()),
            "recompute": p.recompute(), "why": ""} for _, n, p in plans]
    for n, _ in graph.walk():
        if n.name == "scan" and (why := reschedulable_why(n)):
            out.append({"where": program.short_location(n.location()) if n.location() else "",
                        "length": n.params["length"], "schedule": None, "predicted": None, "recompute": 0,
                        "why": why})
    return out


def unfused_scans(graph: Graph) -> list[dict]:
    """For each scan whose stacked outputs did not fuse: the consumer that blocked it, why, and where."""
    out, seen = [], set()
    for scan, consumer, why in blockers(graph):
        where = program.short_location(consumer.location()) if consumer is not None and consumer.location() else ""
        key = (id(scan), where, why)
        if key in seen:
            continue
        seen.add(key)
        out.append({"scan": program.short_location(scan.location()) if scan.location() else "",
                    "consumer": consumer.name if consumer is not None else "output", "where": where, "why": why})
    return out
