"""Attacks on the PyTensor front end's Split (one `split` primitive) and Clip converters.

The attack found four differences in a Clip converted as `max(min(x, hi), lo)` (lo > hi with x >= lo, the
gradient there, NaN bounds, signed zeros at a bound; and a GP's gradient under jit, below); Clip is now
PyTensor's own select chain and these tests say so.

Each converted function is compared with PyTensor's own answer: values and dtypes with
pytensor.function(..., mode="FAST_COMPILE") (its Python `impl`, the same expression as its C code
`x < lo ? lo : x > hi ? hi : x`) and, where said, its JAX backend; gradients with pytensor.grad.
"""
import warnings

import numpy as np
import pytest

pytensor = pytest.importorskip("pytensor")

import jax  # noqa: E402
import pytensor.tensor as pt  # noqa: E402

import jaxform  # noqa: E402
from jaxform import to_function  # noqa: E402
from jaxform.frontends import pytensor as jpt  # noqa: E402


REWRITE = pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no_rewrite"])


def T(name, *shape, dtype="float64"):
    return pt.tensor(name, shape=shape, dtype=dtype)


def _pt(inputs, outputs, *args):
    return pytensor.function(inputs, outputs, mode="FAST_COMPILE", on_unused_input="ignore")(*args)


def _jf(inputs, outputs, rewrite=True, **kw):
    return to_function(jpt.to_graph(inputs, outputs, rewrite=rewrite, **kw))


def _as_list(r):
    return list(r) if isinstance(r, (list, tuple)) else [r]


def _same(got, want):
    """Bit-for-bit: dtype, shape, values (NaN == NaN) and the sign of zeros."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def _op_names(inputs, outputs, rewrite=True):
    """Op and scalar-op class names PyTensor leaves in the graph jaxform converts."""
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    fg = FunctionGraph(inputs, _as_list(outputs), clone=True)
    if rewrite:
        get_mode("JAX").optimizer.rewrite(fg)
    names = set()
    for n in fg.apply_nodes:
        names.add(type(n.op).__name__)
        sop = getattr(n.op, "scalar_op", None)
        if sop is not None:
            names.add(type(sop).__name__)
            if type(sop).__name__ == "Composite":
                names |= {type(m.op).__name__ for m in sop.fgraph.apply_nodes}
    return names


# ---------------------------------------------------------------------------------------------------------
# Clip: values
# ---------------------------------------------------------------------------------------------------------

@REWRITE
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_clip_special_values_match_pytensor(dtype, rewrite):
    """lo <= hi, tensor bounds: inf/-inf in x and in the bounds, NaN in x, huge values, lo == hi; jaxform's
    values and dtype equal PyTensor's bit for bit (except signed zeros, tested separately), eager and jitted."""
    x, lo, hi = T("x", 8, dtype=dtype), T("lo", 8, dtype=dtype), T("hi", 8, dtype=dtype)
    big = np.finfo(dtype).max
    xv = np.array([np.inf, -np.inf, np.nan, big, -big, 2.5, 1.0, -7.0], dtype)
    lov = np.array([-np.inf, -np.inf, 0.0, 0.0, -np.inf, 3.0, 1.0, -np.inf], dtype)
    hiv = np.array([np.inf, 5.0, 1.0, np.inf, 0.0, 3.0, 1.0, np.inf], dtype)
    out = pt.clip(x, lo, hi)
    want = _pt([x, lo, hi], out, xv, lov, hiv)
    np.testing.assert_array_equal(want, np.array([np.inf, -np.inf, np.nan, big, -big, 3.0, 1.0, -7.0], dtype))
    f = _jf([x, lo, hi], out, rewrite)
    _same(f(xv, lov, hiv), want)
    _same(jax.jit(f)(xv, lov, hiv), want)


@REWRITE
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "float32"])
@pytest.mark.parametrize("bounds", ["int", "float", "wide_int", "int8_tensor_f32"])
def test_clip_dtypes_and_weak_bounds_match_pytensor(dtype, bounds, rewrite):
    """Integer and float x with Python-int, Python-float, out-of-range-int bounds (PyTensor upcasts the output)
    and an int8 tensor lo with a float32 constant hi: jaxform's dtype is PyTensor's and the values equal."""
    x = T("x", 6, dtype=dtype)
    xv = np.array([0, 1, 2, 3, 100, 127]).astype(dtype)
    inputs, args = [x], [xv]
    if bounds == "int":
        out = pt.clip(x, 1, 3)
    elif bounds == "float":
        out = pt.clip(x, 0.5, 2.5)
    elif bounds == "wide_int":
        out = pt.clip(x, -1, 300)
    else:
        lo = T("lo", dtype="int8")
        out = pt.clip(x, lo, np.float32(2.5))
        inputs, args = [x, lo], [xv, np.int8(-3)]
    want = _pt(inputs, out, *args)
    assert str(want.dtype) == out.type.dtype
    _same(_jf(inputs, out, rewrite)(*args), want)


@REWRITE
@pytest.mark.parametrize("bounds", ["tensor", "python_consts"])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
def test_clip_lo_above_hi_with_x_at_or_above_lo(dtype, bounds, rewrite):
    """lo = 3 > hi = 1 and x in [0, 1, 2, 3, 4, 9]: PyTensor (FAST_COMPILE and its JAX backend, both
    `x < lo ? lo : x > hi ? hi : x`) gives [3, 3, 3, 1, 1, 1]; jaxform must give the same."""
    x = T("x", 6, dtype=dtype)
    xv = np.array([0, 1, 2, 3, 4, 9]).astype(dtype)
    if bounds == "tensor":
        lo, hi = T("lo", dtype=dtype), T("hi", dtype=dtype)
        inputs, args, out = [x, lo, hi], [xv, np.asarray(3, dtype), np.asarray(1, dtype)], pt.clip(x, lo, hi)
    else:
        inputs, args, out = [x], [xv], pt.clip(x, 3, 1)
    want = _pt(inputs, out, *args)
    np.testing.assert_array_equal(want, np.array([3, 3, 3, 1, 1, 1], dtype))
    jax_backend = pytensor.function(inputs, out, mode="JAX")(*args)
    np.testing.assert_array_equal(np.asarray(jax_backend), want)
    _same(_jf(inputs, out, rewrite)(*args), want)


@REWRITE
def test_clip_lo_above_hi_gradient_goes_to_hi_where_x_above_lo(rewrite):
    """lo = 4 > hi = 1, x = [5, 10] (x > lo > hi): PyTensor's value is hi and pytensor.grad sends the
    gradient to hi only (d/dlo = 0, d/dhi = the weights); jaxform's jax.grad must agree."""
    x, lo, hi = T("x", 2), T("lo", 2), T("hi", 2)
    loss = (pt.clip(x, lo, hi) * np.array([2.0, 3.0])).sum()
    args = (np.array([5.0, 10.0]), np.array([4.0, 4.0]), np.array([1.0, 1.0]))
    want = _pt([x, lo, hi], pytensor.grad(loss, [x, lo, hi]), *args)
    np.testing.assert_array_equal(want[1], [0.0, 0.0])
    np.testing.assert_array_equal(want[2], [2.0, 3.0])
    got = jax.grad(_jf([x, lo, hi], loss, rewrite), argnums=(0, 1, 2))(*args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)


@REWRITE
def test_clip_nan_bound_is_ignored_like_pytensor(rewrite):
    """NaN lo: PyTensor gives `x > hi ? hi : x`; NaN hi: `x < lo ? lo : x` (FAST_COMPILE and its JAX backend
    agree); jaxform must give the same, not NaN."""
    x, lo, hi = T("x", 4), T("lo", 4), T("hi", 4)
    out = pt.clip(x, lo, hi)
    args = (np.array([1.0, 5.0, -3.0, 0.5]), np.array([np.nan, np.nan, 0.0, 0.0]),
            np.array([2.0, 2.0, np.nan, np.nan]))
    want = _pt([x, lo, hi], out, *args)
    np.testing.assert_array_equal(want, [1.0, 2.0, 0.0, 0.5])
    np.testing.assert_array_equal(np.asarray(pytensor.function([x, lo, hi], out, mode="JAX")(*args)), want)
    _same(_jf([x, lo, hi], out, rewrite)(*args), want)


def test_clip_signed_zero_at_lo_keeps_x():
    """At x == lo with zeros of two signs PyTensor keeps x (-0.0 < 0.0 is false): clip(-0.0, 0.0, 1) is -0.0
    and clip(0.0, -0.0, 1) is 0.0; so does jaxform (as max/min it gave XLA max's sign)."""
    x, lo, hi = T("x", 2), T("lo", 2), T("hi", 2)
    out = pt.clip(x, lo, hi)
    args = (np.array([-0.0, 0.0]), np.array([0.0, -0.0]), np.array([1.0, 1.0]))
    want = _pt([x, lo, hi], out, *args)
    got = np.asarray(_jf([x, lo, hi], out, rewrite=False)(*args))
    assert list(np.signbit(want)) == [True, False] and list(np.signbit(got)) == [True, False]


def test_clip_signed_zero_at_hi_keeps_x():
    """clip(0.0, -1, -0.0): PyTensor keeps x (+0.0, since 0.0 > -0.0 is false); so does jaxform."""
    x, lo, hi = T("x", 1), T("lo", 1), T("hi", 1)
    out = pt.clip(x, lo, hi)
    args = (np.array([0.0]), np.array([-1.0]), np.array([-0.0]))
    want = _pt([x, lo, hi], out, *args)
    assert not np.signbit(want[0])
    _same(_jf([x, lo, hi], out, rewrite=False)(*args), want)


@REWRITE
def test_clip_inside_a_composite_matches_pytensor(rewrite):
    """Clip inside a hand-built scalar Composite (what PyTensor's fusion makes): exp(clip(2a, b, c)) with
    lo <= hi agrees with PyTensor, and its jax.grad with pytensor.grad of the unfused expression (no ties)."""
    from pytensor.scalar import basic as ps
    from pytensor.tensor.elemwise import Elemwise
    a, b, c = ps.float64("a"), ps.float64("b"), ps.float64("c")
    comp = ps.Composite([a, b, c], [ps.exp(ps.clip(a * 2.0, b, c))])
    y, lo, hi = T("y", 5), T("lo"), T("hi")
    out = Elemwise(comp)(y, lo, hi)
    assert "Composite" in _op_names([y, lo, hi], out, rewrite=False)
    args = (np.array([-3.0, -0.2, 0.1, 0.7, 5.0]), np.asarray(-1.0), np.asarray(1.0))
    stats = {}
    f = _jf([y, lo, hi], out, rewrite, stats=stats)
    assert stats["fallback"] == 0, stats
    np.testing.assert_allclose(np.asarray(f(*args)), _pt([y, lo, hi], out, *args), rtol=1e-15)
    loss = (Elemwise(comp)(y, lo, hi) * np.arange(1.0, 6.0)).sum()
    plain = (pt.exp(pt.clip(y * 2.0, lo, hi)) * np.arange(1.0, 6.0)).sum()   # Composite has no pullback
    want = _pt([y, lo, hi], pytensor.grad(plain, [y, lo, hi]), *args)
    got = jax.grad(_jf([y, lo, hi], loss, rewrite), argnums=(0, 1, 2))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-14)


# ---------------------------------------------------------------------------------------------------------
# Clip: gradients, transformations
# ---------------------------------------------------------------------------------------------------------

@REWRITE
def test_clip_broadcast_bounds_gradient_all_transformations(rewrite):
    """x (3, 5), lo a scalar tensor, hi a (5,) tensor, lo < hi, no ties: jax.grad, jit(grad),
    jit(grad(jaxform.optimize)), jvp and vmap all agree with pytensor.grad (bounds' gradients summed over
    the broadcast axes)."""
    rng = np.random.default_rng(3)
    x, lo, hi = T("x", 3, 5), T("lo"), T("hi", 5)
    w = rng.normal(size=(3, 5))
    loss = (pt.clip(x, lo, hi) ** 2 * w).sum()
    xv = rng.normal(size=(3, 5)) * 2
    lov, hiv = np.asarray(-0.75), np.linspace(0.3, 1.9, 5)
    xv[np.isclose(xv, lov) | np.isclose(xv, hiv)] += 0.1
    want = _pt([x, lo, hi], pytensor.grad(loss, [x, lo, hi]), xv, lov, hiv)
    f = _jf([x, lo, hi], loss, rewrite)
    g = jax.grad(f, argnums=(0, 1, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # no pass of optimize may be skipped
        opt = jax.jit(jax.grad(jaxform.optimize(f, strict=True), argnums=(0, 1, 2)))
        for fn in (g, jax.jit(g), opt):
            for o, w_ in zip(fn(xv, lov, hiv), want):
                assert np.shape(o) == np.shape(w_)
                np.testing.assert_allclose(np.asarray(o), w_, rtol=1e-13, atol=1e-13)
    t = [rng.normal(size=(3, 5)), np.asarray(0.3), rng.normal(size=5)]
    _, tan = jax.jvp(f, (xv, lov, hiv), tuple(t))
    np.testing.assert_allclose(tan, sum((a * b).sum() for a, b in zip(want, t)), rtol=1e-12)
    batch = np.stack([xv, -xv])
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None, None))(batch, lov, hiv),
                               [_pt([x, lo, hi], loss, b, lov, hiv) for b in batch], rtol=1e-13)


def test_clip_tie_gradient_goes_to_x_forward_and_reverse():
    """At x == lo and x == hi jax.grad gives all of the gradient to x and none to the bound, as PyTensor's
    pullback does ((lo <= x <= hi) * g), and jax.jvp agrees (as max/min it split the tie 0.5/0.5)."""
    x, lo, hi = T("x", 2), T("lo", 2), T("hi", 2)
    loss = pt.clip(x, lo, hi).sum()
    args = (np.array([0.0, 1.0]), np.array([0.0, -1.0]), np.array([2.0, 1.0]))
    f = _jf([x, lo, hi], loss)
    got = [np.asarray(g) for g in jax.grad(f, argnums=(0, 1, 2))(*args)]
    want = _pt([x, lo, hi], pytensor.grad(loss, [x, lo, hi]), *args)
    np.testing.assert_array_equal(want[0], [1.0, 1.0])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    _, tx = jax.jvp(f, args, (np.ones(2), np.zeros(2), np.zeros(2)))
    assert float(tx) == 2.0


# ---------------------------------------------------------------------------------------------------------
# Split
# ---------------------------------------------------------------------------------------------------------

def _x3():
    return T("x", 4, 5, 6)


SPLITS = {
    # name: make() -> (inputs, outputs)
    "zero_size_parts_axis1": lambda: ((x := _x3(),), list(pt.split(x, [0, 5, 0], n_splits=3, axis=1))),
    "all_in_last_axis2": lambda: ((x := _x3(),), list(pt.split(x, [0, 0, 6], n_splits=3, axis=2))),
    "negative_axis": lambda: ((x := _x3(),), list(pt.split(x, [2, 4], n_splits=2, axis=-1))),
    "axis_minus_3": lambda: ((x := _x3(),), list(pt.split(x, [1, 3], n_splits=2, axis=-3))),
    "one_part_raw": lambda: ((x := _x3(),), [pt.split(x, [5], n_splits=1, axis=1)]),
    "one_part_and_input": lambda: ((x := _x3(),), [pt.split(x, [5], n_splits=1, axis=1) * 2.0, x]),
    "symbolic_sizes": lambda: ((x := _x3(),), list(pt.split(x, pt.stack([x.shape[1] - 2, 2]), n_splits=2, axis=1))),
    "symbolic_int32_sizes": lambda: ((x := _x3(),), list(pt.split(
        x, pt.cast(pt.stack([x.shape[2] // 2, x.shape[2] - x.shape[2] // 2]), "int32"), n_splits=2, axis=2))),
    "int8": lambda: ((x := T("x", 7, dtype="int8"),), list(pt.split(x, [3, 4], n_splits=2, axis=0))),
    "bool": lambda: ((x := T("x", 7, dtype="bool"),), list(pt.split(x, [3, 4], n_splits=2, axis=0))),
    "empty_axis": lambda: ((x := T("x", 0, 3),), list(pt.split(x, [0, 0], n_splits=2, axis=0))),
    "reversed_concat": lambda: ((x := _x3(),), [pt.concatenate(pt.split(x, [1, 1, 1, 1], n_splits=4, axis=0)[::-1])]),
    "float32": lambda: ((x := T("x", 3, 4, dtype="float32"),), list(pt.split(x, [1, 3], n_splits=2, axis=1))),
}


def _split_args(inputs, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for v in inputs:
        shape, dt = v.type.shape, v.type.dtype
        if dt == "bool":
            out.append(rng.random(shape) > 0.5)
        elif dt.startswith("int"):
            out.append(rng.integers(-100, 100, size=shape).astype(dt))
        else:
            out.append(rng.normal(size=shape).astype(dt))
    return out


@REWRITE
@pytest.mark.parametrize("name", sorted(SPLITS))
def test_split_values_dtypes_shapes(name, rewrite):
    """Split variants (zero-size parts, one part, negative axis, axis 1/2 of a 3-D tensor, sizes computed from
    shapes, int8/bool/float32 inputs, an empty axis): jaxform's outputs equal PyTensor's bit for bit, eager and
    jitted, without fallback; the graph holds one `split` primitive (none for one part) and no slices."""
    inputs, outputs = SPLITS[name]()
    args = _split_args(inputs)
    want = _as_list(_pt(list(inputs), outputs, *args))
    stats = {}
    g = jpt.to_graph(list(inputs), outputs, rewrite=rewrite, stats=stats)
    assert stats["fallback"] == 0, stats
    f = to_function(g)
    for fn in (f, jax.jit(f)):
        got = _as_list(fn(*args))
        assert len(got) == len(want)
        for o, w in zip(got, want):
            _same(o, w)
    prims = [n.name for n, _ in g.walk()]
    if "Split" in _op_names(list(inputs), outputs, rewrite) and not name.startswith("one_part"):
        assert prims.count("split") == 1 and "slice" not in prims, prims
    if name.startswith("one_part"):
        assert "split" not in prims


@REWRITE
def test_split_gradient_forward_vmap_optimize(rewrite):
    """A loss over the parts of a split with zero-size parts on axis -2 of a 3-D tensor: jax.grad, jit(grad),
    jit(grad(jaxform.optimize(strict=True))), jvp and vmap agree with pytensor.grad; the converted
    pytensor.grad graph (which holds Split and Join) agrees too, also under optimize and vmap."""
    rng = np.random.default_rng(4)
    x = _x3()
    ws = [rng.normal(size=s) for s in [(4, 0, 6), (4, 2, 6), (4, 3, 6), (4, 0, 6)]]
    parts = pt.split(x, [0, 2, 3, 0], n_splits=4, axis=-2)
    loss = sum((pt.sin(p) * w).sum() for p, w in zip(parts, ws)) + (parts[2] ** 2).sum()
    gx = pytensor.grad(loss, x)
    assert "Split" in _op_names([x], loss, rewrite) and "Split" in _op_names([x], gx, rewrite)
    a = rng.normal(size=(4, 5, 6))
    want = _pt([x], gx, a)
    f = _jf([x], loss, rewrite)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for fn in (jax.grad(f), jax.jit(jax.grad(f)), jax.jit(jax.grad(jaxform.optimize(f, strict=True)))):
            np.testing.assert_allclose(np.asarray(fn(a)), want, rtol=1e-13, atol=1e-13)
        fg = _jf([x], gx, rewrite)
        np.testing.assert_allclose(np.asarray(fg(a)), want, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(np.asarray(jax.jit(jaxform.optimize(fg, strict=True))(a)), want,
                                   rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(np.asarray(jax.vmap(fg)(np.stack([a, -a]))[1]), _pt([x], gx, -a), rtol=1e-13)
    t = rng.normal(size=a.shape)
    _, tan = jax.jvp(f, (a,), (t,))
    np.testing.assert_allclose(tan, (want * t).sum(), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(f)(np.stack([a, 2 * a])), [_pt([x], loss, a), _pt([x], loss, 2 * a)],
                               rtol=1e-13)


@REWRITE
def test_concatenate_gradient_with_empty_part(rewrite):
    """pytensor.grad of concatenate([exp(a), b**2], axis=1) with a of shape (3, 0): the gradient splits into
    a (3, 0) and a (3, 4) part; values, shapes and dtypes equal PyTensor's, also through optimize."""
    a, b = T("a", 3, 0), T("b", 3, 4)
    cost = (pt.concatenate([pt.exp(a), b ** 2], axis=1) * np.arange(12.0).reshape(3, 4)).sum()
    gs = pytensor.grad(cost, [a, b])
    args = (np.zeros((3, 0)), np.random.default_rng(5).normal(size=(3, 4)))
    want = _pt([a, b], gs, *args)
    f = _jf([a, b], gs, rewrite)
    for fn in (f, jax.jit(jaxform.optimize(f, strict=True))):
        for o, w in zip(fn(*args), want):
            _same(o, w)


def test_split_runtime_sizes_is_a_clear_error():
    """Split sizes given as a runtime input cannot be static: a ConversionError naming the Split and why."""
    x, s = pt.matrix("x"), pt.lvector("s")
    with pytest.raises(jpt.ConversionError, match="split sizes.*Split.*runtime values"):
        jpt.to_graph([x, s], list(pt.split(x, s, n_splits=2, axis=0)), shapes={"x": (5, 3), "s": (2,)},
                     rewrite=False)


@REWRITE
def test_split_sizes_from_given_shapes(rewrite):
    """x declared without a static shape, split sizes computed from x.shape, the shape given through `shapes=`:
    the sizes become constants at conversion and the parts equal PyTensor's."""
    x = pt.matrix("x")
    outs = list(pt.split(x, pt.stack([x.shape[1] - 2, 2]), n_splits=2, axis=1))
    a = np.arange(15.0).reshape(3, 5)
    got = to_function(jpt.to_graph([x], outs, shapes={"x": (3, 5)}, rewrite=rewrite))(a)
    for o, w in zip(got, _pt([x], outs, a)):
        _same(o, w)


# ---------------------------------------------------------------------------------------------------------
# PyMC models
# ---------------------------------------------------------------------------------------------------------

def _pymc():
    return pytest.importorskip("pymc")


def _check_model(model, points, rtol=1e-10, atol=1e-10):
    from jaxform.frontends import pymc as jpm
    c_logp, c_dlogp = model.compile_logp(), model.compile_dlogp()
    names = [v.name for v in model.value_vars]
    for rewrite in (True, False):
        # rewrite=False on PyMC 5.28: some constants in float32 as PyMC builds them (test_pymc.py: 5e-8)
        tol = (rtol, atol) if rewrite else (max(rtol, 5e-8), max(atol, 1e-9))
        stats = {}
        jpm.model_graph(model, rewrite=rewrite, stats=stats)
        assert stats["fallback"] == 0, stats["fallback_ops"]
        vg = jpm.value_and_grad_fn(model, rewrite=rewrite)
        for p in points:
            got, grad = vg(p)
            np.testing.assert_allclose(np.asarray(got), c_logp(p), rtol=tol[0], atol=tol[1])
            flat = np.concatenate([np.ravel(grad[n]) for n in names])
            np.testing.assert_allclose(flat, c_dlogp(p), rtol=tol[0], atol=tol[1])
    # jax.jit(jax.grad(jaxform.optimize(logp))) at the last point
    f = jpm.logp_fn(model, jit=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        g = jax.jit(jax.grad(jaxform.optimize(lambda d: f(d), strict=True)))(points[-1])
    np.testing.assert_allclose(np.concatenate([np.ravel(g[n]) for n in names]), c_dlogp(points[-1]),
                               rtol=rtol, atol=atol)


def _jittered(model, k=2, seed=0):
    rng = np.random.default_rng(seed)
    ip = model.initial_point()
    return [ip] + [{n: np.asarray(v + 0.3 * rng.normal(size=np.shape(v)), dtype=v.dtype) for n, v in ip.items()}
                   for _ in range(k)]


@pytest.mark.parametrize("shape", [(3, 12), (2,)], ids=["batched_2d", "steps_1"])
def test_pymc_gaussian_random_walk_split(shape):
    """pm.GaussianRandomWalk batched (3, 12) (split on the last axis of a 2-D walk) and with a single step:
    logp and gradient equal PyMC's C backend (rewrite True and False) and through jaxform.optimize."""
    pm = _pymc()
    rng = np.random.default_rng(6)
    with pm.Model() as model:
        s = pm.HalfNormal("s", 1.0)
        w = pm.GaussianRandomWalk("w", sigma=s, init_dist=pm.Normal.dist(0, 1), shape=shape)
        pm.Normal("y", w, 0.5, observed=rng.normal(size=shape))
    assert "Split" in _op_names(model.value_vars, [model.logp()])
    _check_model(model, _jittered(model))


def test_pymc_gp_with_duplicate_inputs():
    """pm.gp.Marginal with an ExpQuad + Matern52 kernel on inputs with duplicated points (clipped squared
    distances exactly 0 off the diagonal too): logp and (jitted) gradient equal PyMC's C backend at the
    initial point and two jittered points, rewrite True and False, and through jaxform.optimize. With Clip as
    max/min, jit(grad) gave dlogp/d ell_log__ -0.0935 at ell_log__ 0.0377 on PyMC 6.4 / JAX 0.12 where PyMC's
    C backend, its JAX backend and a finite difference give 0.1917."""
    pm = _pymc()
    rng = np.random.default_rng(7)
    X = np.concatenate([np.linspace(0, 1, 5)] * 2)[:, None]
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.normal(size=10)
    with pm.Model() as model:
        ell, eta, sig = pm.Gamma("ell", 2, 2), pm.HalfNormal("eta", 1), pm.HalfNormal("sig", 1)
        cov = pm.gp.cov.ExpQuad(1, ls=ell) + pm.gp.cov.Matern52(1, ls=2 * ell)
        gp = pm.gp.Marginal(cov_func=eta ** 2 * cov)
        gp.marginal_likelihood("y", X=X, y=y, sigma=sig)
    assert "Clip" in _op_names(model.value_vars, [model.logp()])
    _check_model(model, _jittered(model), rtol=1e-9, atol=1e-9)


def test_pymc_clip_likelihood():
    """pm.math.clip(x, lo, hi) with free lo and hi as a Normal's mean: logp and gradient equal PyMC's C
    backend at the initial point and jittered points (no ties there)."""
    pm = _pymc()
    with pm.Model() as model:
        x = pm.Normal("x", 0, 1, shape=4)
        lo, hi = pm.Normal("lo", -1, 0.1), pm.Normal("hi", 1, 0.1)
        pm.Normal("y", pm.math.clip(x, lo, hi), 1.0, observed=np.array([0.3, -2.0, 2.0, 0.1]))
    _check_model(model, _jittered(model))


def test_pymc_clip_at_initial_point_tie_gradient_is_pymcs():
    """x ~ Normal has initial value 0, so clip(x, 0, 5) sits on the tie at PyMC's initial point: PyMC's C
    dlogp gives the likelihood's full slope to x, and so does jaxform (as max/min it gave half)."""
    pm = _pymc()
    from jaxform.frontends import pymc as jpm
    with pm.Model() as model:
        x = pm.Normal("x", 0, 1, shape=3)
        pm.Normal("y", pm.math.clip(x, 0.0, 5.0), 1.0, observed=np.array([1.0, 2.0, 3.0]))
    ip = model.initial_point()
    _, g = jpm.value_and_grad_fn(model)(ip)
    want = model.compile_dlogp()(ip)
    # d/dx of -x^2/2 is 0 at 0; the likelihood's slope (y - 0) = [1, 2, 3]
    np.testing.assert_allclose(want, [1.0, 2.0, 3.0])
    np.testing.assert_allclose(np.asarray(g["x"]), want, rtol=1e-15)
    _check_model(model, _jittered(model)[1:])
