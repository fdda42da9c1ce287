"""The planner (issue 27): the default pipeline never leaves a loop program bigger than plain `jax.jit`.

XLA's own `memory_analysis()` is the judge here (exact, unlike time): forward, `grad(optimize(f))`,
`optimize(grad(f))` and `optimize(value_and_grad(f))`, on the programs of issue 27's table
(tests/plan/programs.py), plus the cost model's predictions against XLA's numbers.
"""
import json
import os

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import passes as P
from jaxform.plan import cost, planner
from jaxform.plan.planner import Cost, ViewCost
from jaxform.plan.use import Use

from plan.programs import programs

PROGRAMS = programs()
cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="calibrated on XLA:CPU")


def temp(f, args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def scalar(fn):
    """A scalar loss of `fn` (the first output, plus the sum of the others) to differentiate."""
    def loss(*a):
        out = jax.tree_util.tree_leaves(fn(*a))
        return out[0] + sum(jnp.sum(o) for o in out[1:])
    loss.__name__ = fn.__name__
    return loss


def within(opt, plain, rel=0.01, slack=4096):
    return opt <= plain + max(slack, rel * plain)


@cpu_only
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_default_forward_never_bigger(name):
    fn, args = PROGRAMS[name]
    o = jaxform.optimize(fn)
    plain, opt = temp(fn, args), temp(o, args)
    assert within(opt, plain), (name, plain, opt)
    # ... nor above what the pipeline without any one loop pass gives, by more than 10%, unless the
    # planner traded that memory for time the machine measured (sincos excepted: batching
    # cos(xs) out of the loop buys 1.8x for the memory fusion would save).
    timed_out = [d for d in o.decisions() if (not d.kept and "measured slower" in d.why) or
                 (d.kept and "memory an earlier pass won" in d.why and "measured" in d.why)]
    if name != "sincos" and not timed_out:
        for drop in ("fuse_scan_reductions", "fission", "hoist_loop_invariants", "thin_residuals"):
            alone = temp(jaxform.optimize(fn, passes=[p for p in P.DEFAULT if p != drop]), args)
            assert opt <= 1.1 * alone + 4096, (name, drop, opt, alone, o.decisions())


@cpu_only
@pytest.mark.parametrize("memory", [pytest.param(None, marks=pytest.mark.slow), "auto"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_default_gradients_never_bigger(name, memory):
    fn, args = PROGRAMS[name]
    loss = scalar(fn)
    argnums = tuple(i for i, a in enumerate(args) if not isinstance(a, tuple))
    grad = jax.grad(loss, argnums)
    plain = temp(grad, args)
    for how, g in [("grad(optimize(f))", jax.grad(jaxform.optimize(loss, memory=memory), argnums)),
                   ("optimize(grad(f))", jaxform.optimize(grad, memory=memory))]:
        assert within(temp(g, args), plain), (name, how, memory, plain, temp(g, args))
    vg = jax.value_and_grad(loss, argnums)
    assert within(temp(jaxform.optimize(vg, memory=memory), args), temp(vg, args))


@pytest.fixture
def model_only(monkeypatch):
    """Plan on the cost model alone (JAXFORM_MEASURE=0): these tests check the planner's logic, which the
    model drives deterministically; what the machine's own measurements decide is tested in
    tests/plan/test_measured.py."""
    monkeypatch.setenv("JAXFORM_MEASURE", "0")


@cpu_only
def test_flagship_keeps_fusion_and_sincos_keeps_fission(model_only):
    fn, args = PROGRAMS["rnn_mse"]
    o = jaxform.optimize(fn)
    assert temp(o, args) < temp(fn, args) / 20          # the stacked states are gone
    assert any(d.pass_name == "fuse_scan_reductions" and d.kept for d in o.decisions())
    fn, args = PROGRAMS["sincos"]
    o = jaxform.optimize(fn)
    o(*args)
    kept = {p for p, k in {d.pass_name: d.kept for d in o.decisions()}.items() if k}   # each pass's last verdict
    assert "fission" in kept and "fuse_scan_reductions" not in kept, o.decisions()


@cpu_only
def test_fission_rejected_where_it_gives_fusion_back(model_only):
    fn, args = PROGRAMS["lstm_tanh"]
    o = jaxform.optimize(fn, memory=None)
    o(*args)
    by = {d.pass_name: d for d in o.decisions()}
    assert by["fuse_scan_reductions"].kept and not by["fission"].kept
    assert "memory" in by["fission"].why


@cpu_only
@pytest.mark.parametrize("name", ["rnn_mse", "lstm_tanh", "sincos", "kalman"])
def test_cost_model_predicts_xla_temp_memory(name, request):
    if name == "sincos" and jaxform._jax.JAX_VERSION >= (0, 12):   # calibrated on 0.10's XLA; open on 0.12
        request.applymarker(pytest.mark.xfail(strict=True, reason="sincos prediction off on JAX 0.12's XLA"))
    fn, args = PROGRAMS[name]
    for f in (fn, jaxform.optimize(fn, memory=None)):
        flat = jax.tree_util.tree_leaves(args)
        closed = jax.make_jaxpr(lambda *a: f(*jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args), a)))(*flat)
        e = cost.estimate(closed)
        xla = temp(lambda *a: jaxform._jax.eval_jaxpr(closed, *a), flat)
        assert abs(e.temp_bytes - xla) <= max(0.1 * xla, 160 * 1024), (name, e.temp_bytes, xla)
        gp = cost.gradient_program(closed)
        gx = temp(lambda *a: jaxform._jax.eval_jaxpr(gp, *a), flat)
        assert abs(e.grad_temp_bytes - gx) <= max(0.15 * gx, 512 * 1024), (name, e.grad_temp_bytes, gx)


def _cost(fwd, fs, grad=None, gs=None, timed=False):
    how = "measured" if timed else "model"
    views = [ViewCost("forward", fwd, fs, "XLA", how)]
    if grad is not None:
        views.append(ViewCost("grad", grad, gs, "XLA", how))
    return Cost(tuple(views))


def test_judge_objective():
    plain = _cost(100e6, 1.0, 200e6, 3.0)
    fused = _cost(1e6, 0.9, 200e6, 2.9)
    grad = Use((("grad", (0,)),))     # its view is "grad"
    judge = lambda b, a, **k: planner.judge(plain, b, a, memory_pass=k.get("mp", False), memory=k.get("memory"),  # noqa: E731
                                            use=grad)[0]
    assert judge(plain, fused)
    # more memory than the traced program: never, however fast
    assert not judge(fused, _cost(150e6, 0.1, 200e6, 1.0))
    # giving back what fusion won (within the traced program's) only for a 1.25x predicted speedup ...
    assert not judge(fused, _cost(100e6, 0.8, 200e6, 2.9))
    assert judge(fused, _cost(100e6, 0.5, 200e6, 2.9))
    # ... or measured (a sub-ms program's timing varies 20% within one process: 1.13x measured is not enough)
    assert judge(_cost(1e6, 1.0, 200e6, 2.9, True), _cost(100e6, 0.75, 200e6, 2.9, True))
    assert not judge(_cost(1e6, 0.9, 200e6, 2.9, True), _cost(100e6, 0.8, 200e6, 2.9, True))
    # no bigger but slower: no; predicted within 2%, measured within the machine's noise (5%): a tie
    assert not judge(fused, _cost(1e6, 1.0, 200e6, 2.9))
    assert judge(_cost(2e6, 1.0, 200e6, 3.0, True), _cost(2e6, 1.04, 200e6, 3.0, True))
    assert not judge(_cost(2e6, 1.0, 200e6, 3.0, True), _cost(2e6, 1.07, 200e6, 3.0, True))
    # a big memory win (2x or more) may cost the 10% time regret the planner is held to, measured only
    assert judge(_cost(100e6, 1.0, 200e6, 3.0, True), _cost(1e6, 1.08, 200e6, 3.2, True))
    assert not judge(_cost(100e6, 1.0, 200e6, 3.0, True), _cost(1e6, 1.15, 200e6, 3.0, True))
    assert not judge(_cost(100e6, 1.0, 200e6, 3.0), _cost(1e6, 1.08, 200e6, 3.0))
    # the memory planner trades time for gradient memory as asked: "min" and budgets do, "auto" (the
    # default) only where the gradient is not slower
    assert judge(fused, _cost(1e6, 0.9, 50e6, 4.0), mp=True, memory="min")
    assert judge(fused, _cost(1e6, 0.9, 50e6, 4.0), mp=True, memory=60e6)
    assert not judge(fused, _cost(1e6, 0.9, 50e6, 4.0), mp=True, memory="auto")
    assert judge(fused, _cost(1e6, 0.9, 50e6, 2.9), mp=True, memory="auto")
    assert not judge(fused, _cost(1e6, 0.9, 200e6, 4.0), mp=True, memory="auto")
    # ... and not at all for a function used forward only
    assert not judge(_cost(1e6, 0.9), _cost(1e6, 0.9), mp=True, memory="min")
    # "auto": no slower than plain jax.jit, timed against it (`_Planning.judged`), not against the program
    # before: the fused gradient's own speedup is not a bar the schedule must clear (the demo's remat: fused
    # 591 ms, fused + remat 580-698, plain 657-703)
    timed_plain, faster = _cost(100e6, 1.0, 200e6, 3.0, True), _cost(1e6, 0.9, 200e6, 2.6)
    keep, why = planner.judge(timed_plain, faster, _cost(1e6, 0.9, 50e6, 2.9, True), memory_pass=True,
                              memory="auto", use=grad)
    assert keep and "plain jax.jit" in why, why
    keep, why = planner.judge(timed_plain, faster, _cost(1e6, 0.9, 50e6, 3.4, True), memory_pass=True,
                              memory="auto", use=grad)
    assert not keep and "slower gradient than plain jax.jit" in why, why
    # ... within the noise, 5%; or, where it halves the gradient's memory, the 10% any rewrite halving a view's may
    # cost (the demo's 5x remat, refused at a measured 0.93x where its 600 ms gradient timed 500-690 ms)
    keep, why = planner.judge(timed_plain, faster, _cost(1e6, 0.9, 50e6, 3.2, True), memory_pass=True,
                              memory="auto", use=grad)
    assert keep and "within the 10%" in why, why
    keep, why = planner.judge(timed_plain, faster, _cost(1e6, 0.9, 150e6, 3.2, True), memory_pass=True,
                              memory="auto", use=grad)
    assert not keep and why.kind == planner.SLOWER, why
    keep, why = planner.judge(timed_plain, faster, _cost(1e6, 0.9, 50e6, 3.2), memory_pass=True,
                              memory="auto", use=grad)     # (predicted, not measured: no allowance)
    assert not keep, why
    # a time the model could not tell and the planning budget left unmeasured ("unchecked") is a guess: no
    # memory given back for it (the GPU demo's fission: a predicted 1.40x), no memory schedule under "auto"
    guess = lambda c: Cost(tuple(replace(v, time_from="unchecked") for v in c.views))  # noqa: E731
    assert judge(fused, _cost(100e6, 0.5, 200e6, 2.9))
    keep, why = planner.judge(plain, fused, guess(_cost(100e6, 0.5, 200e6, 2.9)), memory_pass=False, memory=None,
                              use=grad)
    assert not keep and "not measured" in why, why
    keep, why = planner.judge(plain, fused, guess(_cost(1e6, 0.9, 50e6, 2.9)), memory_pass=True, memory="auto",
                              use=grad)
    assert not keep and "cannot tell" in why, why
    assert planner.judge(plain, fused, guess(_cost(1e6, 0.9, 50e6, 4.0)), memory_pass=True, memory="min",
                         use=grad)[0]


def test_a_verdict_says_what_it_is_about_apart_from_its_words():
    """The planner reads a refusal's kind and view (`planner.Why`), not its words: a refusal for a gradient's
    memory or time is judged again with memory planning to come, whatever the sentence says, and a verdict
    reworded by a later pass keeps what it is about."""
    plain = _cost(100e6, 1.0, 200e6, 3.0)
    grad = Use((("grad", (0,)),))
    judge = lambda b, a, **k: planner.judge(plain, b, a, memory_pass=k.get("mp", False),  # noqa: E731
                                            memory=k.get("memory"), use=grad)[1]
    bigger = judge(plain, _cost(100e6, 0.5, 250e6, 2.0))
    assert (bigger.kind, bigger.view) == (planner.BIGGER, "grad") and planner._gradient_refusal(bigger)
    fwd_bigger = judge(plain, _cost(150e6, 0.5, 200e6, 2.0))
    assert (fwd_bigger.kind, fwd_bigger.view) == (planner.BIGGER, "forward")
    assert not planner._gradient_refusal(fwd_bigger)
    slower = judge(_cost(2e6, 1.0, 200e6, 3.0, True), _cost(2e6, 1.0, 200e6, 3.5, True))
    assert (slower.kind, slower.view) == (planner.SLOWER, "grad") and planner._gradient_refusal(slower)
    back = judge(_cost(1e6, 0.9, 200e6, 2.9), _cost(100e6, 0.8, 200e6, 2.9))
    assert back.kind == planner.GIVES_BACK and not planner._gradient_refusal(back)
    none = judge(_cost(1e6, 0.9, 100e6, 2.9), _cost(1e6, 0.9, 100e6, 2.9), mp=True, memory="min")
    assert none.kind == planner.KEPT     # ("min": no more memory is kept, saving nothing)
    assert judge(_cost(1e6, 0.9, 100e6, 2.9), _cost(1e6, 0.9, 100e6, 2.9), mp=True, memory="auto").kind == \
        planner.NO_SAVING
    reworded = bigger.reworded(f"{bigger} once thin_residuals has run")
    assert reworded.kind == planner.BIGGER and reworded.view == "grad" and reworded.endswith("has run")


def test_programs_without_loops_are_not_planned():
    def mlp(w, x):
        return jnp.sum(jnp.tanh(x @ w) @ w.T)
    o = jaxform.optimize(mlp)
    w, x = jnp.ones((8, 8)), jnp.ones((4, 8))
    assert float(o(w, x)) == pytest.approx(float(mlp(w, x)))
    assert o.decisions() == []


def test_passes_given_run_unplanned(model_only):
    fn, args = PROGRAMS["lstm_tanh"]
    o = jaxform.optimize(fn, passes=["fuse_scan_reductions", "fission", "dce"])
    o(*args)
    assert o.decisions() == []
    assert temp(o, args) > 2 * temp(jaxform.optimize(fn), args)   # fission ran as named


def test_explain_shows_decisions(model_only):
    fn, args = PROGRAMS["lstm_tanh"]
    text = str(jaxform.explain(fn, *args, memory=False))
    assert "planner: fuse_scan_reductions: kept" in text and "planner: fission: rejected" in text


def test_measurements_cached_on_disk(tmp_path, monkeypatch):
    """What planning measured is read back by a new process (a new wrapper here): nothing compiled or timed
    (near-ties settled at once here: `test_a_cached_near_tie_is_timed_again_until_it_settles` covers later rounds)."""
    from jaxform.plan import measure
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(measure, "SETTLE_ROUNDS", 1)
    fn, args = PROGRAMS["reverse_gru"]
    o = jaxform.optimize(fn, tune=True)
    y = o(*args)
    b = o.plan().budget
    assert b.compiles and b.timed and any(d.measured is not None for d in o.decisions()), b
    files = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path) for f in fs]
    assert files and all(set(json.load(open(f))) <= {"temp", "seconds", "rounds"} for f in files)
    o2 = jaxform.optimize(fn, tune=True)
    y2 = o2(*args)
    b2 = o2.plan().budget
    assert b2.compiles == 0 and b2.timed == 0 and b2.from_cache, b2
    assert [d.kept for d in o2.decisions()] == [d.kept for d in o.decisions()]
    assert jnp.allclose(y, y2) and jnp.allclose(y, fn(*args), rtol=1e-4)


@cpu_only
@pytest.mark.parametrize("name", ["hmm_two_filter", "kalman_filter", "s4_scan_ssm", "hmm_filter", "flax_rnn_ce"])
def test_real_small_programs_never_bigger_at_all(name):
    """Small real programs (tests/passes/test_fusion_real.py: dynamax, annotated-s4, Flax; cited there) are
    where an absolute slack hides real growth: fission grew dynamax's two-filter smoother 0.8 -> 1.0 KiB while
    the model predicted 264 -> 348 B, under the 4 KiB resolution. Growth beyond the traced program is now
    refused outright (relative tolerance only), and XLA measures small programs: within 1% of plain's."""
    from passes.test_fusion_real import PROGRAMS as REAL
    loss, args = REAL[name]()
    opt = jaxform.optimize(loss)
    assert temp(opt, args) <= 1.01 * temp(loss, args)
    assert temp(jax.grad(opt), args) <= 1.01 * temp(jax.grad(loss), args)


# ---- GPU decisions, from the GPU's cost constants on any backend (`cost.planning_for`) -------------------
# Measured on an H200 (JAX 0.11.2, benchmarks/planner_backend.py, docs/planner.md): a loop step there
# costs a kernel launch per kernel, and moving a reduction into the body adds one: fused forward
# time was 0.38-0.56x plain's for these programs, the streamed seed cumsum 0.46x forward and 0.57x
# under grad, while fission of the seed's sin/cos ran 14.5x faster.

def _decisions(fn, args, backend, use="forward"):
    """explain's verdicts by pass; a jit trace plans forward and gradient apart: those judged for `use`."""
    with cost.planning_for(backend):
        said = jaxform.explain(fn, *args, memory=False).decisions
    heads = [d.split(" (")[0] for d in said]
    return {d.split(":")[0]: d for d, h in zip(said, heads) if h.endswith(f" for {use}") or " for " not in h}


@pytest.mark.parametrize("name", ["rnn_mse", "gru_like", "lstm_tanh", "reverse_gru", "masked"])
def test_gpu_keeps_reductions_out_of_launch_bound_loops(name, model_only):
    fn, args = PROGRAMS[name]
    d = _decisions(fn, args, "gpu")
    assert "rejected" in d["fuse_scan_reductions"] and "slower" in d["fuse_scan_reductions"], d
    if name in ("rnn_mse", "lstm_tanh", "reverse_gru"):     # and on the CPU (calibrated there) it pays
        assert "kept" in _decisions(fn, args, "cpu")["fuse_scan_reductions"]
    with cost.planning_for("gpu"):   # the program optimize returns has no reduction in its loop
        closed = jax.make_jaxpr(jaxform.optimize(scalar(fn)))(*args)
    # (under a jit trace the forward plan runs inside a custom_jvp whose derivatives are the gradient plan's)
    eqns = [e for c in closed.jaxpr.eqns for e in
            (c.params["call_jaxpr"].jaxpr.eqns if c.primitive.name == "custom_jvp_call" else [c])]
    assert any(e.primitive.name == "reduce_sum" for e in eqns if e.primitive.name != "scan")


def test_gpu_keeps_the_seed_sincos_fission():
    fn, args = PROGRAMS["sincos"]
    assert "kept" in _decisions(fn, args, "gpu")["fission"]


def test_gpu_does_not_stream_the_seed_cumsum(model_only):
    def prefix_sums(x):
        def body(i, r):
            r[i + 1] += r[i]
        return jnp.sum(jaxform.for_loop(x.shape[0] - 1, body, x) ** 2)
    x = jnp.linspace(0.0, 1.0, 2000)
    assert "rejected" in _decisions(prefix_sums, (x,), "gpu")["stream_rows"]
    assert "kept" in _decisions(prefix_sums, (x,), "cpu")["stream_rows"]


def test_gpu_kernels_counted_as_xla_fuses():
    """The loop body of the RNN + MSE: plain, a matmul and the tanh fusion writing the carry and the stacked
    row in place (2 kernels); fused, the accumulation is a fusion of its own (and its compensation)."""
    fn, args = PROGRAMS["rnn_mse"]

    def body_kernels(f):
        g = jaxform.ir.Graph.from_jaxpr(jax.make_jaxpr(f)(*args))
        (scan,) = [n for n in g.nodes if n.name == "scan"]
        return cost._fusion_kernels(scan.regions["body"], scan.params["num_carry"])
    assert body_kernels(fn) == 2
    assert body_kernels(jaxform.optimize(fn, passes=["fuse_scan_reductions"])) > 2


def test_planning_for_is_scoped_and_keys_the_cache():
    f = jaxform.optimize(lambda x: x * 2.0)
    f(jnp.ones(3))
    with cost.planning_for("gpu"):
        assert cost.machine() is cost.GPU
        f(jnp.ones(3))
    assert cost.machine() is cost.machine(jax.default_backend()) and f.cache_size() == 2
    with pytest.raises(ValueError, match="planning_for\\('gpuu'\\)"):
        with cost.planning_for("gpuu"):
            pass


GRAD = Use((("grad", None),))    # the gradient of every float input (explain's default is a jit trace's: forward)


def test_gpu_auto_memory_costs_no_time(model_only):
    """dynamax's Kalman filter (tests/passes/test_fusion_real.py): remat of its 2 KiB of residuals ran the
    gradient 1.85x slower on an H200 (0.54x plain); "auto" does not pay time for memory, "min" does."""
    from passes.test_fusion_real import kalman_filter
    loss, args = kalman_filter()
    for backend, memory, verdict in (("gpu", "auto", "rejected"), ("cpu", "auto", "kept"), ("gpu", "min", "kept")):
        with cost.planning_for(backend):
            d = {x.split("(")[0]: x for x in jaxform.explain(loss, *args, memory=False, loop_memory=memory,
                                                             for_use=GRAD).decisions}
        assert verdict in d["remat_loops"], (backend, memory, d["remat_loops"])


def test_a_long_straight_line_program_is_not_compiled_to_check_cleanups():
    """Nothing to plan (no loop, no budget): a straight-line program that only inline/CSE/DCE would change is
    kept as traced (inlined) without compiling it in every view: benchmarks/overhead.py's 11k-equation program
    took minutes to plan under jit (the final guard compiled its forward and three gradients, twice) where
    jax.jit compiles it in 5 s; now 1.10x jax.jit's compile. A short one is still checked."""
    def program(x, y):
        for i in range(250):                     # ~10 equations per step: past GUARD_MAX_EQNS
            x = jnp.tanh(x * y + 0.1 * i) * jax.nn.sigmoid(x) - x / (1.0 + x * x)
        return x.sum()
    x, y = jnp.ones((8, 16)), jnp.full((8, 16), 0.5)
    o = jaxform.optimize(program)
    np.testing.assert_allclose(jax.jit(o)(x, y), jax.jit(program)(x, y), rtol=1e-6)
    p = o.plan()
    assert p.budget.compiles == 0, str(p.budget)
    assert any("not compiled to check them" in d.why for d in p.decisions), [str(d) for d in p.decisions]
    assert np.allclose(jax.grad(o)(x, y), jax.grad(program)(x, y), rtol=1e-5)

    def short(x, y):
        return jnp.sum(jnp.tanh(x * y) * jnp.tanh(x * y))
    s = jaxform.optimize(short)
    jax.jit(s)(x, y)
    assert not any("not compiled to check them" in d.why for d in s.plan().decisions)


@cpu_only
def test_fission_kept_alone_is_judged_with_the_loop_memory_planning_to_come(monkeypatch):
    """`plan.reverse_gru` under jax.grad: fission alone is a tie (2.7 MiB, 1.01x measured), and was kept; remat
    then reached 1.2 MiB where, without fission, it reaches 0.41 MiB at the same time (regret.py, memory regret
    2.92; issue 37: one memory win is never undone by another pass). Judged with remat to come, it is refused:
    the gradient is the least of the two pipelines'. (Times from the model, its slack widened to make fission
    alone the tie it measured: deterministic.)"""
    monkeypatch.setenv("JAXFORM_MEASURE", "memory")
    monkeypatch.setattr(planner, "TIME_SLACK", 0.10)
    fn, args = PROGRAMS["reverse_gru"]
    wrt = (0, 1)
    planned = jaxform.optimize(fn)
    g = jax.grad(planned, argnums=wrt)
    got = temp(g, args)
    without = temp(jax.grad(jaxform.optimize(fn, passes=[p for p in P.DEFAULT if p != "fission"], memory="auto",
                                             plan=False), argnums=wrt), args)
    assert got <= 1.01 * without, (got, without, [str(d) for d in planned.decisions()])
    refused = [d for d in planned.decisions() if d.pass_name.startswith("fission")]
    assert refused and not any(d.kept for d in refused) and "loop memory planning" in refused[-1].why
    for a, b in zip(g(*args), jax.grad(fn, argnums=wrt)(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
