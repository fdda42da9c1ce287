"""Binomial (revolve) checkpointing of a scan: reverse L steps with c stored carries.

Griewank's result: with c checkpoint slots and at most r forward recomputations
of each step, β(c, r) = C(c + r, c) steps can be reversed. For a budget of a
few carries this reaches loops far longer than √L checkpointing can hold, at
a recompute factor that grows like log L.

`scan_revolve(step, consts, carry, xs, length, slots)` runs the loop forward
storing nothing but the final carry and the ys (they are outputs), and its
custom VJP replays a static schedule, computed here in Python as a table of
actions, with a `while_loop` interpreter over the table:

    SAVE s     slots[s] = carry                 LOAD s     carry, t = slots[s]
    ADVANCE n  n forward steps from t           REVERSE    one step's VJP at t

The reverse recursion (treeverse): to reverse steps [a, b) holding the carry
at a and c free slots, save it, advance to the split point m, reverse [m, b)
with c - 1 slots, restore the carry at a and reverse [a, m) with c slots.
The split m = a + β(c, r - 1) (r: the least with β(c, r) >= b - a) is the
binomial one. Float operands only (the interpreter accumulates cotangents);
the VJP is first order (its while loop is not reverse-differentiable).
"""
from __future__ import annotations

import functools
from math import comb

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax

SAVE, LOAD, ADVANCE, REVERSE = range(4)


def _instantiate(ct, like):
    """A symbolic-zero cotangent (symbolic_zeros=True) as an array of zeros."""
    return jnp.zeros(like.shape, like.dtype) if _is_symbolic_zero(ct) else ct


def beta(c: int, r: int) -> int:
    """Steps reversible with c slots and r recomputations (Griewank's binomial bound)."""
    return comb(c + r, c)


def repetitions(length: int, slots: int) -> int:
    """The least r with β(slots, r) >= length: each step is recomputed at most r times."""
    r = 0
    while beta(slots, r) < length:
        r += 1
    return r


def schedule(length: int, slots: int) -> np.ndarray:
    """The action table, rows (op, arg, step): op in SAVE/LOAD/ADVANCE/REVERSE (step: for checking)."""
    assert slots >= 1 and length >= 1
    rows: list[tuple[int, int, int]] = []

    def reverse(a: int, b: int, free: int, slot: int) -> None:
        # the current carry is the carry before step a; slots [0, slot) are taken
        while b - a > 1:
            if free == 0:          # no slot left: replay from a for each step (not reached with slots >= 1)
                raise AssertionError("revolve: ran out of slots")
            n = b - a
            r = repetitions(n, free)
            m = a + max(1, min(n - 1, beta(free, r - 1) if r > 0 else 1))
            rows.append((SAVE, slot, a))
            rows.append((ADVANCE, m - a, a))
            reverse(m, b, free - 1, slot + 1)
            rows.append((LOAD, slot, a))
            b = m
        rows.append((REVERSE, 0, a))

    reverse(0, length, slots, 0)
    return np.asarray(rows, np.int32)


def scan_revolve(step, consts, carry, xs, length: int, slots: int):
    """`lax.scan(partial(step, consts), carry, xs)` whose gradient stores `slots` carries.

    step(consts, carry, x) -> (carry, y); all leaves of consts/carry/xs/ys inexact.

    A `custom_jvp` whose tangent is a linear map with its own transpose (`_jax.linear_map`): forward
    mode runs the plain scan's JVP (so `jax.jvp`/`jacfwd` work as on the original loop), reverse mode
    transposes that map with the binomial schedule, its only residuals the loop's inputs. (A
    `custom_vjp` would give reverse mode alone: JAX cannot run forward mode through one.) Which inputs
    are differentiated is read from the tangents' symbolic zeros by each trace of the rule: a rule is a
    pure function of its arguments, nothing one trace writes is read by another (JAX caches traces).
    """
    rows = schedule(length, slots)
    packed = rows[:, 0] | (rows[:, 1] << 2)   # one int32 a row: op in 2 bits, arg above (numpy: no tracer)
    plain = lambda k, c, x: lax.scan(functools.partial(step, k), c, x, length=length)   # noqa: E731
    reverse = functools.partial(_revolve_vjp, step, length, slots, packed)

    @jax.custom_jvp
    def run(consts, carry, xs):
        return plain(consts, carry, xs)

    def run_jvp(primals, tangents):
        flat_t = jax.tree_util.tree_leaves(tangents)
        flat_p, p_tree = jax.tree_util.tree_flatten(primals)
        which = [not _is_symbolic_zero(t) for t in flat_t]
        weak = [_jax.get_aval(p).weak_type for p, w in zip(flat_p, which) if w]
        n_k, n_c = (len(jax.tree_util.tree_leaves(primals[i])) for i in (0, 1))
        wanted_xs = which[n_k + n_c:]

        def scan_tangent(res, lin):
            # the plain scan's JVP, linear in `lin`, taken w.r.t. the differentiated inputs only: a zero tangent
            # made an array would meet an infinite partial derivative (0 * inf = NaN where JAX gives a number)
            flat_res = jax.tree_util.tree_leaves(res)

            def of_differentiated(*d):
                it = iter(d)
                return plain(*jax.tree_util.tree_unflatten(p_tree, [next(it) if w else p
                                                                    for p, w in zip(flat_res, which)]))
            return jax.jvp(of_differentiated, tuple(p for p, w in zip(flat_res, which) if w), tuple(lin))[1]

        def binomial_transpose(res, ct):   # the binomial schedule, recomputing from the inputs
            ct_k, ct_c, ct_xs = reverse(*res, wanted_xs, ct)
            flat_ct = jax.tree_util.tree_leaves((ct_k, ct_c)) + [c for c in jax.tree_util.tree_leaves(ct_xs)]
            it = iter(flat_ct[n_k + n_c:])
            flat_ct = flat_ct[:n_k + n_c] + [next(it) if w else None for w in wanted_xs]
            # a cotangent has its primal's weak type, as plain JAX's does
            return [_jax.with_weak_type(c, wk) for c, wk in zip((c for c, w in zip(flat_ct, which) if w), weak)]

        out = plain(*primals)
        lin = [t for t, w in zip(flat_t, which) if w]
        return out, _jax.linear_map(scan_tangent, binomial_transpose, primals, lin)

    run.defjvp(run_jvp, symbolic_zeros=True)
    return run(consts, carry, xs)


def _is_symbolic_zero(t) -> bool:
    return type(t).__name__ == "SymbolicZero"


def _revolve_vjp(step, length: int, slots: int, packed, consts, carry0, xs, wanted: list, ct):
    """(ct_consts, ct_carry, ct_xs) of the loop from its inputs, replaying the binomial schedule `packed`;
    ct_xs has None for the xs leaves not `wanted` (no cotangent buffer is built for them)."""
    ct_carry, ct_ys = ct
    zeros = lambda t: jax.tree_util.tree_map(jnp.zeros_like, t)  # noqa: E731
    ys_like = jax.eval_shape(lambda: lax.scan(functools.partial(step, consts), carry0, xs, length=length)[1])
    ct_ys = jax.tree_util.tree_map(_instantiate, ct_ys, ys_like)
    ct_carry = jax.tree_util.tree_map(_instantiate, ct_carry, carry0)
    x_leaves, x_tree = jax.tree_util.tree_flatten(xs)
    table = jnp.asarray(packed)
    x_at = lambda t: jax.tree_util.tree_map(lambda x: x[t], xs)   # noqa: E731
    store = jax.tree_util.tree_map(lambda c: jnp.zeros((slots, *jnp.shape(c)), jnp.result_type(c)), carry0)
    steps = jnp.zeros(slots, jnp.int32)   # the step each slot's carry is before

    def advance(c, t, n):
        return lax.fori_loop(0, n, lambda i, c: step(consts, c, x_at(t + i))[0], c), t + n

    def reverse(c, t, ct_c, ct_k, ct_xs):
        _, vjp = jax.vjp(lambda k, c, x: step(k, c, x), consts, c, x_at(t))
        ct_y = jax.tree_util.tree_map(lambda y: y[t], ct_ys)
        dk, dc, dx = vjp((ct_c, ct_y))
        ct_k = jax.tree_util.tree_map(jnp.add, ct_k, dk)
        dx = [d for d, w in zip(jax.tree_util.tree_leaves(dx), wanted) if w]
        ct_xs = [b.at[t].set(d) for b, d in zip(ct_xs, dx)]
        return dc, ct_k, ct_xs

    def body(state):
        i, c, t, store, steps, ct_c, ct_k, ct_xs = state
        op, arg = table[i] & 3, table[i] >> 2

        def save():
            return (c, t, jax.tree_util.tree_map(lambda s, v: s.at[arg].set(v), store, c),
                    steps.at[arg].set(t), ct_c, ct_k, ct_xs)

        def load():
            return jax.tree_util.tree_map(lambda s: s[arg], store), steps[arg], store, steps, ct_c, ct_k, ct_xs

        def adv():
            c2, t2 = advance(c, t, arg)
            return c2, t2, store, steps, ct_c, ct_k, ct_xs

        def rev():
            dc, k2, x2 = reverse(c, t, ct_c, ct_k, ct_xs)
            return c, t, store, steps, dc, k2, x2
        return (i + 1, *lax.switch(op, [save, load, adv, rev]))

    i32 = lambda n: jnp.asarray(n, jnp.int32)   # noqa: E731  (a Python int is int64 under jax_enable_x64)
    state = (i32(0), carry0, i32(0), store, steps, ct_carry, zeros(consts),
             [jnp.zeros_like(x) for x, w in zip(x_leaves, wanted) if w])
    *_, ct_c, ct_k, ct_xs = lax.while_loop(lambda s: s[0] < table.shape[0], body, state)
    it = iter(ct_xs)   # xs that are not differentiated get no cotangent buffer at all
    return ct_k, ct_c, jax.tree_util.tree_unflatten(x_tree, [next(it) if w else None for w in wanted])
