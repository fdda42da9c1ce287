"""Attack, round 15: the byte budget's planner rule (db19ab9: `planner.judge` / `_over_budget`), the memory-only
compile (`plan.measure.MEMORY_ONLY_OPTIONS`), budgets against "min", special values, and unmet-budget warnings.

Findings (JAX 0.10.2, XLA:CPU, 2 loaded cores, JAXFORM_MEASURE=memory as the suite runs; all sizes B=8, H=16):
  A. (medium) A tighter byte budget ends at MORE gradient memory than a looser one and than "min", unmet.
     rnn_mlp (an RNN scan, then gelu(ys @ w1) @ w2, MSE), L=16: plain jax.grad 156292 B; memory=39073 (25%)
     -> 17156 B, met; memory="min" -> 18500 B; memory=7814 (5%) -> 27904 B (jax.value_and_grad 28416 B) with
     "remat_loops cannot fit ... XLA measures 27.8 KiB". At L=64: memory=1 -> 27904 B where "min" reaches
     26692 B (and memory=31161 reaches it too). Cause: `plan/memory.py::fit_loops` measures only the schedules
     the model walks to for a shrinking target: `loop_schedules` at 7814 B goes keep -> remat -> sqrt ->
     "revolve" with 1 slot (predicted 13056 B, below sqrt), XLA measures 28416 B; the retry target goes
     negative, the same schedule comes back, the loop breaks. "remat" (XLA 17232 B) and "sqrt" are never
     compiled, so `best` can only be the revolve. Fixed: an unmet budget measures `memory.FALLBACKS` too.
  B. (medium) A budget the plan could meet is missed by 7 bytes, because a proposal that brings the gradient
     from over the budget to within it saves less than MEMORY_SLACK (4096 B) and is then judged on time.
     lstm, L=16: plain 127876 B; memory=31969 (25%) -> 31976 B and a "cannot fit" warning; memory=63938 and
     "auto" -> 28868 B (jax.value_and_grad 28944 B), within 31969. fuse_scan_reductions with remat after it
     (`after_memory_planning`): 31976 -> 28944 B, a 3032 B saving, not `_less`; nothing given back, so
     `_over_budget` does not apply; refused "predicted slower grad (0.39x)". `planner.judge` has no rule for
     "the worst gradient view misses the budget before and fits it after". Same cause under "min" and in
     rnn_mlp L=1 (fusion 8704 -> 7168 B refused for a predicted 0.82x at memory=4352 and "min"). Fixed for
     budgets: `planner._over_budget` keeps a proposal that makes a missed budget fit ("min" is as it was).
  C. (medium) A budget silently unmet under jax.grad(..., has_aux=True). f returns (rnn_mse, rnn_mse * 1.0),
     L=16: jax.grad(optimize(f, memory=9000), has_aux=True) runs 9376 B of XLA temp, and no warning (the
     same at 8800 and 9300). The planner's has_aux view (`use.Use.program`, AUX_GRAD) is built with
     `with_value=True`: the program `jax.value_and_grad(f, has_aux=True)` runs (8736 B here), never
     `jax.grad(f, has_aux=True)`'s (no value returned, which XLA schedules bigger here); `memory.budgeted_temp`
     measures the all-outputs gradient. Where the budget is unmet and warned, the quoted number is that
     program's too ("8.5 KiB" at memory=2080 where jax.grad(has_aux=True) measures 9376 B). Fixed (session 16):
     `memory.budgeted_temp` measures jax.grad(f, has_aux=True)'s and jax.value_and_grad(f, has_aux=True)'s
     programs of each scalar output (`use.aux_losses`), the gradient first as JAX returns it (XLA schedules by
     output order: 8800 B with the aux first), and `_Planning.unmet_budget` checks them for the chosen plan.
  D. (low) "min" is not the least: a byte budget reaches less, and the unmet-budget advice "memory='min' stores
     the least" (`memory._loops_over`) is false there. rnn_mse, L=16: "min" 12676 B, "auto" 11396 B,
     memory=10401 (25%) -> 8288 B (met, no warning). rnn_mlp, L=1: "min" 8704 B (= plain), memory=7833 (90%)
     -> 6656 B. Causes: "min" is sqrt-checkpointing for L >= 16 (`memory.loop_schedules`; sqrt measures more
     than remat and revolve here) and never segment checkpointing on a program with loops
     (`remat_program`: "min": remat_loops plans the loops; the straight-line parts stay). Fixed in part (session
     16): "min" measures √L and every-step remat and keeps the least (11396 B), then segments the straight-line
     parts as a budget does (rnn_mlp L=1: 6656 B); the advice now says what "min" does. A budget may still go
     below "min" with revolve: by design ("min" bounds the recomputation per step), recorded by a test.
  F. (medium) A jit trace's budget silently unmet under jax.value_and_grad. o = optimize(rnn_mse, memory=9000),
     L=16, called as jax.value_and_grad(jax.jit(o)): 9320 B of XLA temp, no warning (also at 9300);
     jax.grad(jax.jit(o)) runs 8808 B. Where unmet (memory=2080) the warning says "with its value
     (jax.value_and_grad's program ...) ... XLA measures 8.6 KiB": 8806 B, not the 9320 B value_and_grad of
     the jit runs. Cause: for an unknown use, `_Planning.unmet_budget` and `memory.fit_loops` read
     `memory.budgeted_temp`, which compiles the gradient programs inlined (`cost.gradient_program` without
     through_jit), not behind the jit boundary JAX differentiates (`use.gradient_program(through_jit=True)`,
     whose residuals JAX's partial evaluation decides). Fixed (session 16): under a jit trace `optimize` says
     the gradient is behind the jit (`cost.gradient_behind_jit`) and a budget measures that program.
  E. (low, by design: MIN_SAVING) rnn_mlp, L=1: memory=7833 -> 6656 B (met); memory=4352 -> 8704 B (plain)
     with a warning that names 6.5 KiB as reachable: a tighter budget is left at plain because the 6656 B
     candidate saves 23.5% < MIN_SAVING (25%). Documented in `memory.choose`; a slow regular test records it.
Held (regression tests): memory_only temp bytes equal a normal compile's, to the byte, on 16 programs (conv and
its gradient, f16/bf16 conv and dots, bf16 dot_general with preferred_element_type=f32, while, checkpointed
scan gradient, custom_vjp, sort, cumsum, big reductions, RNG, linalg custom calls, vmap of scan) on JAX 0.10.2
and 0.12 (and with --xla_cpu_enable_concurrency_optimized_scheduler=false); `judge`/`_over_budget` on unit
costs: a forward (non-gradient) view giving back bytes is never kept by the rule, a gradient view growing past
the budget is refused, a met budget does not trigger it; the rule on rnn_max_sum (L=64, B=16, H=32, 50%: 276744 B
with it, 400208 B and a warning without; never worse than without it on rnn_mse/two_carries at 90/50/30/10%);
inf/NaN/-0.0/1e30 inputs give plain JAX's values and gradients (NaN and sign positions) under "min", 50%, 5%, 1
byte, 0 bytes; weak-typed scalar argument under argnums 0, 3, (0, 1); lengths 0 and 1; vmap(grad); jax.jvp;
f16/bf16; the other order optimize(jax.grad(f), memory=B) is never above memory=None's and its warnings quote
what runs; unmet budgets warn under grad, value_and_grad, argnums=1, vmap(grad), jax.grad(jax.jit(o)), each (but the jit
trace's, F) quoting that use's jax.value_and_grad measured bytes ("with its value") to 0.1 KiB. Fast tier ~45 s.
"""
import math
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.plan import measure, planner
from jaxform.plan.planner import Cost, ViewCost, judge
from jaxform.plan.use import Use

from fuzz.test_attack_round13 import close, said, temp  # noqa: E402 (round 13's helpers: one copy)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))


from fuzz.test_attack_round14 import _a, rnn_mse  # noqa: E402,F401 (round 14's program: one copy)


def rnn_mlp(w, xs, t, w1, w2):
    """A scan, then straight-line MLP layers on its stacked states."""
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = lax.scan(cell, jnp.zeros(xs.shape[1:], xs.dtype), xs)
    z = jax.nn.gelu(ys @ w1) @ w2
    return jnp.mean((z - t) ** 2)


def lstm(w, xs, t):
    def cell(c, x):
        h, cc = c
        g = jnp.concatenate([h, x], -1) @ w
        i, f_, o, u = jnp.split(g, 4, -1)
        cc = jax.nn.sigmoid(f_) * cc + jax.nn.sigmoid(i) * jnp.tanh(u)
        h = jax.nn.sigmoid(o) * jnp.tanh(cc)
        return (h, cc), h
    z = jnp.zeros(xs.shape[1:], xs.dtype)
    _, ys = lax.scan(cell, (z, z), xs)
    return jnp.mean((ys - t) ** 2)


def _rnn_args(L, B=8, H=16, dtype=np.float32):
    return (_a(1, H, H, k=1 / np.sqrt(H), dtype=dtype), _a(2, L, B, H, dtype=dtype), _a(3, L, B, H, dtype=dtype))


def _mlp_args(L, B=8, H=16):
    return _rnn_args(L, B, H) + (_a(4, H, 4 * H, k=0.2), _a(5, 4 * H, H, k=0.2))


def _lstm_args(L, B=8, H=16):
    return (_a(1, 2 * H, 4 * H, k=0.2),) + _rnn_args(L, B, H)[1:]


def _grad_temp(f, memory, *args, **kw):
    """(XLA temp of jax.jit(jax.grad(optimize(f, memory=...))), jaxform's warnings)."""
    return said(lambda: temp(jax.grad(jaxform.optimize(f, memory=memory), **kw), *args))


GRAD = Use((("grad", (0, 1, 2)),))
_JAX_010 = tuple(int(x) for x in jax.__version__.split(".")[:2]) < (0, 11)   # where C and F show


def _cost(grad, valued, seconds):
    return Cost((ViewCost("grad", grad, seconds, "XLA"), ViewCost("grad (value returned)", valued, seconds, "XLA")))


# ============= finding A: a tighter budget walks fit_loops into revolve(1), above "min" and a looser budget =============

@pytest.mark.slow
def test_tighter_budget_no_bigger_than_min_or_a_looser_budget():
    """Finding A. rnn_mlp, L=16: plain 156292 B; memory=39073 -> 17156 B; "min" -> 18500 B; memory=7814 ->
    27904 B (unmet, warned "XLA measures 27.8 KiB"). Expected: an unmet budget ends no bigger than what "min"
    reaches, nor than what a looser budget reaches (memory first, as asked)."""
    args = _mlp_args(16)
    plain = temp(jax.grad(rnn_mlp), *args)
    loose, _ = _grad_temp(rnn_mlp, int(0.25 * plain), *args)
    least, _ = _grad_temp(rnn_mlp, "min", *args)
    tight = int(0.05 * plain)
    got, w = _grad_temp(rnn_mlp, tight, *args)
    assert got > tight and w            # (the premise: unmet, and said)
    assert got <= min(least, loose), (got, least, loose, plain)


@pytest.mark.slow
def test_absurd_budget_no_bigger_than_min():
    """Finding A at L=64: memory=1 (and 0) -> 27904 B, memory="min" -> 26692 B, memory=5% (31161) -> 26692 B."""
    args = _mlp_args(64)
    least, _ = _grad_temp(rnn_mlp, "min", *args)
    got, w = _grad_temp(rnn_mlp, 1, *args)
    assert w
    assert got <= least, (got, least)


# ================ finding B: a proposal that makes the budget fit, refused for saving under MEMORY_SLACK ================

def test_judge_keeps_a_proposal_that_makes_the_budget_fit():
    """Finding B, the judge alone, on lstm L=16's measured costs (fuse_scan_reductions with remat after it,
    `after_memory_planning`): before 31976 / 31976 B (grad / value_and_grad), after 28868 / 28944 B, under
    memory=31969; the model's times 0.0827 ms -> 0.211 ms. Expected: kept (the worst gradient goes from over
    the budget to within it, nothing given back: memory first). Got: (False, 'predicted slower grad (0.39x)')."""
    keep, why = judge(_cost(127876, 127888, 0.22e-3), _cost(31976, 31976, 0.0827e-3), _cost(28868, 28944, 0.211e-3),
                      memory_pass=False, memory=31969, use=GRAD)
    assert keep, why


@pytest.mark.slow
def test_budget_met_where_a_looser_budget_meets_it():
    """Finding B end to end. lstm, L=16: plain 127876 B; memory=31969 -> 31976 B, "remat_loops cannot fit ...
    31.2 KiB"; memory=63938 -> 28868 B (value_and_grad 28944 B), within 31969."""
    args = _lstm_args(16)
    plain = temp(jax.grad(lstm), *args)
    mem = int(0.25 * plain)
    looser, _ = _grad_temp(lstm, 2 * mem, *args)
    assert looser <= mem                 # (the premise: a looser budget's plan fits this one)
    got, w = _grad_temp(lstm, mem, *args)
    assert got <= mem, (got, mem, looser, w)


def test_judge_over_budget_rule_holds_on_unit_costs():
    """Held: `_over_budget` keeps a give-back only where the worst gradient misses the budget before and drops;
    a view growing past the budget is refused ("asked"); a forward view giving back bytes is never kept by the
    rule; a budget met before does not trigger it."""
    plain = _cost(400000, 400000, 1e-3)
    # the worst (grad) misses 385000 and drops, value_and_grad grows within it: kept, memory first
    keep, why = judge(plain, _cost(400000, 263000, 1e-3), _cost(276000, 276000, 5e-3), memory_pass=False,
                      memory=385000, use=GRAD)
    assert keep and "is missed" in why, why
    # ... value_and_grad grows past the budget: refused
    keep, why = judge(plain, _cost(400000, 263000, 1e-3), _cost(300000, 390000, 5e-3), memory_pass=False,
                      memory=385000, use=GRAD)
    assert not keep and "asks for" in why, why
    # a met budget: a give-back is a trade of time (refused for a 5x slowdown)
    keep, why = judge(plain, _cost(300000, 263000, 1e-3), _cost(276000, 276000, 5e-3), memory_pass=False,
                      memory=385000, use=GRAD)
    assert not keep, why
    # a jit trace (unknown use): the forward view giving back bytes is no gradient's, the rule does not keep it
    unknown = Use(known=False)
    cst = lambda fwd, g, s: Cost((ViewCost("forward", fwd, s, "XLA"), ViewCost(planner.HYPOTHETICAL_GRAD, g, s, "XLA")))
    keep, why = judge(cst(90000, 400000, 1e-3), cst(10000, 400000, 1e-3), cst(60000, 200000, 5e-3),
                      memory_pass=False, memory=300000, use=unknown)
    assert not keep, why


# ======================= finding C: has_aux's gradient is never judged, its budget silently unmet =======================

def _with_aux(w, xs, t):
    loss = rnn_mse(w, xs, t)
    return loss, loss * 1.0


def test_has_aux_budget_never_silently_unmet():
    """Finding C. f returns (rnn_mse, rnn_mse * 1.0), L=16; jax.grad(optimize(f, memory=9000), has_aux=True):
    9376 B of XLA temp, no warning (jax.value_and_grad(..., has_aux=True) of the same plan: 8736 B)."""
    args = _rnn_args(16)
    got, w = _grad_temp(_with_aux, 9000, *args, has_aux=True)
    assert got <= 9000 or w, (got, w)


@pytest.mark.slow
def test_has_aux_unmet_warning_quotes_what_runs():
    """Finding C, the warning: memory=2080 -> "XLA measures 8.5 KiB" (value_and_grad(has_aux)'s 8736 B); what
    jax.grad(f, has_aux=True) runs: 9376 B (9.2 KiB)."""
    args = _rnn_args(16)
    got, w = _grad_temp(_with_aux, 2080, *args, has_aux=True)
    quoted = [float(q) * 1024 for m in w for q in re.findall(r"measures ([\d.]+) KiB", m)]
    assert quoted and any(abs(q - got) <= 0.05 * 1024 + 1 for q in quoted), (got, w)   # (+1 B: 11520 B prints 11.2 KiB)


# ================= finding F: a jit trace's value_and_grad, measured inlined, its budget silently unmet =================

def test_jit_trace_value_and_grad_budget_never_silently_unmet():
    """Finding F. rnn_mse, L=16, o = optimize(rnn_mse, memory=9000) called as jax.value_and_grad(jax.jit(o)):
    9320 B of XLA temp, no warning (jax.grad(jax.jit(o)): 8808 B; the same at memory=9300)."""
    args = _rnn_args(16)
    o = jaxform.optimize(rnn_mse, memory=9000)
    got, w = said(lambda: temp(jax.value_and_grad(jax.jit(o)), *args))
    assert got <= 9000 or w, (got, w)


# ===================================== finding D: "min" is not the least =====================================

@pytest.mark.slow
def test_min_no_bigger_than_remat_of_every_step_on_a_scan():
    """Finding D. rnn_mse, L=16: "min" (sqrt checkpointing) took 12676 B where "auto" (remat of every step)
    took 11396 B. Now "min" measures both uniform schedules and keeps the least. A 25% budget still goes below
    it (8288 B, revolve): by design, "min" is the least of the schedules that recompute each step a bounded
    number of times (docs/remat.md); binomial checkpointing's recomputation grows with the budget's squeeze,
    so only a byte budget asks for it."""
    args = _rnn_args(16)
    plain = temp(jax.grad(rnn_mse), *args)
    least, _ = _grad_temp(rnn_mse, "min", *args)
    auto, _ = _grad_temp(rnn_mse, "auto", *args)
    assert least <= auto < plain, (least, auto, plain)
    got, w = _grad_temp(rnn_mse, int(0.25 * plain), *args)
    assert got <= int(0.25 * plain) and not w      # (the budget is met, below "min": recorded, by design)


@pytest.mark.slow
def test_min_no_bigger_than_a_budget_with_straight_line_layers():
    """Finding D. rnn_mlp, L=1 (a length-1 scan, then MLP layers): "min" 8704 B = plain; memory=7833 (90%) ->
    6656 B by segment checkpointing, which "min" never runs on a program with loops."""
    args = _mlp_args(1)
    plain = temp(jax.grad(rnn_mlp), *args)
    least, _ = _grad_temp(rnn_mlp, "min", *args)
    got, _ = _grad_temp(rnn_mlp, int(0.9 * plain), *args)
    assert least <= got, (least, got, plain)


@pytest.mark.slow
def test_tighter_budget_left_at_plain_below_min_saving():
    """E (by design, recorded): rnn_mlp L=1: memory=7833 -> 6656 B, met; memory=4352 -> 8704 B (plain), warned,
    the warning naming the 6.5 KiB candidate (saves 23.5% < MIN_SAVING). Never above plain."""
    args = _mlp_args(1)
    plain = temp(jax.grad(rnn_mlp), *args)
    got, w = _grad_temp(rnn_mlp, int(0.5 * plain), *args)
    assert got <= plain and w
    assert any("6.5 KiB" in m for m in w), w


# =========================== held: memory-only compiles measure what jax.jit compiles ===========================

def _memory_only_programs():
    r = np.random.RandomState(0)
    A = lambda *s, dt=np.float32: jnp.asarray(r.randn(*s), dt)  # noqa: E731
    conv = lambda x, k: jnp.sum(lax.conv(x, k, (1, 1), "SAME").astype(jnp.float32) ** 2)  # noqa: E731
    dg = lambda a, b: jnp.sum(lax.dot_general(a, b, (((1,), (0,)), ((), ())),  # noqa: E731
                                              preferred_element_type=jnp.float32) ** 2)

    def ckpt_scan(w, xs):
        def cell(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h
        return jnp.mean(lax.scan(jax.checkpoint(cell), jnp.zeros(xs.shape[1:]), xs)[1] ** 2)

    @jax.custom_vjp
    def cv(x):
        return jnp.sin(x) * x
    cv.defvjp(lambda x: (cv(x), (jnp.cos(x), x)), lambda res, g: (g * (res[0] * res[1] + jnp.sin(res[1])),))

    def wl(x):
        return lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[1])), (0, x))[1].sum()

    return {
        "conv": (conv, (A(4, 3, 16, 16), A(8, 3, 3, 3))),
        "grad conv": (jax.grad(conv, argnums=(0, 1)), (A(4, 3, 16, 16), A(8, 3, 3, 3))),
        "grad conv f16": (jax.grad(conv, argnums=(0, 1)), (A(4, 8, 16, 16, dt=jnp.float16), A(8, 8, 3, 3, dt=jnp.float16))),
        "grad conv bf16": (jax.grad(conv, argnums=(0, 1)), (A(4, 8, 16, 16, dt=jnp.bfloat16), A(8, 8, 3, 3, dt=jnp.bfloat16))),
        "grad dot bf16->f32": (jax.grad(dg, argnums=(0, 1)), (A(64, 128, dt=jnp.bfloat16), A(128, 64, dt=jnp.bfloat16))),
        "while": (wl, (A(32, 32),)),
        "grad ckpt scan": (jax.grad(ckpt_scan), (A(16, 16), A(32, 8, 16))),
        "grad f16 scan": (jax.grad(rnn_mse), _rnn_args(32, dtype=np.float16)),
        "grad custom_vjp": (jax.grad(lambda x: jnp.sum(cv(x @ x))), (A(64, 64),)),
        "grad sort": (jax.grad(lambda x: jnp.sum(jnp.sort(x, axis=0)[:10])), (A(1024, 16),)),
        "grad cumsum": (jax.grad(lambda x: jnp.sum(jnp.cumsum(x, axis=0) ** 2)), (A(1024, 32),)),
        "reductions": (lambda x: jnp.sum(jnp.exp(x), axis=1) + jnp.max(x, axis=0).sum(), (A(512, 512),)),
        "rng": (lambda k, x: jnp.sum(jax.random.normal(k, x.shape) * x), (jax.random.PRNGKey(0), A(128, 128))),
        "solve grad": (jax.grad(lambda a, b: jnp.linalg.solve(a @ a.T + jnp.eye(32), b).sum()), (A(32, 32), A(32, 4))),
        "vmap scan": (jax.vmap(lambda w, xs: rnn_mse(w, xs, xs), (None, 0)), (A(16, 16), A(4, 16, 8, 16))),
        "grad mlp bf16": (jax.grad(lambda w, x: jnp.sum(jax.nn.gelu(x @ w).astype(jnp.float32))),
                          (A(128, 128, dt=jnp.bfloat16), A(64, 128, dt=jnp.bfloat16))),
    }


@pytest.mark.parametrize("name", sorted(_memory_only_programs()))
def test_memory_only_temp_equals_a_normal_compile(name, tmp_path, monkeypatch):
    """Held: `temp_bytes(memory_only=True)` == `temp_bytes(memory_only=False)` == jax.jit's, to the byte."""
    f, args = _memory_only_programs()[name]
    closed = jax.make_jaxpr(f)(*args)
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path / "a"))
    mo = measure.temp_bytes(closed, measure.Budget(math.inf), memory_only=True)
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path / "b"))     # (no answer from the first's disk cache)
    normal = measure.temp_bytes(closed, measure.Budget(math.inf), memory_only=False)
    assert mo is not None and mo == normal == temp(f, *args), (mo, normal)


# ================================= held: special values, types, lengths, uses =================================

def _same(got, want):
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape, (x.dtype, y.dtype, x.shape, y.shape)
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
        np.testing.assert_array_equal(np.signbit(x), np.signbit(y))
        np.testing.assert_allclose(np.nan_to_num(x), np.nan_to_num(y), rtol=2e-5, atol=1e-6)


def _special_inputs(w, xs, t):
    return [(w, xs.at[3, 0, 0].set(jnp.inf), t), (w, xs.at[5, 1, 2].set(jnp.nan), t),
            (w * -0.0, xs * -0.0, t * -0.0), (w * 1e30, xs, t)]


@pytest.mark.parametrize("fraction", [0.05, 0.0])
def test_special_values_equal_plain_under_a_budget(fraction):
    """Held: inf / NaN / -0.0 / 1e30 inputs: jax.grad and jax.value_and_grad of optimize(f, memory=B) give plain
    JAX's values, NaN positions and signs; lengths 0 and 1 too."""
    args = _rnn_args(16)
    mem = int(fraction * temp(jax.grad(rnn_mse), *args))
    o = jaxform.optimize(rnn_mse, memory=mem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a in _special_inputs(*args):
            _same(jax.grad(o)(*a), jax.grad(rnn_mse)(*a))
            _same(jax.value_and_grad(o)(*a), jax.value_and_grad(rnn_mse)(*a))
        for L in (0, 1):
            a = (args[0], args[1][:L], args[2][:L])
            _same(jax.grad(jaxform.optimize(rnn_mse, memory=mem))(*a), jax.grad(rnn_mse)(*a))


@pytest.mark.slow
@pytest.mark.parametrize("memory", ["min", 1, 0])
def test_uses_and_types_equal_plain_under_a_budget(memory):
    """Held: a weak-typed scalar argument (argnums 0, 3, (0, 1)), vmap(grad), jax.jvp, f16 and bf16 under
    "min" and absurd budgets: plain JAX's values, dtypes and weak types."""
    args = _rnn_args(16)

    def scaled(w, xs, t, s):
        return rnn_mse(w, xs, t) * s

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = jaxform.optimize(scaled, memory=memory)
        for k in (0, 3, (0, 1)):
            close(jax.grad(o, argnums=k)(*args, 2.0), jax.grad(scaled, argnums=k)(*args, 2.0))
        a4 = (args[0], args[1][:, :4], args[2][:, :4])
        close(jax.vmap(jax.grad(jaxform.optimize(rnn_mse, memory=memory)), (None, 1, 1))(*a4),
              jax.vmap(jax.grad(rnn_mse), (None, 1, 1))(*a4))
        close(jax.jvp(jaxform.optimize(rnn_mse, memory=memory), args, args), jax.jvp(rnn_mse, args, args))
        for dt, tol in ((np.float16, 2e-2), (jnp.bfloat16, 5e-2)):
            a = _rnn_args(16, dtype=dt)
            close(jax.grad(jaxform.optimize(rnn_mse, memory=memory))(*a), jax.grad(rnn_mse)(*a), rtol=tol)


# ===================================== held: unmet budgets warn, with what runs =====================================

def _quoted(ws):
    return [float(v) * {"MiB": 2 ** 20, "KiB": 1024}[u] for m in ws for v, u in re.findall(r"measures ([\d.]+) (MiB|KiB)", m)]


def test_unmet_budget_warns_with_value_and_grads_bytes():
    """Held: rnn_mse L=16, memory=2080 (5%): jax.grad runs 8288 B, jax.value_and_grad 8800 B; the warning says
    "with its value ... XLA measures 8.6 KiB" (value_and_grad's, to 0.1 KiB)."""
    args = _rnn_args(16)
    o = jaxform.optimize(rnn_mse, memory=2080)
    got, w = said(lambda: temp(jax.grad(o), *args))
    valued = temp(jax.value_and_grad(o), *args)
    assert got > 2080 and w
    assert any(abs(q - valued) <= 0.05 * 1024 + 1 for q in _quoted(w)), (valued, w)


@pytest.mark.slow
@pytest.mark.parametrize("use", ["argnums1", "vmap", "jit_unknown", "value_and_grad"])
def test_unmet_budget_warns_in_every_use(use):
    """Held: rnn_mse L=16 at 5% and 50% of plain: unmet -> warned, quoting the bytes of that use's
    value_and_grad program (to 0.1 KiB); never above plain's in that use."""
    args = _rnn_args(16)
    plain = temp(jax.grad(rnn_mse), *args)
    mk, vmk, a = {
        "argnums1": (lambda o: jax.grad(o, argnums=1), lambda o: jax.value_and_grad(o, argnums=1), args),
        "vmap": (lambda o: jax.vmap(jax.grad(o), (None, 1, 1)), lambda o: jax.vmap(jax.value_and_grad(o), (None, 1, 1)),
                 (args[0], args[1][:, :4], args[2][:, :4])),
        "jit_unknown": (lambda o: jax.grad(jax.jit(o)), lambda o: jax.value_and_grad(jax.jit(o)), args),
        "value_and_grad": (lambda o: jax.value_and_grad(o), lambda o: jax.value_and_grad(o), args),
    }[use]
    for fr in (0.05, 0.5):
        mem = int(fr * plain)
        o = jaxform.optimize(rnn_mse, memory=mem)
        got, w = said(lambda: temp(mk(o), *a))
        assert got <= temp(mk(rnn_mse), *a)
        if got > mem:
            valued = temp(vmk(o), *a)
            assert w and any(abs(q - valued) <= 0.05 * 1024 + 1 for q in _quoted(w)), (use, mem, got, valued, w)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rnn_mse", "lstm"])
def test_other_order_never_above_default_and_quotes_what_runs(name):
    """Held: optimize(jax.grad(f), memory=B) at 50%, 5%, 1 byte: never above memory=None's own temp, gradients
    of plain JAX; an unmet budget warns with that program's own bytes ("XLA measures ..." to 0.1 KiB)."""
    f, args = {"rnn_mse": (rnn_mse, _rnn_args(16)), "lstm": (lstm, _lstm_args(16))}[name]
    gf = jax.grad(f)
    plain = temp(gf, *args)
    default, _ = said(lambda: temp(jaxform.optimize(gf, memory=None), *args))
    for mem in (int(0.5 * plain), int(0.05 * plain), 1):
        o = jaxform.optimize(gf, memory=mem)
        got, w = said(lambda: temp(o, *args))
        assert got <= default <= plain, (mem, got, default, plain)
        if got > mem:
            assert any(abs(q - got) <= 0.05 * 1024 + 1 for q in _quoted(w)), (mem, got, w)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            close(o(*args), gf(*args))
