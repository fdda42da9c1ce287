"""What the machine reports about a candidate program: XLA's temp bytes and its run time.

The cost model (`plan.cost`) predicts; this module asks. Memory is `memory_analysis()` of the compiled
program (what XLA will allocate, exactly). Time is the min of interleaved runs of two compiled candidates
on the call's inputs (random ones of the same shapes where the call is traced under `jit` and has no
values): a ratio between the two, as a decision needs, not an absolute figure. A program with a `while`
loop is timed only on the call's own values (its trip count may depend on them).

Answers are cached in memory for the process and on disk (`JAXFORM_TUNE_CACHE`, default
`~/.cache/jaxform/tune`), keyed like JAX's compilation cache: the module XLA compiles and the constants'
bytes, backend, device kind, JAX version, XLA flags and configuration; in memory, by the identity rule
(`ir.identity.structure`), never by a jaxpr's printed text. The cache holds measurements, never programs: a stale or
colliding entry can only pick the slower or bigger of two correct programs, never a wrong one.

A `Budget` bounds what one plan spends here (compiles and runs); past it, decisions fall back to the
model and say so.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from .. import _jax
from ..ir import Graph
from ..ir.identity import UNSHARED, is_impure, program_identity

REPS = 7              # timing rounds for two cheap programs (interleaved; the min of each is kept)
RUN_SECONDS = 0.25    # ... a program running longer than this gets MIN_REPS samples, its warm-up one of them
MIN_REPS = 2
NOISE = 0.05          # two measured times closer than this are a tie (the machine's noise, 2 loaded cores)
MARGINAL = 0.5        # a ratio between NOISE and this is timed again before it is believed (min of both),
                      # within what is left of the budget (`_interleaved` checks)
SETTLE_ROUNDS = 3     # ... and, cached, timed again by later plans until this many processes measured it;
CHEAP_SECONDS = 0.02  # so is a cached tie of two programs this fast (a verdict from one loaded moment: the
                      # Flax RNN's remat cached at 0.97x plain, 0.79x timed afresh, and the plan ran 1.32x)
TIMING = "t2"         # how times are taken, in their cache key: verdicts timed another way are timed again
SAMPLE_SECONDS = 2e-3  # one timing sample runs a fast program this long (several calls), so timer noise fades
BUDGET_SECONDS = 5.0  # what running candidates may take per deciding pass (compiles apart), at least ...
BUDGET_COMPILES = 8   # ... or this many times the traced program's own compile, whichever is more
BUDGET_RUNS = 12      # ... or this many runs of the slowest program timed (a loop run thousands of times in
                      # training pays a dozen runs once per decision; the disk cache makes it once per machine)
MEMORY_COMPILES = 24  # compiling for XLA's memory (what "never bigger" rests on) may spend this many


def cache_dir() -> str:
    return os.environ.get("JAXFORM_TUNE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jaxform", "tune"))


def enabled() -> bool:
    """JAXFORM_MEASURE=0 plans on the model alone (deterministic decisions, no compiles)."""
    return os.environ.get("JAXFORM_MEASURE", "1") != "0"


def timing() -> bool:
    """JAXFORM_MEASURE=memory asks XLA for memory but times nothing (decisions on time are the model's:
    deterministic, what the test suite runs under); the default also times."""
    return os.environ.get("JAXFORM_MEASURE", "1") not in ("0", "memory")


@dataclass
class Budget:
    """What one plan may spend measuring, and what it spent (reported by `explain`)."""
    seconds: float | None = BUDGET_SECONDS   # None: BUDGET_COMPILES x the first compile (at least BUDGET_SECONDS)
    spent: float = 0.0
    compiles: int = 0
    timed: int = 0
    from_cache: int = 0
    exhausted: bool = False
    refused: int = 0     # pairs left untimed because the allowance was spent (not for any other reason)
    _memo: dict = field(default_factory=dict, repr=False)

    compile_spent: float = 0.0
    first_compile: float | None = None
    longest_compile: float = 0.0    # the compile allowance's yardstick (`allows_compile`)
    decision_start: float = 0.0     # running time spent before the decision now measured (`next_decision`)
    ran_out: bool = False           # some earlier decision was left to the model

    def next_decision(self) -> None:
        """Each deciding pass gets the whole allowance of running time: on the demo's 0.7 s gradient, fusion
        timed in two views spent it, and its remat, the decision the demo is about, was left to a model that
        is 1.5x off on loops (0.80x predicted; measured 0.77x-1.35x from run to run). Compiling keeps one allowance."""
        self.ran_out |= self.exhausted
        self.exhausted = False
        self.decision_start = self.spent - self.compile_spent

    def running(self) -> float:
        """Running time this decision has spent (compiles apart)."""
        return self.spent - self.compile_spent - self.decision_start

    def allows_compile(self) -> bool:
        """Compiling for memory has its own, larger allowance: the model's bytes are a last resort."""
        if self.first_compile is None or math.isinf(self.seconds or 0.0):
            return True
        # (scaled by the longest compile of the plan, not its first: in the demo the first was a program JAX had
        # compiled already for explain, 5 s of allowance ran out before remat, which was left untimed)
        return self.compile_spent < max(BUDGET_SECONDS, MEMORY_COMPILES * self.longest_compile)

    def allows(self) -> bool:
        """May another pair be timed? Running time counts against `seconds`; compiling has its own allowance."""
        if self.seconds is not None and self.running() >= self.seconds:
            self.exhausted = True
        return not self.exhausted

    def __str__(self) -> str:
        return (f"{self.compiles} candidate program(s) compiled, {self.timed} pair(s) timed, "
                f"{self.from_cache} answer(s) from the cache, {self.spent:.2f} s measuring"
                + (" (budget spent: the rest decided by the model)" if self.exhausted or self.ran_out else ""))


def _machine_key() -> str:
    """The machine and every setting XLA compiles under: the backend, JAX, XLA_FLAGS, and the configuration
    jax.jit keys its own caches on (x64, threefry_partitionable, ...: not in a program's text, yet they
    change what it compiles to; a legacy-key RNG scan: 101648 B or 35968 B)."""
    dev = jax.devices()[0]
    config = [r for x in _jax.trace_context() if " at 0x" not in (r := repr(x))]   # (no addresses: stable)
    return "|".join([jax.default_backend(), getattr(dev, "device_kind", ""), jax.__version__,
                     os.environ.get("XLA_FLAGS", ""), str(jax.config.jax_enable_x64),
                     str(getattr(jax.config, "jax_threefry_partitionable", "")), *config])


LOCAL = "local-"             # a key never written to or read from the disk
_local = itertools.count()
HOST_CALLBACKS = frozenset({"pure_callback", "io_callback", "debug_callback", "debug_print"})


@dataclass
class _Program:
    """One candidate as XLA sees it: named by `key`, lowered and compiled on demand, once per plan."""
    closed: object
    key: str
    lowered: object = None
    compiled: object = None
    for_memory: object = None     # compiled for `memory_analysis()` alone (`MEMORY_ONLY_OPTIONS`)


KEYS_KEPT = 512           # programs whose disk key this process remembers (lowering one again costs ~4% of
_keys: collections.OrderedDict = collections.OrderedDict()  # a compile; the memory passes ask again and again)
KEYS_CONST_BYTES = 1 << 20  # ... only where its constants are this small: the key holds them (by identity), and a
                            # closed-over model's weights must not outlive the user's last reference


def _const_bytes(closed) -> float:
    try:
        return sum(int(np.prod(np.shape(c))) * np.dtype(getattr(c, "dtype", np.float32)).itemsize
                   if not _jax.is_typed_key(c) else 0 for c in closed.consts)
    except TypeError:       # (an extended dtype numpy cannot size: not remembered)
        return math.inf


def _program(closed, budget: Budget) -> _Program:
    graph = Graph.from_jaxpr(closed)
    ident = program_identity(graph, closed)
    ident = (ident, _machine_key())        # (lowered under another context, it is another program: round 12)
    prog = budget._memo.get(ident)
    if prog is None:
        prog = _Program(closed, _keys.get(ident))
        if prog.key is None:      # (lowering may raise, e.g. a sharded program: then nothing is remembered)
            prog.key = _key_of(_lowered(prog, budget), closed, graph)
            if ident[0][0] != UNSHARED and _const_bytes(closed) <= KEYS_CONST_BYTES:
                _keys[ident] = prog.key     # (an unshared id may be reused once the program is gone)
            if len(_keys) > KEYS_KEPT:
                _keys.popitem(last=False)
        else:
            _keys.move_to_end(ident)
        budget._memo[ident] = prog
    return prog


def _lowered(prog: _Program, budget: Budget):
    if prog.lowered is None:
        t0 = time.perf_counter()
        prog.lowered = jax.jit(functools.partial(_jax.eval_jaxpr, prog.closed)).lower(
            *[_jax.spec_of(a) for a in prog.closed.in_avals])
        took = time.perf_counter() - t0
        budget.spent += took
        budget.compile_spent += took
    return prog.lowered


def _key_of(lowered, closed, graph: Graph) -> str:
    """The disk cache's key, like JAX's persistent compilation cache: the module XLA compiles, every
    constant's bytes, and the machine. Never the jaxpr's printed text, which JAX prints alike for two
    different callbacks. A module calling back into Python names its callback by an index, not by the
    function: like JAX, such a program is never shared through the disk (its key is this process's own)."""
    if any(n.name in HOST_CALLBACKS for n, _ in graph.walk()):
        return f"{LOCAL}{os.getpid()}-{next(_local)}"
    h = hashlib.sha256(lowered.as_text().encode())
    for c in closed.consts:
        with jax.ensure_compile_time_eval():    # a concrete key's bits, even while an outer jit traces
            a = np.asarray(_jax.key_data(c) if _jax.is_typed_key(c) else c)
        h.update(str(getattr(c, "dtype", "")).encode())     # (a typed key: its impl, then its bits)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(_machine_key().encode())
    return h.hexdigest()


def program_key(closed, budget: Budget | None = None) -> str:
    """The disk cache's key of `closed` (see `_key_of`); lowered once per `budget`."""
    return _program(closed, budget if budget is not None else Budget(math.inf)).key


def _disk(key: str, value=None):
    if key.startswith(LOCAL):
        return value
    path = os.path.join(cache_dir(), key[:2], key + ".json")
    if value is None:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(value, f)
    except OSError:
        pass
    return value


# ---- a progress line: planning that takes a while says so while it runs (like JAX's "compiling" log) ----------

MADE_UP_BYTES = 1 << 30    # inputs made up to time a program under jit: beyond this the model times it
# (training_memory.py's 100000-step RNN, compiled only, asked numpy for 24.4 GiB of float64 and raised)
PROGRESS_SECONDS = 5.0     # planning longer than this says so, once, on the `jaxform` logger
_clock: list = []          # [(started, where, compiles so far, said)] of the plans running (nested: innermost last)


@contextlib.contextmanager
def planning(where: str):
    """Time a plan of `where`; `_tick` (each candidate compiled) says once that it is still planning. Yields
    [started, where, compiles, said]: the compiles of every decision made meanwhile (a budget's too)."""
    _clock.append(clock := [time.perf_counter(), where, 0, False])
    try:
        yield clock
    finally:
        _clock.pop()


def _tick() -> None:
    if not _clock:
        return
    c = _clock[-1]
    c[2] += 1
    took = time.perf_counter() - c[0]
    if not c[3] and took > PROGRESS_SECONDS:
        c[3] = True
        logging.getLogger("jaxform").warning(
            "jaxform: planning %s: %.0f s so far, %d candidate program(s) compiled (XLA measures each one's memory "
            "and time; the answers are cached on disk for the next run). jaxform.explain(fn, *args) lists the "
            "decisions; JAXFORM_MEASURE=0 plans on the cost model alone.", c[1] or "a program", took, c[2])


def measurable(closed) -> bool:
    """Can this program be compiled here on its own (no tracer constants of an enclosing transformation)?"""
    return not any(isinstance(c, _jax.Tracer) for c in closed.consts)


# Compiling for memory alone: XLA:CPU's buffers are assigned on the HLO, before LLVM, so its backend
# optimizations change the code, not `memory_analysis()`: equal to the byte on 24 programs (the loop programs,
# GPT, U-Net, ResNet, LSTM LM, their checkpointed gradients) on JAX 0.10.2 and 0.12, at 0.57x the compile time
# (`test_measured.py` keeps checking it). A program to be timed is compiled as jax.jit would.
MEMORY_ONLY_OPTIONS = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _memory_only_options() -> dict | None:
    return MEMORY_ONLY_OPTIONS if jax.default_backend() == "cpu" else None


def _compiled(closed, budget: Budget, memory_only: bool = False):
    """`closed` compiled, once per plan; `memory_only`: for its `memory_analysis()` alone (see above), kept
    only until a timing needs the program as jax.jit compiles it."""
    prog = _program(closed, budget)
    if prog.compiled is None and not (memory_only and prog.for_memory is not None):
        lowered = _lowered(prog, budget)
        options = _memory_only_options() if memory_only else None
        t0 = time.perf_counter()
        try:
            out = lowered.compile(options) if options else lowered.compile()
        except Exception:  # noqa: BLE001 - options this XLA does not know: as jax.jit compiles
            options, out = None, lowered.compile()
        if options:
            prog.for_memory = out
        else:
            prog.compiled, prog.for_memory = out, None     # (its memory is this one's: one executable kept)
        budget.compiles += 1
        _tick()
        took = time.perf_counter() - t0
        budget.spent += took
        budget.compile_spent += took
        if budget.first_compile is None:
            budget.first_compile = took
        budget.longest_compile = max(budget.longest_compile, took)
        if budget.seconds is None:
            budget.seconds = max(BUDGET_SECONDS, BUDGET_COMPILES * took)
    return prog.compiled if prog.compiled is not None or not memory_only else prog.for_memory


def compile_seconds(closed) -> float:
    """Wall time of one compile of `closed` (the yardstick the budget is scaled by)."""
    t0 = time.perf_counter()
    jax.jit(functools.partial(_jax.eval_jaxpr, closed)).lower(
        *[_jax.spec_of(a) for a in closed.in_avals]).compile()
    return time.perf_counter() - t0


def temp_bytes(closed, budget: Budget, memory_only: bool = False) -> int | None:
    """XLA's temp bytes of `closed`, from the caches or compiled now; None if it cannot be compiled here.
    `memory_only`: no one will time it (a budget's candidates, a plan that times nothing), so it is compiled
    for its memory alone (`MEMORY_ONLY_OPTIONS`), else as jax.jit compiles it, once for both."""
    if closed is None or not measurable(closed):
        return None
    try:
        key = program_key(closed, budget)
    except Exception:  # noqa: BLE001 - a program that cannot be lowered alone: the model decides
        return None
    hit = _disk(key)
    if hit is not None and "temp" in hit:
        budget.from_cache += 1
        return int(hit["temp"])
    if not budget.allows_compile():
        budget.exhausted = True
        return None
    try:
        temp = int(_compiled(closed, budget, memory_only).memory_analysis().temp_size_in_bytes)
    except Exception:  # noqa: BLE001 - a backend that cannot compile it alone: the model decides
        return None
    _disk(key, {"temp": temp})
    return temp


def impure(closed) -> bool:
    """Does running `closed` have effects (callbacks, RNG state, refs)? Then it is never run to be timed."""
    memo: dict = {}
    return bool(closed.effects) or any(is_impure(n, memo) for n, _ in Graph.from_jaxpr(closed).walk())


def has_while(closed) -> bool:
    return any(n.name == "while" for n, _ in Graph.from_jaxpr(closed).walk())


def _inputs(closed, example_args):
    avals = closed.in_avals
    if example_args is not None and len(example_args) == len(avals) and \
            all(isinstance(x, (jax.Array, np.ndarray, np.generic)) and not isinstance(x, _jax.Tracer)
                for x in example_args) and \
            all(tuple(np.shape(x)) == tuple(a.shape) for x, a in zip(example_args, avals)):
        return list(example_args), True
    if any(_jax.is_typed_key(a) for a in avals) or \
            sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in avals) > MADE_UP_BYTES:
        return None, False      # (no key made up here, nor gigabytes: the model times such a program)
    rng = np.random.default_rng(0)
    out = []
    for a in avals:
        if jax.numpy.issubdtype(a.dtype, np.inexact):
            out.append((rng.standard_normal(a.shape, np.float32) * 0.5).astype(a.dtype))
        else:
            out.append(np.zeros(a.shape, a.dtype))
    return out, False


def seconds(before, after, budget: Budget, example_args=None) -> tuple[float, float] | None:
    """(seconds of `before`, of `after`), interleaved min-of-N on the same inputs; None where they cannot
    be timed here (no values for a while loop's trip count, tracer constants, the budget spent)."""
    if before is None or after is None or not (measurable(before) and measurable(after)):
        return None
    if impure(before) or impure(after):
        return None      # running it would run the user's callbacks: planning must not
    try:
        keys = program_key(before, budget), program_key(after, budget)
        key = hashlib.sha256((TIMING + "".join(keys)).encode()).hexdigest()
        key = LOCAL + key if any(k.startswith(LOCAL) for k in keys) else key
    except Exception:  # noqa: BLE001 - a program that cannot be lowered alone: the model times it
        return None
    hit = _disk(key)
    if hit is not None and "seconds" in hit:
        budget.from_cache += 1
        if not _unsettled(hit) or key in _timed_here:     # (a round is a process: once each)
            return tuple(hit["seconds"])
    if not budget.allows():
        budget.refused += 1
        return None if hit is None or "seconds" not in hit else tuple(hit["seconds"])
    args, real = _inputs(before, example_args)
    if args is None or not real and (has_while(before) or has_while(after)):
        return None if hit is None or "seconds" not in hit else tuple(hit["seconds"])
    try:
        with jax.ensure_compile_time_eval():    # run here, even while an enclosing jit traces the call
            fns = [_compiled(before, budget), _compiled(after, budget)]
            best = _interleaved(fns, args, budget)
            if best is None:
                budget.refused += 1
                return None if hit is None or "seconds" not in hit else tuple(hit["seconds"])
            r = best[1] / best[0]
            if _close(r):   # close: again, keep the min (a long program too: its first round is two samples,
                # one the warm-up; the demo's 1 s gradient timed remat 0.9x-1.35x from one process to the next)
                again = _interleaved(fns, args, budget, known=best)
                best = best if again is None else [min(a, b) for a, b in zip(best, again)]
    except Exception:  # noqa: BLE001 - a program that cannot run on its own (sharding, callbacks)
        return None
    rounds = 1
    if hit is not None and "seconds" in hit:          # a near-tie timed again in a later plan: the min of all
        best, rounds = [min(a, b) for a, b in zip(best, hit["seconds"])], hit.get("rounds", 1) + 1
    _disk(key, {"seconds": list(best), "rounds": rounds})
    _timed_here.add(key)
    return tuple(best)


# the pairs this process timed: an unsettled cached verdict is timed again once per process, so that
# SETTLE_ROUNDS counts processes (one plan timed a near-tie six times and settled it alone: round 16's C)
_timed_here: set = set()


def _close(r: float) -> bool:
    """A ratio outside the noise but near enough that one process's measurement may not be the machine's."""
    return 1 + NOISE < max(r, 1 / r) < 1 + MARGINAL


def _unsettled(hit: dict) -> bool:
    """A cached near-tie measured in fewer than SETTLE_ROUNDS processes: timed again (a verdict taken on a
    loaded moment would otherwise stand forever), the min of every round kept; so is a tie of two cheap
    programs (CHEAP_SECONDS: a few milliseconds to time again, and a wrong tie lets near-ties add up)."""
    a, b = hit["seconds"]
    r = b / max(a, 1e-15)
    return hit.get("rounds", 1) < SETTLE_ROUNDS and (_close(r) or max(r, 1 / r) <= 1 + NOISE and
                                                      max(a, b) < CHEAP_SECONDS)


def _interleaved(fns, args, budget: Budget, known: list[float] | None = None) -> list[float] | None:
    """Min-of-N seconds of each compiled program, rounds interleaved (the machine's drift hits all alike);
    None if, after one warm-up run each, the rounds would not fit what is left of the budget. `known`: the
    programs' times from an earlier round, in place of the warm-up (nothing runs before the budget says yes)."""
    t0 = time.perf_counter()
    first = list(known) if known is not None else []
    for f in fns if known is None else ():
        s = time.perf_counter()
        jax.block_until_ready(f(*args))
        first.append(time.perf_counter() - s)
    if budget.seconds is not None:
        budget.seconds = max(budget.seconds, BUDGET_RUNS * max(first))
    calls = max(1, min(50, int(SAMPLE_SECONDS / max(min(first), 1e-6))))
    long = max(first) > RUN_SECONDS     # a long run: MIN_REPS samples, its warm-up one of them
    reps = REPS if not long else MIN_REPS if known is not None else MIN_REPS - 1
    if budget.seconds is not None and budget.running() + (time.perf_counter() - t0) + \
            reps * sum(first) * calls > budget.seconds:
        budget.spent += time.perf_counter() - t0
        budget.exhausted = True
        return None
    best = list(first) if long and known is None else [np.inf] * len(fns)
    for _ in range(reps):
        for i, f in enumerate(fns):
            s = time.perf_counter()
            for _ in range(calls):
                out = f(*args)
            jax.block_until_ready(out)
            best[i] = min(best[i], (time.perf_counter() - s) / calls)
    budget.spent += time.perf_counter() - t0
    budget.timed += 1
    return best
