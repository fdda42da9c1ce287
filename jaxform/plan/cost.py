"""The planner's cost model: what a program will cost under XLA, predicted from its Graph.

Two numbers per program, each a prediction of what XLA reports:

* **temp bytes** (`memory_analysis().temp_size_in_bytes`): the peak of intermediate
  buffers alive at once, parameters and outputs excluded. A value lives from its
  producer to its last consumer, in program order. A value XLA fuses away is no
  buffer: an elementwise (or layout) result whose every consumer is elementwise or
  a reduction. A loop holds its carries twice (XLA double-buffers a while loop's
  state), its stacked `[L, ...]` results as values of the outer program, and one
  step's body peak.
* **seconds**: a roofline per node, max(FLOPs / F, bytes moved / BW), and for a
  loop `length × (body + step overhead)`. The step overhead is the backend's:
  a while-loop iteration on CPU, plus one kernel launch per unfused body node on
  GPU (where moving work out of loops pays more). A while loop's trip count is
  unknown: counted once (a lower bound; the planner never moves work into one).

Calibration (docs/planner.md): CPU constants from this repository's loop sweeps
(`benchmarks/training_memory.py --sweep`, `benchmarks/loops.py`) on the 2-core CI
machine; GPU constants measured on an H200 by `benchmarks/calibrate.py` (kernel launches per
loop step dominate there).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from dataclasses import dataclass

import jax
import numpy as np

from .. import _jax
from ..ir import Graph, Node, Value
from ..ir.separability import AXES_REDUCTIONS, CALL_LIKE, ELEMENTWISE, UNARY
from ..ir.sizes import nbytes, value_bytes  # noqa: F401 (re-exported)
from ..ir.flops import MATMULS, contraction_flops as _contraction_flops, graph_flops  # noqa: F401
from ..ir.toposort import producers_first
from .use import gradient_program  # noqa: F401 (the gradient view, re-exported)

__all__ = ["Machine", "Estimate", "machine", "planning_for", "estimate", "temp_bytes", "seconds", "has_loops",
           "device_memory", "device_memory_limit", "xla_temp"]

LAYOUT = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "convert_element_type",
                    "reduce_precision", "iota", "select_n", "clamp"})
# Row-major layout changes XLA lowers to a bitcast: the result is the operand's buffer, not a new one
# (memory="min" reshapes [L, ...] inputs to [sqrt L, sqrt L, ...]: counted as copies, the planner rejected it).
BITCAST = frozenset({"reshape", "squeeze", "expand_dims"})
FUSIBLE = ELEMENTWISE | LAYOUT              # XLA fuses chains of these into one kernel
FUSED_CONSUMER = FUSIBLE | AXES_REDUCTIONS  # ... and into the reduction that consumes them
TRANSCENDENTAL = frozenset({"exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan",
                            "pow", "atan2", "erf", "erfc", "erf_inv", "lgamma", "digamma", "sqrt", "rsqrt",
                            "asinh", "acosh", "atanh", "sinh", "cosh", "asin", "acos", "atan", "cbrt"})
# FLOPs one element of these costs beyond `Machine.transcendental` (XLA:CPU, measured: cos 2.3 ns, pow 6 ns,
# tanh/exp 0.5 ns per element on the CI machine, where a multiply streams at 0.55 ns).
HEAVY = {"sin": 90, "cos": 90, "tan": 120, "pow": 240, "atan2": 120, "lgamma": 120, "digamma": 120,
         "log": 25, "log1p": 25, "erf_inv": 60}
LOOPS = frozenset({"scan", "while"})
IN_PLACE = frozenset({"dynamic_slice", "dynamic_update_slice"})


@dataclass(frozen=True)
class Machine:
    """What one backend costs: peak rates and the fixed costs a loop pays every step."""
    name: str
    flops: float          # FLOP/s reached by matmuls and fused elementwise code
    bandwidth: float      # bytes/s between buffers
    step: float           # seconds per loop iteration (loop control, carry copies)
    launch: float         # seconds per kernel a loop body launches every step
    transcendental: int   # FLOPs one tanh/exp/log counts as
    in_loop: float        # how much slower arithmetic runs inside a loop body than batched outside it
    cache_bandwidth: float  # bytes/s within one loop step's working set (it stays in cache)
    stack_bandwidth: float  # bytes/s a loop step writes its row of a stacked `[L, ...]` result at
    fuses_reductions: bool  # an elementwise producer fused into its reduction (GPU input fusion)
    kernel_roots: bool = False  # kernels counted as XLA:GPU fuses (`_fusion_kernels`), not one per node


# CPU, measured on the 2-core CI machine (docs/planner.md): the seed's sin/cos runs 1.8x faster with its
# cos batched out of the loop (XLA:CPU splits a big batched op over the cores, never a loop step's small
# one), and XLA:CPU materializes an elementwise result before the reduction that reads it.
CPU = Machine("cpu", flops=4.0e10, bandwidth=8.0e9, step=1.5e-6, launch=2.0e-7, transcendental=12,
              in_loop=2.0, cache_bandwidth=6.4e10, stack_bandwidth=3.0e9, fuses_reductions=False)   # (but for chains without transcendentals)
# GPU: measured on an H200 (JAX 0.11.2; `benchmarks/calibrate.py`, `benchmarks/planner_backend.py`;
# docs/planner.md). A loop step there is bound by kernel launches, not bytes: about 3 us of loop control
# and 3 us per kernel the body runs. Moving a reduction into a loop body adds a kernel per step (XLA:GPU
# does not fuse the accumulation with the producer of the carry it reads), so the fused RNN + MSE ran
# 2x slower forward there than the stacked-then-reduced original: counting kernels as fusions is what
# lets the planner see it.
GPU = Machine("gpu", flops=4.0e14, bandwidth=2.0e12, step=3.0e-6, launch=3.0e-6, transcendental=4,
              in_loop=1.0, cache_bandwidth=2.0e12, stack_bandwidth=2.0e12, fuses_reductions=True,
              kernel_roots=True)
@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value):
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


_PLANNED_FOR: contextvars.ContextVar = contextvars.ContextVar("jaxform_planned_for", default=None)


@contextlib.contextmanager
def planning_for(backend: str):
    """Plan with `backend`'s cost constants whatever JAX's default backend is: tests, and a program
    traced here for another machine (`with planning_for("gpu"): optimize(f)(x)` decides as on a GPU)."""
    if backend not in ("cpu", "gpu", "cuda", "rocm", "tpu"):
        raise ValueError(f"jaxform: planning_for({backend!r}): a JAX backend name is expected, 'cpu' or 'gpu' "
                         "(also 'cuda', 'rocm', 'tpu', which plan with the GPU's constants).")
    with _setting(_PLANNED_FOR, CPU if backend == "cpu" else GPU):
        yield


def forced_machine() -> Machine | None:
    """The machine `planning_for` set, if any (part of `optimize`'s cache key)."""
    return _PLANNED_FOR.get()


_DEVICE_MEMORY: contextvars.ContextVar = contextvars.ContextVar("jaxform_device_memory", default=None)


@contextlib.contextmanager
def device_memory_limit(nbytes: int):
    """Plan as if the device held `nbytes` (what `memory="auto"` fits a straight-line gradient into):
    tests, and planning for a smaller device than this one. Like `planning_for`, it is read when a
    function is traced: a function `jax.jit` traced already keeps its program."""
    if not isinstance(nbytes, (int, np.integer)) or isinstance(nbytes, bool) or nbytes <= 0:
        raise ValueError(f"jaxform: device_memory_limit({nbytes!r}): a positive number of bytes is expected.")
    with _setting(_DEVICE_MEMORY, int(nbytes)):
        yield


def device_memory() -> int | None:
    """Bytes the default device holds: `device_memory_limit`'s, else the allocator's limit (GPU, TPU),
    else the host's RAM (CPU); None where neither is known."""
    forced = _DEVICE_MEMORY.get()
    if forced is not None:
        return forced
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # noqa: BLE001 - a backend without memory stats (CPU): the host's RAM below
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


_FIRST_ARGUMENT: contextvars.ContextVar = contextvars.ContextVar("jaxform_first_argument", default=None)
_ASKED: contextvars.ContextVar = contextvars.ContextVar("jaxform_asked_gradient", default=None)
_KNOWN: contextvars.ContextVar = contextvars.ContextVar("jaxform_gradient_known", default=False)
_BEHIND_JIT: contextvars.ContextVar = contextvars.ContextVar("jaxform_gradient_behind_jit", default=False)


@contextlib.contextmanager
def first_argument_is(inputs, asked: str | None = None, known: bool = False, behind_jit: bool = False):
    """`optimize` tells the planner which program inputs the gradient a byte budget must fit differentiates,
    besides the full one: the traced function's first argument (what `jax.grad(f)` takes by default), or,
    under `jax.grad(..., argnums)`, the inputs it differentiates; `asked` names that gradient for warnings.
    known: traced under that gradient (its inputs are JVP tracers), so it is the only one this trace runs and
    a budget need not compile the gradient w.r.t. every float input too (a third of a budget's compiles).
    behind_jit: traced under `jax.jit` with the use unknown, so a gradient, if any, is JAX's of the jitted call
    (`jax.grad(jax.jit(f))`, whose residuals JAX's partial evaluation decides): a budget is measured on that
    program, not the inlined one (9320 B against 8806 B, round 15's F)."""
    with _setting(_FIRST_ARGUMENT, inputs), _setting(_ASKED, asked), _setting(_KNOWN, known), \
            _setting(_BEHIND_JIT, behind_jit):
        yield


_TRACED: contextvars.ContextVar = contextvars.ContextVar("jaxform_traced_program", default=None)


@contextlib.contextmanager
def traced_program(closed):
    """The planner tells a budget the program as traced, where the pipeline before `remat_program` only cleans
    it up (a loop-free plan): its gradient is the baseline a candidate must beat ("never bigger than jax.jit"),
    and the final guard measures that same program, so the budget's first compile is the guard's (nanoGPT at
    50%: 7 compiles -> 6)."""
    with _setting(_TRACED, closed):
        yield


def traced_baseline(closed):
    """The traced program standing in for `closed` as a budget's baseline, where the planner named one with
    the same inputs (`traced_program`); else `closed`."""
    traced = _TRACED.get()
    if traced is None or traced is closed or list(traced.in_avals) != list(closed.in_avals) or \
            list(traced.out_avals) != list(closed.out_avals):
        return closed
    return traced


def gradient_known() -> bool:
    return _KNOWN.get()


def gradient_behind_jit() -> bool:
    return _BEHIND_JIT.get()


def first_argument():
    return _FIRST_ARGUMENT.get()


ASKED_ARGNUMS = "the gradient jax.grad takes here (w.r.t. the arguments it differentiates)"
ASKED_CLOSED_OVER = "the gradient jax.grad takes here (w.r.t. the values the function closes over)"


def asked_gradient() -> str | None:
    return _ASKED.get()


_BATCHED: contextvars.ContextVar = contextvars.ContextVar("jaxform_gradient_batched", default=None)


@contextlib.contextmanager
def gradient_batched(steps: tuple = (), before_gradient: bool = False):
    """`optimize` tells the memory passes that the gradient runs batched, `jax.vmap(jax.grad(f))` (per-example
    gradients): a budget is for the batched program, not one example's (attack round 10: fitted to one
    example's 19648 B, the batched gradient took 139200 B against a 106675-byte budget). `steps`: each
    `jax.vmap`'s (in_axes per input, size), innermost first (nested vmaps: fitted to the inner batch of 2, a
    budget ran 2x over it silently, round 23's C). before_gradient: the vmap comes first, `jax.grad` of a batched
    loss (`jax.grad(lambda p: jax.vmap(f)(p, xs).sum())`): the gradient of the batched program runs, not the
    batched gradient (a warning quoted per-example gradients' 0.89 MiB where 1.26 MiB ran, round 23's D)."""
    steps = tuple((tuple(axes), int(size)) for axes, size in steps)
    with _setting(_BATCHED, (steps, bool(before_gradient)) if steps else None):
        yield


def batched_gradient():
    """(steps, before_gradient) of the `jax.vmap`s the gradient runs under (`gradient_batched`), or None."""
    return _BATCHED.get()


_ARGUMENTS: contextvars.ContextVar = contextvars.ContextVar("jaxform_arguments", default=())


@contextlib.contextmanager
def arguments_are(inputs: tuple):
    """`optimize` tells the planner which program inputs each positional argument is: under jit the call's
    use is unknown, and `jax.grad(f, argnums=k)` for any k must be no bigger than plain's (the final guard)."""
    with _setting(_ARGUMENTS, tuple(inputs)):
        yield


def arguments() -> tuple:
    return _ARGUMENTS.get()


def planning_key() -> tuple:
    """What `planning_for` and `device_memory_limit` set: part of `optimize`'s cache key."""
    return forced_machine(), _DEVICE_MEMORY.get()


def machine(backend: str | None = None) -> Machine:
    """The cost constants of `backend` (default: `planning_for`'s, else JAX's default backend); TPU uses
    the GPU's."""
    forced = _PLANNED_FOR.get()
    if backend is None and forced is not None:
        return forced
    return CPU if (backend or jax.default_backend()) == "cpu" else GPU


@dataclass(frozen=True)
class Estimate:
    """A predicted program cost: XLA temp bytes and seconds, forward and (where asked) under grad."""
    temp_bytes: float
    seconds: float
    grad_temp_bytes: float | None = None
    grad_seconds: float | None = None

    def __str__(self) -> str:
        g = "" if self.grad_temp_bytes is None else \
            f", grad {_fmt(self.grad_temp_bytes)} / {self.grad_seconds * 1e3:.3g} ms"
        return f"{_fmt(self.temp_bytes)} / {self.seconds * 1e3:.3g} ms{g}"


def _fmt(n: float) -> str:
    for unit, k in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= k:
            return f"{n / k:.1f} {unit}"
    return f"{int(n)} B"


def has_loops(g: Graph) -> bool:
    return any(n.name in LOOPS or _jax.scan3_loop(n.params) is not None for n, _ in g.walk())


# ---- memory ------------------------------------------------------------------------

def _materialized(v: Value, m: Machine) -> bool:
    """Is `v` a buffer of its own? Not if XLA fuses its producer into every consumer."""
    p = v.producer
    if p is None or v.is_output or p.name not in FUSIBLE:
        return True
    into_reduction = m.fuses_reductions or not _transcendental_chain(v)
    consumers = FUSED_CONSUMER if into_reduction else FUSIBLE
    return not all(u.name in consumers for u in v.users)


def _transcendental_chain(v: Value, depth: int = 8) -> bool:
    """Does the fused elementwise chain computing `v` contain a transcendental? (XLA:CPU then keeps the
    chain out of the reduction reading it: measured, `mean((y - cos(x)) ** 2)` holds a buffer.)"""
    p = v.producer
    if p is None or p.name not in FUSIBLE or depth == 0:
        return False
    return p.name in TRANSCENDENTAL or any(_transcendental_chain(u, depth - 1) for u in p.inputs)


UPDATES = frozenset({"dynamic_update_slice", "scatter", "scatter-add"})


def _updated_in_place(body: Graph, i: int, j: int) -> bool:
    """Is carry j (body input i) a buffer the step only updates (a chain of dynamic_update_slice / scatter
    on it)? XLA then updates the loop's one copy in place instead of double-buffering it (measured: a
    for_loop's 100k-row buffer costs one copy, 390.8 KiB)."""
    v, inner = body.outputs[j], body.inputs[i]
    while v is not inner:
        p = v.producer
        if p is None or p.name not in UPDATES or not v.aval.ndim:
            return False
        v = p.inputs[0]
    return body.outputs[j] is not inner


def node_temp(n: Node, m: Machine) -> float:
    """Bytes a node needs while it runs, besides its operands and results."""
    if n.name == "scan":
        body = n.regions["body"]
        nc, nk = n.params["num_consts"], n.params["num_carry"]
        carry = sum(value_bytes(v) * (1 if _updated_in_place(body, nc + j, j) else 2)
                    for j, v in enumerate(n.inputs[nc:nc + nk]))
        return carry + temp_bytes(body, m)
    if n.name == "while":
        carry = sum(value_bytes(v) for v in n.outputs)
        return 2 * carry + max((temp_bytes(g, m) for g in n.subgraphs()), default=0.0)
    return max((temp_bytes(g, m) for g in n.subgraphs()), default=0.0)


def temp_bytes(g: Graph, m: Machine | None = None) -> float:
    """Peak bytes of `g`'s intermediates alive at once (inputs, constants and outputs excluded)."""
    m = m or machine()
    order = producers_first(g.nodes)
    root: dict[int, int] = {}          # a bitcast's result is its operand's buffer (XLA aliases it)
    for n in order:
        if n.name in BITCAST and n.inputs and not n.inputs[0].is_literal and n.params.get("dimensions") is None:
            root[n.outputs[0].id] = root.get(n.inputs[0].id, n.inputs[0].id)
    rid = lambda v: root.get(v.id, v.id)   # noqa: E731
    last: dict[int, int] = {}
    for i, n in enumerate(order):
        for v in n.inputs:
            last[rid(v)] = i
    live = peak = 0.0
    sizes: dict[int, float] = {}
    for i, n in enumerate(order):
        made = 0.0
        for o in n.outputs:
            if o.id not in root and not o.is_output and o.uses and _materialized(o, m):
                sizes[o.id] = b = value_bytes(o)
                made += b
        peak = max(peak, live + made + node_temp(n, m))
        live += made
        for r in {rid(v) for v in n.inputs}:
            if last.get(r) == i and r in sizes:
                live -= sizes.pop(r)
    return peak


# ---- time --------------------------------------------------------------------------

def _size(v: Value) -> int:
    return int(np.prod(getattr(v.aval, "shape", ()) or (1,)))


def _kernels(g: Graph, m: Machine, stacked_from: int | None = None) -> int:
    """Kernels one run of `g` launches: each unfused node, plus one for the fused elementwise code
    (`m.kernel_roots`: as XLA:GPU fuses, `_fusion_kernels`)."""
    if m.kernel_roots:
        return _fusion_kernels(g, stacked_from)
    return 1 + sum(1 for n in g.nodes if n.name not in FUSIBLE)


# What XLA:GPU fuses into one loop fusion with elementwise code (slices read in place, updates written in place).
GPU_FUSIBLE = FUSIBLE | IN_PLACE | frozenset({"slice", "pad", "concatenate", "rev", "stop_gradient"})


def _fusion_kernels(g: Graph, stacked_from: int | None = None) -> int:
    """Kernels of `g` as XLA:GPU fuses it: one per node that fuses with nothing (a matmul, a sort, a
    reduction, which also absorbs the elementwise producers only it reads), one per root of fused
    elementwise code (a value the graph returns, or one an unfused node other than a reduction reads:
    XLA does not merge the fusion making a loop's carry with one reading it), and one copy per stacked
    result (outputs from `stacked_from` on) that no fusion writes in place."""
    count = 0
    for n in g.nodes:
        if n.name in CALL_LIKE and n.subgraphs():
            count += sum(_fusion_kernels(s) for s in n.subgraphs())
        elif n.name not in GPU_FUSIBLE:
            count += 1
        elif any(u is None or (u.name not in GPU_FUSIBLE and u.name not in AXES_REDUCTIONS)
                 for o in n.outputs for u, _ in o.uses):
            count += 1
    if stacked_from is not None:
        count += sum(1 for v in g.outputs[stacked_from:]
                     if v.producer is None or v.producer.name not in GPU_FUSIBLE | CALL_LIKE)   # calls are inlined
    return max(count, 1)


def node_seconds(n: Node, m: Machine, in_loop: bool = False) -> float:
    """Seconds of one node; `in_loop`: it runs in a loop step (slower arithmetic, operands in cache)."""
    if n.name == "scan":
        body = n.regions["body"]
        nk = n.params["num_carry"]
        stacked = sum(value_bytes(v) for v in body.outputs[nk:]) / m.stack_bandwidth
        return n.params["length"] * (seconds(body, m, True) + stacked + m.step + m.launch * _kernels(body, m, nk))
    if n.name == "while":
        return sum(seconds(g, m, True) + m.step + m.launch * _kernels(g, m) for g in n.subgraphs())
    if n.name == "cond":
        return max((seconds(g, m, in_loop) for g in n.subgraphs()), default=0.0)
    subs = list(n.subgraphs())
    if subs:
        return sum(seconds(g, m, in_loop) for g in subs)
    out = sum(_size(o) for o in n.outputs)
    if n.name in MATMULS:
        flops = _contraction_flops(n, out)
    elif n.name in TRANSCENDENTAL:
        flops = max(m.transcendental, HEAVY.get(n.name, 0) if m.name == "cpu" else 0) * out
    elif n.name in IN_PLACE:
        flops = _size(n.inputs[1]) if n.name == "dynamic_update_slice" else out
    else:
        flops = out
    if in_loop and n.name in IN_PLACE:
        # a loop step reads or writes one slice of a carried buffer in place (XLA aliases the carry):
        # what moves is the slice, not the buffer (a for_loop's `r[i + 1] += r[i]` on 100k rows); a write
        # costs what a stacked result's row costs (XLA writes a scan's ys with this same update)
        if n.name == "dynamic_update_slice":
            return value_bytes(n.inputs[1]) / m.stack_bandwidth
        return max(m.in_loop * flops / m.flops, 2.0 * value_bytes(n.outputs[0]) / m.cache_bandwidth)
    moved = sum(value_bytes(o) for o in n.outputs if _materialized(o, m))
    moved += sum(value_bytes(v) for v in {v.id: v for v in n.inputs}.values()
                 if n.name not in FUSIBLE or v.producer is None or _materialized(v, m))   # fused ones stay in registers
    if in_loop:
        return max(m.in_loop * flops / m.flops, moved / m.cache_bandwidth)
    return max(flops / m.flops, moved / m.bandwidth)


def seconds(g: Graph, m: Machine | None = None, in_loop: bool = False) -> float:
    m = m or machine()
    return sum(node_seconds(n, m, in_loop) for n in g.nodes)


# ---- whole programs -----------------------------------------------------------------

def xla_temp(closed) -> int:
    """XLA's temp bytes for `closed` (compiled here: seconds for a big program): what the model predicts,
    measured, where a decision is worth a compile."""
    fn = jax.jit(functools.partial(_jax.eval_jaxpr, closed))
    return fn.lower(*[_jax.spec_of(a) for a in closed.in_avals]).compile().memory_analysis().temp_size_in_bytes


def estimate(closed, *, grad: bool = True, m: Machine | None = None) -> Estimate:
    """Predicted XLA temp bytes and time of `closed`, and with grad=True of its gradient program."""
    m = m or machine()
    g = Graph.from_jaxpr(closed)
    gt = gs = None
    if grad:
        gp = gradient_program(closed)
        if gp is not None:
            gg = Graph.from_jaxpr(gp)
            gt, gs = temp_bytes(gg, m), seconds(gg, m)
    return Estimate(temp_bytes(g, m), seconds(g, m), gt, gs)
