"""Programs the fuzzer found a pass bug on, shrunk, kept as they were printed.

Each is checked like a fuzz program (every pass and the default pipeline);
the comment names the bug and the fix.
"""
from __future__ import annotations

import jax
import pytest

from fuzz.differential import check
from fuzz.programs import Program

REGRESSIONS = {
    # dce looped forever: shrink_unused reported a change for an effectful call (a jit writing
    # a Ref) whose unread body input it may not drop. Fix: report only what it dropped.
    "dce_effectful_call_unread_input": Program('''def f(x0):
    r1 = jax.new_ref(jnp.zeros((3,), jnp.float32))
    @jax.jit
    def sub2(a3):
        r1[...] += x0
        return x0 * 2.0
    v4 = sub2(x0)
    return v4 + r1[...]
''', ((3,),)),
    # inline left a dangling value: a call body returning one of its inputs as is (here a value
    # the branch closes over) was replaced by the body's input, not the caller's operand.
    # Fix: map such outputs to the call's operands.
    "inline_body_returns_its_input": Program('''def f(x0):
    def branch1(a2):
        return a2
    def branch3(a4):
        v5 = jnp.sin(a4)
        @jax.jit
        def sub6(a7):
            v8 = jnp.sin(v5)
            return v5
        v9 = sub6(v5)
        return v9
    v10 = lax.cond(jnp.sum(x0) > 0, branch1, branch3, x0)
    return v10
''', ((3,),)),
    # cse merged two stateful lax.rng_uniform draws (u4 == u5, so the where flipped every sign); found by the
    # issue-15 generator before the fix (issue 15 finding 4). Fix: impure primitives are never merged.
    "cse_rng_uniform_pair": Program('''def f(x0, t):
    x1 = t['a']
    u4 = lax.rng_uniform(0.0, 1.0, (3, 3))
    u5 = lax.rng_uniform(0.0, 1.0, (3, 3))
    v6 = jnp.where(u4 != u5, x1, -x1)
    return {'out': v6, 'aux': (v6, x1,)}
''', ((), (3, 3)), True),
    # Not a pass bug: JAX's own jvp of this program under jit is wrong (-0.66 where eager JAX and float64 give
    # -5.679; JAX 0.10.2 and 0.12.0.1), so the fused program (right) failed against the jitted original. Fix in the
    # fuzzer: on a mismatch, the original run eagerly is the oracle when jit and eager JAX disagree (counted).
    "jax_jit_jvp_of_ref_scan_is_wrong": Program(source='def f(x0, w0, w1):\n    W1 = w0\n    h2 = x0\n    r6 = jax.new_ref(jnp.zeros((), jnp.float32))\n    V7 = w1\n    def body3(h4, _):\n        h4 = 0.5 * jnp.tanh(h4 @ W1) + 1.0\n        r6[...] += jnp.sum(h4).astype(jnp.float32)\n        return h4, h4\n    hT8, ys9 = lax.scan(body3, h2, None, length=4096)\n    z11 = ys9 @ V7\n    loss10 = (jnp.sum(jnp.sin(z11) * 2.0)) / 4096\n    rv12 = r6[...]\n    v13 = jnp.asarray(1.5)\n    v14 = jnp.clip(jnp.argmax(v13.reshape(-1)), 0, 1).astype(jnp.int32)\n    v15 = jnp.sin(v13)\n    def body16(s):\n        k17, c18 = s\n        return k17 + 1, 0.5 * c18 + 0.5 * jnp.tanh(c18)\n    _, v19 = lax.while_loop(lambda s: s[0] < 1, body16, (0, v15))\n    v20 = jnp.sin(v19)\n    v21 = jnp.sin(loss10)\n    return v21\n', shapes=((3,),), tree=False, reverse_diff=False, forward_diff=True, vmap=True, x64=False, extra=((3, 3), (3, 3)), features=frozenset({'rnn', 'rnn:long', 'rnn:loss_sin', 'rnn:matmul_ys', 'rnn:ref', 'weak_type'})),
}


@pytest.mark.parametrize("name", REGRESSIONS)
def test_regression(name):
    check(REGRESSIONS[name])


def test_long_float16_cotangent_oracle_is_accuracy_not_plain_jax():
    """Found by the edge catalog (issue 26's fuzzer, taken then for a memory="min" bug): the derivative of a
    3000-step f16 x f16 -> f32 accumulation with respect to the f16 weights. Plain JAX accumulates that
    cotangent in float16 and saturates at 2048; two-level checkpointing sums per chunk and lands near the
    exact 3000 * 0.8776 = 2633. The fuzzer's oracle is then the program widened to float32: the transformed
    result must be at least as close to it as plain JAX's, and a worse one still fails."""
    import jax
    import numpy as np
    from jaxform.optimize import run_passes
    from fuzz import differential as D
    from fuzz.programs import edge_catalog
    prog = next(p for p in edge_catalog() if {"mixed:f16_dot_f32", "length:long"} <= set(p.features))
    leaves = jax.tree_util.tree_leaves(prog.args())
    closed = jax.make_jaxpr(prog.fn)(*prog.args())
    # two-level checkpointing forced (memory="min" now keeps the least of it and remat of every step as XLA
    # measures them, here remat, whose sums are plain JAX's: checked below)
    from jaxform.ir import Graph
    from jaxform.passes.remat_loops import schedule
    g = Graph.from_jaxpr(closed)
    assert {p.schedule for p in schedule(g, "min")} == {"sqrt"}
    opt = g.to_jaxpr()
    diff = dict(reverse=True, forward=True)
    want, got = D.probe([closed, opt], leaves, vmap=False, **diff)
    least = run_passes(closed, D.pipelines()["memory=min"], strict=True)   # the fuzzer's memory="min" pipeline
    _, same = D.probe([closed, least], leaves, vmap=False, **diff)
    assert np.all(np.asarray(same[1][1]) == np.asarray(want[1][1])) or \
        D._transformed_is_more_accurate(prog, leaves, want, same, D._tol(prog), diff)
    w_grad, g_grad = np.asarray(want[1][1]), np.asarray(got[1][1])
    exact = 3000 * np.asarray(D._weights((1, 2)))[0]
    assert np.all(w_grad[:, 0] == 2048)                            # plain JAX: float16 saturation
    np.testing.assert_allclose(g_grad[:, 0], exact[0], rtol=5e-3)  # memory="min": near the exact sum
    tol = D._tol(prog)
    assert D._transformed_is_more_accurate(prog, leaves, want, got, tol, diff)
    assert not D._transformed_is_more_accurate(prog, leaves, got, want, tol, diff)   # the worse one fails


def _passes_fission_and_plain(prog):
    """Check `prog` under fission (no mismatch) and return (leaves, plain JAX's probe, the derivatives asked)."""
    from fuzz import differential as D
    errors: list = []
    check(prog, names={"fission": D.pipelines()["fission"]}, collect=errors)
    assert not errors, errors
    leaves = jax.tree_util.tree_leaves(prog.args())
    diff = dict(reverse=False, forward=True)
    (want,) = D.probe([jax.make_jaxpr(prog.fn)(*prog.args())], leaves, **diff)
    return leaves, want, diff


def test_subnormal_flushed_by_xla_is_judged_per_element():
    """Found by the edge campaign of 2026-11-25 (seed 2612): the gradient of sum(sqrt(x)^2) at x = 1e-40 is
    inf in plain JAX (XLA:CPU flushed the subnormal in the loop's kernel) and 4.4e19 after fission (sqrt(xs)
    batched before the loop, not flushed). Each value must be plain JAX's or the float64 one; a NaN is neither."""
    import jax.numpy as jnp
    import numpy as np
    from fuzz import differential as D
    src = ("def f(x0, w0):\n    def body(c, x):\n        t = jnp.sqrt(x)\n        return c + t, t\n"
           "    c, ys = lax.scan(body, 0.0, x0)\n    return {'out': jnp.sum(ys * ys), 'aux': (c,)}\n")
    prog = Program(src, ((1,), ()), grad="grad", special=((0, 0, "subnormal"),),
                   features=frozenset({"special:subnormal", "edge", "grad_program"}))
    leaves, want, diff = _passes_fission_and_plain(prog)
    nan = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), want)
    assert not D._subnormal_flush_explains(prog, leaves, want, nan, D._tol(prog), diff)
    assert D._subnormal_flush_explains(prog, leaves, want, want, D._tol(prog), diff)


def test_subnormal_flushed_by_a_batched_kernel_matches_flushed_inputs():
    """Found by the edge campaign of 2026-11-26 (seed 2622): log(|x|) at x = 1e-40 under vmap is -inf in plain
    JAX's loop (the kernel flushed the subnormal) and -104.05 after fission batches it before the loop (XLA:CPU's
    vector log, inaccurate on a subnormal; exact -92.1). Each value must be plain JAX's, the float64 one, plain
    JAX's on flushed inputs, or no further from the float64 one than plain JAX's; a NaN or a worse value fails."""
    import jax.numpy as jnp
    from fuzz import differential as D
    src = ("def f(x0, w0):\n    def body(c, x):\n        t = jnp.log(jnp.abs(x))\n        return c + t, t\n"
           "    c, ys = lax.scan(body, 0.0, x0)\n    return {'out': jnp.sum(ys), 'aux': (c,)}\n")
    prog = Program(src, ((2,), ()), special=((0, 0, "subnormal"),), features=frozenset({"special:subnormal", "edge"}))
    leaves, want, diff = _passes_fission_and_plain(prog)
    flushed = [D._flush_subnormals(x) for x in leaves]
    (got,) = D.probe([jax.make_jaxpr(prog.fn)(*jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(prog.args()), flushed))], flushed, **diff)
    assert D._subnormal_flush_explains(prog, leaves, want, got, D._tol(prog), diff)
    nan = jax.tree_util.tree_map(lambda x: jnp.full_like(x, jnp.nan), want)
    assert not D._subnormal_flush_explains(prog, leaves, want, nan, D._tol(prog), diff)
    far = jax.tree_util.tree_map(lambda x: jnp.full_like(x, 1e30), want)      # further off than plain JAX's
    assert not D._subnormal_flush_explains(prog, leaves, want, far, D._tol(prog), diff)


def test_float32_rounding_of_an_ill_conditioned_sweep_is_judged_against_float64():
    """Found by the edge campaign of 2026-11-26 (seed 2632): a row sweep r[i+2] = r[i]/2 + sin(r[i+1]) w over
    130 steps grows, and its derivative w.r.t. w is 1e-5 off float64 in plain JAX itself; stream_rows adds the
    same cotangents in another order (3.4e-5 off plain JAX). The oracle: within twice plain JAX's own error of
    the float64 value; a value further off fails."""
    import jax.numpy as jnp
    from fuzz import differential as D
    src = ("def f(x0, w0):\n    def body(i, r):\n        r = r.at[i + 2].set(0.5 * r[i] + jnp.sin(r[i + 1]) * w0)\n"
           "        return r\n    r = lax.fori_loop(0, 0 + 130, body, x0)\n    return {'out': r, 'aux': (r[0] * 1.0,)}\n")
    prog = Program(src, ((132, 3), (3,)), special=((0, 5, "-0.0"),), features=frozenset({"edge", "edge:rows"}))
    errors: list = []
    check(prog, names={"stream_rows": ["stream_rows"], "DEFAULT": D.pipelines()["DEFAULT"]}, collect=errors)
    assert not errors, errors
    leaves = jax.tree_util.tree_leaves(prog.args())
    closed = jax.make_jaxpr(prog.fn)(*prog.args())
    diff = dict(reverse=prog.reverse_diff, forward=prog.forward_diff)
    (want,) = D.probe([closed], leaves, vmap=prog.vmap, **diff)
    far = jax.tree_util.tree_map(lambda x: x * 1.01 + 0.01, want)
    assert not D._rounding_explains(prog, leaves, want, far, D._tol(prog), diff)
    assert D._rounding_explains(prog, leaves, want, want, D._tol(prog), diff)
