"""A planned program that differentiates as another: the forward the plan chose, the JVP of the gradient plan
(or of the program as traced) (`jax.custom_jvp`).

Under `jax.jit` the use is unknown (`plan.use`): the call may run forward only, or be differentiated with
respect to any argument (`jax.grad(jax.jit(f), argnums=k)`). A loop rewrite that wins the forward 40x can make
one of those gradients 100x bigger (fusing a loss into an RNN's loop: the gradient w.r.t. the initial state
alone now stores what the full gradient does). Rather than give the forward win up, the planner keeps it and
routes each derivative to a program planned for it: the gradient plan where the inputs that move are the ones
it was planned for, else the traced program, whose derivatives are plain `jax.jit`'s: never bigger.

The rule closes over immutable jaxprs and nothing else, and picks one by which tangents are symbolic zeros
(the structure of the call, not Python state): a pure function of its arguments, as every rule a pass
installs must be (JAX caches traces).
"""
from __future__ import annotations

from typing import Iterable

import jax

from .. import _jax


def with_derivatives_of(chosen, traced, planned=None, wrt: Iterable[int] = ()):
    """A jaxpr that computes `chosen` and whose JVP (and so VJP, grad, jacfwd, hessian) is `planned`'s where
    exactly the inputs `wrt` carry tangents (`jax.grad` w.r.t. them), and `traced`'s otherwise."""
    wrt = frozenset(wrt)

    @jax.custom_jvp
    def run(*args):
        return _jax.eval_jaxpr(chosen, *args)

    def rule(primals, tangents):
        moving = [i for i, t in enumerate(tangents) if not isinstance(t, jax.custom_derivatives.SymbolicZero)]
        floats = {i for i in moving if jax.numpy.issubdtype(chosen.in_avals[i].dtype, jax.numpy.inexact)}
        prog = planned if planned is not None and floats == wrt else traced

        def of(*m):
            full = list(primals)
            for i, v in zip(moving, m):
                full[i] = v
            return _jax.eval_jaxpr(prog, *full)
        return jax.jvp(of, tuple(primals[i] for i in moving), tuple(tangents[i] for i in moving))

    run.defjvp(rule, symbolic_zeros=True)
    return jax.make_jaxpr(run)(*[_jax.spec_of(a) for a in chosen.in_avals])
