"""Return kinds: a value on one path and None (falling off the end, or a bare `return`) on
another. Python decides per call; a traced program returns one structure, so under a traced
condition that is an AutographError at the user's line (it used to return zeros), and under a
Python condition it behaves like Python."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxform.autograph import AutographError, autograph

HERE = __file__


def _line(fn, k):
  return f'{HERE}:{fn.__code__.co_firstlineno + k}'


def _jit_raises(fn, *args, match=(), static_argnums=(), modes=('python', 'lax')):
  msgs = []
  for mode in modes:
    with pytest.raises(AutographError) as e:
      jax.jit(autograph(fn, static_range=mode), static_argnums=static_argnums)(*args)
    msg = str(e.value)
    for m in match:
      assert m in msg, msg
    assert 'fix:' in msg, msg
    msgs.append(msg)
  return msgs[0]


# ---- a value, or falling off the end --------------------------------------------------------

def falls_off(x):
  if x > 0:
    return x * 2


def test_fall_off_under_traced_condition_raises_at_the_if():
  msg = _jit_raises(falls_off, 1.0, match=("'falls_off' returns", 'reaches its end', 'Python returns None',
                                           'if x > 0:', 'return x * 2'))
  assert f'at {_line(falls_off, 1)}' in msg  # the traced `if` that decides
  with pytest.raises(AutographError, match='reaches its end'):
    jax.vmap(autograph(falls_off))(jnp.array([1.0, -1.0]))  # a batched predicate is traced too


def test_fall_off_eager_and_static_condition_behave_like_python():
  f = autograph(falls_off)
  assert f(jnp.asarray(-1.0)) is None and falls_off(-1.0) is None  # concrete: Python dispatch
  np.testing.assert_allclose(f(jnp.asarray(2.0)), 4.0)

  def g(x, n):
    if n > 0:           # Python int under static_argnums: a Python `if`
      return x * 2

  jg = jax.jit(autograph(g), static_argnums=1)
  assert jg(1.0, 0) is None
  np.testing.assert_allclose(jg(1.0, 3), 2.0)


def test_fall_off_after_static_then_traced_returns():
  def f(x, n):
    if x > 0:
      return x
    if n > 0:
      return -x

  jf = jax.jit(autograph(f), static_argnums=1)
  np.testing.assert_allclose(jf(-1.0, 1), 1.0)  # every path returns a value: fine
  np.testing.assert_allclose(jf(2.0, 1), 2.0)
  with pytest.raises(AutographError, match='reaches its end'):  # n = 0: x <= 0 falls off
    jf(-1.0, 0)


def test_every_path_returns_still_works():
  def nested(x):
    if x > 0:
      if x > 2:
        return 1.0
      return 2.0
    return 3.0

  def both(x):
    if x > 0:
      return x
    else:
      return -x

  for f in (nested, both):
    for v in (-1.0, 1.0, 3.0):
      np.testing.assert_allclose(jax.jit(autograph(f))(v), f(v))


def test_none_on_every_path_is_fine():
  def f(x):
    if x > 0:
      return
    x = x + 1  # falls off: None as well

  assert jax.jit(autograph(f))(1.0) is None and jax.jit(autograph(f))(-1.0) is None


# ---- bare `return` and `return value` -------------------------------------------------------

def test_bare_return_and_value_raise():
  def early(x):
    if x > 0:
      return
    return x * 2

  msg = _jit_raises(early, 1.0, match=("'early' returns None where an earlier `return` ran",
                                       'weak float32[] on the path that continues here',
                                       'A bare `return`', 'return x * 2'))
  assert f'at {_line(early, 3)}' in msg

  def branches(x):
    if x > 0:
      return x
    else:
      return

  msg = _jit_raises(branches, 1.0, match=('in the if branch but None in the else branch', 'if x > 0:'))
  assert f'at {_line(branches, 1)}' in msg
  assert autograph(branches)(jnp.asarray(-1.0)) is None  # eager: Python


# ---- different structures ---------------------------------------------------------------------

def test_tuple_vs_scalar_is_an_autograph_error_at_the_return():
  def f(x):
    if x > 0:
      return x, x + 1
    return x

  msg = _jit_raises(f, 1.0, match=("'f' returns (weak float32[], weak float32[]) where an earlier `return` ran",
                                   'one structure on every path'))
  assert f'at {_line(f, 3)}' in msg

  def g(x):
    if x > 0:
      return [x]
    return [x, x]

  _jit_raises(g, 1.0, match=('[weak float32[]]', '[weak float32[], weak float32[]]'))


# ---- early return inside traced loops --------------------------------------------------------

def test_early_return_in_traced_loops_falling_off_raises():
  def scan_loop(xs):
    for v in xs:
      if v > 0:
        return v

  def range_loop(xs, n):
    for i in range(n):
      if xs[i] > 0:
        return xs[i]

  def while_loop(x):
    while x < 10:
      x = x * 2
      if x > 5:
        return x

  xs = jnp.array([-1.0, 2.0, 3.0])
  for f, args in ((scan_loop, (xs,)), (range_loop, (xs, 3)), (while_loop, (1.0,))):
    msg = _jit_raises(f, *args, match=(f"'{f.__name__}' returns", 'reaches its end'))
    assert _line(f, 2) in msg or _line(f, 3) in msg, msg  # the `if` in the loop
    assert f(*[np.asarray(a) if isinstance(a, jax.Array) else a for a in args]) is not None


def test_early_return_in_traced_loops_with_a_final_return():
  def scan_loop(xs):
    for v in xs:
      if v > 0:
        return v
    return -1.0

  def while_loop(x):
    while x < 10:
      x = x * 2
      if x > 5:
        return x
    return -x

  def unrolled(x):
    for i in range(3):    # a Python loop (static_range='python') or a scan ('lax')
      if x > i:
        return x
    return -1.0

  for xs in (jnp.array([-1.0, 2.0, 3.0]), jnp.array([-1.0, -2.0])):
    np.testing.assert_allclose(jax.jit(autograph(scan_loop))(xs), scan_loop(np.asarray(xs)))
  for v in (1.0, 20.0):
    np.testing.assert_allclose(jax.jit(autograph(while_loop))(v), while_loop(v))
  for mode in ('python', 'lax'):
    for v in (0.5, -3.0):
      np.testing.assert_allclose(jax.jit(autograph(unrolled, static_range=mode))(v), unrolled(v))


def test_first_iteration_always_returns():
  """The loop can only end by its first iteration's `return` (the array is not empty): no error."""
  def first(xs):
    for v in xs:
      return v * 2

  def either(xs):
    for v in xs:
      if v > 0:
        return v
      else:
        return -v

  xs = jnp.array([-1.0, 2.0])
  np.testing.assert_allclose(jax.jit(autograph(first))(xs), -2.0)
  np.testing.assert_allclose(jax.jit(autograph(either))(xs), 1.0)


def test_tail_recursion_still_returns_a_value():
  def gcd(a, b):
    if b == 0:
      return a
    return gcd(b, a % b)

  assert int(jax.jit(autograph(gcd))(1071, 462)) == 21

  def count(v, c):  # falls off when v < 0: a value on one path, None on the other
    if v > 10:
      return c
    if v >= 0:
      return count(v + 3, c + 1)

  assert count(1, 0) == 4
  _jit_raises(count, 1, 0, match=("'count' returns", 'None'), modes=('python',))
