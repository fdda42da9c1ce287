"""`check_jaxpr(closed, like)`: the verification every pass result gets, with the types of equations
already in `like` taken from it. It must reject exactly what JAX's own check rejects."""
import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import _jax


def _traced():
    return jax.make_jaxpr(lambda x: jnp.sum(jnp.sin(x) * 2.0, axis=0))(jnp.ones((3, 4), jnp.float32))


def _with(closed, eqns):
    return jex.ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts)


@pytest.fixture
def full_checks(monkeypatch):
    """How many times JAX's own check ran (whole program or one equation)."""
    calls = []
    real = jex.check_jaxpr
    monkeypatch.setattr(jex, "check_jaxpr", lambda j: (calls.append(len(j.eqns)), real(j))[1])
    return calls


def test_a_pass_result_made_of_known_equations_needs_no_type_evaluation(full_checks):
    def f(x):
        a, b = jnp.sin(x) * 2.0, jnp.sin(x) * 2.0     # CSE merges these
        return jnp.sum(a + b, axis=0)
    traced = jax.make_jaxpr(f)(jnp.ones((3, 4), jnp.float32))
    out = jaxform.passes.pipeline.run_passes(traced, ["cse", "dce"], strict=True)
    assert len(out.jaxpr.eqns) < len(traced.jaxpr.eqns)
    full_checks.clear()
    _jax.check_jaxpr(out, traced)
    assert full_checks == []


def test_a_known_equation_with_a_wrong_output_type_is_rejected():
    c = _traced()
    sin, *rest = c.jaxpr.eqns
    wrong = jex.Var(sin.outvars[0].aval.update(dtype=jnp.dtype(jnp.float16)))
    eqns = [sin.replace(outvars=[wrong]), rest[0].replace(invars=[wrong, *rest[0].invars[1:]]), *rest[1:]]
    bad = _with(c, eqns)
    with pytest.raises(jex.JaxprTypeError):
        jex.check_jaxpr(bad.jaxpr)
    with pytest.raises(jex.JaxprTypeError):
        _jax.check_jaxpr(bad, c)


def test_a_variable_used_before_it_is_bound_is_rejected():
    c = _traced()
    e = c.jaxpr.eqns
    with pytest.raises(jex.JaxprTypeError):
        _jax.check_jaxpr(_with(c, [e[1], e[0], *e[2:]]), c)


def test_a_variable_bound_twice_is_rejected():
    c = _traced()
    sin, mul, *rest = c.jaxpr.eqns
    again = mul.replace(invars=[sin.outvars[0], sin.outvars[0]], outvars=[sin.outvars[0]])
    with pytest.raises(jex.JaxprTypeError):
        _jax.check_jaxpr(_with(c, [sin, again, mul, *rest]), c)


def test_an_equation_the_pass_made_is_type_evaluated(full_checks):
    c = _traced()
    *head, red = c.jaxpr.eqns
    assert red.primitive.name == "reduce_sum"
    other_axis = red.replace(params={**red.params, "axes": (1,)})   # f32[3], annotated f32[4]
    with pytest.raises(jex.JaxprTypeError):
        _jax.check_jaxpr(_with(c, [*head, other_axis]), c)
    assert 1 in full_checks       # that one equation went to JAX's check


def test_a_well_typed_new_equation_passes():
    c = _traced()
    *head, red = c.jaxpr.eqns
    x = head[-1].outvars[0]
    neg = jex.Var(x.aval)
    new = jex.new_jaxpr_eqn([x], [neg], jax.lax.neg_p, {}, frozenset(), red.source_info, red.ctx)
    _jax.check_jaxpr(_with(c, [*head, new, red.replace(invars=[neg])]), c)


def test_programs_with_effects_get_jaxs_whole_check(full_checks):
    def f(x):
        jax.debug.callback(lambda v: None, x)
        return jnp.sin(x)
    c = jax.make_jaxpr(f)(np.ones(3, np.float32))
    _jax.check_jaxpr(c, c)
    assert len(full_checks) == 1 and full_checks[0] == len(c.jaxpr.eqns)
