"""Issue 38, memory budgets you can trust: regressions for what a budget promised and did not keep."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform.passes.remat_loops import plan


def _scalar_rnn(w, s):
    def body(h, x):
        return jnp.tanh(h * s + x @ w), None
    h, _ = lax.scan(body, jnp.zeros((16, 64)), jnp.linspace(0.0, 1.0, 200 * 16 * 64).reshape(200, 16, 64))
    return jnp.sum(h ** 2)


def test_hessian_wrt_scalar_through_revolve():
    """jax.hessian(optimize(f, memory=30000), argnums=1) w.r.t. a scalar raised a bare AssertionError: jacfwd
    vmaps the transposed schedule's linear map, and JAX's linear_call jvp rule (which asserts residuals have no
    tangent) ran instead of ours. The map is now jaxform's own primitive, `_jax.linear_map`."""
    w, s = jnp.eye(64, dtype=jnp.float32) * 0.5, jnp.float32(0.7)
    opt = jaxform.optimize(_scalar_rnn, memory=30000)
    from jaxform.plan.memory import loop_schedules
    plans = plan(jaxform.trace(jaxform.optimize(_scalar_rnn, memory=None), w, s))
    loop_schedules(plans, 30000)
    assert plans[0][2].schedule == "revolve"          # the schedule this test is about
    want = jax.hessian(_scalar_rnn, argnums=1)(w, s)
    np.testing.assert_allclose(jax.hessian(opt, argnums=1)(w, s), want, rtol=1e-4)
    np.testing.assert_allclose(jax.jit(jax.hessian(opt, argnums=1))(w, s), want, rtol=1e-4)


def test_callbacks_in_custom_rules_run_as_often_as_in_plain_jax():
    """A jax.debug.callback inside a custom_jvp rule or a custom_vjp fwd ran 11 times per jax.grad under
    memory="min" where plain JAX runs it 6 times: remat recomputed the step holding it (the effect sits in the
    rule, which the purity check did not see)."""
    calls = []

    @jax.custom_jvp
    def f(x):
        return jnp.sin(x)

    @f.defjvp
    def f_jvp(p, t):
        jax.debug.callback(lambda v: calls.append("jvp"), p[0])
        return jnp.sin(p[0]), jnp.cos(p[0]) * t[0]

    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    def g_fwd(x):
        jax.debug.callback(lambda v: calls.append("fwd"), x)
        return jnp.sin(x), x
    g.defvjp(g_fwd, lambda x, ct: (jnp.cos(x) * ct,))

    def loss(w, xs):
        return lax.scan(lambda c, x: (g(f(c * w + x)),) * 2, jnp.zeros(3), xs)[1].sum()
    w, xs = jnp.full(3, 0.5), jnp.linspace(0.0, 1.0, 60).reshape(20, 3)

    def counts(fn):
        calls.clear()
        out = jax.grad(fn)(w, xs)
        jax.effects_barrier()
        return out, (calls.count("jvp"), calls.count("fwd"))
    want, plain = counts(loss)
    assert plain[0] > 0 and plain[1] > 0
    for memory in ("min", "auto", 64):
        got, n = counts(jaxform.optimize(loss, memory=memory))
        assert n == plain, memory
        np.testing.assert_allclose(got, want, rtol=1e-5)


def _mlp(params, x):
    for W in params:
        x = jax.nn.gelu(x @ W) + x
    return jnp.mean(x ** 2)


def _mlp_args(layers=4, d=256, b=128):
    r = np.random.RandomState(0)
    return [jnp.asarray(r.randn(d, d).astype(np.float32) / np.sqrt(d)) for _ in range(layers)], \
        jnp.asarray(r.randn(b, d).astype(np.float32))


def _grad_temp(f, *args):
    return jax.jit(jax.grad(f)).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_budget_path_is_never_bigger_than_plain_and_says_when_it_cannot_help():
    """jax.grad(optimize(f, memory=budget)) never takes more XLA temp than jax.grad(f) (a GPT step went 141.55 ->
    150.19 MiB on JAX 0.10.2 while the warning said 'left as it is'); a budget it does not meet is said, with the
    user's gradient's number (jax.grad's default: the first argument) and the segment count in words."""
    import re
    import warnings
    params, x = _mlp_args()
    plain = _grad_temp(_mlp, params, x)
    for frac in (0.5, 0.01):
        budget = int(plain * frac)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = _grad_temp(jaxform.optimize(_mlp, memory=budget), params, x)
        assert got <= plain, (frac, got, plain)
        assert got < plain     # (this program does shrink: the test can see a bad pick)
        said = [str(m.message) for m in w if "cannot fit" in str(m.message)]
        assert got <= budget or said, (frac, got, budget)
        for m in said:
            assert "first argument" in m and "plain" not in m
            quoted = float(re.search(r"it takes ([0-9.]+) MiB", m).group(1))
            assert abs(quoted - plain / 2 ** 20) <= 0.01, (quoted, plain / 2 ** 20)   # the number the user measures
            assert "segments" not in m or "the program cut into" in m or "left as it is" in m
            if "using that" in m:                                                      # what it reached is what XLA gives
                reached = float(re.search(r"reaches is ([0-9.]+) MiB", m).group(1))
                assert abs(reached - got / 2 ** 20) <= 0.01, (reached, got / 2 ** 20)


def _rnn_lm(params, xs):
    W, U, V = params
    _, hs = lax.scan(lambda h, x: (jnp.tanh(h @ W + x @ U),) * 2, jnp.zeros((8, 32)), xs)
    return -jnp.mean(jax.nn.log_softmax(hs @ V)[..., 0])


@pytest.mark.parametrize("order", ["grad_of_optimize", "optimize_of_value_and_grad"])
def test_a_budget_on_a_program_with_loops_is_never_silently_unmet(order):
    """Issue 38 item 1: jax.grad(optimize(loss, memory=25%)) of an LSTM LM gave 62.8 MiB against a 31.3 MiB
    budget with no warning, and optimize(jax.value_and_grad(loss), memory=50%) stayed at plain silently. A byte
    budget on a program with loops now has XLA measure the gradient the user runs; over budget, it says so,
    quoting the number XLA gives the user."""
    import re
    import warnings
    r = np.random.RandomState(0)
    params = tuple(jnp.asarray(r.randn(*s).astype(np.float32) * 0.1) for s in [(32, 32), (16, 32), (32, 128)])
    xs = jnp.asarray(r.randn(40, 8, 16).astype(np.float32))
    temp = lambda f: jax.jit(f).lower(params, xs).compile().memory_analysis().temp_size_in_bytes   # noqa: E731
    cases = {"grad_of_optimize": (lambda: jax.grad(jaxform.optimize(_rnn_lm, memory=4096)), "first argument"),
             "optimize_of_value_and_grad": (lambda: jaxform.optimize(jax.value_and_grad(_rnn_lm), memory=4096),
                                            "already differentiated")}
    for make, subject in (cases[order],):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = temp(make())
        assert got > 4096
        said = [str(m.message) for m in w if "remat_loops cannot fit" in str(m.message)]
        assert said and all(subject in m for m in said), [str(m.message) for m in w]
        num, unit = re.search(r"XLA measures ([0-9.]+) (MiB|KiB|B)\b", said[-1]).groups()
        measured = float(num) * {"MiB": 1, "KiB": 2 ** -10, "B": 2 ** -20}[unit]
        # (measured on the pass's program; the planner may then pick another proposal: within 10%, not exact)
        assert abs(measured - got / 2 ** 20) <= 0.1 * got / 2 ** 20 + 0.01, (measured, got / 2 ** 20)
