"""`discharge(graph)`: a Graph pass that turns Ref-using code into pure code.

Passes and export paths that cannot see refs (new_ref/get/swap/addupdate,
refs closed over by loop bodies) run on the discharged graph instead: each
Ref becomes the value it holds, threaded through the program. JAX's own
discharge rules do the work; this pass adds the checks that make it safe
(the result has no refs left; other effects such as debug prints stay) and keeps the graph's signature.
"""
from __future__ import annotations

from jaxform import _jax
from jaxform.ir import Graph

__all__ = ["discharge"]


def discharge(graph: Graph) -> Graph:
    """A pure Graph computing what `graph` computes.

    Refs created inside the graph (`jax.new_ref`) disappear and the graph keeps
    its inputs and outputs. A Ref *input* becomes an input of the value it
    holds, and its final value is appended as an extra output (JAX's
    convention), so the pytree signature is dropped in that case.
    """
    if not _uses_refs(graph):
        return graph
    closed = graph.to_jaxpr()
    jaxpr = closed.jaxpr
    for v, c in zip(graph.consts, closed.consts):
        if _jax.is_ref_aval(v.aval):
            raise TypeError("jaxform.discharge: the graph closes over a Ref object (a `jax.new_ref` created "
                            "outside the traced function). Its updates cannot become pure values: create the "
                            "ref inside the function, or take its value as an argument and return the new value.")
    for v in jaxpr.outvars:
        if hasattr(v, "aval") and _jax.is_ref_aval(v.aval):
            raise TypeError("jaxform.discharge: the graph returns a Ref; only its value can be discharged. "
                            "Return `ref[...]` instead of the ref.")
    ref_inputs = sum(_jax.is_ref_aval(v.aval) for v in graph.inputs)
    try:
        pure = _jax.discharge_state(closed)
    except NotImplementedError as e:
        raise NotImplementedError(f"jaxform.discharge: JAX has no state discharge rule for a primitive in this "
                                  f"graph ({e}). Keep this graph un-discharged or rewrite that part without refs.") from e
    out = Graph.from_jaxpr(pure)
    _check(graph, out)
    if not ref_inputs:
        out.in_tree, out.out_tree = graph.in_tree, graph.out_tree
    return out


def _uses_refs(graph: Graph) -> bool:
    """Refs anywhere: a Ref-typed value, or an effect on one (Read/Write/Accum target an input).

    Other effects (debug prints, callbacks) are not refs: they stay, as in JAX's own discharge.
    """
    values = [*graph.inputs, *graph.consts]
    for node, _ in graph.walk():
        if any(_jax.input_effect_target(e) is not None for e, _ in node.effects):
            return True
        values += node.inputs + node.outputs
    return any(_jax.is_ref_aval(v.aval) for v in values)


def _check(before: Graph, after: Graph) -> None:
    """Refuse a result that still holds refs or effects, or whose signature moved."""
    if _uses_refs(after):
        raise RuntimeError("jaxform internal error: discharge left refs in the graph; please report.")
    strip = lambda a: a.inner_aval if _jax.is_ref_aval(a) else a
    ins = [strip(a).strip_weak_type() for a in before.in_avals]
    outs = [a.strip_weak_type() for a in before.out_avals]
    outs += [strip(a).strip_weak_type() for a in before.in_avals if _jax.is_ref_aval(a)]
    got_in = [a.strip_weak_type() for a in after.in_avals]
    got_out = [a.strip_weak_type() for a in after.out_avals]
    if got_in != ins or got_out != outs:
        raise RuntimeError(f"jaxform internal error: discharge changed the signature {ins} -> {outs} into "
                           f"{got_in} -> {got_out}; please report.")
