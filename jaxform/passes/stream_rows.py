"""Stream a loop's in-place buffer: carry only the rows a step touches (issue 29, seed 000).

    def body(i, r):                      # the seed's cumsum, as a for_loop over a ref
        r[i + 1] += r[i]

A `for_loop` over a ref (and JAX's `Scan3`) is discharged into a `scan` that
carries the whole buffer and reads/writes row `i + k` of it with
`dynamic_slice`/`dynamic_update_slice`. Step t touches only rows
`c0 + t + k` for k in a small constant set K, so at any time only the window of
rows `[t + min K, t + max K]` is live in the loop:

    window  carried rows  [t + min K, t + max K)       (rows earlier steps wrote)
    stream  row t + max K of the initial buffer        (no earlier step touched it): a new xs
    emit    row t + min K after the step               (no later step touches it): a new ys

and the final buffer is `buffer0[:c0 + min K] ++ ys ++ window ++ buffer0[c0 + L + max K:]`. The loop
now carries `|K|` rows instead of N, and the finished rows leave as a `ys` stack,
which fusion (`fuse_scan_reductions`, which splits a reduction over such a
concatenation per part) can reduce step by step: the seed's `sum(cumsum(x)**2)`
runs in O(1) memory, as the equivalent `lax.scan` does after fusion.

Exact: the same primitives run on the same row values; only where the rows live
changes. Whether it pays is the planner's decision (a streamed buffer that
nobody reduces costs an extra stack); its lookahead judges it together with the
fusion it enables.

Left unchanged: reverse loops, a counter that does not start at a constant or
step by 1, an index that is not `counter + constant` (through JAX's
negative-index wrap), any other use of the buffer in the body (a whole-buffer
read, a use inside a `cond`/sub-graph, two writes from one version), rows that
could fall outside the buffer at some step (JAX would clamp the index), and
length-0 loops.
"""
from __future__ import annotations

import jax.numpy as jnp

import numpy as np

from ..ir import Graph, Node, ScanLoop, Value
from ..ir.graph import OUT
from .registry import register


@register(exact=True, loops=True)
def stream_rows(graph: Graph) -> Graph:
    """Carry only the window of rows each step touches, for every scan whose buffer carry allows it."""
    for node in list(graph.nodes):
        for sub in node.subgraphs():
            stream_rows(sub)
        if node.name == "scan" and not node.dead:
            loop = ScanLoop(node)
            j = 0
            while j < loop.num_carry:
                if not _stream(graph, loop, j):
                    j += 1
    return graph


def _counters(loop: ScanLoop) -> list[tuple[Value, int]]:
    """(body input, value at step 0) of the carries that start at a constant integer and add 1 each step."""
    out = []
    for init, inner, nxt in zip(loop.carry, loop.body_carry, loop.body_carry_out):
        start = init.literal if init.is_literal else init.const if init.is_const else None
        p = nxt.producer
        if start is None or inner.aval.shape or not jnp.issubdtype(inner.aval.dtype, np.integer) or \
                p is None or p.name != "add" or inner not in p.inputs:
            continue
        if _lit(p.inputs[1 - p.inputs.index(inner)]) == 1:
            out.append((inner, int(np.asarray(start))))
    return out


def _lit(v: Value):
    return int(v.literal) if v.is_literal and jnp.issubdtype(np.asarray(v.literal).dtype, np.integer) else None


def _affine(v: Value, counter: Value, n: int, bound: int) -> tuple[int, int] | None:
    """(c, k) with c in {0, 1} such that v == c * counter + k at every step, else None. Sees through
    JAX's wrap of a negative index, `select_n(x < 0, x, x + n)`: the caller proves every row in [0, n).
    Arithmetic on the counter must run in a signed dtype holding +-`bound` (nothing wraps)."""
    if v is counter:
        return 1, 0
    if (k := _lit(v)) is not None or (v.is_literal and v.aval.dtype == np.bool_ and (k := int(v.literal)) + 1):
        return 0, k
    p = v.producer
    if p is not None and p.name == "convert_element_type" and jnp.issubdtype(v.aval.dtype, np.signedinteger) and \
            jnp.issubdtype(p.inputs[0].aval.dtype, np.signedinteger) and \
            np.iinfo(v.aval.dtype).bits >= np.iinfo(p.inputs[0].aval.dtype).bits:
        return _affine(p.inputs[0], counter, n, bound)       # a widening (or same-width) signed convert
    if p is None or len(p.inputs) not in (2, 3) or p.name not in ("add", "sub", "lt", "select_n"):
        return None
    ins = [_affine(u, counter, n, bound) for u in p.inputs]
    if p.name == "select_n":
        if ins[0] is not None and ins[0][0] == 0:
            return ins[2] if ins[0][1] else ins[1]           # a constant predicate picks one case
        q, x, y = p.inputs[0].producer, ins[1], ins[2]
        if q is not None and q.name == "lt" and q.inputs[0] is p.inputs[1] and _lit(q.inputs[1]) == 0 and \
                x is not None and y is not None and x[0] == y[0] == 1 and y[1] == x[1] + n:
            return x                                         # the wrap of an index that is never negative
        return None
    if None in ins:
        return None
    (ca, ka), (cb, kb) = ins
    if (ca or cb) and not _holds(v if p.name != "lt" else p.inputs[0], bound):
        return None
    if p.name == "lt":
        return (0, int(ka < kb)) if ca == cb == 0 else None
    c, k = (ca + cb, ka + kb) if p.name == "add" else (ca - cb, ka - kb)
    return (c, k) if c in (0, 1) else None


def _offset(v: Value, counter: Value, n: int, bound: int) -> int | None:
    """k such that v == counter + k at every step, else None."""
    a = _affine(v, counter, n, bound)
    return a[1] if a is not None and a[0] == 1 else None


def _zero(v: Value, counter: Value, n: int, bound: int) -> bool:
    return _affine(v, counter, n, bound) == (0, 0)


MAX_OFFSET = 1024          # a window of rows, not a second buffer
SCATTERS = {"scatter": None, "scatter-add": "add"}   # `x.at[i].set(v)`, `x.at[i].add(v)`: the row's new value


def _row_access(n: Node, buf: Value, counter: Value, size: int, bound: int) -> int | None:
    """Offset k if `n` reads (`dynamic_slice`) or writes (`dynamic_update_slice`, `.at[i].set/add`'s
    scatter, with the buffer as the operand) one whole row `counter + k` of `buf` along axis 0; else None."""
    shape = buf.aval.shape
    if n.inputs[0] is not buf or any(v is buf for v in n.inputs[1:]):
        return None
    if n.name == "dynamic_slice" and tuple(n.params["slice_sizes"]) == (1, *shape[1:]):
        idx = n.inputs[1:]
    elif n.name == "dynamic_update_slice" and n.inputs[1].aval.shape == (1, *shape[1:]):
        idx = n.inputs[2:]
    elif n.name in SCATTERS and _one_row_scatter(n, shape):
        p = n.inputs[1].producer
        idx = [p.inputs[0]] + [Graph.literal(0, np.int32)] * (len(shape) - 1)
    else:
        return None
    if len(idx) != len(shape) or not all(_zero(i, counter, size, bound) for i in idx[1:]):
        return None
    k = _offset(idx[0], counter, size, bound)
    return k if k is not None and abs(k) <= MAX_OFFSET else None


def _one_row_scatter(n: Node, shape) -> bool:
    """A scatter of one row at a scalar index along axis 0 (what `x.at[i]` with a traced scalar i builds)."""
    dn, ind, upd = n.params["dimension_numbers"], n.inputs[1], n.inputs[2]
    p = ind.producer
    return tuple(ind.aval.shape) == (1,) and p is not None and p.name in ("broadcast_in_dim", "reshape") and \
        p.inputs[0].aval.shape == () and tuple(upd.aval.shape) == tuple(shape[1:]) and \
        tuple(dn.update_window_dims) == tuple(range(len(shape) - 1)) and tuple(dn.inserted_window_dims) == (0,) and \
        tuple(dn.scatter_dims_to_operand_dims) == (0,) and not getattr(dn, "operand_batching_dims", ()) and \
        not n.params.get("update_consts")


def _written(body: Graph, n: Node, old: Value, rest) -> Value:
    """The row's value after write `n`, whose old value is `old` (shape `rest`)."""
    if n.name == "dynamic_update_slice":
        return body.add("reshape", [n.inputs[1]], {"new_sizes": tuple(rest), "dimensions": None, "sharding": None},
                        source_info=n.source_info, ctx=n.ctx).outputs[0]
    upd = n.inputs[2]
    if SCATTERS[n.name] is None:
        return upd
    return body.add(SCATTERS[n.name], [old, upd], source_info=n.source_info, ctx=n.ctx).outputs[0]


def _holds(v: Value, bound: int) -> bool:
    """Is `v` a signed integer whose dtype holds +-bound (index arithmetic in it cannot wrap)?"""
    return jnp.issubdtype(v.aval.dtype, np.signedinteger) and np.iinfo(v.aval.dtype).max >= bound


def _chain(buf: Value, counter: Value, step: set[int], bound: int):
    """(reads, writes, offsets, last version) if `buf` is only read and written row-wise at `counter + k`
    by the step's own nodes (`step`: not from inside a cond or call), its writes one chain of versions;
    else None."""
    size = buf.aval.shape[0]
    reads, writes, offsets, version = [], [], {}, buf
    while True:
        nxt = None
        for u, _ in version.uses:
            if u is OUT:
                continue
            k = _row_access(u, version, counter, size, bound) if id(u) in step else None
            if k is None or (u.name != "dynamic_slice" and nxt not in (None, u)):
                return None
            offsets[id(u)] = k
            if u.name == "dynamic_slice":
                reads.append(u) if u not in reads else None
            else:
                nxt = u
        if nxt is None:
            return reads, writes, offsets, version
        if version.is_output:
            return None     # an intermediate version is a result of the step: not one chain
        writes.append(nxt)
        version = nxt.outputs[0]


def _anatomy(loop: ScanLoop, j: int):
    """(start, offsets, reads, writes) if carry j is a buffer touched only row-wise, else None."""
    buf = loop.body_carry[j]
    if buf.aval.ndim < 1 or loop.reverse or loop.length == 0 or loop.body_carry_out[j] is buf:
        return None
    size = buf.aval.shape[0]
    # every index value is within +-bound: the counter's range plus the rows plus the offsets
    bound = max((abs(s) for _, s in _counters(loop)), default=0) + loop.length + 2 * size + MAX_OFFSET
    for counter, start in _counters(loop):
        if not _holds(counter, bound):
            continue                           # a narrow counter could wrap around before the last step
        found = _chain(buf, counter, {id(n) for n in loop.body.nodes}, bound)
        if found is None:
            continue
        reads, writes, offsets, last = found
        if last is not loop.body_carry_out[j] or [i for u, i in last.uses if u is OUT] != [j]:
            continue
        ks = list(offsets.values())
        if not ks or start + min(ks) < 0 or start + loop.length - 1 + max(ks) > size - 1:
            continue
        return start, offsets, reads, writes
    return None


def _typed_like(g: Graph, v: Value, like: Value, info) -> Value:
    """v with `like`'s weak type: the loop may type its buffer strongly where the initial one is weak
    (JAX 0.12: `jnp.full((6,), 0.5)` carried is float32, not ~float32), and promotion downstream reads it."""
    if v.aval.weak_type == like.aval.weak_type:
        return v
    return g.add("convert_element_type", [v], {"new_dtype": like.aval.dtype, "weak_type": like.aval.weak_type,
                                                "sharding": None}, **info).outputs[0]


def _stream(graph: Graph, loop: ScanLoop, j: int) -> bool:
    found = _anatomy(loop, j)
    if found is None:
        return False
    start, offsets, reads, writes = found
    body, node = loop.body, loop.node
    lo, hi = min(offsets.values()), max(offsets.values())
    length, buf0, buf = loop.length, loop.carry[j], loop.body_carry[j]
    size, rest = buf0.aval.shape[0], buf0.aval.shape[1:]
    info = dict(source_info=node.source_info, ctx=node.ctx)

    def rows(v: Value, a: int, b: int) -> Value:      # v[a:b] along axis 0, outside the loop, typed as the
        out = graph.add("slice", [v], {"start_indices": (a, *[0] * len(rest)), "limit_indices": (b, *rest),
                                       "strides": None}, **info).outputs[0]
        return _typed_like(graph, out, buf, info)     # loop's own buffer

    def reshape(g: Graph, v: Value, shape) -> Value:           # [1, ...] <-> [...]: a bitcast
        return g.add("reshape", [v], {"new_sizes": tuple(shape), "dimensions": None, "sharding": None},
                     **info).outputs[0]

    # the window: rows [t + lo, t + hi) carried one value each, row t + hi streamed in from the buffer
    window = [loop.add_carry(reshape(graph, rows(buf0, start + r, start + r + 1), rest))
              for r in range(lo, hi)]
    (row_in,) = loop.add_xs([rows(buf0, start + hi, start + hi + length)])
    state = {buf.id: [c.inner for c in window] + [row_in]}     # each version of the buffer: its window rows
    for r in reads:
        if r.inputs[0] is buf:
            body.replace_uses(r.outputs[0], reshape(body, state[buf.id][offsets[id(r)] - lo], (1, *rest)))
    for w in writes:                           # in chain order: each write's operand is known
        new = list(state[w.inputs[0].id])
        new[offsets[id(w)] - lo] = _written(body, w, new[offsets[id(w)] - lo], rest)
        state[w.outputs[0].id] = new
        for r in reads:
            if r.inputs[0] is w.outputs[0]:
                body.replace_uses(r.outputs[0], reshape(body, new[offsets[id(r)] - lo], (1, *rest)))
    last = state[loop.body_carry_out[j].id]
    for c, v in zip(window, last[1:]):
        c.set_next(v)
    (ys,) = loop.add_ys([last[0]])             # row t + lo is finished
    # the final buffer: untouched prefix, finished rows, the last window, untouched suffix
    parts = [rows(buf0, 0, start + lo), ys] + [reshape(graph, c.result, (1, *rest)) for c in window] + \
        [rows(buf0, start + length + hi, size)]
    parts = [p for p in parts if p.aval.shape[0]]
    out = parts[0] if len(parts) == 1 else graph.add("concatenate", parts, {"dimension": 0}, **info).outputs[0]
    graph.replace_uses(loop.carry_out[j], _typed_like(graph, out, loop.carry_out[j], info))
    body.set_output(j, buf)                    # carried unchanged, then dropped with its old chain
    old = reads + writes
    while old:                                 # a read of a written version goes before that write
        dead = [n for n in old if not any(o.uses for o in n.outputs)]
        if not dead:
            raise AssertionError("stream_rows: a replaced buffer access is still read")
        for n in dead:
            body.remove(n)
        old = [n for n in old if n not in dead]
    loop.remove_carry(j)
    return True
