"""Loops over refs read as scans: JAX 0.12's `Scan3` becomes the `scan` every loop pass knows.

With `jax_scan3` on, `lax.scan` traces to

    r = new_ref init ;  ys = Scan3[extensives, length, jaxpr] r consts xs ;  c = r[...]

(the carry lives in a Ref the body reads and writes; no carry parameter). When
each carry ref is *local* -- made by a `new_ref` in the same graph, passed to
this one loop once, and otherwise only read whole after it -- nothing but the
loop can see the ref, so its contents are just a carry: the body is discharged
(ref inputs -> values, final values -> extra outputs: JAX's state discharge)
and the loop is rebuilt as `scan(consts | carry=init | xs)`, the final reads
become the scan's carry results. Fusion, hoisting, fission, `thin_residuals`
and `remat_loops` then apply through `ir.loops.ScanLoop` as to any scan.

Why a `scan` back and not a `Scan3`: on JAX 0.12 `Scan3` has no vjp or batching
rule (grad and vmap of it raise), while `scan` equations bind, differentiate and
batch with the flag on or off; the rewritten program is the same function.

Anything not provably local stays as it was (never wrong): a ref that is a
graph input or output, passed twice (aliased), written or read elsewhere or
before the loop, read partially; an extensive ref; a body JAX cannot
discharge (a nested `Scan3` writing an outer carry ref). A `reverse` Scan3 also
stays: JAX 0.12 ignores `reverse` when it runs one (it scans forward), and a
rewrite must compute what the program computes. Nested loops are rewritten
from the inside out (JAX has no discharge rule for a Scan3).
"""
from __future__ import annotations

import functools

from jaxform import _jax
from jaxform.ir import Graph, Node

__all__ = ["scans_from_ref_loops", "ref_loop_reason", "has_ref_loops"]


def has_ref_loops(graph: Graph) -> bool:
    """Does `graph` hold a Scan3 anywhere (cheap: what `run_passes` asks before reading them)?"""
    return any(_jax.scan3_loop(n.params) is not None for n, _ in graph.walk())


def scans_from_ref_loops(graph: Graph) -> Graph:
    """Every `Scan3` with local carry refs in `graph` (and its sub-graphs) as a pure `scan`; in place."""
    _rewrite(graph)
    return graph


def _rewrite(g: Graph) -> None:
    for node in list(g.nodes):
        if node.dead:
            continue
        if _jax.scan3_loop(node.params) is not None:
            if ref_loop_reason(g, node) is None:
                _to_scan(g, node)
            continue
        for sub in node.subgraphs():
            _rewrite(sub)


def ref_loop_reason(g: Graph, node: Node) -> str | None:
    """Why this Scan3 cannot be read as a scan (None: it can)."""
    extensives, _, _, reverse, _ = _jax.scan3_loop(node.params)
    if reverse:
        return "reverse=True (JAX 0.12 runs a Scan3 forward whatever `reverse` says)"
    nodes = g.nodes
    at = nodes.index(node)
    refs = [v for v in node.inputs if _jax.is_ref_aval(v.aval)]
    if len({v.id for v in refs}) != len(refs):
        return "a ref is passed twice (aliased)"
    for i, v in enumerate(node.inputs):
        if not _jax.is_ref_aval(v.aval):
            continue
        if extensives[i]:
            return "an extensive (scanned-over) ref"
        p = v.producer
        if p is None or p.name != "new_ref" or p.dead or p not in nodes:
            return "a carry ref not made by new_ref in this graph"
        for user, _ in v.uses:
            if user is node:
                continue
            if not isinstance(user, Node):
                return "a carry ref is an output of the graph"
            if not _full_read(user, v) or user not in nodes or nodes.index(user) < at:
                return f"a carry ref is also used by {user.name} (not a whole read after the loop)"
    return None


@functools.cache
def _whole_read_tree():
    import jax
    import numpy as np
    (eqn,) = [e for e in jax.make_jaxpr(lambda: jax.new_ref(np.zeros(1, np.float32))[...])().eqns
              if e.primitive.name == "get"]
    return eqn.params["tree"]


def _full_read(n: Node, ref) -> bool:
    return (n.name == "get" and len(n.inputs) == 1 and n.inputs[0] is ref and
            n.params.get("tree") == _whole_read_tree() and
            n.outputs[0].aval.shape == ref.aval.inner_aval.shape)


def _to_scan(g: Graph, node: Node) -> Node | None:
    """Replace `node` (a Scan3 `ref_loop_reason` accepted) by a scan; None if its body cannot be discharged."""
    extensives, length, body, _, unroll = _jax.scan3_loop(node.params)
    is_ref = [_jax.is_ref_aval(v.aval) for v in node.inputs]
    inner = Graph.from_jaxpr(body)
    if has_ref_loops(inner):      # inner loops first: JAX has no discharge rule for a Scan3
        body = scans_from_ref_loops(inner).to_jaxpr()
    try:
        pure = _jax.discharge_state(body, should_discharge=is_ref)
    except Exception:   # noqa: BLE001 - no discharge rule for something in the body: leave the loop as it is
        return None
    bg = Graph.from_jaxpr(pure)
    n_ys = len(body.out_avals)
    ys_out, ref_out = bg.outputs[:n_ys], bg.outputs[n_ys:]
    pos = range(len(node.inputs))
    consts = [i for i in pos if not is_ref[i] and not extensives[i]]
    carry = [i for i in pos if is_ref[i]]
    xs = [i for i in pos if extensives[i]]
    init = [node.inputs[i].producer.inputs[0] for i in carry]
    # the carry's type is the ref's, in and out of the body (up to weak types: new_ref makes a weak init
    # strong, 0.10's discharge hands the body a weak one; scan's type rule ignores them)
    for k, i in enumerate(carry):
        want = node.inputs[i].aval.inner_aval.strip_weak_type()
        if not all(a.strip_weak_type() == want for a in (bg.inputs[i].aval, ref_out[k].aval, init[k].aval)):
            return None
    bg.inputs = [bg.inputs[i] for i in consts + carry + xs]
    bg.set_outputs(list(ref_out) + list(ys_out))
    params = _jax.scan_params(length=length, reverse=False, unroll=unroll, num_consts=len(consts),
                              num_carry=len(carry), num_operands=len(node.inputs))
    init_vals = [_as_type(g, v, node) for v in init]
    scan = g.add("scan", [node.inputs[i] for i in consts] + init_vals + [node.inputs[i] for i in xs], params,
                 regions={"body": bg}, source_info=node.source_info, ctx=node.ctx, before=node)
    finals, ys = scan.outputs[:len(carry)], scan.outputs[len(carry):]
    for old, new in zip(node.outputs, ys):
        g.replace_uses(old, new)
    news = [node.inputs[i].producer for i in carry]
    for k, i in enumerate(carry):
        ref = node.inputs[i]
        for user, _ in list(ref.uses):
            if user is not node:          # a whole read after the loop: the final carry
                g.replace_uses(user.outputs[0], finals[k])
                g.remove(user)
    g.remove(node)
    for n in news:
        if not any(o.uses for o in n.outputs):
            g.remove(n)
    return scan


def _as_type(g: Graph, v, node: Node):
    """The init as the ref holds it (new_ref drops a weak type; scan wants carry in == carry out)."""
    if not getattr(v.aval, "weak_type", False):
        return v
    import numpy as np
    n = g.add("convert_element_type", [v], {"new_dtype": np.dtype(v.aval.dtype), "weak_type": False,
                                             "sharding": None}, source_info=node.source_info, ctx=node.ctx,
              before=node)
    return n.outputs[0]
