"""Attack, round 13: four changes (fe3e542, and 9dce387's planner).

1. `plan/measure.py::seconds`: a close ratio (`_close`: outside NOISE, inside MARGINAL) is timed again (min of
   both rounds) for long programs too, not only under RUN_SECONDS.
2. `plan/memory.py::choose`: memory="min" no longer gives up early (GIVE_UP_AFTER is a byte budget's only).
3. `plan/planner.py`: `fission` judged together with `thin_residuals` (ENABLES, JUDGED_AGAINST_LATER).
4. `ir/identity.py::program_identity`: the one whole-program key of the planner's costs, measure's memo, explain.

Findings (JAX 0.10.2, XLA:CPU, 2 loaded cores, default XLA_FLAGS):
  A. (low, new with change 1) The again-round of a long close pair is not budgeted before it starts:
     `_interleaved` runs one warm-up of both programs before it checks what is left, so where the first
     round fitted and the second does not, the warm-up runs past the budget and is thrown away (before the
     change a long pair was never timed twice: spent stayed within `seconds`). Fixed: the again-round is
     budgeted on the first round's times, no warm-up (`_interleaved(known=...)`).
  B. (medium, not from these changes) A byte budget misses where the default meets it: rnn_max_sum (L=64,
     B=16, H=32), jax.grad(optimize(f, memory=0.5 x plain)) runs 400208 B with a "cannot fit" warning for
     394336 B; memory=None runs 276744 B and "min" 101000 B (fuse_scan_reductions is refused alone for its
     value-returned view and, under a budget, not rescued by `after_memory_planning`). Fixed: under a byte
     budget, `judge` keeps a proposal that brings the worst gradient view down where it misses the budget and
     grows only gradient views, within it (`_over_budget`): memory first, time not weighed.
  C. (medium, not from these changes) optimize(jax.grad(f), memory=budget) called forward on a program whose
     gradient's add_any all sit inside its loops (two independent carries): the planner's `_is_gradient`
     (nested walk) keeps remat_program, whose `recompute.is_gradient` (top level only) says "not a gradient",
     so remat_program differentiates the gradient program again and warns "cannot fit ... its gradient stays
     at 1.27 MiB": a second-order gradient nobody runs; the program run takes 143492 B, within 201794 B.
     Fixed: one `recompute.is_gradient`, nested bodies counted, which the planner uses too.
Held (regression tests): a re-timed close pair's disk answer is the min of every round, `rounds` counts
processes, settled after SETTLE_ROUNDS and then never run again; a far pair is stored once, never re-timed;
impure programs are never run by `seconds` nor by a timing planner (callback counts of plain JAX); "min" never
bigger than plain jax.grad nor than a byte budget's result on dense+gelu stacks; gradients of plain JAX under
argnums=1, has_aux with int/bool aux, f16, value_and_grad, jvp, vmap(grad), custom_vjp/custom_jvp, RNG keys;
fission+thinning programs (RNN with input projection, two carries, max+sum of stacked outputs) give plain JAX's
values, dtypes and weak types and never more XLA temp than plain jit, in every order and memory setting
tried; program_identity keeps apart callbacks printed alike, custom_jvp rules, custom_vjp bwd statics (an
unshared key), weak types, -0.0 literals, equal-valued distinct constants, threefry and matmul-precision
contexts, and is equal for the same scan/cond/while/custom_vjp program traced twice.
"""
import functools
import glob
import json
import os
import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph
from jaxform.ir.identity import program_identity
from jaxform.plan import measure


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))


def temp(f, *args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def said(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if "jaxform" in str(x.message) and "jaxform: planning" not in
                 str(x.message)]


def close(got, want, rtol=2e-4, weak=True):
    gl, wl = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(gl) == len(wl)
    for x, y in zip(gl, wl):
        if weak:
            assert getattr(x, "weak_type", None) == getattr(y, "weak_type", None), (x, y)
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype, (x.shape, y.shape, x.dtype, y.dtype)
        x, y = x.astype(np.float32), y.astype(np.float32)
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(y))) if y.size else 1.0))


def key(closed):
    return program_identity(Graph.from_jaxpr(closed), closed)


# ================================ change 1: measure.seconds re-times close long pairs ================================

def _pair():
    x = jnp.ones(8, jnp.float32)
    return jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(x), jax.make_jaxpr(lambda x: jnp.cos(x) * 3)(x)


def _fake_runs(monkeypatch, times: dict, calls: list | None = None):
    """measure._compiled gives a function sleeping times[id(closed)] (a deterministic stand-in for a run)."""
    def compiled(closed, budget):
        s = times[id(closed)]

        def run(*args):
            if calls is not None:
                calls.append(s)
            time.sleep(s)
            return np.zeros(1, np.float32)
        return run
    monkeypatch.setattr(measure, "_compiled", compiled)


def _disk_entries(tmp_path):
    return [json.load(open(p)) for p in glob.glob(os.path.join(str(tmp_path), "*", "*.json"))
            if "seconds" in json.load(open(p))]


def test_long_close_pair_again_round_stays_within_budget(monkeypatch):
    """Finding A (low, new with change 1). Input: two programs of 0.10 s and 0.125 s (ratio 1.25: close) made
    long (RUN_SECONDS=0.05), a Budget of 2.0 s with 2.0 - 2.5 x 0.225 s already spent on runs: the first
    round (a warm-up and one sample of each, 0.45 s) fits. Expected: `seconds()` spends no more running time
    than the budget (the MARGINAL comment: re-timed "within what is left of the budget"). Got: the
    again-round's warm-up (0.225 s) runs before `_interleaved` finds the round does not fit, then is thrown
    away: spent - compile_spent ~2.11 s > 2.0 s. Before the change a long pair was timed once. Fixed."""
    a, b = _pair()
    _fake_runs(monkeypatch, {id(a): 0.10, id(b): 0.125})
    monkeypatch.setattr(measure, "RUN_SECONDS", 0.05)
    bud = measure.Budget(seconds=2.0)
    bud.spent = 2.0 - 2.5 * 0.225
    t = measure.seconds(a, b, bud)
    assert t is not None      # the first round fitted
    assert bud.spent - bud.compile_spent <= bud.seconds + 0.02, (bud.spent - bud.compile_spent, bud.seconds)


def test_close_pair_settles_on_disk_with_the_min_of_every_round(monkeypatch, tmp_path):
    """A close pair (0.10 s vs 0.12 s, long) timed by three plans: rounds 1, 2, 3 on disk, each time the min of
    everything seen; a fourth plan answers from the disk without running either program."""
    a, b = _pair()
    calls = []
    _fake_runs(monkeypatch, {id(a): 0.10, id(b): 0.12}, calls)
    monkeypatch.setattr(measure, "RUN_SECONDS", 0.05)
    seen = []
    monkeypatch.setattr(measure, "_timed_here", set())
    for k in range(3):
        calls.clear()
        measure._timed_here.clear()      # (each plan in its own process: a cached pair is timed once per process)
        t = measure.seconds(a, b, measure.Budget(seconds=10.0))
        assert t is not None and 1.05 < t[1] / t[0] < 1.5
        assert len(calls) == 8       # two rounds (re-timed: close), each a warm-up and one sample per program
        (entry,) = _disk_entries(tmp_path)
        assert entry["rounds"] == k + 1
        seen.append(tuple(entry["seconds"]))
        assert entry["seconds"][0] <= min(s[0] for s in seen) and entry["seconds"][1] <= min(s[1] for s in seen)
    calls.clear()
    b4 = measure.Budget(seconds=10.0)
    assert measure.seconds(a, b, b4) == seen[-1]
    assert calls == [] and b4.from_cache == 1


def test_far_pair_is_timed_once_and_not_again(monkeypatch, tmp_path):
    """A far pair (2x) of long programs: one round (4 runs), stored with rounds=1, then answered from the disk."""
    a, b = _pair()
    calls = []
    _fake_runs(monkeypatch, {id(a): 0.06, id(b): 0.12}, calls)
    monkeypatch.setattr(measure, "RUN_SECONDS", 0.03)
    t = measure.seconds(a, b, measure.Budget(seconds=10.0))
    assert len(calls) == 4 and t[1] / t[0] > 1.5
    assert [e["rounds"] for e in _disk_entries(tmp_path)] == [1]
    calls.clear()
    assert measure.seconds(a, b, measure.Budget(seconds=10.0)) == t and calls == []


def test_budget_spent_before_the_again_round_keeps_the_first(monkeypatch, tmp_path):
    """Where the again-round does not fit, the first round's numbers stand (rounds=1) and the budget says so."""
    a, b = _pair()
    _fake_runs(monkeypatch, {id(a): 0.05, id(b): 0.06})
    monkeypatch.setattr(measure, "RUN_SECONDS", 0.02)
    bud = measure.Budget(seconds=2.0)      # (over BUDGET_RUNS x the slowest run: the budget is 2.0 s)
    bud.spent = 2.0 - 0.3
    t = measure.seconds(a, b, bud)
    assert t is not None and bud.exhausted
    (entry,) = _disk_entries(tmp_path)
    assert entry["rounds"] == 1 and tuple(entry["seconds"]) == t


@pytest.mark.parametrize("kind", ["debug_callback", "pure_callback", "custom_jvp_rule"])
def test_impure_programs_are_never_run_by_seconds(kind, monkeypatch):
    """A program with a host callback (in its body, or in a custom_jvp rule) is never run to be timed, even
    where the pair is close and long (the re-timing path)."""
    calls = []
    x = jnp.ones(16, jnp.float32)
    if kind == "debug_callback":
        def f(x):
            jax.debug.callback(lambda v: calls.append(1), x)
            return jnp.sin(x)
    elif kind == "pure_callback":
        def f(x):
            return jax.pure_callback(lambda v: (calls.append(1), np.asarray(v))[1],
                                     jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2
    else:
        @jax.custom_jvp
        def g(x):
            return jnp.sin(x)
        g.defjvp(lambda p, t: (jax.debug.callback(lambda v: calls.append(1), p[0]) or jnp.sin(p[0]), t[0]))
        f = lambda x: g(x) * 2  # noqa: E731
    imp = jax.make_jaxpr(f)(x)
    pure = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.1)(x)
    monkeypatch.setattr(measure, "RUN_SECONDS", 0.0)
    calls.clear()
    assert measure.seconds(imp, pure, measure.Budget(seconds=10.0), [x]) is None
    assert measure.seconds(pure, imp, measure.Budget(seconds=10.0), [x]) is None
    assert calls == []


def _rnn_cb(calls):
    def f(w, xs):
        def cell(h, x):
            h = jnp.tanh(h @ w + x)
            jax.debug.callback(lambda v: calls.append(float(v)), h[0, 0])
            return h, h
        _, ys = lax.scan(cell, jnp.zeros(xs.shape[1:]), xs)
        return jnp.max(ys) + jnp.sum(ys)
    return f


def test_timing_planner_runs_callbacks_as_plain_jax(monkeypatch):
    """JAXFORM_MEASURE=1 (timing on), an RNN with a jax.debug.callback per step and two reductions of its
    stacked states: optimize(f) forward, jax.grad(optimize(f)): the callback runs as often, with the same
    values in the same order, as plain JAX (planning runs nothing impure)."""
    monkeypatch.setenv("JAXFORM_MEASURE", "1")
    w = jnp.asarray(np.random.RandomState(0).randn(8, 8) * 0.3, jnp.float32)
    xs = jnp.asarray(np.random.RandomState(1).randn(12, 4, 8), jnp.float32)
    calls = []
    f = _rnn_cb(calls)
    for use in (lambda g: g, lambda g: jax.grad(g)):
        calls.clear()
        want = use(f)(w, xs)
        plain = list(calls)
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = use(jaxform.optimize(f))(w, xs)
        close(got, want, weak=False)
        assert len(calls) == len(plain)
        np.testing.assert_allclose(calls, plain, rtol=1e-4)


# ================================ change 2: memory="min" compiles every candidate ================================

def _layer(h, W, b):
    h = jax.nn.gelu(h @ W + b)
    return h + 0.1 * jnp.tanh(h)


def _stack(L, D, B, dtype=np.float32):
    r = np.random.RandomState(0)
    ps = [(jnp.asarray(r.randn(D, D) * 0.1, dtype), jnp.zeros(D, dtype)) for _ in range(L)]
    x = jnp.asarray(r.randn(B, D), np.float32)

    def loss(ps, x):
        h = x.astype(ps[0][0].dtype)
        for W, b in ps:
            h = _layer(h, W, b)
        return jnp.mean(h.astype(jnp.float32) ** 2)

    return loss, (ps, x)


def _min_no_bigger(L, D, B, fractions):
    f, args = _stack(L, D, B)
    plain = temp(jax.grad(f), *args)
    g = jax.grad(jaxform.optimize(f, memory="min"))
    least, w = said(lambda: temp(g, *args))
    assert least <= plain, (least, plain)
    for fr in fractions:
        mem = int(fr * plain)
        got, _ = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
        assert least <= got, (fr, least, got)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(g(*args), jax.grad(f)(*args), rtol=1e-4)
    for m in w:      # a "min" warning quotes what runs (to 0.01 MiB)
        q = re.search(r"brings .*? to ([\d.]+) MiB", m)
        if q:
            assert abs(float(q.group(1)) - least / 2 ** 20) <= 0.006, (m, least)


def test_min_two_layers_no_bigger_than_plain_or_a_budget():
    """2 dense+gelu layers (D=16, B=64): "min" no bigger than plain jax.grad nor than what 0.7 x plain reaches."""
    _min_no_bigger(2, 16, 64, (0.7,))


@pytest.mark.slow
@pytest.mark.parametrize("L", [8, 16])
def test_min_deep_stack_no_bigger_than_plain_or_any_budget(L):
    """8 and 16 layers (D=32, B=256): "min" (557056 B / 1081344 B) no bigger than plain (1015808 / 2064384)
    nor than budgets of 0.9, 0.7, 0.5 x plain (819200 / 557056 / 557056 at 8 layers)."""
    _min_no_bigger(L, 32, 256, (0.9, 0.7, 0.5))


@pytest.mark.slow
def test_min_forty_layers_never_bigger_than_plain():
    """40 dense+gelu layers (D=16, B=128): every candidate compiled; never bigger than plain, plain's grads."""
    _min_no_bigger(40, 16, 128, ())


@pytest.mark.slow
@pytest.mark.parametrize("use", ["argnums1", "has_aux", "value_and_grad", "f16", "bf16", "vmap_grad", "jvp",
                                 "custom_rules", "rng_key"])
def test_min_uses_equal_plain_jax(use):
    """8 layers (D=32, B=128) under memory="min": each use's values (dtypes, shapes) equal plain JAX's and its
    XLA temp is never bigger than plain's (e.g. argnums=1: 147456 B vs 376832 B; has_aux with an argmax (int)
    and a bool aux: 294928 B vs 524304 B)."""
    L, D, B = 8, 32, 128
    dtype = {"f16": np.float16, "bf16": jnp.bfloat16}.get(use, np.float32)
    f, (ps, x) = _stack(L, D, B, dtype)
    opt = jaxform.optimize(f, memory="min")
    args = (ps, x)
    if use == "argnums1":
        mk = lambda g: jax.grad(g, argnums=1)  # noqa: E731
    elif use == "has_aux":
        def aux(ps, x):
            h = x
            for W, b in ps:
                h = _layer(h, W, b)
            return jnp.mean(h ** 2), (jnp.argmax(h, axis=1), jnp.sum(h) > 0)
        f, opt = aux, jaxform.optimize(aux, memory="min")
        mk = lambda g: jax.grad(g, has_aux=True)  # noqa: E731
    elif use == "value_and_grad":
        mk = jax.value_and_grad
    elif use == "vmap_grad":
        args = (ps, jnp.stack([x, x * 0.5]))
        mk = lambda g: jax.vmap(jax.grad(g), in_axes=(None, 0))  # noqa: E731
    elif use == "jvp":
        mk = lambda g: (lambda ps, x: jax.jvp(functools.partial(g, ps), (x,), (x,)))  # noqa: E731
    elif use == "custom_rules":
        @jax.custom_vjp
        def cg(h):
            return jnp.tanh(h)
        cg.defvjp(lambda h: (jnp.tanh(h), h), lambda h, g: (g * 3.0 * (1 - jnp.tanh(h) ** 2),))

        @jax.custom_jvp
        def cj(h):
            return jnp.sin(h)
        cj.defjvp(lambda p, t: (jnp.sin(p[0]), 2.0 * t[0]))

        def f(ps, x):
            h = x
            for W, b in ps:
                h = cj(cg(h @ W + b))
                h = h + 0.1 * jnp.tanh(h)
            return jnp.mean(h ** 2)
        opt = jaxform.optimize(f, memory="min")
        mk = jax.grad
    elif use == "rng_key":
        def f(ps, x, k):
            h = x
            for W, b in ps:
                h = jax.nn.gelu(h @ W + b) * jax.random.bernoulli(k, 0.9, (B, D))
            return jnp.mean(h ** 2)
        opt = jaxform.optimize(f, memory="min")
        args = (ps, x, jax.random.key(1))
        mk = jax.grad
    else:
        mk = jax.grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = mk(opt)(*args)
        tg = temp(mk(opt), *args)
    close(got, mk(f)(*args), rtol=1e-2 if dtype != np.float32 else 1e-4, weak=False)
    assert tg <= temp(mk(f), *args)


@pytest.mark.slow
def test_min_runs_a_debug_callback_as_often_as_plain_jax():
    """A jax.debug.callback after the 4th of 8 layers: jax.grad(optimize(f, memory="min")), eager and under
    jit: one call, as plain jax.grad (recomputing the segment must not run it again)."""
    calls = []
    _, (ps, x) = _stack(8, 32, 128)

    def f(ps, x):
        h = x
        for i, (W, b) in enumerate(ps):
            h = _layer(h, W, b)
            if i == 3:
                jax.debug.callback(lambda v: calls.append(float(v)), jnp.sum(h))
        return jnp.mean(h ** 2)

    want = jax.grad(f)(ps, x)
    plain = list(calls)
    for g in (jax.grad(jaxform.optimize(f, memory="min")), jax.jit(jax.grad(jaxform.optimize(f, memory="min")))):
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            close(g(ps, x), want, rtol=1e-4, weak=False)
        assert len(calls) == len(plain) == 1
        np.testing.assert_allclose(calls, plain, rtol=1e-4)     # (the sum fused otherwise: float rounding)


# ================================ change 3: fission judged with thin_residuals ================================

def _a(seed, *shape, k=0.5):
    return jnp.asarray(np.random.RandomState(seed).randn(*shape) * k, np.float32)


def rnn_input_projection(w, u, xs):
    def cell(h, x):
        return jnp.tanh(h @ w + x @ u), None
    h, _ = lax.scan(cell, jnp.zeros((xs.shape[1], w.shape[0])), xs)
    return jnp.sum(h ** 2)


def rnn_max_sum(w, xs):
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = lax.scan(cell, jnp.zeros(xs.shape[1:]), xs)
    return jnp.max(ys * 2) + jnp.sum(ys)


def two_carries(w, v, xs):
    def cell(c, x):
        h, g = c
        h = jnp.tanh(h @ w + x)
        g = g * 0.9 + jnp.sin(x @ v)
        return (h, g), (h, g)
    (h, g), (hs, gs) = lax.scan(cell, (jnp.zeros(xs.shape[1:]), jnp.zeros(xs.shape[1:])), xs)
    return jnp.sum(h ** 2) + jnp.max(gs) + jnp.sum(hs * 0.1) + jnp.sum(g)


def proj_max_sum(w, u, xs):
    def cell(h, x):
        p = jnp.tanh(x @ u)
        h = jnp.tanh(h @ w + p)
        return h, (h, p)
    _, (ys, ps) = lax.scan(cell, jnp.zeros((xs.shape[1], w.shape[0])), xs)
    return jnp.max(ys) + jnp.sum(ys) + jnp.sum(ps ** 2)


def _programs(L, B=16, H=32):
    return {
        "rnn_input_projection": (rnn_input_projection, (_a(1, H, H, k=1 / np.sqrt(H)), _a(5, 16, H, k=0.25),
                                                        _a(6, L, B, 16))),
        "rnn_max_sum": (rnn_max_sum, (_a(1, H, H, k=1 / np.sqrt(H)), _a(2, L, B, H))),
        "two_carries": (two_carries, (_a(1, H, H, k=1 / np.sqrt(H)), _a(3, H, H, k=0.2), _a(2, L, B, H))),
        "proj_max_sum": (proj_max_sum, (_a(1, H, H, k=1 / np.sqrt(H)), _a(5, H, H, k=0.25), _a(6, L, B, H))),
    }


USES = {
    "forward": (lambda f, kw: jaxform.optimize(f, **kw), lambda f: f),
    "grad_of_optimize": (lambda f, kw: jax.grad(jaxform.optimize(f, **kw), argnums=(0, 1)),
                         lambda f: jax.grad(f, argnums=(0, 1))),
    "optimize_of_grad": (lambda f, kw: jaxform.optimize(jax.grad(f), **kw), lambda f: jax.grad(f)),
}


def _check_use(name, use, memory, L=64):
    f, args = _programs(L)[name]
    mk, plain = USES[use]
    kw = {} if memory is None else {"memory": memory if memory in ("auto", "min") else
                                    int(0.5 * temp(jax.grad(f), *args))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = mk(f, kw)(*args)
        jitted = jax.jit(mk(f, kw))(*args)
        t = temp(mk(f, kw), *args)
    want = plain(f)(*args)
    close(got, want)
    close(jitted, jax.jit(plain(f))(*args))
    assert t <= temp(plain(f), *args), (t, temp(plain(f), *args))


@pytest.mark.slow
def test_fission_and_thinning_under_optimize_of_grad_equal_plain():
    """optimize(jax.grad(rnn_input_projection)) (L=16): fission and thin_residuals kept together; the
    gradients (dtypes, weak types) of plain JAX, XLA temp no more than plain jit's."""
    _check_use("rnn_input_projection", "optimize_of_grad", None, L=16)


@pytest.mark.slow
@pytest.mark.parametrize("memory", [None, "auto", "min", "budget"])
@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("name", ["rnn_input_projection", "rnn_max_sum", "two_carries", "proj_max_sum"])
def test_fission_thinning_programs_equal_plain_and_never_bigger(name, use, memory):
    """Every program x use x memory: the values, dtypes and weak types of plain JAX (eager and under jit), and
    XLA temp never more than plain jax.jit of the same use (e.g. two_carries, optimize(grad), None: 143492 B
    vs 403588 B, fission and thinning kept)."""
    _check_use(name, use, memory)


def test_fission_keeps_effect_order_in_a_split_loop(monkeypatch):
    """A loop with two independent carries, one printing through jax.debug.callback each step, under
    JAXFORM_MEASURE=1: optimize(f) forward and jax.grad(optimize(f)): the callback's values in plain JAX's order."""
    monkeypatch.setenv("JAXFORM_MEASURE", "1")
    calls = []
    w, v, xs = _a(1, 8, 8, k=0.3), _a(3, 8, 8, k=0.2), _a(2, 6, 4, 8)

    def f(w, v, xs):
        def cell(c, x):
            h, g = c
            h = jnp.tanh(h @ w + x)
            g = g * 0.9 + jnp.sin(x @ v)
            jax.debug.callback(lambda a: calls.append(float(a)), g[0, 0])
            return (h, g), (h, g)
        (h, g), (hs, gs) = lax.scan(cell, (jnp.zeros(xs.shape[1:]), jnp.zeros(xs.shape[1:])), xs)
        return jnp.sum(h ** 2) + jnp.max(gs) + jnp.sum(hs * 0.1) + jnp.sum(g)

    for use in (lambda g: g, lambda g: jax.grad(g, argnums=(0, 1))):
        calls.clear()
        want = use(f)(w, v, xs)
        plain = list(calls)
        calls.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = use(jaxform.optimize(f))(w, v, xs)
        close(got, want, weak=False)
        assert len(calls) == len(plain)
        np.testing.assert_allclose(calls, plain, rtol=1e-4)


@pytest.mark.slow
def test_fission_thinning_with_timing_on_equal_plain(monkeypatch):
    """JAXFORM_MEASURE=1 (the planner times what the model cannot tell; `with_enabled` judged on measured
    pairs): optimize(jax.grad(f)) and jax.grad(optimize(f)) of rnn_max_sum and rnn_input_projection: plain
    JAX's gradients, never more XLA temp than plain."""
    monkeypatch.setenv("JAXFORM_MEASURE", "1")
    for name in ("rnn_max_sum", "rnn_input_projection"):
        for use in ("optimize_of_grad", "grad_of_optimize"):
            _check_use(name, use, None, L=16)


@pytest.mark.slow
def test_budget_on_rnn_max_sum_reaches_what_the_default_reaches():
    """Finding B (medium; fuse_scan_reductions/after_memory_planning, not these changes). Input: rnn_max_sum
    (L=64, B=16, H=32), jax.grad(optimize(f, memory=0.5 x plain jax.grad temp = 394336 B)). Expected: within
    the budget (memory=None reaches 276744 B with fuse_scan_reductions kept "once loop memory planning has
    run", where its timing allows; "min" 101000 B). Got: 400208 B and "remat_loops cannot fit ... in
    memory=394336 bytes": fuse_scan_reductions refused ("more grad (value returned) temp memory than the
    program as traced"), and `after_memory_planning` did not rescue it: with remat after both, the fused
    gradient takes 270.3 KiB in each view, the unfused 390.8 KiB under jax.grad (over the budget) but 263.0 KiB
    under jax.value_and_grad, so `judge` read the fusion as giving back 7.3 KiB of value_and_grad's memory for
    time (refused for a predicted 0.47x). Fixed: under a byte budget `judge` keeps a proposal that brings the
    worst gradient view down where it misses the budget and grows only gradient views, within it
    (`planner._over_budget`: memory first, time not weighed); the budget now runs 276744 B, no warning.
    (The premise is "min"'s or the default's fit: the default's keeps the fusion only where it times no
    slower, which a loaded 2-core machine does not always measure.)"""
    f, args = _programs(64)["rnn_max_sum"]
    plain = temp(jax.grad(f), *args)
    mem = int(0.5 * plain)
    default, _ = said(lambda: temp(jax.grad(jaxform.optimize(f)), *args))
    least, _ = said(lambda: temp(jax.grad(jaxform.optimize(f, memory="min")), *args))
    assert min(default, least) <= mem     # the premise: the default or "min" fits it
    got, w = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
    assert got <= mem, (got, mem, default, least, w)
    assert not [m for m in w if "cannot fit" in m], w


@pytest.mark.slow
def test_optimize_of_grad_budget_met_says_nothing_false():
    """Finding C (medium; recompute.is_gradient reads the top level only, not these changes). Input:
    two_carries (L=64, B=16, H=32), optimize(jax.grad(f), memory=0.5 x plain = 201794 B) called forward (its
    add_any all inside the loops' bodies). Expected: no "cannot fit" warning (the program runs 143492 B,
    within the budget), or one quoting what runs. Got: "remat_program cannot fit the gradient of its first
    argument ... in memory=201794 bytes: without recomputation it takes 1.27 MiB ... its gradient stays at
    1.27 MiB": the gradient of the gradient program, which nobody runs (and compiled for it). Fixed."""
    f, args = _programs(64)["two_carries"]
    mem = int(0.5 * temp(jax.grad(f), *args))
    o = jaxform.optimize(jax.grad(f), memory=mem)
    got, w = said(lambda: temp(o, *args))
    assert got <= mem, (got, mem)     # the premise: met
    assert not [m for m in w if "cannot fit" in m], w


# ================================ change 4: program_identity ================================

X = jnp.ones((4, 4), jnp.float32)


def test_identity_keeps_apart_programs_printed_alike():
    """Two debug callbacks, two io_callbacks, two custom_jvp rules, custom_vjp bwds differing only in a
    nondiff static: printed alike, keyed apart (the last one unshared: its WrappedFun param is unhashable)."""
    from jax.experimental import io_callback

    def dc(fn):
        return lambda x: (jax.debug.callback(fn, x), x + 1)[1]
    a, b = jax.make_jaxpr(dc(lambda v: None))(X), jax.make_jaxpr(dc(lambda v: print(v)))(X)
    assert str(a) == str(b) and key(a) != key(b)

    def io(fn):
        return lambda x: io_callback(fn, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1
    a, b = jax.make_jaxpr(io(lambda v: v))(X), jax.make_jaxpr(io(lambda v: v * 2))(X)
    assert str(a) == str(b) and key(a) != key(b)

    def mk(s):
        @jax.custom_jvp
        def c(x):
            return jnp.sin(x)
        c.defjvp(lambda p, t: (jnp.sin(p[0]), s * t[0]))
        return c
    c1, c2 = mk(1.0), mk(2.0)
    a, b = jax.make_jaxpr(c1)(X), jax.make_jaxpr(c2)(X)
    assert str(a) == str(b) and key(a) != key(b)
    assert key(jax.make_jaxpr(c1)(X)) == key(jax.make_jaxpr(c1)(X))

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def cv(s, x):
        return jnp.sin(x)
    cv.defvjp(lambda s, x: (jnp.sin(x), x), lambda s, r, g: (s * g * jnp.cos(r),))
    a, b = jax.make_jaxpr(lambda x: cv(2.0, x))(X), jax.make_jaxpr(lambda x: cv(3.0, x))(X)
    assert str(a) == str(b) and key(a) != key(b) and key(a)[0] == "unshared"


def test_identity_keeps_apart_types_literals_constants_and_contexts():
    """weak vs strong f32 input, 0.0 vs -0.0 literal, equal-valued distinct constant arrays, threefry modes,
    matmul precision: each its own key."""
    assert key(jax.make_jaxpr(lambda x: x * 2)(1.0)) != key(jax.make_jaxpr(lambda x: x * 2)(jnp.float32(1.0)))
    assert key(jax.make_jaxpr(lambda x: x * 0.0)(X)) != key(jax.make_jaxpr(lambda x: x * -0.0)(X))
    assert key(jax.make_jaxpr(lambda x: x.astype(jnp.float16))(X)) != \
        key(jax.make_jaxpr(lambda x: x.astype(jnp.bfloat16))(X))
    c1, c2 = jnp.arange(4.0), jnp.arange(4.0)
    assert key(jax.make_jaxpr(lambda x: x + c1)(X)) != key(jax.make_jaxpr(lambda x: x + c2)(X))
    assert key(jax.make_jaxpr(lambda x: x + c1)(X)) == key(jax.make_jaxpr(lambda x: x + c1)(X))
    h, k = (lambda k: jax.random.normal(k, (4,))), jax.random.PRNGKey(0)
    was = jax.config.jax_threefry_partitionable
    try:
        ka = key(jax.make_jaxpr(h)(k))
        jax.config.update("jax_threefry_partitionable", not was)
        kb = key(jax.make_jaxpr(h)(k))
    finally:
        jax.config.update("jax_threefry_partitionable", was)
    assert ka != kb
    m = lambda a: a @ a  # noqa: E731
    k1 = key(jax.make_jaxpr(m)(X))
    with jax.default_matmul_precision("highest"):
        k2 = key(jax.make_jaxpr(m)(X))
    assert k1 != k2


@pytest.mark.parametrize("prog", ["scan", "cond", "while", "fori", "custom_vjp", "checkpoint_policy", "grad"])
def test_identity_of_the_same_program_traced_twice_is_equal(prog):
    """The same program traced twice: one key (the caches share its entries)."""
    @jax.custom_vjp
    def cv(x):
        return jnp.sin(x)
    cv.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))
    f = {"scan": lambda x: lax.scan(lambda c, _: (jnp.sin(c), c), x, None, length=3),
         "cond": lambda x: lax.cond(x[0, 0] > 0, jnp.sin, jnp.cos, x),
         "while": lambda x: lax.while_loop(lambda c: c[0, 0] < 5, lambda c: c + 1, x),
         "fori": lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2, x),
         "custom_vjp": cv,
         "checkpoint_policy": jax.checkpoint(jnp.sin, policy=jax.checkpoint_policies.dots_saveable),
         "grad": jax.grad(lambda x: jnp.sum(cv(x) * jnp.tanh(x)))}[prog]
    assert key(jax.make_jaxpr(f)(X)) == key(jax.make_jaxpr(f)(X))


@pytest.mark.slow
def test_measure_keys_two_custom_jvp_programs_apart_and_each_gradient_is_its_own(monkeypatch):
    """JAXFORM_MEASURE=1: two losses with one forward and different jvp rules, each planned (measure's memo and
    the planner's costs keyed by program_identity): each optimized gradient is its own rule's."""
    monkeypatch.setenv("JAXFORM_MEASURE", "1")

    def make(scale):
        @jax.custom_jvp
        def f(x):
            return jnp.sin(x)
        f.defjvp(lambda p, t: (jnp.sin(p[0]), scale * t[0]))

        def loss(xs):
            return jnp.sum(lax.scan(lambda c, x: (c + f(x), None), jnp.zeros(8), xs)[0] ** 2)
        return loss

    xs = jnp.linspace(-1, 1, 64, dtype=jnp.float32).reshape(8, 8)
    for s in (1.0, 3.0):
        f = make(s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            close(jax.grad(jaxform.optimize(f))(xs), jax.grad(f)(xs))
            close(jaxform.optimize(jax.grad(f))(xs), jax.grad(f)(xs))
