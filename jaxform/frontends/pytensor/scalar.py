"""Scalar ops, applied elementwise inside Elemwise and Composite: each a few Builder calls on
scalars broadcast by the caller, registered in `SCALARS` by class name.
"""
from __future__ import annotations

import numpy as np

from ...ir.build import Builder, Var
from .registry import SCALARS, _NoConverter, register_scalar
from .walk import Converter, _jax_funcify


# ---- scalar ops (inside Elemwise and Composite) -----------------------------------------

def _scalar_op(cv: Converter, sop, vals: list[Var], out_dtypes: list[str], node) -> list[Var]:
    """Apply scalar op `sop` elementwise to `vals`: a Composite's inner graph is walked node by node."""
    b = cv.b
    if type(sop).__name__ == "Composite":
        env = dict(zip(sop.fgraph.inputs, vals))
        for n in sop.fgraph.toposort():
            ins = [env[v] if v in env else b.const(np.asarray(v.data, v.type.dtype)) for v in n.inputs]
            for o, r in zip(n.outputs, _scalar_op(cv, n.op, ins, [o.type.dtype for o in n.outputs], n)):
                env[o] = r
        return [env[o] if o in env else b.const(np.asarray(o.data, o.type.dtype)) for o in sop.fgraph.outputs]
    fn = SCALARS.get(type(sop).__name__)
    if fn is not None:
        try:
            out = fn(b, out_dtypes, *vals)
            return out if isinstance(out, list) else [out]
        except _NoConverter:
            pass
    # a scalar op we do not know: PyTensor's JAX implementation of it, applied elementwise
    cv.fallback += 1
    cv.fallback_ops.append(type(sop).__name__)
    jf = _jax_funcify()(sop, node=node)
    shape = tuple(np.broadcast_shapes(*[v.shape for v in vals]))
    out = b.trace(lambda *a: jf(*a), *[b.broadcast_to(v, shape) for v in vals])
    out = list(out) if isinstance(out, (list, tuple)) else [out]
    return [b.convert(o, d) for o, d in zip(out, out_dtypes)]


def _full(b: Builder, vals):
    shape = tuple(np.broadcast_shapes(*[v.shape for v in vals]))
    return [b.broadcast_to(v, shape) for v in vals]


_BOOL_ARITH = {"add": "or", "mul": "and", "max": "or", "min": "and"}


def _arith(prim: str):
    def fn(b, dts, *vals):
        p = prim
        if dts[0] == "bool":  # PyTensor's boolean arithmetic: + is or, * is and (numpy's rules)
            p = _BOOL_ARITH.get(prim, prim if prim in ("and", "or", "xor") else None)
            if p is None:
                raise _NoConverter
        vals = [b.convert(v, dts[0]) for v in vals]
        out = vals[0]
        for v in vals[1:]:  # PyTensor's Add/Mul are n-ary
            out = b.bind(p, out, v)
        return out
    return fn


def _unary_float(prim: str):
    return lambda b, dts, x: b.bind(prim, b.convert(x, dts[0]))


def _compare(prim: str):
    def fn(b, dts, x, y):
        dt = np.result_type(x.dtype, y.dtype)
        return b.bind(prim, b.convert(x, dt), b.convert(y, dt))
    return fn


for _n, _p in [("Add", "add"), ("Sub", "sub"), ("Mul", "mul"), ("TrueDiv", "div"), ("Maximum", "max"),
               ("Minimum", "min"), ("ScalarMaximum", "max"), ("ScalarMinimum", "min"), ("ArcTan2", "atan2"),
               ("AND", "and"), ("OR", "or"), ("XOR", "xor")]:
    register_scalar(_n)(_arith(_p))
for _n, _p in [("Exp", "exp"), ("Log", "log"), ("Log1p", "log1p"), ("Expm1", "expm1"), ("Exp2", "exp2"),
               ("Sqrt", "sqrt"), ("Sin", "sin"), ("Cos", "cos"), ("Tan", "tan"), ("Tanh", "tanh"),
               ("Sinh", "sinh"), ("Cosh", "cosh"), ("ArcSin", "asin"), ("ArcCos", "acos"), ("ArcTan", "atan"),
               ("ArcSinh", "asinh"), ("ArcCosh", "acosh"), ("ArcTanh", "atanh"), ("Sigmoid", "logistic"),
               ("Erf", "erf"), ("Erfc", "erfc"), ("Erfinv", "erf_inv"), ("GammaLn", "lgamma"), ("Psi", "digamma"),
               ("Neg", "neg"), ("Abs", "abs"), ("Sign", "sign")]:
    register_scalar(_n)(_unary_float(_p))
for _n, _p in [("EQ", "eq"), ("NEQ", "ne"), ("LT", "lt"), ("LE", "le"), ("GT", "gt"), ("GE", "ge")]:
    register_scalar(_n)(_compare(_p))


@register_scalar("GammaInc")
def _gammainc(b, dts, k, x):
    """Regularized lower incomplete gamma P(k, x): lax.igamma, as jax.scipy.special.gammainc."""
    return b.bind("igamma", *_full(b, [b.convert(k, dts[0]), b.convert(x, dts[0])]))


@register_scalar("GammaIncC")
def _gammaincc(b, dts, k, x):
    """Regularized upper incomplete gamma Q(k, x) (hurdle and truncated Poisson): lax.igammac."""
    return b.bind("igammac", *_full(b, [b.convert(k, dts[0]), b.convert(x, dts[0])]))


@register_scalar("Floor")
def _floor(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.convert(x, dts[0])
    return b.convert(b.floor(x), dts[0])


@register_scalar("Ceil")
def _ceil(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.convert(x, dts[0])
    return b.convert(b.ceil(x), dts[0])


@register_scalar("Identity", "Cast")
def _cast(b, dts, x):
    return b.convert(x, dts[0])


@register_scalar("Sqr")
def _sqr(b, dts, x):
    return b.integer_pow(b.convert(x, dts[0]), 2)  # as jnp.square / x ** 2: one equation, a cheaper gradient


@register_scalar("Reciprocal")
def _reciprocal(b, dts, x):
    return b.div(1, b.convert(x, dts[0]))


@register_scalar("Pow")
def _pow(b, dts, x, y):
    if not np.issubdtype(np.dtype(dts[0]), np.inexact):
        raise _NoConverter  # integer powers: jnp.power semantics via the fallback
    k = y.value.literal if y.value.is_literal else None
    if k is not None and float(k) == int(k) and abs(int(k)) <= 4 and y.ndim == 0:
        return b.integer_pow(b.convert(x, dts[0]), int(k))  # x ** 2 as jnp writes it: integer_pow
    return b.pow(*_full(b, [b.convert(x, dts[0]), b.convert(y, dts[0])]))


@register_scalar("Switch")
def _switch(b, dts, c, t, f):
    c = c if c.dtype == np.bool_ else b.ne(c, 0)
    c, t, f = _full(b, [c, b.convert(t, dts[0]), b.convert(f, dts[0])])
    return b.select_n(c, f, t)


@register_scalar("Second")
def _second(b, dts, x, y):
    return b.broadcast_to(b.convert(y, dts[0]), tuple(np.broadcast_shapes(x.shape, y.shape)))


@register_scalar("Invert")
def _invert(b, dts, x):
    return b.not_(x)


@register_scalar("Clip")
def _clip(b, dts, x, lo, hi):
    x, lo, hi = _full(b, [b.convert(v, dts[0]) for v in (x, lo, hi)])
    # exactly PyTensor's `x < lo ? lo : x > hi ? hi : x` (its C code and JAX backend), not numpy.clip: where
    # lo > hi, lo below lo and hi from lo up; a NaN bound clips nothing; x's own zero sign at a bound; the
    # gradient reaches x in full at x == lo or hi. As max/min these all differed (found by an attack).
    # Under jit, XLA's reverse mode gives a GP's clipped squared distances a derivative of O(1) at exact
    # zeros (duplicated inputs, the diagonal) where the true one is 0, with a select (PyTensor's JAX backend
    # too) and with max/min alike: docs/builder.md
    return b.select_n(b.lt(x, lo), b.select_n(b.gt(x, hi), x, hi), lo)


@register_scalar("IsNan")
def _isnan(b, dts, x):
    return b.ne(x, x)


@register_scalar("Softplus")
def _softplus(b, dts, x):
    """PyTensor's piecewise formula (pytensor/scalar/math.py Softplus.static_impl), branch for branch."""
    x = b.convert(x, dts[0])
    c = lambda v: b.const(np.array(v, dts[0]))
    mid = b.log1p(b.exp(x))
    out = b.select_n(b.lt(x, c(33.3)), x, x + b.exp(b.neg(x)))
    out = b.select_n(b.lt(x, c(18.0)), out, mid)
    return b.select_n(b.lt(x, c(-37.0)), out, b.exp(x))


@register_scalar("IsInf")
def _isinf(b, dts, x):
    if not np.issubdtype(np.dtype(x.dtype), np.floating):
        return b.broadcast_to(b.const(np.array(False)), tuple(x.shape))
    return b.eq(b.abs(x), b.const(np.array(np.inf, x.dtype)))


@register_scalar("Erfcx")
def _erfcx(b, dts, x):
    """exp(x²)·erfc(x), with its asymptotic series for x ≥ 12 where erfc underflows (error < 1e-15)."""
    x = b.convert(x, dts[0])
    c = lambda v: b.const(np.array(v, dts[0]))
    big = b.lt(x, c(12.0))
    xs = b.select_n(big, c(0.0), x)              # keep the unused branch finite (its gradient too)
    direct = b.exp(b.integer_pow(xs, 2)) * b.erfc(xs)
    xl = b.select_n(big, x, c(12.0))
    inv2 = b.div(c(1.0), b.integer_pow(xl, 2) * c(2.0))
    series, term = c(1.0), c(1.0)
    for k in range(1, 12):
        term = term * b.neg(inv2) * c(2 * k - 1)
        series = series + term
    asym = series / (xl * c(np.sqrt(np.pi)))
    return b.select_n(big, asym, direct)


@register_scalar("Log1mexp")
def _log1mexp(b, dts, x):
    """log(1 - exp(x)), PyTensor's switch at log(0.5) (pytensor/scalar/math.py Log1mexp)."""
    x = b.convert(x, dts[0])
    lo = b.lt(x, b.const(np.array(np.log(0.5), dts[0])))
    return b.select_n(lo, b.log(b.neg(b.expm1(x))), b.log1p(b.neg(b.exp(x))))
