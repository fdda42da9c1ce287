"""Attack 2 on `_jax.check_jaxpr(closed, like)` (the fast verification path: `_check_scoping`, `_typings`, `_typing_key`,
`_param_key`), `_jax.emit_jaxpr` (optimize's wrapper copies the planned program into an enclosing jit / make_jaxpr
trace with JAX's `inline_jaxpr_into_trace`) and optimize's cache key, after the 18 fixes of
tests/fuzz/test_attack_check_and_emit.py (nothing here repeats that file's cases).

Contracts: (1) `check_jaxpr(closed, like)` raises on every `closed` that `jax.extend.core.check_jaxpr(closed.jaxpr)`
rejects, for any `like` JAX accepts; (2) `jax.jit(jaxform.optimize(f))` / `jax.make_jaxpr(jaxform.optimize(f))` behave
as `jax.jit(f)`: values, dtypes, weak types, effects, errors, source information, cache hits with other types.

Tests named `test_bug_*` failed where a bug was found (each says what was wrong); all four are fixed since (emission
binds again where a primitive is hijax or the program has effects, and gives each equation its own source line;
static arguments are keyed with their type; a binder carrying state goes to JAX's check). The others record what held.
Findings (JAX 0.10.2 and 0.12 unless said):

  F1. emit_jaxpr bypasses `DynamicJaxprTrace.process_primitive`, which sets `trace.frame.is_high` for a "high"
      primitive (hijax: `call_hi_primitive`, which `jax_remat3` makes of jax.checkpoint and `jax_custom_vjp3` of
      custom_vjp; JAX's own staging rule sets it too). The enclosing jaxpr comes out `is_high=False` with a
      `call_hi_primitive` equation in it, is never lowered to low-level JAX, and `jax.jit(optimize(f))(x)` raises
      "NotImplementedError: MLIR translation rule for primitive 'call_hi_primitive' not found", where `jax.jit(f)(x)`
      and the eval path (binding each equation, as before the commit) work. The planned program itself also carries
      is_high=False (jaxform's Graph.to_jaxpr drops the flag), so a fix cannot read it off `closed.jaxpr.is_high`.
      (tests/test_jax_flags.py::test_default_pipeline[jax_remat3] fails the same way: 0.10 and 0.12; [jax_custom_vjp3]
      on 0.12.)
  F2. emit_jaxpr gives every emitted equation the traceback of `source_info_util.current()` taken inside emit_jaxpr
      (only the name stack is the equation's own): the user's line of each operation is replaced by
      "jaxform/_jax.py:NNN (emit_jaxpr)". make_jaxpr's equations, `jax.ad_checkpoint.print_saved_residuals`
      ("named 'a' from .../jaxform/_jax.py (emit_jaxpr)"), the lowered HLO's locations (profiles) and errors raised
      about an equation all point into jaxform. jax.jit(f), and the eval path before the commit, keep each
      equation's own line. (JAX's own `jit(inline=True)` at least names the user's call site.)
  F3. (pre-existing, the cache key) static arguments are keyed by `==` alone: `1 == 1.0 == True == np.int32(1)` with
      one hash, so `optimize(f, static_argnums=1)` called with n=2 and then n=2.0 reuses the program traced for the
      int: `a + jnp.asarray(n)` for an int8 `a` comes back int8 where jax.jit (which keys static arguments by type too) gives
      float32; a weak-typed result where jit's is strong, and the other way round. Under jax.jit and eagerly.
      (filter_optimize's `_Static` already compares types.)
  F4. (JAX 0.10 only; contract (1) to the letter) a binder whose aval is a plain ShapedArray but whose Var carries a
      quasi-dynamic state (`Var(aval, initial_qdd=...)`): JAX 0.10's check makes it a MutableTypecheckVal and the
      equation reading it fails abstract evaluation ("Attempting to pass an unexpected type AvalMutableQDD");
      `_check_scoping` looks at `type(v.aval)` only and vouches for it. (0.12's Var has no qdd.)

Held (tests below): scoping of literals/DropVars used as binders or operands, retyped PRNG key and float0 equations;
literal tracers as arguments and literal outputs of scan/cond/while bodies; refs
passed as arguments; checkpoint policies with names (saved residuals and gradients); custom_vjp whose fwd closes over
tracers (same errors as jax.jit); cache hits inside and outside an explicit mesh; name stacks under named_scope;
ensure_compile_time_eval; disable_jit; donation of an argument the program returns; a global Ref closed over.
Looked at on the fast path, no gap found (not kept as tests): params of every type traced in a broad sample (NamedTuple
dimension numbers are tuples, recursed; enums, dtypes, PRNGImpl, UnspecifiedValue; Mesh / AbstractMesh / NamedSharding
equality includes axis types; PartitionSpec('i') == P(('i',)) mean the same; frozensets of axis names or
unconstrained dims: no rule rejects one member type and accepts the other); avals and JaxprEqnContext are interned
(identity = every field, the mesh's axis types too); jit bodies are checked by `_check_call` under contexts their
equations' own ctx overrides; a matched annotation equal to like's up to weak type typematches the computed type
whenever like's does; Literals are unhashable (an outvar Literal falls back to JAX); jaxpr-level effects, refs, tokens
and hi types always fall back.
"""
import warnings

import numpy as np
import pytest

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name
from jax.extend import source_info_util as siu
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxform
from jaxform import _jax
from fuzz.test_attack_check_and_emit import _assert_rejected, _replace
from test_jax_flags import _flag

X = jnp.arange(3.0, dtype=jnp.float32) + 0.5


# ------------------------------------------------------------------------------------------------------- helpers

def _leaves(tree):
    return [(np.asarray(t).tolist(), str(t.dtype), bool(getattr(t, "weak_type", False)))
            for t in jax.tree_util.tree_leaves(tree)]


def _both(mk):
    """mk(wrap) with wrap = identity (plain JAX) and jaxform.optimize: the same result or the same error type."""
    out = []
    for wrap in (lambda f: f, jaxform.optimize):
        try:
            out.append(("ok", mk(wrap)))
        except Exception as e:  # noqa: BLE001 - compared below
            out.append(("error", type(e).__name__))
    assert out[0] == out[1], out
    return out[0]


# --------------------------------------------------------------------------------------------------- check: held

def test_literal_as_a_binder_is_rejected():
    c = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(jnp.ones(3))
    sin, mul = c.jaxpr.eqns
    lit = jex.Literal(np.float32(1.0), jax.core.ShapedArray((), jnp.float32))
    _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[lit]), mul]), c)      # an equation's outvar
    _assert_rejected(_replace(c, invars=[lit], eqns=[]), c)                         # an input


def test_dropvar_bound_by_an_equation_is_not_readable():
    c = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(jnp.ones(3))
    sin, mul = c.jaxpr.eqns
    d = jex.DropVar(sin.outvars[0].aval)
    _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[d]), mul.replace(invars=[d, mul.invars[1]])]), c)
    _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[d])], outvars=[d]), c)


def test_key_and_float0_equations_retyped_are_rejected():
    k = jax.make_jaxpr(lambda key: jax.random.split(key))(jax.random.key(0))
    e = k.jaxpr.eqns[-1]
    other = jax.random.key(0, impl="rbg")
    v = jex.Var(e.outvars[0].aval.update(dtype=other.dtype))    # key<fry>[2] annotated key<rbg>[2]
    _assert_rejected(_replace(k, eqns=[*k.jaxpr.eqns[:-1], e.replace(outvars=[v])], outvars=[v]), k)
    z = jax.make_jaxpr(lambda x: jnp.zeros(x.shape, jax.dtypes.float0))(jnp.ones(3))
    if z.jaxpr.eqns:
        e = z.jaxpr.eqns[-1]
        v = jex.Var(jax.core.ShapedArray(e.outvars[0].aval.shape, jnp.float32))
        _assert_rejected(_replace(z, eqns=[*z.jaxpr.eqns[:-1], e.replace(outvars=[v])], outvars=[v]), z)


# ---------------------------------------------------------------------------------------------------- emit: held

def test_literal_tracers_and_literal_outputs_in_bodies():
    def h1(w):
        g = w(lambda a, b: (a * b, b, a.astype(jnp.int32)))

        def h(x):
            c = lax.convert_element_type(2.0, jnp.float32)       # a tracer whose value is a literal
            return g(c, lax.convert_element_type(3, jnp.float32)), g(x[0], c)
        return _leaves(jax.jit(h)(X))
    _both(h1)
    _both(lambda w: _leaves(jax.jit(lambda xs: lax.scan(w(lambda c, x: (c + x, (1.0, 2, x))), 0.0, xs))(X)))
    _both(lambda w: _leaves(jax.jit(lambda x: lax.cond(x[0] > 0, w(lambda a: (a, 3.0)), lambda a: (a * 2, 4.0), x))(X)))
    _both(lambda w: _leaves(jax.jit(lambda x: lax.while_loop(lambda c: c[1] < 3, w(lambda c: (c[0] * 2, c[1] + 1)),
                                                             (x, 0)))(X)))


def test_refs_passed_as_arguments():
    def mk(w):
        def f(r):
            r[...] = r[...] * 2
            return r[...] + 1
        g = w(f)

        def h(x):
            r = jax.new_ref(x)
            return g(r), g(r), r[...]
        return _leaves(jax.jit(h)(X))
    _both(mk)


def test_global_ref_closed_over():
    def mk(wrap):
        r = jax.new_ref(jnp.zeros(3))

        def f(x):
            r[...] = r[...] + x
            return r[...] * 2
        g = wrap(f)
        a, b = jax.jit(g)(X), jax.jit(lambda x: g(x) + g(x))(X)
        return _leaves((a, b, r[...]))
    _both(mk)


def test_checkpoint_policies_with_names_across_the_boundary():
    from jax._src.ad_checkpoint import saved_residuals
    x, w = jnp.arange(12.0).reshape(3, 4) / 10, jnp.ones((4, 4)) / 3

    def f(x, w):
        h = checkpoint_name(jnp.tanh(x @ w), "h")
        return jnp.sum(checkpoint_name(jnp.sin(h @ w), "g") * h)
    for pol in (jax.checkpoint_policies.save_only_these_names("h"), jax.checkpoint_policies.dots_saveable,
                jax.checkpoint_policies.save_any_names_but_these("h")):
        def mk(wrap):
            g = wrap(f)
            h = jax.checkpoint(lambda x, w: g(x, w), policy=pol)
            res = sorted((str(a.shape), s.split(" from ")[0]) for a, s in saved_residuals(h, x, w))
            grads = jax.jit(jax.grad(h, argnums=(0, 1)))(x, w)
            return res, [np.round(np.asarray(t), 5).tolist() for t in grads]
        _both(mk)


@pytest.mark.parametrize("which", ["primal", "fwd"])
def test_custom_vjp_closing_over_tracers_as_jit(which):
    w0 = jnp.float32(1.5)

    def mkstep(wrap):
        def step(x, w):
            @jax.custom_vjp
            def g(x):
                return jnp.sin(x) * (w if which == "primal" else 1.0)
            g.defvjp(lambda x: (g(x), jnp.cos(x) * w), lambda r, ct: (ct * r,))
            return jnp.sum(wrap(g)(x))
        return step
    for run in (lambda s: jax.jit(s)(X, w0), lambda s: jax.jit(jax.grad(s))(X, w0),
                lambda s: jax.grad(jax.jit(s))(X, w0)):
        _both(lambda wrap: _leaves(run(mkstep(wrap))))


def test_cache_hits_inside_and_outside_an_explicit_mesh():
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 devices")
    mesh = jax.make_mesh((2,), ("i",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])

    def mk(wrap):
        g = wrap(lambda x: x + jnp.ones(8))
        out = [str(jax.typeof(jax.jit(g)(jnp.arange(8.0))))]
        with jax.set_mesh(mesh):
            xs = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
            out += [str(jax.typeof(jax.jit(g)(jnp.arange(8.0)))), str(jax.typeof(jax.jit(g)(xs))),
                    str(jax.make_jaxpr(g)(xs).out_avals)]
        return out
    _both(mk)


def test_name_stacks_compile_time_eval_disable_jit_donation():
    def ns(wrap):
        def f(x):
            with jax.named_scope("inner"):
                return jnp.sin(x) * 2
        g = wrap(f)

        def h(x):
            with jax.named_scope("outer"):
                return g(x)
        return [str(e.source_info.name_stack) for e in jax.make_jaxpr(h)(X).eqns]
    assert _both(ns)[1] == ["outer/inner", "outer/inner"]

    def ecte(wrap):
        g = wrap(lambda a: a * 2)

        def h(x):
            with jax.ensure_compile_time_eval():
                y = g(jnp.ones(3))
            return x + y
        return _leaves(jax.jit(h)(X)), str(jax.make_jaxpr(h)(X))
    _both(ecte)

    def dj(wrap):
        g = wrap(lambda a: a * 2)
        with jax.disable_jit():
            return _leaves(jax.jit(g)(X))
    _both(dj)

    def don(wrap):
        x = jnp.arange(3.0)
        r = jax.jit(wrap(lambda a: (a, a * 2)), donate_argnums=0)(x)
        return _leaves(r), x.is_deleted()
    _both(don)


# ----------------------------------------------------------------------------------------------------------- bugs

def _remat():
    return lambda x: jnp.sum(jax.checkpoint(lambda a: jnp.sin(jnp.sin(a)))(x))


def _custom():
    @jax.custom_vjp     # made with the flag on: the flag is read when the custom_vjp is defined
    def cv(a):
        return jnp.sin(a)
    cv.defvjp(lambda a: (jnp.sin(a), a), lambda r, g: (g * 3.0,))
    return lambda x: jnp.sum(cv(x) * jnp.cos(x))


@pytest.mark.parametrize("flag,make", [("jax_remat3", _remat), ("jax_custom_vjp3", _custom)], ids=["remat3", "custom_vjp3"])
def test_bug_F1_emission_leaves_the_trace_low_with_a_high_primitive_in_it(flag, make):
    # BUG F1: with `flag` on, jax.checkpoint / custom_vjp trace to `call_hi_primitive` (hijax). Binding one under a jit
    # trace sets `trace.frame.is_high` (process_primitive, and the primitive's staging rule), so JAX lowers the jaxpr to
    # low-level JAX before compiling. `emit_jaxpr` copies the planned program's equations with `inline_jaxpr_into_trace`
    # (`trace.emit_eqn`), which sets nothing: the enclosing jaxpr is is_high=False with a call_hi_primitive in it and
    # jax.jit raises "NotImplementedError: MLIR translation rule for primitive 'call_hi_primitive' not found for
    # platform cpu". jax.jit(fn) works; so did the eval path (binding each equation) before the commit.
    if not hasattr(jax.config, flag):
        pytest.skip(f"JAX {jax.__version__} has no {flag}")
    with _flag(flag):
        fn = make()
        want = jax.jit(fn)(X)
        assert "call_hi_primitive" in [e.primitive.name for e in jax.make_jaxpr(fn)(X).eqns]
        for passes in (["cse"], None):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = jax.jit(jaxform.optimize(make(), passes=passes))(X)
            np.testing.assert_allclose(got, want, rtol=1e-6)


def _log_then_mul(x):
    y = jnp.log(x)
    return y * 2


@pytest.mark.parametrize("passes", [None, ["cse"]], ids=["default", "cse"])
def test_bug_F2_emitted_equations_report_emit_jaxpr_as_their_source(passes):
    # BUG F2: `emit_jaxpr` passes `src = source_info_util.current()` to `inline_jaxpr_into_trace`, which keeps only each
    # equation's name stack and takes src's traceback: every emitted equation reports
    # "/.../jaxform/_jax.py:157 (emit_jaxpr)" as its user frame instead of the line of `fn` that made it
    # (log: `y = jnp.log(x)`, mul: `return y * 2`). make_jaxpr shows it; print_saved_residuals says a checkpoint_name'd
    # value is "named 'a' from .../jaxform/_jax.py (emit_jaxpr)"; the lowered HLO's locations (what a profile maps ops
    # to) and JAX errors about an equation point into jaxform. jax.jit(fn) and the eval path before the commit
    # (core.eval_jaxpr binds under the equation's own traceback) keep the user's lines.
    where = lambda j: [(e.primitive.name, siu.summarize(e.source_info)) for e in j.eqns]   # noqa: E731
    want = where(jax.make_jaxpr(_log_then_mul)(X))
    assert all("test_attack_check_and_emit_2.py" in s for _, s in want)
    got = where(jax.make_jaxpr(jaxform.optimize(_log_then_mul, passes=passes))(X))
    assert got == want

    from jax._src.ad_checkpoint import saved_residuals

    def f(x):
        return jnp.sum(jnp.cos(checkpoint_name(jnp.sin(x), "a")))
    pol = jax.checkpoint_policies.save_only_these_names("a")
    res = lambda g: [s for _, s in saved_residuals(jax.checkpoint(g, policy=pol), X) if "named" in s]   # noqa: E731
    assert [s.split(":")[0] for s in res(jaxform.optimize(f, passes=passes))] == [s.split(":")[0] for s in res(f)]


def test_bug_F3_static_arguments_keyed_by_value_not_type():
    # BUG F3 (pre-existing): the cache key holds static arguments as `(i, value)`: 2 == 2.0 == np.int32(2) with one hash,
    # so the second call reuses the program traced for the first. jax.jit keys static arguments by type as well:
    # `a + jnp.asarray(n)` for an int8 `a` is int8 for n=2, float32 (weak) for n=2.0, int32 for np.int32(2).
    # optimize returns int8 for 2.0 after 2, float32 for 2 after 2.0 (a wrong dtype, not just a weak type), the weak
    # float32 for a strong np.float32(2), int8 for np.int32(2) after 2: eagerly and under jax.jit.
    # (filter_optimize's _Static compares types.)
    f = lambda a, n: a + jnp.asarray(n)    # noqa: E731
    a = jnp.arange(3, dtype=jnp.int8)
    for order in ((2, 2.0), (2.0, 2), (2.0, np.float32(2)), (2, np.int32(2))):
        want = [_leaves(jax.jit(f, static_argnums=1)(a, n)) for n in order]
        assert want[0] != want[1]
        g = jaxform.optimize(f, static_argnums=1)
        assert [_leaves(g(a, n)) for n in order] == want
        g = jax.jit(jaxform.optimize(f, static_argnums=1), static_argnums=1)
        assert [_leaves(g(a, n)) for n in order] == want


def test_bug_F4_binder_with_quasi_dynamic_data_is_vouched_for():
    # BUG F4 (JAX 0.10 only): JAX 0.10's check writes a binder as MutableTypecheckVal when its Var has an initial_qdd,
    # whatever its aval, and the equation reading it fails ("ValueError: Attempting to pass an unexpected type
    # AvalMutableQDD(aval=ShapedArray(float32[3]), ...) to a primitive"). `_check_scoping` requires `type(v.aval) is
    # ShapedArray` only (`_plain`), finds `sin` in like, and accepts. JAX 0.12's Var has no qdd: nothing to test.
    c = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(jnp.ones(3))
    x = c.jaxpr.invars[0]
    try:
        v = jex.Var(x.aval, initial_qdd=object())
    except TypeError:
        pytest.skip(f"JAX {jax.__version__}'s Var has no initial_qdd")
    sin, mul = c.jaxpr.eqns
    _assert_rejected(_replace(c, invars=[v], eqns=[sin.replace(invars=[v]), mul]), c)
