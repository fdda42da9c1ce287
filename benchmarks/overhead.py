"""What does jaxform cost? A ~10k-equation program: trace, passes, compile, cached call.

Prints, from one run: jax.make_jaxpr time; jaxform's from_jaxpr + default
passes + to_jaxpr, with and without the final `check_jaxpr` verification;
XLA compile time; and the per-call cost of jax.jit(optimize(f)) vs
jax.jit(f) once both are cached.
Targets: jaxform's work <= 1x trace time and <= 10% of compile time.
"""
import os
import time

import jax
import jax.numpy as jnp

import jaxform
from jaxform.ir import Graph
from jaxform.optimize import run_passes
from jaxform.passes import default_pipeline


def program(x, y):
    for i in range(1100):  # ~10 equations per step
        x = jnp.tanh(x * y + 0.1 * i) * jax.nn.sigmoid(x) - x / (1.0 + x * x)
    return x.sum()


def best(f, n=5):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts)


def main():
    x, y = jnp.ones((8, 16)), jnp.full((8, 16), 0.5)
    # a fresh function object per trace: make_jaxpr caches per function
    t_trace = best(lambda: jax.make_jaxpr(lambda *a: program(*a))(x, y), 3)
    closed = jax.make_jaxpr(program)(x, y)
    t_round = best(lambda: Graph.from_jaxpr(closed).to_jaxpr(), 3)
    t_full = best(lambda: run_passes(closed, default_pipeline()), 3)
    os.environ["JAXFORM_CHECK"] = "0"
    t_fast = best(lambda: run_passes(closed, default_pipeline()), 3)
    del os.environ["JAXFORM_CHECK"]
    t0 = time.perf_counter(); jax.jit(program).lower(x, y).compile(); t_compile = time.perf_counter() - t0

    jf, jo = jax.jit(program), jax.jit(jaxform.optimize(program))
    jf(x, y).block_until_ready(); jo(x, y).block_until_ready()
    call = lambda g: best(lambda: [g(x, y).block_until_ready() for _ in range(50)], 5) / 50
    c_f, c_o = call(jf), call(jo)
    print(f"program: {len(closed.eqns)} equations; passes: {[p.pass_name for p in default_pipeline()]}")
    print(f"jax.make_jaxpr                    {t_trace * 1e3:8.1f} ms")
    print(f"from_jaxpr + to_jaxpr             {t_round * 1e3:8.1f} ms   {t_round / t_trace:5.2f}x trace")
    print(f"passes, verified by check_jaxpr   {t_full * 1e3:8.1f} ms   {t_full / t_trace:5.2f}x trace  "
          f"{100 * t_full / t_compile:5.1f}% of compile")
    print(f"passes, signature check only      {t_fast * 1e3:8.1f} ms   {t_fast / t_trace:5.2f}x trace  "
          f"{100 * t_fast / t_compile:5.1f}% of compile")
    print(f"XLA compile                       {t_compile * 1e3:8.1f} ms")
    print(f"cached call jit(f)                {c_f * 1e6:8.1f} us")
    print(f"cached call jit(optimize(f))      {c_o * 1e6:8.1f} us   {c_o / c_f:5.2f}x")


if __name__ == "__main__":
    main()
