"""Builder: construct a Graph directly, without tracing Python code.

A symbolic front end (PyTensor, a DSL, a code generator) already knows the
whole program, so re-tracing `jax.numpy` code is wasted work. `Builder`
appends primitives to a Graph one by one; each result's shape and dtype come
from the primitive's own abstract evaluation (the same rule JAX uses while
tracing), so a wrong shape fails right where it is built, naming the
primitive and the operands.

    b = Builder()
    x = b.arg((3, 4), "float32", name="x")
    w = b.arg((4,), "float32", name="w")
    y = b.tanh(x @ w) + 1.0
    f = jaxform.to_function(b.build(y))     # composes with jit, grad, vmap

Values are `Var` handles (a Graph `Value` plus its Builder) with arithmetic
operators. Loops and branches take sub-graphs: a Graph, or a function
`body(builder, *vars) -> vars` built on a nested Builder; outer Vars used
inside a body are captured as loop constants automatically.

One concept per module: this one is the Builder itself (values, binding a primitive, splicing traced
code and whole graphs, `build`); `build_var.py` the `Var` handle and errors; `build_ops.py` the array
operations and `build_control.py` the loops and branches, mixed into `Builder`.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _jax
from .graph import Graph, Node, Value
from .regions import regions_of
from .build_var import BuildError, Operand, Shape, Var, _as_graph, _avals, _dtype  # noqa: F401  (Operand, Shape: re-exported)
from .build_ops import ArrayOps
from .build_control import ControlFlow


_EVAL_CACHE: dict = {}  # (primitive, operand avals, params) -> result avals


class Builder(ArrayOps, ControlFlow):
    """Appends primitives to a Graph; call `build(outputs)` once at the end."""

    def __init__(self, *, parent: "Builder | None" = None):
        self.graph = Graph()
        self.parent = parent
        self._names: dict[int, str] = {}
        self._captured: dict[int, tuple[Var, Value]] = {}  # outer Value id -> (outer Var, our input)
        self._built = False

    # ---- values -----------------------------------------------------------------
    def arg(self, shape: Shape, dtype=np.float32, name: str | None = None) -> Var:
        """A new graph input of this shape and dtype (64-bit types need jax_enable_x64)."""
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise BuildError(f"jaxform.Builder.arg: shape must be non-negative ints, got {shape!r}"
                             f"{' for ' + repr(name) if name else ''} (symbolic dimensions are not supported)")
        v = self.graph.add_input(_jax.ShapedArray(tuple(int(d) for d in shape), _dtype(dtype)))
        return self._named(v, name)

    def const(self, value, dtype=None, name: str | None = None) -> Var:
        """A constant: scalars become inline literals, arrays graph constants."""
        arr = np.asarray(value, dtype=None if dtype is None else _dtype(dtype))
        if dtype is None and arr.dtype.kind in "biufc":
            arr = arr.astype(_dtype(arr.dtype))
        if arr.ndim == 0:
            return self._named(Graph.literal(arr[()], arr.dtype), name)
        # eagerly, even inside jit: under a trace jnp.asarray makes a tracer, and a graph kept (cached) past
        # that trace would hold it (UnexpectedTracerError when the graph runs under the next trace)
        with jax.ensure_compile_time_eval():
            arr = jax.numpy.asarray(arr)
        return self._named(self.graph.add_const(arr), name)

    def name(self, x: Var, name: str) -> Var:
        """Give `x` a name used in error messages."""
        self._names[x.value.id] = name
        return x

    def _axes(self, v: Value, axes, what: str, ndim: int | None = None) -> tuple[int, ...]:
        """Axes normalized to [0, ndim) as numpy does; out of range or repeated is a BuildError (never wrapped)."""
        ndim = v.aval.ndim if ndim is None else ndim
        axes = list(axes) if isinstance(axes, (tuple, list, range)) else [axes]
        out = []
        for a in axes:
            if not isinstance(a, (int, np.integer)) or not -ndim <= a < ndim:
                raise BuildError(f"jaxform.Builder.{what}: axis {a!r} is out of range for {self.describe(v)} "
                                 f"(rank {ndim}: axes are -{ndim}..{ndim - 1})" if ndim else
                                 f"jaxform.Builder.{what}: axis {a!r} given for the scalar {self.describe(v)}")
            out.append(int(a) % ndim)
        if len(set(out)) != len(out):
            raise BuildError(f"jaxform.Builder.{what}: repeated axis in {tuple(axes)} for {self.describe(v)}")
        return tuple(out)

    def describe(self, v: Value) -> str:
        """'x: f32[3,4]' or 'result of mul: f32[3]' for error messages."""
        what = self._names.get(v.id) or (f"result of {v.producer.prim.name}" if v.producer else
                                         f"literal {v.literal}" if v.is_literal else
                                         "constant" if v.is_const else "input")
        return f"{what}: {v.aval.str_short()}"

    def _named(self, v: Value, name):
        if name:
            self._names[v.id] = name
        return Var(self, v)

    def _value(self, x: Operand, like: Value | None = None) -> Value:
        """The Value of an operand; Python scalars take the dtype of `like` (the other operand)."""
        if isinstance(x, Var):
            if x.builder is self:
                return x.value
            return self._capture(x)
        if isinstance(x, Value):
            return x
        if isinstance(x, (bool, int, float, complex)) and like is not None:
            return Graph.literal(x, like.aval.dtype)
        if isinstance(x, (bool, int, float, complex, np.ndarray, np.generic, jax.Array)):
            return self.const(x).value
        raise BuildError(f"jaxform.Builder: cannot use a {type(x).__name__} as an operand")

    def _capture(self, x: Var) -> Value:
        """An outer builder's Var used in a body: becomes a body input fed by the outer value."""
        b = self.parent
        while b is not None and b is not x.builder:
            b = b.parent
        if b is None:
            raise BuildError(f"jaxform.Builder: {x!r} belongs to another Builder; "
                             "pass it as an operand instead")
        if x.value.id not in self._captured:
            v = self.graph.add_input(x.aval, index=len(self._captured))
            self._captured[x.value.id] = (x, v)
            if x.value.id in x.builder._names:
                self._names[v.id] = x.builder._names[x.value.id]
        return self._captured[x.value.id][1]

    def _pair(self, x, y):
        if isinstance(x, (Var, Value)) or not isinstance(y, (Var, Value)):
            xv = self._value(x)
            return xv, self._value(y, like=xv)
        yv = self._value(y)
        return self._value(x, like=yv), yv

    # ---- binding primitives ----------------------------------------------------------
    def bind(self, prim, *operands: Operand, **params) -> Var | list[Var]:
        """Apply a primitive (or its name); results' avals come from its abstract evaluation.

        Region params (scan's `jaxpr`, cond's `branches`, ...) may be Graphs or jaxprs.
        Returns one Var, or a list for multiple-result primitives.
        """
        if self._built:
            raise BuildError("jaxform.Builder: this builder already built its graph; start a new Builder")
        if isinstance(prim, str):
            prim = _jax.primitive(prim)
        values = [self._value(x) for x in operands]
        params = _jax.complete_params(prim, params)
        regions = {}
        for r in regions_of(prim.name):
            if r.param in params:
                p = params.pop(r.param)
                regions[r.name] = tuple(_as_graph(g) for g in p) if r.kind == "closed_tuple" else _as_graph(p)
        try:
            node = self._add(prim, values, params, regions)
        except Exception as e:
            ops = "\n".join(f"  operand {i} ({self.describe(v)})" for i, v in enumerate(values))
            shown = {k: v for k, v in params.items() if not isinstance(v, (Graph, _jax.ClosedJaxpr))}
            raise BuildError(f"jaxform.Builder: {prim.name} cannot take these operands: {e}\n{ops}"
                             + (f"\n  params: {shown}" if shown else "")) from None
        outs = [Var(self, o) for o in node.outputs]
        return outs if prim.multiple_results else outs[0]

    def _add(self, prim, values: list[Value], params: dict, regions: dict) -> Node:
        """Graph.add, with abstract evaluation memoized for region-free, effect-free nodes.

        Symbolic front ends repeat the same op on the same shapes many times
        (jax.numpy gets the same effect from its jit cache), so this halves build time.
        """
        if regions:
            return self.graph.add(prim, values, params, regions=regions)
        params = _jax.complete_params(prim, params)
        key = (prim, tuple(v.aval for v in values), tuple(sorted(params.items())))
        try:
            avals = _EVAL_CACHE.get(key)
        except TypeError:  # unhashable params
            return self.graph.add(prim, values, params)
        if avals is None:
            avals, effs = _jax.abstract_eval(prim, list(key[1]), params)
            if effs:
                return self.graph.add(prim, values, params)
            if len(_EVAL_CACHE) > 100_000:
                _EVAL_CACHE.clear()
            _EVAL_CACHE[key] = avals
        return self.graph.append(Node(prim, values, avals, params))

    # splicing whole programs ---------------------------------------------------------
    def call(self, graph: Graph, *operands: Operand) -> list[Var]:
        """Inline a copy of `graph` applied to `operands`; returns its outputs."""
        g = _as_graph(graph)
        vals = [self._value(o) for o in operands]
        got, want = [v.aval.strip_weak_type() for v in vals], [a.strip_weak_type() for a in g.in_avals]
        if got != want:
            raise BuildError(f"jaxform.Builder.call: the graph takes {_avals(want)}, got {_avals(got)}")
        return self._splice(g.to_jaxpr(), vals)

    def trace(self, fn: Callable, *operands: Operand, **static) -> Any:
        """Trace a JAX function on these operands and splice its equations in.

        The escape hatch for what has no convenience method: returns fn's output
        pytree with Vars as leaves. `static` keyword arguments are passed through.
        """
        vals = [self._value(o) for o in operands]
        structs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in vals]
        closed, out_shape = jax.make_jaxpr(lambda *a: fn(*a, **static), return_shape=True)(*structs)
        outs = self._splice(closed, vals)
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)

    def _splice(self, closed, vals: Sequence[Value]) -> list[Var]:
        g = Graph.from_jaxpr(closed)
        for v_in, v in zip(g.inputs, vals):
            g.replace_uses(v_in, v)
        self.graph.consts.extend(g.consts)
        outs = list(g.outputs)
        g.set_outputs([])
        for n in g.nodes:
            self.graph.append(n)
        return [Var(self, o) for o in outs]

    # finishing ----------------------------------------------------------------
    def build(self, outputs) -> Graph:
        """The finished Graph computing `outputs` (a Var or a list/tuple of them).

        Nodes that do not contribute to an output are dropped. `to_function` of
        the result returns a single array for a single Var, else a list/tuple.
        """
        if self._built:
            raise BuildError("jaxform.Builder: build() was already called on this builder")
        single = not isinstance(outputs, (list, tuple))
        outs = [outputs] if single else list(outputs)
        values = []
        for i, o in enumerate(outs):
            if isinstance(o, Var) and o.builder is not self and self.parent is None:
                raise BuildError(f"jaxform.Builder.build: output {i} ({o!r}) belongs to another Builder")
            values.append(self._value(o))
        g = self.graph
        g.set_outputs(values)
        live, stack = set(), [v.producer for v in values if v.producer is not None]
        stack += [n for n in g.nodes if n.effects]
        while stack:
            n = stack.pop()
            if id(n) not in live:
                live.add(id(n))
                stack.extend(v.producer for v in n.inputs if v.producer is not None)
        for n in reversed(g.nodes):
            if id(n) not in live:
                g.remove(n)
        used = {id(v) for n in g.nodes for v in n.inputs} | {id(v) for v in values}
        g.consts = [c for c in g.consts if id(c) in used]
        g.in_tree = jax.tree_util.tree_structure((tuple(0 for _ in g.inputs), {}))
        g.out_tree = jax.tree_util.tree_structure(0 if single else type(outputs)(0 for _ in outs))
        self._built = True
        return g
