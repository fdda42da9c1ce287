"""A small program to look at with the `jaxform` command (and the CLI tests).

    jaxform inspect examples/inspect_me.py:loss --arg 'f32[16,16]' --arg 'f32[50,8,16]' --html /tmp/loss.html

`loss` recomputes a loop-invariant normalization in every step (hoisted by
`hoist_loop_invariants`) and reduces the stacked states of its scan (fused
into the scan by `fuse_scan_reductions`).
"""
import jax.numpy as jnp
from jax import lax


def loss(w, xs):
    def cell(h, x):
        w_n = w / jnp.linalg.norm(w)          # the same in every step
        h = jnp.tanh(h @ w_n + x)
        return h, h
    _, hs = lax.scan(cell, jnp.zeros(xs.shape[1:]), xs)
    return jnp.sum(hs ** 2)


def pair(params, x):
    """A pytree argument: --arg '(f32[4,4], f32[4])' --arg 'f32[4]'."""
    w, b = params
    return jnp.sin(x @ w + b) + jnp.sin(x @ w + b)


NOT_A_FUNCTION = 3
