"""Fault handling: failing or ill-formed passes are skipped (warned) or raise PassError (strict)."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import passes
from jaxform.optimize import run_passes


@pytest.fixture
def temp_pass():
    """Register passes for one test; remove them from the registry afterwards."""
    names = []

    def reg(fn, exact=True):
        names.append(fn.__name__)
        return passes.register(exact=exact)(fn)
    yield reg
    for n in names:
        passes.PASSES.pop(n, None)


def prog_sin(x):
    return jnp.sin(x) * 2 + jnp.sin(x)


def prog_plain(x):
    return x * 3 + 1


X = jnp.arange(4.0)


def test_pass_raising_on_some_programs(temp_pass):
    def hates_sin(g):
        if any(n.name == "sin" for n, _ in g.walk()):
            raise RuntimeError("no sin allowed")
        return g
    temp_pass(hates_sin)
    with pytest.warns(UserWarning, match=r"pass 'hates_sin' failed on prog_sin .*RuntimeError: no sin allowed"):
        out = jaxform.optimize(prog_sin, passes=["cse", "hates_sin", "dce"])(X)
    np.testing.assert_array_equal(out, prog_sin(X))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(jaxform.optimize(prog_plain, passes=["hates_sin"])(X), prog_plain(X))
    with pytest.raises(jaxform.PassError, match="hates_sin.*no sin allowed"):
        jaxform.optimize(prog_sin, passes=["hates_sin"], strict=True)(X)
    assert "hates_sin" in passes.PASSES


def test_temp_pass_cleaned_up():
    assert "hates_sin" not in passes.PASSES


def _wrong_aval(g):  # an output whose aval is a different dtype: the signature changes
    node = g.add("convert_element_type", [g.outputs[0]], dict(new_dtype=jnp.int32, weak_type=False,
                                                                 sharding=None))
    g.set_output(0, node.outputs[0])
    return g


def _changed_signature(g):  # drops an output
    g.set_outputs(g.outputs[:0] + [g.inputs[0], g.inputs[0]])
    return g


@pytest.mark.parametrize("bad", [_wrong_aval, _changed_signature])
@pytest.mark.parametrize("check", ["1", "0", ""])
def test_invalid_graph_is_skipped(bad, check, monkeypatch):
    monkeypatch.setenv("JAXFORM_CHECK", check)
    closed = jax.make_jaxpr(prog_sin)(X)
    with pytest.warns(UserWarning, match=f"pass '{bad.__name__}' failed.*signature changed"):
        out = run_passes(closed, ["cse", bad], where="prog_sin")
    assert out.out_avals == closed.out_avals
    assert [e.primitive.name for e in out.eqns].count("sin") == 1  # cse still applied
    with pytest.raises(jaxform.PassError, match=bad.__name__):
        run_passes(closed, [bad], strict=True)


def test_wrong_but_valid_program_is_not_caught():
    """Verification checks types and signature, not meaning: a valid wrong program gets through."""
    def wrong(g):
        node = g.add("neg", [g.outputs[0]], {})
        g.set_output(0, node.outputs[0])
        return g
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = jaxform.optimize(prog_plain, passes=[wrong])(X)
    np.testing.assert_array_equal(out, -prog_plain(X))


def test_unknown_pass_lists_known():
    with pytest.raises(ValueError, match=r"unknown pass 'zzz'\. Known passes: .*cse.*dce"):
        jaxform.optimize(prog_plain, passes=["zzz"])


def test_bad_inputs():
    with pytest.raises(TypeError, match="expects a function, got int"):
        jaxform.optimize(3)
    with pytest.raises(TypeError, match=r"argument .* of prog_plain .* is a object.*static"):
        jaxform.optimize(prog_plain)(object())
    with pytest.raises(TypeError, match="not hashable"):
        jaxform.optimize(lambda x, s: x, static_argnums=1)(X, {"a": 1})
