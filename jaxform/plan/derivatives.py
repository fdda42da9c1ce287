"""A planned program that differentiates as the traced one: the forward the plan chose, the JVP of the program
as traced (`jax.custom_jvp`).

Under `jax.jit` the use is unknown (`plan.use`): the call may run forward only, or be differentiated with
respect to any argument (`jax.grad(jax.jit(f), argnums=k)`). A loop rewrite that wins the forward 40x can make
one of those gradients 100x bigger (fusing a loss into an RNN's loop: the gradient w.r.t. the initial state
alone now stores what the full gradient does). Rather than give the forward win up, the planner keeps it and
routes every derivative through the traced program, whose gradients are plain `jax.jit`'s: never bigger.

The rule closes over two immutable jaxprs and nothing else: a pure function of its arguments, as every rule a
pass installs must be (JAX caches traces).
"""
from __future__ import annotations

import jax

from .. import _jax


def with_derivatives_of(chosen, traced):
    """A jaxpr that computes `chosen` and whose JVP (and so VJP, grad, jacfwd, hessian) is `traced`'s. Only
    the inputs that carry tangents are differentiated (symbolic zeros stay zeros): an instantiated zero
    tangent times an inf partial is a NaN that plain JAX's JVP never makes (an attack: NaN where plain's
    tangent of the initial state was finite)."""
    @jax.custom_jvp
    def planned(*args):
        return _jax.eval_jaxpr(chosen, *args)

    def as_traced(primals, tangents):
        moving = [i for i, t in enumerate(tangents) if not isinstance(t, jax.custom_derivatives.SymbolicZero)]

        def of(*m):
            full = list(primals)
            for i, v in zip(moving, m):
                full[i] = v
            return _jax.eval_jaxpr(traced, *full)
        return jax.jvp(of, tuple(primals[i] for i in moving), tuple(tangents[i] for i in moving))

    planned.defjvp(as_traced, symbolic_zeros=True)
    return jax.make_jaxpr(planned)(*[_jax.spec_of(a) for a in chosen.in_avals])
