"""Runtime operators the converted code calls (imported there as `ag__`).

Dispatch happens at run time, like TensorFlow AutoGraph: an `if` whose predicate is a
Python value (or a concrete array) runs as plain Python; a traced predicate becomes
`lax.cond`. Loops likewise become `lax.scan` / `lax.while_loop` only when the iterable
or loop test is traced. The variables a statement may change are reached through
`get_state()` / `set_state(values)` closures (the converter makes them `nonlocal`);
the static `info` record says which of them are live afterwards, so only those are
branch outputs / loop carries.

Each branch is traced once to a jaxpr whose abstract outputs decide the plan (which
variables are outputs, their dtypes, zero-fill for a lowered `return` value) and name
the offending variable when branches disagree; the jaxprs are then replayed inside
`lax.cond` (or a select). A loop body is first traced abstractly (`jax.eval_shape`) to
fix the carry and catch a carry that changes shape or dtype.

This module is the namespace converted code sees as `ag__` (tests patch it: `ag__.retval` is looked up
here at run time). Each Python construct lives in its own module:

    runtime.py       Info, undefined variables, traced-region depth, tracing a body to a jaxpr
    conditionals.py  if / conditional expressions / and, or, not
    loops.py         for / while, range / enumerate / zip, static iterables
    lists.py         append in a traced loop, traced indexing into lists, x[i] = v, x[i] op= v
    calls.py         builtins on traced values, run-time checks of self-recursion

Converting the functions a converted function calls (`autograph(recursive=True)`) is the
converter's: convert.py binds its `call` next to this namespace, so nothing here imports it.
"""
from __future__ import annotations

from .runtime import (Info, Undefined, _DEPTH, _SPLIT, _traced_region, checked, depth, is_traced,  # noqa: F401
                      retval, static_test)
from .conditionals import and_, if_exp, if_stmt, not_, or_  # noqa: F401
from .loops import enumerate_, for_stmt, range_, static_iter, while_stmt, zip_  # noqa: F401
from .lists import append, getitem, setitem, setitem_op  # noqa: F401
from .calls import builtin, check_self, is_self, recurse  # noqa: F401
