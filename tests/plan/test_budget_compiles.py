"""Issue 38: what a byte budget compiles on a loop-free train step (planning time is compiles: each candidate
is a whole gradient). A budget's baseline is the program as traced, the one the final guard measures, so the
two share a compile; order B (`optimize(jax.grad(f), memory=B)`) compiles its candidates fastest first (by the
model) up to the first that fits, as order A does; a gradient of jitted layers is a gradient once inlined.
Counts are of fresh compiles (JAXFORM_MEASURE=memory, a fresh tune cache per test)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import _jax
from jaxform.plan import measure

NEW_XLA = _jax.JAX_VERSION >= (0, 11)    # XLA:CPU before 0.11 frees nothing by recomputation (docs/remat.md)

_layer = jax.jit(lambda h, w: jnp.tanh(h @ w))


def jitted_mlp(params, x):
    """Eight tanh layers, each a jitted call (as Equinox and Flax modules often are): the traced program and
    its inlined form are different programs to XLA."""
    h = x
    for w in params:
        h = _layer(h, w)
    return jnp.mean(h ** 2)


def _args():
    r = np.random.RandomState(0)
    return ([jnp.asarray(r.randn(256, 256) * 0.1, np.float32) for _ in range(8)],
            jnp.asarray(r.randn(512, 256), np.float32))


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


@pytest.fixture
def compiles(monkeypatch, tmp_path):
    """Counts the planner's fresh compiles (`measure._compiled` where nothing was compiled for the program)."""
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    n = [0]
    orig = measure._compiled

    def counted(closed, budget, memory_only=False):
        p = measure._program(closed, budget)
        n[0] += p.compiled is None and not (memory_only and p.for_memory is not None)
        return orig(closed, budget, memory_only)
    monkeypatch.setattr(measure, "_compiled", counted)
    return n


def _planned(fn, args):
    """(XLA temp of jit(fn), the 'cannot' warnings) with fn traced, i.e. planned, here."""
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        lowered = jax.jit(fn).lower(*args)
    return lowered.compile().memory_analysis().temp_size_in_bytes, [str(w.message) for w in ws
                                                                    if "cannot" in str(w.message)]


def test_gradient_first_order_compiles_up_to_the_first_fit(compiles):
    """Order B compiled the traced program's gradient twice (its cleaned form for the budget, its traced form for
    the guard) and all four recompute candidates, then kept the fastest that fit: 6 compiles on nanoGPT at 50%
    (14.7 -> 22.2 s against a 3.3 s plain compile). Now: the traced program once, then candidates fastest first
    until one fits (nanoGPT: 3), and the result in the guard. And a gradient of jitted layers was not taken for a gradient once inlined: left
    at plain's bytes, warned, after 19 compiles (JAX 0.12)."""
    args = _args()
    plain = temp(jax.grad(jitted_mlp), *args)
    budget = int(plain * 0.6)
    o = jaxform.optimize(jax.grad(jitted_mlp), memory=budget)
    got, said = _planned(o, args)
    _close(jax.jit(o)(*args), jax.grad(jitted_mlp)(*args))
    assert got <= plain
    if NEW_XLA:
        assert got <= budget and not said, (got, budget, said)
        assert compiles[0] <= 3, compiles[0]      # the traced program, the fastest candidate (it fits), the result
    else:
        assert got <= budget or said
        assert compiles[0] <= 6, compiles[0]      # the traced program, the four candidates (none fits), the result


def test_budget_baseline_is_the_guards_compile(compiles):
    """Order A measured the gradient of the inlined program for its baseline and the guard the traced one: two
    compiles of plain's gradient where calls are jitted (5 compiles here on JAX 0.12; nanoGPT 7 -> 6)."""
    args = _args()
    plain = temp(jax.grad(jitted_mlp), *args)
    budget = int(plain * 0.7)
    g = jax.grad(jaxform.optimize(jitted_mlp, memory=budget))
    got, said = _planned(g, args)
    _close(jax.jit(g)(*args), jax.grad(jitted_mlp)(*args))
    assert got <= plain
    if NEW_XLA:
        assert got <= budget and not said, (got, budget, said)
        assert compiles[0] <= 4, compiles[0]      # plain as traced, candidates up to the fit, its value_and_grad
    else:
        assert got <= budget or said


def _close(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=1e-6)
