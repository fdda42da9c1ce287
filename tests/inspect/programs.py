"""Small programs for the inspect tests (module-level so source lines are stable)."""
import inspect as _pyinspect

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

L, B, H = 10, 4, 8


def rnn(W, h0, xs):
    return lax.scan(lambda h, x: (jnp.tanh(h @ W + x),) * 2, h0, xs)[1]


def mse(W, h0, xs, targets):
    return jnp.mean((rnn(W, h0, xs) - targets) ** 2)   # MSE_LINE


def twice(x):
    a = jnp.sin(x) * 2.0
    b = jnp.sin(x) * 2.0   # TWICE_LINE: a duplicate, merged by cse
    return a + b


def nested(x, xs):
    def step(c, x_t):
        c = lax.cond(x_t.sum() > 0, lambda c: jnp.sin(c) + jnp.sin(c), lambda c: c * 2.0, c)
        return c, c
    return lax.scan(step, x, xs)[1].sum()


def algebraic(x):
    return jnp.log(jnp.exp(x)) * 1.0


def rnn_args(length=L):
    r = np.random.RandomState(0)
    f = lambda *s: jnp.asarray(r.randn(*s).astype(np.float32))  # noqa: E731
    return f(H, H) / H, f(B, H), f(length, B, H), f(length, B, H)


def line_of(fn, marker: str) -> int:
    lines, start = _pyinspect.getsourcelines(fn)
    return start + next(i for i, l in enumerate(lines) if marker in l)
