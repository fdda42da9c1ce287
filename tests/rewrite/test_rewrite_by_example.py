"""rule_by_example: patterns and replacements as ordinary JAX functions, matched shape-agnostically."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform import Rules, rewrite, rule_by_example
from jaxform.optimize import PassError
from jaxform.testing import assert_same

rng = np.random.default_rng(2)
U = rng.uniform(0.1, 1.0, size=(3, 4)).astype(np.float32)


def prims(fn, *args):
    return [n.prim.name for n, _ in jaxform.trace(fn, *args).walk()]


LOG1P = rule_by_example(lambda x: jnp.log(1 + x), lambda x: jnp.log1p(x), name="log1p")


@pytest.mark.parametrize("shape", [(), (7,), (3, 4), (2, 3, 5)])
def test_matches_any_shape_where_params_do_not_pin_it(shape):
    x = rng.uniform(0.1, 1.0, size=shape).astype(np.float32)
    fn = lambda x: jnp.log(x + 1.0) * 2.0
    f2 = rewrite(fn, [LOG1P])
    assert_same(fn, f2, x)
    assert "log" not in prims(f2, x) and f2.stats.fired == {"log1p": 1}


def test_matches_other_dtypes_confirmed_by_tracing():
    x = U.astype(jnp.bfloat16)
    f2 = rewrite(lambda x: jnp.log(1 + x), [LOG1P])
    assert "log1p" in prims(f2, x) and f2.stats.total == 1
    np.testing.assert_allclose(np.float32(f2(x)), np.float32(jnp.log1p(x)), rtol=1e-2)


def test_two_arguments_repeated_use_and_names():
    sq = rule_by_example(lambda a, b: (a - b) * (a - b), lambda a, b: jnp.square(a - b))
    assert "<lambda at test_rewrite_by_example.py" in sq.name
    def fn(x, y):
        s = jnp.sin(x)
        return jnp.sum((s - y) * (s - y))
    f2 = rewrite(fn, [sq])
    assert_same(fn, f2, U, U[::-1])
    assert f2.stats.total == 1 and "mul" not in prims(f2, U, U)
    # (x - y) * (y - x) is not the pattern: a and b must be the same values in both places
    other = rewrite(lambda x, y: (x - y) * (y - x), [sq])
    other(U, U)
    assert other.stats.total == 0


def test_softmax_by_example_respects_axis_and_keeps_other_params():
    stable = rule_by_example(lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True),
                             lambda x: jax.nn.softmax(x, axis=-1), name="softmax")
    big = rng.normal(size=(5, 9)).astype(np.float32) * 50
    fn = lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=-1, keepdims=True)
    with pytest.raises(PassError, match="do not terminate.*'softmax'"):
        rewrite(fn, [stable])(big)
    # jax.nn.softmax is itself exp(x - max) / sum(...): the rule matches its own output. Guard it.
    raw_only = dataclasses.replace(stable, check=lambda caps, root: stable.check(caps, root) and
                                   caps["x"].producer is None)
    rules = Rules([raw_only])
    f2 = rewrite(fn, rules)
    np.testing.assert_allclose(f2(big), jax.nn.softmax(big, axis=-1), rtol=1e-5)
    assert f2.stats.total == 1
    # axis 0 is another program (reduce axes (0,)): no match
    f0 = rewrite(lambda x: jnp.exp(x) / jnp.sum(jnp.exp(x), axis=0, keepdims=True), rules)
    f0(big)
    assert f0.stats.total == 0


def test_loose_match_is_confirmed_exactly():
    # reshape's new_sizes depends on the shape, so it is left free in the Pat; the check then
    # traces the pattern on the captured shape and rejects reshapes to anything but (-1,).
    flat = rule_by_example(lambda x: jnp.sin(x.reshape(-1)), lambda x: jnp.sin(x).reshape(-1), name="flat")
    assert "new_sizes" not in flat.pat.params
    ok = rewrite(lambda x: jnp.sin(x.reshape(-1)), [flat])
    assert_same(lambda x: jnp.sin(x.reshape(-1)), ok, U)
    assert ok.stats.total == 1
    other = rewrite(lambda x: jnp.sin(x.reshape(4, 3)), [flat])
    other(U)
    assert other.stats.total == 0


def test_example_args_and_replacements_that_decline():
    colsum = rule_by_example(lambda x: jnp.sum(x * x, axis=1),
                             lambda x: jnp.einsum("ij,ij->i", x, x) if x.ndim == 2 else None,
                             jax.ShapeDtypeStruct((2, 3), jnp.float32), name="colsum")
    f2 = rewrite(lambda x: jnp.sum(x * x, axis=1), [colsum])
    assert_same(lambda x: jnp.sum(x * x, axis=1), f2, U)
    assert f2.stats.total == 1
    f3 = rewrite(lambda x: jnp.sum(x * x, axis=1), [colsum])
    f3(np.ones((2, 3, 4), np.float32))           # rank 3 matches (same params) but the replacement declines
    assert f3.stats.total == 0


def test_errors():
    with pytest.raises(ValueError, match="array constant"):
        rule_by_example(lambda x: x * np.arange(35.0).reshape(5, 7), lambda x: x)
    with pytest.raises(ValueError, match="must compute something"):
        rule_by_example(lambda x: x, lambda x: x)
    with pytest.raises(ValueError, match=r"does not use argument\(s\) \['y'\]"):
        rule_by_example(lambda x, y: jnp.sin(x), lambda x, y: x)
    with pytest.raises(TypeError, match="plain positional"):
        rule_by_example(lambda *xs: jnp.sin(xs[0]), lambda x: x)
    with pytest.raises(TypeError, match="takes 1 arguments, got 2 examples"):
        rule_by_example(lambda x: jnp.sin(x), lambda x: x, U, U)


def test_where_keeps_a_rule_off_its_own_output():
    naive = lambda x: jnp.log(jnp.sum(jnp.exp(x), axis=-1))

    def stable(x):
        m = jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
        return jnp.log(jnp.sum(jnp.exp(x - m), axis=-1)) + m[..., 0]
    with pytest.raises(PassError, match="do not terminate"):      # stable contains the pattern again
        rewrite(naive, [rule_by_example(naive, stable)])(U)
    shifted = jaxform.Pat("sub", jaxform.Pat.any(), jaxform.Pat("stop_gradient"))
    seen = []
    rule = rule_by_example(naive, stable, name="lse",
                           where=lambda x: seen.append(x) or shifted.match(x) is None)
    f2 = rewrite(naive, [rule])
    assert_same(naive, f2, U)
    assert f2.stats.fired == {"lse": 1} and all(isinstance(v, jaxform.Value) for v in seen)
    np.testing.assert_allclose(f2(U * 100), jax.nn.logsumexp(U * 100, axis=-1), rtol=1e-6)
