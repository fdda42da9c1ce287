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
}


@pytest.mark.parametrize("name", REGRESSIONS)
def test_regression(name):
    check(REGRESSIONS[name])
