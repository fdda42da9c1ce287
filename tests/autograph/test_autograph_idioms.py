"""Everyday Python idioms (issue 20): annotated locals, recursion, tuple assignment to items,
builtins on traced values, list.append in traced loops, Python lists indexed by a traced loop
index, enumerate + break. Each is checked against plain Python (eager and under jit); each
unsupported variant raises an AutographError naming the user's line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxform.autograph import AutographError, autograph


def _close(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), rtol=1e-5, atol=1e-5)


def _check(fn, *args, modes=('python', 'lax'), **kw):
  want = fn(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args])
  jargs = [jnp.asarray(a) for a in args]
  for m in modes:
    _close(jax.jit(autograph(fn, static_range=m, **kw))(*jargs), want)
  _close(autograph(fn, **kw)(*jargs), want)


X = np.array([0.5, -1.0, 2.0, 3.0, -0.25], np.float32)


def annotated(x):
  if x > 0:
    y: float = x * 2
  else:
    y: float = -x
  z: int
  return y


def test_annotated_assignment():
  _check(annotated, 1.5)
  _check(annotated, -1.5)


def fact(n):
  return 1 if n <= 1 else n * fact(n - 1)


def gcd(a, b):
  return a if b == 0 else gcd(b, a % b)


def count_down(x, n):
  if n <= 0:
    return x
  x = x * 0.5 + 1.0
  return count_down(x, n - 1)


def test_recursion_python_values_recurses():
  assert autograph(fact)(6) == 720


def test_tail_recursion_becomes_while_loop():
  _check(gcd, 1071, 462)
  _check(count_down, 3.0, 7)
  jaxpr = str(jax.make_jaxpr(autograph(gcd))(1071, 462))
  assert 'while' in jaxpr


def test_non_tail_recursion_on_traced_values_is_a_teaching_error():
  with pytest.raises(AutographError, match=r"recursive call to 'fact' under a traced condition(.|\n)*test_autograph_idioms.py:\d+(.|\n)*tail call"):
    jax.jit(autograph(fact))(5)
  assert jax.jit(autograph(fact), static_argnums=0)(5) == 120  # static n: plain recursion


def swaps(a, i, j):
  a[i], a[j] = a[j], a[i]
  a[0], k, a[k] = a[4], 2, a[0] * 10  # targets assigned left to right: a[k] uses the new k
  b, c = a * 1, a * 2  # (not `b = c = a * 1`: NumPy would alias them; JAX arrays are values)
  b[1] = c[2] = 7.0
  return a, b, c, k


def test_tuple_and_multiple_assignment_to_items():
  want = swaps(X.copy(), 1, 3)
  _close(jax.jit(autograph(swaps))(jnp.asarray(X), 1, 3), want)
  _close(autograph(swaps)(jnp.asarray(X), 1, 3), want)


def builtins_(x, s):
  m = min(s, x[0]) + max(x[1], s, 0.5) + abs(s) + min(x) + max(x)
  return m + sum(x) + len(x) + sum(x, 1.0)


def test_builtins_on_traced_values():
  _check(builtins_, X, -0.75)


def range_outside_header(n):
  return list(range(n))


def test_range_with_traced_bound_outside_for_header():
  with pytest.raises(AutographError, match=r'range\(\) with a traced bound(.|\n)*range_outside_header|range\(\) with a traced bound(.|\n)*test_autograph_idioms'):
    jax.jit(autograph(range_outside_header))(3)


def collect(x):
  ys = [x[0] * 0]
  pairs = []
  for i, r in enumerate(x):
    ys.append(r * 2.0)
    pairs.append((i, r))
    if r > 0:
      ys.append(r)
    else:
      ys.append(-r)
  return jnp.stack(ys), len(ys), [p[0] for p in pairs]


def test_append_in_traced_loop_becomes_stacked_output():
  _check(collect, X)
  jaxpr = str(jax.make_jaxpr(autograph(collect))(jnp.asarray(X)))
  assert 'scan' in jaxpr


def collect_static_range(x):
  out, acc = [], x * 0
  for i in range(3):
    acc = acc + x
    out.append(acc * i)
  return jnp.stack(out), acc


def test_append_static_range_lax():
  _check(collect_static_range, X)
  assert 'scan' in str(jax.make_jaxpr(autograph(collect_static_range, static_range='lax'))(jnp.asarray(X)))


def collect_while(x, n):
  ys = []
  for i in range(n):
    ys.append(x[i])
  return ys


def collect_break(x):
  ys = []
  for r in x:
    if r > 1:
      break
    ys.append(r)
  return ys


def collect_one_branch(x):
  ys = []
  for r in x:
    if r > 0:
      ys.append(r)
  return ys


def collect_shapes(x):
  ys = []
  for r in x:
    if r > 0:
      ys.append(jnp.ones(2) * r)
    else:
      ys.append(jnp.ones(3) * r)
  return ys


def collect_read(x):
  ys = [0.0]
  for r in x:
    ys.append(ys[-1] + r)
  return ys


@pytest.mark.parametrize('fn, args, msg', [
    (collect_while, (X, 3), r"list 'ys' is appended to in this traced `for` loop, whose trip count is traced"),
    (collect_break, (X,), r"list 'ys' is appended to in this traced `for` loop, which can exit early"),
    (collect_one_branch, (X,), r"list 'ys' gets 1 element\(s\) in the if branch but 0 in the else branch"),
    (collect_shapes, (X,), r"variable 'ys' is float32\[2\] in the if branch but float32\[3\]"),
    (collect_read, (X,), r"list 'ys' is appended to in a traced loop, so inside the loop it only collects"),
], ids=['traced-trip-count', 'break', 'one-branch', 'shapes-differ', 'read-inside'])
def test_append_errors(fn, args, msg):
  with pytest.raises(AutographError, match=msg) as e:
    jax.jit(autograph(fn))(*[jnp.asarray(a) for a in args])
  assert 'test_autograph_idioms.py:' in str(e.value)
  fn(*[np.array(a) if isinstance(a, np.ndarray) else a for a in args])  # plain Python runs them


def weighted(x):
  ws = [0.5, 1.0, -2.0, 3.0, 0.25]
  pairs = [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0), (7.0, 8.0), (9.0, 10.0)]
  acts = [jnp.sin, jnp.cos, jnp.tanh, jnp.sin, jnp.cos]
  s = 0.0
  for i, r in enumerate(x):
    s = s + ws[i] * r + pairs[i][1] + acts[i](r)
  return s


def test_list_indexed_by_traced_loop_index():
  _check(weighted, X)


def ragged(x):
  ws = [jnp.ones(2), jnp.ones(3)]
  s = 0.0
  for i, r in enumerate(x):
    s = s + ws[i].sum()
  return s


def test_list_of_different_shapes_by_traced_index_errors():
  with pytest.raises(AutographError, match=r'element 0 is float32\[2\] but element 1 is float32\[3\](.|\n)*test_autograph_idioms.py:'):
    jax.jit(autograph(ragged))(jnp.ones(2))


def enumerate_break(x):
  for i, r in enumerate(x):
    if r > 2:
      break
  return i


def test_enumerate_break_return_index():  # issue 15, finding 17
  _check(enumerate_break, X)
  _check(enumerate_break, np.array([3.0, 0.0], np.float32))


def list_table(p1, p2):
  t = [[0] * 3 for _ in range(3)]
  for i in range(1, 3):
    for j in range(1, 3):
      if p1[i] == p2[j]:
        t[i][j] = t[i - 1][j - 1]
      else:
        t[i][j] = 1 + min(t[i - 1][j], t[i][j - 1])
  return t


def test_list_item_assignment_in_traced_branch_does_not_leak():
  a, b = np.array([1, 2, 3], np.int32), np.array([1, 3, 3], np.int32)
  _close(jax.jit(autograph(list_table))(a, b), list_table(a, b))


def test_conversion_failure_is_autograph_error_at_user_line(monkeypatch):
  """An internal failure of the AST pass (here injected, as the KeyError of issue 20 was)
  reaches the user as an AutographError naming the function and its line, never ours."""
  from jaxform.autograph import convert, recursion

  def broken(node, filename):
    raise KeyError('fact')
  monkeypatch.setattr(recursion, 'rewrite', broken)
  convert._CACHE.clear()
  with pytest.raises(AutographError, match=r"autograph cannot convert annotated \(KeyError: 'fact'\)(.|\n)*test_autograph_idioms.py:\d+"):
    autograph(annotated)
  convert._CACHE.clear()


def collect_nested(x):
  ys = []
  for r in x:
    ys.append(r)
    for q in x:  # a traced loop inside a collecting loop: its rows join the outer list
      ys.append(q * r)
  return jnp.stack(ys)


def test_append_in_nested_traced_loops():
  _check(collect_nested, X[:3])


def collect0(x):
  return collect(x)[0]


def swap0(x):
  return swaps(x, 0, 4)[0]


def builtins1(x):
  return builtins_(x, x[2])


def test_new_idioms_under_vmap():
  xs = np.stack([X, X[::-1] * 0.5, -X]).astype(np.float32)
  for fn in (weighted, collect0, swap0, builtins1):
    got = jax.vmap(autograph(fn, recursive=True))(jnp.asarray(xs))
    for k in range(len(xs)):
      _close(got[k], fn(xs[k].copy()))


LOG = []


def append_nonlocal(x):
  LOG.append(1)  # a global list: not rebound (it would become an unbound local)
  out = []

  def g():
    out.append(2)  # a closure's list: mutated in place, as in Python
  g()
  for r in x:
    out.append(r)
  return out


def test_append_to_global_and_closure_lists():
  LOG.clear()
  got = jax.jit(autograph(append_nonlocal))(jnp.asarray(X[:2]))
  _close(got, append_nonlocal(X[:2]))
  assert LOG == [1, 1]
