"""optimize / trace / to_function / filter_optimize at the API boundary: jit's semantics, clear errors.

Regression tests for issue 15 (findings 6, 7, 15, 16, 19) and issue 20 (filter_optimize).
"""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform


# ---- finding 6: to_function checks the traced pytree and avals ----

def _sub(a, b):
    return a - b


def test_to_function_rejects_keywords_for_positionals():
    run = jaxform.to_function(jaxform.trace(_sub, 2.0, 1.0))
    assert float(run(2.0, 1.0)) == 1.0
    with pytest.raises(TypeError, match="keyword arguments a, b"):
        run(b=1.0, a=2.0)


def test_to_function_keywords_bind_by_name():
    run = jaxform.to_function(jaxform.trace(_sub, a=2.0, b=1.0))
    assert float(run(b=1.0, a=2.0)) == 1.0


def test_to_function_rejects_other_pytree_and_shape():
    run = jaxform.to_function(jaxform.trace(_sub, 2.0, 1.0))
    with pytest.raises(TypeError, match="structured as 2 positional"):
        run((2.0, 1.0))
    with pytest.raises(TypeError, match=r"input 0 .* must be float32\[\], got float32\[3\]"):
        run(jnp.ones(3), 1.0)
    with pytest.raises(TypeError, match="must be float32"):
        run(jnp.int32(2), 1.0)


# ---- finding 7: the cache key includes JAX's configuration ----

def test_cache_key_includes_x64():
    f = lambda x: x + jnp.arange(3)       # same argument types under both modes, different result dtype
    g, x = jaxform.optimize(f), jnp.ones(3, jnp.int32)
    assert g(x).dtype == jnp.int32
    with jax.enable_x64():
        assert g(x).dtype == jax.jit(f)(x).dtype == jnp.int64
    assert g(x).dtype == jnp.int32


def _from_constants(x):
    w = jnp.asarray(1.5)                      # weak-typed; float64 under x64
    return {"c": jnp.sin(w), "lit": jnp.sin(jnp.asarray(1.5)) * 2.0, "x": x * w}


def _types(tree):
    return [(x.dtype, x.weak_type, type(x).__name__) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("passes", [None, [], ["algebra", "cse", "dce"]])
@pytest.mark.parametrize("first", [False, True])
def test_cache_key_x64_for_outputs_from_constants(passes, first):
    """The fuzzer's residual of finding 7: a wrapper first called without x64 returned float32 under
    enable_x64 for an output computed from constants. Same wrapper, both orders, plain and under jit."""
    g = jaxform.optimize(_from_constants, passes=passes)
    for x64 in (first, not first, first):
        with jax.enable_x64(x64):
            for x in (2.0, jnp.float32(2.0)):
                want = jax.jit(_from_constants)(x)
                assert _types(g(x)) == _types(jax.jit(g)(x)) == _types(want)
                assert want["c"].dtype == (jnp.float64 if x64 else jnp.float32)
                for k in want:
                    np.testing.assert_allclose(g(x)[k], want[k], rtol=1e-6)


def test_cache_key_includes_rank_promotion():
    g = jaxform.optimize(lambda x, y: x + y)
    g(jnp.ones(3), jnp.ones((2, 1)))
    with jax.numpy_rank_promotion("raise"):
        with pytest.raises(ValueError, match="jax_numpy_rank_promotion"):
            g(jnp.ones(3), jnp.ones((2, 1)))


# ---- finding 15: static_argnums / static_argnames as jax.jit ----

def _h(x, n, mode="sum"):
    return x * n if mode == "sum" else x - n


def test_static_argnames_given_positionally():
    g = jaxform.optimize(_h, static_argnames=("n", "mode"))
    assert float(g(2.0, 3, "sub")) == float(jax.jit(_h, static_argnames=("n", "mode"))(2.0, 3, "sub")) == -1.0


def test_static_argnums_given_by_keyword():
    g = jaxform.optimize(_h, static_argnums=(1, 2))
    assert float(g(2.0, n=3, mode="sub")) == float(jax.jit(_h, static_argnums=(1, 2))(2.0, n=3, mode="sub"))


def test_out_of_range_static_argnums_raises_like_jit():
    with pytest.raises(ValueError, match="static_argnums"):
        jax.jit(_h, static_argnums=5)
    with pytest.raises(ValueError, match="static_argnums"):
        jaxform.optimize(_h, static_argnums=5)


def test_single_pass_name_is_one_pass():
    g = jaxform.optimize(lambda x: x * 1.0, passes="cse")
    assert [p.__name__ for p in g.passes] == ["cse"]
    with pytest.raises(ValueError, match="unknown pass 'cs'"):
        jaxform.optimize(lambda x: x, passes="cs")


# ---- finding 16: tracing errors name the user's function and argument ----

def user_loop(x, n):
    for _ in range(n):
        x = x + 1
    return x


def test_tracing_error_names_user_function():
    with pytest.raises(jax.errors.TracerIntegerConversionError) as e:
        jaxform.optimize(user_loop)(1.0, 3)
    msg = str(e.value)
    assert "user_loop" in msg and "argument n" in msg and "flat_fn" not in msg


def test_trace_error_names_user_function():
    with pytest.raises(jax.errors.TracerIntegerConversionError, match="user_loop.*argument n"):
        jaxform.trace(user_loop, 1.0, 3)


# ---- finding 19: constant outputs are jax Arrays typed as jit types them ----

@pytest.mark.parametrize("f", [lambda x: 1.0, lambda x: 1, lambda x: jnp.float32(2), lambda x: np.arange(3),
                               lambda x: x, lambda x: (x, 2)])
@pytest.mark.parametrize("arg", [2.0, np.ones(2, np.float32)])
def test_constant_outputs_are_arrays(f, arg):
    want, got = jax.jit(f)(arg), jaxform.optimize(f)(arg)
    for w, o in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        assert isinstance(o, jax.Array) and type(o) is type(w)
        assert jax.typeof(o) == jax.typeof(w)
        np.testing.assert_array_equal(o, w)


def test_to_function_constant_output_is_array():
    run = jaxform.to_function(jaxform.trace(lambda x: (x, 3), 1.0))
    out = run(1.0)
    assert all(isinstance(o, jax.Array) for o in out)
    assert jax.typeof(out[1]) == jax.typeof(jax.jit(lambda: 3)())


# ---- issue 20: Equinox models, filter_optimize ----

class MLP(eqx.Module):
    w: jax.Array
    b: jax.Array
    hidden_size: int
    act: object

    def __call__(self, x):
        h = self.act(x @ self.w + self.b)
        return h[..., : self.hidden_size].sum(-1) + jnp.zeros(self.hidden_size).sum()


def _model():
    k1, k2 = jax.random.split(jax.random.key(0))
    return MLP(jax.random.normal(k1, (3, 4)), jax.random.normal(k2, (4,)), 2, jnp.tanh)


def loss(model, x):
    return jnp.mean(model(x) ** 2)


def test_filter_optimize_value_and_grad_matches_equinox():
    model, x = _model(), jnp.arange(6.0).reshape(2, 3)
    want = eqx.filter_value_and_grad(loss)(model, x)
    f = jaxform.filter_optimize(loss)
    got = eqx.filter_value_and_grad(f)(model, x)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    got_jit = eqx.filter_jit(eqx.filter_value_and_grad(f))(model, x)
    np.testing.assert_allclose(got_jit[0], want[0], rtol=1e-6)
    # a different static (hidden size) is a new entry; equal statics share one
    eqx.filter_value_and_grad(f)(eqx.tree_at(lambda m: m.hidden_size, model, 3), x)
    eqx.filter_value_and_grad(f)(model, x + 1)
    assert f.cache_size() == 2


def test_filter_optimize_unhashable_static_by_identity():
    class Cfg:                      # unhashable (defines __eq__ only)
        def __eq__(self, other):
            return False
        __hash__ = None
    cfg = Cfg()
    f = jaxform.filter_optimize(lambda x, c: x * 2)
    f(jnp.ones(2), cfg); f(jnp.ones(2), cfg)
    assert f.cache_size() == 1
    f(jnp.ones(2), Cfg())
    assert f.cache_size() == 2


def test_optimize_on_model_with_int_field_names_the_leaf():
    model, x = _model(), jnp.ones((2, 3))
    model = MLP(model.w, model.b, 2, None)          # arrays and an int only
    def lossn(model, x):
        return jnp.zeros(model.hidden_size).sum() + jnp.sum(x @ model.w)
    with pytest.raises(TypeError, match=r"lossn.*argument model\.hidden_size") as e:
        eqx.filter_value_and_grad(jaxform.optimize(lossn))(model, x)
    assert "flat_fn" not in str(e.value)
    val, _ = eqx.filter_value_and_grad(jaxform.filter_optimize(lossn))(model, x)
    np.testing.assert_allclose(val, lossn(model, x))


def test_non_array_leaf_error_names_path():
    with pytest.raises(TypeError, match=r"argument model\.act of loss .*filter_optimize"):
        jaxform.optimize(loss)(_model(), jnp.ones((2, 3)))


# ---- issue 26, finding 10: every option is checked when optimize is called ----

@pytest.mark.parametrize("memory, match", [
    ("Auto", r"memory='Auto' is not a setting\. Did you mean 'auto'\?"),
    (" MIN", r"Did you mean 'min'\?"),
    ("fast", r"memory='fast' is not a setting"),
    (-1, "finite number of bytes >= 0"),
    (float("nan"), "finite number of bytes >= 0"),
    (float("inf"), "finite number of bytes >= 0"),
])
@pytest.mark.parametrize("api", [jaxform.optimize, jaxform.filter_optimize])
def test_invalid_memory_raises_at_optimize(api, memory, match):
    with pytest.raises(ValueError, match=match) as e:
        api(_sub, memory=memory)
    assert "_sub" in str(e.value)          # names the user's function


@pytest.mark.parametrize("kw", [dict(memory=True), dict(memory=[1]), dict(exact="yes"), dict(strict=1)])
def test_invalid_option_types_raise_at_optimize(kw):
    with pytest.raises(TypeError, match="_sub"):
        jaxform.optimize(_sub, **kw)


@pytest.mark.parametrize("memory", [None, "auto", "min", 0, 2**30, 1.5e9, np.int64(10)])
def test_valid_memory_settings_accepted(memory):
    assert float(jaxform.optimize(_sub, memory=memory)(2.0, 1.0)) == 1.0


# ---- issue 26, finding 12: optimize honours jax.disable_jit() like jax.jit ----

def _branchy(x):
    if x > 0:                   # Python control flow on a value: only works untraced
        return x * 2
    return -x


@pytest.mark.parametrize("api", [jaxform.optimize, jaxform.filter_optimize, jax.jit])
def test_disable_jit_runs_python_as_written(api):
    seen = []

    def f(x):
        seen.append(type(x))
        return _branchy(x)

    g = api(f)
    with jax.disable_jit():
        assert float(g(jnp.float32(-3.0))) == 3.0
        assert float(g(jnp.float32(2.0))) == 4.0
    assert all(not issubclass(t, jax.core.Tracer) for t in seen)
    with pytest.raises(jax.errors.TracerBoolConversionError):
        g(jnp.float32(1.0))      # outside disable_jit it traces, as jax.jit does
