"""Findings of an attack on the planner, while_grad and remat_program (one test per finding).

Open findings are xfail(strict=True): they pass while the bug exists and alert when fixed.
What held up (no test): see the commit message of this file.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform


def _temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _rnn(xs, w):
    def body(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, ys = lax.scan(body, jnp.zeros(16), xs)
    return jnp.sum(jnp.sin(ys) ** 2)


ARGS = (jnp.ones((50, 16)), jnp.eye(16) * 0.5)


def test_memory_min_not_above_memory_none_on_grad_program():
    """optimize(jax.grad(f), memory="min") asks for the least memory whatever the time, yet XLA's
    temp for it was above what the default memory=None gives (11460 vs 9924 B, CPU, JAX 0.10.2): the
    planner took the program's own forward view ("forward (gradient program)") for a gradient and kept
    remat_loops' checkpoints, which only pay if the program is differentiated again. Fixed: `Use.differentiates`."""
    g = jax.grad(_rnn)
    t_min = _temp(jaxform.optimize(g, memory="min"), *ARGS)
    t_none = _temp(jaxform.optimize(g, memory=None), *ARGS)
    assert t_min <= t_none * 1.01, (t_min, t_none)


def test_zero_budget_not_above_memory_min_under_grad():
    """A byte budget of 0 cannot be met, so the least-memory schedule should be chosen. Found: under
    jax.grad(optimize(f, memory=0)) XLA's temp was 7264 B while memory="min" reached 2500 B (JAX 0.10.2; 2976
    vs 2436 B on 0.12). Fixed by `plan.memory.fit_loops`: an unmet budget measures "min"'s schedules too and
    keeps the least (2500 B in both, both JAX versions, 2026-11-29)."""
    t_zero = _temp(jax.grad(jaxform.optimize(_rnn, memory=0)), *ARGS)
    t_min = _temp(jax.grad(jaxform.optimize(_rnn, memory="min")), *ARGS)
    assert t_zero <= t_min * 1.01, (t_zero, t_min)

