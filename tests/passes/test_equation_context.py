"""Every node a pass builds, moves or rebuilds keeps the equation context of the user code it stands for.

Issue 15, finding 20 (the pass part): `eqn.ctx` holds the `jax_threefry_partitionable`
mode, the compute type, the mesh and XLA metadata (`set_xla_metadata`, which ends up
in the compiled HLO). A node rebuilt without it got the context at emission time
instead. Before: `sum_then_pull_back` rebuilt the pull-back after the loop (and its
accumulator) without a context, `remat_loops` spliced its new scan/checkpoint
structure in with the pass's own, and rewrite rules (`algebra`) built their
replacement nodes without one. Each program is traced under `set_xla_metadata`,
so every one of its equations carries the tag; after the pass every equation, in
every body, must still carry it.
"""
import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental.xla_metadata import set_xla_metadata

from jaxform import passes
from jaxform.ir import Graph
from jaxform.optimize import run_passes
from jaxform.passes.licm import sum_then_pull_back
from jaxform.passes.remat_loops import with_memory

W = jnp.linspace(-1.0, 1.0, 64).reshape(8, 8) / 5
H0 = jnp.linspace(0.0, 1.0, 8)
XS = jnp.linspace(0.0, 1.0, 40).reshape(5, 8)
XL = jnp.linspace(0.0, 1.0, 160).reshape(20, 8)


def rnn(W, h, xs):
    def step(h, x):
        h = jnp.tanh(h @ W + jnp.cos(x))
        return h, h
    _, ys = lax.scan(step, h, xs)
    return jnp.sum(ys @ W) + jnp.sum(ys ** 2)


def rnn_time_major(W, h, xs):   # fusion transposes the stacked ys outside the loop
    def step(h, x):
        h = jnp.tanh(h @ W + jnp.cos(x))
        return h, h[None]
    _, ys = lax.scan(step, h, xs)
    return jnp.sum(jnp.swapaxes(ys, 0, 1) @ W)


def ck_gram(W, x):
    body = jax.checkpoint(lambda c, _: (jnp.tanh((W @ W.T) @ c), None))
    return jnp.sum(lax.scan(body, x, None, length=5)[0] ** 2)


def invariant(W, x, xs):
    return lax.scan(lambda c, xi: (c + jnp.exp(W).sum(0) * xi, None), x, xs)[0]


def rewritten(x):
    return jnp.log(jnp.exp(x)) - (-x)


CASES = {
    "fuse_scan_reductions": (rnn, (W, H0, XS), ["fuse_scan_reductions"]),
    "fuse_transposed": (rnn_time_major, (W, H0, XL), ["fuse_scan_reductions"]),
    "fission": (rnn, (W, H0, XS), ["fission"]),
    "hoist_loop_invariants": (invariant, (W, H0, XS), ["hoist_loop_invariants"]),
    "sum_then_pull_back": (jax.grad(ck_gram), (W, H0), [passes.hoist_loop_invariants, sum_then_pull_back]),
    "remat": (jax.grad(rnn), (W, H0, XS), [with_memory("auto")]),
    "remat_sqrt": (jax.grad(rnn), (W, H0, XL), [with_memory("min")]),
    "algebra": (rewritten, (H0,), ["algebra"]),
    "default_grad": (jax.grad(rnn), (W, H0, XL), passes.default_pipeline() + [with_memory("min")]),
}


@pytest.mark.parametrize("case", CASES)
def test_pass_keeps_equation_context(case):
    fn, args, pipeline = CASES[case]
    with set_xla_metadata(jaxform_test="user"):
        closed = jax.make_jaxpr(fn)(*args)
    out = run_passes(closed, pipeline, strict=True)
    assert str(out) != str(closed), "the pass must change the program for this test to mean anything"
    lost = [(n.name, n.location()) for n, _ in Graph.from_jaxpr(out).walk()
            if (n.ctx.xla_metadata or {}).get("jaxform_test") != "user"]
    assert not lost, f"nodes without the user's equation context: {lost}"
