"""PyTensor graphs converted by jaxform match PyTensor's own JAX backend.

For each graph: values, jitted values, gradients (jax.grad through both) and
vmap agree with `jax_funcify` of the graph PyTensor's mode="JAX" compiles, and
graphs we claim to convert directly use no fallback.
"""
import numpy as np
import pytest

pytensor = pytest.importorskip("pytensor")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

from jaxform import to_function  # noqa: E402
from jaxform.frontends import pytensor as jpt  # noqa: E402
from jaxform.testing import assert_same  # noqa: E402


rng = np.random.default_rng(0)


def T(name, *shape, dtype="float64"):
    return pt.tensor(name, shape=shape, dtype=dtype)


def vals(*inputs):
    out = []
    for v in inputs:
        shape = v.type.shape
        if v.type.dtype.startswith("int"):
            out.append(rng.integers(0, 3, size=shape).astype(v.type.dtype))
        elif v.type.dtype == "bool":
            out.append(rng.random(size=shape) > 0.5)
        else:
            out.append(rng.normal(size=shape).astype(v.type.dtype))
    return out


def hierarchical_logp():
    """Eight-schools non-centred model, logp written as PyMC would build it (PyMC needs pytensor<2.39)."""
    mu, log_tau, theta_t = T("mu"), T("log_tau"), T("theta_t", 8)
    y = pt.as_tensor_variable(np.array([28., 8., -3., 7., -1., 1., 18., 12.]))
    sigma = pt.as_tensor_variable(np.array([15., 10., 16., 11., 9., 11., 10., 18.]))

    def normal_logp(x, m, s):
        return -0.5 * ((x - m) / s) ** 2 - pt.log(s) - 0.5 * np.log(2 * np.pi)

    tau = pt.exp(log_tau)
    half_cauchy = np.log(2) - np.log(np.pi * 5) - pt.log1p((tau / 5) ** 2) + log_tau  # + log|d tau/d log_tau|
    theta = mu + tau * theta_t
    logp = normal_logp(mu, 0, 5) + half_cauchy + normal_logp(theta_t, 0, 1).sum() + \
        normal_logp(y, theta, sigma).sum()
    return [mu, log_tau, theta_t], logp


def gp_logp():
    """A small GP marginal likelihood: Cholesky and triangular solves (fallback ops)."""
    x, ls, noise = T("x", 6), T("ls"), T("noise")
    y = pt.as_tensor_variable(np.sin(np.arange(6.0)))
    d = x[:, None] - x[None, :]
    K = pt.exp(-0.5 * (d / pt.exp(ls)) ** 2) + (pt.exp(noise) + 1e-3) * pt.eye(6)
    L = pt.linalg.cholesky(K)
    a = pt.linalg.solve_triangular(L, y, lower=True)
    return [x, ls, noise], -0.5 * (a ** 2).sum() - pt.log(pt.diagonal(L)).sum()


def scan_cumprod():
    x, h0 = T("x", 5, 3), T("h0", 3)
    hs, _ = pytensor.scan(lambda xt, h: pt.tanh(h * 0.5 + xt), sequences=[x], outputs_info=[h0])
    return [x, h0], hs[-1].sum() + hs.mean()


def ifelse():
    from pytensor.ifelse import ifelse as ife
    x, y = T("x", 3), T("y", 3)
    return [x, y], ife(x.sum() > 0, x * y, x - y)


def mlp():
    x, w1, b1, w2 = T("x", 5, 4), T("w1", 4, 8), T("b1", 8), T("w2", 8, 3)
    labels = pt.as_tensor_variable(np.array([0, 2, 1, 1, 0]))
    h = pt.tanh(x @ w1 + b1)
    logp = pt.special.log_softmax(h @ w2, axis=-1)
    return [x, w1, b1, w2], -logp[pt.arange(5), labels].mean()


def logistic_regression():
    x, w, b = T("x", 10, 3), T("w", 3), T("b")
    y = pt.as_tensor_variable((np.arange(10) % 2).astype("float64"))
    z = x @ w + b
    return [x, w, b], (y * pt.softplus(-z) + (1 - y) * pt.softplus(z)).sum()


def concat_grad():
    """pytensor.grad of pt.concatenate: the gradient splits the output gradient (a Split op, issue 28)."""
    x, y = T("x", 3, 2), T("y", 4, 2)
    w = pt.as_tensor_variable(np.arange(14.0).reshape(7, 2))
    cost = (pt.concatenate([pt.exp(x), y], axis=0) ** 2 * w).sum()
    return [x, y], pytensor.grad(cost, [x, y])


x34, y4, m44 = (lambda: T("x", 3, 4)), (lambda: T("y", 4)), (lambda: T("m", 4, 4))
CASES = {
    # name: (make() -> (inputs, outputs), converted with no fallback?)
    "add_mul": (lambda: ((x := x34(), y := y4()), x * y + 1.0), True),
    "exp_log": (lambda: ((x := x34(),), pt.log1p(pt.exp(x)) - pt.log(pt.exp(x) + 1)), True),
    "tanh_sin_cos": (lambda: ((x := x34(),), pt.tanh(x) * pt.sin(x) + pt.cos(x) ** 2), True),
    "div_sqrt_abs": (lambda: ((x := x34(),), x / pt.sqrt(pt.abs(x) + 1.0)), True),
    "pow_float": (lambda: ((x := x34(),), (x ** 2 + 1) ** 1.5), True),
    "max_min_clip": (lambda: ((x := x34(), y := y4()), pt.clip(pt.maximum(x, y) - pt.minimum(x, 0.3), -1, 1)), True),
    "switch": (lambda: ((x := x34(),), pt.switch(x > 0, x, 0.1 * x)), True),
    "comparisons_cast": (lambda: ((x := x34(),), pt.cast((x > 0) & (x < 1), "float64") * x), True),
    "sigmoid_erf": (lambda: ((x := x34(),), pt.sigmoid(x) + pt.erf(x) + pt.erfc(x)), True),
    "gammaln_psi": (lambda: ((x := x34(),), pt.gammaln(pt.exp(x)) + pt.psi(pt.exp(x))), True),
    "sum_axis": (lambda: ((x := x34(),), x.sum(axis=0) + x.sum()), True),
    "mean_var": (lambda: ((x := x34(),), x.mean(axis=1) + x.var(axis=1)), True),
    "max_prod": (lambda: ((x := x34(),), x.max(axis=1) * pt.prod(x, axis=1)), True),
    "all_any": (lambda: ((x := x34(),), pt.switch(pt.all(x > -5) & pt.any(x > 0), x.sum(), 0.0)), True),
    "dimshuffle": (lambda: ((x := x34(),), x.dimshuffle(1, "x", 0) * 2.0), True),
    "transpose_broadcast": (lambda: ((x := x34(), y := y4()), x.T * x.T[:, :1] + y[:, None]), True),
    "dot_mv": (lambda: ((x := x34(), y := y4()), pt.dot(x, y)), True),
    "dot_mm": (lambda: ((x := x34(), m := m44()), pt.dot(x, m)), True),
    "matmul_batched": (lambda: ((x := T("x", 2, 3, 4), m := m44()), pt.matmul(x, m)), True),
    "outer": (lambda: ((x := T("x", 3), y := y4()), pt.outer(x, y)), True),
    "softmax": (lambda: ((x := x34(),), pt.special.softmax(x, axis=-1)), True),
    "log_softmax": (lambda: ((x := x34(),), pt.special.log_softmax(x, axis=0)), True),
    "logsumexp": (lambda: ((x := x34(),), pt.logsumexp(x, axis=1)), True),
    "basic_subtensor": (lambda: ((x := x34(),), x[1:, ::2] * 2 + x[0, 1]), True),
    "negative_step": (lambda: ((x := x34(),), x[::-1, 3:0:-2]), True),
    "set_subtensor": (lambda: ((x := x34(), y := y4()), pt.set_subtensor(x[1], y)), True),
    "inc_subtensor": (lambda: ((x := x34(),), pt.inc_subtensor(x[1:, 2], 3.0)), True),
    "advanced_subtensor": (lambda: ((x := x34(), i := T("i", 2, dtype="int64")), x[i] * 2), False),
    "advanced_inc": (lambda: ((x := x34(), i := T("i", 2, dtype="int64")), pt.inc_subtensor(x[i, 1], 1.5)), False),
    "split": (lambda: ((x := T("x", 5, 3),), [o * (k + 1) for k, o in enumerate(pt.split(x, [2, 3], n_splits=2, axis=0))]),
              True),
    "concat_symbolic_grad": (lambda: concat_grad(), True),
    "gammainc_gammaincc": (lambda: ((x := x34(), k := y4()),
                                    pt.gammaincc(pt.exp(k), pt.exp(x)) * pt.gammainc(pt.exp(k) + 1, pt.exp(x))), True),
    "logsumexp_axes": (lambda: ((x := T("x", 2, 3, 4),), [pt.logsumexp(x, axis=(0, 2)), pt.logsumexp(x),
                                                          pt.logsumexp(x, axis=1, keepdims=True)]), True),
    "join_stack": (lambda: ((x := x34(), y := y4()), pt.join(0, x, y[None, :], x) + 1), True),
    "reshape_from_shape": (lambda: ((x := x34(),), x.reshape((x.shape[0] * 2, -1)) * 2), True),
    "alloc_shape": (lambda: ((x := x34(),), pt.alloc(1.0, x.shape[0], 2, x.shape[1]) * x[:, None, :]), True),
    "flatten": (lambda: ((x := T("x", 2, 3, 4),), x.flatten() + x.flatten(2)[:, :1].sum()), True),
    "zeros_like_fill": (lambda: ((x := x34(),), pt.zeros_like(x) + pt.ones_like(x) * x), True),
    "int_arith": (lambda: ((x := x34(), k := T("k", 3, 4, dtype="int32")), (k // 2 + k % 3) * x), False),
    "argmax": (lambda: ((x := x34(),), pt.argmax(x, axis=0)), False),
    "cumsum": (lambda: ((x := x34(),), pt.cumsum(x, axis=1)), False),
    "sort": (lambda: ((x := x34(),), pt.sort(x, axis=1)), False),
    "multi_output": (lambda: ((x := x34(), y := y4()), [pt.exp(x).sum(), x * y, (x - 1).max()]), True),
    "mlp": (mlp, False),
    "logistic_regression": (logistic_regression, True),
    "hierarchical_logp": (hierarchical_logp, True),
    "gp_logp": (gp_logp, False),
    "scan": (scan_cumprod, False),
    "ifelse": (ifelse, False),
}


def _reference(inputs, outputs):
    """PyTensor's own JAX backend: jax_funcify of the graph mode='JAX' compiles (a JAX-traceable function)."""
    from pytensor.link.jax.dispatch import jax_funcify
    f = pytensor.function(inputs, outputs, mode="JAX", on_unused_input="ignore")
    fn = jax_funcify(f.maker.fgraph)
    return f, lambda *a: list(fn(*a))


SLOW = {"gp_logp", "mlp", "scan"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(CASES)])
def test_matches_pytensor_jax_backend(name):
    make, direct = CASES[name]
    inputs, outputs = make()
    args = vals(*inputs)
    compiled, ref = _reference(inputs, outputs)
    stats = {}
    g = jpt.to_graph(inputs, outputs, stats=stats)
    ours = to_function(g)
    listed = lambda *a: (lambda r: r if isinstance(r, list) else [r])(ours(*a))
    # values equal PyTensor's JAX-mode function; dtypes are PyTensor's declared ones
    got = listed(*args)
    want = compiled(*args)
    want = want if isinstance(want, list) else [want]
    for o, w, var in zip(got, want, outputs if isinstance(outputs, list) else [outputs]):
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-9, atol=1e-9)
        assert str(o.dtype) == var.type.dtype
    # values eager + jit, gradients through jax.grad, and vmap agree with the JAX backend's function
    floats = any(np.issubdtype(np.dtype(o.dtype), np.floating) for o in got)
    assert_same(ref, listed, *map(jnp.asarray, args), rtol=1e-9, atol=1e-9, grad=floats)
    if direct:
        assert stats["fallback"] == 0, stats


@pytest.mark.parametrize("name", ["add_mul", "max_min_clip", "mean_var", "reshape_from_shape", "alloc_shape",
                                  "set_subtensor", "hierarchical_logp", "softmax", "join_stack", "matmul_batched",
                                  "logsumexp", "logsumexp_axes", "split", "concat_symbolic_grad", "gammainc_gammaincc"])
def test_unrewritten_graph_converts_directly(name):
    """rewrite=False converts the graph as written (no Composite fusion); still no fallback needed."""
    make, _ = CASES[name]
    inputs, outputs = make()
    args = vals(*inputs)
    stats = {}
    g = jpt.to_graph(inputs, outputs, rewrite=False, stats=stats)
    want = pytensor.function(inputs, outputs, on_unused_input="ignore", mode="FAST_COMPILE")(*args)
    got = to_function(g)(*args)
    for o, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
        np.testing.assert_allclose(np.asarray(o), w, rtol=1e-9, atol=1e-9)
    assert stats["fallback"] == 0, stats


def test_builds_primitives_not_jnp_calls():
    """The direct path emits plain primitives: no `jit` (pjit) wrappers that jnp tracing leaves."""
    inputs, out = hierarchical_logp()
    g = jpt.to_graph(inputs, out)
    names = {n.name for n, _ in g.walk()}
    assert "jit" not in names and "pjit" not in names
    assert {"exp", "log1p", "reduce_sum"} <= names


def test_function_is_jitted_and_composes():
    x = T("x", 3, 4)
    f = jpt.function([x], (pt.tanh(x) ** 2).sum())
    a = rng.normal(size=(3, 4))
    np.testing.assert_allclose(f(a), (np.tanh(a) ** 2).sum(), rtol=1e-12)
    np.testing.assert_allclose(jax.grad(f)(a), 2 * np.tanh(a) * (1 - np.tanh(a) ** 2), rtol=1e-12)
    assert jax.vmap(f)(np.stack([a, a])).shape == (2,)


def test_unknown_shape_needs_static_shape():
    x = pt.matrix("x")
    with pytest.raises(jpt.ConversionError, match=r"'x' has shape \(None, None\).*shapes="):
        jpt.to_graph([x], x.sum())
    g = jpt.to_graph([x], x.sum(axis=0) * x.shape[0], shapes={"x": (2, 5)})
    a = rng.normal(size=(2, 5))
    np.testing.assert_allclose(to_function(g)(a), a.sum(0) * 2)
    assert g.inputs[0].aval.shape == (2, 5)
    with pytest.raises(jpt.ConversionError, match="gives"):
        jpt.to_graph([T("y", 3)], T("y", 3).sum(), shapes=[(4,)])


def test_runtime_shape_is_a_clear_error():
    x, n = T("x", 6), T("n", dtype="int64")
    with pytest.raises(jpt.ConversionError, match="depends on runtime values"):
        jpt.to_graph([x, n], pt.alloc(0.0, n) + 1, rewrite=False)


def test_float64_without_x64_is_an_error():
    x = T("x", 3)
    jax.config.update("jax_enable_x64", False)
    try:
        with pytest.raises(jpt.ConversionError, match="64-bit mode is off"):
            jpt.to_graph([x], pt.exp(x))
        z = T("z", 3, dtype="float32")
        g = jpt.to_graph([z], pt.exp(z))
    finally:
        jax.config.update("jax_enable_x64", True)
    assert g is not None


def test_user_converter_wins():
    """A registered converter replaces the built-in one (the registry is the extension point)."""
    from pytensor.tensor.special import Softmax
    calls = []
    old = jpt.CONVERTERS.get(Softmax)
    jpt.register(Softmax)(lambda cv, node, x: calls.append(node) or cv.b.exp(cv.value(x)))
    try:
        x = T("x", 3)
        g = jpt.to_graph([x], pt.special.softmax(x), rewrite=False)
        np.testing.assert_allclose(to_function(g)(np.zeros(3)), np.ones(3))
        assert calls
    finally:
        jpt.CONVERTERS[Softmax] = old


def test_fallback_import_keeps_x64_flag():
    before = jax.config.jax_enable_x64
    jpt._jax_funcify()
    assert jax.config.jax_enable_x64 == before


def test_while_scan_is_a_clear_error():
    """A scan with `until` returns traces whose length depends on the data: no static-shape JAX program
    (PyTensor's JAX backend refuses it too), so conversion stops naming the op instead of guessing."""
    from pytensor.scan.utils import until
    x = T("x")
    out, _ = pytensor.scan(lambda v: (v * 2, until(v > 10.0)), outputs_info=[x], n_steps=20)
    with pytest.raises(jpt.ConversionError, match="while-scan"):
        jpt.to_graph([x], out[-1])


def test_cast_of_literal_is_folded():
    """A float32 constant in a float64 expression is cast at conversion (exact), not by a runtime convert."""
    x = T("x", 3)
    g = jpt.to_graph([x], x * np.float32(-0.5), rewrite=False)
    assert "convert_element_type" not in {n.name for n, _ in g.walk()}
    np.testing.assert_allclose(to_function(g)(np.ones(3)), -0.5 * np.ones(3))


def _op_names(inputs, outputs, rewrite=True):
    """Class names of the ops in the graph jaxform converts (after the JAX mode's rewrites if `rewrite`)."""
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    fg = FunctionGraph(inputs, outputs if isinstance(outputs, list) else [outputs], clone=True)
    if rewrite:
        get_mode("JAX").optimizer.rewrite(fg)
    return {type(n.op).__name__ for n in fg.apply_nodes} | \
        {type(n.op.scalar_op).__name__ for n in fg.apply_nodes if hasattr(n.op, "scalar_op")}


@pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no_rewrite"])
def test_concatenate_gradient_split_converts(rewrite):
    """Issue 28: on pytensor >= 3.1 Split takes (x, splits) with the axis as a property; the symbolic gradient
    of pt.concatenate is a Split, converted natively and equal to PyTensor's C backend."""
    inputs, outputs = concat_grad()
    assert "Split" in _op_names(inputs, outputs, rewrite)
    stats = {}
    got = to_function(jpt.to_graph(inputs, outputs, rewrite=rewrite, stats=stats))(*vals(*inputs))
    assert stats["fallback"] == 0, stats
    args = vals(*inputs)
    got = to_function(jpt.to_graph(inputs, outputs, rewrite=rewrite))(*args)
    want = pytensor.function(inputs, outputs)(*args)
    for o, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(o), w, rtol=1e-12)


def test_split_is_one_split_primitive_not_slices():
    """Issue 28: Split converts to JAX's `split` primitive (its transpose is one concatenate), not one slice per
    part (their transposes are a pad and an add per part). With slices, the GaussianRandomWalk of PyMC's
    stochastic volatility model ran 1.32-1.38x slower than PyTensor's backend per gradient inside a sampler's
    loop; with `split` 1.00-1.02x (benchmarks/pymc_models.py, the "loop" column)."""
    inputs, outputs = CASES["split"][0]()
    g = jpt.to_graph(inputs, outputs, rewrite=False)
    names = [n.name for n, _ in g.walk()]
    assert names.count("split") == 1 and "slice" not in names, names
    whole = pt.split(inputs[0], [5], n_splits=1, axis=0)        # one part (PyTensor returns it unlisted)
    g1 = jpt.to_graph(inputs, [whole * 2], rewrite=False)     # one part: the input itself
    assert "split" not in [n.name for n, _ in g1.walk()]


@pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no_rewrite"])
def test_clip_is_pytensors_clip_values_and_gradient(rewrite):
    """Clip is PyTensor's (`x < lo ? lo : x > hi ? hi : x`, its C code and JAX backend), not numpy.clip's
    min(max(x, lo), hi), which jaxform used: where lo > hi, lo below lo and hi from lo up; a NaN bound
    clips nothing; the sign of x's zero at a bound; the gradient reaches x in full at x == lo or hi."""
    x, lo, hi = T("x", 8), T("lo", 8), T("hi", 8)
    out = pt.clip(x, lo, hi)
    loss = (out * np.arange(1.0, 9.0)).sum()
    grads = pytensor.grad(loss, [x, lo, hi])
    xv = np.array([0.0, 0.5, 2.0, 5.0, np.nan, 7.0, -0.0, 1.0])
    lov = np.array([0.0, 0.0, 10.0, 3.0, 0.0, np.nan, 0.0, 0.0])
    hiv = np.array([1.0, 1.0, 3.0, 1.0, 1.0, 2.0, 1.0, np.nan])
    want = pytensor.function([x, lo, hi], out, mode="FAST_COMPILE")(xv, lov, hiv)
    np.testing.assert_array_equal(want, [0.0, 0.5, 10.0, 1.0, np.nan, 2.0, -0.0, 1.0])   # PyTensor's own
    stats = {}
    f = to_function(jpt.to_graph([x, lo, hi], out, rewrite=rewrite, stats=stats))
    assert stats["fallback"] == 0, stats
    got = np.asarray(f(xv, lov, hiv))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    fc = to_function(jpt.to_graph([x, lo, hi], loss, rewrite=rewrite))
    xf = np.where(np.isnan(xv), 0.5, xv)
    got = [np.asarray(o) for o in jax.grad(fc, argnums=(0, 1, 2))(xf, lov, hiv)]
    ref = pytensor.function([x, lo, hi], grads, mode="FAST_COMPILE")(xf, lov, hiv)
    # PyTensor's gradient, ties included (entry 0: x == lo gets it all), lo > hi included (entries 2, 3),
    # except at a NaN hi (entry 7), where PyTensor's pullback sends x nothing though the value is x: ours x
    keep = np.arange(8) != 7
    for o, w in zip(got, ref):
        np.testing.assert_array_equal(o[keep], w[keep])
    assert [o[7] for o in got] == [8.0, 0.0, 0.0] and ref[0][7] == 0.0
    assert [o[0] for o in got] == [1.0, 0.0, 0.0]


def test_split_bad_sizes_is_a_clear_error():
    x = T("x", 5, 3)
    outs = pt.split(x, [2, 2], n_splits=2, axis=0)
    with pytest.raises(jpt.ConversionError, match="Split.*sizes \\[2, 2\\]"):
        jpt.to_graph([x], list(outs), rewrite=False)


@pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no_rewrite"])
def test_logsumexp_native_matches_scipy_and_softmax_gradient(rewrite):
    """LogSumExp (an op since pytensor 3; mixtures, zero-inflated counts) converts natively: values equal
    scipy.special.logsumexp, including rows of -inf (no NaN) and large values; the gradient is softmax."""
    from scipy.special import logsumexp, softmax
    import importlib
    if not hasattr(importlib.import_module("pytensor.tensor.special"), "LogSumExp"):
        pytest.skip("pytensor < 3 has no LogSumExp op: logsumexp is log(sum(exp(x))), which its rewrites "
                    "stabilize for values, not for the gradient of a row near overflow")
    x = T("x", 4, 3)
    out = pt.logsumexp(x, axis=1)
    stats = {}
    f = to_function(jpt.to_graph([x], out, rewrite=rewrite, stats=stats))
    assert stats["fallback"] == 0, stats
    xv = rng.normal(size=(4, 3)) * 3
    xv[1] = -np.inf
    xv[2] = [800.0, 799.0, -np.inf]
    np.testing.assert_allclose(np.asarray(f(xv)), logsumexp(xv, axis=1), rtol=1e-14)
    fin = rng.normal(size=(4, 3)) * 3
    fin[2] = [800.0, 799.0, 700.0]
    g = jax.grad(lambda a: (f(a) * jnp.arange(1.0, 5.0)).sum())(fin)
    np.testing.assert_allclose(np.asarray(g), softmax(fin, axis=1) * np.arange(1.0, 5.0)[:, None], rtol=1e-12)


def test_gammaincc_native_matches_scipy_and_pytensor_gradient():
    """GammaIncC (hurdle and truncated Poisson normalizers) converts to lax.igammac: values equal scipy; the
    gradient in both arguments equals PyTensor's own (C) symbolic gradient."""
    from scipy.special import gammainc, gammaincc
    k, x = T("k", 5), T("x", 5)
    outs = [pt.gammaincc(k, x), pt.gammainc(k, x)]
    stats = {}
    f = to_function(jpt.to_graph([k, x], outs, stats=stats))
    assert stats["fallback"] == 0, stats
    kv, xv = np.array([0.5, 1.0, 2.5, 7.0, 20.0]), np.array([0.3, 2.0, 1.0, 9.0, 15.0])
    q, p = f(kv, xv)
    np.testing.assert_allclose(np.asarray(q), gammaincc(kv, xv), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(p), gammainc(kv, xv), rtol=1e-12)
    # gradients: d/dx exactly -x^(k-1) e^-x / Gamma(k); d/dk against a central difference of scipy (PyTensor
    # 2.38's own symbolic d/dk is wrong at k=20, x=15: -5.06 where the difference gives 0.243)
    from scipy.special import gammaln
    got = jax.grad(lambda a, b: (f(a, b)[0] * jnp.arange(1.0, 6.0)).sum(), argnums=(0, 1))(kv, xv)
    dx = -np.exp((kv - 1) * np.log(xv) - xv - gammaln(kv))
    np.testing.assert_allclose(np.asarray(got[1]), dx * np.arange(1.0, 6.0), rtol=1e-10)
    h = 1e-5
    dk = (gammaincc(kv + h, xv) - gammaincc(kv - h, xv)) / (2 * h)
    np.testing.assert_allclose(np.asarray(got[0]), dk * np.arange(1.0, 6.0), rtol=1e-6)


def test_always_true_check_conditions():
    """Which parameter-check conditions jaxform drops (true for every non-NaN input) and which it keeps."""
    x = T("x", 3)
    holds = {"sigmoid >= 0": pt.sigmoid(x) >= 0, "sigmoid <= 1": pt.sigmoid(x) <= 1, "exp > 0": pt.exp(x) > 0,
             "all(0 <= sigmoid <= 1)": pt.all(pt.stack([pt.all(pt.sigmoid(x) >= 0), pt.all(pt.sigmoid(x) <= 1)])),
             "0 < exp": 0 < pt.exp(x), "abs >= 0": pt.abs(x) >= 0}
    fails = {"x > 0": x > 0, "abs > 0": pt.abs(x) > 0, "exp >= 1": pt.exp(x) >= 1, "sigmoid < 0.5": pt.sigmoid(x) < 0.5,
             "exp > 0 and x > 0": pt.and_(pt.exp(x) > 0, x > 0)}
    assert all(jpt._always_holds(v) for v in holds.values()), {k: jpt._always_holds(v) for k, v in holds.items()}
    assert not any(jpt._always_holds(v) for v in fails.values()), {k: jpt._always_holds(v) for k, v in fails.items()}
