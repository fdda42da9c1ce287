"""The one compatibility layer over JAX internals.

Everything jaxform needs from `jax._src` goes through here, so a JAX upgrade
touches one file. Tested against JAX 0.10.x, 0.11.x and 0.12.x (see pyproject.toml):
the differences between them are the adapters in "JAX versions" below, so that the
IR and every pass see one canonical layout (JAX 0.10's).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any

import jax
import jax.extend.core as jex
import jax.extend.source_info_util as _public_siu
# What has no public equivalent on every supported version (0.10-0.12) comes from jax._src; each
# use says why (the list is in docs/testing.md, "What still needs jax._src").
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import source_info_util as _siu
from jax._src.interpreters import partial_eval as _pe

Var = jex.Var
Literal = jex.Literal
DropVar = jex.DropVar
Jaxpr = jex.Jaxpr
ClosedJaxpr = jex.ClosedJaxpr
JaxprEqn = jex.JaxprEqn
Primitive = jex.Primitive
JaxprTypeError = jex.JaxprTypeError
Tracer = jax.core.Tracer
ShapedArray = jax.core.ShapedArray
no_effects = jex.no_effects
new_jaxpr_eqn = jex.new_jaxpr_eqn
jaxpr_as_fun = jex.jaxpr_as_fun


def get_aval(x: Any):
    """The abstract value of an array, scalar or tracer."""
    return jax.typeof(x)


def check_jaxpr(closed: ClosedJaxpr, like: ClosedJaxpr | None = None) -> None:
    """Type-check a jaxpr (raises JaxprTypeError).

    `like`: a program already verified (traced by JAX, or checked) that `closed` was rewritten from. An
    equation with the primitive, params (with their types), context and input types of one JAX checked
    in `like` (its top level, and jit bodies, which JAX checks in full) keeps that one's output types:
    only the equations a pass made are evaluated again, one at a time, and variable scoping is checked in
    full. Rewritten train steps re-evaluated every type, 5-10% of their compile. Whatever this check
    cannot vouch for (effects, refs, a mismatch) gets JAX's whole check and its error.
    """
    if like is not None and not closed.jaxpr.effects and not _core.config.debug_key_reuse.value:
        try:
            if _check_scoping(closed.jaxpr, _typings(like.jaxpr, {})):
                return
        except Exception:
            pass   # JAX's check below decides, with its message
    jex.check_jaxpr(closed.jaxpr)


def _param_key(v):
    """A param as a key: its type at every level (`(0.0, 0.0) == (0, 0)`, and a slice's float start is an error)."""
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(map(_param_key, v)))
    return (type(v), v)


def _typing_key(eqn):
    """What an equation's types are a function of; None where params cannot be keyed (unhashable)."""
    try:
        key = (eqn.primitive, tuple((k, _param_key(v)) for k, v in eqn.params.items()), eqn.ctx,
               tuple(x.aval for x in eqn.invars))
        hash(key)
        return key
    except TypeError:
        return None


def _typings(jaxpr, known: dict) -> dict:
    """The equations JAX's check types in full in a verified jaxpr: its own, and those of jit bodies (the
    rules of scan, cond, custom derivatives and shard_map check a body's signature, or in another context),
    each keyed to its output types and effects."""
    for eqn in jaxpr.eqns:
        key = _typing_key(eqn)
        if key is not None:
            known[key] = ([v.aval for v in eqn.outvars], eqn.effects)
        if eqn.primitive.name in ("jit", "pjit"):
            _typings(eqn.params["jaxpr"].jaxpr, known)
    return known


_ONE_EQUATION = jex.DebugInfo("jaxform check_jaxpr", "one equation a pass made", None, None)


def _plain(v) -> bool:
    return type(v.aval) is _core.ShapedArray


def _check_scoping(jaxpr, known: dict) -> bool:
    """True when every variable is bound once before use and each equation's types are vouched for by
    `known` (the same types, up to weak type) or by JAX's check of that one equation; False where JAX's
    whole check must decide (refs, tokens and other types, dropped binders, any doubt)."""
    binders = [*jaxpr.constvars, *jaxpr.invars]
    bound = set(binders)
    if len(bound) != len(binders) or not all(isinstance(v, _core.Var) and not isinstance(v, _core.DropVar)
                                             and _plain(v) and getattr(v, "initial_qdd", None) is None
                                             for v in binders):     # (state a binder carries: JAX's check)
        return False

    def readable(x):
        if isinstance(x, _core.Literal):
            return _core.typecheck(x.aval, x.val)
        return x in bound

    same = lambda a, b: a.strip_weak_type() == b.strip_weak_type()   # noqa: E731
    for eqn in jaxpr.eqns:
        if eqn.effects or not all(map(readable, eqn.invars)) or \
                not all(_plain(x) for x in (*eqn.invars, *eqn.outvars)):
            return False
        key = _typing_key(eqn)
        typed = known.get(key) if key is not None else None
        if typed is None:
            inputs = list(dict.fromkeys(x for x in eqn.invars if isinstance(x, _core.Var)))
            outputs = [v for v in eqn.outvars if not isinstance(v, _core.DropVar)]
            jex.check_jaxpr(_core.Jaxpr(constvars=[], invars=inputs, outvars=outputs, eqns=[eqn],
                                        debug_info=_ONE_EQUATION))
        elif typed[1] or len(typed[0]) != len(eqn.outvars) or \
                not all(map(same, (v.aval for v in eqn.outvars), typed[0])):
            return False     # (an effect the equation dropped; other types)
        for v in eqn.outvars:
            if not isinstance(v, _core.DropVar):
                if v in bound:
                    return False
                bound.add(v)
    return all(readable(x) and _plain(x) for x in jaxpr.outvars)


def eval_jaxpr(closed: ClosedJaxpr, *args):
    """Evaluate by binding each primitive: runs under whatever trace is active. (jax._src: the public
    `jaxpr_as_fun` also turns `jax_debug_nans` off while it runs, which would hide a user's NaN check.)"""
    return _core.eval_jaxpr(closed.jaxpr, closed.consts, *args)


def emit_jaxpr(closed: ClosedJaxpr, *args):
    """`eval_jaxpr`, but under a jit/make_jaxpr trace whose tracers every arg is (of the program's input
    types), copy the equations into that trace as they are instead of binding each again: binding re-runs
    every abstract evaluation, about a third of what `optimize` added to a train step's compile (JAX
    inlines a `jit(inline=True)` body the same way). The program is one this process traced and verified,
    so its types stand. Each equation keeps its own source line and name stack, as `eval_jaxpr` gives it.
    Bound again as before: effects, hijax primitives (the trace must know of them to lower them), and a
    program that closes over a value of the trace."""
    trace, jaxpr = _core.trace_ctx.trace, closed.jaxpr
    if not (isinstance(trace, _pe.DynamicJaxprTrace) and args and len(args) == len(jaxpr.invars)
            and all(isinstance(a, _pe.DynamicJaxprTracer) and a._trace is trace and a.aval == v.aval
                    for a, v in zip(args, jaxpr.invars))
            and not jaxpr.effects and not any(isinstance(c, Tracer) for c in closed.consts)
            and not any(e.primitive.is_high(*[x.aval for x in e.invars], **e.params) for e in jaxpr.eqns)):
        return eval_jaxpr(closed, *args)
    here = _siu.current()
    env = dict(zip(jaxpr.constvars, [trace.new_const(c, source_info=here) for c in closed.consts]))
    env.update(zip(jaxpr.invars, args))

    def read(x, src):
        return _pe.DynamicJaxprTracer(trace, x.aval, x, src) if isinstance(x, _core.Literal) else env[x]

    for eqn in jaxpr.eqns:
        src = here.replace(traceback=eqn.source_info.traceback or here.traceback,
                           name_stack=here.name_stack + eqn.source_info.name_stack)
        ins, avals = [read(x, src) for x in eqn.invars], [v.aval for v in eqn.outvars]
        folded = _pe.try_constant_folding(eqn.primitive, ins, eqn.params, avals)
        outs = [trace.new_const(c, source_info=src, aval=a) for c, a in zip(folded, avals)] if folded is not None \
            else trace.emit_eqn(ins, avals, eqn.primitive, eqn.params, eqn.effects, src, eqn.ctx)
        for v, t in zip(eqn.outvars, outs):
            env.setdefault(v, t)
    return [trace.to_jaxpr_tracer(read(x, here), here) for x in jaxpr.outvars]


def jaxpr_effects(constvars, invars, outvars, eqns):
    """The effects of a jaxpr made of these parts (input effects resolved to its vars)."""
    return _pe.make_jaxpr_effects(constvars, invars, outvars, eqns)


def input_effect_target(eff):
    """For an effect tied to an input (a Ref read/write), that input's Var; else None."""
    if isinstance(eff, _effects.JaxprInputEffect):
        return eff.input
    return None


def retarget_effect(eff, var):
    return eff.replace(var)


def is_literal(x) -> bool:
    return isinstance(x, jex.Literal)


def is_dropvar(x) -> bool:
    return isinstance(x, jex.DropVar)


def is_ref_aval(aval) -> bool:
    return isinstance(aval, jax.ref.AbstractRef)


def source_summary(source_info) -> str:
    """'file.py:12 (fn)' for the innermost user frame of an equation, or ''."""
    if source_info is None:
        return ""
    try:
        return _public_siu.summarize(source_info)
    except Exception:
        return ""


def user_frame(source_info):
    """(file, line, function) of the innermost user frame, or None."""
    if source_info is None:
        return None
    frame = _siu.user_frame(source_info.traceback)
    if frame is None:
        return None
    return frame.file_name, frame.start_line, frame.function_name


def transposed(source_info) -> bool:
    """Was this equation made by the backward pass of reverse-mode AD? JAX names the step in its name stack
    ("transpose(jvp(loss))", under `vmap` for jacrev) on every version we support; `add_any` alone misses a
    chain's gradient. Not `jax.linear_transpose`'s "transpose(...)" alone: a tied-weights decoder made that way
    is a forward, and taken for a gradient its budget was judged on the wrong program (round 20's A)."""
    return "transpose(jvp(" in str(getattr(source_info, "name_stack", "") or "")


def inlined_source_info(outer, inner):
    """The source info of an equation spliced out of a call into its caller: the call's name stack before the
    equation's own, as JAX's own inlining does, so that "transpose(jvp(...))" of a transposed jit call stays
    on the equations of its body (a gradient of jitted layers was no longer told for a gradient once inlined)."""
    try:
        return inner.replace(name_stack=outer.name_stack + inner.name_stack)
    except (AttributeError, TypeError):     # (a JAX without name stacks on source info: left as it was)
        return inner


def new_source_info():
    """Source info for the code that is calling now (used for nodes built by hand)."""
    return _public_siu.current()


def abstract_eval(prim: Primitive, avals, params):
    """Output avals and effects of binding `prim` on operands of these avals."""
    out, effs = prim.abstract_eval(*avals, **params)
    outs = list(out) if prim.multiple_results else [out]
    return outs, effs


@functools.cache
def _all_primitives() -> dict[str, Primitive]:
    found: dict[str, Primitive] = {}
    mods = ["jax._src.lax.lax", "jax._src.lax.control_flow.loops", "jax._src.lax.control_flow.conditionals",
            "jax._src.lax.slicing", "jax._src.lax.special", "jax._src.lax.linalg", "jax._src.lax.parallel",
            "jax._src.lax.convolution", "jax._src.lax.windowed_reductions", "jax._src.lax.fft",
            "jax._src.pjit", "jax._src.core", "jax._src.custom_derivatives", "jax._src.ad_checkpoint",
            "jax._src.state.primitives", "jax._src.prng", "jax._src.random", "jax._src.ad_util",
            "jax._src.lax.ann", "jax._src.lax.control_flow.for_loop", "jax._src.callback", "jax._src.debugging"]
    mods += ["jax.extend.core.primitives"]
    for name in mods:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for v in vars(mod).values():
            if isinstance(v, _core.Primitive):
                found.setdefault(v.name, v)
    return found


def primitive(name: str) -> Primitive:
    """Look a primitive up by its jaxpr name ('add', 'scan', 'dot_general', ...)."""
    prims = _all_primitives()
    if name not in prims:
        import difflib
        close = difflib.get_close_matches(name, prims, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"jaxform: no JAX primitive named {name!r}.{hint}")
    return prims[name]


def discharge_state(closed: ClosedJaxpr, should_discharge=True) -> ClosedJaxpr:
    """Turn Ref-using code (new_ref/get/swap/addupdate, refs in loops) into pure code.

    Ref *inputs* become extra outputs holding their final values (JAX's
    convention); a jaxpr whose refs are all internal keeps its signature.
    `should_discharge` (one bool per input) limits this to some Ref inputs.
    """
    from jax._src.state import discharge
    return discharge.discharge_state(closed, should_discharge=should_discharge)


def is_unspecified(sharding) -> bool:
    """True for the 'no sharding requested' marker in jit params."""
    from jax._src.sharding_impls import UnspecifiedValue
    return isinstance(sharding, UnspecifiedValue)


@functools.cache
def _optional_params() -> dict[str, dict[str, Any]]:
    """Params that tracing fills with None when the user asks for nothing (accuracy, shardings).

    Read off jaxprs of representative lax calls, so that nodes built by hand
    (Graph.add, Builder) need only the params that matter.
    """
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    # numpy example inputs, traced as arguments: nothing leaks into a trace that is active when this first runs
    calls = [lambda x, m: [f(x) for f in (lax.sin, lax.cos, lax.tan, lax.exp, lax.exp2, lax.log, lax.log1p,
                                         lax.expm1, lax.tanh, lax.logistic, lax.sqrt, lax.rsqrt, lax.cbrt)],
             lambda x, m: (x.sum(0), x.max(0), x.min(0), x.prod(0), m.sum(0), jnp.argmax(x, 0), x.astype(jnp.int32)),
             lambda x, m: (lax.broadcast_in_dim(x, (3, 2, 2), (1, 2)), x @ x, x.reshape(4), lax.iota(jnp.int32, 3),
                           jnp.zeros(3), lax.reduce_precision(x, 5, 10), jnp.cumsum(x, 0), x * x)]
    found: dict[str, dict[str, Any]] = {}
    for c in calls:
        for e in jax.make_jaxpr(c)(np.ones((2, 2), np.float32), np.ones((2, 2), np.int32)).eqns:
            found.setdefault(e.primitive.name, {}).update({k: None for k, v in e.params.items() if v is None})
    return found


def complete_params(prim: Primitive, params: dict) -> dict:
    """`params` plus any optional params (set to None) that `prim` expects but the caller left out."""
    return {**_optional_params().get(prim.name, {}), **params}


# ---- JAX versions: one adapter per concept ------------------------------------
# jaxform's IR and passes see JAX 0.10's layout: scan params hold `num_consts` and
# `num_carry`, a ClosedJaxpr pairs an open Jaxpr with its consts. `Graph.from_jaxpr`
# passes each equation's params through `canonical_params`, `Node.full_params` through
# `jax_params`; everything else about a version is picked here once, by feature detection.

JAX_VERSION: tuple[int, ...] = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

CALL_PRIMITIVE: str = jex.primitives.closed_call_p.name
"""The name of JAX's plain call of a closed jaxpr: 'closed_call' (0.10), 'eval_jaxpr' (0.11+, which
merged call_p and closed_call_p into eval_jaxpr_p). Its body is the `call_jaxpr` param either way."""


def _consts_on_jaxpr() -> bool:
    """0.11+: ClosedJaxpr is Jaxpr, whose leading `consts` make the first invars constvars."""
    return jex.ClosedJaxpr is jex.Jaxpr


def closed_jaxpr(constvars, invars, outvars, eqns, effects, debug_info, consts) -> ClosedJaxpr:
    """A closed jaxpr from its parts. On 0.12 a Jaxpr built with constvars but no `consts=` would
    turn its constvars into leading inputs, so the consts go in at construction."""
    if _consts_on_jaxpr():
        return jex.Jaxpr(constvars, invars, outvars, eqns, effects, debug_info, consts=list(consts))
    return jex.ClosedJaxpr(jex.Jaxpr(constvars, invars, outvars, eqns, effects, debug_info), list(consts))


def consts_as_inputs(closed: ClosedJaxpr, traced: list) -> ClosedJaxpr:
    """`closed` with its constants that are in `traced` (tracers of an enclosing transformation, by identity)
    made leading inputs, in that order; the other constants stay."""
    at = {id(c): k for k, c in enumerate(traced)}
    specs = [spec_of(get_aval(c)) for c in traced] + [spec_of(a) for a in closed.in_avals]

    def opened(*a):
        consts = [a[at[id(c)]] if id(c) in at else c for c in closed.consts]
        return _core.eval_jaxpr(closed.jaxpr, consts, *a[len(traced):])
    return jax.make_jaxpr(opened)(*specs)


def inputs_as_consts(closed: ClosedJaxpr, values: list) -> ClosedJaxpr:
    """`closed` with its leading inputs bound to `values` (tracers of the enclosing trace: constants again)."""
    n = len(values)
    return jax.make_jaxpr(lambda *a: _core.eval_jaxpr(closed.jaxpr, closed.consts, *values, *a))(
        *[spec_of(a) for a in closed.in_avals[n:]])


class LayoutHint:
    """The version-specific form of canonical params that counts alone cannot rebuild (0.11+ scan's
    FlatTree nesting), kept so a round trip gives back the same equation. All hints compare equal:
    they never tell two nodes apart (CSE) and the printer hides them."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, LayoutHint)

    def __hash__(self):
        return hash(LayoutHint)

    def __repr__(self):
        return "LayoutHint"


_HINT = "_jax_layout"


class _ScanFlatTrees:
    """0.11+: scan's `num_consts`/`num_carry` became FlatTrees `ft_in` = (consts, carry, xs) and
    `ft_out` = (carry, ys), every leaf None; only the top-level split means anything to JAX."""

    @staticmethod
    def applies() -> bool:
        import inspect
        from jax._src.lax.control_flow import loops
        return "ft_in" in inspect.signature(loops._scan_abstract_eval).parameters

    @staticmethod
    def from_jax(p: dict) -> dict:
        ft_in, ft_out = p.pop("ft_in"), p.pop("ft_out")
        consts, carry, _ = ft_in.unpack()
        p["num_consts"], p["num_carry"] = len(consts), len(carry)
        p[_HINT] = LayoutHint((ft_in, ft_out))
        return p

    @staticmethod
    def to_jax(p: dict) -> dict:
        from jax._src import flattree as ft
        c, k = p.pop("num_consts"), p.pop("num_carry")
        hint = p.pop(_HINT, None)
        body = p["jaxpr"]
        x, y = len(body.in_avals) - c - k, len(body.out_avals) - k
        if hint is not None:
            ft_in, ft_out = hint.value
            if [len(t) for t in ft_in.unpack()] == [c, k, x] and [len(t) for t in ft_out.unpack()] == [k, y]:
                p["ft_in"], p["ft_out"] = ft_in, ft_out
                return p
        p["ft_in"] = ft.pack((ft.nones(c), ft.nones(k), ft.nones(x)))
        p["ft_out"] = ft.pack((ft.nones(k), ft.nones(y)))
        return p


# primitive name -> adapter, for the adapters that apply to the running JAX
_PARAM_ADAPTERS: dict[str, Any] = {name: a for name, a in [("scan", _ScanFlatTrees)] if a.applies()}


def canonical_params(prim: Primitive, params: dict) -> dict:
    """An equation's params in jaxform's layout (a new dict; region params are left as they are)."""
    a = _PARAM_ADAPTERS.get(prim.name)
    return a.from_jax(dict(params)) if a else dict(params)


def jax_params(prim: Primitive, params: dict) -> dict:
    """Canonical params (regions already turned back into jaxprs) in the running JAX's layout."""
    a = _PARAM_ADAPTERS.get(prim.name)
    return a.to_jax(dict(params)) if a else params


def primitive_harnesses() -> list | None:
    """JAX's own primitive test harnesses (jax._src.internal_test_util.test_harnesses); None if absl-py is missing.

    5,594 small programs over 132 primitives (JAX 0.10.2), each with `dyn_fun`,
    `dyn_args_maker(rng)`, `group_name`, `fullname`, `filter(device)` and
    `jax_unimplemented`: the peer suite in tests/peer/test_harnesses.py runs them
    through the Graph round trip and the default pipeline.
    """
    try:
        from jax._src.internal_test_util import test_harnesses
    except ImportError:  # the module imports absl.testing
        return None
    return test_harnesses.all_harnesses


def with_weak_type(x, weak: bool):
    """`x` with its weak type set as given (same dtype and value); JAX exposes no public way to
    make a value weakly typed, which `jaxform.scan` needs to give results the types lax.scan gives."""
    from jax._src.lax import lax as _lax
    return _lax._convert_element_type(x, x.dtype, weak_type=weak)


# ---- jax.jit's rules, for `optimize` (static arguments, config key, tracing with debug info) ----

def trace_context() -> tuple:
    """The configuration state jax.jit keys its caches on (x64, rank promotion, matmul precision, ...)."""
    from jax._src import config
    return config.trace_context()


def is_typed_key(x) -> bool:
    """A typed PRNG key array (`jax.random.key`), which numpy cannot hold: its bits are `key_data`."""
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def key_data(x):
    return jax.random.key_data(x)


def jit_disabled() -> bool:
    """Whether `jax.disable_jit()` is in force: `optimize` then runs the function as written, as jit does."""
    return bool(jax.config.jax_disable_jit)


def resolve_static_args(fn, static_argnums, static_argnames) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """jax.jit's static_argnums/static_argnames, completed from `fn`'s signature and validated as jit does."""
    from jax._src import api_util
    _, _, nums, names = api_util.resolve_argnums(fn, api_util.fun_signature(fn), None, None,
                                                 static_argnums, static_argnames)
    return nums, names


def jit_trace(fn, static_argnums, static_argnames, args, kwargs):
    """Trace `fn` as jax.jit does: its static-argument rules, and its errors naming `fn` and argument paths.

    Returns (closed jaxpr, out_tree). Tracers of an enclosing transformation that
    `fn` closes over become leading consts of the closed jaxpr (as with make_jaxpr);
    its invars are the leaves of the dynamic arguments in jit's order.
    """
    t = jax.jit(fn, static_argnums=static_argnums, static_argnames=static_argnames).trace(*args, **kwargs)
    closed, n = t.jaxpr, t._num_consts
    if n:
        jaxpr = closed.jaxpr
        dbg = jaxpr.debug_info
        if dbg.arg_names is not None:
            dbg = dbg._replace(arg_names=dbg.arg_names[n:])
        jaxpr = jaxpr.replace(constvars=[*jaxpr.constvars, *jaxpr.invars[:n]], invars=jaxpr.invars[n:],
                              debug_info=dbg)
        closed = ClosedJaxpr(jaxpr, [*closed.consts, *t._consts])
    return closed, t.out_tree


def spec_of(aval) -> jax.ShapeDtypeStruct:
    """A ShapeDtypeStruct that traces back to `aval`: shape, dtype, weak type, and where set, its
    sharding (an explicit-axes mesh) and manual-axis type (shard_map's varying axes). Passes
    that re-trace a piece of a program (remat_loops, fission) would otherwise change its signature."""
    sharding = getattr(aval, "sharding", None)
    if sharding is not None and getattr(sharding, "mesh", None) is not None and sharding.mesh.empty:
        sharding = None   # no mesh: as a plain trace makes it
    mat = getattr(aval, "mat", None)
    mat = None if mat is None or mat.empty else mat
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False),
                                sharding=sharding, manual_axis_type=mat)


def as_output(x, aval):
    """`x` as the jax Array jit would return for `aval` (eval_jaxpr hands back literals and inputs as they are)."""
    if isinstance(x, jax.Array):
        return x
    from jax._src.lax import lax as _lax
    import numpy as np
    return _lax._convert_element_type(x, np.dtype(aval.dtype), getattr(aval, "weak_type", False))


# ---- loops over refs (JAX 0.12's `Scan3`) -------------------------------------

HI_PRIMITIVE = "call_hi_primitive"
"""0.12+: the one primitive behind every `hijax.HiPrim` (Scan3, RematTraced, ...); the object
itself rides in the `_prim` param."""


def scan3_loop(params: dict):
    """For a `Scan3` equation (jax_scan3 on, 0.12+): (extensives, length, body, reverse, unroll),
    body a ClosedJaxpr `(*operands sliced where extensive) -> ys[t]` whose Ref operands are the
    carries; None for anything else (and on versions without Scan3)."""
    prim = params.get("_prim")
    if prim is None:
        return None
    try:
        from jax._src.lax.control_flow.loops import Scan3
    except ImportError:
        return None
    if type(prim) is not Scan3:
        return None
    body = prim.jaxpr
    if not isinstance(body, ClosedJaxpr):
        body = ClosedJaxpr(body, ())
    return list(prim.extensives), int(prim.length), body, bool(prim.reverse), prim.unroll


def has_scan3(jaxpr) -> bool:
    """Does this (closed) jaxpr hold a Scan3 at any depth? Read off the equations, no Graph built."""
    for eqn in jaxpr.eqns:
        if scan3_loop(eqn.params) is not None:
            return True
        if any(has_scan3(sub) for sub in jex.jaxprs_in_params(eqn.params)):
            return True
    return False


LOOP_FLAGS = ("jax_scan3", "jax_remat3")
"""JAX 0.12's opt-in loop and remat rebuilt on refs (jax-ml/jax PR 36435); absent before 0.12."""


def loop_flags() -> dict[str, bool]:
    """The flags of LOOP_FLAGS this JAX has, with their current values."""
    return {f: bool(getattr(jax.config, f)) for f in LOOP_FLAGS if hasattr(jax.config, f)}


@contextlib.contextmanager
def classic_loops():
    """jaxform's own tracing (a pass re-tracing a loop under `jax.checkpoint`, the planner's gradient
    view) builds `scan`/`checkpoint` equations, which every JAX version can differentiate and batch:
    0.12's `Scan3` has no vjp or batching rule yet. User code is never traced under this."""
    from jax._src import config as _config
    states = [getattr(_config, f[len("jax_"):]) for f in loop_flags()]
    with contextlib.ExitStack() as stack:
        for st in states:
            stack.enter_context(st(False))
        yield


@functools.cache
def _scan_param_names() -> frozenset:
    import numpy as np
    from jax import lax
    with classic_loops():
        j = jax.make_jaxpr(lambda c, x: lax.scan(lambda c, x: (c, x), c, x))(np.float32(0), np.zeros(1, np.float32))
    (eqn,) = [e for e in j.eqns if e.primitive.name == "scan"]
    return frozenset(canonical_params(eqn.primitive, eqn.params))


def scan_params(*, length: int, reverse: bool, unroll, num_consts: int, num_carry: int, num_operands: int) -> dict:
    """Canonical params of a new `scan` node (its body goes in as the region), for the running JAX."""
    p = dict(length=length, reverse=reverse, unroll=unroll, num_consts=num_consts, num_carry=num_carry)
    names = _scan_param_names()
    if "linear" in names:
        p["linear"] = (False,) * num_operands
    if "_split_transpose" in names:
        p["_split_transpose"] = False
    return p


# ---- a primitive of jaxform's own: a tangent guard whose transpose raises ---------------

@functools.cache
def transpose_error_primitive():
    """`guard_p.bind(t, message=...)`: the identity (evaluation, jvp, vmap, lowering) whose transpose
    raises `message`. Put on a tangent, it lets forward mode through and stops reverse mode with an error
    that teaches (JAX's `linear_call` has no batching rule; a custom_vjp would stop forward mode)."""
    from jax.interpreters import ad, batching, mlir

    p = jex.Primitive("jaxform_no_transpose")
    p.def_impl(lambda x, *, message, error: x)
    p.def_abstract_eval(lambda x, *, message, error: x)

    def transpose(ct, x, *, message, error):
        raise error(message)
    ad.deflinear2(p, transpose)
    batching.primitive_batchers[p] = lambda args, dims, **kw: (p.bind(*args, **kw), dims[0])
    mlir.register_lowering(p, lambda ctx, x, **kw: [x])
    return p


# ---- a linear map with its own transpose: jaxform's own primitive ---------------------------------------------
# `jax.custom_derivatives.linear_call(f, f_transpose, residuals, linear)` is JAX's public way to give a linear map
# its own transpose (revolve's forward mode: the tangent is the plain scan's JVP, its transpose the binomial
# schedule). JAX has no batching rule for it (0.10-0.12), and its jvp rule asserts that residuals have no tangent
# (forward over reverse gives them one). jaxform does not patch JAX's primitive: what a user's own `linear_call`
# does must not depend on whether jaxform ran earlier in the process (issue 40, finding 3). `linear_map` binds a
# primitive of jaxform's own, `jaxform_linear_call`, with the rules it needs; nothing is registered for JAX's.

def _vmap_closed(closed: ClosedJaxpr, in_axes: list, size: int, axis_name=None, spmd_name=None) -> ClosedJaxpr:
    """`closed` under vmap of `size` with `in_axes` (0 or None each), all outputs at 0; under the caller's
    axis name (a collective in the map names it) and with the inputs' weak types kept."""
    specs = [jax.ShapeDtypeStruct(a.shape if ax is None else (size, *a.shape), a.dtype,
                                  weak_type=getattr(a, "weak_type", False)) for a, ax in zip(closed.in_avals, in_axes)]
    kw = {} if spmd_name is None else {"spmd_axis_name": spmd_name}
    return jax.make_jaxpr(jax.vmap(lambda *a: _core.eval_jaxpr(closed.jaxpr, closed.consts, *a),
                                   in_axes=tuple(in_axes), out_axes=0, axis_size=size, axis_name=axis_name,
                                   **kw))(*specs)


def _hoisted(fn, specs) -> tuple[ClosedJaxpr, list, Any]:
    """`fn`'s jaxpr, flat, with its constants made leading inputs (they may be tracers of an outer trace),
    the constants, and the tree of `fn`'s output."""
    tree = []

    def flat(*a):
        leaves, t = jax.tree_util.tree_flatten(fn(*a))
        tree.append(t)
        return leaves
    closed = jax.make_jaxpr(flat)(*specs)
    return jex.ClosedJaxpr(_pe.convert_constvars_jaxpr(closed.jaxpr), ()), list(closed.consts), tree[-1]


# The primitive's operands: the callee's constants, the transpose's constants, the residuals, the linear
# operands. Both functions are jaxprs over (their constants, residuals, linear operands / cotangents), traced
# when the map is made, so a value either closes over from an enclosing trace is an operand like any other
# (batched, differentiated, transposed with the rest) and never outlives its trace.

def _split(args, num_consts, num_tconsts, num_res):
    a, b, c = num_consts, num_consts + num_tconsts, num_consts + num_tconsts + num_res
    return args[:a], args[a:b], args[b:c], args[c:]


def _linear_map_impl(*args, callee, transpose, num_consts, num_tconsts, num_res):
    consts, _, res, lin = _split(args, num_consts, num_tconsts, num_res)
    return _core.eval_jaxpr(callee.jaxpr, (), *consts, *res, *lin)


def _linear_map_jvp(primals, tangents, **params):
    """The tangent is linear in the linear operands' tangents: the same map (so reverse mode later runs the
    given transpose). Tangents of consts/residuals (forward over reverse: a Hessian-vector product through
    revolve's transposed schedule) add the callee's derivative w.r.t. them, the linear operands held at their
    values: `jax.jvp` of the callee, which gives the primal output too (the callee runs once for it). The
    transpose's constants do not change the output: their tangents do not reach it."""
    from jax.interpreters import ad
    p = linear_map_primitive()
    nc, nt, nr = params["num_consts"], params["num_tconsts"], params["num_res"]
    callee = params["callee"]
    n = nc + nt + nr
    nonzero = [type(t) is not ad.Zero for t in tangents]
    t_lin = None
    if any(nonzero[n:]):
        t_lin = p.bind(*primals[:n], *[ad.instantiate_zeros(t) for t in tangents[n:]], **params)
    own = [k for k in (*range(nc), *range(nc + nt, n)) if nonzero[k]]    # consts and residuals with a tangent
    if not own:
        out = p.bind(*primals, **params)
        return out, t_lin if t_lin is not None else [jax.numpy.zeros_like(o) for o in out]   # (JAX never asks)
    consts, _, res, lin = _split(list(primals), nc, nt, nr)

    def of_own(*d):
        vals = list(primals)
        for k, v in zip(own, d):
            vals[k] = v
        c, _, r, _ = _split(vals, nc, nt, nr)
        return _core.eval_jaxpr(callee.jaxpr, (), *c, *r, *lin)
    out, t_res = jax.jvp(of_own, tuple(primals[k] for k in own), tuple(tangents[k] for k in own))
    t_out = list(t_res) if t_lin is None else [a + b for a, b in zip(t_res, t_lin)]
    return list(out), t_out


def _linear_map_transpose(cts, *args, callee, transpose, num_consts, num_tconsts, num_res):
    """Run the given transpose on the cotangents; its own transpose is the callee (`linear_map` twice)."""
    from jax.interpreters import ad
    consts, tconsts, res, lin = _split(args, num_consts, num_tconsts, num_res)
    cts_avals = transpose.in_avals[num_tconsts + num_res:]
    cts = [jax.numpy.zeros(a.shape, a.dtype) if type(ct) is ad.Zero else ct for ct, a in zip(cts, cts_avals)]
    out = linear_map_primitive().bind(*tconsts, *consts, *res, *cts, callee=transpose, transpose=callee,
                                      num_consts=num_tconsts, num_tconsts=num_consts, num_res=num_res)
    # a linear operand that is not an undefined primal (known zeros, say) gets no cotangent
    return [None] * (num_consts + num_tconsts + num_res) + \
        [c if ad.is_undefined_primal(x) else None for c, x in zip(out, lin)]


def _linear_map_batch(axis_data, args, dims, *, callee, transpose, num_consts, num_tconsts, num_res):
    """Both functions batched alike: constants and residuals keep their batch axes (moved to 0), the linear
    operands are batched at 0 (so the transpose's cotangents line up), outputs at 0; under the vmap's axis
    name, so a collective in the map still finds its axis."""
    from jax.interpreters import batching
    p = linear_map_primitive()
    params = dict(num_consts=num_consts, num_tconsts=num_tconsts, num_res=num_res)
    if all(d is None for d in dims):
        out = p.bind(*args, callee=callee, transpose=transpose, **params)
        return out, [None] * len(out)
    size, name, spmd = axis_data.size, axis_data.name, getattr(axis_data, "spmd_name", None)
    nfix = num_consts + num_tconsts + num_res
    fixed = [a if d is None else jax.numpy.moveaxis(a, d, 0) for a, d in zip(args[:nfix], dims[:nfix])]
    axes = [None if d is None else 0 for d in dims[:nfix]]
    lin = [batching.bdim_at_front(a, d, size) for a, d in zip(args[nfix:], dims[nfix:])]
    c_axes, t_axes, r_axes = _split(axes, num_consts, num_tconsts, num_res)[:3]
    b_callee = _vmap_closed(callee, [*c_axes, *r_axes] + [0] * len(lin), size, name, spmd)
    n_cts = len(transpose.in_avals) - num_tconsts - num_res
    b_transpose = _vmap_closed(transpose, [*t_axes, *r_axes] + [0] * n_cts, size, name, spmd)
    out = p.bind(*fixed, *lin, callee=b_callee, transpose=b_transpose, **params)
    return out, [0] * len(out)


@functools.cache
def linear_map_primitive() -> Primitive:
    """`jaxform_linear_call`: JAX's `linear_call` as a primitive of jaxform's own, with a batching rule and a
    jvp rule for tangents of the residuals. Made once; JAX's own primitives are left as they are."""
    from jax._src.interpreters import batching
    from jax.interpreters import ad, mlir
    p = jex.Primitive("jaxform_linear_call")
    p.multiple_results = True
    p.def_impl(_linear_map_impl)
    p.def_abstract_eval(lambda *args, callee, **_: callee.out_avals)
    ad.primitive_jvps[p] = _linear_map_jvp
    ad.primitive_transposes[p] = _linear_map_transpose
    batching.fancy_primitive_batchers[p] = _linear_map_batch   # (axis data: the vmap's name and size)
    mlir.register_lowering(p, mlir.lower_fun(_linear_map_impl, multiple_results=True))
    return p


def linear_map(fun, fun_transpose, residual_args, linear_args):
    """`jax.custom_derivatives.linear_call(fun, fun_transpose, residual_args, linear_args)` (same contract:
    `fun(res, lin)` linear in `lin`, `fun_transpose(res, ct)` its transpose) on jaxform's own primitive,
    which also batches (under the vmap's axis name) and takes forward mode over its transpose. Both
    functions are traced here: what they close over from an enclosing trace becomes an operand."""
    res, res_tree = jax.tree_util.tree_flatten(residual_args)
    lin, lin_tree = jax.tree_util.tree_flatten(linear_args)
    nr = len(res)
    specs = [spec_of(get_aval(x)) for x in (*res, *lin)]
    callee, consts, out_tree = _hoisted(lambda *a: fun(jax.tree_util.tree_unflatten(res_tree, a[:nr]),
                                                       jax.tree_util.tree_unflatten(lin_tree, a[nr:])), specs)
    out_specs = [spec_of(a) for a in callee.out_avals]
    transpose, tconsts, tree = _hoisted(
        lambda *a: fun_transpose(jax.tree_util.tree_unflatten(res_tree, a[:nr]),
                                 jax.tree_util.tree_unflatten(out_tree, list(a[nr:]))), specs[:nr] + out_specs)
    if tree != lin_tree:
        raise TypeError(f"jaxform: a linear map's transpose returned {tree}; its linear inputs are {lin_tree}")
    out = linear_map_primitive().bind(*consts, *tconsts, *res, *lin, callee=callee, transpose=transpose,
                                      num_consts=len(consts), num_tconsts=len(tconsts), num_res=nr)
    return jax.tree_util.tree_unflatten(out_tree, out)


# ---- how a function is being traced (the use `optimize` plans for) ------------------------------

def transformation_of(x: Any):
    """What transformation `x` is a tracer of, and the value it wraps: `("grad", primal)` under
    `jax.grad`/`vjp`/`linearize` (a linearize tracer), `("jvp", primal)` under forward mode,
    `("vmap", val, axis, size)` under `jax.vmap` (axis None: not batched), or None (a concrete array,
    or a jit/scan tracer: nothing tells how its result will be used). Tracers of nested transformations
    are ordered by `trace_depth`: the deeper trace is the transformation applied first."""
    from jax._src.interpreters import ad as _ad, batching as _batching
    linearize = getattr(_ad, "LinearizeTracer", None)
    if linearize is not None and isinstance(x, linearize):
        return ("grad", x.primal)
    if isinstance(x, _ad.JVPTracer):
        return ("jvp", x.primal)
    if isinstance(x, _batching.BatchTracer):
        axis = x.batch_dim if isinstance(x.batch_dim, int) else None
        size = getattr(x.val, "shape", ())[axis] if axis is not None else None
        return ("vmap", x.val, axis, size)
    return None


def trace_depth(x: Any) -> int:
    """How many traces lie under the one `x` belongs to (0 for a concrete array)."""
    t, d = getattr(x, "_trace", None), 0
    while t is not None:
        t, d = getattr(t, "parent_trace", None), d + 1
    return d
