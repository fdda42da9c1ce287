"""The Builder's control flow (`scan`, `cond`, `while_loop`), a mixin of `Builder`: each body is a
Graph or a function built on a nested Builder, whose captured outer values become loop constants."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .graph import Graph
from .build_var import BuildError, Operand, Var, _as_graph, _avals


class ControlFlow:
    """The Builder's loops and branches: bodies are Graphs or functions built on a nested Builder."""

    # control flow ---------------------------------------------------------------
    def _region(self, body, in_avals, what: str) -> tuple[Graph, list[Var]]:
        """A sub-graph taking `in_avals` (+ leading captured inputs), and the outer Vars it captured."""
        if callable(body) and not isinstance(body, Graph):
            sub = type(self)(parent=self)
            args = [Var(sub, sub.graph.add_input(a)) for a in in_avals]
            out = body(sub, *args)
            g = sub.build(list(out) if isinstance(out, (list, tuple)) else [out])
            captured = [x for x, _ in sub._captured.values()]
        else:
            g, captured = _as_graph(body).copy(), []
            got = [a.strip_weak_type() for a in g.in_avals]
            want = [a.strip_weak_type() for a in in_avals]
            if got != want:
                raise BuildError(f"jaxform.Builder: {what} takes {_avals(got)} but must take {_avals(want)}")
        # constants inside a body become leading operands (loop constants), like JAX's tracing does
        for i, c in enumerate(list(g.consts)):
            v = g.add_input(c.aval, index=len(captured))
            g.replace_uses(c, v)
            captured.append(Var(self, self.graph.add_const(c.const)))
        g.consts = []
        g.in_tree = g.out_tree = None
        return g, captured

    def scan(self, body, consts: Sequence[Operand], init: Sequence[Operand], xs: Sequence[Operand],
             length: int | None = None, reverse: bool = False, unroll: int = 1) -> tuple[list[Var], list[Var]]:
        """lax.scan over the leading axis of `xs`: body(consts..., carry..., x...) -> (carry..., y...).

        Returns (final carry, stacked ys) as lists of Vars.
        """
        consts, init, xs = ([self._value(v) for v in vs] for vs in (consts, init, xs))
        lengths = {v.aval.shape[0] for v in xs if v.aval.ndim}
        if any(v.aval.ndim == 0 for v in xs):
            raise BuildError("jaxform.Builder.scan: xs must have a leading axis to scan over")
        if length is None:
            if len(lengths) != 1:
                raise BuildError("jaxform.Builder.scan: give length= (no xs)" if not lengths else
                                 f"jaxform.Builder.scan: xs have different leading sizes {sorted(lengths)}")
            length = lengths.pop()
        elif lengths - {length}:
            raise BuildError(f"jaxform.Builder.scan: length={length} but xs have leading sizes {sorted(lengths)}")
        x_avals = [v.aval.update(shape=v.aval.shape[1:]) for v in xs]
        g, captured = self._region(body, [v.aval for v in consts + init] + x_avals, "the scan body")
        carry_in = [v.aval.strip_weak_type() for v in init]
        carry_out = [a.strip_weak_type() for a in g.out_avals[:len(init)]]
        if carry_in != carry_out:
            raise BuildError(f"jaxform.Builder.scan: the body returns carry {_avals(carry_out)} "
                             f"but the carry is {_avals(carry_in)}; they must match")
        ops = [self._value(c) for c in captured] + consts + init + xs
        outs = self.bind("scan", *ops, jaxpr=g, length=int(length), reverse=bool(reverse), unroll=int(unroll),
                         num_consts=len(captured) + len(consts), num_carry=len(init))
        return outs[:len(init)], outs[len(init):]

    def cond(self, index: Operand, branches: Sequence, *operands: Operand) -> list[Var]:
        """branches[index](*operands) (like lax.switch: an int index is clamped; a bool picks 1 for True)."""
        iv = self._value(index)
        if iv.aval.shape != ():
            raise BuildError(f"jaxform.Builder.cond: the index must be a scalar, got {self.describe(iv)}")
        if iv.aval.dtype == np.bool_:
            iv = self.convert(iv, np.int32).value
        else:
            iv = self.convert(iv, np.int32).value
            if len(branches) > 1:
                iv = self.clamp(0, iv, len(branches) - 1).value
        ops = [self._value(o) for o in operands]
        regions = [self._region(br, [o.aval for o in ops], f"cond branch {i}") for i, br in enumerate(branches)]
        outs = [[a.strip_weak_type() for a in g.out_avals] for g, _ in regions]
        for i, o in enumerate(outs[1:], 1):
            if o != outs[0]:
                raise BuildError(f"jaxform.Builder.cond: branch {i} returns {_avals(o)} but branch 0 returns "
                                 f"{_avals(outs[0])}; all branches must return the same types")
        # every branch takes every branch's captured values as leading operands
        extra = [c for _, cap in regions for c in cap]
        graphs, offset = [], 0
        for g, cap in regions:
            for j, c in enumerate(extra):
                if not offset <= j < offset + len(cap):
                    g.add_input(c.aval, index=j)
            offset += len(cap)
            graphs.append(g)
        return self.bind("cond", iv, *[self._value(c) for c in extra], *ops, branches=tuple(graphs))

    def while_loop(self, cond, body, init: Sequence[Operand]) -> list[Var]:
        """lax.while_loop: cond(carry...) -> bool[], body(carry...) -> carry...; returns the final carry."""
        init = [self._value(v) for v in init]
        avals = [v.aval for v in init]
        cg, ccap = self._region(cond, avals, "the while cond")
        if len(cg.outputs) != 1 or cg.out_avals[0].shape != () or cg.out_avals[0].dtype != np.bool_:
            raise BuildError(f"jaxform.Builder.while_loop: cond must return one bool[] scalar, "
                             f"got {_avals(cg.out_avals)}")
        bg, bcap = self._region(body, avals, "the while body")
        got = [a.strip_weak_type() for a in bg.out_avals]
        if got != [a.strip_weak_type() for a in avals]:
            raise BuildError(f"jaxform.Builder.while_loop: the body returns {_avals(got)} but the carry is "
                             f"{_avals(avals)}; they must match")
        ops = [self._value(c) for c in ccap + bcap] + init
        return self.bind("while", *ops, cond_jaxpr=cg, body_jaxpr=bg,
                         cond_nconsts=len(ccap), body_nconsts=len(bcap))
