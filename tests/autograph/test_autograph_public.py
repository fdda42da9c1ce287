"""Programs from public numerical-Python code, converted unchanged (or with the one-line
change noted at the function): jit(autograph(f)) — with static ranges unrolled
(static_range='python') and, where marked, as lax loops (static_range='lax') — and the
eager converted function must match plain Python f on NumPy / Python values.

Each function cites the repository and path it was taken from (found with the code search
corpus); bodies are kept as written there (style included). The one-line change, where
there is one, is `return arr` for in-place sorts/integrators: a converted function rebinds
a JAX array instead of mutating it, so the caller needs it returned."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxform.autograph import autograph

PROGRAMS = []


def program(*args, static=(), lax=True):
  """Register fn with inputs; static: argnums kept static under jit (callables, sizes);
  lax: also run with static_range='lax'."""
  def reg(fn):
    PROGRAMS.append(pytest.param(fn, args, static, lax, id=fn.__name__))
    return fn
  return reg


def f_cubic(x):
  return x ** 3 - 2 * x - 5


def df_cubic(x):
  return 3 * x ** 2 - 2


def f_decay(t, y):
  return -0.5 * y + jnp.sin(t) if isinstance(y, jax.Array) else -0.5 * y + np.sin(t)


R = np.random.RandomState(0)
VEC = R.randn(9).astype(np.float32)
INTS = R.randint(0, 50, size=8).astype(np.int32)


# ---- root finding ------------------------------------------------------------------------

# QuantEcon/QuantEcon.py  bisection.py
@program(f_cubic, 1.0, 3.0, static=(0,))
def bisect(f, a, b, tol=10e-5):
    """
    Implements the bisection root finding algorithm, assuming that f is a
    real-valued function on [a, b] satisfying f(a) < 0 < f(b).
    """
    lower, upper = a, b

    while upper - lower > tol:
        middle = 0.5 * (upper + lower)
        # === if root is between lower and middle === #
        if f(middle) > 0:
            lower, upper = lower, middle
        # === if root is between middle and upper  === #
        else:
            lower, upper = middle, upper

    return 0.5 * (upper + lower)


# sdrave/braunschweig09  bisec/d/bisec.py   (while True + break, swap, builtin abs)
@program(f_cubic, 3.0, 1.0, static=(0,))
def bisec(f, a, b, tol=1e-4):
    if f(a) > f(b):
        a, b = b, a
    while True:
        c = (a + b)/2
        y = f(c)
        if abs(y) < 1e-4:
            break
        if y > 0:
            b = c
        else:
            a = c

    return y


# pilipb/Exercises_SC  solvers.py   (builtin abs on a traced value in a while test)
@program(f_cubic, df_cubic, 3.0, 1e-3, static=(0, 1))
def newton(f, df, x0, tol):
    x = x0
    while abs(f(x)) > tol:
        x = x - f(x)/df(x)
    return x


# Aditbar/Elementary-My-Dear-Watson  Python/ModulDasar/ModulNewtRaph.py   (return inside a loop;
# one-line change: the original ends with `print("Too much\n")`, i.e. returns None when it does not
# converge; a traced function cannot return a tuple on one path and None on another, so it returns
# a flag instead. Unchanged, it raises an AutographError: test_newtraph_unchanged_raises)
@program(f_cubic, df_cubic, 3.0, 1e-5, static=(0, 1))
def NewtRaph(f, df, x, eps = 1.0e-9):
    for i in range(30):
        dx = -f(x)/df(x)
        x = x + dx
        if abs(dx) < eps:
            return x, 1
    return x, 0


# ---- number theory (tail recursion -> while loop) ------------------------------------------

# akhterrehan983/cp-python-  math/gcd.py
@program(1071, 462, lax=False)
def gcd(a,b):

    # Everything divides 0
    if (b == 0):
         return a
    return gcd(b, a%b)


# lih627/python-algorithm-templates  maths/Euclidean_algorithm.py
@program(1071, 462, lax=False)
def gcd2(a, b):  # named gcd there
    if b == 0:
        return a
    if a % b:
        return gcd2(b, a % b)
    return b


# daniel-reich/ubiquitous-fiesta  2SPQuzZTskcBpXpv4_22.py   (swap, then tail call)
@program(462, 1071, lax=False)
def euclidean(a, b):
  if a < b:
    a, b = b, a
  r = a%b
  if r == 0:
    return b
  else:
    return euclidean(b, r)


# ---- sorting (tuple swaps on array items) ---------------------------------------------------

# odp31/sorting-algorithms  python/bubbleSort.py   (one-line change: `return arr`)
@program(VEC[:6])
def bubble_sort(arr):
  n = len(arr)
  for i in range(n):
    for j in range(0, n - i - 1):
      if arr[j] > arr[j+1]:
        arr[j], arr[j+1] = arr[j+1], arr[j]
  return arr


# nexttrack07/sorting  bubble_sort.py   (one-line change: `return arr`)
@program(VEC[:6])
def bubble_sort2(arr):  # named bubble_sort there
    # takes an array and sorts it in place
    # Time: O(n²) and Space: O(1)

    # loop over entire array from start
    # nested loop from start + 1
    # if current element > next element, swap

    for i in range(len(arr)):
        for j in range(i+1, len(arr)):
            if arr[i] > arr[j]:
                arr[j], arr[i] = arr[i], arr[j]
    return arr


# aneels3/Algorithm  selection_sort.py   (one-line change: `return arr`)
@program(VEC[:6])
def selectionSort(arr):
    # Traverse through all array elements
    for i in range(len(arr)):

        # Find the minimum element in remaining
        # unsorted array
        min_idx = i
        for j in range(i+1, len(arr)):
            if arr[min_idx] > arr[j]:
                min_idx = j

        # Swap the found minimum element with
        # the first element
        arr[i], arr[min_idx] = arr[min_idx], arr[i]
    return arr


# MimiRandomS/ALDA_algorithm_analysis  algorithms/insertion_sort.py   (one-line change: `return arr`)
@program(VEC[:6])
def insertion_sort(arr):
    n = len(arr)                        # O(1) # Assignation
    for i in range(1 , n):              # O(n) loop for in list
        key = arr[i]                    # O(1) Assignation
        j = i - 1                       # O(1) Assignation
        while j >= 0 and key < arr[j] : # O(n^2) because 1+2+3+⋯+(n−1) = ∑[n(n - 1)/2] loop in loop in list
            arr[j + 1] = arr[j]         # O(1) Assignation
            j -= 1                      # O(1) Subtraction
        arr[j + 1] = key                # O(1) Assignation
    return arr


# ---- dynamic programming --------------------------------------------------------------------

# sarangan/leet-code  053-Maximum-Subarray.md   (Kadane; builtin max on traced values)
@program(VEC[:6])
def max_subarray(A):
    max_ending_here = max_so_far = A[0]
    for x in A[1:]:
        max_ending_here = max(x, max_ending_here + x)
        max_so_far = max(max_so_far, max_ending_here)
    return max_so_far


# pabloschwarzenberg/grader  tema10_ej2/tema10_ej2_faa46230257dc2eed746a45427c53f26.py
# (Levenshtein over int sequences instead of strings; list-of-lists table, builtin min of three;
#  the table is written at a loop index, so static_range='lax' does not apply: lists are not arrays)
@program(INTS[:6], INTS[2:], lax=False)
def levenshtein(palabra1,palabra2):
    m = len(palabra1)
    n = len(palabra2)
    table = [[0] * (n+1) for k in range(m+1)]

    for i in range(m + 1):
        table[i][0] = i
    for j in range(n + 1):
        table [0][j] = j

    for i in range(1, m+1):
        for j in range(1, n + 1):
            if palabra1[i-1] == palabra2[j-1]:
                table[i][j] = table[i-1][j-1]
            else:
                table[i][j] = 1 + min(table[i-1][j], table[i][j-1], table[i-1][j-1])

    return table[-1][-1]


# ---- polynomials and quadrature -------------------------------------------------------------

# NikodemNowak/newton-chebyshev  horner.py   (static_range='lax': a Python list indexed by the
# traced loop index -> stacked)
@program(0.7, (2.0, -1.0, 0.5, 3.0, -2.0), static=(1,))
def horner(x, coeffs):
    result = coeffs[0]
    for i in range(1, len(coeffs)):
        result = result * x + coeffs[i]
    return result


# codyfrisby/coursera  python/horner.py
@program((2.0, -1.0, 0.5, 3.0, -2.0), 0.7, static=(0,))
def horner2(coeffs, x):  # named horner there
    acc = 0
    for c in reversed(coeffs):
        acc = acc * x + c
    return acc


# woraseth/numer  simpson.py   (builtin sum over generators)
@program(jnp.cos, 0.0, 1.5, 20, static=(0, 3), lax=False)
def simpson(fn, a, b, n):
  '''
  f : function
  a : number : start
  b : number : stop
  n : integer : must be even
  '''
  h = (b - a) / n
  sum1 = sum(fn(a + (2*i + 1)*h) for i in range(0, int(n/2)))
  sum2 = sum(fn(a + (2*i + 2)*h) for i in range(0, int(n/2) - 1))
  return (fn(a) + fn(b) + 4*sum1 + 2*sum2) * h / 3;


# motisoltani/Midpoint-and-2-point-Gauss-integration-Python  Midpoint.py
@program(jnp.exp, 0.0, 2.0, 50, static=(0, 1, 2, 3))
def midpoint(f, a, b, n):
    h = float(b-a)/n
    result = 0
    for i in range(n):
        result += f((a + h/2.0) + i*h)
    result *= h
    return result


# ---- ODE integrators ------------------------------------------------------------------------

# jakepper/Numerical-Analysis  src/differentiation/explicit_euler.py   (one-line change: `return Y`)
@program(f_decay, np.linspace(0, 2, 20).astype(np.float32), np.full(20, 1.5, np.float32), 0.1, 20, static=(0, 4))
def explicit_euler(f, T, Y, step, n, verbose=False):
    if verbose:
        print("%12s%12s%12s".format("step (k)", "y", "t"))
    y = Y[0]
    for k in range(n - 1):
        y += step * f(T[k], Y[k])
        Y[k + 1] = y
        if verbose:
            print("%12d%12f%12f".format(k, Y[k], T[k]))
    return Y


# Aymenmz/Python-For-Calculus  EquaDiff/RK4.py   (a Python list of states, item-assigned)
@program(lambda y, t: -0.5 * y + t, 0.0, 2.0, 1.0, 25, static=(0, 4), lax=False)
def RK4(f, a, b, y0, n):
    y = [y0] * n
    T = [a] * n
    h = (b - a) / n
    for i in range(0, n - 1, 1):
        y[i + 1] = y[i] + (h / 6 * (f(y[i], T[i]) + 4 * f(y[i] + h / 2 * f(y[i], T[i] + h / 2), T[i] + h / 2) +
                                    f(y[i] + h * f(y[i], T[i]), T[i] + h)))
        T[i + 1] = T[i] + h
    return y


def _np(a):
  return np.array(a) if isinstance(a, np.ndarray) else a


def _jax(a, i, static):
  return a if i in static or not isinstance(a, (np.ndarray, float, int)) else jnp.asarray(a)


def _close(got, want, tol=2e-4):
  lg, lw = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
  assert len(lg) == len(lw), (got, want)
  for a, b in zip(lg, lw):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol, atol=tol)


def test_enough_programs():
  assert len(PROGRAMS) >= 15


@pytest.mark.parametrize('fn, args, static, lax', PROGRAMS)
def test_public_program(fn, args, static, lax):
  want = fn(*[_np(a) for a in args])  # plain Python on NumPy / Python values
  jargs = [_jax(a, i, static) for i, a in enumerate(args)]
  for mode in ('python', 'lax') if lax else ('python',):
    conv = autograph(fn, static_range=mode)
    _close(jax.jit(conv, static_argnums=static)(*jargs), want)
  _close(autograph(fn)(*jargs), want)  # eager: concrete values run as Python


def test_newtraph_unchanged_raises():
  """The unchanged NewtRaph falls off its end (returns None) when it does not converge. Under
  jit that path is decided by a traced test: an AutographError at the `if`, not zeros."""
  from jaxform.autograph import AutographError

  # Aditbar/Elementary-My-Dear-Watson  Python/ModulDasar/ModulNewtRaph.py (as written there)
  def NewtRaph(f, df, x, eps = 1.0e-9):
      for i in range(30):
          dx = -f(x)/df(x)
          x = x + dx
          if abs(dx) < eps:
              return x, 1
      print("Too much\n")

  assert NewtRaph(f_cubic, df_cubic, 3.0, 1e-5)[1] == 1  # plain Python converges here
  _close(autograph(NewtRaph)(f_cubic, df_cubic, jnp.asarray(3.0), 1e-5), NewtRaph(f_cubic, df_cubic, 3.0, 1e-5))
  for mode in ('python', 'lax'):
    with pytest.raises(AutographError, match=r"(?s)'NewtRaph' returns \((weak )?float32\[\], (weak )?int32\[\]\) on some "
                                             r"paths but on others reaches its end.*if abs\(dx\) < eps:"):
      jax.jit(autograph(NewtRaph, static_range=mode), static_argnums=(0, 1))(f_cubic, df_cubic, 3.0, 1e-5)
