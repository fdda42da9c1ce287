"""Errors that teach: each names the variable, the user's file:line and what to change,
and the user's source line shows in the traceback."""
import traceback

import jax
import jax.numpy as jnp
import pytest

from jaxform.autograph import AutographError, autograph

HERE = __file__


def _raises(fn, *args, match=()):
  with pytest.raises(AutographError) as e:
    jax.jit(autograph(fn))(*args)
  msg = str(e.value)
  for m in match:
    assert m in msg, msg
  assert f'{HERE}:' in msg and 'fix:' in msg, msg
  return e


def test_defined_in_one_branch_used_after():
  def f(x):
    if x > 0:
      y = x * 2
    return y
  e = _raises(f, 1.0, match=("'y'", 'only in the if branch', 'if x > 0:'))
  assert f'{HERE}:{f.__code__.co_firstlineno + 1}' in str(e.value)


def test_defined_in_else_branch_only():
  def f(x):
    if x > 0:
      pass
    else:
      z = 1.0
    return z
  _raises(f, 1.0, match=("'z'", 'only in the else branch'))


def test_one_branch_fine_when_not_used_after():
  @autograph
  def f(x):
    if x > 0:
      tmp = x * 2
      x = tmp + 1
    return x
  assert jax.jit(f)(1.0) == 3.0 and jax.jit(f)(-1.0) == -1.0


def test_loop_carry_changes_shape():
  def f(x, n):
    acc = jnp.zeros(1)
    for i in range(n):
      acc = jnp.concatenate([acc, x[None]])
    return acc
  _raises(f, 1.0, 3, match=("'acc'", 'float32[1]', 'float32[2]', 'pre-allocate'))


def test_loop_carry_changes_dtype():
  def f(x, n):
    k = jnp.int32(0)
    while k < n:
      k = k + x
    return k
  _raises(f, 0.5, 3, match=("'k'", 'int32', 'float32', 'astype'))


def test_weak_python_scalar_carry_is_promoted_not_an_error():
  @autograph
  def f(xs):
    total = 0
    for x in xs:
      total += x
    return total
  assert jax.jit(f)(jnp.arange(4.0)) == 6.0


def test_branches_disagree_on_shape():
  def f(x):
    if x.sum() > 0:
      y = x
    else:
      y = x[:1]
    return y
  _raises(f, jnp.ones(3), match=("'y'", 'float32[3]', 'float32[1]'))


def test_returns_of_different_structure():
  def f(x):
    if x > 0:
      return x, x
    return x
  # x = 1.0 is weakly typed, and stays so through the traced `if` (issue 26, finding 5)
  e = _raises(f, 1.0, match=("'f' returns (weak float32[], weak float32[]) where an earlier `return` ran",
                             'weak float32[] on the path that continues here', 'one structure on every path',
                             'return x, x'))
  assert f'{HERE}:{f.__code__.co_firstlineno + 3}' in str(e.value)  # the `return x` that differs


def test_read_before_assignment_in_traced_loop():
  def f(xs):
    for x in xs:
      if x > 0:
        s = 0.0
      s = s + x
    return s
  with pytest.raises(AutographError):  # one-branch `s` used after the inner if
    jax.jit(autograph(f))(jnp.ones(3))


def test_loop_variable_undefined_before_loop_and_read():
  def f(xs):
    for x in xs:
      acc = acc + x if x > 100 else x
    return acc
  _raises(f, jnp.ones(3), match=("'acc'", 'before it is assigned', 'initialize'))


def test_try_around_traced_branch():
  def f(x):
    try:
      if x > 0:
        x = x + 1
    except ValueError:
      x = x - 1
    return x
  _raises(f, 1.0, match=('`try`', 'traced'))
  assert autograph(f)(1.0) == 2.0  # static predicate: plain Python, try works


def test_loop_containing_try():
  def f(xs):
    s = 0.0
    for x in xs:
      try:
        s = s + x
      except TypeError:
        pass
    return s
  _raises(f, jnp.ones(3), match=('contains a `try`',))


def test_generator_in_traced_loop():
  def gen(xs):
    for x in xs:
      yield x * 2
  with pytest.raises(AutographError, match='generator'):
    jax.jit(lambda xs: sum(autograph(gen)(xs)))(jnp.ones(3))
  assert list(autograph(gen)([1, 2])) == [2, 4]  # static iterable: a normal generator


def test_raise_in_traced_branch():
  def f(x):
    if x < 0:
      raise ValueError('negative')
    return x
  _raises(f, 1.0, match=('`raise`', 'checkify'))
  with pytest.raises(ValueError):
    autograph(f)(-1.0)  # concrete: Python semantics


def test_non_scalar_predicate():
  def f(x):
    if x > 0:
      x = x + 1
    return x
  _raises(f, jnp.ones(3), match=('shape (3,)', 'jnp.any'))


def test_traceback_shows_user_source_line():
  def f(x):
    y = x * 2
    if y > 0:
      z = y
    return z
  try:
    jax.jit(autograph(f))(1.0)
  except AutographError as e:
    frames = traceback.extract_tb(e.__traceback__)
    user = [fr for fr in frames if fr.filename == HERE and fr.name == 'f']
    assert user and user[-1].line.strip() == 'if y > 0:', frames
  else:
    pytest.fail('no error')


def test_user_error_inside_converted_code_points_at_user_line():
  @autograph
  def f(x, n):
    for i in range(n):
      x = x + jnp.ones(3) @ jnp.ones(4)  # shape error on this line
    return x
  with pytest.raises(TypeError) as e:
    jax.jit(f)(1.0, 2)
  lines = [fr.line for fr in traceback.extract_tb(e.value.__traceback__) if fr.filename == HERE]
  assert any('jnp.ones(3) @ jnp.ones(4)' in l for l in lines), lines


def test_source_unavailable():
  ns = {}
  exec('def g(x):\n  return x', ns)
  with pytest.raises(AutographError, match='source'):
    autograph(ns['g'])


def test_undefined_variable_message():
  @autograph
  def f(flag):
    if flag:
      y = 1
    return y
  with pytest.raises((AutographError, UnboundLocalError), match="'y'"):
    f(False)
