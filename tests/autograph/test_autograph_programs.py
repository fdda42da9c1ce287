"""Control-flow programs: jit(autograph(f)) on JAX inputs must match plain Python f on
NumPy copies of the inputs (NumPy so that x[i] = y works in the reference), and
gradients (jax.grad, or jax.jacfwd where the program lowers to while_loop) must match
central finite differences of the plain Python function in float64.

Programs make arrays they later assign into with `x * 0` so the same source builds a
NumPy array in the reference run and a JAX array in the converted run."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxform.autograph import autograph

CASES = []


def case(*args, grad=None, static=()):
  """Register a program with its inputs. grad: 'rev' (jax.grad), 'fwd' (jax.jacfwd; the
  program lowers to while_loop, which has no reverse mode) or None; static: argnums
  kept static under jit."""
  def reg(fn):
    CASES.append(pytest.param(fn, args, grad, static, id=fn.__name__))
    return fn
  return reg


R = np.random.RandomState(0)
V = R.randn(6).astype(np.float32)
W = R.randn(6).astype(np.float32)
M = R.randn(4, 5).astype(np.float32)
POS = np.abs(V) + 0.5


# ---- if / elif / else -------------------------------------------------------------------

@case(1.5, grad='rev')
@case(-0.5, grad='rev')
def if_else(x):
  if x > 0:
    y = x * 2
  else:
    y = -x
  return y


@case(-2.0, grad='rev')
@case(0.5, grad='rev')
@case(3.0, grad='rev')
def elif_chain(x):
  if x < -1:
    y = x * x
  elif x < 1:
    y = 3 * x
  else:
    y = jnp.sin(x)
  return y


@case(2.0, grad='rev')
@case(-2.0, grad='rev')
def if_without_else(x):
  y = x
  if x > 0:
    y = y * 10
  return y + 1


@case(1.0, 2.0, grad='rev')
@case(-1.0, 2.0, grad='rev')
@case(1.0, -2.0, grad='rev')
def nested_if(x, y):
  if x > 0:
    if y > 0:
      z = x * y
    else:
      z = x - y
  else:
    z = x + y
  return z


@case(0.3, grad='rev')
@case(-0.3, grad='rev')
def if_tuple_outputs(x):
  if x > 0:
    a, b = x, x * 2
  else:
    a, b = -x, x * 3
  return a * b


@case(0.5, 0.5)
@case(0.5, -0.5)
@case(-0.5, 0.5)
def if_and_or_not(x, y):
  if x > 0 and y > 0:
    r = 1.0
  elif x > 0 or not y > 0:
    r = 2.0
  else:
    r = 3.0
  return r


@case(0.5)
@case(1.5)
@case(-0.5)
def compare_chain(x):
  if 0 < x < 1:
    return x * 10
  return x


@case(1.0, grad='rev')
@case(-1.0, grad='rev')
def if_dict_state(x):
  d = {'a': x, 'b': x * 2}
  if x > 0:
    d = {'a': d['a'] + 1, 'b': d['b'] * 3}
  return d['a'] + d['b']


@case(1.0, grad='rev')
@case(-1.0, grad='rev')
def temporary_only_in_branch(x):
  if x > 0:
    t = x * 3
    x = t + 1
  return x


@case(1.0, grad='rev')
@case(-1.0, grad='rev')
def early_return_if(x):
  if x > 0:
    return x * x
  return -x


@case(0.5, grad='rev')
@case(-3.0, grad='rev')
@case(5.0, grad='rev')
def return_in_elif(x):
  if x > 2:
    return x
  elif x < -2:
    return x * 2
  y = x * x
  return y + 1


@case(2.0)
@case(-2.0)
def int_float_branches(x):
  if x > 0:
    y = 1
  else:
    y = 2.5
  return y


@case(1.0, grad='rev')
@case(-1.0, grad='rev')
def if_expression(x):
  y = x * 2 if x > 0 else x * -3
  return y + (1.0 if y > 1 else 0.0)


@case(V)
def if_setitem(xs):
  xs = xs * 1
  if xs[0] > 0:
    xs[1] = 100.0
  else:
    xs[2] = -100.0
  return xs


@case(1.0, True, static=(1,), grad='rev')
@case(1.0, False, static=(1,), grad='rev')
def static_flag(x, flag):
  if flag:
    y = x * 2
    name = 'double'
  else:
    y = x
    name = 'same'
  return y if name == 'double' else -y


# ---- for over range ---------------------------------------------------------------------

@case(V, 4, grad='fwd')
@case(V, 0, grad='fwd')
def range_traced_n(xs, n):
  s = 0.0
  for i in range(n):
    s = s + xs[i] * i
  return s


@case(V, 1, 5)
def range_start_stop(xs, a, b):
  s = 0.0
  for i in range(a, b):
    s += xs[i]
  return s


@case(V, 0, 6)
@case(V, 5, 0)
def range_step(xs, a, b):
  s = 0.0
  for i in range(a, b, 2 if a < b else -2):
    s += xs[i]
  return s


@case(V, static=(), grad='rev')
def range_static(xs):
  s = 0.0
  for i in range(xs.shape[0]):
    if xs[i] > 0:
      s = s + xs[i]
  return s


@case(V, 6, grad='fwd')
def range_if_inside(xs, n):
  pos, neg = 0.0, 0.0
  for i in range(n):
    if xs[i] > 0:
      pos += xs[i]
    else:
      neg += xs[i]
  return pos * 2 + neg


@case(3, 4)
def nested_range(n, m):
  s = 0
  for i in range(n):
    for j in range(m):
      s += i * j + 1
  return s


@case(V, 6)
def range_break(xs, n):
  s = 0.0
  for i in range(n):
    if xs[i] < 0:
      break
    s += xs[i]
  return s


@case(V, 6)
def range_continue(xs, n):
  s = 0.0
  for i in range(n):
    if xs[i] < 0:
      continue
    s += xs[i]
  return s


@case(V, 6, 0.0)
@case(V, 6, -10.0)
def for_else(xs, n, thresh):
  found = -1
  for i in range(n):
    if xs[i] < thresh:
      found = i
      break
  else:
    found = 99
  return found


@case(4, 5)
def nested_break_inner(n, m):
  count = 0
  for i in range(n):
    for j in range(m):
      if j > i:
        break
      count += 1
  return count


@case(4, 5, 7)
@case(4, 5, 100)
def nested_break_flag_outer(n, m, limit):
  count = 0
  done = False
  for i in range(n):
    for j in range(m):
      count += 1
      if count >= limit:
        done = True
        break
    if done:
      break
  return count


@case(V, 6)
def early_return_in_loop(xs, n):
  for i in range(n):
    if xs[i] > 1.0:
      return i
  return -1


@case(V)
def cumsum_setitem(xs):
  out = xs * 0
  out[0] = xs[0]
  for i in range(1, xs.shape[0]):
    out[i] = out[i - 1] + xs[i]
  return out


@case(V, 6)
def augassign_setitem_traced(xs, n):
  out = xs * 1
  for i in range(n):
    out[i] += i * 2.0
    out[0] -= 1.0
  return out


@case(M, 4, 5)
def setitem_2d(m, r, c):
  m = m * 1
  for i in range(r):
    for j in range(c):
      if (i + j) % 2 == 0:
        m[i, j] -= 10.0
      else:
        m[i, j] *= 2.0
  return m


@case(6)
@case(0)
def loop_target_after(n):
  last = -5
  for i in range(n):
    last = i * 2
  return last


@case(V)
def loop_index_used_after(xs):
  total = 0.0
  for i in range(3):
    total += xs[i]
  return total + i


# ---- for over arrays ----------------------------------------------------------------

@case(V, grad='rev')
def scan_array(xs):
  s = 0.0
  for x in xs:
    s = s * 0.5 + x
  return s


@case(V, grad='rev')
def scan_enumerate(xs):
  s = 0.0
  for i, x in enumerate(xs):
    s = s + i * x
  return s


@case(V, W, grad='rev')
def scan_zip(xs, ys):
  s = 0.0
  for x, y in zip(xs, ys):
    if x > y:
      s = s + x * y
    else:
      s = s - y
  return s


@case(V, W, grad='rev')
def scan_enumerate_zip(xs, ys):
  s = 0.0
  for i, (x, y) in enumerate(zip(xs, ys)):
    s = s + (x - y) * i
  return s


@case(M, grad='rev')
def scan_rows(m):
  acc = m[0] * 0
  for row in m:
    acc = acc + row * row
  return acc.sum()


@case(V)
def scan_break(xs):
  s = 0.0
  for x in xs:
    if x < -0.5:
      break
    s += x
  return s


@case(V, grad='rev')
def scan_continue(xs):
  s = 0.0
  for x in xs:
    if x < 0:
      continue
    s = s + x * x
  return s


@case(V)
def scan_early_return(xs):
  for i, x in enumerate(xs):
    if x > 1.0:
      return x * 100
  return 0.0


@case(V, W, 3)
def zip_range_array(xs, ys, n):
  s = 0.0
  for i, x in zip(range(n), xs):
    s += x * i
  return s


@case(V)
def scan_setitem(xs):
  out = xs * 0
  for i, x in enumerate(xs):
    out[i] = x * x if x > 0 else 0.0
  return out


@case(V, W)
def zip_unequal(xs, ys):
  s = 0.0
  for x, y in zip(xs, ys[:4]):
    s += x * y
  return s


# ---- while ----------------------------------------------------------------------------

@case(3.0, grad='fwd')
@case(200.0, grad='fwd')
def while_double(x):
  while x < 100:
    x = x * 2
  return x


@case(27)
@case(1)
def collatz_steps(n):
  steps = 0
  while n != 1:
    if n % 2 == 0:
      n = n // 2
    else:
      n = 3 * n + 1
    steps += 1
  return steps


@case(48, 18)
@case(17, 5)
def gcd(a, b):
  while b != 0:
    a, b = b, a % b
  return a


@case(2.0, grad='fwd')
@case(10.0, grad='fwd')
def newton_sqrt(a):
  x = a
  i = 0
  while abs(x * x - a) > 1e-4 and i < 50:
    x = 0.5 * (x + a / x)
    i += 1
  return x


@case(V, 6)
def while_break(xs, n):
  i = 0
  s = 0.0
  while i < n:
    if xs[i] < 0:
      break
    s += xs[i]
    i += 1
  return s, i


@case(V, 6)
def while_continue(xs, n):
  i = 0
  s = 0.0
  while i < n:
    i += 1
    if xs[i - 1] < 0:
      continue
    s += xs[i - 1]
  return s


@case(4, 3)
def nested_while(n, m):
  i = 0
  total = 0
  while i < n:
    j = 0
    while j < m:
      total += i + j
      j += 1
    i += 1
  return total


@case(V, 6)
def while_return(xs, n):
  i = 0
  while i < n:
    if xs[i] > 1.0:
      return i * 10
    i += 1
  return -1


@case(V, 6)
def while_setitem(xs, n):
  out = xs * 1
  i = 0
  while i < n:
    out[i] = out[i] + out[i - 1] if i > 0 else out[i]
    i += 1
  return out


@case(np.sort(V), 0.3)
@case(np.sort(V), -5.0)
def binary_search(sorted_xs, target):
  lo, hi = 0, sorted_xs.shape[0]
  while lo < hi:
    mid = (lo + hi) // 2
    if sorted_xs[mid] < target:
      lo = mid + 1
    else:
      hi = mid
  return lo


@case(1.0)
def while_static(x):
  k = 0
  while k < 3:
    x = x + k
    k += 1
  return x


# ---- functions, closures, lambdas, defaults -------------------------------------------------

@case(V, grad='rev')
def nested_function(xs):
  def relu_sum(v):
    s = 0.0
    for e in v:
      if e > 0:
        s = s + e
    return s
  return relu_sum(xs) + relu_sum(-xs)


@case(1.0, 2.0)
@case(-1.0, 2.0)
def lambda_boolops(x, y):
  both = lambda a, b: a > 0 and b > 0
  either = lambda a, b: a > 0 or b < 0
  r = 0
  if both(x, y):
    r += 1
  if either(x, y):
    r += 10
  return r


@case(2.0, grad='rev')
@case(-2.0, grad='rev')
def default_args(x):
  def f(v, scale=3.0, shift=1.0):
    if v > 0:
      return v * scale + shift
    return v
  return f(x) + f(x, scale=0.5)


@case(V, 2.0, grad='rev')
def closure_over_loop_var(xs, c):
  total = 0.0
  for x in xs:
    add = lambda v: v * c
    if x > 0:
      total = total + add(x)
  return total


@case(V, grad='rev')
def horner(xs):
  coeffs = (1.0, -2.0, 0.5, 3.0)
  out = xs * 0
  for c in coeffs:
    out = out * xs + c
  return out.sum()


@case(V, 6)
def bubble_sort(xs, n):
  xs = xs * 1
  for i in range(n):
    for j in range(n - 1 - i):
      if xs[j] > xs[j + 1]:
        t = xs[j]
        xs[j] = xs[j + 1]
        xs[j + 1] = t
  return xs


@case(M, W[:5])
def matvec_loops(m, v):
  out = m[:, 0] * 0
  for i in range(m.shape[0]):
    acc = 0.0
    for j in range(m.shape[1]):
      acc = acc + m[i, j] * v[j]
    out[i] = acc
  return out.sum()


@case(V)
def argmax_loop(xs):
  best, best_i = xs[0], 0
  for i, x in enumerate(xs):
    if x > best:
      best, best_i = x, i
  return best_i


@case(V)
def prefix_max(xs):
  out = xs * 1
  for i in range(1, xs.shape[0]):
    if out[i - 1] > out[i]:
      out[i] = out[i - 1]
  return out


@case(V)
def count_positive(xs):
  n = 0
  for x in xs:
    if not x <= 0:
      n += 1
  return n


@case(1.0, 0.125, grad='fwd')
def euler_ode(y0, dt):
  y, t = y0, 0.0
  while t < 1.0:
    y = y + dt * (-2.0 * y + jnp.sin(t))
    t = t + dt
  return y


@case(POS, grad='rev')
def mixed_static_dynamic(xs):
  out = 0.0
  for k in range(3):           # static: unrolled
    if k == 1:                 # static predicate: plain Python
      continue
    for x in xs:               # traced: scan
      if x > 1.0:              # traced: cond
        out = out + (x - 1) / x * k
      else:
        out = out + x
  return out


@case(V, 6)
def multi_return_nested(xs, n):
  for i in range(n):
    for j in range(n):
      if xs[i] + xs[j] > 2.5:
        return i * 10 + j
  return -1


@case(V, 3)
def pytree_loop_state(xs, n):
  state = (xs[0], {'count': 0})
  for i in range(n):
    v, aux = state
    state = (v + xs[i], {'count': aux['count'] + 1})
  return state[0], state[1]['count']


@case(1.0, 2.0)
@case(-1.0, 2.0)
def not_traced(x, y):
  flag = not (x > 0)
  if flag:
    return y
  return x


@case(V, 6)
def with_statement_in_loop(xs, n):
  s = 0.0
  for i in range(n):
    with jax.named_scope('body'):
      if xs[i] > 0:
        s = s + xs[i]
  return s


@case(5.0, 3)
def factorial_like(x, n):
  out = 1.0
  k = n
  while k > 0:
    out = out * (x - k + 1)
    k -= 1
  return out


@case(V)
def loop_else_no_break(xs):
  s = 0.0
  for x in xs:
    s += x
  else:
    s = s * 2
  return s


def _to_np(a):
  return np.array(a) if isinstance(a, np.ndarray) else a


def _close(a, b, tol=2e-5):
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=tol, atol=tol)


def test_enough_programs():
  assert len({p.values[0] for p in CASES}) >= 60


@pytest.mark.parametrize('fn, args, grad, static', CASES)
def test_program(fn, args, grad, static):
  expected = fn(*[_to_np(a) for a in args])
  conv = autograph(fn)
  jargs = [jnp.asarray(a) if i not in static else a for i, a in enumerate(args)]
  got = jax.jit(conv, static_argnums=static)(*jargs)
  _close(got, expected)
  _close(conv(*jargs), expected)  # eager: concrete values run as plain Python
  if grad:
    d = jax.grad if grad == 'rev' else jax.jacfwd
    _close(jax.jit(d(conv), static_argnums=static)(*jargs), _fd(fn, args), tol=1e-3)


def _fd(fn, args, eps=1e-4):
  """d fn / d args[0] by central differences, in float64 through the NumPy reference."""
  x0 = np.asarray(args[0], np.float64)
  g = np.zeros_like(x0)
  for idx in np.ndindex(x0.shape):
    hi, lo = x0.copy(), x0.copy()
    hi[idx] += eps
    lo[idx] -= eps
    f = lambda x: float(np.asarray(fn(x if x.shape else float(x), *args[1:]), np.float64).sum())
    g[idx] = (f(hi) - f(lo)) / (2 * eps)
  return g


# issue 26, finding 5: a traced `if` (or loop) whose branches assign a weakly typed value returned it strongly
# typed, so bf16 activations * scale became float32 under jit(autograph(g)) while Python, eager autograph and a
# hand-written lax.cond keep bfloat16. Types must be the ones lax.cond / lax loops give.
def _weak_if(x, flag):
    if flag > 0:
        scale = 2.0
    else:
        scale = 0.5
    return x * scale


def _weak_if_mixed(x, flag):   # weak f32 vs bf16: promotes to bf16, as in Python
    if flag > 0:
        scale = 2.0
    else:
        scale = x[0] * 0 + 3
    return x * scale


def _weak_for(x, n):
    s = 1.0
    for _ in range(n):
        s = s * 0.5
    return x * s


def _weak_while(x, n):
    s, i = 1.0, 0
    while i < n:
        s = s * 0.5
        i += 1
    return x * s


@pytest.mark.parametrize("fn", [_weak_if, _weak_if_mixed, _weak_for, _weak_while], ids=lambda f: f.__name__)
def test_weak_types_survive_traced_control_flow(fn):
    x = jnp.linspace(-1, 1, 4).astype(jnp.bfloat16)
    want = fn(x, 3)
    assert want.dtype == jnp.bfloat16
    for got in (jax.jit(autograph(fn))(x, 3), autograph(fn)(x, 3)):
        assert (got.dtype, got.weak_type) == (want.dtype, want.weak_type)
        np.testing.assert_array_equal(np.float32(got), np.float32(want))
    ref = jax.jit(lambda x, f: x * jax.lax.cond(f > 0, lambda: 2.0, lambda: 0.5))(x, 3)
    assert fn is not _weak_if or ref.dtype == want.dtype


# issue 26, finding 9: a list built by `append` in a traced loop and assigned by index (in the loop, or after it
# with a traced index) raised a jaxform internal error (TypeError: '_Collect' object does not support item
# assignment; TracerIntegerConversionError). It now works where Python's meaning is expressible, else it is an
# AutographError at the user's line.
def _append_then_set_last(x):
    xs = []
    for r in x:
        xs.append(r * 2)
        xs[-1] = r * 3
    return xs


def _append_then_augassign_last(x):
    xs = []
    for r in x:
        xs.append(r * 2)
        xs[-1] += 1
    return xs


def _append_then_set_traced_index(x, k):
    xs = []
    for r in x:
        xs.append(r * 2)
    xs[k] = x[0] - 7
    xs[k] += 1
    return xs


@pytest.mark.parametrize("fn,args", [(_append_then_set_last, ()), (_append_then_augassign_last, ()),
                                     (_append_then_set_traced_index, (1,)), (_append_then_set_traced_index, (-3,))],
                         ids=["set_last", "augassign_last", "traced_index", "traced_negative_index"])
def test_list_from_append_assigned_by_index(fn, args):
    x = jnp.arange(6.0).reshape(3, 2)
    want = fn(x, *args)
    for got in (jax.jit(autograph(fn))(x, *args), autograph(fn)(x, *args)):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_list_from_append_assigned_at_another_iteration_is_an_autograph_error():
    from jaxform.autograph import AutographError

    def f(x):
        xs = []
        for r in x:
            xs.append(r * 2)
            xs[0] = r
        return xs
    with pytest.raises(AutographError, match=r"(?s)only the elements this iteration appended.*xs\[0\] = r") as e:
        jax.jit(autograph(f))(jnp.ones((3, 2)))
    assert f"{__file__}:{f.__code__.co_firstlineno + 4}" in str(e.value)
