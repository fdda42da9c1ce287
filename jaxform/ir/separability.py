"""Per-step separability: can an equation over stacked values run one step at a time?

A *stacked* value has a scan axis: `ys` of a scan (axis 0), or anything
computed from it that keeps that axis whole (`ys.T`, `ys @ V`, `log_softmax(ys)`).
An equation over stacked operands is *separable* when step t of its result
(along the result's scan axis) is a function of step t of its operands only;
then it can run inside the scan body on per-step values. Per primitive:

    elementwise (incl. stop_gradient, select_n, clamp, convert, reduce_precision)  axis a -> a
    dot_general, scan axis a free or batch (never contracted)                     a -> its place in the result
    transpose / reshape / broadcast_in_dim / squeeze that keep the axis whole      a -> where it goes
    reductions, argmax, cumulative ops, rev, sort over other axes                  a -> a minus reduced axes before it
    slice / dynamic_slice / pad / concatenate / gather not indexing the scan axis  a -> a (or its batch position)
    pjit, closed_call, remat, custom_jvp_call                                      recursively on the body

`axes` below is one entry per operand: the position of the scan axis, or
None for an operand that is the same at every step (a loop constant).
`out_axes(node, axes, length)` says where the axis goes in each result (None:
not separable); `emit_step(g, node, ins, axes, length)` adds the per-step
equation(s) to `g`, given per-step operands (the scan axis removed). Call-like
nodes move whole: the body is rewritten per step and a custom_jvp rule is the
original rule restricted to one step (its jvp jaxpr, made per-step the same way),
so custom derivatives stay exactly the user's.

`effect_free(v)`: v's computation involves no effectful node (ref reads/writes,
callbacks, debug prints, RNG state); passes must not move such computations.
"""
from __future__ import annotations

import math
from typing import Sequence

from .. import _jax
from . import identity
from .graph import Graph, Node, Value

UNARY = frozenset({
    "neg", "sign", "floor", "ceil", "round", "is_finite", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "abs",
    "sqrt", "rsqrt", "cbrt", "square", "integer_pow", "one_minus_square", "not", "real", "imag", "conj", "lgamma",
    "digamma", "erf", "erfc", "erf_inv", "bessel_i0e", "bessel_i1e", "convert_element_type", "reduce_precision", "copy", "copy_p",
    "population_count", "clz", "stop_gradient"})
BINARY = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "and", "or", "xor",
    "eq", "ne", "lt", "le", "gt", "ge", "shift_left", "shift_right_logical", "shift_right_arithmetic", "complex",
    "igamma", "igammac", "polygamma", "zeta"})
ELEMENTWISE = UNARY | BINARY | frozenset({"select_n", "clamp"})
AXES_REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                             "reduce_xor", "argmax", "argmin"})
CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
CALL_LIKE = frozenset({"pjit", "jit", "closed_call", "core_call", "eval_jaxpr", "remat2", "checkpoint", "custom_jvp_call"})


class NotSeparable(Exception):
    """The equation's result at step t needs other steps of its operands (or it cannot move)."""


def effect_free(v: Value) -> bool:
    """Is `v` computed without any impure node (transitively)? The IR's one rule, `identity.effect_free`.

    A value that reads a ref or follows a callback must not be computed
    elsewhere (e.g. before a scan that writes that ref): its order is fixed.
    """
    return identity.effect_free([v])


def _drop(seq, i):
    return tuple(x for j, x in enumerate(seq) if j != i)


def _renum(dims, a):
    """Dimension numbers of an array after removing axis a (a itself must not be among them)."""
    return tuple(d - (d > a) for d in dims)


def _the_axis(axes):
    got = {a for a in axes if a is not None}
    if len(got) != 1:
        raise NotSeparable("operands disagree on the scan axis" if got else "no stacked operand")
    return got.pop()


# ---- operand axes: where an outside operand must have the scan axis -----------------------

def operand_axes(node: Node, known: dict[int, int], length: int) -> list:
    """Fill in the scan axis of each operand given those of the stacked ones (`known`: index -> axis).

    An operand not in `known` gets the axis it must be sliced along per step
    (it has `length` or 1 there) or None when every step uses all of it.
    """
    name, ins = node.name, node.inputs
    axes = [known.get(i) for i in range(len(ins))]
    if name in ELEMENTWISE or name in ("concatenate",):
        a = _the_axis(axes)
        return [known.get(i, None if ins[i].aval.ndim == 0 else a) for i in range(len(ins))]
    if name == "dot_general":
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        if 0 in known and 1 not in known and known[0] in lb:
            axes[1] = rb[lb.index(known[0])]
        elif 1 in known and 0 not in known and known[1] in rb:
            axes[0] = lb[rb.index(known[1])]
        return axes
    if name == "gather":
        dn = node.params["dimension_numbers"]
        ob, ib = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
        if 0 in known and 1 not in known and known[0] in ob:
            axes[1] = ib[ob.index(known[0])]
        elif 1 in known and 0 not in known and known[1] in ib:
            axes[0] = ob[ib.index(known[1])]
        return axes
    if name in ("select_and_scatter_add",):
        raise NotSeparable(name)
    # everything else: outside operands (indices of dynamic_slice, padding values, call operands) are constants
    return axes


# ---- out axes ----------------------------------------------------------------------------

def out_axes(node: Node, axes: Sequence, length: int) -> list | None:
    """The scan axis of each result, or None if `node` is not separable along these operand axes."""
    try:
        return _rule(node, list(axes), length)[0]
    except NotSeparable:
        return None


def why_not(node: Node, axes: Sequence, length: int) -> str:
    """Why `node` is not separable (for explain): '' if it is."""
    try:
        _rule(node, list(axes), length)
        return ""
    except NotSeparable as e:
        return str(e) or node.name


def _rule(node: Node, axes: list, length: int):
    """(out_axes, params of the per-step equation, per-step regions or None)."""
    if node.effects:
        raise NotSeparable(f"{node.name} has effects (its order is fixed)")
    name, p, ins = node.name, node.params, node.inputs
    if all(a is None for a in axes):
        raise NotSeparable("no stacked operand")
    for v, a in zip(ins, axes):
        if a is not None and not (0 <= a < v.aval.ndim and v.aval.shape[a] in (length, 1)):
            raise NotSeparable(f"operand has no scan axis at {a}")
    if name in ELEMENTWISE:
        a = _the_axis(axes)
        for v, b in zip(ins, axes):
            if b is None and v.aval.ndim != 0:
                raise NotSeparable("a non-scalar operand without the scan axis")
        return [a], p, None
    if name in AXES_REDUCTIONS:
        (a,), red = axes, tuple(p["axes"])
        if a in red:
            raise NotSeparable(f"{name} over the scan axis")
        return [a - sum(r < a for r in red)], {**p, "axes": _renum(red, a)}, None
    if name in CUMULATIVE:
        (a,) = axes
        if p["axis"] == a:
            raise NotSeparable(f"{name} along the scan axis")
        return [a], {**p, "axis": p["axis"] - (p["axis"] > a)}, None
    if name == "transpose":
        (a,), perm = axes, tuple(p["permutation"])
        return [perm.index(a)], {**p, "permutation": tuple(d - (d > a) for d in perm if d != a)}, None
    if name == "broadcast_in_dim":
        (a,), dims, shape = axes, tuple(p["broadcast_dimensions"]), tuple(p["shape"])
        if len(ins) != 1:
            raise NotSeparable("dynamic broadcast")
        b = dims[a]
        if shape[b] != ins[0].aval.shape[a]:
            raise NotSeparable("broadcast along the scan axis")
        return [b], {**p, "shape": _drop(shape, b), "broadcast_dimensions": _renum(_drop(dims, a), b)}, None
    if name == "reshape":
        (a,), s, new = axes, ins[0].aval.shape, tuple(p["new_sizes"])
        if p.get("dimensions") is not None or len(ins) != 1:
            raise NotSeparable("reshape with dimensions")
        pre = math.prod(s[:a])
        for b in range(len(new)):
            if math.prod(new[:b]) == pre and new[b] == s[a]:
                return [b], {**p, "new_sizes": _drop(new, b)}, None
        raise NotSeparable("reshape merges or splits the scan axis")
    if name == "squeeze":
        (a,), dims = axes, tuple(p["dimensions"])
        if a in dims:
            raise NotSeparable("squeeze of the scan axis")
        return [a - sum(d < a for d in dims)], {**p, "dimensions": _renum(dims, a)}, None
    if name == "rev":
        (a,), dims = axes, tuple(p["dimensions"])
        if a in dims:
            raise NotSeparable("rev along the scan axis")
        return [a], {**p, "dimensions": _renum(dims, a)}, None
    if name == "slice":
        (a,), lo, hi, st = axes, p["start_indices"], p["limit_indices"], p["strides"]
        if lo[a] != 0 or hi[a] != ins[0].aval.shape[a] or (st is not None and st[a] != 1):
            raise NotSeparable("slice along the scan axis inside a call (such slices fuse after inline: ir/steps.py)")
        return [a], {**p, "start_indices": _drop(lo, a), "limit_indices": _drop(hi, a),
                     "strides": None if st is None else _drop(st, a)}, None
    if name == "dynamic_slice":
        a, sizes = axes[0], tuple(p["slice_sizes"])
        if a is None or any(b is not None for b in axes[1:]) or sizes[a] != ins[0].aval.shape[a]:
            raise NotSeparable("dynamic_slice indexes the scan axis")
        return [a], {**p, "slice_sizes": _drop(sizes, a)}, None
    if name == "pad":
        a, cfg = axes[0], tuple(p["padding_config"])
        if a is None or axes[1] is not None or tuple(cfg[a]) != (0, 0, 0):
            raise NotSeparable("pad along the scan axis")
        return [a], {**p, "padding_config": _drop(cfg, a)}, None
    if name == "concatenate":
        a = _the_axis(axes)
        if p["dimension"] == a or any(b is None for b in axes):
            raise NotSeparable("concatenate along the scan axis")
        return [a], {**p, "dimension": p["dimension"] - (p["dimension"] > a)}, None
    if name == "sort":
        a = _the_axis(axes)
        if p["dimension"] == a or any(b != a for b in axes):
            raise NotSeparable("sort along the scan axis")
        return [a] * len(node.outputs), {**p, "dimension": p["dimension"] - (p["dimension"] > a)}, None
    if name == "dot_general":
        return _dot_general(node, axes)
    if name == "gather":
        return _gather(node, axes)
    if name in CALL_LIKE:
        return _call(node, axes, length)
    raise NotSeparable(f"{name} is not known to be step-by-step")


def _dot_general(node, axes):
    p = node.params
    (lc, rc), (lb, rb) = p["dimension_numbers"]
    lc, rc, lb, rb = map(tuple, (lc, rc, lb, rb))
    la, ra = axes
    nl, nr = node.inputs[0].aval.ndim, node.inputs[1].aval.ndim
    lfree = [d for d in range(nl) if d not in lc and d not in lb]
    rfree = [d for d in range(nr) if d not in rc and d not in rb]
    if la in lc or ra in rc:
        raise NotSeparable("dot_general contracts the scan axis")
    if la is not None and ra is not None:
        if la not in lb or ra not in rb or lb.index(la) != rb.index(ra):
            raise NotSeparable("both dot_general operands are stacked, not along one batch dimension")
        i = lb.index(la)
        dn = ((_renum(lc, la), _renum(rc, ra)), (_renum(_drop(lb, i), la), _renum(_drop(rb, i), ra)))
        return [i], {**p, "dimension_numbers": dn}, None
    if la is not None:
        if la in lb:
            raise NotSeparable("dot_general batch operand without its stacked partner")
        dn = ((_renum(lc, la), rc), (_renum(lb, la), rb))
        return [len(lb) + lfree.index(la)], {**p, "dimension_numbers": dn}, None
    if ra in rb:
        raise NotSeparable("dot_general batch operand without its stacked partner")
    dn = ((lc, _renum(rc, ra)), (lb, _renum(rb, ra)))
    return [len(lb) + len(lfree) + rfree.index(ra)], {**p, "dimension_numbers": dn}, None


def _gather(node, axes):
    p = node.params
    dn = p["dimension_numbers"]
    oa, ia = axes
    ob, ib = tuple(dn.operand_batching_dims), tuple(dn.start_indices_batching_dims)
    offset = tuple(dn.offset_dims)
    out_rank = node.outputs[0].aval.ndim
    batch_pos = [d for d in range(out_rank) if d not in offset]   # output positions of indices dims[:-1]
    nidx = node.inputs[1].aval.ndim
    if ia is None and oa is not None:   # the scan axis is a whole offset (window) dim of the operand: x[..., 0]
        collapsed, smap = tuple(dn.collapsed_slice_dims), tuple(dn.start_index_map)
        if oa in smap or oa in collapsed or oa in ob or p["slice_sizes"][oa] != node.inputs[0].aval.shape[oa]:
            raise NotSeparable("gather indexes the scan axis")
        window = [d for d in range(node.inputs[0].aval.ndim) if d not in collapsed and d not in ob]
        b = offset[window.index(oa)]
        new = dn._replace(offset_dims=_renum(_drop(offset, window.index(oa)), b),
                          collapsed_slice_dims=_renum(collapsed, oa), start_index_map=_renum(smap, oa),
                          operand_batching_dims=_renum(ob, oa))
        return [b], {**p, "dimension_numbers": new, "slice_sizes": _drop(tuple(p["slice_sizes"]), oa)}, None
    if ia is None or ia == nidx - 1:
        raise NotSeparable("gather indexes the scan axis")
    b = batch_pos[ia]
    if oa is not None:
        if oa not in ob or ia not in ib or ob.index(oa) != ib.index(ia):
            raise NotSeparable("gather indexes the scan axis of its operand")
        i = ob.index(oa)
        new = dn._replace(offset_dims=_renum(offset, b), collapsed_slice_dims=_renum(dn.collapsed_slice_dims, oa),
                          start_index_map=_renum(dn.start_index_map, oa), operand_batching_dims=_renum(_drop(ob, i), oa),
                          start_indices_batching_dims=_renum(_drop(ib, i), ia))
        return [b], {**p, "dimension_numbers": new, "slice_sizes": _drop(tuple(p["slice_sizes"]), oa)}, None
    if ia in ib:
        raise NotSeparable("gather batch indices without their stacked operand")
    new = dn._replace(offset_dims=_renum(offset, b), start_indices_batching_dims=_renum(ib, ia))
    return [b], {**p, "dimension_numbers": new}, None


# ---- call-like: the body per step -------------------------------------------------------

def _call(node, axes, length):
    p = dict(node.params)
    for key in ("in_shardings", "out_shardings"):
        if key in p and not all(_jax.is_unspecified(s) for s in p[key]):
            raise NotSeparable(f"{node.name} with explicit shardings")
    body = node.regions["body"]
    if node.name == "custom_jvp_call":
        nc = p["num_consts"]
        if any(a is not None for a in axes[:nc]):
            raise NotSeparable("custom_jvp_call consts are stacked")
    step, oaxes = step_graph(body, axes, length)
    if any(a is None for a in oaxes):
        raise NotSeparable(f"a result of {node.name} is the same at every step")
    if node.name == "custom_jvp_call":
        orig = p["jvp_jaxpr_fun"]
        p["jvp_jaxpr_fun"] = _step_jvp(orig, axes, oaxes, length)
        if not _VALIDATING:   # (only the outermost: a rule's own jaxpr calls the function again, e.g. relu)
            _VALIDATING.add(id(orig))
            try:   # the rule with all tangents nonzero must be step-by-step too (checked now, not at grad time)
                p["jvp_jaxpr_fun"].call_wrapped(*[False] * len(axes))
            except ValueError as e:
                raise NotSeparable(f"custom_jvp rule of {p.get('name', node.name)} is not step-by-step") from e
            finally:
                _VALIDATING.discard(id(orig))
    return oaxes, p, {"body": step}


_VALIDATING: set = set()


def _step_jvp(jvp_fun, axes, oaxes, length):
    """The original custom jvp rule, one step at a time: its jvp jaxpr (traced at the stacked
    shapes, as JAX would) made per-step like any body. Fails at differentiation time, with a
    clear message, if the user's rule is not itself step-by-step."""
    import jax.extend.linear_util as lu
    memo: dict = {}

    def thunk(*in_zeros):
        if in_zeros not in memo:
            jaxpr, consts, out_zeros = jvp_fun.call_wrapped(*in_zeros)
            g = Graph.from_jaxpr(jaxpr, consts)
            nz = [a for a, z in zip(axes, in_zeros) if not z]
            g_axes = [None] * len(g.consts) + list(axes) + nz
            g.inputs = g.consts + g.inputs   # consts become leading inputs, invariant
            g.consts = []
            try:
                step, got = step_graph(g, g_axes, length)
            except NotSeparable as e:
                raise ValueError(f"jaxform: fuse_scan_reductions moved a custom_jvp function into a scan body "
                                 f"but its jvp rule is not step-by-step ({e}); run without "
                                 "fuse_scan_reductions") from None
            closed = step.to_jaxpr()
            k = len(consts)
            memo[in_zeros] = (_jax_open(closed, k), list(consts), out_zeros)
        return memo[in_zeros]

    return lu.wrap_init(thunk, debug_info=getattr(jvp_fun, "debug_info", None))


def _jax_open(closed, k):
    """A jaxpr whose first k invars (the jvp's consts) become constvars again."""
    j = closed.jaxpr
    assert not j.constvars
    return _jax.Jaxpr(j.invars[:k], j.invars[k:], j.outvars, j.eqns, j.effects, j.debug_info)


def step_graph(g: Graph, axes: Sequence, length: int) -> tuple[Graph, list]:
    """A new graph computing one step of `g` (inputs with axis None are passed whole); raises NotSeparable."""
    ins = [Value(v.aval if a is None else v.aval.update(shape=_drop(v.aval.shape, a))) for v, a in zip(g.inputs, axes)]
    out = Graph(ins, [Value(c.aval, const=c.const) for c in g.consts])
    env: dict[int, tuple[Value, int | None]] = {v.id: (w, a) for v, w, a in zip(g.inputs, ins, axes)}
    env.update({c.id: (w, None) for c, w in zip(g.consts, out.consts)})

    def get(v):
        if v.is_literal:
            return Value(v.aval, literal=v.literal), None
        return env[v.id]

    for n in g.nodes:
        got = [get(v) for v in n.inputs]
        vals, ax = [w for w, _ in got], [a for _, a in got]
        if all(a is None for a in ax):   # the same at every step: copied as is
            if n.effects or any(m.effects for s in n.subgraphs() for m, _ in s.walk()):
                raise NotSeparable(f"{n.name} has effects")
            regions = {k: (tuple(r.copy() for r in s) if isinstance(s, tuple) else s.copy())
                       for k, s in n.regions.items()}
            m = Node(n.prim, vals, [o.aval for o in n.outputs], n.params, regions=regions, effects=(),
                     source_info=n.source_info, ctx=n.ctx)
            out.append(m)
            env.update({o.id: (w, None) for o, w in zip(n.outputs, m.outputs)})
            continue
        known = {i: a for i, a in enumerate(ax) if a is not None}
        full = operand_axes(n, known, length)
        for i, a in enumerate(full):
            if i not in known and a is not None:   # a constant of this body sliced per step
                vals[i] = drop_invariant_axis(out, n.inputs[i], vals[i], a, length, lambda x: get(x)[0])
        res, oax = emit_step(out, n, vals, full, length)
        env.update({o.id: (w, a) for o, w, a in zip(n.outputs, res, oax)})
    outs = [get(v) for v in g.outputs]
    out.set_outputs([w for w, _ in outs])
    return out, [a for _, a in outs]


def drop_invariant_axis(g: Graph, orig: Value, v: Value, a: int, length: int, tr=None) -> Value:
    """The per-step slice of `v` (a value without steps; `orig` its source, `tr` maps source values to `g`'s)
    along axis a: a scalar as is, a size-1 axis squeezed, a broadcast re-done per step; a
    length-`length` axis would need the step index: NotSeparable."""
    s = v.aval.shape
    if v.aval.ndim == 0:
        return v
    b = orig.producer
    if b is not None and b.name == "broadcast_in_dim" and len(b.inputs) == 1 and tr is not None:
        dims = tuple(b.params["broadcast_dimensions"])
        src = b.inputs[0]
        base = tr(src)
        if a in dims:
            base = drop_invariant_axis(g, src, base, dims.index(a), length, tr)
            dims = tuple(d for d in dims if d != a)
        new = g.add("broadcast_in_dim", [base], {**b.params, "shape": _drop(tuple(b.params["shape"]), a),
                                                "broadcast_dimensions": _renum(dims, a)},
                    source_info=b.source_info)
        new.ctx = b.ctx
        return new.outputs[0]
    if s[a] == 1:
        p = orig.producer   # the per-step view of a user value: its line and context
        return g.add("reshape", [v], {"new_sizes": _drop(s, a), "dimensions": None},
                     source_info=p and p.source_info, ctx=p and p.ctx).outputs[0]
    raise NotSeparable("a constant with the scan's length would need the step index")


def emit_step(g: Graph, node: Node, ins: Sequence[Value], axes: Sequence, length: int) -> tuple[list, list]:
    """Add the per-step version of `node` to `g` on per-step operands `ins`; returns (results, their axes)."""
    oax, params, regions = _rule(node, list(axes), length)
    if regions is not None:   # a pure call (effects refused above): results typed by its per-step body
        new = g.append(Node(node.prim, list(ins), [v.aval for v in regions["body"].outputs], params,
                            regions=regions, source_info=node.source_info, ctx=node.ctx))
        return new.outputs, oax
    new = g.add(node.prim, list(ins), params, source_info=node.source_info)
    new.ctx = node.ctx
    keep_varying(new)
    return new.outputs, oax


def varying(aval) -> frozenset:
    """The manual mesh axes (shard_map) along which values of this type differ between devices."""
    mat = getattr(aval, "mat", None)
    return frozenset(getattr(mat, "varying", None) or getattr(aval, "vma", None) or ())


def keep_varying(node: Node) -> None:
    """Results of a non-collective equation vary over the devices wherever its operands do. Abstract
    evaluation outside shard_map's tracing context drops that part of the type; put it back."""
    src = max((v.aval for v in node.inputs), key=lambda a: len(varying(a)), default=None)
    for o in node.outputs:
        if src is not None and not varying(src) <= varying(o.aval):
            o.aval = like_varying(o.aval, src)


def like_varying(aval, src):
    """`aval` typed as varying over the devices (shard_map) as `src` is: its manual mesh and varying axes."""
    sh = src.sharding
    spec = type(sh.spec)(*[None] * aval.ndim)
    mat = src.mat
    return aval.update(sharding=type(sh)(sh.mesh, spec), manual_axis_type=type(mat)(
        varying=varying(src) | varying(aval), unreduced=mat.unreduced, reduced=mat.reduced))
