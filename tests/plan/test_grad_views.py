"""The programs a known gradient use is judged as (`plan.use`): the gradient as `jax.grad` runs it, with its
value returned too (what `jax.value_and_grad` runs; the inputs cannot tell the two apart), and, for a scalar
float output among others, the gradient of that output alone (`jax.grad(f, has_aux=True)`). A byte budget or "min" is
never given back for time, and an unmet budget is said even where no memory pass ran (attack round 9's
findings 3 and 4, and what their fix exposed)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import passes as P
from jaxform.plan import planner
from jaxform.plan.planner import Cost, ViewCost
from jaxform.plan.use import WITH_VALUE, Use, aux_index, aux_losses, aux_view

from plan.programs import sincos

GRAD_X1 = Use((("grad", (0,)),))


def _a(*shape, seed=0, k=0.3):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape) * k, jnp.float32)


def _sincos_args():
    return _a(8, 16), _a(50, 8, 16, seed=1), _a(50, 8, 16, seed=2)


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _with_aux(w, zs):
    vs = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), jnp.cos(x) * h), jnp.zeros(zs.shape[1:]), zs)[1]
    return jnp.sum(w ** 2), vs


def test_a_gradient_is_judged_with_and_without_its_value():
    closed = jax.make_jaxpr(sincos)(*_sincos_args())
    assert GRAD_X1.views() == ("grad", "grad" + WITH_VALUE) == GRAD_X1.views(closed)   # one output: no has_aux
    grad, valued = GRAD_X1.program(closed, "grad"), GRAD_X1.program(closed, "grad" + WITH_VALUE)
    # x1's gradient alone; then the loss too: sincos's loop does not read x1, yet its value needs the loop
    assert [tuple(v.aval.shape) for v in grad.jaxpr.outvars] == [(8, 16)]
    assert [tuple(v.aval.shape) for v in valued.jaxpr.outvars] == [(), (8, 16)]
    assert any(e.primitive.name == "scan" for e in valued.jaxpr.eqns)
    assert GRAD_X1.program(closed, aux_view(0)) is None      # one output: no has_aux call to judge
    # a gradient taken of a gradient is judged without the inner one's value (it is not returned)
    hess = Use((("grad", (0,)), ("grad", (0,))))
    assert len(hess.program(closed, "grad(grad)" + WITH_VALUE).jaxpr.outvars) == 2   # the inner gradient, x1's


def test_a_has_aux_gradient_is_judged_without_the_aux_cotangent():
    args = _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)
    closed = jax.make_jaxpr(_with_aux)(*args)
    assert GRAD_X1.views(closed) == ("grad", "grad" + WITH_VALUE, aux_view(0))
    both, first = GRAD_X1.program(closed, "grad" + WITH_VALUE), GRAD_X1.program(closed, aux_view(0))
    # both return the loss, the aux and w's gradient; only the first gives the aux a cotangent
    assert len(both.jaxpr.outvars) == len(first.jaxpr.outvars) == 3
    run = lambda p: temp(lambda *a: jaxform._jax.eval_jaxpr(p, *a), *args)   # noqa: E731
    assert run(first) < run(both)


def test_the_has_aux_loss_is_found_where_it_is():
    """`{"loss": l, "aux": a}` flattens the aux first, `{"acc": mean(a), "aux": a, "loss": l}` the accuracy
    first: each scalar output is judged as the has_aux loss (round 10 and 11's attacks), not output 0."""
    args = _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)
    swapped = jax.make_jaxpr(lambda w, zs: (lambda l, v: {"loss": l, "aux": v})(*_with_aux(w, zs)))(*args)
    acc = jax.make_jaxpr(lambda w, zs: (lambda l, v: {"acc": jnp.mean(v), "aux": v, "loss": l})(
        *_with_aux(w, zs)))(*args)
    assert aux_losses(swapped) == [1] and aux_losses(jax.make_jaxpr(_with_aux)(*args)) == [0]
    assert aux_losses(acc) == [0, 2] and GRAD_X1.views(acc)[2:] == (aux_view(0), aux_view(2))
    assert [aux_index(v) for v in GRAD_X1.views(acc)] == [None, None, 0, 2]
    first = GRAD_X1.program(swapped, aux_view(1))
    # the returned values (aux, loss) and w's gradient, which the aux's cotangent does not reach: smaller
    run = lambda p: temp(lambda *a: jaxform._jax.eval_jaxpr(p, *a), *args)   # noqa: E731
    assert len(first.jaxpr.outvars) == 3 and run(first) < run(GRAD_X1.program(swapped, "grad" + WITH_VALUE))
    assert run(GRAD_X1.program(acc, aux_view(2))) < run(GRAD_X1.program(acc, aux_view(0)))   # the loss alone
    assert aux_losses(jax.make_jaxpr(lambda w: (w, w * 2))(args[0])) == []    # no scalar: no has_aux call


def test_a_loss_and_aux_pair_is_judged_as_has_aux_runs_it():
    """A function returning (loss, aux), as `optimize` tells the planner (`returns_loss_and_aux`), is judged per
    candidate as `jax.grad(f, has_aux=True)` and `jax.value_and_grad(f, has_aux=True)` run it; the VJP of every
    output, with and without the values, only by the final guard (round 17's K: judging it per candidate too
    doubled each candidate's compiles)."""
    from jaxform.plan.use import NO_VALUE, returns_loss_and_aux, without_value
    args = _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)
    closed = jax.make_jaxpr(_with_aux)(*args)
    with returns_loss_and_aux(True):
        assert GRAD_X1.views(closed) == (aux_view(0, value=False), aux_view(0))
        assert GRAD_X1.guarded_views(closed) == ("grad", "grad" + WITH_VALUE)
        grad, valued = GRAD_X1.program(closed, aux_view(0, value=False)), GRAD_X1.program(closed, aux_view(0))
    assert aux_index(aux_view(0, value=False)) == 0 and aux_view(0, value=False).endswith(NO_VALUE)
    assert without_value(aux_view(0)) == aux_view(0, value=False) and without_value("grad" + WITH_VALUE) == "grad"
    assert without_value("grad") is None and without_value(aux_view(0, value=False)) is None
    # has_aux's gradient returns the aux and w's gradient; with the value, the loss too
    assert len(grad.jaxpr.outvars) == 2 and len(valued.jaxpr.outvars) == 3
    with returns_loss_and_aux(False):    # a pair `optimize` was not told of: every way judged per candidate
        assert GRAD_X1.views(closed) == ("grad", "grad" + WITH_VALUE, aux_view(0))
        assert GRAD_X1.guarded_views(closed) == ()


def test_the_final_guard_holds_a_pair_to_the_vjp_of_every_output(monkeypatch):
    """Only the guard sees a (loss, aux) function's VJP of every output: a chosen program bigger there than as
    traced (XLA's bytes, faked here for that view alone) is caught, in has_aux's views no bigger."""
    from jaxform.plan import measure
    from jaxform.plan.use import returns_loss_and_aux
    args = _a(16, 16, k=0.1), _a(60, 8, 16, seed=3)
    closed = jax.make_jaxpr(_with_aux)(*args)
    chosen = jax.make_jaxpr(lambda w, zs: jax.tree_util.tree_map(lambda x: x * 1.0, _with_aux(w, zs)))(*args)
    with returns_loss_and_aux(True):
        costs = planner._Costs(GRAD_X1, measure.Budget(None), None, True, False)
        p = planner._Planning(closed, [], "auto", False, "", costs)
        grown = costs.guarded(chosen)["grad" + WITH_VALUE]
        monkeypatch.setattr(measure, "temp_bytes", lambda c, *a, **k: 2000 if c is grown else 1000)
        over = p.bigger(chosen)
    assert over is not None and "grad" + WITH_VALUE in over and "2000 B > 1000 B" in over, over
    assert set(costs.views(closed)) == {aux_view(0, value=False), aux_view(0)}


def test_judge_gives_back_no_bytes_a_budget_or_min_asks_for():
    grad = Use((("grad", (0,)),))
    cost = lambda m, s: Cost((ViewCost("grad", m, s, "XLA", "measured"),))   # noqa: E731
    plain, won, faster = cost(200e6, 3.0), cost(50e6, 3.0), cost(100e6, 1.0)   # 3x faster for 50 MB back
    judge = lambda memory: planner.judge(plain, won, faster, memory_pass=False, memory=memory, use=grad)  # noqa: E731
    assert judge(None)[0] and judge(150e6)[0]            # time first; or a budget it still fits
    for memory in ("min", 60e6):
        keep, why = judge(memory)
        assert not keep and "memory=" in why, why


@pytest.mark.parametrize("memory", [2000, "min"])
def test_a_budget_won_by_fusion_is_not_given_back_for_time(memory):
    """sincos under jax.grad with a 2000-byte budget: fusion fits it (608 B as value_and_grad runs it), and
    fission, predicted 7.5x faster, used to undo it: 25.6 KiB, no warning."""
    args = _sincos_args()
    o = jaxform.optimize(sincos, memory=memory)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got = temp(jax.value_and_grad(o), *args)
    plain = temp(jax.value_and_grad(sincos), *args)
    assert got <= (2000 if memory == 2000 else plain // 10), (got, plain, [str(w.message) for w in said])


def test_an_unmet_budget_is_said_where_no_memory_pass_ran():
    """A pipeline without memory passes, planned for jax.grad with a budget nothing meets: said by the planner."""
    args = _sincos_args()
    closed = jax.make_jaxpr(sincos)(*args)
    pipeline = [p for p in P.default_pipeline() if planner.base_name(p) in ("inline", "cse", "dce")]  # (no fusion:
    # its 608 B on JAX 0.10.2 are 0 B on 0.12)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        out = planner.plan(closed, pipeline, memory=100, use=GRAD_X1, example_args=jax.tree_util.tree_leaves(args))
    got = temp(jax.value_and_grad(lambda *a: jaxform._jax.eval_jaxpr(out.closed, *a)[0]), *args)
    assert got > 100
    msgs = [str(w.message) for w in said if "cannot fit" in str(w.message)]
    assert len(msgs) == 1 and "memory=100 bytes" in msgs[0] and "no memory pass" in msgs[0], msgs


def test_a_jit_trace_says_no_unmet_budget_its_gradient_meets():
    """Under a jit trace the planner's hypothetical gradient is every float input's, the budget `jax.grad`'s
    default (the first argument's): the unmet-budget warning measured the former and said "cannot fit ... 36.9
    KiB" where `jax.value_and_grad` of it takes 17648 B of a 20000-byte budget (round 11's run)."""
    from plan.programs import rnn_max_sum
    args = _a(16, 16, k=0.25), _a(40, 8, 16, seed=1)
    o = jaxform.optimize(rnn_max_sum, memory=20000)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        jax.jit(o).lower(*args).compile()
    got = temp(jax.value_and_grad(o), *args)
    said = [str(x.message) for x in w if "cannot fit" in str(x.message)]
    assert got > 20000 or not said, (got, said)
    assert got <= 20000 or said, got
