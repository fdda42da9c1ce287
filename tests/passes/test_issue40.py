"""Issue 40 ("Trust, round 4"): regression tests, run on every JAX version the project supports."""
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform


def _grow(x):
    """y <- 0.5 sin y + 1.3 y + 0.1 while y < 2: the trip count depends on x (lane by lane under vmap)."""
    def body(c):
        i, y = c
        return i + 1, jnp.sin(y) * 0.5 + y * 1.3 + 0.1
    return lax.while_loop(lambda c: c[1] < 2.0, body, (0, x))[1]


def _trips(x) -> int:
    y, n = float(x), 0
    while y < 2.0:
        y, n = float(np.sin(np.float32(y)) * 0.5 + y * 1.3 + 0.1), n + 1
    return n


def _scan_grad(x):
    """The gradient of the same loop unrolled as a scan of this lane's actual trip count."""
    n = _trips(x)
    return jax.grad(lambda v: lax.scan(lambda y, _: (jnp.sin(y) * 0.5 + y * 1.3 + 0.1, None), v, None,
                                       length=n)[0])(x)


XS = jnp.array([0.5, 1.2, 1.9, 0.1, 2.5], jnp.float32)   # trip counts 3, 1, 1, 4, 0


@pytest.mark.parametrize("memory", ["min", "auto"])
def test_grad_of_vmap_equals_per_lane_scan(memory):
    """Finding 1: grad(vmap(...)) over per-lane trip counts once raised JAX's 'Transpose rule for stop_gradient
    not implemented' (JAX's cond batching put stop_gradient on the bounded form's tangents)."""
    assert len({_trips(x) for x in XS}) > 2
    opt = jaxform.optimize(_grow, max_steps=20, memory=memory)
    want = np.array([_scan_grad(x) for x in XS])
    outer = jax.grad(lambda x: jnp.sum(jax.vmap(opt)(x)))(XS)
    inner = jax.vmap(jax.grad(opt))(XS)
    np.testing.assert_allclose(outer, want, rtol=1e-5)
    np.testing.assert_allclose(inner, want, rtol=1e-5)
    np.testing.assert_allclose(jax.vmap(opt)(XS), jax.vmap(_grow)(XS))


def _fixed(x):
    def body(c):
        i, y = c
        return i + 1, jnp.sin(y) * 0.5 + y * 1.1
    return lax.while_loop(lambda c: c[0] < 5, body, (0, x))[1]   # 5 trips


@pytest.mark.parametrize("max_steps", [3, 5, 8])   # past, at and under the bound
def test_forward_mode_equals_plain_at_any_trip_count(max_steps):
    """Finding 2: jax.jvp through a 5-trip loop with max_steps=3 gave a NaN tangent. Forward mode needs no bound:
    it now equals plain JAX past the bound too; reverse mode past the bound stays NaN (never wrong)."""
    opt = jaxform.optimize(_fixed, max_steps=max_steps, memory="min")
    x = jnp.float32(0.3)
    got, want = jax.jvp(opt, (x,), (jnp.float32(1.0),)), jax.jvp(_fixed, (x,), (jnp.float32(1.0),))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(jax.jacfwd(opt)(x), jax.jacfwd(_fixed)(x), rtol=1e-6)
    xs = jnp.array([0.3, 0.7, -0.2], jnp.float32)
    np.testing.assert_allclose(jax.vmap(lambda v: jax.jvp(opt, (v,), (1.0,))[1])(xs),
                               jax.vmap(lambda v: jax.jvp(_fixed, (v,), (1.0,))[1])(xs), rtol=1e-6)
    g = jax.grad(opt)(x)
    if max_steps < 5:
        assert np.isnan(g)
    else:
        np.testing.assert_allclose(g, jax.jvp(_fixed, (x,), (jnp.float32(1.0),))[1], rtol=1e-6)


def test_forward_mode_of_per_lane_loop_past_bound():
    """Forward mode under vmap with lanes under, at and past a bound of 2: each lane as plain JAX."""
    opt = jaxform.optimize(_grow, max_steps=2, memory="min")
    got = jax.vmap(lambda v: jax.jvp(opt, (v,), (1.0,))[1])(XS)
    want = jax.vmap(lambda v: jax.jvp(_grow, (v,), (1.0,))[1])(XS)
    np.testing.assert_allclose(got, want, rtol=1e-6)


_USER_LINEAR_CALL = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax
    from jax.custom_derivatives import linear_call

    def user(r, x):
        return linear_call(lambda r, x: r * x, lambda r, ct: 3.0 * r * ct, r, x)
    r, x = jnp.array([1., 2., 3.]), jnp.array([[1., 2., 3.], [4., 5., 6.]])

    def outcome(f):
        try:
            return ["ok", np.asarray(f()).tolist()]
        except Exception as e:   # noqa: BLE001
            return [type(e).__name__, str(e).splitlines()[0] if str(e) else ""]

    cases = {
        "vmap": lambda: jax.vmap(user, (None, 0))(r, x),
        "vmap_grad": lambda: jax.vmap(lambda rr: jax.grad(lambda v: jnp.sum(user(rr, v)))(r))(x),
        "jvp": lambda: jax.jvp(lambda v: user(r, v), (r,), (r,))[1],
        "jvp_res": lambda: jax.jvp(lambda a: user(a, r), (r,), (r,))[1],
        "grad": lambda: jax.grad(lambda v: jnp.sum(user(r, v)))(r),
    }
    before = {k: outcome(f) for k, f in cases.items()}
    if sys.argv[1] == "revolve":
        import jaxform
        from jaxform.passes import decisions    # revolve as the model schedules it, unmeasured (tests/conftest.py,
        decisions.install("fit_loops", lambda g, memory, schedule, warn=True: (schedule(g, memory), g)[1])  # revolve_as_scheduled)
        def rnn(w, xs):
            h, _ = lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), jnp.zeros(xs.shape[1:]), xs)
            return jnp.sum(h)
        w = np.eye(4, dtype=np.float32) * 0.5
        xs = np.linspace(-1, 1, 20 * 12, dtype=np.float32).reshape(20, 3, 4)
        opt = jaxform.optimize(rnn, passes=["hoist_loop_invariants", "dce"], memory=1, strict=True)
        jax.grad(opt)(w, xs)
        jax.vmap(jax.grad(opt), (None, 0))(w, np.stack([xs, xs]))
        assert "jaxform_linear_call" in str(jax.make_jaxpr(jax.grad(opt))(w, xs))   # a revolve really ran
    after = {k: outcome(f) for k, f in cases.items()}
    # and nothing of JAX's own was touched: the rule tables for its linear_call are as JAX made them
    from jax._src.custom_derivatives import linear_call_p
    from jax._src.interpreters import ad, batching
    tables = [getattr(batching, t, {}) for t in ("fancy_primitive_batchers", "primitive_batchers")]
    has_batcher = any(isinstance(t, dict) and linear_call_p in t for t in tables)
    after["rules"] = [has_batcher, ad.primitive_jvps[linear_call_p].__module__]
    print(json.dumps([before, after]))
""")


def test_user_linear_call_unchanged_by_revolve():
    """Finding 3: a user's linear_call under vmap / jvp / grad behaves after a revolve was traced exactly as it
    does before, and as in a process that never imported jaxform (vmap: JAX's own NotImplementedError)."""
    def run(mode):
        out = subprocess.run([sys.executable, "-c", _USER_LINEAR_CALL, mode], capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        import json
        return json.loads(out.stdout.strip().splitlines()[-1])
    before, after = run("revolve")
    plain_before, plain_after = run("plain")
    assert after.pop("rules") == plain_after.pop("rules") == [False, "jax._src.custom_derivatives"]
    assert before == after == plain_before == plain_after
    assert before["vmap"][0] == "NotImplementedError"      # plain JAX has no batching rule for linear_call
    np.testing.assert_allclose(before["grad"][1], [3., 6., 9.])


def test_finished_steps_do_not_poison_constants_gradient():
    """The bounded form runs the body on every step (a select): on a finished step sqrt(k - y) of a loop constant
    k is NaN; its gradient must not reach k's (the step sees the constants with a zero tangent there)."""
    def f(k, x):
        def body(c):
            i, y = c
            return i + 1, y + 0.1 * jnp.sqrt(k - y)
        return lax.while_loop(lambda c: c[1] < 1.0, body, (0, x))[1]
    k, x = jnp.float32(1.05), jnp.float32(0.5)
    n, y = 0, 0.5
    while y < 1.0:
        y, n = y + 0.1 * np.sqrt(1.05 - y), n + 1
    want = jax.grad(lambda k, x: lax.fori_loop(0, n, lambda i, y: y + 0.1 * jnp.sqrt(k - y), x), (0, 1))(k, x)
    got = jax.grad(jaxform.optimize(f, max_steps=30, memory="min"), (0, 1))(k, x)
    np.testing.assert_allclose(got, want, rtol=1e-5)
