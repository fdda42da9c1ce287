"""`trace`, `to_function` and `optimize`: the way in and out of the Graph world.

`optimize(fn)` wraps `fn` like `jax.jit` does: per input signature it traces
`fn` to a jaxpr, runs the passes over its Graph, verifies the result, and
caches it; each call evaluates the cached jaxpr by binding primitives, so the
wrapper composes with jit, grad, vmap and sharded jit. An optimization bug
must never break or change the user's program: a pass that raises, or whose
output fails verification, is skipped with a warning (strict=True raises).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from . import _jax
from .ir import Graph
from . import passes as _passes
from . import plan as _plan
from .passes.pipeline import PassError, run_passes, verify, user_stacklevel  # noqa: F401 (re-exported)
from .passes.remat_loops import check_memory
from .passes.while_grad import check_max_steps


def _fn_name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    try:
        code = inspect.unwrap(fn).__code__
        return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
    except AttributeError:
        return name


def _is_leaf_ok(leaf) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex, bool, jax.ShapeDtypeStruct)) or \
        isinstance(leaf, _jax.Tracer)


def _arg_path(fn, path, positions=None) -> str:
    """`model.hidden_size` for a leaf path of ((args), {kwargs}), naming positionals from `fn`'s signature."""
    if not path:
        return "(arguments)"
    head, rest = path[0], path[1:]
    if getattr(head, "idx", None) == 0 and rest:     # positional argument
        i = rest[0].idx
        i = positions[i] if positions is not None else i
        try:
            params = list(inspect.signature(fn).parameters.values())
            name = params[i].name if i < len(params) and params[i].kind in (
                params[i].POSITIONAL_ONLY, params[i].POSITIONAL_OR_KEYWORD) else f"args[{i}]"
        except (TypeError, ValueError):
            name = f"args[{i}]"
        rest = rest[1:]
    elif rest:                                         # keyword argument
        name, rest = str(rest[0].key), rest[1:]
    else:
        return "(arguments)"
    out = name
    for k in rest:
        out += f".{k.name}" if isinstance(k, jax.tree_util.GetAttrKey) else jax.tree_util.keystr((k,))
    return out


def _check_leaves(fn, leaves, paths, positions=None) -> None:
    for leaf, path in zip(leaves, paths):
        if not _is_leaf_ok(leaf):
            raise TypeError(
                f"jaxform: argument {_arg_path(fn, path, positions)} of {_fn_name(fn)} is a "
                f"{type(leaf).__name__}, which is not an array. Mark it static "
                f"(optimize(fn, static_argnums=...) / static_argnames=...), use jaxform.filter_optimize, "
                f"or pass an array.")


def _outputs(closed, outs) -> list:
    """Outputs as jit returns them: jax Arrays of the jaxpr's output types (eval_jaxpr passes literals through)."""
    return [_jax.as_output(o, a) for o, a in zip(outs, closed.out_avals)]


def trace(fn: Callable, *args, **kwargs) -> Graph:
    """Trace `fn` on example arguments (arrays, ShapeDtypeStructs or pytrees of them) into a Graph."""
    paths_leaves, in_tree = jax.tree_util.tree_flatten_with_path((args, kwargs))
    _check_leaves(fn, [l for _, l in paths_leaves], [p for p, _ in paths_leaves])
    closed, out_tree = _jax.jit_trace(fn, (), (), args, kwargs)
    g = Graph.from_jaxpr(closed)
    g.in_tree, g.out_tree = in_tree, out_tree
    return g


def to_function(graph: Graph) -> Callable:
    """A callable running `graph` (a snapshot of it now); composes with jit, grad, vmap.

    If the graph came from `trace`, it takes and returns the same pytrees as
    the traced function (positional and keyword arguments as they were traced),
    otherwise flat arrays in, a list of arrays out. Arguments of another
    structure, shape or dtype raise a TypeError: a graph is one signature.
    """
    closed = graph.to_jaxpr()
    in_tree, out_tree = graph.in_tree, graph.out_tree
    in_avals = closed.in_avals

    def run(*args, **kwargs):
        if in_tree is not None:
            flat, tree = jax.tree_util.tree_flatten((args, kwargs))
            if tree != in_tree:
                raise TypeError(
                    "jaxform: this graph was traced with arguments structured as "
                    f"{_describe(in_tree)}, but was called with {_describe(tree)}. Pass the same pytrees, "
                    "positional and keyword arguments as at tracing (or trace again).")
        else:
            if kwargs:
                raise TypeError("jaxform: this graph takes positional arrays only (it was not traced from a "
                                "function); got keyword arguments " + ", ".join(kwargs))
            flat = list(args)
        if len(flat) != len(in_avals):
            raise TypeError(f"jaxform: this graph takes {len(in_avals)} arrays, got {len(flat)}")
        for i, (x, a) in enumerate(zip(flat, in_avals)):
            if not _is_leaf_ok(x):
                raise TypeError(f"jaxform: input {i} of this graph is a {type(x).__name__}, not an array")
            b = _jax.get_aval(x)
            if tuple(b.shape) != tuple(a.shape) or b.dtype != a.dtype:
                raise TypeError(f"jaxform: input {i} of this graph must be {a.str_short()}, got "
                                f"{b.str_short()}. Trace again for other shapes or dtypes.")
        outs = _outputs(closed, _jax.eval_jaxpr(closed, *flat))
        return jax.tree_util.tree_unflatten(out_tree, outs) if out_tree is not None else outs

    run.jaxpr = closed
    return run


def _describe(tree) -> str:
    """'2 positional (pytree), keywords a, b' for a treedef of ((args), {kwargs})."""
    try:
        args, kwargs = jax.tree_util.tree_unflatten(tree, ["*"] * tree.num_leaves)
        kw = f"keyword arguments {', '.join(kwargs)}" if kwargs else "no keyword arguments"
        return f"{len(args)} positional argument(s) {args!r} and {kw}"
    except Exception:
        return str(tree)


# ---- optimize -------------------------------------------------------------------

def _aval_key(x):
    a = _jax.get_aval(x)
    return (a.shape, a.dtype, getattr(a, "weak_type", False), getattr(a, "sharding", None),
            getattr(a, "memory_space", None), getattr(a, "manual_axis_type", None))   # (host memory; shard_map's varying axes)


@contextlib.contextmanager
def planning_contexts(args: tuple, positions: Sequence[int], use):
    """What a call tells the planner beside its program (`optimize`'s wrapper, and `explain` to report what
    that plans): which inputs the first argument is (`jax.grad`'s default), the gradient a known use takes
    where its argnums differ, which inputs each argument is, and the batching of per-example gradients.
    `positions`: the indices of `args` that are traced (not static)."""
    first = range(len(jax.tree_util.tree_leaves(args[0]))) if list(positions[:1]) == [0] else None
    asked = None
    known = use is not None and use.known and bool(use.steps) and isinstance(use.steps[0], tuple) and \
        use.steps[0][0] == "grad"
    if known:
        wrt = use.steps[0][1]
        if wrt is None:      # (a use built by hand, `Use((("grad", None),))`: every float input)
            first = None
        elif first is None or set(wrt) != set(first):   # argnums other than the default
            first, asked = wrt, _plan.cost.ASKED_ARGNUMS
    sizes = [len(jax.tree_util.tree_leaves(args[i])) for i in positions]
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    # per-example gradients, jax.vmap(jax.grad(f)): a budget is for the batched gradient; so it is for a program
    # run under jax.vmap as it is, jax.vmap(optimize(jax.grad(f), memory=N)) (its own temp, batched: fitted to one
    # example's, it ran plain's 1266688 B against N = 633344 B without a word, round 21's F); every vmap of a
    # nest (round 23's C); and jax.grad of a batched loss, the vmap first, is the gradient of the batched program
    # (round 23's D)
    steps = use.steps if use is not None and use.known else ()
    batch = _vmaps(steps[1:] if known else steps)
    before = not known and bool(batch) and len(steps) > len(batch) and isinstance(steps[len(batch)], tuple) and \
        steps[len(batch)][0] == "grad"
    if before:
        wrt, known = steps[len(batch)][1], True
        if first is None or set(wrt) != set(first):
            first, asked = wrt, _plan.cost.ASKED_ARGNUMS
    behind_jit = use is not None and not use.known
    with _plan.cost.first_argument_is(first, asked, known, behind_jit), \
            _plan.cost.gradient_batched(batch, before), \
            _plan.cost.arguments_are(range(a, a + n) for a, n in zip(starts, sizes) if n):
        yield


def _vmaps(steps) -> list:
    """The (in_axes, size) of the `jax.vmap` steps `steps` starts with, innermost first."""
    out = []
    for s in steps:
        if not (isinstance(s, tuple) and s[0] == "vmap"):
            break
        out.append(s[1:])
    return out


def _loss_and_aux(out_tree, closed) -> bool:
    """Whether `fn` returns what `jax.grad(fn, has_aux=True)` takes: a pair (tuple or list) whose first element
    is one float scalar, output 0 (`plan.use.returns_loss_and_aux`)."""
    try:
        shape = jax.tree_util.tree_unflatten(out_tree, range(out_tree.num_leaves))
    except Exception:  # noqa: BLE001 - a custom node that cannot hold indices: not claimed
        return False
    out = closed.out_avals
    return isinstance(shape, (tuple, list)) and len(shape) == 2 and isinstance(shape[0], int) and \
        shape[0] == 0 and bool(out) and out[0].shape == () and jax.numpy.issubdtype(out[0].dtype, jax.numpy.floating)


def _pipeline(passes, exact: bool) -> list:
    if passes is None:
        return _passes.default_pipeline(exact)
    if isinstance(passes, str) or callable(passes):
        passes = [passes]              # one pass, not a sequence of characters
    pipeline = [_passes.get(p) for p in passes]
    return [p for p in pipeline if getattr(p, "exact", False)] if exact else pipeline


def _check_options(api: str, fn, *, exact, strict, memory, tune=False, max_steps=None) -> None:
    """Every option checked when `optimize` is called, not when a pass first runs (which would skip
    the pass with a warning and run the program unplanned while the user believes planning is on)."""
    for name, v in (("exact", exact), ("strict", strict), ("tune", tune)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{api}({_fn_name(fn)}): {name} must be True or False, got {type(v).__name__} {v!r}")
    if not (isinstance(memory, str) and memory == "default"):
        check_memory(memory, f"{api}({_fn_name(fn)})")
    check_max_steps(max_steps, f"{api}({_fn_name(fn)})")


def _check_bound(api: str, fn, memory, exact, max_steps) -> None:
    """max_steps with planning off would be ignored: the user believes while loops are differentiable."""
    if max_steps is not None and (memory is None or exact):
        raise ValueError(f"{api}({_fn_name(fn)}): max_steps={max_steps} bounds while loops for reverse-mode "
                         f"gradients, which memory planning does: it needs memory='auto', 'min' or a byte budget "
                         f"and exact=False (memory is None by default when passes=[...] is given), got "
                         f"memory={memory!r}, exact={exact!r}")


def optimize(fn: Callable | None = None, passes: Sequence | str | None = None, *, exact: bool = False,
             strict: bool = False, static_argnums: int | Sequence[int] | None = None,
             static_argnames: str | Sequence[str] | None = None, memory="default", tune: bool = False,
             max_steps: int | None = None, plan: bool | None = None) -> Callable:
    """Optimize `fn` with jaxform passes; a drop-in wrapper like `jax.jit`.

    The default pipeline is planned (`jaxform.plan`, docs/planner.md) for the use the call is traced
    under (forward, `jax.grad`, `jax.vmap`, `jax.jvp`; under a bare `jax.jit` the forward, its derivatives
    as traced): each loop rewrite a pass proposes is kept only where XLA measures the program no
    bigger (temp memory) and no slower (timed where the cost model cannot tell) than before it; with
    `memory="auto"`, `"min"` or a budget, memory planning then trades time for gradient memory as asked.
    So the objective is: `memory=None`: fastest without growing memory; `"auto"`/bytes: fastest within
    the budget.

    passes: a pass name or callable, or a sequence of them (default: the `passes.DEFAULT` pipeline).
    exact: keep only passes registered exact, i.e. that never change a value computed
        by the same primitives: the optimized jaxpr gives bit-identical results when
        evaluated op by op (eagerly). Under `jax.jit` XLA fuses and may contract the
        optimized program differently than the original (e.g. float16 arithmetic kept
        in float32 across a fusion), so jitted results may differ in the last bits,
        exactly as two equivalent jitted programs may. See docs/testing.md.
    strict: raise instead of skipping a pass that fails.
    static_argnums / static_argnames: as in `jax.jit` (names and numbers complete each
        other from `fn`'s signature; hashable; part of the cache key).
    memory: what loops remember under grad (`passes.remat_loops`, docs/remat.md): None
        (everything, as JAX does), "auto" (remat a scan body where that at least halves its
        stored bytes and the recomputation is cheap), "min" (two-level √L checkpointing) or a
        byte budget for the gradient's loop residuals. A program without loops is checkpointed in
        segments under "min" or a budget (XLA-measured to fit; `passes.remat_program`; a program that
        is itself a gradient gets recomputation in its backward, `passes.recompute`), and under "auto"
        only where its gradient would not fit the device (`plan.memory`). Default: "auto" with the default
        pipeline, None when `passes` is given or exact=True (remat is not bit-exact).
    tune: where the cost model cannot tell two candidate programs apart, time both on the
        device at the first call for a signature (interleaved, min of N, with a noise margin)
        and keep the faster; verdicts are cached on disk (`JAXFORM_TUNE_CACHE`, default
        ~/.cache/jaxform/tune), so a later process pays nothing. Default pipeline only.
    max_steps: an upper bound on the trip count of the `lax.while_loop`s in `fn`, so that `jax.grad` can
        differentiate them (JAX alone cannot): each becomes a bounded scan under `grad` only, its memory
        planned like a scan's; a gradient past the bound is NaN (docs/remat.md). A loop whose condition is
        `i < N` (an integer counter from a literal, +1 per step) needs none. Needs `memory` set.
    plan: whether the planner judges each deciding pass's proposal (default: only for the default pipeline).
        `passes=[...]` runs exactly the passes it names, unplanned, unless plan=True: then the pipeline
        is planned like the default one, and a pass registered `decided=True` is judged too
        (docs/extending.md).

    Traces with `jax.jit`'s rules, so tracing errors name `fn` and the argument path.
    Caches per argument types, static arguments and JAX configuration (the state
    `jax.jit` keys on: x64, rank promotion, default matmul precision, ...).
    Does not compile by itself: wrap in `jax.jit` for speed.
    """
    if fn is None:
        return functools.partial(optimize, passes=passes, exact=exact, strict=strict,
                                 static_argnums=static_argnums, static_argnames=static_argnames, memory=memory,
                                 tune=tune, max_steps=max_steps, plan=plan)
    if not callable(fn):
        raise TypeError(f"jaxform.optimize expects a function, got {type(fn).__name__}")
    if plan is not None and not isinstance(plan, (bool, np.bool_)):
        raise TypeError(f"jaxform.optimize({_fn_name(fn)}): plan must be True, False or None, got {plan!r}")
    _check_options("jaxform.optimize", fn, exact=exact, strict=strict, memory=memory, tune=tune,
                   max_steps=max_steps)
    planned = passes is None if plan is None else bool(plan)
    pipeline = _pipeline(passes, exact)
    if memory == "default":
        memory = "auto" if passes is None else None
    _check_bound("jaxform.optimize", fn, memory, exact, max_steps)
    name = _fn_name(fn)
    if memory is not None and not exact:   # planned last: fusion first shrinks what loops remember
        pipeline += _passes.memory_pipeline(memory, max_steps, name)   # (not exact: XLA fuses recomputed ops anew)
    static_argnums, static_argnames = _jax.resolve_static_args(fn, static_argnums, static_argnames)
    cache: dict = {}
    decisions: list = []
    last_plan: list = []
    args_leaves: list = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _jax.jit_disabled():        # as jax.jit: run `fn` as written (prints, pdb, Python control flow)
            return fn(*args, **kwargs)
        n = len(args)
        static_pos = {i % n if i < 0 else i for i in static_argnums if n and i < n}   # as jax.jit
        # typed (as jax.jit keys them): 2, 2.0 and np.int32(2) are equal and hash alike, and trace apart
        statics = tuple((i, type(args[i]), args[i]) for i in sorted(static_pos)) + \
            tuple(sorted(((k, type(v), v) for k, v in kwargs.items() if k in static_argnames), key=lambda kv: kv[0]))
        positions = [i for i in range(n) if i not in static_pos]
        dyn = (tuple(args[i] for i in positions), {k: v for k, v in kwargs.items() if k not in static_argnames})
        leaves_paths, in_tree = jax.tree_util.tree_flatten_with_path(dyn)
        leaves = [l for _, l in leaves_paths]
        _check_leaves(fn, leaves, [p for p, _ in leaves_paths], positions)
        try:
            use = _plan.use_of(leaves) if planned else None     # plan for how the result will be used
            key = (in_tree, tuple(map(_aval_key, leaves)), statics, _jax.trace_context(), _plan.cost.planning_key())
            hash(key)
        except TypeError as e:
            raise TypeError(f"jaxform: a static argument of {name} is not hashable: {e}") from None
        # one entry per signature, holding a plan per use (forward, grad, vmap...): `None` where the plan is
        # the same for every use (nothing was planned), so such a program is traced once per signature
        uses = cache.get(key, {})
        entry = uses.get(None) or uses.get(use)
        if entry is None:
            args_leaves[:] = [leaves]
            with planning_contexts(args, positions, use):
                entry = _build(args, kwargs, len(leaves), use)
            args_leaves.clear()
            if entry[2]:
                cache.setdefault(key, {})[use if entry[3] else None] = entry
        closed, out_tree, _, _ = entry
        outs = _outputs(closed, _jax.emit_jaxpr(closed, *leaves))
        return jax.tree_util.tree_unflatten(out_tree, outs)

    def _build(args, kwargs, n_leaves, use):
        closed, out_tree = _jax.jit_trace(fn, static_argnums, static_argnames, args, kwargs)
        assert len(closed.jaxpr.invars) == n_leaves, "jaxform: argument flattening differs from jax.jit's"
        # Constants that are tracers of an enclosing transformation belong to this call only.
        cacheable = not any(isinstance(c, _jax.Tracer) for c in closed.consts)
        if not planned:
            return run_passes(closed, pipeline, strict=strict, where=name), out_tree, cacheable, False
        if _jax.has_scan3(closed):   # planned from the scans they are
            closed = run_passes(closed, [_passes.scans_from_ref_loops], strict=strict, where=name)
        traced = [c for c in closed.consts if isinstance(c, _jax.Tracer)]
        if traced and not closed.jaxpr.effects:
            return _build_open(closed, traced, out_tree)
        with _jax.classic_loops(), _plan.use.returns_loss_and_aux(_loss_and_aux(out_tree, closed)):
            chosen = _plan.plan(closed, pipeline, memory=memory, strict=strict, where=name, tune=tune,
                                example_args=args_leaves[0] if args_leaves else None, use=use)
        decisions[:] = chosen.decisions
        last_plan[:] = [chosen]
        return chosen.closed, out_tree, cacheable, chosen.budget is not None   # planned for this use

    def _build_open(closed, traced, out_tree):
        """`fn` closes over values of an enclosing transformation (`jax.grad(lambda w: optimize(lambda xs:
        f(xs, w))(xs))`): they are inputs of the program planned, so the use they tell is planned for (a
        closed-over parameter under jax.grad: the gradient w.r.t. it), then closed over again."""
        opened = _jax.consts_as_inputs(closed, traced)
        n = len(traced)
        use2 = _plan.use_of(list(traced) + list(args_leaves[0]))
        grad = next((s for s in use2.steps if isinstance(s, tuple) and s[0] == "grad"), None) if use2.known else None
        first, asked, known = _plan.cost.first_argument(), _plan.cost.asked_gradient(), _plan.cost.gradient_known()
        if grad is not None and any(i < n for i in grad[1]):
            first, asked, known = grad[1], _plan.cost.ASKED_CLOSED_OVER, True
        elif first is not None:
            first = [i + n for i in first]
        behind_jit = _plan.cost.gradient_behind_jit() and not known
        groups = [range(0, n)] + [range(r.start + n, r.stop + n) for r in _plan.cost.arguments()]
        batch = _plan.cost.batched_gradient()     # the values closed over are not batched
        batch = ((), False) if batch is None else ([((None,) * n + axes, size) for axes, size in batch[0]], batch[1])
        with _plan.cost.first_argument_is(first, asked, known, behind_jit), _plan.cost.arguments_are(groups), \
                _plan.cost.gradient_batched(*batch), _jax.classic_loops(), \
                _plan.use.returns_loss_and_aux(_loss_and_aux(out_tree, closed)):
            chosen = _plan.plan(opened, pipeline, memory=memory, strict=strict, where=name, tune=tune,
                                example_args=None, use=use2)
        decisions[:] = chosen.decisions
        last_plan[:] = [chosen]
        return _jax.inputs_as_consts(chosen.closed, traced), out_tree, False, True

    wrapper.cache_size = lambda: len(cache)
    wrapper.passes = tuple(pipeline)
    # what `jaxform.explain(wrapper, ...)` explains: this function with these settings (not a re-plan of its result)
    wrapper.jaxform_settings = dict(passes=passes, exact=exact, memory=memory, max_steps=max_steps, plan=plan)
    wrapper.decisions = lambda: list(decisions)   # the planner's decisions for the latest signature traced
    wrapper.plan = lambda: last_plan[0] if last_plan else None   # ... and the whole plan: use, what it spent
    return wrapper


# ---- filter_optimize ------------------------------------------------------------

def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class _Static:
    """A static leaf in a cache key: equal by `==` when hashable, else by identity (as equinox.filter_jit)."""
    __slots__ = ("value", "_hash")

    def __init__(self, value):
        self.value = value
        try:
            self._hash = hash((type(value), value))
        except TypeError:
            self._hash = None

    def __hash__(self):
        return id(self.value) if self._hash is None else self._hash

    def __eq__(self, other):
        if not isinstance(other, _Static) or type(self.value) is not type(other.value):
            return False
        if self._hash is None or other._hash is None:
            return self.value is other.value
        try:
            return bool(self.value == other.value)
        except Exception:
            return self.value is other.value


@jax.tree_util.register_static
class _Hole:
    """Stands in the traced arguments for a static leaf: a pytree node without leaves."""
    __slots__ = ("i",)

    def __init__(self, i):
        self.i = i

    def __hash__(self):
        return hash(self.i)

    def __eq__(self, other):
        return isinstance(other, _Hole) and other.i == self.i


def filter_optimize(fn: Callable | None = None, passes: Sequence | str | None = None, *, exact: bool = False,
                    strict: bool = False, memory="default", tune: bool = False, max_steps: int | None = None) -> Callable:
    """`optimize` with every non-array leaf of the arguments static, like `equinox.filter_jit`.

    Array leaves (jax/NumPy arrays and scalars) are traced; all other leaves
    (Python ints and floats, strings, functions, ...) are static, compared by
    `==` if hashable and by identity otherwise. Each distinct set of static
    leaves is its own cache entry, so an `int` field of a model (a hidden size)
    can drive Python control flow. Tracing errors name `fn` and the argument path.
    `memory`, `tune` and `max_steps` as in `optimize`.
    """
    if fn is None:
        return functools.partial(filter_optimize, passes=passes, exact=exact, strict=strict, memory=memory,
                                 tune=tune, max_steps=max_steps)
    if not callable(fn):
        raise TypeError(f"jaxform.filter_optimize expects a function, got {type(fn).__name__}")
    _check_options("jaxform.filter_optimize", fn, exact=exact, strict=strict, memory=memory, tune=tune,
                   max_steps=max_steps)
    pipeline = tuple(_pipeline(passes, exact))
    if memory == "default":
        memory = "auto" if passes is None else None
    _check_bound("jaxform.filter_optimize", fn, memory, exact, max_steps)
    inner_cache: dict = {}

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _jax.jit_disabled():
            return fn(*args, **kwargs)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        statics = tuple(None if _is_array(l) else _Static(l) for l in leaves)
        key = (tree, statics)
        inner = inner_cache.get(key)
        if inner is None:
            inner = inner_cache[key] = optimize(_with_statics(fn, leaves), passes, exact=exact, strict=strict,
                                                memory=memory, tune=tune, max_steps=max_steps)
        holed = [l if _is_array(l) else _Hole(i) for i, l in enumerate(leaves)]
        a, k = jax.tree_util.tree_unflatten(tree, holed)
        return inner(*a, **k)

    wrapper.cache_size = lambda: sum(f.cache_size() for f in inner_cache.values())
    wrapper.passes = pipeline
    return wrapper


def _with_statics(fn, leaves):
    """`fn` taking the arguments with static leaves replaced by holes, and filling them back in."""
    statics = {i: l for i, l in enumerate(leaves) if not _is_array(l)}

    @functools.wraps(fn)
    def filled(*args, **kwargs):
        fill = lambda x: statics[x.i] if isinstance(x, _Hole) else x
        a, k = jax.tree_util.tree_map(fill, (args, kwargs), is_leaf=lambda x: isinstance(x, _Hole))
        return fn(*a, **k)

    return filled
