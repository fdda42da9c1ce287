"""Planning that takes a while says so while it runs, once (issue 38: U-Net budgets planned for minutes in
silence), and explain counts every candidate compiled, the memory decisions' included."""
import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform
from jaxform.plan import measure


def _rnn(w, xs):
    h, _ = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(h ** 2)


def test_progress_line_once_while_planning(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))      # nothing answered from an earlier run's cache
    monkeypatch.setattr(measure, "PROGRESS_SECONDS", 0.0)
    w, xs = np.eye(8, dtype=np.float32) * 0.5, np.linspace(-1, 1, 30 * 4 * 8, dtype=np.float32).reshape(30, 4, 8)
    opt = jaxform.optimize(_rnn, memory=4096)
    with caplog.at_level(logging.WARNING, logger="jaxform"):
        jax.grad(opt)(w, xs)
    said = [r.getMessage() for r in caplog.records if "so far" in r.getMessage()]
    assert len(said) == 1 and "_rnn" in said[0] and "candidate program(s) compiled" in said[0], said
    plan = opt.plan()
    assert plan is not None and plan.budget.compiles >= 1


def test_no_progress_line_for_a_quick_plan(monkeypatch, caplog):
    w, xs = np.eye(4, dtype=np.float32), np.ones((5, 2, 4), np.float32)
    with caplog.at_level(logging.WARNING, logger="jaxform"):
        jax.grad(jaxform.optimize(_rnn))(w, xs)
    assert not [r for r in caplog.records if "so far" in r.getMessage()]
