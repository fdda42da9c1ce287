"""jaxform.scan vs lax.scan and for_loop vs a hand-written lax.fori_loop, in one run.

Prints compiled runtime (min of N after warmup) and XLA temp memory for each
pair, and the ratio ours / reference (target: time <= 1.05, memory equal).
Run: .venv/bin/python benchmarks/for_loop.py
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxform

T, H, N = 512, 128, 64
R = np.random.RandomState(0)
W = jnp.asarray(R.randn(H, H).astype(np.float32) / np.sqrt(H))
XS = jnp.asarray(R.randn(T, H).astype(np.float32))
C0 = jnp.zeros(H)
M0 = jnp.asarray(R.randn(N, H).astype(np.float32))


def cell(c, x):
    c = jnp.tanh(c @ W + x)
    return c, c.sum()


def rnn(scan):
    return lambda c, xs: scan(cell, c, xs)


def rnn_grad(scan):
    return jax.grad(lambda c, xs: jnp.sum(scan(cell, c, xs)[1] ** 2), argnums=(0, 1))


# for_loop vs fori_loop: rows updated in place from the previous row, plus a carried accumulator.
def rows_ours(m, xs):
    def body(i, refs):
        m_, acc = refs
        i = jnp.maximum(i, 1)
        row = jnp.tanh(m_[i - 1] @ W + xs[i])
        m_[i] = row
        acc[...] += row
    return jaxform.for_loop(N, body, (m, C0))


def rows_ref(m, xs):
    def body(i, carry):
        m_, acc = carry
        i = jnp.maximum(i, 1)
        row = jnp.tanh(lax.dynamic_index_in_dim(m_, i - 1, keepdims=False) @ W + xs[i])
        return lax.dynamic_update_index_in_dim(m_, row, i, 0), acc + row
    return lax.fori_loop(0, N, body, (m, C0))


def rows_grad(f):
    return jax.grad(lambda m, xs: jnp.sum(f(m, xs)[0] ** 2) + jnp.sum(f(m, xs)[1]), argnums=(0, 1))


def measure(f, *args, n=200):
    jf = jax.jit(f)
    compiled = jf.lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(jf(*args))
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(jf(*args))
        best = min(best, time.perf_counter() - t0)
    return best, temp


def main():
    cases = [
        ("scan rnn fwd", rnn(jaxform.scan), rnn(lax.scan), (C0, XS)),
        ("scan rnn grad", rnn_grad(jaxform.scan), rnn_grad(lax.scan), (C0, XS)),
        ("for_loop rows fwd", rows_ours, rows_ref, (M0, XS)),
        ("for_loop rows grad", rows_grad(rows_ours), rows_grad(rows_ref), (M0, XS)),
    ]
    print(f"{'case':22s} {'ours ms':>9s} {'ref ms':>9s} {'time ratio':>10s} {'ours temp':>10s} {'ref temp':>10s}")
    for name, ours, ref, args in cases:
        for a, b in zip(jax.tree_util.tree_leaves(jax.jit(ours)(*args)), jax.tree_util.tree_leaves(jax.jit(ref)(*args))):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        (to, mo), (tr, mr) = measure(ours, *args), measure(ref, *args)
        print(f"{name:22s} {to * 1e3:9.3f} {tr * 1e3:9.3f} {to / tr:10.3f} {mo:10d} {mr:10d}"
              f"{'' if mo == mr else '  (temp differs)'}")


if __name__ == "__main__":
    main()
