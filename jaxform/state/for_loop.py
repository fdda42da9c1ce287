"""`for_loop` over mutable references, and `scan` written with it.

The body runs on real `jax.Ref`s while it is traced, so users write
`ref[i] = v` / `ref[i] += v` exactly as with `jax.new_ref`. The traced body is
then *discharged* (JAX's own state discharge rules) into a pure function
`(i, *values) -> values`, and the loop is an ordinary `lax.scan` (static n)
or `lax.fori_loop` (traced n) over that function. Why: from the outside a `for_loop` is pure code, so jit, grad
(both modes), vmap and their nesting are JAX's well-trodden loop rules instead
of the younger Ref transformation rules (e.g. `jacfwd` through `jax.new_ref`
fails in JAX 0.10). Refs the body closes over (an outer loop's refs, or a
user's `jax.new_ref`) are read before the loop, carried, and written back.
"""
from __future__ import annotations

import inspect
import operator
import os
import traceback
from typing import Any, Callable

import jax
import jaxlib
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxform import _jax

__all__ = ["for_loop", "scan", "StateError"]


class StateError(ValueError, TypeError):
    """A misuse of refs or of a loop body, reported at the user's source line."""


# ---------------------------------------------------------------- error reporting

_JAX_DIRS = (os.path.dirname(jax.__file__), os.path.dirname(jaxlib.__file__))
_STATE_DIR = os.path.join(_JAX_DIRS[0], "_src", "state")
_OWN_DIR = os.path.dirname(__file__)
_SKIP = (*_JAX_DIRS, _OWN_DIR)


def _user_frame(tb) -> traceback.FrameSummary | None:
    """The innermost traceback frame that is neither JAX's nor this module's."""
    frames = [f for f in traceback.extract_tb(tb) if not f.filename.startswith(_SKIP)]
    return frames[-1] if frames else None


def _where(fn: Callable) -> str:
    """'name (file:line)' for a user function, used when no frame is at hand."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    try:
        return f"`{name}` ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
    except (TypeError, OSError):
        return f"`{name}`"


def _call_body(fn: Callable, what: str, *args):
    """Call a user body; a ref misuse JAX reports in it is re-raised naming the user's line."""
    try:
        return fn(*args)
    except StateError:
        raise
    except (ValueError, TypeError) as e:
        frames = traceback.extract_tb(e.__traceback__)
        if not any(f.filename.startswith(_STATE_DIR) for f in frames):
            raise  # not a ref misuse (e.g. the user's own exception): leave it alone
        f = _user_frame(e.__traceback__)
        at = f"{f.filename}:{f.lineno} in {f.name}: `{(f.line or '').strip()}`" if f else _where(fn)
        raise StateError(f"{what} {_where(fn)} failed at {at}:\n  {type(e).__name__}: {e}\n"
                         "(For ref writes: the value must match the ref's shape and dtype at that index (no implicit "
                         "broadcast or cast: use `.astype` / `jnp.broadcast_to`), and a ref of rank r "
                         "takes at most r indices.)") from e


# ---------------------------------------------------------------- tracing + discharge

def _shape_struct(x, drop: int = 0) -> jax.ShapeDtypeStruct:
    """x's type (weak type kept: a Python-scalar init stays weak, as in lax loops), minus `drop` leading axes."""
    weak = bool(getattr(jax.typeof(x), "weak_type", False))
    return jax.ShapeDtypeStruct(jnp.shape(x)[drop:], jnp.result_type(x), weak_type=weak)


def _zeros(s: jax.ShapeDtypeStruct):
    """Zeros of type `s`, weakly typed if `s` is (a weak type comes from a Python scalar of its kind)."""
    if getattr(s, "weak_type", False):
        z = lax.full(s.shape, np.zeros((), s.dtype).item())
        if z.dtype == s.dtype:
            return z
    return jnp.zeros(s.shape, s.dtype)


def _discharged_body(body: Callable, tree, structs, x_structs, y_structs):
    """Trace `body(i, refs, x_slices, y_refs)` (the last two only if streaming) and discharge it.

    Returns (fn, consts, ref_mask): `fn(*consts, i, *vals, *x_slices) -> (*vals, *y_slices, *const_ref_vals)`
    is pure; `consts` are what the body closed over and `ref_mask[k]` says
    whether consts[k] is a Ref (its value is threaded through the loop).
    """
    def stateful(i, *args):
        vals, x_slices = args[:len(structs)], args[len(structs):]
        refs = [jax.new_ref(v) for v in vals]
        y_refs = [jax.new_ref(_zeros(y)) for y in y_structs]
        stream = (x_slices, y_refs) if x_structs or y_structs else ()
        out = _call_body(body, "for_loop body", i, jax.tree_util.tree_unflatten(tree, refs), *stream)
        if out is not None:
            raise StateError(f"for_loop body {_where(body)} returned a {type(out).__name__}; "
                             "a for_loop body must return None and write its results into the refs "
                             "it receives (e.g. `refs[i] = value`).")
        return [r[...] for r in [*refs, *y_refs]]

    closed = jax.make_jaxpr(stateful)(jax.ShapeDtypeStruct((), jnp.int32), *structs, *x_structs)
    jaxpr = closed.jaxpr
    ref_mask = [_jax.is_ref_aval(v.aval) for v in jaxpr.constvars]
    # Closed-over values become leading inputs so that closed-over Refs are
    # discharged like inputs: their final values come back as extra outputs.
    debug = jaxpr.debug_info._replace(arg_names=(*(f"closed_over[{k}]" for k in range(len(jaxpr.constvars))),
                                                 *jaxpr.debug_info.safe_arg_names(len(jaxpr.invars))))
    open_ = jex.Jaxpr((), [*jaxpr.constvars, *jaxpr.invars], jaxpr.outvars, jaxpr.eqns, jaxpr.effects, debug)
    pure = _jax.discharge_state(jex.ClosedJaxpr(open_, ()))
    _check_pure(pure, "for_loop body")
    return jex.jaxpr_as_fun(pure), list(closed.consts), ref_mask


def _check_pure(closed, what: str) -> None:
    bad = [v for v in [*closed.jaxpr.invars, *closed.jaxpr.outvars]
           if hasattr(v, "aval") and _jax.is_ref_aval(v.aval)]
    ref_effects = [e for e in closed.jaxpr.effects if _jax.input_effect_target(e) is not None]
    if bad or ref_effects:   # other effects (debug prints, callbacks) stay, as under lax.scan
        raise RuntimeError(f"jaxform internal error: discharging the {what} left refs "
                           f"({bad or ref_effects}); please report this.")


# ---------------------------------------------------------------- for_loop

def for_loop(n: int | jax.Array, body: Callable[[jax.Array, Any], None], init: Any, *,
             reverse: bool = False, unroll: int | bool = 1) -> Any:
    """Run `body(i, refs)` for i in range(n) (reversed if `reverse`) on refs holding `init`.

    `init` is a pytree of arrays; `body` receives `jax.Ref`s of the same
    structure, mutates them in place (`ref[i] = v`, `ref[i] += v`) and returns
    None. Returns the final values, structured like `init`. A traced `n` runs
    a while loop (forward-mode differentiable only, as with `lax.fori_loop`).
    """
    return _loop(n, body, init, (), (), reverse, unroll)[0]


def _loop(n, body, init, xs: list, y_structs: list, reverse: bool, unroll):
    """for_loop that also streams: body(i, refs, [x[i] for x in xs], y_refs), and
    what the body leaves in the one-step `y_refs` is stacked into ys (returned second).

    Streaming is how `scan` reads xs and writes ys: exactly like lax.scan, so
    reverse mode stacks the xs cotangent and reads the ys cotangent per step.
    Reading `xs[i]` off a closed-over array instead makes reverse mode add a
    full-size zero-padded cotangent every iteration (quadratic work), and a
    preallocated ys buffer is carried and sliced through both passes.
    """
    leaves, tree = jax.tree_util.tree_flatten(init)
    leaves = [jnp.asarray(x) for x in leaves]
    x_structs = [_shape_struct(x, 1) for x in xs]
    fn, consts, ref_mask = _discharged_body(body, tree, [_shape_struct(x) for x in leaves], x_structs, y_structs)
    ref_consts = [c for c, m in zip(consts, ref_mask) if m]
    n_vals, n_ys = len(leaves), len(y_structs)

    def run(i, vals, ref_vals, x_slices):
        it = iter(ref_vals)
        args = [next(it) if m else c for c, m in zip(consts, ref_mask)]
        outs = list(fn(*args, i, *vals, *x_slices))
        return outs[:n_vals], outs[n_vals + n_ys:], outs[n_vals:n_vals + n_ys]

    carry0 = (leaves, [r[...] for r in ref_consts])
    try:
        n = max(operator.index(n), 0)  # static trip count: a scan, reverse-differentiable
    except TypeError:  # traced: a while loop, as lax.fori_loop does
        if xs or y_structs:
            raise StateError("jaxform internal error: streamed inputs/outputs need a static trip count.")
        def wstep(i, carry):
            j = (n - 1 - i) if reverse else i
            return run(jnp.asarray(j, jnp.int32), *carry, [])[:2]
        (vals, ref_vals), ys = lax.fori_loop(0, n, wstep, carry0), []
    else:
        def sstep(carry, x_slices):
            i, vals, ref_vals = carry
            vals, ref_vals, y_slices = run(i, vals, ref_vals, x_slices)
            return (i - 1 if reverse else i + 1, vals, ref_vals), y_slices
        i0 = jnp.int32(n - 1 if reverse else 0)
        (_, vals, ref_vals), ys = lax.scan(sstep, (i0, *carry0), list(xs), length=n, reverse=reverse, unroll=unroll)
    for r, v in zip(ref_consts, ref_vals):
        r[...] = v
    return jax.tree_util.tree_unflatten(tree, vals), ys


# ---------------------------------------------------------------- scan

def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None,
         reverse: bool = False, unroll: int | bool = 1) -> tuple[Any, Any]:
    """`lax.scan` with the same semantics, written as a `for_loop` over refs.

    The carry lives in refs; each step reads its `x` slice and writes its `y`
    into a one-step output ref that the loop stacks at index `i` (streamed the
    way lax.scan streams, so grads cost the same as lax.scan's).
    """
    xs_leaves, xs_tree = jax.tree_util.tree_flatten(xs)
    lengths = {int(jnp.shape(x)[0]) if jnp.ndim(x) else None for x in xs_leaves}
    if None in lengths:
        raise ValueError(f"scan got an xs leaf with no leading axis to scan over (scan of {_where(f)}).")
    if length is not None:
        lengths.add(int(length))
    if len(lengths) > 1:
        raise ValueError(f"scan got inconsistent lengths {sorted(lengths)} for xs leaves and `length` "
                         f"(scan of {_where(f)}).")
    if not lengths:
        raise ValueError(f"scan of {_where(f)}: `length` is required when xs is None or has no leaves.")
    n = lengths.pop()

    init_leaves, init_tree = jax.tree_util.tree_flatten(init)
    init_leaves = [jnp.asarray(c) for c in init_leaves]
    x_structs = xs_tree.unflatten([_shape_struct(x, 1) for x in xs_leaves])
    out_c, out_y = _scan_types(f, init_tree, init_leaves, x_structs)
    # Like lax.scan: a weakly typed init (e.g. a Python 0) takes the carry-out dtype.
    promoted = [c.astype(o.dtype) if c.dtype != o.dtype and c.aval.weak_type else c
                for c, o in zip(init_leaves, jax.tree_util.tree_leaves(out_c))]
    if any(p is not c for p, c in zip(promoted, init_leaves)):
        init_leaves = promoted
        out_c, out_y = _scan_types(f, init_tree, init_leaves, x_structs)
    _check_carry(f, init_tree, init_leaves, out_c)
    y_leaves, y_tree = jax.tree_util.tree_flatten(out_y)
    if n == 0:  # the body is never run
        return (init_tree.unflatten([_typed_as(c, o) for c, o in zip(init_leaves, init_tree.flatten_up_to(out_c))]),
                y_tree.unflatten([_typed_as(jnp.zeros((0, *y.shape), y.dtype), y) for y in y_leaves]))

    def body(i, carry_refs, x_slices, y_refs):
        carry = init_tree.unflatten([r[...] for r in carry_refs])
        x = xs_tree.unflatten(x_slices)
        new_c, y = f(carry, x)
        for r, c in zip(carry_refs, init_tree.flatten_up_to(new_c)):
            # Written as is when only weak types differ: discharge threads the written value, so the
            # loop's carry out keeps f's type (a weak init may become strong and back, as in lax.scan).
            r[...] = c if jnp.result_type(c) == r.dtype else lax.convert_element_type(c, r.dtype)
        for r, v in zip(y_refs, y_tree.flatten_up_to(y)):
            r[...] = v

    carry, ys = _loop(n, body, init_leaves, xs_leaves, y_leaves, reverse, unroll)
    # Types as lax.scan gives them: the final carry has the type of f's carry output, ys of f's y
    # (weak types included; a ref write makes a value strong, so they are set here).
    carry = [_typed_as(v, o) for v, o in zip(carry, init_tree.flatten_up_to(out_c))]
    return init_tree.unflatten(carry), y_tree.unflatten([_typed_as(v, o) for v, o in zip(ys, y_leaves)])


def _typed_as(v, like):
    weak = bool(getattr(like, "weak_type", False))
    return v if jax.typeof(v).weak_type == weak else _jax.with_weak_type(v, weak)


def _scan_types(f, init_tree, init_leaves, x_structs):
    """Output types of one step of `f`, traced abstractly."""
    carry = init_tree.unflatten([jax.ShapeDtypeStruct(c.shape, c.dtype, weak_type=c.aval.weak_type) for c in init_leaves])
    return jax.eval_shape(lambda c, x: _call_body(f, "scan function", c, x), carry, x_structs)


def _check_carry(f, init_tree, init_leaves, out_c) -> None:
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_c)
    if out_tree != init_tree:
        raise StateError(f"scan function {_where(f)} returned a carry with structure {out_tree}, "
                         f"but init has structure {init_tree}; they must match.")
    for k, (a, b) in enumerate(zip(init_leaves, out_leaves)):
        if a.shape != b.shape or (a.dtype != b.dtype and not a.aval.weak_type):
            raise StateError(f"scan function {_where(f)} returned carry leaf {k} as {b.dtype}{list(b.shape)} "
                             f"but init has {a.dtype}{list(a.shape)}; carry types must not change.")
