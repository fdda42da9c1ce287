"""Attack, round 12: two changes.

1. `plan/measure.py`: the cache of measurements keyed in memory by `identity.structure` (process-wide LRU
   `_keys`: identity -> disk key), on disk by sha256(lowered StableHLO + every constant's bytes +
   `_machine_key()`); programs with host callbacks get a "local-" key that never touches the disk.
   Attacked: constants of every awkward kind (typed PRNG keys fry/rbg, bf16/f16/int8/bool, 0-size, scalars,
   non-contiguous views), callbacks hidden in nested jit / cond / custom_vjp, a closed-over tracer under an
   outer jit, custom_jvp rules that differ, and the key under a changed trace context (matmul precision,
   threefry_partitionable).
2. `plan/memory.py` `choose()` (PROBE_AFTER: after the cheapest two candidates save nothing, the widest is
   measured out of turn, and where it saves nothing either the search stops) and `_other_order()`.
   Attacked on stacks of dense+gelu layers (benchmarks/memory_budget.py's layer) where recomputation frees
   memory only with many segments.

Findings (JAX 0.10.2, XLA:CPU, default XLA_FLAGS):
  A. (high) A budget the old search met is now missed. 16 layers (D=64, B=512): plain `jax.grad` temp
     8257536 B. Candidates' gradient temp / plain: checkpoint_dots 1.00, nothing-2 0.968, nothing-4 0.903,
     nothing-8 0.774, nothing-16 0.516, all-4 (the "widest") 0.903, all-8 0.774. The cheapest two save
     nothing, the widest saves 9.7% (< MIN_SAVING/2), so the search gives up after 3 compiles; yet
     nothing-8 / nothing-16 fit. memory=0.6 x plain (4954521 B): jax.grad(optimize(f, memory=...)) runs
     8257536 B (plain) with a "cannot fit" warning; with PROBE_AFTER disabled (the old search) it runs
     4325376 B, within the budget. Same for 0.8 x plain (new 8257536 B, old 6422528 B) and for
     jax.value_and_grad (0.6 x 8388608: new 8388608 B). "all, 4 segments" is not the widest in effect:
     it saves less than finer cuts.
  B. (medium) The warning of A says "the least any segment checkpointing reaches is 7.62 MiB" (nothing-2's),
     and adds that XLA:CPU "frees nothing by recomputation": both false, nothing-16 reaches ~4.1 MiB (the
     search stopped before it measured it).
  C. (low) `measure.program_key` depends on the process's history, not on the program and machine: under
     `jax.default_matmul_precision("highest")` (or a flipped jax_threefry_partitionable), a program keyed
     before under the default context gets the default context's key from the `_keys` LRU (which keys by
     `structure` only, no `_machine_key`), while the same program keyed fresh under that context gets
     another. Disk entries are filed under whichever context keyed it first; two processes disagree on
     the key (cache misses). No wrong measurement found on CPU: the lowered modules were identical.
  D. (medium) `_other_order` stops after recompute k=4 and k=8 save < 12.5%, before k=16: 32 layers
     (D=32, B=512), memory="min": jax.grad(optimize(f, memory="min")) runs 7929856 B with no warning, yet
     optimize(jax.grad(f), memory="min") runs 6356992 B (19.8% less; k=16: 0.764x, k=4 0.953x, k=8 0.890x);
     with every k measured (PROBE_AFTER out of reach) the warning names it. (The same program under
     memory=0.8 x plain, 6658457 B: now 8323072 B, missed as in A; the old search met it at 6356992 B.)
  E. (medium, pre-existing, not from these changes) memory="min" is not the least: on that program "min"
     runs 7929856 B while the old search under memory=6658457 runs 6356992 B; "min" walks the likeliest-first order
     and GIVE_UP_AFTER stops it after all-4, nothing-4, checkpoint_dots save < 12.5%.
C is fixed (the key LRU holds the machine key beside the structure). A, B and D came from a probe that
made budgets compile less; a fix (probing the finest cut) then broke a 4-layer MLP whose 8-segment cuts save
less than its 4-segment ones, so the search is back to what it was: A, B and D hold as regression tests.
E, older than the probe, is fixed in round 13: "min" compiles every candidate (the early give-up is a budget's).
Held: typed key constants (fry vs rbg, seeds), constants' dtypes/sizes/layouts all keyed apart; callbacks in
nested jit, cond, custom_vjp's forward never reach the disk; a tracer constant under jit plans and runs;
custom_jvp rules that differ give each its own gradient; budgets never exceed plain `jax.grad`; a missed
budget warns; values and gradients equal plain JAX; the other order's quoted number is what
optimize(jax.grad(f), memory=...) runs.
"""
import functools
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.plan import measure
from jaxform.plan import memory as plan_memory


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))


def temp(f, *args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def said(fn):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(x.message) for x in w if "jaxform" in str(x.message)]


def close(got, want, rtol=1e-5):
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(y))) if y.size else 1.0))


def _raw_temp(closed) -> int:
    return jax.jit(functools.partial(_jax.eval_jaxpr, closed)).lower(
        *[_jax.spec_of(a) for a in closed.in_avals]).compile().memory_analysis().temp_size_in_bytes


# ================================ change 1: the cache of measurements ================================

def _with_const(c):
    return jax.make_jaxpr(lambda x: x + jnp.sum(jnp.asarray(c)).astype(x.dtype))(jnp.ones(3, jnp.float32))


def test_typed_key_constants_are_keyed_apart():
    """A typed key's impl and bits are part of the key: fry seed 0, fry seed 1, rbg seed 0."""
    keys = [jax.random.key(0), jax.random.key(1), jax.random.key(0, impl="rbg")]
    progs = [jax.make_jaxpr(lambda x, k=k: jax.random.normal(k, (4,)) + x)(jnp.ones(4)) for k in keys]
    got = [measure.program_key(p) for p in progs]
    assert len(set(got)) == 3
    b = measure.Budget()
    for p in progs:
        assert measure.temp_bytes(p, b) == _raw_temp(p)


def test_awkward_constants_are_keyed_apart_and_measured():
    """bf16/f16/int8/uint8/bool, 0-size, scalar, a transposed (non-contiguous) view: each its own key; the
    same values as a contiguous copy: the same key (the bytes are the values')."""
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    consts = [np.ones(3, np.float16), np.ones(3, jnp.bfloat16), np.ones(3, np.int8), np.ones(3, np.uint8),
              np.ones(3, bool), np.zeros((0, 3), np.float32), np.float32(2.0), base.T, base.T.copy() + 1]
    progs = [_with_const(c) for c in consts]
    keys = [measure.program_key(p) for p in progs]
    assert len(set(keys)) == len(keys)
    assert measure.program_key(_with_const(np.ascontiguousarray(base.T))) == keys[7]
    b = measure.Budget()
    for p in progs:
        assert measure.temp_bytes(p, b) == _raw_temp(p)


def _cb(x):
    return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


@pytest.mark.parametrize("where", ["jit", "cond", "custom_vjp_fwd", "debug_print", "io_callback"])
def test_callbacks_anywhere_stay_off_the_disk(where, tmp_path):
    x = jnp.ones(3, jnp.float32)
    if where == "jit":
        f = lambda x: jax.jit(_cb)(x) + 1.0
    elif where == "cond":
        f = lambda x: lax.cond(x[0] > 0, _cb, lambda v: v, x) + 1.0
    elif where == "custom_vjp_fwd":
        @jax.custom_vjp
        def g(x):
            return _cb(x)
        g.defvjp(lambda x: (_cb(x), None), lambda r, ct: (ct,))
        f = lambda x: g(x) + 1.0
    elif where == "debug_print":
        def f(x):
            jax.debug.print("x {}", x)
            return x + 1.0
    else:
        from jax.experimental import io_callback
        f = lambda x: io_callback(lambda v: np.asarray(v), jax.ShapeDtypeStruct((3,), jnp.float32), x) + 1.0
    closed = jax.make_jaxpr(f)(x)
    assert measure.program_key(closed).startswith(measure.LOCAL)
    assert measure.temp_bytes(closed, measure.Budget()) is not None
    assert not list(tmp_path.rglob("*.json"))


def test_closed_over_tracer_under_jit_plans_and_runs():
    """optimize(f) of a function closing over an outer jit's tracer, under a memory budget: no crash, the
    values and gradients of plain JAX."""
    W = jnp.asarray(np.random.RandomState(0).randn(16, 16) * 0.3, jnp.float32)
    x = jnp.asarray(np.random.RandomState(1).randn(8, 16), jnp.float32)

    def outer(opt, W, x):
        inner = lambda x: jnp.sum(jnp.tanh(jnp.tanh(x @ W) @ W) ** 2)
        return jax.value_and_grad(opt(inner) if opt else inner)(x)

    got = jax.jit(functools.partial(outer, lambda f: jaxform.optimize(f, memory=1)))(W, x)
    close(got, jax.jit(functools.partial(outer, None))(W, x))
    got = jax.jit(functools.partial(outer, jaxform.optimize))(W, x)
    close(got, jax.jit(functools.partial(outer, None))(W, x))


def test_custom_jvp_rules_that_differ_each_give_their_own_gradient():
    """Two programs with the same forward (one compiled module, a shared disk entry) but different jvp
    rules: each optimized gradient is its own rule's."""
    def make(scale):
        @jax.custom_jvp
        def f(x):
            return jnp.sin(x)

        f.defjvp(lambda p, t: (jnp.sin(p[0]), scale * t[0]))
        return lambda x: jnp.sum(f(x) ** 2)

    x = jnp.linspace(-1, 1, 64, dtype=jnp.float32)
    for s in (1.0, 3.0):
        f = make(s)
        close(jax.grad(jaxform.optimize(f, memory="min"))(x), jax.grad(f)(x))
        close(jax.jit(jax.grad(jaxform.optimize(f)))(x), jax.grad(f)(x))


def test_program_key_is_the_context_s_not_the_first_one():
    """Finding C (low). Input: one closed jaxpr (tanh(a@b)@b, 64x64) keyed under the default context, then
    under jax.default_matmul_precision("highest"). Expected: the key computed under that context (as
    `_key_of` defines it: module + constants + `_machine_key()`, which holds the trace context), i.e. what
    a fresh process computes. Got: the default context's key (the LRU keys by structure only); a fresh
    computation under "highest" gives a different key. Disk entries are filed by process history. Fixed:
    the LRU is keyed by the program's structure and the machine key together."""
    a = jnp.ones((64, 64), jnp.float32)
    closed = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b) @ b)(a, a)
    measure.program_key(closed)
    with jax.default_matmul_precision("highest"):
        remembered = measure.program_key(closed)
        fresh = measure._key_of(measure._lowered(measure._Program(closed, None), measure.Budget()),
                                closed, measure.Graph.from_jaxpr(closed))
    assert remembered == fresh


def test_threefry_mode_is_not_shared():
    """A typed-key program traced under each threefry mode: XLA compiles them to different temp (1049344 B
    vs 525056 B); the cache must give each its own."""
    h = lambda k: jax.random.normal(k, (256, 256)).sum()
    k = jax.random.PRNGKey(0)
    was = jax.config.jax_threefry_partitionable
    try:
        a = jax.make_jaxpr(h)(k)
        ta = measure.temp_bytes(a, measure.Budget())
        jax.config.update("jax_threefry_partitionable", not was)
        b = jax.make_jaxpr(h)(k)
        tb = measure.temp_bytes(b, measure.Budget())
        assert (ta, tb) == (_raw_temp(a), _raw_temp(b))
    finally:
        jax.config.update("jax_threefry_partitionable", was)


# ================================ change 2: budgets' search ================================

def _layer(h, W, b):
    h = jax.nn.gelu(h @ W + b)
    return h + 0.1 * jnp.tanh(h)


def _stack(L, D, B):
    r = np.random.RandomState(0)
    ps = [(jnp.asarray(r.randn(D, D) * 0.05, np.float32), jnp.zeros(D, np.float32)) for _ in range(L)]
    x = jnp.asarray(r.randn(B, D), np.float32)

    def loss(ps, x):
        h = x
        for W, b in ps:
            h = _layer(h, W, b)
        return jnp.mean(h ** 2)

    return loss, (ps, x)


DEEP = (16, 64, 512)      # the cheapest two and "all, 4 segments" save < 12.5%; nothing-8/16 save 23%/48%


def test_the_deep_stack_budget_is_met():
    """Finding A (high). Input: 16 dense+gelu layers (D=64, B=512), jax.grad(optimize(loss, memory=0.6 x
    plain jax.grad's XLA temp)). Expected: <= the budget (nothing-16 reaches 0.516 x plain; the old search
    ran 4325376 B against 4954521 B). Got: 8257536 B (plain) and a "cannot fit" warning: after
    checkpoint_dots (1.00x) and nothing-2 (0.968x) the widest, "all, 4 segments", saved 9.7% (< 12.5%) and
    the search stopped. Fixed: the probe is the finest cut (it stores least between its boundaries), and the
    search gives up only where it saves nothing."""
    f, args = _stack(*DEEP)
    plain = temp(jax.grad(f), *args)
    mem = int(0.6 * plain)
    got, w = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
    assert got <= mem, (got, mem, w)


def test_a_missed_budget_warns_and_never_grows():
    """Whatever the search does: plain or less, a warning when over, the values of plain JAX."""
    f, args = _stack(*DEEP)
    plain = temp(jax.value_and_grad(f), *args)
    mem = int(0.6 * plain)
    vg = jax.value_and_grad(jaxform.optimize(f, memory=mem))
    got, w = said(lambda: temp(vg, *args))
    assert got <= plain
    assert got <= mem or any("cannot fit" in m for m in w), (got, mem, w)
    close(vg(*args), jax.value_and_grad(f)(*args))


def test_the_warning_s_least_is_the_least():
    """Finding B (medium). Input: as A. Expected: the warning's "the least any segment checkpointing reaches
    is X" no more than what a candidate reaches (nothing-16: ~4.1 MiB, under 0.6 x plain), and no claim that
    XLA:CPU frees nothing by recomputation. Got: "reaches 7.62 MiB with the program cut into 2 segments" and
    the XLA_FLAGS advice. Fixed with A: the budget is met; a warning, where one is given, quotes a least no
    more than what the finest cut reaches."""
    f, args = _stack(*DEEP)
    plain = temp(jax.grad(f), *args)
    mem = int(0.6 * plain)
    got, w = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
    m = re.search(r"the least any segment checkpointing reaches is ([\d.]+) MiB", " ".join(w))
    assert got <= mem or m is not None, (got, mem, w)
    assert m is None or float(m.group(1)) * 2 ** 20 <= 0.6 * plain * 1.01, m.group(0)
    assert not any("frees nothing by recomputation" in x for x in w)


@pytest.mark.slow
def test_other_order_number_is_what_it_runs():
    """The other order's quoted figure (a budget of 0.8 x plain on the deep stack) matches what
    optimize(jax.grad(f), memory=...) runs, within rounding to 0.01 MiB, and is within the budget."""
    f, args = _stack(*DEEP)
    plain = temp(jax.grad(f), *args)
    mem = int(0.8 * plain)
    _, w = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
    m = re.search(r"optimize\(jax.grad\(f\), memory=\d+\), reaches ([\d.]+) MiB", " ".join(w))
    if m is None:
        pytest.skip("this order met the budget: no other order named")
    got, _ = said(lambda: temp(jaxform.optimize(jax.grad(f), memory=mem), *args))
    assert abs(got / 2 ** 20 - float(m.group(1))) <= 0.006, (got, m.group(0))
    close(jax.jit(jaxform.optimize(jax.grad(f), memory=mem))(*args), jax.grad(f)(*args))


def test_min_equals_plain():
    """memory="min": never bigger than plain, values of plain JAX."""
    f, args = _stack(8, 32, 64)
    g = jax.grad(jaxform.optimize(f, memory="min"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(g(*args), jax.grad(f)(*args))
        assert temp(g, *args) <= temp(jax.grad(f), *args)


@pytest.mark.slow
def test_vmap_grad_of_a_budget_equals_plain():
    """vmap(grad(...)) of a budget that cannot be met: never bigger than plain, values of plain JAX."""
    f, (ps, x) = _stack(8, 32, 64)
    xs = jnp.stack([x, x * 0.5])
    vg = jax.vmap(jax.grad(jaxform.optimize(f, memory=1)), in_axes=(None, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        close(vg(ps, xs), jax.vmap(jax.grad(f), in_axes=(None, 0))(ps, xs))
        assert temp(vg, ps, xs) <= temp(jax.vmap(jax.grad(f), in_axes=(None, 0)), ps, xs)


@pytest.mark.slow
def test_min_names_the_other_order_that_reaches_less():
    """Finding D (medium). Input: 32 dense+gelu layers (D=32, B=512), jax.grad(optimize(loss, memory="min")).
    Expected (the rule: the other order is named where it reaches >= 10% less): a warning naming
    optimize(jax.grad(f), memory="min"), which runs 6356992 B against this order's 7929856 B (19.8% less).
    Got: no warning. `_other_order` measured recompute k=4 (0.953x) and k=8 (0.890x), both > 0.875x, and
    gave up before k=16 (0.764x). The control (PROBE_AFTER out of reach: every k measured, as before) named
    it. Fixed: the other order measures its finest cut first and gives up only where that saves nothing; and
    with E fixed this order's "min" now reaches what the other does, so the rule holds either way."""
    f, args = _stack(32, 32, 512)
    got, w = said(lambda: temp(jax.grad(jaxform.optimize(f, memory="min")), *args))
    other, _ = said(lambda: temp(jaxform.optimize(jax.grad(f), memory="min"), *args))
    assert other > 0.9 * got or any("The other order" in m for m in w), (got, other, w)


@pytest.mark.slow
def test_min_is_no_more_than_a_budget_reaches():
    """Finding E (medium, pre-existing: GIVE_UP_AFTER under memory="min" is older than these changes). Input:
    32 dense+gelu layers (D=32, B=512). Expected: jax.grad(optimize(f, memory="min")) no bigger than what a
    byte budget of 0.8 x plain reaches with the full search (PROBE_AFTER out of reach): 6356992 B. Got:
    7929856 B: "min" walks the likeliest-first order (all-4, nothing-4, checkpoint_dots: each < 12.5% saved) and stops
    before nothing-8/16. A probe of the finest cut fixed it in round 12, then broke a 4-layer MLP whose
    8-segment cuts save less than its 4-segment ones (tests/passes/test_memory_trust.py) and was withdrawn.
    Fixed in round 13: "min" asks for the least, so it compiles every candidate (no early give-up)."""
    f, args = _stack(32, 32, 512)
    mem = int(0.8 * temp(jax.grad(f), *args))
    least, _ = said(lambda: temp(jax.grad(jaxform.optimize(f, memory="min")), *args))
    budgeted, _ = said(lambda: temp(jax.grad(jaxform.optimize(f, memory=mem)), *args))
    assert budgeted <= mem, (budgeted, mem)       # the premise
    assert least <= budgeted, (least, budgeted)
