"""Attack on commit 6a7398c: `_jax.check_jaxpr(closed, like)` (types of equations found in `like` are taken from it,
only the others go to JAX's check one equation at a time) and `_jax.emit_jaxpr` (optimize's wrapper copies the
planned program's equations into an enclosing jit / make_jaxpr trace with `inline_jaxpr_into_trace`).

Contract of (1): `check_jaxpr(closed, like)` raises wherever `jax.extend.core.check_jaxpr(closed.jaxpr)` does, for
any `like` that JAX's check accepts. Contract of (2): `jax.jit(jaxform.optimize(f))` behaves as it did when every
primitive was bound again (and as `jax.jit(f)`): values, dtypes, weak types, memory kinds, effects, errors.

The tests named `test_bug_*` failed on that commit: each comment says what was wrong; all are fixed since (the
fast path keys params by type at every level, binds no DropVar, harvests types only from like's top level and jit
bodies, records effects and compares annotations up to weak type, leaves key-reuse checking and programs with refs
to JAX; emit_jaxpr binds again where the program closes over a tracer or an argument's type differs, and the cache
key holds memory space and manual axes). Findings, both JAX versions (0.10.2, 0.12):

check_jaxpr(closed, like) accepts programs JAX's check rejects:
  C1. params keyed by `(name, type(v), v)` with `==`: a tuple param with 0.0 / False where like has 0 matches
      (`(0.0, 0.0) == (0, 0)`, same hash): `slice[start_indices=(0.0, 0.0)]`, `broadcast_in_dim[shape=(3.0, 4.0)]`,
      `transpose[permutation=(1.0, 0.0)]`, `dot_general[dimension_numbers=(((1.0,), (0.0,)), ((), ()))]`...
  C2. a DropVar among the jaxpr's invars (or constvars) counts as bound: JAX never binds a DropVar ("Variable '_'
      not defined" where it is read), the fast path puts it in `bound`.
  C3. typing is not a function of the key alone: an equation found inside a shard_map body (ppermute, pbroadcast,
      pvary: no NamedAxisEffect) is vouched for at top level, where JAX's check raises "unbound axis name".
  C4. `_typings` harvests equations from scan / cond / while / custom_jvp / custom_vjp bodies, which JAX's check of
      `like` never type-checks (their typecheck rules look at the body's signature only): an ill-typed equation in
      such a body of a `like` JAX accepts then vouches for the same equation at top level.
  C5. with `jax_debug_key_reuse` on, JAX's check also runs the key-reuse checker over the whole program; the fast
      path never does (a program that consumes one key twice passes).
  C6. `typematch` is not transitive (it compares shardings only when both meshes are non-empty and one is explicit):
      the fast path caches an equation's *annotated* out types after JAX accepted them once and compares the next
      equation of that key against the annotation, not the computed type. A first `cos` annotated without a
      sharding makes a second `cos` annotated with the wrong explicit sharding pass.
  C7. JAX's check rejects a program that returns a Ref ("returned a ref!", mutable_array_checks, on by default);
      the fast path looks at equations' avals only, so an input Ref returned as it is passes.

emit_jaxpr (optimize under jit / make_jaxpr):
  E1. a function closing over a tracer of the very trace it is called in (`jax.jit(lambda x, w:
      optimize(lambda x: f(x, w))(x))`, the usual train-step shape) fails: the tracer is a const of the planned
      program, and `inline_jaxpr_into_trace` makes every const a *new constvar* of the trace (`trace.new_const`, no
      `to_jaxpr_tracer`): the outer jaxpr gets a constvar whose value is its own tracer -> UnexpectedTracerError
      under jit; make_jaxpr returns a jaxpr that reads a leaked tracer instead of its input. Refs closed over, too.
  E2. the cache key (`optimize._aval_key`: shape, dtype, weak type, sharding) leaves out the memory space; a
      program traced for a device array is inlined, with its types, for a pinned_host array: the result is typed
      and placed in device memory (jit(f) and the eval path: pinned_host).
  E3. the cache key leaves out the manual axis type (shard_map's varying axes): the program traced for a varying
      argument, inlined for an invariant one types the result varying, and vice versa; a varying value typed
      invariant passes shard_map's replication check, so `out_specs=P()` silently returns device 0's shard where
      jax.jit(f) raises. (Before the commit re-binding raised a vma mismatch instead.)
  E4. (pre-existing: the same cache key with the eval path raised "mul requires varying manual axes to match")
      the same, the other way round: jax.jit(f) works, jit(optimize(f)) raises.
"""
import contextlib

import numpy as np
import pytest

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax.experimental import checkify
from jax.experimental import io_callback
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxform
from jaxform import _jax


# ------------------------------------------------------------------------------------------------ helpers (check)

def _replace(closed, **kw):
    jaxpr = closed.jaxpr.replace(**kw)
    consts = closed.consts if "constvars" not in kw else [np.zeros(v.aval.shape, v.aval.dtype) for v in jaxpr.constvars]
    return jex.ClosedJaxpr(jaxpr, consts)


def _open(invars, outvars, eqns):
    return jex.ClosedJaxpr(jex.Jaxpr([], list(invars), list(outvars), list(eqns)), [])


def _assert_rejected(bad, like):
    """The contract: `like` passes JAX's check, JAX's check rejects `bad`, so must check_jaxpr(bad, like)."""
    jex.check_jaxpr(like.jaxpr)
    with pytest.raises(Exception):
        jex.check_jaxpr(bad.jaxpr)
    with pytest.raises(Exception):
        _jax.check_jaxpr(bad, like)


def _assert_accepted(ok, like):
    jex.check_jaxpr(like.jaxpr)
    jex.check_jaxpr(ok.jaxpr)
    _jax.check_jaxpr(ok, like)


def _sin_mul_sum():
    return jax.make_jaxpr(lambda x: jnp.sum(jnp.sin(x) * 2.0, axis=0))(jnp.ones((3, 4), jnp.float32))


def _eqn(closed, name):
    return next(e for e in closed.jaxpr.eqns if e.primitive.name == name)


def _explicit_mesh():
    from jax.sharding import AxisType
    _mesh()
    return jax.make_mesh((2,), ("i",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:2])


@contextlib.contextmanager
def _sin_on_explicit_mesh():
    """(mesh, jaxpr of sin of an f32[8] sharded P('i') on a 2-device explicit mesh, its one equation), the mesh set."""
    mesh = _explicit_mesh()
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones(8), NamedSharding(mesh, P("i")))
        c = jax.make_jaxpr(jnp.sin)(x)
        sin, = c.jaxpr.eqns
        yield mesh, c, sin


def _mesh(n=2):
    if len(jax.devices()) < n:
        pytest.skip(f"needs {n} devices")
    return Mesh(np.array(jax.devices()[:n]), ("i",))


# ------------------------------------------------------------------------------ check: what the fast path gets right

def test_matched_equation_with_wrong_dtype_or_shape_is_rejected():
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    for aval in (sin.outvars[0].aval.update(dtype=jnp.dtype(jnp.float16)), sin.outvars[0].aval.update(shape=(4, 3)),
                 jax.core.ShapedArray((3, 4), jnp.int32)):
        v = jex.Var(aval)
        bad = _replace(c, eqns=[sin.replace(outvars=[v]), mul.replace(invars=[v, mul.invars[1]]), red])
        _assert_rejected(bad, c)


def test_weak_type_only_differences_are_accepted_as_jax_does():
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    v = jex.Var(sin.outvars[0].aval.update(weak_type=True))
    ok = _replace(c, eqns=[sin.replace(outvars=[v]), mul.replace(invars=[v, mul.invars[1]]), red])
    _assert_accepted(ok, c)


def test_dropvar_outvar_with_wrong_aval_is_rejected_matched_or_not():
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    junk = jex.DropVar(jax.core.ShapedArray((7,), jnp.float16))
    bad = _replace(c, eqns=[sin, sin.replace(outvars=[junk]), mul, red])            # matched (sin is in like)
    _assert_rejected(bad, c)
    cos = jex.new_jaxpr_eqn(list(sin.invars), [junk], jax.lax.cos_p, dict(sin.params), sin.effects,
                            sin.source_info, sin.ctx)
    _assert_rejected(_replace(c, eqns=[sin, cos, mul, red]), c)                      # unmatched


def test_dropvar_outvar_then_real_binder_of_the_same_key_is_rejected():
    """The one-equation check stores annotated types (DropVars included) for the next equation of that key: JAX
    checks a DropVar's annotation too (JAX 0.10 and 0.12), so no poisoning through it."""
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    wrong = jax.core.ShapedArray((7,), jnp.float16)
    mk = lambda out: jex.new_jaxpr_eqn(list(sin.invars), [out], jax.lax.cos_p, dict(sin.params), sin.effects,
                                       sin.source_info, sin.ctx)
    z = jex.Var(wrong)
    bad = _replace(c, eqns=[sin, mk(jex.DropVar(wrong)), mk(z), mul, red], outvars=[*c.jaxpr.outvars, z])
    _assert_rejected(bad, c)


def test_literals_with_wrong_values_or_avals_are_rejected():
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    lit = mul.invars[1]
    assert isinstance(lit, jex.Literal)
    for new in (jex.Literal(np.int32(2), lit.aval),                          # value of another dtype
                jex.Literal(np.float32(2), jax.core.ShapedArray((), jnp.float16)),   # aval of another dtype
                jex.Literal(np.ones(2, np.float32), lit.aval)):               # value of another shape
        bad = _replace(c, eqns=[sin, mul.replace(invars=[mul.invars[0], new]), red])
        _assert_rejected(bad, c)
    # a literal returned with a value that does not match its type
    bad = _replace(c, outvars=[jex.Literal(np.int32(1), red.outvars[0].aval)])
    _assert_rejected(bad, c)


def test_scoping_errors_are_rejected():
    c = _sin_mul_sum()
    sin, mul, red = c.jaxpr.eqns
    x = c.jaxpr.invars[0]
    _assert_rejected(_replace(c, eqns=[mul, sin, red]), c)                                    # used before bound
    _assert_rejected(_replace(c, eqns=[sin, sin, mul, red]), c)                              # bound twice
    _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[x]), mul, red]), c)              # rebinds an input
    _assert_rejected(_replace(c, invars=[x, x]), c)                                          # input twice
    _assert_rejected(_replace(c, constvars=[x]), c)                                          # const and input
    _assert_rejected(_replace(c, outvars=[mul.outvars[0], jex.Var(red.outvars[0].aval)]), c)   # unbound output
    _assert_rejected(_replace(c, eqns=[sin, mul, red.replace(invars=[jex.Var(mul.outvars[0].aval)])]), c)


def test_constvars_are_in_scope():
    w = jnp.arange(12.0).reshape(3, 4)
    c = jax.make_jaxpr(lambda x: jnp.sin(x) * w)(jnp.ones((3, 4)))
    if not c.jaxpr.constvars:
        c = _jax.jit_trace(lambda x: jnp.sin(x) * w, (), (), (jnp.ones((3, 4)),), {})[0]
    _assert_accepted(c, c)


def test_top_level_params_of_another_type_get_jaxs_verdict():
    """`type(v)` in the key tells 0 from 0.0 from False at the top level of params."""
    def f(x):
        return (jax.lax.iota(jnp.int32, 4), jnp.cumsum(x, axis=0), jax.lax.integer_pow(x, 2),
                jnp.concatenate([x, x], axis=1), jax.lax.reduce_precision(x, 5, 10))
    c = jax.make_jaxpr(f)(jnp.ones((3, 4), jnp.float32))
    tried = 0
    for i, e in enumerate(c.jaxpr.eqns):
        for k, v in e.params.items():
            if type(v) is not int:
                continue
            for new in (float(v), np.int64(v), *( (bool(v),) if v in (0, 1) else ())):
                eqns = list(c.jaxpr.eqns)
                eqns[i] = e.replace(params={**e.params, k: new})
                bad = _replace(c, eqns=eqns)
                try:
                    jex.check_jaxpr(bad.jaxpr)
                except Exception:
                    tried += 1
                    with pytest.raises(Exception):
                        _jax.check_jaxpr(bad, c)
    assert tried >= 3


def test_edited_bodies_of_call_and_control_flow_equations_are_rejected():
    x = jnp.ones(3, jnp.float32)

    @jax.custom_jvp
    def cj(a):
        return jnp.sin(a)
    cj.defjvp(lambda p, t: (cj(p[0]), t[0]))

    @jax.custom_vjp
    def cv(a):
        return jnp.cos(a)
    cv.defvjp(lambda a: (cv(a), a), lambda r, g: (g,))

    progs = {     # primitive name: (program, the param holding the body)
        "jit": (lambda a: jax.jit(lambda b: jnp.sin(b) * 2)(a), "jaxpr"),
        "remat": (jax.checkpoint(lambda a: jnp.sin(jnp.sin(a))), "jaxpr"),
        "custom_jvp_call": (cj, "call_jaxpr"),
        "custom_vjp_call": (cv, "call_jaxpr"),
        "scan": (lambda a: jax.lax.scan(lambda c, y: (c + jnp.sin(y), c), 0.0, a)[0], "jaxpr"),
        "cond": (lambda a: jax.lax.cond(a[0] > 0, jnp.sin, jnp.cos, a), "branches"),
        "while": (lambda a: jax.lax.while_loop(lambda c: c[0] < 5, lambda c: c + jnp.sin(c), a), "body_jaxpr"),
    }
    for name, (f, key) in progs.items():
        c = jax.make_jaxpr(f)(x)
        i, e = next((i, e) for i, e in enumerate(c.jaxpr.eqns) if e.primitive.name.startswith(name)
                    and key in e.params)
        sub = e.params[key]
        first = sub[0] if isinstance(sub, tuple) else sub
        body = first.jaxpr if isinstance(first, jex.ClosedJaxpr) else first
        # the body's last output retyped to f16: a different signature (every rule compares signatures)
        out = body.outvars[-1]
        v16 = jex.Var(out.aval.update(dtype=jnp.dtype(jnp.float16)))
        conv = jex.new_jaxpr_eqn([out], [v16], jax.lax.convert_element_type_p,
                                 dict(new_dtype=jnp.dtype(jnp.float16), weak_type=False, sharding=None),
                                 jex.no_effects, e.source_info, e.ctx)
        nbody = body.replace(eqns=[*body.eqns, conv], outvars=[*body.outvars[:-1], v16])
        nfirst = jex.ClosedJaxpr(nbody, first.consts) if isinstance(first, jex.ClosedJaxpr) else nbody
        nsub = (nfirst, *sub[1:]) if isinstance(sub, tuple) else nfirst
        eqns = list(c.jaxpr.eqns)
        eqns[i] = e.replace(params={**e.params, key: nsub})
        try:
            jex.check_jaxpr(_replace(c, eqns=eqns).jaxpr)
        except Exception:
            with pytest.raises(Exception):
                _jax.check_jaxpr(_replace(c, eqns=eqns), c)
        else:   # (none expected: every rule compares the signature)
            raise AssertionError(f"{name}: JAX accepted the edited body")


def test_stripped_effects_are_rejected():
    def f(a):
        jax.debug.callback(lambda v: None, a)
        return jnp.sin(a)
    c = jax.make_jaxpr(f)(jnp.ones(3))
    cb = _eqn(c, "debug_callback")
    eqns = [e.replace(effects=jex.no_effects) if e is cb else e for e in c.jaxpr.eqns]
    _assert_rejected(_replace(c, eqns=eqns), c)
    _assert_rejected(_replace(c, eqns=eqns, effects=jex.no_effects), c)


def test_programs_with_refs_tokens_and_keys_get_jaxs_verdict():
    def with_ref(a):
        r = jax.new_ref(a)
        r[...] = r[...] + 1
        return r[...]
    c = jax.make_jaxpr(with_ref)(jnp.ones(3))
    for i, e in enumerate(c.jaxpr.eqns):   # any output retyped is an error JAX finds
        if e.outvars and isinstance(e.outvars[0], jex.Var) and not isinstance(e.outvars[0], jex.DropVar):
            aval = e.outvars[0].aval
            inner = getattr(aval, "inner_aval", aval)
            if hasattr(inner, "dtype") and inner.dtype == jnp.float32 and not hasattr(aval, "inner_aval"):
                v = jex.Var(aval.update(dtype=jnp.dtype(jnp.int32)))
                eqns = list(c.jaxpr.eqns)
                eqns[i] = e.replace(outvars=[v])
                outs = [v if o is e.outvars[0] else o for o in c.jaxpr.outvars]
                _assert_rejected(_replace(c, eqns=eqns, outvars=outs), c)
                break
    else:
        raise AssertionError("no f32 equation output to retype")
    t = jax.make_jaxpr(lambda a: (a + 1, jax.lax.after_all(jax.lax.create_token(), jax.lax.create_token())))(
        jnp.ones(3))
    aa = _eqn(t, "after_all")
    v = jex.Var(jax.core.ShapedArray((), jnp.float32))
    _assert_rejected(_replace(t, eqns=[aa.replace(outvars=[v]) if e is aa else e for e in t.jaxpr.eqns],
                              outvars=[t.jaxpr.outvars[0], v]), t)
    _assert_accepted(t, t)
    k = jax.make_jaxpr(lambda key: jax.random.split(key))(jax.random.key(0))
    e = k.jaxpr.eqns[-1]
    v = jex.Var(jax.core.ShapedArray(e.outvars[0].aval.shape, jnp.uint32))
    _assert_rejected(_replace(k, eqns=[*k.jaxpr.eqns[:-1], e.replace(outvars=[v])], outvars=[v]), k)
    _assert_accepted(k, k)


def test_explicit_sharding_mismatch_on_a_matched_equation_is_rejected():
    with _sin_on_explicit_mesh() as (mesh, c, sin):
        wrong = jex.Var(sin.outvars[0].aval.update(sharding=NamedSharding(mesh.abstract_mesh, P(None))))
        _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[wrong])], outvars=[wrong]), c)


def test_cse_dce_result_is_accepted():
    def f(x):
        a, b = jnp.sin(x) * 2.0, jnp.sin(x) * 2.0
        return jnp.sum(a + b, axis=0)
    traced = jax.make_jaxpr(f)(jnp.ones((3, 4), jnp.float32))
    out = jaxform.passes.pipeline.run_passes(traced, ["cse", "dce"], strict=True)
    _assert_accepted(out, traced)


# ------------------------------------------------------------------- check: bugs (failed on 6a7398c, fixed)

@pytest.mark.parametrize("prim,param,value", [
    ("slice", "start_indices", (0.0, 0.0)),
    ("slice", "start_indices", (False, False)),
    ("broadcast_in_dim", "shape", (3.0, 4.0)),
    ("transpose", "permutation", (1.0, 0.0)),
    ("dot_general", "dimension_numbers", (((1.0,), (0.0,)), ((), ()))),
])
def test_bug_C1_tuple_params_equal_by_value_of_another_element_type(prim, param, value):
    # BUG C1: `_typing_key` keys params as (name, type(v), v): the type of a tuple is checked, not that of its
    # elements, and (0.0, 0.0) == (0, 0) with the same hash. The edited equation takes like's output types; JAX's
    # check raises "TypeError: slice start_indices must have every element be an integer type" (and the like).
    def f(x, y):
        return (jax.lax.slice(x, (0, 0), (2, 3)), jnp.broadcast_to(x[0], (3, 4)), x.T,
                jax.lax.dot_general(x, y, (((1,), (0,)), ((), ()))))
    c = jax.make_jaxpr(f)(jnp.ones((3, 4), jnp.float32), jnp.ones((4, 2), jnp.float32))
    i, e = next((i, e) for i, e in enumerate(c.jaxpr.eqns) if e.primitive.name == prim)
    assert e.params[param] == value and hash(e.params[param]) == hash(value)
    eqns = list(c.jaxpr.eqns)
    eqns[i] = e.replace(params={**e.params, param: value})
    _assert_rejected(_replace(c, eqns=eqns), c)


def test_bug_C2_dropvar_among_the_inputs_counts_as_bound():
    # BUG C2: `bound = set(constvars) | set(invars)` includes DropVars; JAX's check never binds a DropVar (`write`
    # skips `env[v] = v` for DropVar), so reading it is "Variable '_' not defined". Fast path: accepted (a DropVar
    # input read by an equation, returned, or a DropVar constvar read).
    c = jax.make_jaxpr(jnp.sin)(jnp.ones(3))
    sin, = c.jaxpr.eqns
    d = jex.DropVar(c.jaxpr.invars[0].aval)
    _assert_rejected(_replace(c, invars=[d], eqns=[sin.replace(invars=[d])]), c)
    _assert_rejected(_replace(c, invars=[d], eqns=[], outvars=[d]), c)
    _assert_rejected(_replace(c, constvars=[d], invars=[], eqns=[sin.replace(invars=[d])]), c)


def test_bug_C3_equation_from_a_shard_map_body_vouched_for_at_top_level():
    # BUG C3: `_typings` keys every equation of like's sub-jaxprs as if its type were a function of (primitive,
    # params, ctx, input types) alone. A ppermute (no NamedAxisEffect, so the fast path takes it) typed inside
    # shard_map's axis environment is vouched for at top level: JAX's check raises "NameError: Found an unbound
    # axis name: i"; the fast path accepts. (A pass that hoists or inlines out of a shard_map body.)
    mesh = _mesh()
    f = jax.shard_map(lambda a: jax.lax.ppermute(a, "i", [(0, 1), (1, 0)]), mesh=mesh, in_specs=P("i"),
                      out_specs=P("i"))
    like = jax.make_jaxpr(f)(jnp.ones(4))
    pp = _eqn(jex.ClosedJaxpr(like.jaxpr.eqns[0].params["jaxpr"], []), "ppermute")
    assert not pp.effects
    x, y = jex.Var(pp.invars[0].aval), jex.Var(pp.outvars[0].aval)
    _assert_rejected(_open([x], [y], [pp.replace(invars=[x], outvars=[y])]), like)


@pytest.mark.parametrize("where", ["scan", "cond"])
def test_bug_C4_like_vouches_for_equations_jax_never_checked(where):
    # BUG C4: JAX's check of `like` does not type-check the bodies of scan, cond, while, custom_jvp_call,
    # custom_vjp_call (their typecheck rules compare signatures only; `_while_typecheck` says so in a TODO). An
    # ill-typed equation there (`sin: f32[] -> f16[7]`) leaves `like` accepted by JAX, and `_typings` then vouches
    # for that equation anywhere: the top-level program below is rejected by JAX ("inconsistently typed as f32[]
    # for let-binder of type f16[7]") and accepted by the fast path.
    if where == "scan":
        c = jax.make_jaxpr(lambda xs: jax.lax.scan(lambda s, y: (s + jnp.sin(y), None), jnp.float32(0), xs)[0])(
            jnp.ones(3))
        key = "jaxpr"
    else:
        c = jax.make_jaxpr(lambda a: jax.lax.cond(a > 0, jnp.sin, jnp.cos, a))(jnp.float32(1))
        key = "branches"
    e = next(q for q in c.jaxpr.eqns if q.primitive.name == where)
    sub = e.params[key]
    body = sub[-1] if isinstance(sub, tuple) else sub
    sin = next(q for q in body.jaxpr.eqns if q.primitive.name == "sin")
    junk = jex.Var(jax.core.ShapedArray((7,), jnp.float16))
    nbody = jex.ClosedJaxpr(body.jaxpr.replace(eqns=[*body.jaxpr.eqns, sin.replace(outvars=[junk])]), body.consts)
    nsub = (*sub[:-1], nbody) if isinstance(sub, tuple) else nbody
    like = _replace(c, eqns=[q.replace(params={**q.params, key: nsub}) if q is e else q for q in c.jaxpr.eqns])
    x, z = jex.Var(sin.invars[0].aval), jex.Var(junk.aval)
    _assert_rejected(_open([x], [z], [sin.replace(invars=[x], outvars=[z])]), like)


def test_bug_C5_key_reuse_checker_is_skipped():
    # BUG C5: with jax_debug_key_reuse on, `jex.check_jaxpr` runs `check_key_reuse_jaxpr` on the program after
    # typing it: "KeyReuseError: In random_bits, argument 0 is already consumed." The fast path (key arrays are
    # ShapedArrays) never runs it: a rewrite that feeds one key to two random_bits is accepted.
    def f(k):
        k1, k2 = jax.random.split(k)
        return jax.random.bits(k1, (2,)), jax.random.bits(k2, (2,))
    c = jax.make_jaxpr(f)(jax.random.key(0))
    i1, i2 = [i for i, e in enumerate(c.jaxpr.eqns) if e.primitive.name == "random_bits"]
    eqns = list(c.jaxpr.eqns)
    eqns[i2] = eqns[i2].replace(invars=[eqns[i1].invars[0]])
    with jax.debug_key_reuse(True):
        _assert_rejected(_replace(c, eqns=eqns), c)


def test_bug_C6_annotation_cached_for_a_key_is_not_the_computed_type():
    # BUG C6: after JAX's one-equation check accepts an equation, `known[key]` holds its *annotated* out types;
    # the next equation of that key is compared (typematch) against that annotation. typematch is not transitive:
    # it ignores shardings where either mesh is empty. cos annotated f32[8] (no mesh) passes against the computed
    # f32[8@i]; a second cos annotated f32[8] on the explicit mesh with P(None) passes against f32[8] - but JAX
    # compares it with the computed f32[8@i] and rejects ("inconsistently typed as f32[8@i] for let-binder of type
    # f32[8]"). The same with a `like` whose annotation is the loose one (like_loose below).
    with _sin_on_explicit_mesh() as (mesh, c, sin):
        computed = sin.outvars[0].aval
        loose = jax.core.ShapedArray(computed.shape, computed.dtype)
        wrong = computed.update(sharding=NamedSharding(mesh.abstract_mesh, P(None)))
        b, w = jex.Var(loose), jex.Var(wrong)
        cos = jex.new_jaxpr_eqn(list(sin.invars), [b], jax.lax.cos_p, dict(sin.params), sin.effects,
                                sin.source_info, sin.ctx)
        _assert_rejected(_replace(c, eqns=[cos, cos.replace(outvars=[w])], outvars=[b, w]), c)
        like_loose = _replace(c, eqns=[sin.replace(outvars=[b])], outvars=[b])
        _assert_rejected(_replace(c, eqns=[sin.replace(outvars=[w])], outvars=[w]), like_loose)


def test_bug_C7_returned_ref_is_not_checked():
    # BUG C7: JAX's check rejects a program that returns a Ref ("JaxprTypeError: returned a ref!",
    # mutable_array_checks is on by default). The fast path checks avals of equations only ("refs ...: JAX's
    # check" in the docstring), so an input Ref returned untouched, with no equation, is accepted.
    def f(a):
        r = jax.new_ref(a)
        return r[...]
    c = jax.make_jaxpr(f)(jnp.ones(3))
    ref_aval = next(e.outvars[0].aval for e in c.jaxpr.eqns if hasattr(e.outvars[0].aval, "inner_aval"))
    r = jex.Var(ref_aval)
    _assert_rejected(_open([r], [r], []), c)
    x = c.jaxpr.invars[0]
    _assert_rejected(_replace(c, invars=[x, r], outvars=[*c.jaxpr.outvars, r]), c)


# -------------------------------------------------------------------------------------------- helpers (emit)

def _leaf(l):
    if hasattr(l, "dtype") and jnp.issubdtype(l.dtype, jax.dtypes.prng_key):
        return ("key", str(l.dtype), np.asarray(jax.random.key_data(l)).tolist())
    return (np.asarray(l).tolist(), str(l.dtype), bool(getattr(l, "weak_type", False)), type(l).__name__)


def _avals(closed):
    return [(a.shape, str(a.dtype), a.weak_type, str(getattr(a, "memory_space", None))) for a in closed.out_avals]


def _same_as_jit(f, *args, passes=None, static_argnums=None, **jit_kw):
    g = jaxform.optimize(f, passes=passes, static_argnums=static_argnums)
    a = jax.jit(f, static_argnums=static_argnums, **jit_kw)(*args)
    b = jax.jit(g, static_argnums=static_argnums, **jit_kw)(*args)
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    la, lb = map(jax.tree_util.tree_leaves, (a, b))
    for x, y in zip(la, lb):
        if _leaf(x)[0] != "key" and jnp.issubdtype(x.dtype, jnp.inexact):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
            assert _leaf(x)[1:] == _leaf(y)[1:]
        else:
            assert _leaf(x) == _leaf(y)
    if static_argnums is None:
        assert _avals(jax.make_jaxpr(f)(*args)) == _avals(jax.make_jaxpr(g)(*args))
    return b


X = jnp.arange(3.0, dtype=jnp.float32) + 0.5


# ------------------------------------------------------------------------------- emit: what the commit gets right

@pytest.mark.parametrize("passes", [None, ["cse", "dce"]])
def test_emit_scalars_numpy_literals_inputs_consts(passes):
    _same_as_jit(lambda a: a * 2, 1.0, passes=passes)                       # weak-typed Python scalar
    _same_as_jit(lambda a, b: (a * b, b + 1), X, 2.0, passes=passes)
    _same_as_jit(lambda a: a + 1, 3, passes=passes)
    _same_as_jit(lambda a, b: a + b, jnp.arange(3, dtype=jnp.int8), 3, passes=passes)
    _same_as_jit(lambda a, b: (a + b, b * 2), jnp.float16(1.0), 3.0, passes=passes)
    _same_as_jit(lambda a: a * 2, np.arange(3.0, dtype=np.float32), passes=passes)
    _same_as_jit(lambda a: (a, 1.0, 2, True), X, passes=passes)            # literals returned
    _same_as_jit(lambda a, b: (b, a), X, 1.0, passes=passes)                # inputs returned as they are
    _same_as_jit(lambda a: (a, jnp.float32(3), np.ones(2)), X, passes=passes)
    _same_as_jit(lambda a: a @ np.ones((3, 3), np.float32) + np.arange(3.0), X, passes=passes)
    big = jnp.arange(1000.0).reshape(10, 100)
    _same_as_jit(lambda a: jnp.sum(big) * a, X, passes=passes)
    _same_as_jit(lambda: jnp.ones(3) * 2, passes=passes)                    # no inputs
    _same_as_jit(lambda a, n: a * n, X, 3, passes=passes, static_argnums=1)
    _same_as_jit(lambda a: a * 2.0, jnp.ones(3, jnp.bfloat16), passes=passes)


def test_emit_donation():
    f = lambda a: (a * 2, a + 1)
    g = jaxform.optimize(f)
    a = jax.jit(f, donate_argnums=0)(jnp.arange(3.0))
    b = jax.jit(g, donate_argnums=0)(jnp.arange(3.0))
    assert [_leaf(t) for t in a] == [_leaf(t) for t in b]


def test_emit_keys():
    _same_as_jit(lambda k: jax.random.normal(k, (2,)), jax.random.key(0))
    _same_as_jit(lambda k: jax.random.split(k), jax.random.key(0))
    _same_as_jit(lambda k: (k, jax.random.key_data(k)), jax.random.key(1))
    _same_as_jit(lambda k, x: x + jax.random.uniform(jax.random.fold_in(k, 3), x.shape), jax.random.key(2), X)


def test_emit_inside_control_flow_checkpoint_vmap_grad():
    body = jaxform.optimize(lambda c, xi: (c + jnp.sin(xi), c * xi))
    _same_as_jit(lambda xs: jax.lax.scan(body, 0.0, xs), X)
    _same_as_jit(lambda a: jax.lax.cond(a[0] > 0, jaxform.optimize(lambda a: a * 2), lambda a: a - 1, a), X)
    _same_as_jit(lambda a: jax.lax.while_loop(lambda c: c[0] < 10, jaxform.optimize(lambda c: c * 2 + 1), a), X)
    _same_as_jit(jax.checkpoint(jaxform.optimize(lambda a: jnp.sin(jnp.sin(a)))), X)
    _same_as_jit(jax.grad(jaxform.optimize(lambda a: jnp.sum(jnp.sin(a) ** 2))), X)
    _same_as_jit(jax.vmap(jaxform.optimize(lambda a: jnp.sin(a) * a)), jnp.ones((2, 3)))
    _same_as_jit(jaxform.optimize(jax.grad(lambda a: jnp.sum(jnp.sin(a) ** 2))), X)
    _same_as_jit(lambda a: jax.jit(jaxform.optimize(lambda b: jnp.cos(b) + 1))(a), X)


def test_emit_closure_over_an_enclosing_transformations_tracer():
    """A tracer of another trace (jax.grad outside the jit) is a constant of the trace the program goes into."""
    w = jnp.float32(1.5)
    f = lambda w, x: jax.jit(lambda x: jaxform.optimize(lambda x: jnp.sum(jnp.sin(x) * w))(x))(x)
    plain = lambda w, x: jax.jit(lambda x: jnp.sum(jnp.sin(x) * w))(x)
    np.testing.assert_allclose(jax.grad(f)(w, X), jax.grad(plain)(w, X), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.grad(f))(w, X), jax.grad(plain)(w, X), rtol=1e-6)


def test_emit_custom_derivatives_under_jit():
    @jax.custom_vjp
    def cv(a):
        return jnp.sin(a)
    cv.defvjp(lambda a: (jnp.sin(a), a), lambda r, g: (g * 3.0,))

    @jax.custom_jvp
    def cj(a):
        return jnp.cos(a)
    cj.defjvp(lambda p, t: (jnp.cos(p[0]), t[0] * 5.0))

    f = lambda a: jnp.sum(cv(a) * cj(a) + jax.nn.relu(a))
    g = jaxform.optimize(f)
    for _ in range(2):     # the second time from optimize's cache, into a new trace
        want = jax.grad(jax.jit(f))(X)
        np.testing.assert_allclose(jax.grad(jax.jit(g))(X), want, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(jax.grad(g))(X), want, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(lambda a: jax.grad(g)(a))(X), want, rtol=1e-6)


@pytest.mark.parametrize("ordered", [False, True])
def test_emit_callbacks_in_order_and_effects(ordered):
    def mk(log):
        def inner(c, xi):
            jax.debug.callback(lambda v: log.append(("cb", float(v))), xi, ordered=ordered)
            if ordered:
                io_callback(lambda v: log.append(("io", float(v))), None, c, ordered=True)
            return c + xi, c * xi
        return inner
    results = []
    for opt in (False, True):
        log = []
        inner = mk(log)
        body = jaxform.optimize(inner) if opt else inner

        def f(xs):
            c, ys = jax.lax.scan(body, 0.0, xs)
            c = body(c, 1.0)[0]
            c2 = jax.lax.cond(c > 1, lambda c: body(c, 1.0)[0], lambda c: c, c)
            return jax.lax.while_loop(lambda c: c < 20, lambda c: body(c, 3.0)[0], c2), ys
        r = jax.block_until_ready(jax.jit(f)(X))
        jax.effects_barrier()
        results.append(([_leaf(t) for t in jax.tree_util.tree_leaves(r)], log, jax.make_jaxpr(f)(X).effects))
    assert results[0] == results[1]


def test_emit_io_callback_and_debug_print_at_top_level(capsys):
    seen = []

    def f(a):
        y = io_callback(lambda v: (seen.append(np.asarray(v).tolist()), np.asarray(v) + 1)[1],
                        jax.ShapeDtypeStruct(a.shape, a.dtype), a, ordered=True)
        jax.debug.print("y={}", y, ordered=True)
        return y * 2
    a = jax.jit(f)(X)
    jax.effects_barrier()
    out_plain = capsys.readouterr().out
    b = jax.jit(jaxform.optimize(f))(X)
    jax.effects_barrier()
    assert _leaf(a) == _leaf(b) and capsys.readouterr().out == out_plain and seen == [X.tolist(), X.tolist()]
    assert jax.make_jaxpr(f)(X).effects == jax.make_jaxpr(jaxform.optimize(f))(X).effects


def test_emit_checkify_errors():
    def fc(a):
        checkify.check(jnp.all(a > 0), "neg {}", a[0])
        return jnp.sin(a)
    for arg in (X, -X):
        e1, r1 = jax.jit(checkify.checkify(fc))(arg)
        e2, r2 = jax.jit(checkify.checkify(jaxform.optimize(fc)))(arg)
        assert e1.get() == e2.get()
        np.testing.assert_allclose(r1, r2)


def test_emit_make_jaxpr_output_types():
    for f, args in [(lambda a: a * 2, (1.0,)), (lambda a, b: (a, b * 2), (X, 2)), (lambda a: (a.astype(jnp.int32), 1.0), (X,))]:
        assert _avals(jax.make_jaxpr(f)(*args)) == _avals(jax.make_jaxpr(jaxform.optimize(f))(*args))
        c = jax.make_jaxpr(jaxform.optimize(f))(*args)
        jex.check_jaxpr(c.jaxpr)
        np.testing.assert_allclose(jex.jaxpr_as_fun(c)(*args)[0], jax.tree_util.tree_leaves(f(*args))[0])


def test_emit_tracing_errors_are_jits():
    f = lambda a: a @ jnp.ones((4, 4))
    with pytest.raises(TypeError):
        jax.jit(f)(X)
    with pytest.raises(TypeError):
        jax.jit(jaxform.optimize(f))(X)


# ---------------------------------------------------------------------------- emit: bugs (failed on 6a7398c, fixed)

@pytest.mark.parametrize("passes", [None, ["cse"]])
def test_bug_E1_closure_over_a_tracer_of_the_same_trace(passes):
    # BUG E1: `inline_jaxpr_into_trace` turns each const of the planned program into `trace.new_const(c)`: a tracer
    # of the very jit trace that `fn` closes over (w below, the train step's params) becomes a new constvar whose
    # value is that tracer, instead of the tracer itself (`to_jaxpr_tracer`, what binding did). jax.jit raises
    # UnexpectedTracerError ("... DynamicJaxprTracer to escape the scope of the transformation"); make_jaxpr gives
    # `{ lambda a:f32[]; b:f32[3] c:f32[]. let d = sin b; e = mul d a in (e,) }`: it multiplies by a leaked tracer,
    # not by its input c. (Before the commit: correct.)
    w = jnp.float32(2.0)
    f = lambda x, w: jaxform.optimize(lambda x: jnp.sin(x) * w, passes=passes)(x)
    want = jnp.sin(X) * w
    np.testing.assert_allclose(jax.jit(f)(X, w), want, rtol=1e-6)
    c = jax.make_jaxpr(f)(X, w)
    assert not any(isinstance(k, jax.core.Tracer) for k in c.consts)
    np.testing.assert_allclose(jex.jaxpr_as_fun(c)(X, w)[0], want, rtol=1e-6)


def test_bug_E1_closure_over_a_ref_of_the_same_trace():
    # BUG E1 (refs): the same with a Ref made in the jit body and closed over (UnexpectedTracerError, Ref{f32[3]}).
    def outer(opt):
        def h(x):
            r = jax.new_ref(x)
            g = lambda y: (r.__setitem__(Ellipsis, r[...] + y), r[...] * 2)[1]
            return (jaxform.optimize(g) if opt else g)(x), r[...]
        return h
    want = jax.jit(outer(False))(X)
    got = jax.jit(outer(True))(X)
    for a, b in zip(want, got):
        np.testing.assert_allclose(a, b)


def test_bug_E2_memory_space_left_out_of_the_cache_key():
    # BUG E2: `optimize._aval_key` = (shape, dtype, weak_type, sharding): no memory space. The program traced for a
    # device array is inlined, types and all, for a pinned_host one of the same shape: make_jaxpr's `mul b 2.0` is
    # typed f32[3] where jax.jit(f) (and re-binding, before the commit) types it f32<host>[3], and jit's result
    # lands in device memory instead of pinned_host.
    d = jax.devices()[0]
    if "pinned_host" not in [m.kind for m in d.addressable_memories()]:
        pytest.skip("no pinned_host memory")
    from jax.sharding import SingleDeviceSharding
    xh = jax.device_put(X, SingleDeviceSharding(d, memory_kind="pinned_host"))
    f = lambda a: a * 2
    g = jaxform.optimize(f)
    both = lambda h: (lambda a, b: (h(a), h(b)))
    assert _avals(jax.make_jaxpr(both(g))(X, xh)) == _avals(jax.make_jaxpr(both(f))(X, xh))
    want = [t.sharding.memory_kind for t in jax.jit(both(f))(X, xh)]
    got = [t.sharding.memory_kind for t in jax.jit(both(g))(X, xh)]
    assert got == want == ["device", "pinned_host"]


def _shard_map_pair(g, order, out_specs):
    def body(x, y):
        if order == 0:
            return g(x), g(y)
        gy = g(y)
        return g(x), gy
    return jax.shard_map(body, mesh=_mesh(), in_specs=(P("i"), P()), out_specs=out_specs)


def test_bug_E3_varying_value_typed_invariant_gives_a_silent_wrong_result():
    # BUG E3: `_aval_key` leaves out the manual axis type (shard_map's varying axes). Traced first for the invariant
    # y, the program is inlined, with its invariant types, for the varying x: shard_map's replication check then
    # accepts out_specs=P() for g(x) and returns device 0's shard ([0, 2]). jax.jit(f) raises "shard_map ... out_specs
    # which require replication which can't be statically inferred"; so did re-binding before the commit (a vma
    # mismatch on `mul`). Now it is a silently wrong value.
    f = lambda a: a * 2
    with pytest.raises(Exception):
        jax.jit(_shard_map_pair(f, 1, (P(), P())))(jnp.arange(4.0), jnp.arange(2.0))
    with pytest.raises(Exception):
        out = jax.jit(_shard_map_pair(jaxform.optimize(f), 1, (P(), P())))(jnp.arange(4.0), jnp.arange(2.0))
        print("returned", out)


def test_bug_E4_invariant_value_typed_varying_fails_where_jit_works():
    # BUG E4 (pre-existing cause, the cache key of E3; before the commit it raised a vma mismatch on `mul` instead):
    # traced for the varying x first, the program is reused for the invariant y; its output is typed varying, so
    # out_specs=P() for g(y) raises, where jax.jit(f) returns [0, 2] (so does jax.jit(f) for every out_specs tried).
    f = lambda a: a * 2
    want = jax.jit(_shard_map_pair(f, 0, (P("i"), P())))(jnp.arange(4.0), jnp.arange(2.0))
    got = jax.jit(_shard_map_pair(jaxform.optimize(f), 0, (P("i"), P())))(jnp.arange(4.0), jnp.arange(2.0))
    for a, b in zip(want, got):
        np.testing.assert_allclose(a, b)
