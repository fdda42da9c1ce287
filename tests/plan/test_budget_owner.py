"""Issue 38: one owner of a byte budget on a program with loops. remat_loops gives the loops schedules and
XLA measures the gradient (tightening them until it fits); remat_program then checkpoints segments around and
across the loops for what is left; an unmet budget is said once, naming the gradient the user asked for."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax

V, D, H, B, T = 256, 32, 64, 8, 48


def lstm_lm(p, tokens):
    """A one-layer LSTM language model (embedding, scan over time, projection, softmax cross-entropy),
    after init2winit's LSTM LM (google/init2winit, init2winit/model_lib/lstm_lm.py)."""
    x = p["emb"][tokens[:, :-1]]

    def cell(carry, xt):
        h, c = carry
        i, f, g, o = jnp.split(xt @ p["wx"] + h @ p["wh"], 4, -1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    _, hs = lax.scan(cell, (jnp.zeros((B, H)), jnp.zeros((B, H))), jnp.swapaxes(x, 0, 1))
    lp = jax.nn.log_softmax(jnp.swapaxes(hs, 0, 1) @ p["out"])
    return -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], -1))


def _params():
    k = jax.random.split(jax.random.PRNGKey(0), 5)
    p = {"emb": jax.random.normal(k[0], (V, D)) * 0.1, "wx": jax.random.normal(k[1], (D, 4 * H)) * 0.1,
         "wh": jax.random.normal(k[2], (H, 4 * H)) * 0.1, "out": jax.random.normal(k[3], (H, V)) * 0.1}
    return p, jax.random.randint(k[4], (B, T + 1), 0, V)


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def _close(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("frac", [0.5, 0.25])
def test_lstm_lm_budget_met_in_grad_of_optimize(frac):
    """The loops' schedules were the model's alone: at 50% the LSTM LM's gradient measured 63% of plain
    (9.4 of 15 MiB, no warning at 25%: a budget twice as tight fitted). Now XLA measures and the schedules
    tighten until the budget is met."""
    p, tokens = _params()
    plain = temp(jax.grad(lstm_lm), p, tokens)
    budget = int(plain * frac)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        g = jax.grad(jaxform.optimize(lstm_lm, memory=budget))
        got = temp(g, p, tokens)
    assert got <= budget or any("cannot fit" in str(w.message) for w in said), (got, budget)
    assert got <= budget, (got, budget, plain)
    _close(jax.jit(g)(p, tokens), jax.grad(lstm_lm)(p, tokens))


@pytest.mark.slow
def test_gradient_first_order_names_the_better_one():
    """`optimize(jax.grad(f), memory=...)`: the loops' residuals are values already; the warning says to put
    the budget before differentiation (the order that meets it), once."""
    p, tokens = _params()
    plain = temp(jax.grad(lstm_lm), p, tokens)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = jaxform.optimize(jax.grad(lstm_lm), memory=int(plain * 0.5))
        _close(o(p, tokens), jax.grad(lstm_lm)(p, tokens))
    msgs = [str(w.message) for w in said if "cannot fit" in str(w.message)]
    assert len(msgs) == 1 and "jax.grad(optimize(f, memory=...))" in msgs[0], msgs
    assert temp(o, p, tokens) <= plain


def rnn_then_mlp(w, ws, xs):
    """A scan whose outputs feed a deep MLP: the loops' schedules cannot touch the MLP's activations."""
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h
    _, hs = lax.scan(cell, jnp.zeros((32, 64)), xs)
    z = hs.reshape(-1, 64)
    for k in range(ws.shape[0]):
        z = jnp.tanh(z @ ws[k])
    return jnp.mean(z ** 2)


@pytest.mark.slow
def test_segments_around_loops_take_what_the_loops_leave():
    r = np.random.default_rng(0)
    args = (jnp.asarray(r.standard_normal((64, 64)) * 0.1, jnp.float32),
            jnp.asarray(r.standard_normal((8, 64, 64)) * 0.1, jnp.float32),
            jnp.asarray(r.standard_normal((64, 32, 64)), jnp.float32))
    plain = temp(jax.grad(rnn_then_mlp, (0, 1)), *args)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = jaxform.optimize(rnn_then_mlp, memory=int(plain * 0.5))
        g = jax.grad(o, (0, 1))
        got = temp(g, *args)
    _close(jax.jit(g)(*args), jax.grad(rnn_then_mlp, (0, 1))(*args))
    assert got <= plain                                     # never bigger, on any JAX
    msgs = [str(w.message) for w in said if "cannot fit" in str(w.message)]
    assert len(msgs) <= 1, msgs                             # said once, not per proposal the planner judged
    assert got <= plain * 0.5 or msgs, (got, plain)         # met, or said
    if msgs:
        assert "the gradient jax.grad takes here (w.r.t. the arguments" in msgs[0], msgs[0]   # the gradient the user asked for
    if _jax.JAX_VERSION >= (0, 12):   # XLA:CPU before 0.12 frees nothing by recomputation (docs/remat.md)
        names = [n.name for n, _ in jaxform.trace(o, *args).walk()]
        assert sum(n in ("checkpoint", "remat2") for n in names) >= 2, names   # segments across the scan
        assert got <= plain * 0.65, (got, plain)            # 0.59 measured (loops alone: 0.80)


def _mlp(params, x):
    """A 4-layer GELU MLP's loss (benchmarks/memory_budget.py's (a), smaller)."""
    h = x
    for W, b in params:
        h = jax.nn.gelu(h @ W + b)
        h = h + 0.1 * jnp.tanh(h)
    return jnp.mean(h ** 2)


@pytest.mark.parametrize("memory", [0.5, 0.25, "min"])
def test_budget_never_bigger_than_plain_in_either_order(memory):
    """Issue 38: the budget path never yields a gradient bigger than plain's, in either order, on any JAX (on
    0.10.2 XLA:CPU frees nothing by recomputation: the budget is unmet there and said, never exceeded). The
    planner's final guard covers the straight-line program too: whatever the other passes did (CSE), the
    result is measured against jax.jit's."""
    r = np.random.RandomState(0)
    params = [(jnp.asarray(r.randn(128, 128) * 0.1, np.float32), jnp.zeros(128, np.float32)) for _ in range(4)]
    x = jnp.asarray(r.randn(64, 128), np.float32)
    plain = temp(jax.grad(_mlp), params, x)
    budget = memory if isinstance(memory, str) else int(plain * memory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        after = jax.grad(jaxform.optimize(_mlp, memory=budget))
        first = jaxform.optimize(jax.grad(_mlp), memory=budget)
        assert temp(after, params, x) <= plain
        assert temp(first, params, x) <= plain
        _close(jax.jit(after)(params, x), jax.grad(_mlp)(params, x))
        _close(first(params, x), jax.grad(_mlp)(params, x))


def test_min_on_a_gradient_program_with_loops_says_it_cannot():
    """`optimize(jax.grad(f), memory="min")` with a scan: its loops' residuals are values already, so "min"
    changes nothing there; it says so and names the order that can (it used to stay at 100%, silently)."""
    p, tokens = _params()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = jaxform.optimize(jax.grad(lstm_lm), memory="min")
        _close(o(p, tokens), jax.grad(lstm_lm)(p, tokens))
    msgs = [str(w.message) for w in said if "under memory='min'" in str(w.message)]
    assert len(msgs) == 1 and "jax.grad(optimize(f, memory=...))" in msgs[0], [str(w.message) for w in said]


@pytest.mark.slow
@pytest.mark.parametrize("frac", [0.25, "min"])
def test_value_first_order_names_the_other_where_it_reaches_less(frac):
    """`jax.grad(optimize(loss, memory=...))` that falls short names `optimize(jax.grad(loss), ...)` where that
    order, measured, reaches 10% less (benchmarks/memory_budget.py's transformer LM at 25% on JAX 0.12: 23.00
    MiB this way, 18.07 MiB the other), and does not name it where it does not."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2] / "benchmarks"))
    from memory_budget import lm_setup
    params, tokens, losses = lm_setup()
    loss = losses["plain"]
    plain = temp(jax.value_and_grad(loss), params, tokens)
    budget = "min" if frac == "min" else int(plain * frac)
    a, b, said = _both_orders(jax.value_and_grad, loss, budget, params, tokens)
    named = _named_other(said)
    short = budget == "min" or a > budget
    if short and b <= 0.9 * a * 0.98:            # (grad's program vs value_and_grad's: a 2% margin)
        assert named, (a, b, said)
    if b >= a:
        assert not named, (a, b, said)


def _named_other(said: list) -> bool:
    return any("The other order" in m for m in said)


def _both_orders(diff, loss, budget, *args) -> tuple[int, int, list]:
    """XLA temp of order A, `diff(optimize(loss, memory=budget))`, and of order B, `optimize(diff(loss), ...)`,
    and A's warnings."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        a = temp(diff(jaxform.optimize(loss, memory=budget)), *args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        b = temp(jaxform.optimize(diff(loss), memory=budget), *args)
    return a, b, [str(w.message) for w in said]


def _normed_stack(p, x):
    """Six residual layers with a layer norm each: a ResNet-like loss (two tests below)."""
    for w in p:
        h = x @ w
        mu = h.mean(-1, keepdims=True)
        x = jnp.tanh((h - mu) * lax.rsqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5)) + x
    return jnp.mean(x ** 2)


def test_value_first_order_names_the_other_under_grad():
    """The rule of the slow test above, on a program small enough for the fast tier, under `jax.grad`, where
    `budget_is_own` says no: `_other_order` asks of the gradient program the other order runs as it is
    (`recompute_choice(own=True)`). From 815f0e5 to session 20 it asked with this trace's use and measured
    nothing: the LM at 25% on JAX 0.12, 23.00 MiB this way and 18.07 the other, was warned without naming it
    (memory_budget.py --orders). And it compares what this order runs: left as it is (a saving under 25%), that
    is plain's, not the least candidate's (JAX 0.10.2: 1586176 B this way, 1325056 B the other, unnamed)."""
    k = jax.random.split(jax.random.PRNGKey(0), 7)
    p = [jax.random.normal(kk, (64, 64)) * 0.1 for kk in k[:6]]
    x = jax.random.normal(k[6], (256, 64))
    budget = int(temp(jax.grad(_normed_stack), p, x) * 0.25)
    a, b, said = _both_orders(jax.grad, _normed_stack, budget, p, x)
    assert a > budget and (b <= 0.9 * a or b >= a), (a, b, budget)     # (the premise: one rule applies)
    assert _named_other(said) == (b <= 0.9 * a), (a, b, said)


_VG_SCRIPT = """
import sys, warnings, jax, jaxform
sys.path.insert(0, sys.argv[1])
from memory_budget import mlp_setup, temp
params, batch, losses = mlp_setup()
loss = losses["plain"]
plain = temp(jax.jit(jax.value_and_grad(loss)), params, batch)
for frac in (0.5, 0.25):
    budget = int(plain * frac)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        o = jaxform.optimize(loss, memory=budget)
        vg = temp(jax.jit(jax.value_and_grad(o)), params, batch)
        g = temp(jax.jit(jax.grad(o)), params, batch)
    print(frac, budget, vg, g, sum("cannot fit" in str(w.message) for w in said))
"""


@pytest.mark.parametrize("flag", [False, True])
def test_budget_met_by_value_and_grad_or_said(flag):
    """Issue 38: a byte budget is met by `jax.value_and_grad` (a train step's) as well as `jax.grad`, or the call
    says so. benchmarks/memory_budget.py's MLP at 50% on JAX 0.10.2 with the memory scheduler on: jax.grad's
    program fit at 3.00 MiB while XLA scheduled value_and_grad's at 3.50, silently. Run in a fresh process:
    XLA_FLAGS is read once, at start."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).parents[2]
    env = dict(os.environ)
    if flag:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    r = subprocess.run([sys.executable, "-c", _VG_SCRIPT, str(root / "benchmarks")], capture_output=True, text=True,
                       env=env, cwd=root, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    for line in r.stdout.split("\n"):
        if line.strip():
            frac, budget, vg, g, said = line.split()
            assert (int(vg) <= int(budget) and int(g) <= int(budget)) or int(said) > 0, line


def _chain_mlp(ws, x):
    h = x
    for w in ws:
        h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)


def _chain_args():
    r = np.random.default_rng(0)
    return ([jnp.asarray(r.standard_normal((128, 128)) * 0.1, jnp.float32) for _ in range(6)],
            jnp.asarray(r.standard_normal((256, 128)), jnp.float32))


def test_a_gradient_without_add_any_is_taken_for_one():
    """`optimize(jax.value_and_grad(f))` of a chain (each value read once: no `add_any` on JAX 0.12) is a
    gradient program: its budget is for the program itself, never for its own second-order gradient, which
    `memory_budget.py --orders` found quoted ("cannot fit the gradient of its first argument ... 4.00 MiB" of an
    MLP that met its 3.00 MiB budget at 2.50 MiB). JAX's name stack says which equations it transposed."""
    from jaxform.passes.recompute import is_gradient
    ws, x = _chain_args()
    assert is_gradient(jax.make_jaxpr(jax.value_and_grad(_chain_mlp))(ws, x))
    assert not is_gradient(jax.make_jaxpr(_chain_mlp)(ws, x))
    temp = lambda f: jax.jit(f).lower(ws, x).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    plain = temp(jax.value_and_grad(_chain_mlp))
    for frac in (0.5, 0.75):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = temp(jaxform.optimize(jax.value_and_grad(_chain_mlp), memory=int(frac * plain)))
        said = [str(m.message) for m in w if "jaxform" in str(m.message)]
        assert got <= plain
        assert not any("gradient of its first argument" in m for m in said), said
        assert got > int(frac * plain) or not said, (got, said)        # met: nothing to say


def test_a_met_budget_on_a_gradient_with_a_scalar_value_is_not_warned():
    """The value of `jax.value_and_grad` is a scalar float among outputs, but no has_aux loss: a program taken
    for a gradient runs as it is (the LM at 50% in order B met 38.39 MiB at 32.68 and was warned "cannot fit ...
    79.62 MiB", its second-order has_aux gradient)."""
    p, tokens = _params()
    loss = lambda p, t: lstm_lm(p, t) + 0.0 * jnp.sum(p["out"] * p["out"])  # noqa: E731
    temp = lambda f: jax.jit(f).lower(p, tokens).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    plain = temp(jax.value_and_grad(loss))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = temp(jaxform.optimize(jax.value_and_grad(loss), memory=int(1.5 * plain)))
    assert got <= plain and not [str(m.message) for m in w if "jaxform" in str(m.message)]


def test_the_other_orders_estimate_budgets_a_cleaned_gradient(monkeypatch):
    """`jax.grad(optimize(f, memory=B))` falling short quotes what `optimize(jax.grad(f), memory=B)` reaches
    (`plan.memory._other_order`). That order budgets the gradient after its cleanups (inline, CSE, DCE),
    so the estimate must too: CSE merges what JAX's JVP and transpose compute twice, and moves where the
    forward ends. Uncleaned, a ResNet's estimate cut a 1063-equation gradient whose forward ends at 556
    where that order cut 996 and 443, reached 72.4 MiB where it reached 56.4 (JAX 0.12), and the warning
    did not name it (benchmarks/memory_budget.py --orders)."""
    from jaxform.plan import memory as pm
    from jaxform.passes.pipeline import run_passes
    from jaxform.passes.recompute import is_gradient

    loss = _normed_stack
    k = jax.random.split(jax.random.PRNGKey(0), 7)
    p = [jax.random.normal(kk, (64, 64)) * 0.1 for kk in k[:6]]
    x = jax.random.normal(k[6], (32, 64))
    seen = []
    real = pm.recompute_choice
    monkeypatch.setattr(pm, "recompute_choice",
                        lambda closed, *a, **kw: (seen.append(closed) if is_gradient(closed) else None,
                                                  real(closed, *a, **kw))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        jax.jit(jax.grad(jaxform.optimize(loss, memory=1))).lower(p, x)     # (1 byte: unmet, the other order asked)
    # (jax.grad's program, then jax.value_and_grad's where this order's takes more: round 21's G, session 22)
    assert 1 <= len(seen) <= 2
    assert all(len(run_passes(s, ["cse", "dce"]).jaxpr.eqns) == len(s.jaxpr.eqns) for s in seen)
