"""A scan's anatomy, shared by every loop pass.

    scan operands  = consts | carry | xs        body inputs  = consts | carry | xs[t]
    scan results   = carry  | ys                body outputs = carry  | ys[t]

Loop passes (fusion, hoisting, fission, remat planning) read and edit scans
through `ScanLoop` instead of doing their own param surgery: it keeps the
operands, the body's inputs and outputs, the results and the role counts in
step, so that a pass says *what* it adds ("a carry starting at 0", "a new
xs") and never *where* in the flat lists it goes. The params it reads are
jaxform's canonical layout (see `_jax.py`), whatever JAX version runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .graph import Graph, Node, Value
from .regions import scan_roles


@dataclass
class Carry:
    """A carry added by a pass: `inner` is the body's input, `result` the scan's final value."""
    loop: "ScanLoop"
    inner: Value
    result: Value

    def set_next(self, v: Value) -> None:
        """The body's value for this carry at the next step (starts as `inner`: carried unchanged)."""
        self.loop.body.set_output(self.loop._carry_index(self), v)


class ScanLoop:
    """A view of one `scan` node by roles; edits keep node, body and params consistent."""

    def __init__(self, node: Node):
        assert node.name == "scan", node
        self.node, self.body = node, node.regions["body"]
        self._carries: list[Carry] = []
        self._position: Value | None = None

    # ---- reading -------------------------------------------------------------------
    @property
    def params(self) -> dict:
        return self.node.params

    @property
    def length(self) -> int:
        return self.params["length"]

    @property
    def reverse(self) -> bool:
        return bool(self.params["reverse"])

    @property
    def num_consts(self) -> int:
        return self.params["num_consts"]

    @property
    def num_carry(self) -> int:
        return self.params["num_carry"]

    def _role(self, seq, name):
        return list(seq[scan_roles(self.params)[name]])

    consts = property(lambda s: s._role(s.node.inputs, "consts"))
    carry = property(lambda s: s._role(s.node.inputs, "carry"))
    xs = property(lambda s: s._role(s.node.inputs, "xs"))
    carry_out = property(lambda s: s._role(s.node.outputs, "carry_out"))
    ys = property(lambda s: s._role(s.node.outputs, "ys"))
    body_consts = property(lambda s: s._role(s.body.inputs, "consts"))
    body_carry = property(lambda s: s._role(s.body.inputs, "carry"))
    body_xs = property(lambda s: s._role(s.body.inputs, "xs"))
    body_carry_out = property(lambda s: s._role(s.body.outputs, "carry_out"))
    body_ys = property(lambda s: s._role(s.body.outputs, "ys"))

    def carry_dependent(self) -> set[int]:
        """ids of the body's values that depend on the carry (directly or through another node).

        Values outside this set are functions of consts and xs[t] alone: fission
        may compute them for all steps at once before the loop. Effectful nodes
        count as carry-dependent (their order within the loop is fixed).
        """
        dep = {v.id for v in self.body_carry}
        for n in self.body.nodes:   # graph order is topological for bodies read from jaxprs
            if n.effects or any(v.id in dep for v in n.inputs) or any(_reads(g, dep) for g in n.subgraphs()):
                dep.update(o.id for o in n.outputs)
        return dep

    # ---- editing -------------------------------------------------------------------
    def add_consts(self, outer: Sequence[Value]) -> list[Value]:
        """New loop constants; returns their body inputs."""
        at = self.num_consts
        inner = [Value(v.aval) for v in outer]
        self._insert_inputs(at, outer, inner)
        self.params["num_consts"] = at + len(outer)
        return inner

    def add_xs(self, outer: Sequence[Value]) -> list[Value]:
        """New scanned inputs (`[length, ...]`, scanned over axis 0); returns their per-step body inputs."""
        for v in outer:
            if v.aval.shape[:1] != (self.length,):
                raise ValueError(f"jaxform: a new xs must have the scan's length {self.length} on axis 0, "
                                 f"got {v.aval.str_short()}")
        inner = [Value(v.aval.update(shape=v.aval.shape[1:])) for v in outer]
        self._insert_inputs(len(self.node.inputs), outer, inner)
        return inner

    def add_carry(self, init: Value) -> Carry:
        """A new carry starting at `init`, carried unchanged until `set_next` says otherwise."""
        c, k = self.num_consts, self.num_carry
        inner = Value(init.aval)
        self._insert_inputs(c + k, [init], [inner])
        outs = list(self.body.outputs)
        self.body.set_outputs(outs[:k] + [inner] + outs[k:])
        result = Value(init.aval)
        res = list(self.node.outputs)
        self.node.set_outputs(res[:k] + [result] + res[k:])
        self.params["num_carry"] = k + 1
        carry = Carry(self, inner, result)
        self._carries.append(carry)
        return carry

    def position(self) -> Value:
        """The body's int32 position of the current step: t such that this step computes ys[t]
        (0, 1, ... or, in a reverse scan, length-1, ..., 0). Added once, as a counting carry."""
        if self._position is None:
            i32 = np.int32
            c = self.add_carry(Graph.literal(self.length - 1 if self.reverse else 0, i32))
            nxt = self.body.add("sub" if self.reverse else "add", [c.inner, Graph.literal(1, i32)],
                                source_info=self.node.source_info, ctx=self.node.ctx)
            c.set_next(nxt.outputs[0])
            self._position = c.inner
        return self._position

    def add_ys(self, inner: Sequence[Value]) -> list[Value]:
        """New stacked outputs of per-step body values; returns the scan's `[length, ...]` results."""
        self.body.set_outputs(list(self.body.outputs) + list(inner))
        outer = [Value(v.aval.update(shape=(self.length, *v.aval.shape), weak_type=v.aval.weak_type))
                 for v in inner]
        self.node.set_outputs(list(self.node.outputs) + outer)
        return outer

    def remove_ys(self, positions: Sequence[int]) -> None:
        """Drop stacked outputs (by position among the ys) whose results nobody reads any more."""
        drop = {self.num_carry + j for j in positions}
        for i in drop:
            if self.node.outputs[i].uses:
                raise ValueError(f"jaxform: ys {i - self.num_carry} of the scan is still read; "
                                 "replace its uses before removing it")
        self.body.set_outputs([v for i, v in enumerate(self.body.outputs) if i not in drop])
        self.node.set_outputs([v for i, v in enumerate(self.node.outputs) if i not in drop])

    def remove_carry(self, j: int) -> None:
        """Drop carry j (by position among the carries): its final value must be unread outside and its
        body input unread inside but by its own next value (which is dropped with it)."""
        c, k = self.num_consts, self.num_carry
        if self.node.outputs[j].uses:
            raise ValueError(f"jaxform: carry {j} of the scan is still read; replace its uses before removing it")
        inner = self.body.inputs[c + j]
        self.body.set_outputs([v for i, v in enumerate(self.body.outputs) if i != j])
        if inner.uses:
            raise ValueError(f"jaxform: carry {j} is still read inside the body")
        self.body.inputs[c + j:c + j + 1] = []
        self.node.set_inputs([v for i, v in enumerate(self.node.inputs) if i != c + j])
        self.node.set_outputs([v for i, v in enumerate(self.node.outputs) if i != j])
        self.params["num_carry"] = k - 1
        self._carries = [x for x in self._carries if x.inner is not inner]

    def _carry_index(self, carry: Carry) -> int:
        return self.body.inputs.index(carry.inner) - self.num_consts

    def _insert_inputs(self, at: int, outer: Sequence[Value], inner: Sequence[Value]) -> None:
        ins = list(self.node.inputs)
        self.node.set_inputs(ins[:at] + list(outer) + ins[at:])
        self.body.inputs[at:at] = list(inner)


def _reads(g: Graph, ids: set[int]) -> bool:
    """Does a sub-graph read any value in `ids` directly (a closure over the enclosing body)?"""
    return any(v.id in ids for n, _ in g.walk() for v in n.inputs)
