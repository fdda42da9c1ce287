"""Programs the fuzzer found a pass bug on, shrunk, kept as they were printed.

Each is checked like a fuzz program (every pass and the default pipeline);
the comment names the bug and the fix.
"""
from __future__ import annotations

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
}


@pytest.mark.parametrize("name", REGRESSIONS)
def test_regression(name):
    check(REGRESSIONS[name])
