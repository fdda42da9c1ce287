"""Differential runner: every registered pass and the default pipeline on one program.

For each pipeline: run it strictly (an exception fails the check), verify the
emitted jaxpr (`check_jaxpr` + same signature, and the same output dtypes AND
weak types), then compare with the original. The round trip alone
(`ROUNDTRIP`, passes=[]) is compared too: bodies shared by printed text merged
different callbacks there. A pipeline whose output equals the round trip's
changed nothing; equality is printed text plus constants plus the *identity*
of every callable in the params (callbacks, custom rules) and every
equation's context (JAX prints distinct callbacks alike, and leaves out the
context). All distinct outputs are compared in ONE jitted probe computing, per
version, values, derivatives (forward mode where a while_loop forbids reverse
mode; none where a custom_vjp also forbids forward mode) and vmap over a
stacked batch: compiling is the cost.

Programs with host callbacks are also run per version eagerly and under jit,
recording every invocation: ordered io_callbacks and ordered debug
callbacks/prints must come in the same sequence, unordered ones as the same
multiset (JAX guarantees no order for them); pure_callbacks may be elided or
repeated by JAX, so only their results are compared. Some programs (all
x64 ones) also go through the user API: `jaxform.optimize(fn)` against
`jax.jit(fn)`, with and without x64 on the same wrapper (its cache must key
on the config), comparing values, dtypes and weak types.

Grad programs (`Program.grad`: what `optimize(jax.grad(f))` sees, a forward
scan stacking residuals and a reverse scan reading them) go through the same
checks; their derivatives are second order, forward over reverse (reverse over
reverse costs about twice the compile time, and JAX 0.10 fails it on some
programs whose first order is fine). A pass that only acts on what another made
runs after it too on grad programs (PAIRS: hoist_loop_invariants then
sum_then_pull_back), counted as "<pair>:last_changed" when the last pass changed something.

Tolerances follow the lowest precision in the program: float32 1e-5, float16
1e-2, bfloat16 5e-2 (a reassociating pass must still stay close: an f16 sum
that saturates at 2048 instead of ~5000 fails).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import io
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform import _jax, passes
from jaxform.ir import Graph
from jaxform.optimize import PassError, run_passes, verify

from fuzz import programs as _programs

STATS: collections.Counter = collections.Counter()  # "programs", "<pipeline>:changed", "has:<feature>", ...


class Mismatch(AssertionError):
    """A pass (or the API) changed a program's results; `kind` says which check, `who` which pipelines."""

    def __init__(self, kind: str, who: list[str], msg: str):
        super().__init__(f"[{kind}] {'/'.join(who)}: {msg}")
        self.kind, self.who = kind, list(who)


# Passes that only act on what an earlier pass made (on grad programs): each runs after it too, and
# "<pair>:last_changed" counts the programs where the last pass changed the earlier one's output.
# sum_then_pull_back needs the loop-invariant residual JAX recomputes per step under checkpoint to be
# a loop constant first (alone it changes no grad program of a checkpointed RNN).
PAIRS = {"hoist_loop_invariants>sum_then_pull_back": ["hoist_loop_invariants", "sum_then_pull_back"]}


def memory_pipelines() -> dict:
    """What `optimize(memory=...)` appends, per setting: while loops bounded for grad, loop planning, and
    segment checkpointing of loop-free programs. The segment schedule is forced (no XLA compiles per
    candidate, which would multiply the fuzzer's time); which one is chosen does not change values."""
    from jaxform.passes.remat_loops import with_memory as loops
    from jaxform.passes.remat_program import with_memory as program
    from jaxform.passes.while_grad import with_options as whiles
    # memory="auto" is what `while_grad` and `remat_loops` do alone (registered passes, run above)
    settings = {"memory=min": ("min", ("all", 2)), "memory=0": (0, ("nothing", 3)),
                "memory=0,recompute": (0, ("recompute", 2))}   # optimize(jax.grad(f), memory=...)
    out = {k: [whiles(m, None, "a fuzz program"), loops(m), program(m, sched)] for k, (m, sched) in settings.items()}
    out["memory=auto,small device"] = ["while_grad", "remat_loops", auto_on_a_small_device]
    return out


def auto_on_a_small_device(graph):
    """memory="auto" (the default) where the device holds the arguments, their gradients and one byte
    more: the whole "auto" path of a straight-line program (gate, budget, candidates compiled and measured
    by XLA, the recompute path for gradient programs), which a forced schedule skips."""
    import warnings
    from jaxform.ir.sizes import nbytes
    from jaxform.passes.remat_program import remat_program
    from jaxform.plan.memory import AUTO_SHARE
    from jaxform.plan.cost import device_memory_limit
    ins = sum(b for v in graph.inputs if np.isfinite(b := nbytes(v.aval)))
    with device_memory_limit(int((2 * ins + 1) / AUTO_SHARE) + 1), warnings.catch_warnings():
        warnings.simplefilter("ignore")       # "cannot fit": one byte is the point
        return remat_program(graph, memory="auto")


auto_on_a_small_device.pass_name, auto_on_a_small_device.exact = "remat_program(memory='auto', small device)", False


def pipelines(grad: bool = True) -> dict[str, list]:
    """Every registered pass alone, the default pipeline (read now: passes are added over time), each
    memory setting's passes, and, for grad programs (`grad`), the PAIRS."""
    out = {name: [name] for name in sorted(passes.PASSES)}
    out["DEFAULT"] = list(passes.DEFAULT)
    out.update(memory_pipelines())
    if grad:
        out.update((k, list(v)) for k, v in PAIRS.items() if all(p in passes.PASSES for p in v))
    return out


def _ids(jaxpr, out: list) -> list:
    """Identity of every callable in params (recursively, in equation order) and every equation context."""
    for eqn in jaxpr.eqns:
        out.append(repr(getattr(eqn, "ctx", None)))
        for _, v in sorted(eqn.params.items()):
            _param_ids(v, out)
    return out


def _param_ids(v, out):
    if hasattr(v, "eqns"):
        _ids(v, out)
    elif hasattr(v, "jaxpr") and hasattr(v, "consts"):
        _ids(v.jaxpr, out)
    elif isinstance(v, (tuple, list)):
        for x in v:
            _param_ids(x, out)
    elif callable(v) and not isinstance(v, type):
        out.append(id(getattr(v, "callback_func", v)))


def _key(closed, canonical: bool = True):
    """Identity of a program up to variable naming: text, constants, callables' identities, contexts.
    canonical: re-emit through Graph first (so that, e.g., an unread result printed `_` is no change)."""
    closed = Graph.from_jaxpr(closed).to_jaxpr() if canonical else closed
    consts = tuple((np.shape(c), str(np.asarray(c).dtype), np.asarray(c).tobytes()) for c in closed.consts)
    return str(closed.jaxpr), consts, tuple(_ids(closed.jaxpr, []))


def _tol(prog) -> tuple[float, float]:
    if "bfloat16" in prog.features:
        return 5e-2, 5e-2
    if "float16" in prog.features:
        return 1e-2, 1e-2
    if "rnn:long" in prog.features:
        # 4096-step float32 sums: two correct summation orders differ by more than 1e-5. XLA itself sums a
        # vmapped [2, 4096, 3] stack along the steps one by one (4.5e-5 off the float64 value, seed 3101), where
        # the fused, compensated carry is within an ulp. The accuracy of fused sums is tested against float64
        # in tests/passes/test_scan_reductions.py (test_long_float32_sum_is_compensated).
        return 1e-4, 1e-4
    return 1e-5, 1e-5


def _close(a, b, kind, who, what, tol):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if ta != tb:
        raise Mismatch(kind, who, f"{what}: output structure differs: {ta} vs {tb}")
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        if x.shape != y.shape or x.dtype != y.dtype:
            raise Mismatch(kind, who, f"{what}: {x.shape}/{x.dtype} vs {y.shape}/{y.dtype}")
        try:
            if np.issubdtype(x.dtype, np.inexact) or x.dtype.name == "bfloat16":
                np.testing.assert_allclose(x.astype(np.complex128 if np.iscomplexobj(x) else np.float64),
                                           y.astype(np.complex128 if np.iscomplexobj(y) else np.float64),
                                           rtol=tol[0], atol=tol[1], err_msg=what)
            else:
                np.testing.assert_array_equal(x, y, err_msg=what)
        except AssertionError as e:
            raise Mismatch(kind, who, str(e)) from None


_weights = _programs.weights


def _no_reverse(e: Exception) -> bool:
    """JAX's or jaxform's error for reverse-mode differentiation of a while loop without a bound."""
    from jaxform.passes.while_grad import WhileGradError
    return isinstance(e, WhileGradError) or "Reverse-mode differentiation does not work" in str(e)


def probe(versions, leaves, reverse: bool = True, forward: bool = True, vmap: bool = True, jit: bool = True,
          full_grad: bool = False):
    """Per flat jaxpr in `versions`: (values, derivatives, vmapped values), all in one jit.

    full_grad (programs JAX cannot reverse-differentiate: while loops): the derivatives are the whole
    gradient, by `jax.grad` where the version can (memory planning bounded its while loops) and by
    `jax.jacfwd` where not (the original): reverse mode through a bounded while checked against forward."""
    stacked = [jnp.stack([x, x * 0.5]) for x in leaves]
    tangents = tuple(jnp.ones_like(x) for x in leaves)
    argnums = tuple(range(len(leaves)))

    def one(closed, xs):
        f = lambda *a: _jax.eval_jaxpr(closed, *a)
        # A fixed, non-uniform linear functional of the outputs (its gradient is J^T w): as well conditioned as
        # the outputs themselves. (It was sum(sin(o)): an output of 24,182 one ulp apart then moved the derivative
        # by 0.5%, a mismatch of the probe, not of the pass.)
        loss = lambda *a: sum(jnp.sum(jnp.asarray(o).astype(jnp.float32) * _weights(jnp.shape(o))) for o in f(*a)
                              if jnp.issubdtype(jnp.result_type(o), jnp.floating))
        if not any(jnp.issubdtype(a.dtype, jnp.floating) for a in closed.out_avals):
            d = ()
        elif reverse:
            d = jax.grad(loss, argnums=argnums)(*xs)
        elif full_grad:
            try:
                d = jax.grad(loss, argnums=argnums)(*xs)
                STATS["while:reverse_mode_checked"] += closed is not versions[0]
            except Exception as e:  # noqa: BLE001 - only the no-reverse-mode errors fall back
                if not _no_reverse(e):
                    raise
                d = jax.jacfwd(loss, argnums=argnums)(*xs)
        elif forward:
            d = jax.jvp(loss, tuple(xs), tangents)[1]
        else:
            d = ()
        return f(*xs), d, (jax.vmap(f)(*stacked) if vmap else ())

    run = lambda *xs: [one(c, xs) for c in versions]   # noqa: E731
    return (jax.jit(run) if jit else run)(*leaves)


def _jax_disagrees_with_itself(eager_original, want, got, tol) -> bool:
    """The original program under jit is the oracle; JAX can get it wrong (seen: the jvp of a 4096-step scan
    writing a Ref, -0.66 under jit, -5.679 eagerly and in float64). Then the transformed program is compared
    with the original run eagerly instead (`eager_original()`, probed once per program), and the case is
    counted, not failed."""
    try:
        eager = eager_original()
        _close(eager, got, "values", ["eager"], "", tol)
    except Exception:
        return False
    try:
        _close(want, eager, "values", ["jit"], "", tol)
    except Mismatch:
        STATS["oracle:jax_jit_disagrees_with_eager"] += 1
        return True
    return False


NARROW = ("jnp.float16", "jnp.bfloat16")


def _every_leaf(want, got, *refs, fn) -> bool:
    """fn(plain, transformed, *references) holds at every element of every output leaf (as float64 arrays)."""
    for w, g, *rs in zip(*(jax.tree_util.tree_leaves(t) for t in (want, got, *refs))):
        w, g, *rs = (np.asarray(x, np.float64) for x in (w, g, *rs))
        if any(x.shape != w.shape for x in (g, *rs)):
            return False
        with np.errstate(invalid="ignore", over="ignore"):
            if not fn(w, g, *rs).all():
                return False
    return True


def _flush_subnormals(x):
    """x with its subnormal floats replaced by zero of the same sign (what a flushing kernel reads)."""
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        return x
    tiny = np.finfo(a.dtype).tiny
    return jnp.asarray(np.where((a != 0) & (np.abs(a) < tiny), np.copysign(np.zeros_like(a), a), a), a.dtype)


def _transformed_is_more_accurate(prog, leaves, want, got, tol, diff) -> bool:
    """A program that computes in float16/bfloat16 has no single right answer to a tolerance: JAX accumulates a
    loop constant's cotangent in its own narrow dtype, so 3000 float16 steps of 1.0 saturate at 2048 in plain
    JAX, while two-level checkpointing (memory="min") sums per chunk and lands near the exact 2633. Then the
    oracle is the same program computed in float32 (its source with the narrow dtypes widened): the transformed
    program passes where it is, everywhere, at least as close to that as plain JAX is (within `tol`), and the
    case is counted, not failed. Either way round a worse result still fails."""
    if not any(t in prog.source for t in NARROW):
        return False
    import dataclasses
    wide_src = prog.source
    for t in NARROW:
        wide_src = wide_src.replace(t, "jnp.float32")
    try:
        wide = dataclasses.replace(prog, source=wide_src)
        closed = jax.make_jaxpr(wide.fn)(*jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(prog.args()),
                                                                      leaves))
        exact = probe([closed], leaves, vmap=prog.vmap, **diff)[0]
        if not _every_leaf(want, got, exact, fn=lambda w, g, e: (np.abs(g - e) <= np.abs(w - e) + tol[1] +
                                                              tol[0] * np.abs(e)) | (np.isnan(g) & np.isnan(w))):
            return False
    except Exception:  # noqa: BLE001 - no widened oracle: the mismatch stands
        return False
    STATS["oracle:transformed_more_accurate_than_jax"] += 1
    return True


def _float64(prog, leaves, diff):
    """The program's outputs computed in float64 (its float inputs widened; x64 on), as probe gives them."""
    with jax.enable_x64(True):
        wide = [jnp.asarray(np.asarray(x), jnp.float64) if np.issubdtype(np.asarray(x).dtype, np.floating)
                else x for x in leaves]
        closed = jax.make_jaxpr(prog.fn)(*jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(prog.args()), wide))
        return probe([closed], wide, vmap=prog.vmap, **diff)[0]


def _rounding_explains(prog, leaves, want, got, tol, diff) -> bool:
    """An ill-conditioned float32 program (a recurrence that grows: r[i+2] = r[i]/2 + sin(r[i+1]) w over 130
    steps) amplifies rounding past the fixed tolerance in plain JAX itself: plain JAX is then 1e-5 off the
    exact value, and a transformed program that adds the same cotangents in another order another 3e-5
    (campaign of 2026-11-26, stream_rows). Such a mismatch passes where every element of the transformed
    program is within twice plain JAX's own error of the exact (float64) value, plus the tolerance; a value
    off by more, or a NaN plain JAX does not give, still fails."""
    if prog.x64 or not any(np.issubdtype(np.asarray(x).dtype, np.floating) for x in leaves):
        return False
    try:
        exact = _float64(prog, leaves, diff)
        if not _every_leaf(want, got, exact, fn=lambda w, g, e: np.isclose(g, w, tol[0], tol[1], equal_nan=True) |
                           (np.abs(g - e) <= 2 * np.abs(w - e) + tol[1] + tol[0] * np.abs(e))):
            return False
    except Exception:  # noqa: BLE001 - no float64 reference: the mismatch stands
        return False
    STATS["oracle:float32_rounding"] += 1
    return True


def _subnormal_flush_explains(prog, leaves, want, got, tol, diff) -> bool:
    """XLA:CPU flushes subnormals to zero in some fused kernels and not in others, so where a pass moves work
    (fission batches `sqrt(x)` out of the loop) the same subnormal input gives plain JAX's flushed value (the
    derivative of sqrt at 1e-40 read as at 0: inf) in one place and the IEEE value (4.4e19) in the other.
    For a program with a subnormal input a mismatch is judged element by element: each value of the transformed
    program must be plain JAX's, the exact one (the program in float64, where 1e-40 is a normal number), or plain
    JAX's on the inputs with subnormals flushed to (signed) zero, or at least as close to the exact value as plain
    JAX's: which kernel flushes a subnormal, and how accurate XLA:CPU's vector `log` is on one, depends on where
    the op runs (campaign of 2026-11-26, fission: log|1e-40| is -inf in the loop's kernel, -104.05 batched before
    it; exact -92.1). Anything else (a NaN that plain JAX does not give, a value further off than plain JAX's)
    still fails."""
    if not any(f == "special:subnormal" for f in prog.features) or prog.x64:
        return False
    try:
        with jax.enable_x64(True):
            wide = [jnp.asarray(np.asarray(x), jnp.float64) if np.issubdtype(np.asarray(x).dtype, np.floating)
                    else x for x in leaves]
            closed = jax.make_jaxpr(prog.fn)(*jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(prog.args()), wide))
            exact = probe([closed], wide, vmap=prog.vmap, **diff)[0]
        flushed_in = [_flush_subnormals(x) for x in leaves]
        flushed = probe([jax.make_jaxpr(prog.fn)(*jax.tree_util.tree_unflatten(
            jax.tree_util.tree_structure(prog.args()), flushed_in))], flushed_in, vmap=prog.vmap, **diff)[0]
        near = lambda g, r: np.isclose(g, r, tol[0], tol[1], equal_nan=True)  # noqa: E731
        def plain_exact_or_flushed(w, g, e, z):
            e = e.astype(np.float32).astype(np.float64)   # the exact value as float32 can hold it
            closer = np.abs(g - e) <= np.abs(w - e) + tol[1] + tol[0] * np.abs(e)   # no worse than plain JAX
            return near(g, w) | near(g, e) | near(g, z) | closer
        if not _every_leaf(want, got, exact, flushed, fn=plain_exact_or_flushed):
            return False
    except Exception:  # noqa: BLE001 - no float64 reference: the mismatch stands
        return False
    STATS["oracle:subnormal_flushed_by_xla"] += 1
    return True


_NUM = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf")


def run_recording(closed, leaves, jit: bool):
    """Run a flat jaxpr eagerly or under jit; return (outputs, [(tag, values)] of callbacks and prints)."""
    _programs.CALLS.clear()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        f = lambda *a: _jax.eval_jaxpr(closed, *a)
        out = jax.block_until_ready((jax.jit(f) if jit else f)(*leaves))
        jax.effects_barrier()
    calls = [(t, np.asarray(v, np.complex128 if np.iscomplexobj(v) else np.float64).reshape(-1))
             for t, v in _programs.CALLS]
    for line in buf.getvalue().splitlines():
        tag, _, rest = line.partition(" ")
        if "print" in tag:
            calls.append((tag, np.array([float(m) for m in _NUM.findall(rest)])))
    _programs.CALLS.clear()
    return out, calls


def _same_calls(want, got, who, what, tol):
    """Ordered effects: the same sequence; unordered ones: the same multiset; pure_callbacks: not compared."""
    ordered = lambda cs: [c for c in cs if c[0].startswith("o")]
    unordered = lambda cs: [c for c in cs if not c[0].startswith(("o", "pure"))]
    close = lambda a, b: a[0] == b[0] and a[1].shape == b[1].shape and np.allclose(a[1], b[1], *tol, equal_nan=True)
    w, g = ordered(want), ordered(got)
    if len(w) != len(g) or not all(close(a, b) for a, b in zip(w, g)):
        raise Mismatch("callback_order", who, f"{what}: ordered callbacks/prints differ:\n  original "
                       f"{[(t, v.tolist()) for t, v in w]}\n  transformed {[(t, v.tolist()) for t, v in g]}")
    w, g = unordered(want), list(unordered(got))
    for a in w:
        j = next((j for j, b in enumerate(g) if close(a, b)), None)
        if j is None:
            raise Mismatch("callback_multiset", who, f"{what}: the original's call {a[0]}{a[1].tolist()} "
                           f"is missing; original {sorted(t for t, _ in w)}, transformed {sorted(t for t, _ in got)}")
        g.pop(j)
    if g:
        raise Mismatch("callback_multiset", who, f"{what}: extra calls {[(t, v.tolist()) for t, v in g]}")


def _leaf_types(tree):
    return [(str(np.asarray(x).dtype), getattr(x, "weak_type", None), type(x).__name__)
            for x in jax.tree_util.tree_leaves(tree)]


def check_api(prog, args, tol):
    """`jaxform.optimize(fn)` vs `jax.jit(fn)` on the same wrapper, without and (x64 programs) with x64."""
    opt = jaxform.optimize(prog.fn)
    for x64 in ([False, True] if prog.x64 else [False]):
        with jax.enable_x64(x64), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = jax.jit(prog.fn)(*args)
            try:
                got = opt(*args)
            except Exception as e:  # noqa: BLE001 - jit ran it, optimize must too
                raise Mismatch("api", ["optimize"], f"x64={x64}: jit ran it, optimize raised "
                                                    f"{type(e).__name__}: {e}") from e
            jax.effects_barrier()
            _programs.CALLS.clear()
            if _leaf_types(want) != _leaf_types(got):
                raise Mismatch("api_dtype", ["optimize"], f"x64={x64}: output dtype/weak_type/type differ: "
                                                          f"jit {_leaf_types(want)} vs optimize {_leaf_types(got)}")
            _close(want, got, "api_values", ["optimize"], f"x64={x64}: optimize(f) vs jit(f)", tol)


# Mismatch kinds known to be open: counted as "known_open:<kind>" and collected in campaigns, never raised in CI.
# (Empty: forward mode over revolve, issue 26 finding 4, was the last; revolve is now a custom_jvp whose tangent
# is a linear_call transposed by the binomial schedule.)
KNOWN_OPEN: set[str] = set()
SCHEDULES = {"none": None, "min": "min", "revolve": 1}   # memory=1 (one byte): binomial checkpointing


def _types_and_values(want, got, kind, who, what, tol):
    if _leaf_types(want) != _leaf_types(got):
        raise Mismatch(kind + "_dtype", who, f"{what}: dtype/weak_type differ: {_leaf_types(want)} vs "
                                             f"{_leaf_types(got)}")
    _close(want, got, kind, who, what, tol)


def _api_rounding_explains(prog, args, want, got, of, tol) -> bool:
    """`_rounding_explains` for an API check: `of(args)` computed in float64 is the exact value; dtypes and
    weak types must still match plain JAX's."""
    if prog.x64:
        return False
    try:
        if [(np.asarray(w).dtype, getattr(w, "weak_type", None)) for w in jax.tree_util.tree_leaves(want)] != \
                [(np.asarray(g).dtype, getattr(g, "weak_type", None)) for g in jax.tree_util.tree_leaves(got)]:
            return False
        with jax.enable_x64(True):
            wide = jax.tree_util.tree_map(lambda x: jnp.asarray(np.asarray(x), jnp.float64)
                                          if np.issubdtype(np.asarray(x).dtype, np.floating) else x, args)
            exact = of(wide)
        ok = _every_leaf(want, got, exact, fn=lambda w, g, e: np.isclose(g, w, tol[0], tol[1], equal_nan=True) |
                         (np.abs(g - e) <= 2 * np.abs(w - e) + tol[1] + tol[0] * np.abs(e)))
    except Exception:  # noqa: BLE001 - no float64 reference: the mismatch stands
        return False
    if ok:
        STATS["oracle:float32_rounding"] += 1
    return ok


def check_api_repeated(prog, args, tol, fail):
    """One optimized function called again and again as a user does (issue 26 findings 3, 4, 6): gradients with
    alternating argnums, the same function on x and on stop_gradient(x) in one loss, and forward mode, for
    every memory schedule; values, dtypes and weak types against plain JAX."""
    fn, n = prog.fn, len(jax.tree_util.tree_leaves(args))
    grad = lambda f, argnums: jax.jit(jax.grad(f, argnums))   # noqa: E731  (one compile, not op by op)
    loss = lambda f: (lambda *a: _programs.functional(f(*a)))   # noqa: E731
    both = lambda f: (lambda *a: _programs.functional(f(*a)) + 2 * _programs.functional(  # noqa: E731
        f(lax.stop_gradient(a[0]), *a[1:])))
    tangents = tuple(jnp.ones_like(jnp.asarray(a)) if not isinstance(a, float) else 1.0 for a in args)
    wants: dict = {}   # plain JAX's results, computed once for every schedule

    def want(key, f):
        if key not in wants:
            wants[key] = f()
        return wants[key]
    for sched, memory in SCHEDULES.items():
        STATS[f"api_schedule:{sched}"] += 1
        # the default pipeline (planned); for a schedule, a fixed pipeline so that the planner cannot decline it
        opt = jaxform.optimize(fn, passes=None if memory is None else ["hoist_loop_invariants", "dce"],
                               memory=memory, strict=True)
        who = [f"optimize(memory={memory!r})"]
        if sched == "revolve" and _count_jvp_rules(opt, args) > _count_jvp_rules(fn, args):
            STATS["api_schedule:revolve_applied"] += 1
        try:   # the first and last argument alternately (a cache hit of the rules traced for the other)
            for argnums in ((n - 1,), (0,), (n - 1,)) if sched != "min" else ():
                w_g, g_g = want(argnums, lambda: grad(loss(fn), argnums)(*args)), grad(loss(opt), argnums)(*args)
                try:
                    _types_and_values(w_g, g_g, "api_grad", who, f"grad argnums={argnums}", tol)
                except Mismatch:
                    if not _api_rounding_explains(prog, args, w_g, g_g, lambda a: jax.grad(loss(fn), argnums)(*a),
                                                  tol):
                        raise
            if sched == "revolve":
                _types_and_values(grad(both(fn), tuple(range(n)))(*args), grad(both(opt), tuple(range(n)))(*args),
                                  "api_grad", who, "grad of f(x) + 2 f(stop_gradient(x))", tol)
                # forward over reverse (revolve's linear_call transposed, then differentiated forward). Array
                # tangents: JAX 0.10.2 itself fails jvp-of-grad through nested checkpointed scans (the "min"
                # schedule, also what a short weakly typed loop gets for a 1-byte budget) when a tangent is a
                # Python float ("non-canonical constant of type float"; plain JAX code, fixed in 0.12).
                arr = tuple(jnp.ones_like(jnp.asarray(a)) for a in args)
                hvp = lambda f: jax.jit(lambda *a: jax.jvp(jax.grad(loss(f), (0,)), a, arr)[1])   # noqa: E731
                try:
                    w_hvp = want("hvp", lambda: hvp(fn)(*args))
                except Exception:   # noqa: BLE001 - JAX cannot (a user's custom_vjp): nothing to compare
                    w_hvp = None
                if w_hvp is not None:
                    _types_and_values(w_hvp, hvp(opt)(*args), "api_hvp", who, "jvp of grad", tol)
        except Mismatch as e:
            fail(e)
        except Exception as e:   # noqa: BLE001 - plain JAX ran it (above, first), optimize must too
            fail(Mismatch("api_crash", who, f"grad: {type(e).__name__}: {e}"))
        try:
            w = want("jvp", lambda: jax.jit(lambda *a: jax.jvp(fn, a, tangents))(*args))
        except Exception:   # noqa: BLE001 - JAX cannot: nothing to compare
            continue
        try:
            _types_and_values(w, jax.jit(lambda *a: jax.jvp(opt, a, tangents))(*args), "api_jvp", who, "jvp", tol)
        except Mismatch as e:
            fail(e)
        except Exception as e:   # noqa: BLE001
            fail(Mismatch("api_jvp_crash", who, f"jvp: {type(e).__name__}: {e}"))


def _count_jvp_rules(f, args) -> int:
    return str(jaxform.trace(f, *args)).count("custom_jvp_call")


def check(prog, names: dict[str, list[str]] | None = None, api: bool | None = None,
          collect: list | None = None) -> list[str]:
    """Check `prog` (a fuzz Program) under each pipeline; return the names of those that changed it.

    collect: append Mismatch errors there and go on (a campaign counting all mismatches) instead of raising.
    """
    with jax.enable_x64(prog.x64), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # jax.debug.print output is compared, not shown
        return _check(prog, pipelines(bool(prog.grad)) if names is None else names,
                      prog.x64 if api is None else api, collect)


def _check(prog, names, api, collect):
    def fail(e: Mismatch):
        if e.kind in KNOWN_OPEN:
            STATS[f"known_open:{e.kind}"] += 1
            if collect is not None:
                collect.append(e)
            return
        if collect is None:
            raise AssertionError(f"{e}\n--- program ---\n{prog}") from e
        collect.append(e)

    tol = _tol(prog)
    args = prog.args()
    leaves = jax.tree_util.tree_leaves(args)
    try:
        closed = jax.make_jaxpr(prog.fn)(*args)
    except Exception:
        if not prog.grad:
            raise
        STATS["rejected:jax_cannot_grad_original"] += 1   # JAX cannot differentiate f: not a pass bug
        import hypothesis
        hypothesis.reject()
    # The derivatives of a grad program are second order: forward over reverse (Hessian-vector products),
    # the cheap one; reverse over reverse costs ~2x the compile time and JAX 0.10 fails it on some
    # first-order-fine programs (a Ref written in a scan: "DynamicJaxprTracer has no attribute accum").
    diff = dict(reverse=False, forward=prog.forward_diff) if prog.grad else \
        dict(reverse=prog.reverse_diff, forward=prog.forward_diff,
             full_grad=not prog.reverse_diff and prog.forward_diff and any(f.startswith("while:") for f in prog.features))
    _programs.CALLS.clear()
    want_types = [(a.dtype, a.weak_type) for a in closed.out_avals]
    outs = {}
    for name, pipeline in {"ROUNDTRIP": [], **names}.items():
        try:
            out = run_passes(closed, pipeline, strict=True)
            verify(out, closed)
        except (PassError, TypeError, _jax.JaxprTypeError) as e:
            fail(Mismatch("crash", [name], f"{type(e).__name__}: {e}"))
            continue
        got_types = [(a.dtype, a.weak_type) for a in out.out_avals]
        if got_types != want_types:
            fail(Mismatch("dtype_weak_type", [name], f"output (dtype, weak_type) {want_types} -> {got_types}"))
        outs[name] = out
    STATS["programs"] += 1
    for f in prog.features:
        STATS[f"has:{f}"] += 1
    versions: dict = {}
    rt = outs.get("ROUNDTRIP")
    if rt is not None and _key(rt, canonical=False) != _key(closed, canonical=False):
        versions[_key(rt)] = (rt, ["ROUNDTRIP"])
    same = _key(rt) if rt is not None else None
    for name, out in outs.items():
        k = _key(out)
        if name != "ROUNDTRIP" and k != same:
            versions.setdefault(k, (out, []))[1].append(name)
    changed = [n for _, who in versions.values() for n in who]
    for name in set(PAIRS) & set(outs):
        if PAIRS[name][0] in outs and _key(outs[name]) != _key(outs[PAIRS[name][0]]):
            STATS[f"{name}:last_changed"] += 1
            for f in prog.features:
                STATS[f"{f}|{name}:last_changed"] += 1
    if versions:
        try:
            want, *got = probe([closed] + [out for out, _ in versions.values()], leaves, vmap=prog.vmap, **diff)
        except Exception:
            try:   # JAX itself cannot transform the original (e.g. grad of a Ref in a scan): not a pass bug
                probe([closed], leaves, vmap=prog.vmap, **diff)
            except Exception:
                STATS["rejected:jax_cannot_transform_original"] += 1
                import hypothesis
                hypothesis.reject()
            raise
        eager_original = functools.cache(   # only on a mismatch, once however many versions mismatch
            lambda: probe([closed], leaves, vmap=prog.vmap, jit=False, **diff)[0])
        for g, (_, who) in zip(got, versions.values()):
            try:
                _close(want, g, "values", who, "values, derivatives, vmap (jit)", tol)
            except Mismatch as e:
                if not _jax_disagrees_with_itself(eager_original, want, g, tol) and \
                        not _transformed_is_more_accurate(prog, leaves, want, g, tol, diff) and \
                        not _rounding_explains(prog, leaves, want, g, tol, diff) and \
                        not _subnormal_flush_explains(prog, leaves, want, g, tol, diff):
                    fail(e)
        if prog.effects:
            for jit in (False, True):
                w_out, w_calls = run_recording(closed, leaves, jit)
                for out, who in versions.values():
                    g_out, g_calls = run_recording(out, leaves, jit)
                    what = "under jit" if jit else "eagerly"
                    try:
                        _close(w_out, g_out, "values", who, f"values {what}", tol)
                        _same_calls(w_calls, g_calls, who, what, tol)
                    except Mismatch as e:
                        fail(e)
    if api:
        STATS["api"] += 1
        try:
            check_api(prog, args, tol)
        except Mismatch as e:
            fail(e)
    if prog.api_checks:
        STATS["api_repeated"] += 1
        check_api_repeated(prog, args, tol, fail)
    for name in changed:
        if name != "ROUNDTRIP":
            STATS[f"{name}:changed"] += 1
            for f in prog.features:
                STATS[f"{f}|{name}:changed"] += 1
    return [n for n in changed if n != "ROUNDTRIP"]
