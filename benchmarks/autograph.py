"""autograph: converted Python control flow vs hand-written lax, in one run.

For each program: compiled runtime of jit(autograph(f)) vs jit(hand-written lax) (min of
N after warmup, target <= 1.05x), XLA temp memory of both, and the conversion time of f
(AST pass + compile, cache cleared, min of 5; target <= 20 ms).

    .venv/bin/python benchmarks/autograph.py

Second table: compile-time gain of static_range='lax' on public programs with static loops.
"""
import time

import jax
import jax.numpy as jnp
from jax import lax

from jaxform.autograph import autograph
from jaxform.autograph import convert as _convert

D = 256


# ---- 1. traced-bound loop with a branch (fori_loop + cond) ------------------------------

def loop_cond(x, n):
  for i in range(n):
    if x.sum() > 0:
      x = jnp.sin(x) * 0.9
    else:
      x = jnp.cos(x) + 0.1
  return x


def loop_cond_lax(x, n):
  def body(i, x):
    return lax.cond(x.sum() > 0, lambda x: jnp.sin(x) * 0.9, lambda x: jnp.cos(x) + 0.1, x)
  return lax.fori_loop(0, n, body, x)


# ---- 2. RNN over the rows of an array (scan) -------------------------------------------

def rnn(h, xs, w):
  for x in xs:
    h = jnp.tanh(h @ w + x)
  return h


def rnn_lax(h, xs, w):
  return lax.scan(lambda h, x: (jnp.tanh(h @ w + x), None), h, xs)[0]


# ---- 3. Newton iterations until convergence (while_loop) -------------------------------

def newton(a):
  x = a
  i = 0
  while jnp.max(jnp.abs(x * x - a)) > 1e-5 and i < 100:
    x = 0.5 * (x + a / x)
    i += 1
  return x, i


def newton_lax(a):
  def cond(s):
    x, i = s
    return jnp.logical_and(jnp.max(jnp.abs(x * x - a)) > 1e-5, i < 100)
  return lax.while_loop(cond, lambda s: (0.5 * (s[0] + a / s[0]), s[1] + 1), (a, 0))


# ---- 4. early exit: first index where the running sum passes a threshold (break) -------

def first_crossing(xs, n, t):
  s = 0.0
  idx = -1
  for i in range(n):  # traced n: while_loop that stops at the break
    s += xs[i]
    if s > t:
      idx = i
      break
  return idx


def first_crossing_lax(xs, n, t):
  def cond(c):
    i, s, idx = c
    return jnp.logical_and(i < n, idx < 0)
  def body(c):
    i, s, idx = c
    s = s + xs[i]
    return i + 1, s, jnp.where(s > t, i, idx)
  return lax.while_loop(cond, body, (0, 0.0, -1))[2]


# ---- 5. item assignment in a loop (in-place .at[].set) ---------------------------------

def prefix_sums(xs, n):
  out = jnp.zeros_like(xs)
  out[0] = xs[0]
  for i in range(1, n):
    out[i] = out[i - 1] * 0.99 + xs[i]
  return out


def prefix_sums_lax(xs, n):
  out = jnp.zeros_like(xs).at[0].set(xs[0])
  return lax.fori_loop(1, n, lambda i, o: o.at[i].set(o[i - 1] * 0.99 + xs[i]), out)


def _time_pair(f, g, args, budget=0.5):
  """min-of-N wall time of the compiled f and g (N from a time budget, >= 50), interleaved
  so that load drifts on a shared machine hit both alike."""
  cs = [jax.jit(h).lower(*args).compile() for h in (f, g)]
  best = [float('inf')] * 2
  t = time.perf_counter()
  for c in cs:
    jax.block_until_ready(c(*args))
  reps = max(50, int(budget / (time.perf_counter() - t)))
  for _ in range(reps):
    for k, c in enumerate(cs):
      t = time.perf_counter()
      jax.block_until_ready(c(*args))
      best[k] = min(best[k], time.perf_counter() - t)
  return best, [c.memory_analysis().temp_size_in_bytes for c in cs]


def _conversion_ms(fn, reps=5):
  best = float('inf')
  for _ in range(reps):
    _convert._CACHE.clear()
    t = time.perf_counter()
    autograph(fn)
    best = min(best, time.perf_counter() - t)
  return best * 1e3


def _compile_s(fn, args, static, reps=2):
  """Trace + lower + XLA compile of jit(fn), min over reps (caches cleared between)."""
  best = float('inf')
  for _ in range(reps):
    jax.clear_caches()
    _convert._CACHE.clear()
    t = time.perf_counter()
    jax.jit(fn, static_argnums=static).lower(*args).compile()
    best = min(best, time.perf_counter() - t)
  return best


def static_range_gain():
  """Public programs (tests/autograph/test_autograph_public.py, sources cited there) whose loops
  run over static ranges: compile time and runtime with the loops unrolled (static_range=
  'python', the default) vs turned into lax.scan / while_loop (static_range='lax')."""
  import os
  import sys
  import numpy as np
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tests', 'autograph'))
  import test_autograph_public as pub
  r = np.random.RandomState(0)
  v16 = jnp.asarray(r.randn(16).astype(np.float32))
  coeffs = tuple(float(c) for c in r.randn(64))
  t = jnp.linspace(0, 2, 100)
  cases = [
      ('bubble_sort n=16', pub.bubble_sort, (v16,), ()),
      ('selectionSort n=16', pub.selectionSort, (v16,), ()),
      ('insertion_sort n=16', pub.insertion_sort, (v16,), ()),
      ('horner 64 coeffs', pub.horner, (jnp.float32(0.7), coeffs), (1,)),
      ('explicit_euler n=100', pub.explicit_euler, (pub.f_decay, t, jnp.ones(100), 0.02, 100), (0, 4)),
      ('midpoint n=400', lambda a: pub.midpoint(lambda y: jnp.exp(-a * y * y), 0.0, 2.0, 400), (jnp.float32(1.0),), ()),
  ]
  print(f'\n{"static range program":22s} {"compile py":>11s} {"compile lax":>11s} {"gain":>6s} '
        f'{"run py":>9s} {"run lax":>9s}')
  for name, fn, args, static in cases:
    fp, fl = autograph(fn), autograph(fn, static_range='lax')
    for a, b in zip(jax.tree_util.tree_leaves(jax.jit(fp, static_argnums=static)(*args)),
                    jax.tree_util.tree_leaves(jax.jit(fl, static_argnums=static)(*args))):
      assert jnp.allclose(a, b, rtol=1e-4, atol=1e-4), name
    cp, cl = _compile_s(fp, args, static), _compile_s(fl, args, static)
    dyn = [i for i in range(len(args)) if i not in static]
    bind = lambda f: (lambda *d: f(*[d[dyn.index(i)] if i in dyn else args[i] for i in range(len(args))]))
    (tp, tl), _ = _time_pair(bind(fp), bind(fl), [args[i] for i in dyn], budget=0.2)
    print(f'{name:22s} {cp * 1e3:9.0f}ms {cl * 1e3:9.0f}ms {cp / cl:5.1f}x {tp * 1e6:7.1f}us {tl * 1e6:7.1f}us')


def main():
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (D,))
  xs = jax.random.normal(k[1], (512, D)) * 0.1
  w = jax.random.normal(k[2], (D, D)) / D ** 0.5
  v = jax.random.uniform(k[3], (4096,))
  programs = [
      ('fori+cond', loop_cond, loop_cond_lax, (x, 1000)),
      ('scan rnn', rnn, rnn_lax, (x, xs, w)),
      ('while newton', newton, newton_lax, (jnp.abs(x) + 1.0,)),
      ('break early exit', first_crossing, first_crossing_lax, (v, 4096, 1000.0)),
      ('setitem loop', prefix_sums, prefix_sums_lax, (v, 4096)),
  ]
  print(f'{"program":18s} {"autograph":>11s} {"hand lax":>11s} {"ratio":>6s} {"temp bytes":>12s} '
        f'{"same jaxpr":>10s} {"convert":>9s}')
  worst_ratio, worst_conv = 0.0, 0.0
  for name, f, hand, args in programs:
    conv = autograph(f)
    for a, b in zip(jax.tree_util.tree_leaves(jax.jit(conv)(*args)), jax.tree_util.tree_leaves(jax.jit(hand)(*args))):
      assert jnp.allclose(a, b, rtol=1e-4, atol=1e-4), name
    (t_c, t_h), (m_c, m_h) = _time_pair(conv, hand, args)
    ms = _conversion_ms(f)
    ratio = t_c / t_h
    worst_ratio, worst_conv = max(worst_ratio, ratio), max(worst_conv, ms)
    mem = f'{m_c}/{m_h}' if min(m_c, m_h) < 65536 else f'{m_c / m_h:.2f}x'
    same = str(jax.make_jaxpr(conv)(*args)) == str(jax.make_jaxpr(hand)(*args))
    print(f'{name:18s} {t_c * 1e6:9.1f}us {t_h * 1e6:9.1f}us {ratio:5.2f}x {mem:>12s} '
          f'{"yes" if same else "no":>10s} {ms:7.2f}ms')
  print(f'worst runtime ratio {worst_ratio:.3f}x (target <= 1.05x); '
        f'worst conversion {worst_conv:.2f} ms (target <= 20 ms)')


if __name__ == '__main__':
  main()
  static_range_gain()
