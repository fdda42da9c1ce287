"""The decorator, caching, composition with jit/grad/vmap, what each construct lowers to,
recursive conversion, and the static analysis."""
import ast
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxform
from jaxform.autograph import AutographError, autograph
from jaxform.autograph import analysis, convert


def _prims(fn, *args):
  return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def _all_prims(jaxpr):
  from jax.extend.core import subjaxprs
  return {e.primitive.name for e in jaxpr.eqns} | set().union(*map(_all_prims, subjaxprs(jaxpr)))


def test_exported_from_package():
  assert jaxform.autograph is autograph and jaxform.AutographError is AutographError


def test_bare_and_with_options():
  def f(x, n):
    for i in range(n):
      x = x * 2
    return x
  assert autograph(f)(1.0, 3) == 8.0
  assert autograph(recursive=True)(f)(1.0, 3) == 8.0
  assert autograph(static_range='lax')(f)(1.0, 3) == 8.0
  with pytest.raises(ValueError):
    autograph(static_range='nope')(f)


def test_lowering_targets():
  @autograph
  def cond(x):
    if x > 0:
      x = x + 1
    return x

  @autograph
  def scan(xs):
    s = 0.0
    for x in xs:
      s = s + x
    return s

  @autograph
  def fori(x, n):
    for i in range(n):
      x = x + i
    return x

  @autograph
  def while_(x):
    while x < 10:
      x = x * 2
    return x

  @autograph
  def setitem(x, i):
    x[i] = 0.0
    x[i] += 1.0
    return x

  assert 'cond' in _prims(cond, 1.0)
  assert 'scan' in _prims(scan, jnp.ones(3))
  assert 'while' in _prims(fori, 1.0, 3)
  assert 'while' in _prims(while_, 1.0)
  assert {'scatter', 'scatter-add'} <= _prims(setitem, jnp.ones(3), 1)


def test_static_predicates_stay_python():
  @autograph
  def f(x, n: int, mode: str):
    if mode == 'double':        # a string: must stay Python
      x = x * 2
    for i in range(n):          # static n: unrolled
      if i % 2 == 0:            # static predicate
        x = x + i
    return x
  prims = _prims(lambda x: f(x, 3, 'double'), 1.0)
  assert not prims & {'cond', 'while', 'scan'}, prims
  assert f(1.0, 3, 'double') == 1.0 * 2 + 0 + 2


def test_static_range_lax_gives_scan_and_reverse_grad():
  def f(x):
    for i in range(100):
      x = jnp.sin(x) + i * 1e-3
    return x
  g = autograph(static_range='lax')(f)
  assert 'scan' in _prims(g, 1.0)
  assert len(jax.make_jaxpr(g)(1.0).jaxpr.eqns) < 10
  np.testing.assert_allclose(jax.jit(g)(0.3), f(0.3), rtol=1e-5)
  np.testing.assert_allclose(jax.grad(g)(0.3), jax.grad(f)(0.3), rtol=1e-4)


def test_vmap_of_converted_cond_and_loop():
  @autograph
  def f(x):
    if x > 0:
      y = x * 2
    else:
      y = -x
    i = 0
    while y < 10:
      y = y * 3
      i += 1
    return y, i
  xs = jnp.array([-1.0, 0.5, 4.0, 20.0])
  ys, ns = jax.vmap(f)(xs)
  ref = [f.__wrapped__(float(x)) for x in xs]
  np.testing.assert_allclose(ys, [r[0] for r in ref], rtol=1e-6)
  np.testing.assert_array_equal(ns, [r[1] for r in ref])


def test_grad_through_cond_and_scan():
  @autograph
  def f(xs):
    s = 0.0
    for x in xs:
      if x > 0:
        s = s + x ** 2
      else:
        s = s - x
    return s
  xs = jnp.array([1.0, -2.0, 3.0])
  np.testing.assert_allclose(jax.jit(jax.grad(f))(xs), [2.0, -1.0, 6.0])


def test_conversion_is_cached(monkeypatch):
  def f(x):
    if x > 0:
      x = x + 1
    return x
  autograph(f)
  calls = []
  orig = convert._parse
  monkeypatch.setattr(convert, '_parse', lambda fn: calls.append(fn) or orig(fn))
  g1, g2 = autograph(f), autograph(f)
  assert calls == [] and g1.__code__ is g2.__code__
  autograph(recursive=True)(f)  # other options: converted again
  assert len(calls) == 1


def test_closure_cells_and_globals_stay_live():
  scale = 2.0

  @autograph
  def f(x):
    if x > 0:
      x = x * scale + OFFSET
    return x
  assert f(1.0) == 2.0 + OFFSET
  scale = 10.0
  assert f(1.0) == 10.0 + OFFSET


OFFSET = 0.5


def test_defaults_kwdefaults_and_metadata():
  @autograph
  def f(x, a=2.0, *, b=3.0):
    """doc"""
    if x > 0:
      x = x * a + b
    return x
  assert f(1.0) == 5.0 and f(1.0, 1.0, b=0.0) == 1.0
  assert f.__name__ == 'f' and f.__doc__ == 'doc' and f.__wrapped__.__name__ == 'f'
  assert jax.jit(f)(1.0) == 5.0


def test_methods():
  class Model:
    def __init__(self, k):
      self.k = k

    @autograph
    def __call__(self, x):
      for i in range(self.k):
        if x > 100:
          break
        x = x * 3
      return x
  m = Model(5)
  assert m(1.0) == 81.0 * 3 and jax.jit(m)(1.0) == 243.0
  assert autograph(m.__call__)(1.0) == 243.0


def test_recursive_converts_callees():
  def helper(x):
    if x > 0:
      return x * 2
    return -x

  def f(x):
    return helper(x) + jnp.sum(jnp.ones(2))

  with pytest.raises(jax.errors.TracerBoolConversionError):
    jax.jit(autograph(f))(1.0)
  g = jax.jit(autograph(recursive=True)(f))
  assert g(1.0) == 4.0 and g(-3.0) == 5.0


def test_lambda():
  f = autograph(lambda x: x * 2 if x > 0 else x - 1)
  assert jax.jit(f)(2.0) == 4.0 and jax.jit(f)(-2.0) == -3.0


def test_nested_def_with_own_returns_and_loops():
  @autograph
  def outer(xs):
    def first_positive(v):
      for i, e in enumerate(v):
        if e > 0:
          return i
      return -1
    return first_positive(xs), first_positive(-xs)
  a, b = jax.jit(outer)(jnp.array([-1.0, -2.0, 3.0]))
  assert (a, b) == (2, 0)


def test_python_side_effects_in_static_code_still_work():
  @autograph
  def f(xs):
    seen = []
    for i in range(3):       # static: Python list appends are fine
      seen.append(i)
    out = xs * 0
    for i in seen:
      out[i] = xs[i] * 2
    return out
  np.testing.assert_allclose(jax.jit(f)(jnp.arange(4.0)), [0, 2, 4, 0])


def test_while_test_becomes_traced_midway():
  @autograph
  def f(x):
    i = 0
    while i < 3:     # Python ints at first...
      i = i + x      # ...then traced
    return i
  assert jax.jit(f)(jnp.int32(1)) == 3
  assert 'while' in _prims(f, jnp.int32(1))


def test_item_assignment_python_list_and_nested_subscript():
  @autograph
  def f(x):
    lst = [x, x]
    lst[0] = x * 2
    m = jnp.zeros((2, 3))
    m[1][2] = x
    m[0, :] += 1.0
    return lst[0] + lst[1] + m.sum()
  assert jax.jit(f)(1.0) == 2 + 1 + 1 + 3


# ---- analysis --------------------------------------------------------------------------

def _fn(src):
  return ast.parse(textwrap.dedent(src)).body[0]


def test_writes_ignores_nested_scopes():
  fn = _fn('''
  def f(x):
    a = 1
    def g():
      b = 2
    c = [d for d in range(3)]
    x[0] = 1
    for i, (j, k) in []:
      pass
  ''')
  assert analysis.writes(fn.body) == {'a', 'g', 'c', 'i', 'j', 'k'}


def test_liveness_branch_outputs_and_loop_carry():
  fn = _fn('''
  def f(x, n):
    t = 0
    if x > 0:
      t = x
      dead = 1
      y = 2
    else:
      y = 3
    for i in range(n):
      tmp = y * 2
      y = tmp + t
    return y
  ''')
  lv = analysis.Liveness()
  lv.run(fn.body)
  if_, for_ = fn.body[1], fn.body[2]
  assert {'t', 'y'} <= lv.live_out[id(if_)] and 'dead' not in lv.live_out[id(if_)]
  assert lv.live_head[id(for_)] >= {'y', 't'} and 'tmp' not in lv.live_head[id(for_)]
  assert lv.live_entry[id(for_)] == {'y', 't'}


def test_liveness_closures_are_always_live():
  fn = _fn('''
  def f(x):
    g = lambda: z
    if x:
      z = 1
    else:
      z = 2
    return g()
  ''')
  lv = analysis.Liveness(analysis.nested_reads(fn))
  lv.run(fn.body)
  assert 'z' in lv.live_out[id(fn.body[1])]


def test_break_flag_is_a_select_and_the_loop_stops_early():
  @autograph
  def f(xs, n, t):
    s, idx = 0.0, -1
    for i in range(n):
      s += xs[i]
      if s > t:
        idx = i
        break
    return idx
  prims = _all_prims(jax.make_jaxpr(f)(jnp.ones(8), 8, 2.5).jaxpr)
  assert 'cond' not in prims and 'while' in prims and 'select_n' in prims
  assert jax.jit(f)(jnp.ones(8), 8, 2.5) == 2 and jax.jit(f)(jnp.ones(8), 8, 100.0) == -1


def test_branch_with_computation_stays_a_cond():
  @autograph
  def f(x):
    if x > 0:
      x = jnp.sqrt(x)  # NaN on the untaken side under a select: must stay lax.cond
    return x
  assert 'cond' in _prims(f, 1.0)
  assert jnp.isfinite(jax.grad(f)(-4.0))


def test_deep_nesting_matches_python():
  def f(xs, n):
    total = 0.0
    for i in range(n):
      if xs[i] > 0:
        j = 0
        while j < i:
          if (i + j) % 3 == 0:
            total = total + xs[j]
          elif xs[j] < -0.5:
            break
          j += 1
      else:
        for x in xs:
          if x > 1.0:
            continue
          total = total - x * 0.1
    return total
  xs = np.random.RandomState(1).randn(7).astype(np.float32)
  np.testing.assert_allclose(jax.jit(autograph(f))(jnp.asarray(xs), 7), f(xs, 7), rtol=1e-5)


def test_if_expression_promotes_dtypes():
  @autograph
  def f(x):
    return 1 if x > 0 else 2.5
  assert jax.jit(f)(1.0) == 1.0 and jax.jit(f)(-1.0) == 2.5


def test_vmap_of_loop_with_break_and_return():
  @autograph
  def f(xs):
    for i, x in enumerate(xs):
      if x > 0:
        return i
    return -1
  m = jnp.array([[-1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [5.0, 0.0, 0.0]])
  np.testing.assert_array_equal(jax.vmap(f)(m), [1, -1, 0])


def test_converted_functions_call_each_other():
  @autograph
  def clip(x):
    if x > 1:
      x = 1.0
    return x

  @autograph
  def f(xs):
    s = 0.0
    for x in xs:
      s = s + clip(x)
    return s
  assert jax.jit(f)(jnp.array([0.5, 3.0, 2.0])) == 2.5


def test_conversion_time_is_small():
  import time
  def f(x, n):
    for i in range(n):
      if x > 0:
        x = x - 1
      elif x < -10:
        break
    while x < 0:
      x = x + 2
    return x
  convert._CACHE.clear()
  t = time.perf_counter()
  autograph(f)
  assert time.perf_counter() - t < 0.5  # benchmarks/autograph.py measures ~2-5 ms


def test_del_walrus_and_autograph_inside_converted_code():
  @autograph
  def f(xs, n):
    i = 0
    total = 0.0
    while (i := i + 1) <= n:
      tmp = xs[i - 1] * 2
      total = total + tmp
      del tmp

    @autograph
    def inner(v):
      if v > 0:
        v = v * 10
      return v
    return inner(total), i
  xs = jnp.arange(4.0)
  assert f(xs, 3) == (60.0, 4)
  out = jax.jit(f)(xs, 3)
  assert out[0] == 60.0 and out[1] == 4
