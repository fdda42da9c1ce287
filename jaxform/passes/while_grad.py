"""Reverse-mode gradients through `lax.while_loop` with a data-dependent trip count.

JAX cannot transpose a `while` (its trip count is only known at run time, so it
has nowhere to store per-step residuals). With a bound on the trip count
(`optimize(fn, memory=..., max_steps=N)`, or a static one read from the loop's own
condition: `i < N` on an integer counter that starts at a literal and adds 1 each
step), each while loop whose carry holds floats is wrapped in a `custom_jvp`:

    primal  the original `while` (forward evaluation, `jit`, `vmap`: unchanged cost)
    jvp     the tangents of its *bounded form*: a scan over N steps whose step runs
            the body under `lax.cond(cond(c), body, identity)`. A step after the
            condition first fails passes the carry through, so the tangents (and, by
            transposition, the gradients) equal those of the same loop unrolled as a
            scan of its actual length. The bounded form's memory under `grad` is
            planned by `remat_loops` (√N checkpointing for "auto"/"min", the cheapest
            fitting schedule for a byte budget).

If the loop is still running after N steps, the tangents are multiplied by NaN:
a gradient past the bound is never silently wrong (values stay exact: they come
from the `while`). A float while loop with no known bound gets a tangent guard
instead whose transpose raises an error naming the function and what to do;
forward mode (`jax.jvp`, `jacfwd`) keeps working on it as before.

Forward mode is exact at any trip count: the tangents past the bound are the `while`'s own
(a linear map, `_jax.linear_map`, whose transpose is zero, so reverse mode over forward mode never
transposes the `while`'s tangents). Reverse over forward mode (`jax.grad` of `jax.jvp`, `jacrev(jacfwd)`)
differentiates those tangents w.r.t. the primals, through the `while`: JAX's own error, as in plain JAX.

Costs: under `grad` the forward pass runs both the `while` and the bounded scan, whose
step is a `select` (the body runs on all N steps; XLA allocates for N steps anyway:
memory follows N, not the actual trip count). Not a `cond`: its jvp, batched afterwards
(`grad(vmap(...))`: the rule is traced unbatched), gets `stop_gradient` on its tangents
from JAX's cond batching, which reverse mode cannot transpose (issue 40). On finished
steps the body sees the carry and its constants with a zero tangent, so a NaN or inf
it makes there cannot reach the gradient.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _jax
from ..ir import Graph, Node
from ..ir.identity import is_impure
from ..ir.separability import varying
from .registry import register
from .remat_loops import _splice, remat_loops

BOUND_CMP = {"lt": ("counter", 0), "le": ("counter", 1), "gt": ("limit", 0), "ge": ("limit", 1)}


class WhileGradError(ValueError):
    """`jax.grad` reached a `while_loop` whose trip count has no known bound."""


def check_max_steps(max_steps, where: str = "jaxform") -> None:
    """Raise a TypeError/ValueError that teaches unless `max_steps` is None or an int >= 1."""
    if max_steps is None:
        return
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)):
        raise TypeError(f"{where}: max_steps must be None or a positive int (an upper bound on every "
                        f"while_loop's trip count), got {type(max_steps).__name__} {max_steps!r}")
    if max_steps < 1:
        raise ValueError(f"{where}: max_steps must be >= 1, got {max_steps!r}")


@register(exact=False)
def while_grad(graph: Graph, memory="auto", max_steps=None, where: str = "") -> Graph:
    """Make float `while` loops reverse-differentiable within a bound (see the module docstring)."""
    if memory is None:
        return graph
    check_max_steps(max_steps)
    _rewrite_all(graph, memory, max_steps, where)
    return graph


def with_options(memory, max_steps, where: str = ""):
    """`while_grad` with fixed options, as a pass (what `optimize(memory=..., max_steps=...)` appends)."""
    p = functools.partial(while_grad, memory=memory, max_steps=max_steps, where=where)
    p.pass_name, p.exact = f"while_grad(max_steps={max_steps!r})", False
    return p


def _rewrite_all(graph: Graph, memory, max_steps, where: str) -> None:
    for node in list(graph.nodes):
        for sub in node.subgraphs():          # innermost first: an outer body sees the rewritten inner loop
            _rewrite_all(sub, memory, max_steps, where)
        if node.name == "while" and _eligible(node):
            bound = static_bound(node)
            steps = min((b for b in (max_steps, bound) if b is not None), default=None)
            _rewrite(graph, node, steps, memory, where)


def _inexact(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _eligible(node: Node) -> bool:
    """A pure while loop with a float carry (else there is nothing to differentiate)."""
    nc, nb = node.params["cond_nconsts"], node.params["body_nconsts"]
    carry = node.inputs[nc + nb:]
    if not any(_inexact(v.aval) for v in carry) or is_impure(node):
        return False
    return not any(varying(v.aval) for v in node.inputs)


# ---- the static bound: `i < N`, i an int counter from a literal, +1 per step ---------------

def _scalar(v):
    """The Python number a graph value holds, if it is a literal or a scalar constant, else None."""
    x = v.literal if v.is_literal else (v.const if v.is_const else None)
    if x is None or np.ndim(x) != 0:
        return None
    try:
        return np.asarray(x).item()
    except Exception:  # noqa: BLE001 - a tracer constant: not static
        return None


def static_bound(node: Node) -> int | None:
    """The most steps this while loop can take, read from its condition, or None."""
    nc, nb = node.params["cond_nconsts"], node.params["body_nconsts"]
    cond, body = node.regions["cond"], node.regions["body"]
    init = node.inputs[nc + nb:]
    best = None
    for k, limit, inclusive in _comparisons(cond, cond.outputs[0]):
        i = k - nc
        if i < 0 or not jnp.issubdtype(init[i].aval.dtype, jnp.integer) or not _increments(body, nb, i):
            continue
        i0 = _scalar(init[i])
        n = _scalar(limit) if limit.producer is None and (limit.is_literal or limit.is_const) else None
        if n is None and limit in cond.inputs[:nc]:     # a cond constant: the outer operand may be a literal
            n = _scalar(node.inputs[cond.inputs.index(limit)])
        if i0 is None or n is None:
            continue
        steps = max(0, int(math.ceil(n - i0)) + inclusive)
        best = steps if best is None else min(best, steps)
    return best


def _comparisons(cond: Graph, v, depth: int = 4):
    """(cond input index of the counter, limit Value, inclusive) for each `i < N` conjunct of `v`."""
    p = v.producer
    if p is None or depth == 0:
        return
    if p.name == "and" or p.name == "convert_element_type" and p.inputs[0].aval.dtype == np.bool_:
        for u in p.inputs:
            yield from _comparisons(cond, u, depth - 1)
    elif p.name in BOUND_CMP:
        side, inclusive = BOUND_CMP[p.name]
        counter, limit = p.inputs if side == "counter" else p.inputs[::-1]
        if counter in cond.inputs:
            yield cond.inputs.index(counter), limit, inclusive


def _increments(body: Graph, nb: int, i: int) -> bool:
    """Does the body return its carry `i` plus the literal 1?"""
    out, inp = body.outputs[i], body.inputs[nb + i]
    p = out.producer
    if p is None or p.name != "add":
        return False
    a, b = p.inputs
    return (a is inp and _scalar(b) == 1) or (b is inp and _scalar(a) == 1)


# ---- the rewrite ----------------------------------------------------------------------------

def _rewrite(graph: Graph, node: Node, steps: int | None, memory, where: str) -> None:
    nc, nb = node.params["cond_nconsts"], node.params["body_nconsts"]
    cond_j, body_j = node.regions["cond"].to_jaxpr(), node.regions["body"].to_jaxpr()
    specs = [_jax.spec_of(v.aval) for v in node.inputs]
    loop = bounded_while(cond_j, body_j, nc, nb, steps, memory, specs, where)
    closed = jax.make_jaxpr(loop)(*specs)
    _splice(graph, node, Graph.from_jaxpr(closed))


def _run_while(cond_j, body_j, nc, nb, ops):
    cc, bc, carry = ops[:nc], ops[nc:nc + nb], ops[nc + nb:]
    return lax.while_loop(lambda c: _jax.eval_jaxpr(cond_j, *cc, *c)[0],
                          lambda c: list(_jax.eval_jaxpr(body_j, *bc, *c)), list(carry))


def _bounded_form(cond_j, body_j, nc, nb, steps, select: bool = False):
    """ops -> (*carry after at most `steps` steps, still running?): the while as a scan."""
    def form(*ops):
        cc, bc, carry = ops[:nc], ops[nc:nc + nb], ops[nc + nb:]

        def step(c, _):
            go = _jax.eval_jaxpr(cond_j, *cc, *c)[0]
            # on finished lanes of a vmapped cond (a select) the body still runs: cut its gradient there
            fed = [lax.select(go, x, _no_tangent(x)) if _inexact(_jax.get_aval(x)) else x for x in c]
            if select:     # every step runs the body, finished steps keep their carry
                # and see the body's constants with no tangent too: a 0 * inf there cannot reach their gradient
                kept = [jnp.where(go, k, _no_tangent(k)) if _inexact(_jax.get_aval(k)) else k for k in bc]
                ran = _jax.eval_jaxpr(body_j, *kept, *fed)
                new = [lax.select(go, r, x) for r, x in zip(ran, c)]
            else:
                new = lax.cond(go, lambda a, b: list(_jax.eval_jaxpr(body_j, *bc, *a)), lambda a, b: list(b), fed, c)
            return new, None

        out, _ = lax.scan(step, list(carry), None, length=steps)
        return [*out, _jax.eval_jaxpr(cond_j, *cc, *out)[0]]
    return form


@jax.custom_jvp
def _no_tangent(x):
    """`x` with a zero tangent: `lax.stop_gradient` without its primitive, which JAX's remat transposes under
    `grad(vmap(...))` (a batched cond is a select) and has no transpose rule for (issue 40, finding 1)."""
    return x


@_no_tangent.defjvp
def _no_tangent_jvp(primals, tangents):
    return primals[0], jnp.zeros_like(primals[0])


def _planned(form, specs, memory):
    """`form` with its scan's memory planned by `remat_loops` ("auto" plans as "min": N is only a bound)."""
    g = Graph.from_jaxpr(jax.make_jaxpr(form)(*specs))
    g = remat_loops(g, memory="min" if memory == "auto" else memory)
    closed = g.to_jaxpr()
    return lambda *ops: _jax.eval_jaxpr(closed, *ops)


def _no_bound_message(where: str) -> str:
    return (f"jaxform: jax.grad reached a lax.while_loop in {where or 'the optimized function'} whose trip "
            f"count is data-dependent and has no known bound, so there is nowhere to store its steps for "
            f"the backward pass. Give one: optimize(fn, memory='auto', max_steps=N) with N at least the "
            f"largest trip count (a gradient past N is NaN, never wrong), or write the loop's condition as "
            f"`i < N` on an integer counter starting at a literal, or use lax.scan / "
            f"lax.fori_loop with static bounds. Forward mode (jax.jvp, jacfwd) needs no bound.")


def _exact_tangents(cond_j, body_j, nc, nb, primals, tangents, floats):
    """The float carries' tangents of the `while` itself, as a linear map whose transpose is zero (a
    `_jax.linear_map`): forward mode gets them exactly at any trip count; reverse mode never transposes the
    `while` (JAX cannot), it takes the bounded form's cotangents instead."""
    inexact = [i for i, p in enumerate(primals) if _inexact(_jax.get_aval(p))]
    if not inexact:
        return [jnp.zeros_like(primals[nc + nb + i]) for i in floats]   # never selected where not running

    def while_tangent(res, lin):
        def of(*d):
            ops = list(res)
            for i, x in zip(inexact, d):
                ops[i] = x
            return _run_while(cond_j, body_j, nc, nb, ops)
        t = jax.jvp(of, tuple(res[i] for i in inexact), tuple(lin))[1]
        return [t[i] for i in floats]

    def zero_transpose(res, ct):
        return [jnp.zeros_like(res[i]) for i in inexact]

    # an operand that is no tangent of the trace (zeros JAX instantiated) is a constant: it gets no cotangent
    lin = [tangents[i] for i in inexact]
    return _jax.linear_map(while_tangent, zero_transpose, list(primals), lin)


def bounded_while(cond_j, body_j, nc, nb, steps, memory, specs, where: str = ""):
    """A function of the while's operands: the while itself, with a reverse-differentiable jvp rule.

    The rule is a pure function of its arguments and of jaxprs fixed here (no state between traces).
    """
    floats = [i for i, s in enumerate(specs[nc + nb:]) if _inexact(s)]

    @jax.custom_jvp
    def loop(*ops):
        return _run_while(cond_j, body_j, nc, nb, ops)

    if steps is None:
        guard, message = _jax.transpose_error_primitive(), _no_bound_message(where)

        @loop.defjvp
        def loop_jvp(primals, tangents):
            out, t_out = jax.jvp(lambda *o: _run_while(cond_j, body_j, nc, nb, o), primals, tangents)
            t_out = list(t_out)
            for i in floats:
                t_out[i] = guard.bind(t_out[i], message=message, error=WhileGradError)
            return out, t_out
        return loop

    # every step runs the body, finished lanes keep their carry (a select, not a cond): a cond whose jvp is
    # batched afterwards (grad(vmap(...)): the rule is traced unbatched) gets stop_gradient on its tangent
    # operands from JAX's batching rule, which reverse mode cannot transpose (issue 40, finding 1)
    form = _planned(_bounded_form(cond_j, body_j, nc, nb, steps, select=True), specs, memory)

    @loop.defjvp
    def loop_jvp(primals, tangents):
        res, t_res = jax.jvp(form, primals, tangents)
        # the exact tangents of the while itself: forward mode needs no bound (a tangent past it is exact, as in
        # plain JAX); reverse mode never transposes them (their transpose is zero) and sees the bounded form's,
        # poisoned with NaN where the loop is still running after `steps`
        out = _run_while(cond_j, body_j, nc, nb, primals)
        t_exact = _exact_tangents(cond_j, body_j, nc, nb, primals, tangents, floats)
        running = res[-1]
        poison = jnp.where(running, jnp.nan, 1.0)
        t_out = list(t_res[:-1])
        for k, i in enumerate(floats):
            bounded = t_out[i] * poison.astype(t_out[i].dtype)
            # a tangent has its primal's weak type, as in plain JAX (the poison is a strong float)
            t_out[i] = _jax.with_weak_type(jnp.where(running, t_exact[k], bounded), _jax.get_aval(out[i]).weak_type)
        return out, t_out
    return loop


__all__ = ["while_grad", "with_options", "static_bound", "bounded_while", "check_max_steps", "WhileGradError"]
