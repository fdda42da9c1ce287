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
    # a jit trace's unknown use: the forward planned alone, its derivatives as traced (no loop rescheduled:
    # explain showed remat_loops' stage here, which `jax.grad(jax.jit(optimize(mse)))` never ran)
    assert [c.pass_name for c in r.changes] == ["fuse_scan_reductions"] and "as traced" in r.derivatives
    c = r.changes[0]
    assert any(w.endswith(f"programs.py:{line_of(mse, 'MSE_LINE')} (mse)") for w in c.where)
    assert c.eqns[0] == r.eqns[0] and c.eqns[1] > c.eqns[0]   # the moved chain sits in the body, plus an accumulator
    before, after = r.temp_bytes
    assert c.temp_bytes == (before, after)
    # planned for a gradient, the loop is rescheduled too (remat), and the gradient's bytes are reported
    wrt = tuple(range(len(jax.tree_util.tree_leaves(args))))
    rg = jaxform.explain(mse, *args, for_use=jaxform.plan.Use((("grad", wrt),)))
    assert [c.pass_name for c in rg.changes] == ["fuse_scan_reductions", "remat_loops(memory='auto')"], str(rg)
    assert not rg.derivatives and rg.grad_temp_bytes[1] < rg.grad_temp_bytes[0]
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


def _hoist_broadcasts():
    """A decided pass the planner rejects on XLA's bytes: a per-step broadcast made a loop constant
    (docs/extending.md's `biased_steps`)."""
    from jaxform.ir import ScanLoop

    @jaxform.passes.register("test_explain_hoist_broadcast", loops=True, decided=True)
    def hoist(graph):
        for node in [n for n in graph.nodes if n.name == "scan"]:
            loop = ScanLoop(node)
            outer = {v.id: o for v, o in zip(loop.body_consts, loop.consts)}
            for n in [n for n in loop.body.nodes if n.name == "broadcast_in_dim"]:
                if all(v.id in outer for v in n.inputs):
                    moved = graph.copy_node(n, [outer[v.id] for v in n.inputs], before=node)
                    for old, new in zip(n.outputs, loop.add_consts(moved.outputs)):
                        loop.body.replace_uses(old, new)
                    loop.body.remove(n)
        return graph
    return hoist


def test_explain_reports_the_program_the_plan_runs():
    """A jit trace plans the forward alone (its derivatives as traced): explain replayed the whole pipeline
    instead, passes the forward plan had rejected included. A GPU demo printed its forward 0.63x slower
    (fission, rejected there for a measured 0.52x) and a program that never ran."""
    import jax.numpy as jnp
    from jax import lax

    def biased_steps(b, xs):
        def step(h, x):
            return jnp.tanh(h * 0.9 + x + jnp.broadcast_to(b, x.shape)), None
        return jnp.sum(lax.scan(step, jnp.zeros(xs.shape[1:]), xs)[0])

    _hoist_broadcasts()
    pipeline = ["inline", "cse", "test_explain_hoist_broadcast", "dce"]
    b, ys = jnp.ones((8,)), jnp.ones((200, 256, 8))
    report = jaxform.explain(biased_steps, b, ys, passes=pipeline, plan=True)
    assert any("test_explain_hoist_broadcast: rejected" in d for d in report.decisions), report.decisions
    assert not [c for c in report.changes if c.pass_name == "test_explain_hoist_broadcast"], str(report)
    assert report.temp_bytes[1] <= report.temp_bytes[0], str(report)
    assert "broadcast_in_dim" not in report.diff


def test_explain_under_a_forward_use_shows_no_memory_pass():
    """A forward use runs no memory pass (docs/planner.md); the planner's skipped passes indexed the
    pipeline it ran, not the one explain replays, so remat_loops' stage and its gradient line showed."""
    from jaxform.plan import FORWARD
    report = jaxform.explain(mse, *rnn_args(length=200), for_use=FORWARD, memory=False)
    assert not [c for c in report.changes if c.pass_name.startswith("remat")], str(report)
    assert not report.loops and report.grad_temp_bytes is None
