"""Static selections of a scan's steps (`ys[k:]`, `ys[::2]`, `ys[-1]`) and their step predicates.

A value sliced from a scan's stacked outputs along the scan axis holds only
some steps: its entry j is the scan's step `start + j * stride` (positions as
`ys[t]` counts them, whatever the scan's direction; `stride` < 0 after a
`rev`, as `ys[::-2]` gives). Fusion (issue 17) runs the consumers of such a
value at every step of the body and lets only the selected ones count:
`predicate(g, position, steps)` is `position in steps`. Measured in
docs/scan_reductions.md: this beats leaving the slice outside.

`selects(node, axes, steps, length)` says what an equation does to the steps
of its stacked operand: nothing (None: the ordinary separability rules apply),
a narrower selection (`slice`, `dynamic_slice` with a static start, `rev`), or
one step picked out (`squeeze` of a one-step selection, `gather` of a static
index: `jnp.take(ys, k, 0)`); NotSeparable when it indexes the scan axis in a
way that is not static.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from . import identity
from .graph import Graph, Node, Value
from .separability import NotSeparable


@dataclass(frozen=True)
class Steps:
    """Entry j of a selected value is the scan's step `start + j * stride`, for j < count."""
    start: int
    stride: int
    count: int

    @staticmethod
    def full(length: int) -> "Steps":
        return Steps(0, 1, length)

    def is_all(self, length: int) -> bool:
        """Every step of the scan is selected (possibly in reverse order): no predicate needed."""
        return self.count == length and (length <= 1 or abs(self.stride) == 1)

    @property
    def first(self) -> int:
        return min(self.start, self.start + (self.count - 1) * self.stride) if self.count else 0

    def slice(self, lo: int, hi: int, st: int) -> "Steps":
        """Entries range(lo, hi, st) of this selection (st > 0, bounds already clamped as slice's are)."""
        n = len(range(lo, hi, st))
        if n == 0:
            return Steps(0, 1, 0)
        return Steps(self.start + lo * self.stride, self.stride * st if n > 1 else 1, n)

    def rev(self) -> "Steps":
        if self.count <= 1:
            return self
        return Steps(self.start + (self.count - 1) * self.stride, -self.stride, self.count)


def static_value(v: Value, depth: int = 8):
    """v's value if it is computed, effect-free and without sub-graphs, from literals and small constants."""
    if v.is_literal:
        return np.asarray(v.literal)
    if v.is_const:
        c = np.asarray(v.const)
        return c if c.size <= 64 else None
    n = v.producer
    if n is None or depth == 0 or n.effects or identity.is_impure(n) or any(True for _ in n.subgraphs()) \
            or np.prod(v.aval.shape, dtype=int) > 64:
        return None
    vals = [static_value(u, depth - 1) for u in n.inputs]
    if any(x is None for x in vals):
        return None
    try:
        with jax.ensure_compile_time_eval():   # (passes may run while a jit traces)
            out = n.prim.bind(*vals, **n.full_params())
    except Exception:   # an equation that cannot run eagerly here: not static
        return None
    out = out if n.prim.multiple_results else [out]
    return np.asarray(out[v.index])


def _static_int(v: Value) -> int | None:
    x = static_value(v)
    if x is None or x.ndim or not jax.numpy.issubdtype(x.dtype, np.integer):
        return None
    return int(x)


def selects(node: Node, axes: list, steps: Steps, length: int):
    """What `node` does to the selected steps of its stacked operand 0 (scan axis `axes[0]`).

    None: it does not index the scan axis. ("slice", new Steps, per-step node or None): a narrower
    selection, the per-step equation given as (primitive name, params) for the other axes (None:
    identity). ("pick", position, per-step equation or None): one step, the scan axis removed.
    Raises NotSeparable when it indexes the scan axis in a way that is not static.
    """
    a = axes[0]
    if a is None or any(b is not None for b in axes[1:]):
        return None
    name, p, x = node.name, node.params, node.inputs[0]
    shape = tuple(x.aval.shape)
    if name == "slice":
        lo, hi = tuple(p["start_indices"]), tuple(p["limit_indices"])
        st = tuple(p["strides"] or (1,) * len(shape))
        if (lo[a], hi[a], st[a]) == (0, shape[a], 1):
            return None
        rest = _drop(lo, a), _drop(hi, a), _drop(st, a)
        full = all(l == 0 and h == s and t == 1 for l, h, t, s in zip(*rest, _drop(shape, a)))
        step = None if full else ("slice", {"start_indices": rest[0], "limit_indices": rest[1],
                                            "strides": None if p["strides"] is None else rest[2]})
        return "slice", steps.slice(lo[a], hi[a], st[a]), step
    if name == "rev":
        dims = tuple(p["dimensions"])
        if a not in dims:
            return None
        others = tuple(d - (d > a) for d in dims if d != a)
        return "slice", steps.rev(), ("rev", {"dimensions": others}) if others else None
    if name == "dynamic_slice":
        sizes = tuple(p["slice_sizes"])
        if sizes[a] == shape[a]:
            return None
        if any(z != s for i, (z, s) in enumerate(zip(sizes, shape)) if i != a):
            raise NotSeparable("dynamic_slice of the scan axis and other axes at once")
        k = _static_int(node.inputs[1 + a])
        if k is None:
            raise NotSeparable("dynamic_slice along the scan axis at a start that is not static")
        k = min(max(k, 0), shape[a] - sizes[a])   # dynamic_slice clamps its start
        return "slice", steps.slice(k, k + sizes[a], 1), None
    if name == "squeeze":
        dims = tuple(p["dimensions"])
        if a not in dims:
            return None
        if steps.count != 1:
            raise NotSeparable("squeeze of the scan axis")
        others = tuple(d - (d > a) for d in dims if d != a)
        return "pick", steps.start, ("squeeze", {"dimensions": others}) if others else None
    if name == "gather":
        return _gather_pick(node, a, steps)
    return None


def _gather_pick(node: Node, a: int, steps: Steps):
    """`jnp.take(ys, k, axis)` with a static k: a gather collapsing the scan axis at one start index."""
    from jax import lax
    p, dn = node.params, node.params["dimension_numbers"]
    x, idx = node.inputs
    nd = x.aval.ndim
    if a not in tuple(dn.start_index_map) and a not in tuple(dn.collapsed_slice_dims):
        return None   # the scan axis is a whole window: the separability rule handles it
    rest = [d for d in range(nd) if d != a]
    if (tuple(dn.start_index_map) != (a,) or tuple(dn.collapsed_slice_dims) != (a,) or dn.operand_batching_dims
            or tuple(dn.offset_dims) != tuple(range(nd - 1)) or tuple(idx.aval.shape) != (1,)
            or any(p["slice_sizes"][d] != x.aval.shape[d] for d in rest)):
        raise NotSeparable("gather along the scan axis that is not one static index")
    iv = static_value(idx)
    if iv is None or not jax.numpy.issubdtype(iv.dtype, np.integer):
        raise NotSeparable("gather along the scan axis at an index that is not static")
    k, n = int(iv.reshape(())), steps.count
    if n == 0:
        raise NotSeparable("gather from an empty selection")
    if lax.GatherScatterMode.from_any(p["mode"]) == lax.GatherScatterMode.CLIP:
        k = min(max(k, 0), n - 1)
    elif not 0 <= k < n:   # fill (or a broken promise): not a step of the scan
        raise NotSeparable("gather along the scan axis out of bounds")
    return "pick", steps.start + k * steps.stride, None


def predicate(g: Graph, position: Value, steps: Steps) -> Value:
    """A bool scalar in `g`: is `position` (the current step's position) one of `steps`?"""
    i32 = np.int32
    if steps.count == 0:
        return Graph.literal(False, np.bool_)
    first, span, stride = steps.first, (steps.count - 1) * abs(steps.stride), abs(steps.stride)
    d = g.add("sub", [position, Graph.literal(first, i32)]).outputs[0]
    if steps.count == 1:
        return g.add("eq", [d, Graph.literal(0, i32)]).outputs[0]
    ok = g.add("ge", [d, Graph.literal(0, i32)]).outputs[0]
    ok = g.add("and", [ok, g.add("le", [d, Graph.literal(span, i32)]).outputs[0]]).outputs[0]
    if stride > 1:
        r = g.add("rem", [d, Graph.literal(stride, i32)]).outputs[0]
        ok = g.add("and", [ok, g.add("eq", [r, Graph.literal(0, i32)]).outputs[0]]).outputs[0]
    return ok


def _drop(seq, i):
    return tuple(x for j, x in enumerate(seq) if j != i)


__all__ = ["Steps", "selects", "predicate", "static_value"]
