"""Derivative rules a pass installs are checked when the pass runs, not at the user's `grad`.

A pass that emits a `custom_vjp`/`custom_jvp` (revolve's schedule, a thinned residual) hands JAX
code that is traced only later, when the user differentiates: a bug there (a dtype mismatch
under x64, a wrong cotangent structure) would escape `run_passes`' safety net and reach the
user's `jax.grad`. So every rule that is new in a pass's output (compared by the identity of its
rule callables with the input's; the user's own rules are not re-checked) is traced there, on
the signature's avals: reverse mode (`grad` of the sum of the inexact outputs, tracing fwd and
bwd) for custom_vjp, both modes for custom_jvp (forward mode runs its rule, reverse mode transposes
it). A failure raises, so the pass is skipped (or, with strict, raises) at optimization time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import _jax

RULE_PARAMS = {"custom_vjp_call": ("fwd_jaxpr_thunk", "bwd"), "custom_jvp_call": ("jvp_jaxpr_fun", "jvp_jaxpr_thunk")}


def rules(closed) -> dict[int, str]:
    """id of each rule callable in `closed` (any depth) -> the primitive that holds it. Walks the jaxpr itself
    (no Graph is built: this runs on every verification)."""
    out: dict[int, str] = {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            for k in RULE_PARAMS.get(name, ()):
                if k in eqn.params:
                    out[id(eqn.params[k])] = name
            for v in eqn.params.values():
                for x in (v if isinstance(v, (tuple, list)) else (v,)):
                    if hasattr(x, "eqns"):
                        walk(x)
                    elif hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                        walk(x.jaxpr)
    walk(closed.jaxpr)
    return out


def _inexact(a) -> bool:
    """A float or complex input to differentiate; PRNG key arrays (dtype key<fry>, which NumPy cannot
    interpret) and integers are not."""
    try:
        return jax.numpy.issubdtype(np.dtype(a.dtype), np.inexact)
    except TypeError:
        return False


def check_installed_rules(closed, like) -> None:
    """Trace the derivatives of `closed` if it holds a rule `like` does not; raise what that tracing raises."""
    new = {k: v for k, v in rules(closed).items() if k not in rules(like)}
    if not new:
        return
    avals = closed.in_avals
    specs = [_jax.spec_of(a) for a in avals]
    diff = [i for i, a in enumerate(avals) if _inexact(a)]
    if not diff or not any(_inexact(a) for a in closed.out_avals):
        return

    def with_(d, args):
        args = list(args)
        for i, x in zip(diff, d):
            args[i] = x
        return args

    def reverse(c):
        def loss(d, args):
            outs = _jax.eval_jaxpr(c, *with_(d, args))
            return sum(jnp.sum(jnp.real(o)).astype(jnp.float32) for o, a in zip(outs, c.out_avals) if _inexact(a))
        jax.make_jaxpr(lambda *a: jax.grad(loss)([a[i] for i in diff], a))(*specs)

    def forward(c):
        jax.make_jaxpr(lambda *a: jax.jvp(lambda *d: _jax.eval_jaxpr(c, *with_(d, a)),
                                          [a[i] for i in diff], [jnp.ones_like(a[i]) for i in diff]))(*specs)

    # A custom_jvp is differentiated both ways: forward through its rule, reverse by transposing the rule's
    # linear part (revolve's: a `linear_call` whose transpose is the binomial schedule).
    for mode, prims in ((reverse, ("custom_vjp_call", "custom_jvp_call")), (forward, ("custom_jvp_call",))):
        if any(p in new.values() for p in prims):
            try:
                mode(closed)
            except Exception:
                try:            # a program that was never differentiable this way does not blame the pass
                    mode(like)
                except Exception:
                    continue
                raise


__all__ = ["rules", "check_installed_rules"]
