"""Findings of an attack on passes/recompute.py (optimize(jax.grad(f), memory=...)).

What holds (kept where tests/passes/test_recompute.py does not cover it): `recomputed(closed, k)` is
bit-identical op by op on gradient programs with special values, float16/bfloat16 networks, bfloat16
matmuls accumulating in float32, int8 matmuls accumulating in int32, typed and raw PRNG keys (dropout),
weak-typed Python scalars, user custom_vjp/custom_jvp, has_aux with integer aux, Hessians, jvp-of-grad and
vmap-of-grad programs; the optimized gradient keeps values, dtypes and weak types under alternating argnums,
keeps nested callbacks' invocation sequence, and differentiates (reverse over reverse, jacfwd, jacrev).

What it found, each fixed and a test below ("findings"): `remat_program._recompute_choice` (now `plan.memory.recompute_choice`) ran first for
every program under memory="min" or a byte budget, so a forward program with skip connections (a U-Net)
got the gradient program's recompute schedule instead of segment checkpointing (96% of the gradient's memory
instead of 58%), and a budget under a forward program's own temp turned checkpointing off; a gradient
program with XLA temp 0 was rewritten for nothing; one within its budget warned and compiled its own
gradient; `recomputed` crashed on programs of 0-1 equations and on k = 0. Now only a program AD made
(`recompute.is_gradient`) takes the recompute path, and every gradient program stops there.
"""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxform
from jaxform import _jax
from jaxform.passes.recompute import recomputed

R = np.random.RandomState(0)


def temp(f, *args) -> int:
    return jax.jit(f).lower(*args).compile().memory_analysis().temp_size_in_bytes


def desc(tree):
    return [(x.dtype, x.shape, _jax.get_aval(x).weak_type) for x in jax.tree_util.tree_leaves(tree)]


def close(a, b, rtol=1e-5):
    """Same dtypes, shapes, weak types; same NaN/inf pattern; finite values close."""
    assert desc(a) == desc(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y))
        np.testing.assert_array_equal(np.isinf(x), np.isinf(y))
        fin = np.isfinite(x)
        np.testing.assert_allclose(x[fin], y[fin], rtol=rtol, atol=rtol)


def bits(x):
    a = np.asarray(x)
    return a.dtype, a.shape, a.tobytes(), _jax.get_aval(x).weak_type


# ---- small networks -----------------------------------------------------------------------------

def params_(dt=jnp.float32, n=16, L=5):
    r = np.random.RandomState(1)
    return [(jnp.asarray(r.randn(n, n) / 4, dt), jnp.asarray(r.randn(n) * 0.1, dt)) for _ in range(L)]


def mlp(params, x, act=jax.nn.gelu):
    h = x
    for W, b in params:
        h = act(h @ W + b)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def mixed(params, x):        # bfloat16 weights and activations, float32 accumulation
    h = x
    for W, b in params:
        z = lax.dot(h, W, preferred_element_type=jnp.float32) + b.astype(jnp.float32)
        h = jax.nn.gelu(z).astype(jnp.bfloat16)
    return jnp.mean(h.astype(jnp.float32) ** 2)


def int8net(params, xi, wi):  # int8 x int8 -> int32, then a differentiable float network
    h = lax.dot(xi, wi, preferred_element_type=jnp.int32).astype(jnp.float32) / 100.0
    return mlp(params, h)


def dropout(params, x, key):
    h = x
    for i, (W, b) in enumerate(params):
        h = jax.nn.gelu(h @ W + b)
        keep = jax.random.bernoulli(jax.random.fold_in(key, i), 0.8, h.shape)
        h = lax.select(keep, h / 0.8, jnp.zeros_like(h))
    return jnp.mean(h ** 2)


def weak(params, x, s):
    h = x
    for W, b in params:
        h = jnp.tanh(h @ W + b) * s + 2.0
    return jnp.mean(h ** 2) * s


@jax.custom_vjp
def my_tanh(x):
    return jnp.tanh(x)


my_tanh.defvjp(lambda x: (jnp.tanh(x), (jnp.tanh(x), jnp.cos(x))),
               lambda res, g: (g * (1 - res[0] * res[0]) + 0.0 * res[1],))


@jax.custom_jvp
def softplus(x):
    return jnp.logaddexp(x, 0.0)


softplus.defjvps(lambda t, ans, x: t * jax.nn.sigmoid(x))


def with_aux(params, x):
    h = x
    for W, b in params:
        h = jnp.tanh(h @ W + b)
    return jnp.mean(h ** 2), (jnp.argmax(h, axis=1), h)


def chain(a):
    for _ in range(12):
        a = jnp.sin(a) * 1.1 + jnp.cos(a)
    return jnp.sum(a)


X = jnp.asarray(R.randn(8, 16), jnp.float32)
SPECIAL = X.at[0, 0].set(jnp.inf).at[1, 1].set(jnp.nan).at[2, :].set(-0.0).at[3, 3].set(3e38) \
    .at[3, 4].set(3e38).at[4, :].set(1e-40)
XI = jnp.asarray(R.randint(-100, 100, (8, 16)), jnp.int8)
WI = jnp.asarray(R.randint(-100, 100, (16, 16)), jnp.int8)
P1 = [(jnp.asarray(R.randn(1, 1), jnp.float32), jnp.asarray(R.randn(1), jnp.float32)) for _ in range(6)]

PROGRAMS = {
    "special_values": lambda: (jax.grad(mlp), (params_(), SPECIAL)),
    "value_and_grad_argnums01_special": lambda: (jax.value_and_grad(mlp, argnums=(0, 1)), (params_(), SPECIAL)),
    "bfloat16": lambda: (jax.grad(mlp), (params_(jnp.bfloat16), X.astype(jnp.bfloat16))),
    "float16": lambda: (jax.grad(mlp), (params_(jnp.float16), X.astype(jnp.float16))),
    "bf16_dot_f32": lambda: (jax.grad(mixed), (params_(jnp.bfloat16), X.astype(jnp.bfloat16))),
    "int8_dot_int32": lambda: (jax.grad(int8net), (params_(), XI, WI)),
    "dropout_typed_key": lambda: (jax.grad(dropout), (params_(), X, jax.random.key(0))),
    "dropout_raw_key": lambda: (jax.grad(dropout), (params_(), X, jax.random.PRNGKey(0))),
    "weak_python_scalar": lambda: (jax.grad(weak, argnums=(0, 2)), (params_(), X, 0.5)),
    "custom_vjp": lambda: (jax.grad(functools.partial(mlp, act=my_tanh)), (params_(), X)),
    "custom_jvp": lambda: (jax.grad(functools.partial(mlp, act=softplus)), (params_(), X)),
    "has_aux_int": lambda: (jax.value_and_grad(with_aux, has_aux=True), (params_(), X)),
    "argnums1": lambda: (jax.grad(mlp, argnums=1), (params_(), X)),
    "width1": lambda: (jax.grad(functools.partial(mlp, act=softplus)), (P1, X[:3, :1])),
    "scalar_weak": lambda: (jax.grad(chain), (0.3,)),
    "hessian": lambda: (jax.hessian(chain), (jnp.ones(3),)),
    "jvp_of_grad": lambda: (lambda x, t: jax.jvp(jax.grad(chain), (x,), (t,)), (jnp.ones(3), jnp.ones(3))),
    "vmap_of_grad": lambda: (jax.vmap(jax.grad(chain)), (jnp.ones((2, 3)),)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_recomputed_is_bit_identical_op_by_op(name):
    """`recomputed(closed, k)` on many small gradient programs: eagerly bit-identical (NaN, -0.0, dtypes,
    weak types included), close under jit."""
    fn, args = PROGRAMS[name]()
    closed = jax.make_jaxpr(fn)(*args)
    flat = jax.tree_util.tree_leaves(args)
    ref = _jax.eval_jaxpr(closed, *flat)
    changed = 0
    for k in (2, 5, 8):
        c = recomputed(closed, k)
        if c is None:
            continue
        changed += 1
        _jax.check_jaxpr(c)
        out = _jax.eval_jaxpr(c, *flat)
        assert [bits(a) for a in ref] == [bits(b) for b in out], k
        if changed == 1:
            j = jax.jit(functools.partial(_jax.eval_jaxpr, c))(*flat)
            j0 = jax.jit(functools.partial(_jax.eval_jaxpr, closed))(*flat)
            close(j, j0, rtol=2e-2 if "16" in name else 1e-5)
    assert changed, "the program should give the pass something to recompute"


def test_recomputed_small_k_is_none():
    closed = jax.make_jaxpr(jax.grad(mlp))(params_(), X)
    assert recomputed(closed, 1) is None and recomputed(closed, -1) is None


# ---- end to end: optimize(jax.grad(f), memory=...) -----------------------------------------------

def wloss(params, x, s, c):
    return mlp(params, x) * s + c * 2.0


@pytest.mark.parametrize("mode,argnums", [(jax.value_and_grad, (0,)), (jax.value_and_grad, (2,)),
                                          (jax.grad, (0, 1, 2, 3))])
def test_weak_scalars_special_values_alternating_argnums(mode, argnums):
    params = params_(n=32)
    x = jnp.asarray(R.randn(16, 32), jnp.float32).at[0, :].set(-0.0).at[1, :].set(1e-40).at[2, 2].set(3e38)
    g = mode(wloss, argnums=argnums)
    opt = jaxform.optimize(g, memory="min")
    args = (params, x, 0.5, 1.0)
    close(opt(*args), g(*args))
    close(jax.jit(opt)(*args), jax.jit(g)(*args))
    if 0 in argnums:
        assert "optimization_barrier" in str(jax.make_jaxpr(opt)(*args))
        assert temp(opt, *args) < temp(g, *args)


def test_nested_callbacks_keep_their_sequence():
    """A callback inside a nested jit and one in a custom_vjp's backward: the program is left alone, and
    the callbacks run as often and in the order they do without jaxform."""
    seen = []

    @jax.jit
    def inner(h):
        jax.debug.callback(lambda v: seen.append(("inner", float(v))), jnp.sum(h))
        return h

    @jax.custom_vjp
    def tap(h):
        return h

    def tap_bwd(_, g):
        jax.debug.callback(lambda v: seen.append(("bwd", float(v))), jnp.sum(g))
        return (g,)
    tap.defvjp(lambda h: (h, None), tap_bwd)

    def noisy(params, x):
        h = x
        for i, (W, b) in enumerate(params):
            h = jax.nn.gelu(h @ W + b)
            h = inner(h) if i == 1 else tap(h) if i == 2 else h
        return jnp.mean(h ** 2)
    params, x = params_(n=32), jnp.asarray(R.randn(16, 32), jnp.float32)
    g = jax.value_and_grad(noisy)
    opt = jaxform.optimize(g, memory="min")
    runs = []
    for fn in (g, opt, jax.jit(g), jax.jit(opt)):
        seen.clear()
        jax.block_until_ready(fn(params, x))
        runs.append(list(seen))
    assert [[t for t, _ in r] for r in runs] == [["inner", "bwd"]] * 4
    assert runs[0] == runs[1] and runs[2] == runs[3]                       # eagerly, op by op: the same values
    np.testing.assert_allclose([v for _, v in runs[1]], [v for _, v in runs[3]], rtol=1e-5)


def test_optimized_gradient_under_transformations():
    """Reverse over the recomputed program (its barrier and copies transposed), jacfwd, jacrev, jit."""
    params, x = params_(n=32), jnp.asarray(R.randn(16, 32), jnp.float32)
    g = jax.grad(mlp)
    opt = jaxform.optimize(g, memory="min")
    assert "optimization_barrier" in str(jax.make_jaxpr(opt)(params, x))
    sq = lambda fn: jax.jit(jax.grad(lambda p: sum(jnp.sum(l ** 2) for l in jax.tree_util.tree_leaves(fn(p, x)))))
    close(sq(opt)(params), sq(g)(params), rtol=1e-4)
    jf = lambda fn: jax.jacfwd(lambda b: fn([*params[:-1], (params[-1][0], b)], x)[0][1])(params[-1][1])
    close(jf(opt), jf(g), rtol=1e-4)
    jr = lambda fn: jax.jacrev(lambda b: fn([*params[:-1], (params[-1][0], b)], x)[-1][1])(params[-1][1])
    close(jr(opt), jr(g), rtol=1e-4)


@pytest.mark.parametrize("batch", [0, 1])
def test_empty_and_single_batches_every_memory_setting(batch):
    params, x = params_(n=16, L=4), jnp.asarray(R.randn(batch, 16), jnp.float32)
    g = jax.value_and_grad(mlp)
    for memory in (None, "min"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            opt = jaxform.optimize(g, memory=memory)
            close(opt(params, x), g(params, x))
            close(jax.jit(opt)(params, x), jax.jit(g)(params, x))


# ---- findings -----------------------------------------------------------------------------------

def test_zero_temp_gradient_program_is_left_alone():
    x = jnp.ones(4)
    g = jax.grad(chain)
    assert temp(g, x) == 0
    opt = jaxform.optimize(g, memory="min")
    assert temp(opt, x) == 0
    assert "optimization_barrier" not in str(jax.make_jaxpr(opt)(x))   # nothing to save: left as it is


def unet_setup(D, B, L=4):
    r = np.random.RandomState(0)
    Ws = [jnp.asarray(r.randn(D, D) / np.sqrt(D), jnp.float32) for _ in range(2 * L + 2)]
    return Ws, jnp.asarray(r.randn(B, D), jnp.float32)


def unet(Ws, x, L=4):
    """A forward program (not a gradient) with skip connections: the encoder's outputs are read by the
    decoder after the bottleneck, so `recomputed` finds 'residuals' read after the 'turn'."""
    skips, h = [], x
    for i in range(L):
        h = jax.nn.gelu(h @ Ws[i])
        h = h + 0.1 * jnp.tanh(h)
        skips.append(h)
    h = jax.nn.gelu(h @ Ws[L]) @ Ws[L + 1]
    for i in range(L):
        h = jax.nn.gelu(h @ Ws[L + 2 + i]) + skips[L - 1 - i]
    return jnp.mean(h ** 2)


def test_forward_program_with_skip_connections_is_checkpointed_not_recomputed():
    Ws, x = unet_setup(128, 64)
    opt = jaxform.optimize(unet, memory="min")
    plain = temp(jax.grad(unet), Ws, x)
    got = temp(jax.grad(opt), Ws, x)           # 753664 of 786432 B; checkpointing alone gives 458752 B
    np.testing.assert_allclose(jax.grad(opt)(Ws, x)[0], jax.grad(unet)(Ws, x)[0], rtol=1e-4, atol=1e-6)
    assert got <= 0.75 * plain, (got, plain)
    assert "optimization_barrier" not in str(jax.make_jaxpr(opt)(Ws, x))


def test_forward_program_under_a_small_budget_still_checkpoints_its_gradient():
    Ws, x = unet_setup(64, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = jaxform.optimize(unet, memory=1024)
        got = temp(jax.grad(opt), Ws, x)
    assert got < temp(jax.grad(unet), Ws, x)


def test_gradient_program_within_its_budget_does_not_warn():
    from jax.scipy.special import logsumexp
    r = np.random.RandomState(0)
    sizes = (64, 128, 128, 128, 128, 10)
    params = [(jnp.asarray(r.randn(m, n) / np.sqrt(m), jnp.float32), jnp.asarray(r.randn(n) * 0.1, jnp.float32))
              for m, n in zip(sizes[:-1], sizes[1:])]
    x = jnp.asarray(r.randn(32, 64), jnp.float32)
    y = jax.nn.one_hot(r.randint(0, 10, 32), 10)

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jnp.tanh(h @ w + b)
        logits = h @ params[-1][0] + params[-1][1]
        return -jnp.mean(jnp.sum((logits - logsumexp(logits, axis=1, keepdims=True)) * y, axis=1))
    g = jax.grad(loss)
    budget = 2 * temp(g, params, x, y)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        opt = jaxform.optimize(g, memory=budget)
        jax.make_jaxpr(opt)(params, x, y)
    assert temp(opt, params, x, y) <= budget
    msgs = [str(m.message) for m in w if "remat_program" in str(m.message)]
    assert not msgs, msgs


def test_recomputed_on_tiny_programs_returns_none():
    assert recomputed(jax.make_jaxpr(jax.grad(lambda x: x))(1.0), 2) is None


def test_recompute_schedule_zero_segments_is_a_no_op():
    closed = jax.make_jaxpr(jax.grad(mlp))(params_(), X)
    assert recomputed(closed, 0) is None
