"""A budget takes the first candidate that fits in the order of what each recomputes (`plan.memory.by_recompute`):
the cost model's seconds of the equations each schedule's backward computes again. The pass's fixed order puts
`checkpoint_dots` first, right where matmuls and convolutions are the work (`dots_saveable` keeps both); where
elementwise work dominates it recomputes nearly everything, and the segments come first. (The first version of
this change took convolutions for recomputed under `dots_saveable`, and put `checkpoint_dots` last on conv nets,
where it recomputes least: tests/fuzz/test_attack_recompute_order.py.)"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.ir import Graph
from jaxform.passes.inline import inline
from jaxform.passes.remat_program import boundaries, candidates, recomputed_eqns, schedules
from jaxform.plan import memory as pm
from jaxform.plan.memory import by_recompute

DN = ("NHWC", "HWIO", "NHWC")


def convnet(params, x):
    """Six 3x3 convolutions with tanh, a residual every other layer: the shape of a ResNet's trunk."""
    h = x
    for i, w in enumerate(params):
        y = jnp.tanh(lax.conv_general_dilated(h, w, (1, 1), "SAME", dimension_numbers=DN))
        h = h + y if i % 2 else y
    return jnp.mean(h ** 2)


def mlp(params, x):
    h = x
    for w in params:
        h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)


def _conv_args(layers=6, c=8):
    r = np.random.RandomState(0)
    return ([jnp.asarray(r.randn(3, 3, c, c) * 0.2, np.float32) for _ in range(layers)],
            jnp.asarray(r.randn(4, 16, 16, c), np.float32))


def _mlp_args():
    r = np.random.RandomState(0)
    return ([jnp.asarray(r.randn(64, 64) * 0.2, np.float32) for _ in range(6)],
            jnp.asarray(r.randn(32, 64), np.float32))


def _program(fn, args):
    return inline(Graph.from_jaxpr(jax.make_jaxpr(fn)(*args))).to_jaxpr()


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _names(specs):
    return [s[0] for s in specs]


def pointwise(params, x):
    """Elementwise work only (a normalizing flow's or an activation stack's shape): no matmul to keep."""
    h = x
    for s in params:
        h = jnp.sin(h * s) + jnp.exp(-h * h) * jnp.tanh(h)
    return jnp.mean(h ** 2)


def _pointwise_args():
    r = np.random.RandomState(0)
    return ([jnp.asarray(r.randn(256) * 0.5 + 1, np.float32) for _ in range(8)],
            jnp.asarray(r.randn(128, 256), np.float32))


def test_what_each_schedule_recomputes():
    closed = _program(convnet, _conv_args())
    eqns = closed.jaxpr.eqns
    b = tuple(boundaries(closed.jaxpr, 4))
    assert recomputed_eqns(closed, "nothing", b) == list(range(b[-1]))     # all but the last segment
    assert recomputed_eqns(closed, "all", b) == list(range(len(eqns)))
    dots = set(recomputed_eqns(closed, "dots", ()))
    convs = {i for i, e in enumerate(eqns) if e.primitive.name == "conv_general_dilated"}
    assert convs and not convs & dots and dots     # dots_saveable keeps convolutions; the tanh are recomputed
    m = _program(mlp, _mlp_args())
    matmuls = {i for i, e in enumerate(m.jaxpr.eqns) if e.primitive.name == "dot_general"}
    assert matmuls and not matmuls & set(recomputed_eqns(m, "dots", ()))


@pytest.mark.parametrize("fn, args", [(convnet, _conv_args), (mlp, _mlp_args)], ids=["conv", "mlp"])
def test_matmuls_and_convolutions_keep_checkpoint_dots_first(fn, args):
    closed = _program(fn, args())
    names = _names(by_recompute(closed))
    assert sorted(names) == sorted(_names(schedules(closed, cheapest_first=True)))    # the same schedules
    assert names[0] == "checkpoint_dots" and names[1].startswith("nothing, 2"), names


def test_elementwise_work_puts_checkpoint_dots_after_the_segments():
    names = _names(by_recompute(_program(pointwise, _pointwise_args())))
    assert names.index("checkpoint_dots") > max(i for i, n in enumerate(names) if n.startswith("nothing")), names
    assert all(n.startswith("all") for n in names[names.index("checkpoint_dots") + 1:]), names


def test_an_elementwise_budget_compiles_the_segments_first(monkeypatch, tmp_path):
    """A budget that 2 segments meet on a program with no matmul: the planner asks for 2 segments first and for
    nothing after it (the fixed order compiled checkpoint_dots first, which recomputes the whole forward here).
    The gradient fits, with plain JAX's values, and is no bigger than plain's."""
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    args = _pointwise_args()
    closed = _program(pointwise, args)
    two = dict(candidates(closed, True))["nothing, 2 segments"]
    run = lambda prog: lambda p, x: _jax.eval_jaxpr(prog, *p, x)[0]     # noqa: E731
    plain, saved = (max(temp(g(run(prog)), *args) for g in (jax.grad, jax.value_and_grad)) for prog in (closed, two))
    if saved >= 0.8 * plain:
        pytest.skip(f"XLA frees little by recomputation here ({saved} B of plain's {plain})")
    budget = saved      # (what jax.grad and jax.value_and_grad of 2 segments take)
    asked = []

    def recorded(*a, **k):
        for name, prog in candidates(*a, **k):
            asked.append(name)
            yield name, prog
    monkeypatch.setattr(pm, "candidates", recorded)
    fn = jax.grad(jaxform.optimize(pointwise, memory=budget))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)     # the budget is met: nothing to say
        lowered = jax.jit(fn).lower(*args)
    assert asked == ["nothing, 2 segments"], asked
    assert lowered.compile().memory_analysis().temp_size_in_bytes <= budget
    for a, b in zip(jax.tree.leaves(jax.jit(fn)(*args)), jax.tree.leaves(jax.grad(pointwise)(*args))):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_a_program_the_model_cannot_cost_keeps_the_pass_order(monkeypatch):
    """Ordering is an optimization: a node the cost model raises on leaves the pass's own order, never a failed
    pass (which would skip the budget)."""
    closed = _program(pointwise, _pointwise_args())

    def cannot(*a, **k):
        raise NotImplementedError("a primitive the model has no cost for")
    monkeypatch.setattr(pm.cost, "node_seconds", cannot)
    assert _names(by_recompute(closed)) == _names(schedules(closed, cheapest_first=True))
