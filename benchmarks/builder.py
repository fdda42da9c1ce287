"""Building graphs directly vs tracing jax.numpy code (seed 004), in one run.

(a) a 10k-op elementwise/matmul chain: jaxform.Builder vs jax.make_jaxpr of the
    same program written with jax.numpy (both end in a ClosedJaxpr).
(b) PyTensor models -> jitted JAX callable: jaxform.frontends.pytensor.function
    vs pytensor.function(mode="JAX"): conversion time (graph -> callable, incl.
    PyTensor's rewrites, excl. XLA compile), first-call (compile) time, and
    steady-state runtime (min of N calls after warmup, block_until_ready).

    .venv/bin/python benchmarks/builder.py
"""
from __future__ import annotations

import time

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from jaxform import Builder


def best(fn, n=5):
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


# ---- (a) 10k-op graph ---------------------------------------------------------------

N_OPS, SHAPE = 10_000, (16, 16)


def build_with_builder():
    b = Builder()
    x, w = b.arg(SHAPE), b.arg(SHAPE)
    y = x
    for i in range(N_OPS // 4):  # 4 primitives per step: dot_general, tanh, mul, add
        y = b.tanh(y @ w) * 0.5 + x
    return b.build(y).to_jaxpr()


def trace_jnp():
    def f(x, w):
        y = x
        for i in range(N_OPS // 4):
            y = jnp.tanh(y @ w) * 0.5 + x
        return y
    s = jax.ShapeDtypeStruct(SHAPE, jnp.float32)
    return jax.make_jaxpr(f)(s, s)


def bench_a():
    a, t = build_with_builder(), trace_jnp()
    assert len(a.eqns) == len(t.eqns) == N_OPS, (len(a.eqns), len(t.eqns))
    x = jnp.asarray(np.random.default_rng(0).normal(size=SHAPE) * 0.1, jnp.float32)
    ea, et = jax.extend.core.jaxpr_as_fun(a)(x, x)[0], jax.extend.core.jaxpr_as_fun(t)(x, x)[0]
    np.testing.assert_allclose(ea, et, rtol=1e-5, atol=1e-6)
    tb, tt = best(build_with_builder, 3), best(trace_jnp, 3)
    print(f"(a) {N_OPS} ops -> ClosedJaxpr: Builder {tb * 1e3:8.1f} ms | trace jnp {tt * 1e3:8.1f} ms | "
          f"Builder/trace = {tb / tt:.2f}x")


# ---- (b) PyTensor models ------------------------------------------------------------------

def models():
    import pytensor
    import pytensor.tensor as pt

    def hier():
        J = 200
        mu, log_tau, theta_t = pt.tensor("mu", shape=()), pt.tensor("log_tau", shape=()), pt.tensor("t", shape=(J,))
        y = pt.as_tensor_variable(np.random.default_rng(1).normal(size=J) * 10)
        s = pt.as_tensor_variable(np.full(J, 12.0))
        tau = pt.exp(log_tau)
        theta = mu + tau * theta_t
        lp = -0.5 * (mu / 5) ** 2 - pt.log1p((tau / 5) ** 2) + log_tau - 0.5 * (theta_t ** 2).sum() \
            - 0.5 * (((y - theta) / s) ** 2).sum()
        return "hierarchical logp (J=200)", [mu, log_tau, theta_t], lp

    def mlp():
        x = pt.tensor("x", shape=(256, 64))
        ws = [pt.tensor(f"w{i}", shape=(64, 64)) for i in range(6)]
        h = x
        for w in ws:
            h = pt.tanh(h @ w) + h
        return "6-layer MLP + log_softmax (256x64)", [x, *ws], pt.special.log_softmax(h, axis=-1).sum()

    def scan_rnn():
        xs, h0, w = pt.tensor("xs", shape=(100, 32)), pt.tensor("h0", shape=(32,)), pt.tensor("w", shape=(32, 32))
        hs, _ = pytensor.scan(lambda x, h: pt.tanh(pt.dot(w, h) + x), sequences=[xs], outputs_info=[h0])
        return "scan RNN (100 steps, fallback op)", [xs, h0, w], hs.sum()

    return [hier(), mlp(), scan_rnn()]


def bench_b():
    import pytensor
    from jaxform.frontends import pytensor as jpt
    from pytensor.link.jax.dispatch import jax_funcify  # noqa: F401  (import cost outside the timings)

    rng = np.random.default_rng(0)
    print("(b) PyTensor graph -> jitted callable      convert ms (jaxform | PT JAX)   first call ms        "
          "run us (jaxform | PT JAX)  ratio")
    for name, inputs, out in models():
        args = [rng.normal(size=v.type.shape) * 0.1 for v in inputs]

        def ours():
            return jpt.function(inputs, out)

        def theirs():
            return pytensor.function(inputs, out, mode="JAX")

        tc_o, tc_t = best(ours, 3), best(theirs, 3)
        fo, ft = ours(), theirs()
        t = time.perf_counter(); jax.block_until_ready(fo(*args)); t1_o = time.perf_counter() - t
        t = time.perf_counter(); ft(*args); t1_t = time.perf_counter() - t
        np.testing.assert_allclose(np.asarray(fo(*args)), ft(*args), rtol=1e-8)
        jargs = [jnp.asarray(a) for a in args]
        # PyTensor's Function call converts inputs/outputs; time its jitted JAX function too for a fair runtime
        jit_t = ft.vm.jit_fn if hasattr(ft.vm, "jit_fn") else None
        r_o = best(lambda: jax.block_until_ready(fo(*jargs)), 50)
        r_t = best(lambda: jax.block_until_ready(ft(*args)), 50)  # PT's Function call (numpy in/out)
        extra = ""
        if jit_t is not None:
            r_tj = best(lambda: jax.block_until_ready(jit_t(*jargs)), 50)
            extra = f" (PT jitted fn alone {r_tj * 1e6:.0f} us, ours/that {r_o / r_tj:.2f}x)"
        print(f"    {name:36s} {tc_o * 1e3:7.1f} | {tc_t * 1e3:7.1f} = {tc_o / tc_t:4.2f}x   "
              f"{t1_o * 1e3:7.1f} | {t1_t * 1e3:7.1f}   {r_o * 1e6:8.0f} | {r_t * 1e6:8.0f} = {r_o / r_t:4.2f}x{extra}")


if __name__ == "__main__":
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}")
    bench_a()
    jax.config.update("jax_enable_x64", True)  # PyTensor's floatX is float64
    bench_b()
