"""Attack, round 9: three changes of f396a7b / 5d28f64.

1. `plan.memory.choose`: a byte budget must be met by `jax.value_and_grad`'s program too (or said).
2. `plan.cost.gradient_known`: traced under a known `jax.grad`, a budget measures only that gradient.
3. `planner._Planning.loop_by_loop` + `per_loop.only_loop(...).positions`: per-loop proposals, then the
   pass with every loop in view; the other loops found again after a rewrite that adds loops.
4. `GIVE_BACK_MEASURED` 1.10 -> 1.25.

Four findings: two fixed (budgets on loop programs now hold `jax.value_and_grad`'s program too; `positions`
read in emitted order), each a regression test with a comment saying what it found; two (`value_and_grad` and
`has_aux` under a known gradient use, older than these changes) fixed the next session: a gradient is judged with
its value returned, and in the gradient of its first output alone. The rest
is coverage of the attacks that held. Programs are small (each compile well under a second); values are compared with
plain JAX (dtype and weak type included), memory with plain `jax.jit` of the same transform (XLA temp).
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.ir import Graph, ScanLoop
from jaxform.passes import fission
from jaxform.plan import planner
from jaxform.plan.per_loop import only_loop, top_loops
from jaxform.plan.planner import Cost, ViewCost, judge
from jaxform.plan.use import Use

from plan.programs import rnn_mse, sincos  # noqa: E402  (tests/plan/programs.py; not `programs`: tests/inspect has one)


def _a(*shape, k=0.3, seed=0):
    return jnp.asarray(np.random.default_rng(seed + 7 * len(shape) + sum(shape)).standard_normal(shape) * k,
                       jnp.float32)


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def said(fn):
    """fn()'s result and the warnings it gave (planning happens at the first trace)."""
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(m.message) for m in w]


def close(got, want, rtol=1e-5):
    """Same tree, dtypes, weak types, shapes; values to rtol (atol scaled by the largest value: f32
    reassociation over a loop), NaN and inf where plain JAX has them, signed zeros as JAX's."""
    ga, wa = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for x, y in zip(ga, wa):
        x, y = jnp.asarray(x), jnp.asarray(y)
        assert (x.dtype, x.shape, x.weak_type) == (y.dtype, y.shape, y.weak_type), \
            ((x.dtype, x.shape, x.weak_type), (y.dtype, y.shape, y.weak_type))
        if x.dtype == jax.dtypes.float0:
            continue
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
        np.testing.assert_array_equal(np.isposinf(x), np.isposinf(y))
        np.testing.assert_array_equal(np.isneginf(x), np.isneginf(y))
        np.testing.assert_array_equal(np.signbit(x[(x == 0) & (y == 0)]), np.signbit(y[(x == 0) & (y == 0)]))
        fin = np.isfinite(y)
        scale = float(np.max(np.abs(y[fin]))) if fin.any() else 1.0
        np.testing.assert_allclose(x[fin], y[fin], rtol=rtol, atol=rtol * scale + 1e-7)


def rnn(w, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]


# =========================================================================================================
# Findings
# =========================================================================================================

def _sincos_args():
    return _a(8, 16), _a(50, 8, 16, seed=1), _a(50, 8, 16, seed=2)


# Found: a byte budget on a program with loops was fitted and checked on jax.grad's gradient only
# (fit_loops / loop_budget_check); sincos's gradient w.r.t. its first argument takes 0 B, so any budget "fit"
# while jax.value_and_grad(o) took ~26 KiB > 2000 B, silently. Fixed: `memory.budgeted_temp` (both programs).
def test_loop_budget_met_by_value_and_grad_or_said_sincos():
    args = _sincos_args()
    budget = 2000
    o = jaxform.optimize(sincos, memory=budget)
    (g, vg), msgs = said(lambda: (temp(jax.grad(o), *args), temp(jax.value_and_grad(o), *args)))
    assert (g <= budget and vg <= budget) or any("cannot fit" in m for m in msgs), (g, vg, budget, msgs)


# Found: the README RNN + MSE under a budget between its plan's jax.grad and jax.value_and_grad temps
# (L=200 B=16 H=32, JAX 0.10.2 CPU: 422020 and 424192 B): grad fit, value_and_grad did not, nothing said. Fixed.
def test_loop_budget_met_by_value_and_grad_or_said_rnn():
    L, B, H = 200, 16, 32
    args = _a(H, H, k=1 / np.sqrt(H)), _a(L, B, H, seed=1), _a(L, B, H, seed=2)
    auto = jaxform.optimize(rnn_mse, memory="auto")
    g0, vg0 = temp(jax.grad(auto), *args), temp(jax.value_and_grad(auto), *args)
    if vg0 <= g0:
        pytest.skip(f"this XLA schedules value_and_grad no bigger than grad here ({vg0} <= {g0})")
    budget = g0 + (vg0 - g0) // 2
    o = jaxform.optimize(rnn_mse, memory=budget)
    (g, vg), msgs = said(lambda: (temp(jax.grad(o), *args), temp(jax.value_and_grad(o), *args)))
    close(jax.value_and_grad(o)(*args), jax.value_and_grad(rnn_mse)(*args), rtol=1e-4)
    assert (g <= budget and vg <= budget) or any("cannot fit" in m for m in msgs), (g, vg, budget, msgs)


# Finding 3 (fixed): under a known jax.grad use the grad view of sincos w.r.t. x1 was 0 B whatever the rewrite,
# so fusion/fission were kept 'no bigger' while jax.jit(jax.value_and_grad(optimize(sincos))) took 26200 B
# against plain's 25688 B (28888 B under memory='min'): a gradient is now judged with its value returned.
@pytest.mark.parametrize("memory", [None, "min"])
def test_value_and_grad_never_bigger_than_plain(memory):
    args = _sincos_args()
    o = jaxform.optimize(sincos, memory=memory)
    close(jax.value_and_grad(o)(*args), jax.value_and_grad(sincos)(*args))
    assert temp(jax.value_and_grad(o), *args) <= temp(jax.value_and_grad(sincos), *args)


def _with_aux(w, zs):
    vs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), jnp.cos(x) * h), jnp.zeros(zs.shape[1:]), zs)[1]
    return jnp.sum(w ** 2), vs


# Finding 4 (fixed): the grad view put a ones cotangent on every float output, the aux included, so the aux's
# loop looked like a big gradient in which fission's batched cos(zs) was 'no bigger'; JAX gives the aux no
# cotangent: jax.grad(optimize(f), has_aux=True) took 32388 B where plain's takes 1668 B (19x). Now also judged
# in the gradient of the first output alone (use.AUX_GRAD).
def test_grad_has_aux_never_bigger_than_plain():
    args = _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)
    o = jaxform.optimize(_with_aux)
    close(jax.grad(o, has_aux=True)(*args), jax.grad(_with_aux, has_aux=True)(*args))
    assert temp(jax.grad(o, has_aux=True), *args) <= temp(jax.grad(_with_aux, has_aux=True), *args)


def _three_lines(m, xs, zs, us):
    """Three top-level scans on three source lines, each body with a loop-invariant nested scan."""
    def body(h, x):
        p = lax.scan(lambda c, _: (jnp.tanh(c @ m), None), m, None, length=6)[0]
        h = jnp.tanh(h @ p + x)
        return h, h
    ys = lax.scan(body, jnp.zeros(xs.shape[1:]), xs)[1]
    vs = lax.scan(body, jnp.zeros(zs.shape[1:]), zs)[1]
    qs = lax.scan(body, jnp.zeros(us.shape[1:]), us)[1]
    return jnp.sum(ys) + jnp.sum(vs ** 2) + jnp.sum(qs ** 3)


def _hoist_appended(graph: Graph) -> Graph:
    """A decided pass as docs/extending.md writes one, moving a loop-invariant nested scan out of each scan
    body, but appending the copy (no `before=`: the IR allows it, `to_jaxpr` emits producers first)."""
    for node in [n for n in graph.nodes if n.name == "scan"]:
        loop = ScanLoop(node)
        outer = {v.id: o for v, o in zip(loop.body_consts, loop.consts)}
        for n in [n for n in loop.body.nodes if n.name == "scan"]:
            if all(v.id in outer for v in n.inputs) and not n.effects:
                moved = graph.copy_node(n, [outer[v.id] for v in n.inputs])
                for old, new in zip(n.outputs, loop.add_consts(moved.outputs)):
                    loop.body.replace_uses(old, new)
                loop.body.remove(n)
    return graph


_hoist_appended.pass_name, _hoist_appended.exact, _hoist_appended.decided = "hoist_appended", True, True


def _lengths(closed) -> list:
    return [n.params["length"] for n in top_loops(Graph.from_jaxpr(closed))]


# Found: only_loop's `positions` indexed the pass's Graph node list, whose order may be stale after an edit
# (Graph.add appends; to_jaxpr emits producers first): a rewrite of loop 0 appending its hoisted loop at the end
# gave positions 1, 2 for loops at 2, 3. Fixed: positions are read in the order the program is emitted.
def test_only_loop_positions_match_the_program_returned():
    args = _a(8, 8, k=0.2), _a(3, 2, 8), _a(4, 2, 8, seed=1), _a(5, 2, 8, seed=2)
    closed = jax.make_jaxpr(_three_lines)(*args)
    before = _lengths(closed)
    assert before == [3, 4, 5]
    one = only_loop(_hoist_appended, 0)
    out = one(Graph.from_jaxpr(closed)).to_jaxpr()
    after = _lengths(out)
    assert len(after) == 4          # the hoisted nested loop is a top-level loop now
    for j, i in one.positions.items():
        assert after[i] == before[j], (one.positions, before, after)


# Found (end to end, the stale positions above): loop 1 was proposed twice, loop 2 judged under the label
# "loop 3 of 3", loop 3 never proposed alone. Fixed with them.
def test_per_loop_decisions_name_the_loop_they_judged():
    args = _a(8, 8, k=0.2), _a(30, 4, 8), _a(40, 4, 8, seed=1), _a(50, 4, 8, seed=2)
    o = jaxform.optimize(_three_lines, passes=["inline", "cse", _hoist_appended, "dce"], plan=True)
    close(o(*args), _three_lines(*args))
    lines = {}
    for d in o.decisions():
        if "[loop " in d.pass_name:
            k = int(d.pass_name.split("[loop ")[1].split(" of")[0])
            lines[k] = int(d.pass_name.split("test_attack_round9.py:")[1].split(":")[0])
    first = _three_lines.__code__.co_firstlineno
    want = {1: first + 6, 2: first + 7, 3: first + 8}       # the lines of ys, vs, qs
    assert lines and all(lines[k] == want[k] for k in lines), (lines, want, [str(d) for d in o.decisions()])
    assert set(lines) == {1, 2, 3}, [str(d) for d in o.decisions()]


# =========================================================================================================
# Attacks that held (coverage)
# =========================================================================================================

def test_only_loop_positions_after_fission_adds_a_loop():
    """fission batches a carry-free nested scan in front of its loop (a new top-level loop): the other
    loops' positions follow, for each loop proposed alone."""
    def f(w, xs, zs, us):
        def outer(h, x):
            _, inner = lax.scan(lambda g, t: (jnp.sin(g) + t, jnp.cos(g) * t), x[0], x)
            h = jnp.tanh(h @ w + inner.sum(0))
            return h, h
        vs = rnn(w, zs)
        _, ys = lax.scan(outer, jnp.zeros(xs.shape[2:]), xs)
        return jnp.sum(ys ** 2) + jnp.sum(vs) + jnp.sum(rnn(w.T, us))
    args = _a(8, 8), _a(5, 3, 4, 8), _a(7, 4, 8), _a(9, 4, 8)
    closed = jax.make_jaxpr(f)(*args)
    before = _lengths(closed)
    assert before == [7, 5, 9]
    grew = False
    for k in range(3):
        one = only_loop(fission, k)
        after = _lengths(one(Graph.from_jaxpr(closed)).to_jaxpr())
        grew |= len(after) > len(before)
        assert set(one.positions) == set(range(3)) - {k}
        for j, i in one.positions.items():
            assert after[i] == before[j], (k, one.positions, before, after)
    assert grew


def _three(w, xs, zs, us):
    """Three top-level scans (a stacked-state RNN reduced by max and sum, a transposed one, a carry-free
    sin/cos), rewritten by fusion, fission and thin_residuals (which pairs a gradient's loops)."""
    ys = rnn(w, xs)
    vs = rnn(w.T, zs)
    c, qs = lax.scan(lambda c, x: (jnp.sin(c), jnp.cos(x)), jnp.ones(us.shape[1:]), us)
    return jnp.max(ys * 2, initial=-1e9) + jnp.sum(ys) + jnp.mean(vs ** 2) + jnp.sum(qs ** 2) + jnp.sum(c)


def test_three_loops_one_empty_one_single_step_every_use():
    """Per-loop proposals then the pass with every loop in view, on three scans running 12, 0 and 1 steps:
    the forward under jit, jax.jit(jax.grad(optimize(f))) and optimize(jax.grad(f)) equal plain JAX and are
    never bigger than plain jax.jit of the same thing."""
    args = _a(8, 8, k=0.25), _a(12, 3, 8), _a(0, 3, 8, seed=1), _a(1, 3, 8, seed=2)
    g = jax.grad(_three, argnums=(0, 1))
    og = jaxform.optimize(g)
    close(og(*args), g(*args), rtol=1e-4)
    assert temp(og, *args) <= temp(g, *args)
    assert any("[loop " in d.pass_name for d in og.decisions()), [str(d) for d in og.decisions()]
    o = jaxform.optimize(_three)
    close(jax.grad(o, argnums=(0, 1))(*args), g(*args), rtol=1e-4)
    assert temp(jax.grad(o, argnums=(0, 1)), *args) <= temp(g, *args)
    o = jaxform.optimize(_three)
    close(jax.jit(o)(*args), _three(*args))
    assert temp(o, *args) <= temp(_three, *args)


def test_callbacks_in_loops_keep_order_and_count():
    """debug.callback inside both of two loops: the hidden-loop proposals and the pass with every loop in
    view move no effect (order and count of calls as plain JAX's), under jax.grad(optimize(f)) and
    optimize(jax.grad(f))."""
    log = []

    def f(w, xs, zs):
        def c1(h, x):
            h = jnp.tanh(h @ w + x)
            jax.debug.callback(lambda v: log.append(("a", float(v))), h[0, 0])
            return h, h
        _, ys = lax.scan(c1, jnp.zeros(xs.shape[1:]), xs)

        def c2(h, x):
            jax.debug.callback(lambda v: log.append(("b", float(v))), x[0, 0])
            return jnp.tanh(h @ w.T + x), jnp.cos(x) * 2
        _, vs = lax.scan(c2, jnp.zeros(zs.shape[1:]), zs)
        return jnp.sum(ys ** 2) + jnp.max(ys) + jnp.mean(vs)

    args = _a(8, 8, k=0.2), _a(5, 4, 8), _a(3, 4, 8, seed=1)

    def run(fn):
        log.clear()
        out = fn()
        jax.effects_barrier()
        return out, list(log)

    o1, o2 = jaxform.optimize(f, memory="min"), jaxform.optimize(jax.grad(f), memory="min")
    for got, want in [(lambda: jax.grad(o1)(*args), lambda: jax.grad(f)(*args)),
                      (lambda: o2(*args), lambda: jax.grad(f)(*args))]:
        (a, la), _ = said(lambda: run(got))
        b, lb = run(want)
        close(a, b, rtol=1e-4)
        assert [t[0] for t in la] == [t[0] for t in lb], (la, lb)
        np.testing.assert_allclose([t[1] for t in la], [t[1] for t in lb], rtol=1e-5, atol=1e-6)


def test_rng_int_carry_and_while_loop_beside_a_scan():
    """RNG and an integer carry inside a scan, a while loop (bounded by max_steps) beside it: forward and
    gradient as plain JAX's (the while loop's gradient against the same loop written as a 5-step scan)."""
    def of(loop):
        def f(w, xs, key, n):
            def step(c, x):
                k, h, i = c
                k, s = jax.random.split(k)
                h = jnp.tanh(h @ w + x * jax.random.uniform(s, x.shape))
                return (k, h, i + 1), h * i.astype(h.dtype)
            (_, h, i), ys = lax.scan(step, (key, jnp.zeros(xs.shape[1:]), n), xs)
            m = loop(w, ys[-1])
            return jnp.sum(ys ** 2) + jnp.max(ys) + jnp.sum(m ** 2) + i.astype(jnp.float32)
        return f

    f = of(lambda w, h: lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, jnp.tanh(s[1] @ w)), (0, h))[1])
    ref = of(lambda w, h: lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=5)[0])
    args = (_a(8, 8, k=0.25), _a(6, 3, 8), jax.random.PRNGKey(3), jnp.int32(2))
    o = jaxform.optimize(f, memory="auto", max_steps=8)
    (got, _) = said(lambda: jax.value_and_grad(o)(*args))
    close(got[0], f(*args))
    close(got[1], jax.grad(ref)(*args), rtol=1e-4)


def test_inf_nan_signed_zero_land_where_plain_jax_puts_them():
    """inf, NaN and -0.0 in the inputs of two loops (the second of length 0, then the same inputs), forward
    and under vmap, and a gradient: where plain JAX's land (NaN for NaN, the sign of a zero)."""
    def f(w, xs, zs):
        ys = rnn(w, xs)
        c, qs = lax.scan(lambda c, x: (c * 0.5, jnp.cos(x) * c), 1.0, zs)
        return jnp.sum(ys ** 2, axis=0), jnp.max(qs, axis=0, initial=-jnp.inf), c, jnp.min(ys * -0.0, axis=0)

    bad = _a(6, 3, 8).at[2, 0, 0].set(jnp.inf).at[3, 1, 2].set(jnp.nan).at[4, 2, 1].set(-jnp.inf) \
        .at[1, 1, 1].set(-0.0)
    w = _a(8, 8, k=0.2)
    for args in [(w, bad, _a(0, 3, 8)), (w, bad, bad)]:
        o = jaxform.optimize(f)
        close(o(*args), f(*args))
        vm = lambda fn: jax.vmap(fn, (None, 0, None))(args[0], jnp.stack([args[1], -args[1]]), args[2])  # noqa
        close(vm(o), vm(f))
    loss = lambda w, xs, zs: jnp.sum(jnp.nan_to_num(f(w, xs, zs)[0]))  # noqa: E731
    o = jaxform.optimize(loss)
    close(jax.grad(o, argnums=(0, 1))(w, bad, bad), jax.grad(loss, argnums=(0, 1))(w, bad, bad))


# ---- change 2: a known gradient, its argnums, closures, caching per use -----------------------------------

def test_each_argnums_use_gets_its_own_plan_under_a_budget():
    """One `optimize(f, memory=B)` used under jax.grad with argnums 1, then (0, 2), then 1 again:
    each use is planned for its own gradient (the budget measures only it), and each equals plain JAX's and
    what a fresh `optimize` gives for that use alone (no use is served another's plan)."""
    L, B, H = 60, 8, 16
    args = _a(H, H, k=1 / np.sqrt(H)), _a(L, B, H, seed=1), _a(L, B, H, seed=2)
    budget = 40_000
    o = jaxform.optimize(rnn_mse, memory=budget)
    seen = {}
    for an in (1, (0, 2), 1):
        (got, t), msgs = said(lambda: (jax.grad(o, argnums=an)(*args), temp(jax.grad(o, argnums=an), *args)))
        close(got, jax.grad(rnn_mse, argnums=an)(*args), rtol=1e-4)
        assert t <= budget or any("cannot fit" in m for m in msgs) or an in seen, (an, t, msgs)
        if an not in seen:      # (o.plan() is the latest plan built: a cached use builds none)
            assert o.plan().use == Use((("grad", an if isinstance(an, tuple) else (an,)),)), o.plan().use
        fresh = jaxform.optimize(rnn_mse, memory=budget)
        (t_fresh, _) = said(lambda: temp(jax.grad(fresh, argnums=an), *args))
        assert t == t_fresh, (an, t, t_fresh)
        seen[an] = t
    assert seen[1] <= temp(jax.grad(rnn_mse, argnums=1), *args)


def _two_params(s, p, xs, n):
    h0 = jnp.zeros(xs.shape[1:], xs.dtype)
    ys = lax.scan(lambda h, x: (jnp.tanh(h @ p["w"].astype(h.dtype) + x * s),) * 2, h0, xs)[1]
    vs = lax.scan(lambda h, x: (jnp.tanh(h @ p["u"].astype(h.dtype) + x),) * 2, h0, xs * 2)[1]
    return (jnp.sum(ys.astype(jnp.float32) ** 2) + jnp.max(vs.astype(jnp.float32)) * n.astype(jnp.float32)) * s


def test_closure_over_a_traced_parameter_under_a_budget():
    """jax.value_and_grad(lambda p: optimize(lambda xs: f(p, xs), memory=B)(xs)): the gradient w.r.t. the
    closed-over value is the one planned (`_build_open`, known=True); value and gradient are plain JAX's."""
    p, xs, n = {"w": _a(8, 8, k=0.2), "u": _a(8, 8, k=0.2, seed=3)}, _a(20, 4, 8), jnp.int32(3)
    closed = lambda q: jaxform.optimize(lambda xs: _two_params(2.0, q, xs, n), memory=3000)(xs)  # noqa: E731
    (got, _) = said(lambda: jax.value_and_grad(closed)(p))
    close(got, jax.value_and_grad(lambda q: _two_params(2.0, q, xs, n))(p))


@pytest.mark.slow
def test_bf16_params_weak_scalar_and_int_inputs_under_a_budget():
    """bf16 parameters, a weakly typed Python-float scale, integer leaves and an integer argument
    differentiated with allow_int (float0 cotangents), argnums (0, 1) and (1, 3), under a byte budget."""
    p = {"w": _a(8, 8, k=0.2).astype(jnp.bfloat16), "u": _a(8, 8, k=0.2, seed=3).astype(jnp.bfloat16),
         "k": jnp.arange(3)}
    xs, n = _a(20, 4, 8).astype(jnp.bfloat16), jnp.int32(3)
    for an in ((0, 1), (1, 3)):
        o = jaxform.optimize(_two_params, memory=3000)
        (got, _) = said(lambda: jax.value_and_grad(o, argnums=an, allow_int=True)(2.0, p, xs, n))
        close(got, jax.value_and_grad(_two_params, argnums=an, allow_int=True)(2.0, p, xs, n), rtol=3e-2)


_FLAG_SCRIPT = """
import sys, warnings, jax, jaxform
sys.path.insert(0, sys.argv[1])
from memory_budget import mlp_setup, temp
params, batch, losses = mlp_setup(B=128)
loss = losses["plain"]
cases = {
    "argnums=1": (lambda f: jax.grad(f, argnums=1), lambda f: jax.value_and_grad(f, argnums=1)),
    "closure": (lambda f: (lambda p, b: jax.grad(lambda p: f(p, b))(p)),
                lambda f: (lambda p, b: jax.value_and_grad(lambda p: f(p, b))(p))),
}
make = lambda b: jaxform.optimize(loss, memory=b)
for name, (G, VG) in cases.items():
    plain_g, plain_vg = temp(jax.jit(G(loss)), params, batch), temp(jax.jit(VG(loss)), params, batch)
    budget = int(plain_vg * 0.5)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = make(budget)
        vg = temp(jax.jit(VG(o)), params, batch)
        g = temp(jax.jit(G(o)), params, batch)
    leaves = lambda f: jax.tree_util.tree_leaves(VG(f)(params, batch))
    ok = all(bool(jax.numpy.allclose(a, b, rtol=1e-5, atol=1e-7)) for a, b in zip(leaves(o), leaves(loss)))
    print(name, budget, vg, g, plain_vg, plain_g, int(ok), sum("cannot fit" in str(w.message) for w in said))
"""


@pytest.mark.slow
def test_straight_line_budget_with_argnums_and_closure_scheduler_flag():
    """With XLA's memory scheduler on (recomputation frees memory on 0.10.2), the MLP at 50% under
    jax.grad(..., argnums=1) and under a closure: jax.grad's and jax.value_and_grad's programs each fit the
    budget or 'cannot fit' is said, neither is bigger than plain's, values are plain's (fresh process)."""
    root = Path(__file__).parents[2]
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    r = subprocess.run([sys.executable, "-c", _FLAG_SCRIPT, str(root / "benchmarks")], capture_output=True,
                       text=True, env=env, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split() for line in r.stdout.split("\n") if line.strip()]
    assert len(lines) == 2, r.stdout
    for name, budget, vg, g, pvg, pg, ok, warned in lines:
        budget, vg, g, pvg, pg, ok, warned = map(int, (budget, vg, g, pvg, pg, ok, warned))
        assert ok, name
        assert (vg <= budget and g <= budget) or warned, (name, budget, vg, g)
        assert vg <= pvg and g <= pg, (name, vg, pvg, g, pg)


# ---- change 4 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("back, speedup, kept", [(300_000, 1.2, False), (300_000, 1.3, True),
                                                  (400_000, 1.24, False), (400_000, 1.26, True),
                                                  (118_000, 1.03, False), (118_000, 1.10, True)])
def test_memory_won_is_given_back_only_for_a_measured_1_25x(back, speedup, kept):
    """Memory an earlier pass won (100 KiB of a traced program's 400 KiB) is spent again (to `back`) only for a
    measured speedup: GIVE_BACK_MEASURED = 1.25x for all of it; 1.2x (which passed at 1.10) does not buy 2/3 of it
    (1.20x would). Since session 22 a small share costs less (`planner.give_back_price`, by its square root): 6% of
    the win for 1.06x (`plan.masked`'s gradient: fission giving back 6% of remat's win, 1.2x faster)."""
    fwd = Use()
    plain = Cost((ViewCost("forward", 400_000, 1.0, "XLA", "measured"),))
    before = Cost((ViewCost("forward", 100_000, 1.0, "XLA", "measured"),))
    after = Cost((ViewCost("forward", back, 1.0 / speedup, "XLA", "measured"),))
    keep, why = judge(plain, before, after, memory_pass=False, memory=None, use=fwd)
    assert keep == kept, why
    assert planner.GIVE_BACK_MEASURED == 1.25
    if not kept:
        assert "gives back" in why, why
