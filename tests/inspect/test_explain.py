"""explain: which passes changed the program, where (user lines), and the effect on equations and memory."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform.inspect import Report
from programs import B, H, L, algebraic, line_of, mse, rnn, rnn_args, twice


def test_flagship_report():
    args = rnn_args(length=200)
    r = jaxform.explain(mse, *args)
    # the pipeline `optimize` runs: its memory passes included (while_grad, remat_loops, remat_program)
    assert isinstance(r, Report) and r.passes == list(jaxform.passes.DEFAULT) + [
        "while_grad(max_steps=None)", "remat_loops(memory='auto')", "remat_program(memory='auto')"]
    assert [c.pass_name for c in r.changes] == ["fuse_scan_reductions", "remat_loops(memory='auto')"]
    c = r.changes[0]
    assert any(w.endswith(f"programs.py:{line_of(mse, 'MSE_LINE')} (mse)") for w in c.where)
    assert c.eqns[0] == r.eqns[0] and c.eqns[1] > c.eqns[0]   # the moved chain sits in the body, plus an accumulator
    before, after = r.temp_bytes
    assert c.temp_bytes[0] == before and r.changes[1].temp_bytes[1] == after   # then the loop is planned (remat)
    # XLA's own numbers for the user's function and for jaxform.optimize of it
    assert before == jax.jit(mse).lower(*args).compile().memory_analysis().temp_size_in_bytes
    assert after == jax.jit(jaxform.optimize(mse)).lower(*args).compile().memory_analysis().temp_size_in_bytes
    # explain of the optimize wrapper explains the function under the wrapper's settings, not a re-plan of its result
    assert jaxform.explain(jaxform.optimize(mse), *args).changes == r.changes
    r2 = jaxform.explain(jaxform.optimize(mse, memory="min"), *args)
    assert r2.passes[-1] == "remat_program(memory='min')" and r2.function == r.function
    assert before >= 200 * B * H * 4 > 10 * after   # the [L, B, H] intermediates are gone
    assert "+" in c.diff and "num_carry=3" in c.diff   # h, the accumulator and its compensation (200 steps > 64)
    text = str(r)
    assert "fuse_scan_reductions: equations" in text and "programs.py" in text and "temp memory" in text


def test_counts_equations_inside_bodies():
    r = jaxform.explain(rnn, *rnn_args()[:3], memory=False, loop_memory=None)
    closed = jax.make_jaxpr(rnn)(*rnn_args()[:3])
    top = len(closed.jaxpr.eqns)
    body = len(closed.jaxpr.eqns[-1].params["jaxpr"].jaxpr.eqns)
    assert r.eqns[0] == top + body and r.temp_bytes is None and r.changes == []
    assert "no pass changed the program" in str(r)


def test_where_points_at_the_users_line():
    r = jaxform.explain(twice, jnp.ones(3), passes=["cse"], memory=False)
    (c,) = r.changes
    assert c.where == [f"{os.path.relpath(__file__.replace('test_explain', 'programs'))}:"
                       f"{line_of(twice, 'TWICE_LINE')} (twice)"]
    assert c.eqns == (5, 3) and (c.added, c.removed) == (0, 2)


def test_rule_firings_for_rule_set_passes():
    r = jaxform.explain(algebraic, jnp.ones(3), passes=["algebra"])
    (c,) = r.changes
    assert c.rules == {"log(exp(x)) -> x": 1, "x*1 -> x": 1}
    assert c.eqns == (3, 0)
    assert "rule log(exp(x)) -> x: 1x" in str(r)


def test_user_rules_as_a_pass_report_their_firings():
    rules = jaxform.Rules([(jaxform.Pat("neg", jaxform.Pat("neg", jaxform.Pat.any("x"))), lambda x: x)],
                          name="double_neg")
    r = jaxform.explain(lambda x: -(-x) + 1.0, jnp.ones(3), passes=[rules], memory=False)
    (c,) = r.changes
    assert c.pass_name == "double_neg" and sum(c.rules.values()) == 1


def test_measure_and_to_dict(capsys):
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in rnn_args()]
    r = jaxform.explain(mse, *specs, measure=True, reps=2, progress=True)
    t0, t1 = r.time_s
    assert 0 < t0 < 10 and 0 < t1 < 10 and r.reps == 2
    d = r.to_dict()
    assert d["changes"][0]["pass_name"] == "fuse_scan_reductions" and d["time_s"] == r.time_s
    assert json.loads(json.dumps(d))["eqns"] == list(r.eqns)
    err = capsys.readouterr().err
    assert "compiling" in err and "measuring" in err
    assert "time (jit, min of 2)" in str(r)


def test_trace_errors_propagate():
    with pytest.raises(TypeError):
        jaxform.explain(mse, jnp.ones((3, 3)), jnp.ones((2, 4)), jnp.ones((5, 2, 4)), jnp.ones((5, 2, 4)))


# ---- stages are the same program by the identity rule, never by printed text ----

def _adder(d):
    def cb(v):
        return np.asarray(v + d, np.float32)
    return cb


def _calls(d):
    return lambda x: jax.pure_callback(_adder(d), jax.ShapeDtypeStruct((3,), jnp.float32), x) * 2.0


def test_stages_that_print_alike_are_not_one_program(monkeypatch):
    """explain keyed its memory cache (and `program.run` its "changed?" test) on the printed
    jaxpr: two programs calling different callbacks print alike (masked addresses). A pass
    swapping the callback was not reported, and both stages shared one measurement."""
    from jaxform.inspect import program
    x = jnp.ones(3)
    other = jax.make_jaxpr(_calls(100))(x).jaxpr.eqns[0].params["callback"]

    def swap_callback(graph):
        for n, _ in graph.walk():
            if n.name == "pure_callback":
                n.params["callback"] = other
        return graph

    before = jax.make_jaxpr(_calls(1))(x)
    after = program.run(before, [swap_callback])
    assert str(before) == str(after)                               # JAX prints them alike...
    assert program.program_key(before) != program.program_key(after)  # ...they are not the same program
    assert program.program_key(before) == program.program_key(program.run(before, []))

    measured = []
    monkeypatch.setattr(program, "temp_bytes", lambda c, flat: measured.append(c) or 0)
    r = jaxform.explain(_calls(1), x, passes=[swap_callback], loop_memory=None)
    assert [c.pass_name for c in r.changes] == ["swap_callback"]
    # one measurement per distinct program: the original, and the one calling `other`
    assert len(measured) == 2
    ids = {id(c.jaxpr.eqns[0].params["callback"]) for c in measured}
    assert len(ids) == 2 and id(other) in ids
