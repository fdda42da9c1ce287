"""Attack, round 10: the gradient views of a known gradient use (`plan.use`, `planner._Costs.views`, `judge`,
`_judge_memory`, `_Planning.unmet_budget`, `memory.unmet_without`, `memory.choose`'s value_and_grad quote).

Attacked (scratch runs, then the tests below), each against plain JAX (values, dtypes, weak types; memory: XLA temp
of `jax.jit` of the same transform of the plain function): `jax.grad`, `jax.value_and_grad`,
`jax.grad(has_aux=True)` (loss first, loss not first, dict outputs), `jax.vjp` with cotangents on every output,
`argnums=1`, under memory=None, "auto", "min" and byte budgets; scans as RNNs, sin/cos, max+sum of stacked
states, cumsum-like carries; aux outputs that are stacked scan outputs, integers, dicts; f16/bf16 first outputs;
a non-scalar or integer first output (vjp only); complex outputs; budgets under `jax.vmap(jax.grad(...))` and
under forward / jvp calls (never silently unmet, never "cannot fit" where what runs fits, quoted numbers as
measured); second order (`jax.hessian`, `jax.grad(jax.grad)`, `jax.jacfwd(jax.grad)`), `jax.jvp`,
`jax.vmap(jax.grad)`; scans of length 0 and 1, inf / NaN / -0.0, integer carries, RNG keys, `jax.debug.callback`
(count and order), `custom_vjp` in the body; one `optimize(f)` called under many uses in turn.

Six findings (JAX 0.10.2, CPU). Fixed, now regression tests: complex outputs judged in no view; memory='min'
growing jax.grad's bytes 33x over memory=None's (the worst-view rule; remat now also may not grow any gradient
view); a forward call warning "cannot fit" for a gradient that fits (no memory pass or budget check under a use
that takes no gradient); has_aux with the loss not the first flat output (19x plain's bytes; fixed in a later
session: the has_aux view finds the scalar loss wherever it is). Open, each a strict xfail with the numbers
measured: (low severity) a vjp cotangent of 0.5. A vmap(grad) budget fitted to one example's gradient is fixed
too (the memory passes measure the batched gradient). One silent budget miss found against the change as first read
(vmap(value_and_grad)) holds since the worst-view change; it is kept as a test with the attacks that held
(ordinary tests). Programs are small (each compile well under a second).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax

from plan.programs import rnn_max_sum, rnn_mse, sincos  # noqa: E402  (tests/plan/programs.py)


from test_attack_round9 import _a, close, said, temp  # noqa: E402,F401  (round 9's helpers, tests/fuzz)


# Three findings are XLA:CPU 0.10's numbers: on JAX 0.12 plain's per-example gradient of rnn_max_sum fits the
# 106675-byte budget already (95544 B), and the vjp with a cotangent of 0.5 is no bigger than plain.
ON_XLA_010 = pytest.mark.skipif(_jax.JAX_VERSION >= (0, 11), reason="a JAX 0.10.2 finding: XLA:CPU 0.12 schedules "
                                "these programs differently (plain's vmap(grad) 95544 B fits the budget)")


def cannot_fit(msgs) -> list:
    return [m for m in msgs if "cannot fit" in m]


def vjp_all(fn, ct=None):
    """jax.vjp pulled back with a cotangent on every output (ones, or `ct` times ones; float0 for integers)."""
    def run(*a):
        out, pull = jax.vjp(fn, *a)
        cts = jax.tree_util.tree_map(
            lambda y: jnp.ones_like(y) * (1 if ct is None else ct) if jnp.issubdtype(y.dtype, jnp.inexact)
            else np.zeros(y.shape, jax.dtypes.float0), out)
        return out, pull(cts)
    return run


def rnn(w, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ w + x),) * 2, jnp.zeros(xs.shape[1:], xs.dtype), xs)[1]


L, B, H = 40, 8, 16


def _rnn_args(seed=1):
    return _a(H, H, k=1 / np.sqrt(H)), _a(L, B, H, seed=seed)


def with_aux(w, zs):
    """Round 9's has_aux program: the loss does not read the loop; the aux is the loop's stacked output."""
    vs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), jnp.cos(x) * h), jnp.zeros(zs.shape[1:]), zs)[1]
    return jnp.sum(w ** 2), vs


def _aux_args():
    return _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)


def aux_stack(w, zs):
    """A loss from the loop's states and a stacked aux from the same loop."""
    def body(h, x):
        h2 = jnp.tanh(h @ w + x)
        return h2, (h2, jnp.cos(x) * h)
    _, (ys, vs) = lax.scan(body, jnp.zeros(zs.shape[1:]), zs)
    return jnp.sum(ys ** 2), vs


def cumsum(x, xs):
    c, ys = lax.scan(lambda c, t: (c + jnp.sin(t * x), c), jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(ys ** 2) + jnp.sum(c)


# =========================================================================================================
# Findings (open: strict xfails)
# =========================================================================================================

def _swap_dict(w, zs):
    loss, vs = with_aux(w, zs)
    return {"aux": vs, "loss": loss}       # flattened: "aux" first, the scalar loss second


# Finding 1: AUX_GRAD covered has_aux only where the loss was output 0 of the flat outputs. A function returning a
# dict {"loss", "aux"} flattens the aux first ("aux" < "loss"), and one returning (aux, loss) is the same program:
# no has_aux view was judged (the first output is not a scalar), the grad views gave the aux a ones cotangent, so
# fission's batched cos(zs) again looked free (stored in that gradient anyway): 32388 B under memory=None (41796 B
# under 'min') against plain's 1668 B. Fixed: the has_aux view differentiates the first scalar float output
# wherever it is (`use.aux_loss`).
@pytest.mark.parametrize("memory", [None, "auto", "min"])
def test_has_aux_with_the_loss_not_first_never_bigger(memory):
    args = _aux_args()
    G = lambda f: jax.grad(lambda *a: (lambda r: (r["loss"], r["aux"]))(f(*a)), has_aux=True)  # noqa: E731
    o = jaxform.optimize(_swap_dict, memory=memory)
    close(G(o)(*args), G(_swap_dict)(*args))
    assert temp(G(o), *args) <= temp(G(_swap_dict), *args)


def _cplx_rnn(w, xs):
    ys = rnn(w, xs)
    return jnp.max(ys) + jnp.sum(ys) + 0j


# Finding 2: complex outputs get no cotangent in any view (`gradient_program` differentiates `jnp.floating`
# outputs only): every gradient view of every candidate is `None`, costed 0 B by the model (`0 B~ / ?` in the
# decisions) and skipped by the final guard, so every rewrite is kept unjudged under a known gradient use.
# Fixed: `gradient_program` differentiates complex (inexact) outputs too: every view is judged.
def test_complex_output_gradient_never_bigger():
    args = _aux_args()
    VG = lambda f: jax.value_and_grad(lambda *a: jnp.real(f(*a)))  # noqa: E731
    o = jaxform.optimize(_cplx_rnn, memory=None)
    close(VG(o)(*args), VG(_cplx_rnn)(*args), rtol=1e-4)
    assert temp(VG(o), *args) <= temp(VG(_cplx_rnn), *args)


def _vmap_args():
    return _a(8, 8, k=1 / np.sqrt(8)), _a(6, 30, 4, 8, seed=1)


_V = lambda f: jax.vmap(jax.grad(f), in_axes=(None, 0))              # noqa: E731  (per-example gradients)
_VV = lambda f: jax.vmap(jax.value_and_grad(f), in_axes=(None, 0))   # noqa: E731


# Finding 3: under jax.vmap(jax.grad(o)) the memory passes fitted the budget to the *unbatched* gradient
# (fit_loops / budgeted_temp: 19648 B per example); a budget above that but below the batched gradient got no
# schedule at all: the plan was the traced program, 139200 B (vmap(value_and_grad) 118528 B) against 106675 B,
# warned with a false reason, where memory='min' reaches 97912 B. Fixed: `optimize` tells the memory passes the
# batching (`cost.gradient_batched`) and they measure the batched gradient.
@ON_XLA_010
def test_vmap_grad_budget_met_where_a_schedule_meets_it():
    args = _vmap_args()
    budget = 106675
    o = jaxform.optimize(rnn_max_sum, memory=budget)
    (g, vg), msgs = said(lambda: (temp(_V(o), *args), temp(_VV(o), *args)))
    assert g <= budget and vg <= budget, (g, vg, msgs)


def test_vmap_grad_budget_between_min_and_plain_is_met():
    """Finding 3 on any JAX: a budget halfway between what memory='min' reaches under jax.vmap(jax.grad) and
    plain's batched gradient is met (the memory passes fit the batched gradient, not one example's), in both
    jax.vmap(jax.grad) and jax.vmap(jax.value_and_grad), with the values plain JAX gives."""
    args = _vmap_args()
    plain = max(temp(_V(rnn_max_sum), *args), temp(_VV(rnn_max_sum), *args))
    least = max(temp(_V(jaxform.optimize(rnn_max_sum, memory="min")), *args),
                temp(_VV(jaxform.optimize(rnn_max_sum, memory="min")), *args))
    if least > 0.9 * plain:
        pytest.skip(f"this XLA reaches {least} B of plain's {plain} B under memory='min': no budget between")
    budget = (least + plain) // 2
    o = jaxform.optimize(rnn_max_sum, memory=budget)
    (g, vg), msgs = said(lambda: (temp(_V(o), *args), temp(_VV(o), *args)))
    assert g <= budget and vg <= budget, (g, vg, budget, msgs)
    close(_V(o)(*args), _V(rnn_max_sum)(*args), rtol=1e-4)


@ON_XLA_010
def test_vmap_grad_budget_is_reachable():
    """The other side of finding 3 (holds): memory='min' gets jax.vmap(jax.grad) of the same program within
    106675 B, and the budget is never silently unmet (said by the planner's new warning)."""
    args = _vmap_args()
    o = jaxform.optimize(rnn_max_sum, memory="min")
    got = temp(_V(o), *args)
    assert got <= 106675 < temp(_V(rnn_max_sum), *args), got
    close(_V(o)(*args), _V(rnn_max_sum)(*args), rtol=1e-4)
    o = jaxform.optimize(rnn_max_sum, memory=106675)
    (g, vg), msgs = said(lambda: (temp(_V(o), *args), temp(_VV(o), *args)))
    assert (g <= 106675 and vg <= 106675) or cannot_fit(msgs), (g, vg, msgs)


# Finding 4: a forward call of optimize(f, memory=B) (concrete arrays: use "forward", no memory pass is run) warns
# "remat_loops cannot fit the gradient of its first argument ... XLA measures 83.3 KiB", measured on the forward
# plan's gradient without schedules; the gradient the user then takes is planned for its own use and fits.
# (Also jax.jvp and jax.vmap of o, which take no gradient at all, warn the same.) Older than this change.
# Fixed: a use that takes no gradient (forward, jvp, vmap) runs no memory pass and no budget check.
def test_forward_call_warns_no_cannot_fit_where_the_gradient_fits():
    w, xs = _rnn_args()
    args = (w, xs, _a(L, B, H, seed=2))
    budget = 30000
    o = jaxform.optimize(rnn_mse, memory=budget)
    (out, msgs) = said(lambda: o(*args))
    close(out, rnn_mse(*args), rtol=1e-4)
    (g, vg), more = said(lambda: (temp(jax.grad(o), *args), temp(jax.value_and_grad(o), *args)))
    assert (g > budget or vg > budget) or not cannot_fit(msgs + more), (g, vg, msgs + more)


def test_has_aux_budget_fits_without_a_false_warning():
    """aux_stack (L=24) under memory=10000: jax.grad and jax.value_and_grad with has_aux fit (8344 and 8792 B
    measured, plain's 62148 and 62152 B: never bigger) and nothing says "cannot fit". (Seen in a scratch run as a false
    warning: it came from a jax.vjp of the same function, another use, planned and warned on its own.)"""
    args = _a(H, H, k=0.25), _a(24, B, H, seed=1)
    budget = 10000
    o = jaxform.optimize(aux_stack, memory=budget)
    (g, vg), msgs = said(lambda: (temp(jax.grad(o, has_aux=True), *args),
                                  temp(jax.value_and_grad(o, has_aux=True), *args)))
    close(jax.value_and_grad(o, has_aux=True)(*args), jax.value_and_grad(aux_stack, has_aux=True)(*args), rtol=1e-4)
    assert (g <= budget and vg <= budget) != bool(cannot_fit(msgs)), (g, vg, msgs)
    assert g <= temp(jax.grad(aux_stack, has_aux=True), *args)
    assert vg <= temp(jax.value_and_grad(aux_stack, has_aux=True), *args)


def _sincos_args():
    return _a(B, H), _a(L, B, H, seed=1), _a(L, B, H, seed=2)


# Finding 5: `_judge_memory` now takes a gradient's memory as the worst of its views (`_worst`): under 'min',
# remat_loops' schedule for sincos w.r.t. x2 grows jax.value_and_grad's view 21.2 -> 23.9 KiB (inside the 4 KiB
# slack, "saving below the model's resolution") and is kept, while jax.grad's view goes 644 B -> 20.8 KiB.
# Fixed: `_judge_memory` also refuses a schedule that grows any gradient view past the program before it
# (unless a byte budget is then met): remat_loops is now rejected, 'more grad memory (0.6 KiB -> 20.8 KiB)'.
def test_min_takes_no_more_gradient_memory_than_none():
    args = _sincos_args()
    G = lambda f: jax.grad(f, argnums=1)  # noqa: E731
    lo, none = jaxform.optimize(sincos, memory="min"), jaxform.optimize(sincos, memory=None)
    close(G(lo)(*args), G(sincos)(*args))
    assert temp(G(lo), *args) <= temp(G(none), *args)


# Finding 6 (low severity): jax.vjp pulled back with a cotangent of 0.5: XLA schedules plain's program at
# 42752 B (62656 B with 1.0, 2.0 or a cotangent argument); the plan (fusion, judged with ones) takes 43240 B
# whatever the cotangent. No view can know the cotangent; said for the record.
@ON_XLA_010
@pytest.mark.xfail(strict=True, reason=(
    "cumsum-like carry (x (8,16), xs (40,8,16)), jax.vjp(o) pulled back with 0.5: 43240 B against plain's "
    "42752 B (plain takes 62656 B with a cotangent of 1.0, the planner's view)"))
def test_vjp_with_a_cotangent_other_than_ones_never_bigger():
    args = _a(B, H), _a(L, B, H, seed=1)
    o = jaxform.optimize(cumsum, memory=None)
    close(vjp_all(o, 0.5)(*args), vjp_all(cumsum, 0.5)(*args), rtol=1e-4)
    assert temp(vjp_all(o, 0.5), *args) <= temp(vjp_all(cumsum, 0.5), *args)


# =========================================================================================================
# Attacks that held (coverage; the slow tier, but for the budget miss found against the first version)
# =========================================================================================================

def _f16(w, xs):
    ys = rnn(w.astype(jnp.float16), xs.astype(jnp.float16))
    return jnp.sum(ys ** 2), jnp.cos(ys)


def _int_vec_first(w, xs):
    ys = rnn(w, xs)
    return jnp.sum(ys > 0), jnp.sum(ys ** 2, axis=0), jnp.max(ys)


_HAS_AUX = {"grad_aux": lambda f: jax.grad(f, has_aux=True),
            "vg_aux": lambda f: jax.value_and_grad(f, has_aux=True)}


@pytest.mark.slow
def test_has_aux_f16_loss_never_bigger():
    """An f16 scalar loss with an f16 aux under memory='auto' (a stacked f32 aux: the budget test above; an integer
    aux: the callback test below): jax.grad and jax.value_and_grad with has_aux of one optimize(f) each equal
    plain JAX's (to f16's resolution) and no bigger."""
    args = _rnn_args()
    o = jaxform.optimize(_f16, memory="auto")
    for name, U in _HAS_AUX.items():
        (got, t), _ = said(lambda: (U(o)(*args), temp(U(o), *args)))
        close(got, U(_f16)(*args), rtol=2e-2)
        assert t <= temp(U(_f16), *args), name


@pytest.mark.slow
def test_vjp_of_an_integer_then_a_vector_first_output():
    """No has_aux view where the first output is not a float scalar (an integer, then a vector): jax.vjp with
    every output's cotangent still equal and no bigger under memory='min'."""
    args = _a(8, 8, k=0.3), _a(20, 4, 8, seed=1)
    o = jaxform.optimize(_int_vec_first, memory="min")
    (got, t), _ = said(lambda: (vjp_all(o)(*args), temp(vjp_all(o), *args)))
    close(got, vjp_all(_int_vec_first)(*args), rtol=1e-4)
    assert t <= temp(vjp_all(_int_vec_first), *args)


@pytest.mark.slow
def test_single_output_uses_never_bigger():
    """rnn max+sum (where plain's jax.grad is the bigger program: 98752 B against value_and_grad's 82496 B at
    L=64 B=4 H=16): jax.grad, jax.value_and_grad, jax.grad(argnums=1) under memory='min', each equal and no
    bigger."""
    args = _a(16, 16, k=0.25, seed=64), _a(64, 4, 16, seed=65)
    uses = {"grad": jax.grad, "vg": jax.value_and_grad, "grad1": lambda f: jax.grad(f, argnums=1)}
    o = jaxform.optimize(rnn_max_sum, memory="min")
    for name, U in uses.items():
        (got, t), _ = said(lambda: (U(o)(*args), temp(U(o), *args)))
        close(got, U(rnn_max_sum)(*args), rtol=1e-4)
        assert t <= temp(U(rnn_max_sum), *args), name


# Found against the change as first read (unmet_budget looked only at the first gradient view, jax.grad's):
# sincos under jax.vmap(jax.value_and_grad) with x2 and y batched took 81920 B against a 40960-byte budget with no
# warning (vmap(grad) takes 0 B; the memory passes measured the unbatched gradient). Holds now (the worst view).
def test_vmap_budget_never_silently_unmet_sincos():
    x1, x2, y = _sincos_args()
    args = (x1, jnp.stack([x2 * (1 + 0.1 * k) for k in range(4)]), jnp.stack([y * (1 + 0.1 * k) for k in range(4)]))
    V = lambda f: jax.vmap(jax.grad(f), in_axes=(None, 0, 0))              # noqa: E731
    VV = lambda f: jax.vmap(jax.value_and_grad(f), in_axes=(None, 0, 0))   # noqa: E731
    budget = 40960
    o = jaxform.optimize(sincos, memory=budget)
    (g, vg), msgs = said(lambda: (temp(V(o), *args), temp(VV(o), *args)))
    close(VV(o)(*args), VV(sincos)(*args))
    assert (g <= budget and vg <= budget) or cannot_fit(msgs), (g, vg, msgs)


@pytest.mark.parametrize("budget", [2000, 25000])
@pytest.mark.slow
def test_budget_met_or_said_with_the_numbers_measured(budget):
    """rnn_mse under jax.grad and jax.value_and_grad: each within the budget, or 'cannot fit' said and the number
    it quotes for jax.value_and_grad's program is the one measured (to the 0.1 KiB it prints); no 'cannot fit'
    where both fit."""
    w, xs = _rnn_args()
    args = (w, xs, _a(L, B, H, seed=2))
    o = jaxform.optimize(rnn_mse, memory=budget)
    (g, vg), msgs = said(lambda: (temp(jax.grad(o), *args), temp(jax.value_and_grad(o), *args)))
    close(jax.value_and_grad(o)(*args), jax.value_and_grad(rnn_mse)(*args), rtol=1e-4)
    said_ = cannot_fit(msgs)
    fits = g <= budget and vg <= budget
    assert fits != bool(said_), (g, vg, budget, msgs)
    if said_:
        assert any(f"{max(g, vg) / 1024:.1f} KiB" in m for m in said_), (g, vg, said_)


def _scalar_loop(x):
    c, ys = lax.scan(lambda c, t: (jnp.sin(c) * x + t, jnp.cos(c) * x), x, jnp.linspace(0, 1, 12))
    return jnp.max(ys) + jnp.sum(ys ** 2) + c


def _scalar_and_xs(x, xs):
    c, ys = lax.scan(lambda c, t: (jnp.tanh(c * x + t), c), x * 0.1, xs)
    return jnp.sum(ys) + jnp.max(ys)


@pytest.mark.slow
def test_second_order_jvp_and_vmap_of_grad():
    """jax.hessian, jax.grad(jax.grad) of a scalar-input loop; jax.jvp and jax.vmap(jax.grad) of a loop over
    data, under memory='min': plain JAX's values, never bigger."""
    x, xs = jnp.float32(0.7), _a(12, seed=3)
    cases = [(jax.hessian, _scalar_loop, (x,)), (lambda f: jax.grad(jax.grad(f)), _scalar_loop, (x,)),
             (lambda f: lambda *a: jax.jvp(f, a, tuple(jnp.ones_like(t) for t in a)), _scalar_and_xs, (x, xs)),
             (lambda f: jax.vmap(jax.grad(f), in_axes=(0, None)), _scalar_and_xs, (jnp.linspace(0.1, 1, 5), xs))]
    for k, (T, f, args) in enumerate(cases):
        o = jaxform.optimize(f, memory="min")
        (got, t), _ = said(lambda: (T(o)(*args), temp(T(o), *args)))
        close(got, T(f)(*args), rtol=1e-4)
        assert t <= temp(T(f), *args), k


@pytest.mark.slow
def test_callbacks_rng_int_carry_custom_vjp_short_scans():
    """jax.debug.callback in the body (count and order as plain JAX's), an RNG key carried through the scan, an
    integer carry returned as aux, custom_vjp in the body; lengths 5, 1 and 0; jax.value_and_grad(has_aux) and
    jax.vjp under memory='min' and a budget."""
    log = []

    @jax.custom_vjp
    def cv(x):
        return jnp.sin(x)
    cv.defvjp(lambda x: (jnp.sin(x), jnp.cos(x)), lambda c, g: (2.0 * g * c,))

    def f(w, xs, key, n):
        def step(c, x):
            k, h, i = c
            k, s = jax.random.split(k)
            h = cv(jnp.tanh(h @ w + x * jax.random.uniform(s, x.shape) * i.astype(x.dtype)))
            jax.debug.callback(lambda v: log.append(float(v)), h[0, 0])
            return (k, h, i + 1), (h, i)
        (_, h, i), (ys, iz) = lax.scan(step, (key, jnp.zeros(xs.shape[1:]), n), xs)
        return jnp.sum(ys ** 2) + jnp.max(ys, initial=-1.0) + jnp.sum(h), (iz, i)

    def run(fn):
        log.clear()
        out = fn()
        jax.effects_barrier()
        return out, list(log)

    w = _a(8, 8, k=0.3)
    vg = lambda g: jax.value_and_grad(g, has_aux=True)  # noqa: E731
    for n_steps, memory, U in [(5, 3000, vg), (1, "min", vjp_all), (0, "min", vg)]:
        args = (w, _a(n_steps, 3, 8, seed=n_steps), jax.random.PRNGKey(1), jnp.int32(2))
        o = jaxform.optimize(f, memory=memory)
        ((got, lg), _) = said(lambda: run(lambda: U(o)(*args)))
        want, lw = run(lambda: U(f)(*args))
        close(got, want, rtol=1e-4)
        assert len(lg) == len(lw) == n_steps, (n_steps, len(lg), len(lw))
        np.testing.assert_allclose(lg, lw, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_one_function_many_uses_in_turn():
    """One optimize(f, memory="min") called forward, under jax.grad(has_aux), jax.value_and_grad(has_aux),
    the grad of the aux's sum (the plan for w's gradient, served again), forward again; inputs with
    inf, NaN and -0.0: plain JAX's values each time, never bigger than plain's."""
    def f(w, xs, t):
        ys = rnn(w, xs)
        return jnp.mean((ys - t) ** 2) + jnp.max(ys), jnp.cos(ys) * t
    xs = _a(30, 4, 8, seed=1).at[3, 0, 0].set(jnp.inf).at[5, 1, 1].set(jnp.nan).at[7, 2, 2].set(-0.0)
    args = _a(8, 8, k=0.3), xs, _a(30, 4, 8, seed=2)
    uses = [lambda g: g, lambda g: jax.grad(g, has_aux=True), lambda g: jax.value_and_grad(g, has_aux=True),
            lambda g: jax.grad(lambda *a: jnp.sum(g(*a)[1])), lambda g: g]
    o = jaxform.optimize(f, memory="min")
    for k, U in enumerate(uses):
        (got, t), _ = said(lambda: (U(o)(*args), temp(U(o), *args)))
        close(got, U(f)(*args), rtol=1e-4)
        assert t <= temp(U(f), *args), k
