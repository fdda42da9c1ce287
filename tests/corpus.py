"""A corpus of real JAX programs covering every primitive family the IR knows.

Each entry: (name, fn, args, differentiable). Used by the round-trip and
optimize tests; other test modules may reuse it.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

rng = np.random.default_rng(0)


def arr(*shape, dtype=np.float32):
    return jnp.asarray(rng.standard_normal(shape).astype(dtype))


PROGRAMS: list[tuple[str, object, tuple, bool]] = []


def program(*args, differentiable=True):
    def wrap(fn):
        PROGRAMS.append((fn.__name__, fn, args, differentiable))
        return fn
    return wrap


# ---- plain array code ------------------------------------------------------------------------
@program(arr(4, 5), arr(5))
def elementwise_broadcast(x, b):
    return jnp.tanh(x * 2.0 + b) - jnp.exp(-x) / (1 + x**2)


@program(arr(4, 5))
def reductions(x):
    return x.sum(), x.max(0), x.min(1), x.mean(), jnp.prod(x[:2, :2]), jnp.argmax(x, 1)


@program(arr(3, 4), arr(4, 6))
def matmul_chain(a, b):
    return jax.nn.relu(a @ b) @ b.T


@program(arr(2, 3, 4), arr(2, 4, 5))
def batched_dot(a, b):
    return jnp.einsum("bij,bjk->bik", a, b)


@program(arr(6, 8))
def slicing(x):
    return x[1:4, ::2], x[-1], x[:, 3], lax.dynamic_slice(x, (2, 1), (3, 3))


@program(arr(10), jnp.array([1, 3, 3, 7]))
def gather_scatter(x, idx):
    return x[idx], x.at[idx].add(1.0), x.at[idx].set(0.0), x.at[idx].mul(2.0)


@program(arr(3, 4))
def reshape_transpose(x):
    return x.reshape(4, 3).T.reshape(-1), jnp.concatenate([x, x], 0), jnp.stack([x, x], -1)


@program(arr(8))
def cumulative(x):
    return jnp.cumsum(x), jnp.cumprod(x), lax.cummax(x), jnp.sort(x)


@program(arr(5, 5))
def softmax_logsumexp(x):
    return jax.nn.softmax(x), jax.nn.log_softmax(x, axis=0), jax.scipy.special.logsumexp(x)


@program(arr(4, 4))
def where_select(x):
    return jnp.where(x > 0, x, 0.1 * x), jnp.clip(x, -0.5, 0.5), jnp.abs(x)


@program(arr(3, 3) + 3 * jnp.eye(3))
def linalg(a):
    return jnp.linalg.inv(a), jnp.linalg.det(a), jnp.linalg.solve(a, jnp.ones(3)), jnp.linalg.cholesky(a @ a.T)


@program(arr(4), differentiable=False)
def integer_and_bool(x):
    i = jnp.arange(4) * 3 % 5
    return (x > 0) & (i < 3), i.astype(jnp.float32) + x, jnp.bitwise_xor(i, 6), i // 2


@program(jax.random.key_data(jax.random.key(0)), arr(3))
def random_numbers(k, x):
    key = jax.random.wrap_key_data(k)
    a, b = jax.random.split(key)
    return x + jax.random.normal(a, (3,)), jax.random.uniform(b, (2,))


@program(arr(2, 5, 5, 3), arr(3, 3, 3, 4))
def convolution(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


@program(arr(6, 6))
def pooling(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID")


@program(arr(16))
def fft(x):
    return jnp.fft.rfft(x).real, jnp.fft.irfft(jnp.fft.rfft(x), n=16)


@program(arr(4, 4))
def float64_free_casts(x):
    return x.astype(jnp.bfloat16).astype(jnp.float32) * 2, x.astype(jnp.float16).sum()


@program(arr(5), arr(5))
def complex_numbers(x, y):
    z = x + 1j * y
    return jnp.abs(z * jnp.conj(z)), jnp.angle(z)


# ---- control flow ----------------------------------------------------------------------------
def _rnn_body(w):
    return lambda h, x: (jnp.tanh(h @ w + x), h.sum())


@program(arr(7, 3), arr(3, 3))
def scan_rnn(xs, w):
    return lax.scan(_rnn_body(w), jnp.zeros(3), xs)


@program(arr(7, 3), arr(3, 3))
def scan_reverse_unroll(xs, w):
    return lax.scan(_rnn_body(w), jnp.zeros(3), xs, reverse=True, unroll=3)


@program(arr(4, 3))
def scan_no_xs(x):
    return lax.scan(lambda c, _: (c * 0.9 + 1.0, c), x[0], None, length=5)


@program(arr(3, 4, 2))
def nested_scans(x):
    def outer(c, row):
        c2, ys = lax.scan(lambda a, r: (a + jnp.sin(r), a * r), c, row)
        return c2, ys.sum(0)
    return lax.scan(outer, jnp.zeros(2), x)


@program(arr(3), arr(3))
def cond_two_branches(x, y):
    return lax.cond(x.sum() > 0, lambda a, b: a * b, lambda a, b: a - b, x, y)


@program(jnp.int32(2), arr(3))
def switch_three_branches(i, x):
    return lax.switch(i, [jnp.sin, jnp.cos, lambda a: a**2], x)


@program(arr(3), differentiable=False)
def while_loop(x):
    return lax.while_loop(lambda c: c[1] < 10, lambda c: (c[0] * 1.1, c[1] + 1), (x, 0))


@program(arr(3))
def fori_static(x):
    return lax.fori_loop(0, 5, lambda i, c: c * jnp.cos(c) + i, x)


@program(arr(4, 3), differentiable=False)
def scan_in_cond_in_while(x):
    def body(c):
        v, k = c
        inner = lambda v: lax.scan(lambda a, r: (a + r * v, a), jnp.zeros(3), x)[0]
        v = lax.cond(k % 2 == 0, inner, lambda v: v * 0.5, v)
        return v, k + 1
    return lax.while_loop(lambda c: c[1] < 4, body, (x[0], 0))


@program(arr(3, 3), arr(3))
def pytree_carry(w, x):
    def body(c, _):
        return {"h": jnp.tanh(c["h"] @ w), "n": c["n"] + 1.0}, (c["h"], c["n"])
    return lax.scan(body, {"h": x, "n": jnp.float32(0)}, None, length=4)


# ---- calls, custom derivatives, remat, sharding ----------------------------------------------
@program(arr(3, 3))
def nested_jit(x):
    inner = jax.jit(lambda a: a @ a + 1.0)
    return jax.jit(lambda a: inner(a) * inner(a.T))(x)


@program(arr(4))
def custom_jvp(x):
    @jax.custom_jvp
    def f(a):
        return jnp.log1p(jnp.exp(a))
    f.defjvp(lambda p, t: (f(p[0]), jax.nn.sigmoid(p[0]) * t[0]))
    return f(x) * 2


@program(arr(4))
def custom_vjp(x):
    @jax.custom_vjp
    def clip_grad(a):
        return a
    clip_grad.defvjp(lambda a: (a, None), lambda _, g: (jnp.clip(g, -0.1, 0.1),))
    return jnp.sin(clip_grad(x * 3)).sum()


@program(arr(4, 4))
def checkpoint(x):
    f = jax.checkpoint(lambda a: jnp.sin(jnp.sin(a)) @ a)
    return f(x).sum()


@program(arr(4, 4))
def checkpoint_policy(x):
    f = jax.checkpoint(lambda a: jnp.tanh(a @ a) @ a, policy=jax.checkpoint_policies.dots_saveable)
    return f(x)


@program(arr(8, 4))
def shard_map_program(x):
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    f = jax.shard_map(lambda a: a * 2 + lax.psum(a.sum(), "i"), mesh=mesh, in_specs=jax.P(),
                      out_specs=jax.P())
    return f(x)


@program(arr(4, 4))
def sharding_constraint(x):
    mesh = jax.make_mesh((1,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    s = jax.sharding.NamedSharding(mesh, jax.P("i"))
    return lax.with_sharding_constraint(x * 2, s) + 1


@program(arr(3))
def stop_gradient_and_debug(x):
    return jnp.sin(x) + lax.stop_gradient(x) ** 2


# ---- mutable references ------------------------------------------------------------------------
@program(arr(5), differentiable=False)
def ref_in_fori(x):
    r = jax.new_ref(jnp.zeros_like(x))

    def body(i, c):
        r[i] = c + x[i]
        return c + x[i]
    lax.fori_loop(0, 5, body, 0.0)
    return r[...]


@program(arr(5), differentiable=False)
def ref_accumulate(x):
    r = jax.new_ref(x)
    r[...] += 1.0
    r[1:3] = r[1:3] * 2.0
    return r[...]


# ---- real models --------------------------------------------------------------------------------
def _mlp_params():
    return {"w1": arr(4, 8), "b1": arr(8), "w2": arr(8, 2), "b2": arr(2)}


@program(_mlp_params(), arr(5, 4), arr(5, 2))
def mlp_train_step(p, x, y):
    def loss(p):
        h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)
    l, g = jax.value_and_grad(loss)(p)
    return l, jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g)


@program(arr(10, 4, 3), arr(3, 3), arr(3, 3), arr(10, 4, 3))
def rnn_mse_loss(xs, w, u, targets):
    def cell(h, x):
        h = jnp.tanh(h @ w + x @ u)
        return h, h
    _, ys = lax.scan(cell, jnp.zeros((4, 3)), xs)
    return jnp.mean((ys - targets) ** 2)


def _equinox_mlp():
    import equinox as eqx
    return eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(1))


def equinox_train_step(x, y):
    import equinox as eqx
    model = _equinox_mlp()

    def loss(m):
        return jnp.mean((jax.vmap(m)(x) - y) ** 2)
    l, g = eqx.filter_value_and_grad(loss)(model)
    return l, jax.tree_util.tree_leaves(eqx.filter(g, eqx.is_array))


def flax_train_step(x, y):
    from flax import nnx
    model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(model)

    def loss(state):
        m = nnx.merge(graphdef, state)
        return jnp.mean((m(x) - y) ** 2)
    return jax.value_and_grad(loss)(state)


try:
    import equinox  # noqa: F401
    program(arr(6, 3), arr(6, 2))(equinox_train_step)
except ImportError:
    pass
try:
    import flax  # noqa: F401
    program(arr(6, 3), arr(6, 2))(flax_train_step)
except ImportError:
    pass


@program(arr(5, 3))
def attention(x):
    q, k, v = x, x * 0.5, x + 1.0
    s = jax.nn.softmax(q @ k.T / jnp.sqrt(3.0), axis=-1)
    return s @ v


@program(arr(6, 2))
def vmap_inside(x):
    return jax.vmap(lambda r: jnp.outer(r, r).sum())(x), jax.vmap(jnp.linalg.norm)(x)


@program(arr(4))
def grad_inside(x):
    return jax.grad(lambda a: jnp.sum(jnp.sin(a) ** 2))(x), jax.jacfwd(jnp.tanh)(x)


@program(arr(7), arr(7))
def associative_scan(x, y):
    return lax.associative_scan(jnp.add, x), lax.associative_scan(lambda a, b: a * b, y)


@program(arr(3, 3) + 3 * jnp.eye(3), arr(3))
def cg_solve(a, b):
    return jax.scipy.sparse.linalg.cg(a @ a.T, b, maxiter=20)[0]
