"""Measure the planner's cost constants (`jaxform.plan.cost.Machine`) on this machine's default backend.

The planner predicts seconds from a handful of constants per backend. This script measures each
one with a microbenchmark built for it, prints measured beside the constant in use, and a
`Machine(...)` line to paste into `plan/cost.py`. Run it on a new backend before trusting the
planner's time predictions there (the GPU constants came from this script on an H200).

    .venv/bin/python benchmarks/calibrate.py [--reps N]
"""
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxform.inspect.program import min_time
from jaxform.plan.cost import machine

REPS = int(sys.argv[sys.argv.index("--reps") + 1]) if "--reps" in sys.argv else 7
GPU = jax.default_backend() != "cpu"
L = 20_000                                  # loop steps: per-step costs are a difference of two loops


def timed(f, *args) -> float:
    return min_time([jax.jit(f)], args, REPS)[0]


def loop(body, init, length=L):
    return lambda c: lax.scan(lambda c, _: (body(c), None), c, None, length=length)[0]


def step_seconds() -> float:
    """A while-loop iteration whose body is one small fused update: loop control and carry handling."""
    return timed(loop(lambda c: c * 0.999 + 1.0, None), jnp.zeros(256, jnp.float32)) / L


def launch_seconds() -> float:
    """Each further kernel in a loop body: 9 chained sorts of 64 numbers against 1 (a sort fuses with
    nothing, so each is a kernel), per extra sort."""
    def chain(k):
        def body(x):
            for _ in range(k):
                x = -jnp.sort(x)
            return x
        return loop(body, None)
    x = jnp.linspace(0.0, 1.0, 64, dtype=jnp.float32)
    return max(timed(chain(9), x) - timed(chain(1), x), 0.0) / (8 * L)


def bandwidth() -> float:
    """Bytes/s of an elementwise pass over a buffer far larger than the caches (read + write)."""
    x = jnp.ones((64 if GPU else 8) * 2**20, jnp.float32)
    return 2 * x.nbytes / timed(lambda x: x * 2.0 + 1.0, x)


def flops() -> float:
    """FLOP/s of a float32 matmul at the precision JAX uses by default."""
    n = 8192 if GPU else 1024
    a = jnp.ones((n, n), jnp.float32) / n
    return 2 * n**3 / timed(lambda a: a @ a, a)


def transcendental() -> float:
    """FLOPs one tanh costs, from a compute-bound chain of 8 tanh against 8 multiply-adds."""
    x = jnp.ones((16 if GPU else 2) * 2**20, jnp.float32) * 0.1
    t_mul = timed(lambda x: x * 0.9 + 0.01 * x * x * x * x * x * x * x * x, x)
    t_tanh = timed(lambda x: jnp.tanh(jnp.tanh(jnp.tanh(jnp.tanh(jnp.tanh(jnp.tanh(jnp.tanh(jnp.tanh(x)))))))), x)
    return max(t_tanh - t_mul, 0.0) / (8 * x.size) * flops_per_second + 1.0


def stack_bandwidth(step: float) -> float:
    """Bytes/s a loop step writes its row of a stacked `[L, d]` result at."""
    d = 4096 if GPU else 512
    ys = lambda x: lax.scan(lambda c, _: (c + 1.0, c), x, None, length=L)[1]
    carry = loop(lambda c: c + 1.0, None)
    x = jnp.zeros(d, jnp.float32)
    return L * d * 4 / max(timed(ys, x) - timed(carry, x), step * L * 0.05)


def in_loop_factor(step: float) -> float:
    """How much slower the same elementwise work runs one row per loop step than batched over all rows."""
    d = 4096 if GPU else 256
    xs = jnp.ones((L, d), jnp.float32) * 0.1
    body = lambda c, x: (c, jnp.tanh(x * 1.5 + 0.25) * x)
    t_loop = timed(lambda xs: lax.scan(body, jnp.float32(0), xs)[1], xs)
    t_batched = timed(lambda xs: body(0.0, xs)[1], xs)
    return max(t_loop - step * L, t_batched) / t_batched


if __name__ == "__main__":
    m = machine()
    print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), JAX {jax.__version__}, "
          f"min of {REPS}")
    step = step_seconds()
    flops_per_second = flops()
    got = {"flops": flops_per_second, "bandwidth": bandwidth(), "step": step, "launch": launch_seconds(),
           "transcendental": transcendental(), "in_loop": in_loop_factor(step),
           "stack_bandwidth": stack_bandwidth(step)}
    print(f"{'constant':<16} {'in use':>10} {'measured':>10}  ratio")
    for k, v in got.items():
        cur = getattr(m, k)
        print(f"{k:<16} {cur:>10.3g} {v:>10.3g}  {v / cur if cur else np.inf:.2f}x")
    fmt = lambda v: f"{v:.2g}" if isinstance(v, float) else str(v)
    print("Machine(" + ", ".join(f"{k}={fmt(round(v) if k == 'transcendental' else v)}"
                                 for k, v in got.items()) + ")")
