"""Attack, round 20: commits 815f0e5 and cb7f017 (inline keeps the call's name stack; a budget's baseline is the
program as traced; order B compiles its candidates fastest first up to the first fit; gradient programs memoized
per plan; `plan.memory.budget_is_own`).

Measured with `jax.jit(g).lower(*args).compile().memory_analysis().temp_size_in_bytes`, JAXFORM_MEASURE=memory,
8 tanh layers 128x128 on 256x128 f32 unless said; numbers identical on JAX 0.10.2 and 0.12.0.1 where one is given.

Findings (bugs; A fixed in session 19, B a strict xfail):
  A. (high) Silent unmet budget: a FORWARD whose output is made by `jax.linear_transpose` (a tied-weights decoder,
     `tied`: the reconstruction is the transpose of the first layer's matmul, here a jitted call) is taken for a
     gradient program (`recompute.is_gradient` -> True: its output is a transposed equation's). Differentiated
     behind a jit, `jax.grad(loss(jax.jit(optimize(tied, memory=B))))` with B = 50% of plain (655360 B of
     1310720 B) runs 1310720 B (plain's, 2x the budget) and warns nothing, on both JAX versions; the same without
     the jit warns "cannot fit" (JAX 0.12 reaches 917504 B). The same with the transpose of an un-jitted matmul
     (`tied_nojit`), so it is the outputs-only `is_gradient` reading, not the inline name-stack change.
     Fixed: `_jax.transposed` reads reverse mode's "transpose(jvp(" (linear_transpose names its equations
     "transpose(...)" alone), so the decoder is a forward, planned for its gradient too under the jit.
  B. (medium) The force field of round 19's F behind a jit: `forces = jax.grad(energy, argnums=1)`, loss
     mse(jax.jit(optimize(forces, memory=B))(p, x), t), B = 50% of plain (2097152 of 4194304 B): the gradient that
     runs is 4194304 B (plain's), no warning (both JAX versions). `budget_is_own` budgets it on its own memory
     because under the jit trace `cost.gradient_known` is False; without the jit it is warned (0.12: 2621440 B).
Held (plain tests; values and gradients equal plain JAX's, f32 rtol 1e-5):
  - jitted layers (`jitted_mlp`), has_aux, argnums=1, value_and_grad, both orders, budgets 30/50/90% and "min"
    (JAX 0.12): never bigger than plain (1179648 B); 30%/50% warned (A reaches 786432 B, B 655360 B), 90% met
    silently; "min" A 786432 B, B 655360 B.
  - a program jaxform's cleanups change (duplicate tanh(h @ w), CSE): 50% (1114112 of 2228224 B) met: A 917504 B,
    B 1048576 B (0.12); never bigger on 0.10.2 or warned.
  - jits inside jax.checkpoint, nested jits, a jit inside a scan, bf16 layers: never bigger, met or warned, values.
  - `is_gradient` of jax.grad / value_and_grad of jitted layers is True, of the forward False.
  - a jaxform-optimized tied decoder differentiated without the jit is warned, never bigger, values equal.
Runtime (2 shared cores): about 55 s on JAX 0.12.0.1, about 90 s on JAX 0.10.2.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.passes.recompute import is_gradient

NEW_XLA = _jax.JAX_VERSION >= (0, 11)


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXFORM_TUNE_CACHE", str(tmp_path))


def temp(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def said(fn):
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in ws if "cannot" in str(w.message)]


def close(a, b, rtol=1e-5, atol=1e-6):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert jnp.asarray(x).dtype == jnp.asarray(y).dtype
        np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=rtol, atol=atol)


_layer = jax.jit(lambda h, w: jnp.tanh(h @ w))
_mm = jax.jit(lambda v, w: v @ w)


def jitted_mlp(p, x):
    h = x
    for w in p:
        h = _layer(h, w)
    return jnp.mean(h ** 2)


def jitted_aux(p, x):
    h = x
    for w in p:
        h = _layer(h, w)
    return jnp.mean(h ** 2), (jnp.mean(h), jnp.max(h))


def cse(p, x):
    h = x
    for w in p:
        h = jnp.tanh(h @ w) + 0.0 * jnp.tanh(h @ w)
    return jnp.mean(h ** 2)


def ckpt(p, x):
    h = x
    for w in p:
        h = jax.checkpoint(lambda h, w: _layer(_layer(h, w), w))(h, w)
    return jnp.mean(h ** 2)


def nested(p, x):
    h = x
    for w in p:
        h = jax.jit(lambda h, w: _layer(h, w) * 1.0 + 0.1)(h, w)
    return jnp.mean(h ** 2)


def scan_jit(p, x):
    h, _ = lax.scan(lambda h, w: (_layer(h, w), None), x, jnp.stack(p))
    return jnp.mean(h ** 2)


def bf16_mlp(p, x):
    h = x
    for w in p:
        h = _layer(h, w)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def tied(p, x):
    """A tied-weights autoencoder: the decoder is the transpose of the first layer's (jitted) matmul."""
    h = x
    for w in p:
        h = jnp.tanh(h @ w)
    w0 = p[0]
    (y,) = jax.linear_transpose(lambda v: _mm(v, w0), h)(h)
    return y


def tied_nojit(p, x):
    h = x
    for w in p:
        h = jnp.tanh(h @ w)
    w0 = p[0]
    (y,) = jax.linear_transpose(lambda v: v @ w0, h)(h)
    return y


def energy(p, x):
    h = x
    for w in p:
        h = jnp.tanh(h @ w)
    return jnp.sum(h)


forces = jax.grad(energy, argnums=1)


def _args(dtype=np.float32):
    r = np.random.RandomState(0)
    return ([jnp.asarray(r.randn(128, 128) * 0.1, dtype) for _ in range(8)],
            jnp.asarray(r.randn(256, 128), dtype))


def _recon(y, x):
    return jnp.sum((y - x) ** 2)


# ============== findings A and B: a budget on what runs behind a jit, silently unmet ==============

def _behind_jit(f, lossf):
    p, x = _args()
    ref = jax.grad(lambda p, x: lossf(f(p, x), x))
    plain = temp(ref, p, x)
    memory = plain // 2
    o = jax.jit(jaxform.optimize(f, memory=memory))
    g = jax.grad(lambda p, x: lossf(o(p, x), x))
    got, w = said(lambda: temp(g, p, x))
    want = ref(p, x)      # (f32 summed in another order once planned: a tolerance on the gradient's scale)
    close(g(p, x), want, rtol=1e-4, atol=1e-6 * max(float(jnp.abs(v).max()) for v in jax.tree_util.tree_leaves(want)))
    assert got <= plain
    assert got <= memory or w, (got, memory, plain)


@pytest.mark.slow
def test_tied_decoder_behind_jit_budget_met_or_said():
    _behind_jit(tied, _recon)


def test_tied_decoder_nojit_behind_jit_budget_met_or_said():
    _behind_jit(tied_nojit, _recon)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="B: jax.grad(mse(jax.jit(optimize(forces, memory=2097152)))) runs 4194304 B "
                   "(plain's), no warning: under the jit trace budget_is_own budgets the forces' own memory")
def test_force_field_behind_jit_budget_met_or_said():
    t = _args()[1] * 0.5
    _behind_jit(forces, lambda y, x: jnp.mean((y - t) ** 2))


def test_tied_decoder_without_jit_warned():
    """Without the jit boundary the same budget is warned (0.12 reaches 917504 B), values equal."""
    p, x = _args()
    ref = jax.grad(lambda p, x: _recon(tied(p, x), x))
    plain = temp(ref, p, x)
    memory = plain // 2
    o = jaxform.optimize(tied, memory=memory)
    g = jax.grad(lambda p, x: _recon(o(p, x), x))
    got, w = said(lambda: temp(g, p, x))
    close(g(p, x), ref(p, x), rtol=1e-4, atol=1e-5)
    assert got <= plain and (got <= memory or w), (got, memory, plain, w)


# ============== held ==============

def test_jitted_layers_are_gradients_once_traced():
    p, x = _args()
    assert not is_gradient(jax.make_jaxpr(jitted_mlp)(p, x))
    assert is_gradient(jax.make_jaxpr(jax.grad(jitted_mlp))(p, x))
    assert is_gradient(jax.make_jaxpr(jax.value_and_grad(jitted_mlp))(p, x))


def _budget(f, args, frac, order, g=jax.grad):
    plain = temp(g(f), *args)
    memory = frac if frac == "min" else int(plain * frac)
    o = g(jaxform.optimize(f, memory=memory)) if order == "A" else jaxform.optimize(g(f), memory=memory)
    got, w = said(lambda: temp(o, *args))
    close(o(*args), g(f)(*args))
    assert got <= plain, (got, plain)
    if frac != "min":
        assert got <= memory or w, (got, memory, plain)
    return got, plain, w


@pytest.mark.slow
@pytest.mark.parametrize("order", "AB")
def test_jitted_layers_has_aux_half(order):
    got, plain, w = _budget(jitted_aux, _args(), 0.5, order, lambda f: jax.grad(f, has_aux=True))
    if NEW_XLA:
        assert got < plain


@pytest.mark.parametrize("order", "AB")
def test_jitted_layers_argnums1_value_and_grad_ninety(order):
    p, x = _args()
    got, plain, w = _budget(lambda x, p: jitted_mlp(p, x), (x, p), 0.9, order,
                            lambda f: jax.value_and_grad(f, argnums=1))
    if NEW_XLA:
        assert got <= int(plain * 0.9) and not w, (got, plain, w)


@pytest.mark.parametrize("order", "AB")
def test_jitted_layers_min_no_bigger(order):
    got, plain, _ = _budget(jitted_mlp, _args(), "min", order)
    if NEW_XLA:
        assert got < plain


@pytest.mark.parametrize("order", "AB")
def test_cleaned_program_half(order):
    got, plain, w = _budget(cse, _args(), 0.5, order)
    if NEW_XLA:
        assert got <= plain // 2 and not w, (got, plain, w)


@pytest.mark.slow
@pytest.mark.parametrize("f", [ckpt, nested, scan_jit], ids=lambda f: f.__name__)
def test_jits_in_checkpoint_nested_scan_half(f):
    for order in "AB":
        _budget(f, _args(), 0.5, order)


@pytest.mark.slow
def test_bf16_jitted_layers_order_b():
    p, x = _args()
    args = ([w.astype(jnp.bfloat16) for w in p], x.astype(jnp.bfloat16))
    _budget(bf16_mlp, args, 0.5, "B")
