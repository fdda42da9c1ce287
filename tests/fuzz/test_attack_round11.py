"""Attack, round 11: commit 7f67d99's two changes.

1. `jaxform.explain` reports the program the plan runs (`inspect/explain.py`, `Plan.forward`, `Plan.skipped`
   indexing the pipeline as given, `planner._plan_each_use`). Attacked: for each setting, explain's totals
   (`temp_bytes[1]`, `eqns[1]`, `report.diff`) against the program `optimize` actually planned and runs
   (`o.plan().forward` or `.closed` after `jax.jit(...).lower`), XLA's temp bytes of it, and
   `jax.jit(jaxform.optimize(f))`'s own `memory_analysis`: the default pipeline, memory=None / "auto" / "min" /
   byte budgets, `explain(f, loop_memory=...)` and `explain(optimize(f, ...))`, for_use=None, FORWARD and
   `Use((("grad", (0,)),))` (against `jax.jit(jax.grad(optimize(f)))`), one to three loops (per-loop
   decisions, `Plan.partial`), straight-line MLPs, `optimize(jax.grad(f))`, a user decided pass with
   plan=True, `exact=True`, and `python -m jaxform.cli demo` (small sizes: consistent).
2. `plan/use.py::aux_loss`: the has_aux view differentiates the first scalar float output. Attacked with
   `jax.grad(..., has_aux=True)` / `jax.value_and_grad(..., has_aux=True)` of a picker over `optimize(f)`'s
   outputs against the same of plain f (values and XLA temp bytes): the loss behind an accuracy scalar, the
   loss the second of two scalars, nested dicts, an integer scalar before the loss, a bf16 loss, complex aux,
   `jax.vjp` with cotangents on some outputs only, `jax.vmap` of the has_aux gradient, memory=None/auto/min.

Findings (JAX 0.10.2, CPU), each fixed the same session and now a regression test (the numbers as found):
  A. explain does not plan under the contexts `optimize` plans under (`cost.first_argument_is`,
     `cost.arguments_are`): with a byte budget, remat_loops fits a different gradient, and explain reports a
     program that never runs. rnn_max_sum (H=16, L=40, B=8), memory=20000: explain says 4848 B, 17 eqns
     (remat 'sqrt', "gradient 103.8 KiB -> 23.2 KiB"); jax.jit(optimize(f)) runs 2160 B, 14 eqns. The same
     under for_use=grad vs jax.jit(jax.grad(optimize(f))): rnn_max_sum 4848/17 vs 2160/14, lstm_tanh 4792/19
     vs 2104/16, sincos 12456/21 vs 2088/16. explain run inside those two contexts reports what runs.
  B. `explain(optimize(f, exact=True), ...)` ignores `exact` (`jaxform_settings["exact"]` is never read): it
     replays the non-exact default pipeline and reports fuse_scan_reductions, 21608 B -> 2160 B, 9 -> 13
     eqns; the exact optimize runs the traced program, 21608 B, 9 eqns.
  C. Where the jit trace's forward plan changes nothing (`_plan_each_use`'s only_inlined return:
     `Plan.forward` None, so no "as traced" line), explain still prints "loop ... under grad keeps remat:
     predicted 200.00 KiB -> 101.00 KiB", while jax.grad(jax.jit(optimize(f))) runs plain's 309892 B (the
     change promised: derivatives as traced, no remat/gradient lines).
  D. The has_aux view picks the first float scalar, which need not be the loss: {"acc": mean(vs), "aux": vs,
     "loss": l} (acc flattens first) or (max(vs), loss, vs) or {"m": {"a": vs, "b": sum(vs)}, "z_loss": l}:
     jax.grad(has_aux) of optimize takes 32368 B against plain's 1640 B (19.7x) under memory None/auto,
     41776 B under "min"; jax.vmap of it 278064 B against 96872 B; round 10's aux_stack with an accuracy
     scalar first 156496 B against 154312 B (None/auto). Values stay equal. (An uncommitted change that
     appeared in the working tree during this session, one has_aux view per float scalar, the first
     AUX_VIEWS=3, makes these XPASS; they are written against 7f67d99.)
  E. Against that change too: four float metrics before the loss ({"a1".."a4", "aux", "loss"}): 32304 B
     against plain's 1576 B under memory=None (20.5x), 41584 B under "min".
Held (ordinary tests below): explain = what runs for the default pipeline / None / "min" under a jit trace,
under FORWARD for every memory setting, under a grad use without a budget, for optimize(jax.grad(f)) at every
setting; has_aux with an integer scalar before the loss, a bf16 loss, complex aux; jax.vjp with cotangents on
some outputs. Not made tests (timing-dependent): two fresh plans of sincos (memory="min") and of a three-loop
program once differed from each other (12456 B / 21 eqns vs 51200 B / 5 eqns) where a 1.41x measured time
decided between fusion and fission; explain re-plans, so it can report the other one. Under a known grad use
where remat_loops was rejected (measured 0.86x), the loop line said "keeps remat" (fixed with C: no loop line
where the plan skipped remat_loops).
Fixes: A, explain plans and replays under `optimize.planning_contexts`; B, explain reads the wrapper's exact
setting; C, `Plan.forward` is set where the forward plan changed nothing too; D and E, `use.aux_losses`: every
float scalar output is judged as a has_aux loss, at most `AUX_VIEWS` (3) of them, the first ones and the last.
"""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.inspect import program as P
from jaxform.inspect.show import paired_text
from jaxform.ir import Graph
from jaxform.ir.printing import diff
from jaxform.plan import FORWARD, Use, cost

from plan.programs import _a as pa, lstm_tanh, rnn_max_sum, rnn_mse, sincos  # noqa: E402  (tests/plan)
from test_attack_round9 import close, temp  # noqa: E402  (tests/fuzz)
from test_attack_round10 import aux_stack, with_aux, _aux_args  # noqa: E402

GRAD0 = Use((("grad", (0,)),))
H, L, B = 16, 40, 8


def _rnn_args():
    return pa(H, H, k=1 / np.sqrt(H)), pa(L, B, H)


def _lstm_args():
    return pa(H, H, k=1 / np.sqrt(H)), pa(B, H), pa(L, B, H)


def _sincos_args():
    return pa(8, 16), pa(100, 8, 16), pa(100, 8, 16, seed=2)


def _mse_args():
    return pa(H, H, k=1 / np.sqrt(H)), pa(L, B, H), pa(L, B, H, seed=1)


def planned(o, f, args, wrap=lambda o: o):
    temp(wrap(o), *args)
    p = o.plan()
    prog = p.forward if p.forward is not None else p.closed
    closed, flat = P.trace_flat(f, args)
    return (P.temp_bytes(prog, flat), len(Graph.from_jaxpr(prog)),
            diff(*paired_text(Graph.from_jaxpr(closed), Graph.from_jaxpr(prog))))


def reported(r):
    return r.temp_bytes[1], r.eqns[1], r.diff


def _ctx(args, wrt=None, known=False):
    """The contexts optimize plans under (optimize.py's wrapper), for the first positional argument."""
    sizes = [len(jax.tree_util.tree_leaves(a)) for a in args]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    st = contextlib.ExitStack()
    st.enter_context(cost.first_argument_is(range(sizes[0]) if wrt is None else wrt, None, known))
    st.enter_context(cost.arguments_are([range(a, a + n) for a, n in zip(starts, sizes) if n]))
    return st


# =========================================================================================================
# Findings (fixed: regression tests)
# =========================================================================================================

@pytest.mark.parametrize("via_optimize", [False, True])
def test_explain_budget_under_jit_is_what_runs(via_optimize):
    args = _rnn_args()
    o = jaxform.optimize(rnn_max_sum, memory=20000)
    want = planned(o, rnn_max_sum, args)
    assert want[0] == temp(o, *args)
    r = jaxform.explain(o, *args) if via_optimize else jaxform.explain(rnn_max_sum, *args, loop_memory=20000)
    got = reported(r)
    assert got[:2] == want[:2] and got[2] == want[2], (got[:2], want[:2])


@pytest.mark.parametrize("name", ["rnn_max_sum", pytest.param("lstm_tanh", marks=pytest.mark.slow), "sincos"])
def test_explain_budget_under_grad_use_is_what_runs(name):
    f, args = {"rnn_max_sum": (rnn_max_sum, _rnn_args()), "lstm_tanh": (lstm_tanh, _lstm_args()),
               "sincos": (sincos, _sincos_args())}[name]
    o = jaxform.optimize(f, memory=20000)
    want = planned(o, f, args, jax.grad)
    assert o.plan().use.label == GRAD0.label
    got = reported(jaxform.explain(f, *args, loop_memory=20000, for_use=GRAD0))
    assert got[:2] == want[:2], (got[:2], want[:2])


def test_explain_budget_inside_optimizes_contexts_is_what_runs():
    """Finding A's cause, pinned: run inside the two contexts optimize sets, explain reports what runs."""
    args = _rnn_args()
    o = jaxform.optimize(rnn_max_sum, memory=20000)
    want = planned(o, rnn_max_sum, args)
    with _ctx(args):
        got = reported(jaxform.explain(rnn_max_sum, *args, loop_memory=20000))
    assert got[:2] == want[:2], (got[:2], want[:2])


def test_explain_of_an_exact_optimize_is_what_runs():
    args = _rnn_args()
    o = jaxform.optimize(rnn_max_sum, exact=True)
    ran = temp(o, *args)
    r = jaxform.explain(o, *args)
    assert r.temp_bytes[1] == ran, (r.temp_bytes, ran)
    assert all(getattr(jaxform.passes.get(p.split("(")[0]), "exact", False)
               for p in (c.pass_name for c in r.changes)), [c.pass_name for c in r.changes]


def _final(w, xs):
    """A loss of the last carry only: no forward rewrite applies (the forward plan is the traced program)."""
    h, _ = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(h ** 2)


def test_explain_under_jit_claims_no_remat_the_gradient_never_runs():
    args = pa(H, H, k=1 / np.sqrt(H)), pa(200, B, H)
    o = jaxform.optimize(_final)
    g_opt, g_plain = temp(jax.grad(jax.jit(o)), *args), temp(jax.grad(_final), *args)
    r = jaxform.explain(_final, *args)
    claims = [lp for lp in r.loops if lp["schedule"] not in (None, "keep")]
    assert not claims or g_opt < g_plain, (claims, g_opt, g_plain, str(r))


def _acc_first(w, zs):
    loss, vs = with_aux(w, zs)
    return {"acc": jnp.mean(vs), "aux": vs, "loss": loss}      # flattened: acc, aux, loss


def _two_scalars(w, zs):
    loss, vs = with_aux(w, zs)
    return jnp.max(vs), loss, vs


def _nested(w, zs):
    loss, vs = with_aux(w, zs)
    return {"m": {"a": vs, "b": jnp.sum(vs)}, "z_loss": loss}


def _stack_acc(w, zs):
    loss, vs = aux_stack(w, zs)
    return {"acc": jnp.mean(vs), "aux": vs, "loss": loss}


_PICK = {"acc_first": (_acc_first, lambda r: (r["loss"], (r["acc"], r["aux"]))),
         "two_scalars": (_two_scalars, lambda r: (r[1], (r[0], r[2]))),
         "nested": (_nested, lambda r: (r["z_loss"], r["m"])),
         "stack_acc": (_stack_acc, lambda r: (r["loss"], (r["acc"], r["aux"])))}


def _aux_grad(fn, pick, vg=False):
    t = jax.value_and_grad if vg else jax.grad
    return t(lambda *a: pick(fn(*a)), has_aux=True)


@pytest.mark.parametrize("name,memory", [("acc_first", None), ("acc_first", "min"), ("two_scalars", "auto"),
                                         ("nested", None), ("stack_acc", None)])
def test_has_aux_loss_behind_another_scalar_never_bigger(name, memory):
    f, pick = _PICK[name]
    args = _aux_args()
    o = jaxform.optimize(f, memory=memory)
    close(_aux_grad(o, pick)(*args), _aux_grad(f, pick)(*args), rtol=1e-4)
    got, want = temp(_aux_grad(o, pick), *args), temp(_aux_grad(f, pick), *args)
    assert got <= want, (got, want)


def test_value_and_grad_has_aux_loss_behind_another_scalar_never_bigger():
    f, pick = _PICK["acc_first"]
    args = _aux_args()
    o = jaxform.optimize(f, memory=None)
    close(_aux_grad(o, pick, vg=True)(*args), _aux_grad(f, pick, vg=True)(*args), rtol=1e-4)
    got, want = temp(_aux_grad(o, pick, vg=True), *args), temp(_aux_grad(f, pick, vg=True), *args)
    assert got <= want, (got, want)


def test_vmap_has_aux_loss_behind_another_scalar_never_bigger():
    f, pick = _PICK["acc_first"]
    w, zs = _aux_args()
    zb = jnp.stack([zs] * 3)
    V = lambda fn: jax.vmap(_aux_grad(fn, pick), in_axes=(None, 0))   # noqa: E731
    o = jaxform.optimize(f, memory=None)
    close(V(o)(w, zb), V(f)(w, zb), rtol=1e-4)
    got, want = temp(V(o), w, zb), temp(V(f), w, zb)
    assert got <= want, (got, want)


def _four_metrics(w, zs):
    loss, vs = with_aux(w, zs)
    return {"a1": jnp.mean(vs), "a2": jnp.max(vs), "a3": jnp.min(vs), "a4": jnp.sum(vs), "aux": vs, "loss": loss}


@pytest.mark.parametrize("memory", [None, "min"])
def test_has_aux_loss_behind_four_metrics_never_bigger(memory):
    pick = lambda r: (r["loss"], (r["a1"], r["a2"], r["a3"], r["a4"], r["aux"]))   # noqa: E731
    args = _aux_args()
    o = jaxform.optimize(_four_metrics, memory=memory)
    close(_aux_grad(o, pick)(*args), _aux_grad(_four_metrics, pick)(*args), rtol=1e-4)
    got, want = temp(_aux_grad(o, pick), *args), temp(_aux_grad(_four_metrics, pick), *args)
    assert got <= want, (got, want)


# =========================================================================================================
# Attacks that held (ordinary tests)
# =========================================================================================================

@pytest.mark.parametrize("memory", ["default", None, "min"])
def test_explain_under_jit_is_what_runs(memory):
    """rnn_mse: the default pipeline, None (forward plan, derivatives as traced: 1648 B, 11 eqns) and "min"
    (one plan for both: 6896 B, 16 eqns); explain(f) and explain(optimize(f)) alike."""
    args = _mse_args()
    kw = {} if memory == "default" else dict(memory=memory)
    o = jaxform.optimize(rnn_mse, **kw)
    want = planned(o, rnn_mse, args)
    assert want[0] == temp(o, *args)
    for r in (jaxform.explain(o, *args),
              jaxform.explain(rnn_mse, *args, **({} if memory == "default" else dict(loop_memory=memory)))):
        got = reported(r)
        assert got[:2] == want[:2] and got[2] == want[2], (got[:2], want[:2])
        assert bool(r.derivatives) == (o.plan().forward is not None)
        if r.derivatives:
            assert not r.loops and r.grad_temp_bytes is None


@pytest.mark.parametrize("memory", ["default", "min", 20000])
def test_explain_forward_use_is_what_a_concrete_call_runs(memory):
    """FORWARD: memory passes dropped, no remat stage or loop line; the program a concrete call plans."""
    args = _lstm_args()
    kw = {} if memory == "default" else dict(memory=memory)
    o = jaxform.optimize(lstm_tanh, **kw)
    o(*args)
    p = o.plan()
    assert p.use.label == FORWARD.label
    closed, flat = P.trace_flat(lstm_tanh, args)
    want = P.temp_bytes(p.closed, flat), len(Graph.from_jaxpr(p.closed))
    r = jaxform.explain(lstm_tanh, *args, for_use=FORWARD,
                        **({} if memory == "default" else dict(loop_memory=memory)))
    assert (r.temp_bytes[1], r.eqns[1]) == want
    assert not [c for c in r.changes if c.pass_name.startswith("remat")] and not r.loops


def test_explain_grad_use_without_a_budget_is_what_runs():
    args = _mse_args()
    o = jaxform.optimize(rnn_mse, memory="min")
    want = planned(o, rnn_mse, args, jax.grad)
    got = reported(jaxform.explain(rnn_mse, *args, loop_memory="min", for_use=GRAD0))
    assert got[:2] == want[:2] and got[2] == want[2], (got[:2], want[:2])


@pytest.mark.parametrize("memory", ["default", "min", pytest.param(20000, marks=pytest.mark.slow)])
def test_explain_of_an_optimized_gradient_is_what_runs(memory):
    """optimize(jax.grad(f)): a program taken for a gradient (23684 B, 21 eqns at every setting)."""
    args = _mse_args()
    g = jax.grad(rnn_mse)
    o = jaxform.optimize(g, **({} if memory == "default" else dict(memory=memory)))
    ran = temp(o, *args)
    want = planned(o, g, args)
    r = jaxform.explain(o, *args)
    assert r.temp_bytes[1] == ran == want[0] and r.eqns[1] == want[1]


@pytest.mark.parametrize("name", ["int_first", "bf16", "cplx"])
def test_has_aux_variants_that_held(name):
    """An integer scalar before the loss (no float scalar before it), a bf16 loss, complex aux: never bigger."""
    def int_first(w, zs):
        loss, vs = with_aux(w, zs)
        return {"aux": vs, "count": jnp.sum(vs > 0), "loss": loss}

    def bf16(w, zs):
        loss, vs = with_aux(w, zs)
        return {"aux": vs, "loss": loss.astype(jnp.bfloat16)}

    def cplx(w, zs):
        loss, vs = with_aux(w, zs)
        return {"aux": vs + 0j, "loss": loss}
    f, pick = {"int_first": (int_first, lambda r: (r["loss"], (r["count"], r["aux"]))),
               "bf16": (bf16, lambda r: (r["loss"], r["aux"])),
               "cplx": (cplx, lambda r: (r["loss"], r["aux"]))}[name]
    args = _aux_args()
    for memory in (None, "min"):
        o = jaxform.optimize(f, memory=memory)
        for vg in (False, True):
            close(_aux_grad(o, pick, vg)(*args), _aux_grad(f, pick, vg)(*args), rtol=1e-3)
            assert temp(_aux_grad(o, pick, vg), *args) <= temp(_aux_grad(f, pick, vg), *args)


@pytest.mark.slow
def test_vjp_with_cotangents_on_some_outputs_never_bigger():
    """jax.vjp of {"acc", "aux", "loss"} pulled back with ones on one output, zeros on the others."""
    args = _aux_args()

    def vjp_on(fn, k):
        def run(*a):
            out, pull = jax.vjp(fn, *a)
            leaves, tree = jax.tree_util.tree_flatten(out)
            return out, pull(jax.tree_util.tree_unflatten(
                tree, [jnp.ones_like(y) if i == k else jnp.zeros_like(y) for i, y in enumerate(leaves)]))
        return run
    for memory in (None, "min"):
        o = jaxform.optimize(_acc_first, memory=memory)
        for k in range(3):
            close(vjp_on(o, k)(*args), vjp_on(_acc_first, k)(*args), rtol=1e-4)
            assert temp(vjp_on(o, k), *args) <= temp(vjp_on(_acc_first, k), *args)
