"""`if` statements, conditional expressions and `and` / `or` / `not`: `lax.cond` (or a select)
when the predicate is traced, plain Python otherwise. Each branch is traced once; its abstract
outputs decide which variables are outputs and name the one whose branches disagree."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun

from .. import _jax
from .errors import AutographError, error
from .runtime import (Info, Undefined, _SPLIT, _aval, _describe, _kind, _pred, _returns, _run, _same_static,
                      _trace_closed, _traced_region, is_traced)
from .lists import _Collect


# ---- if ------------------------------------------------------------------------------

_MOVES = {'convert_element_type', 'broadcast_in_dim', 'copy', 'copy_p', 'reshape', 'squeeze'}


def _moves_only(closed) -> bool:
  """A branch that only moves/casts values (flags, `idx = i`) computes nothing that could
  be expensive or produce NaN/inf on the untaken side, so both sides may run."""
  return not closed.effects and all(e.primitive.name in _MOVES for e in closed.jaxpr.eqns)


def if_stmt(pred, body: Callable, orelse: Callable, get_state: Callable, set_state: Callable, info: tuple):
  if not is_traced(pred):
    return body() if pred else orelse()
  info = Info(*info)
  p = _pred(pred, info)
  init = get_state()

  def traced(fn, implied=()):  # one trace of the branch: its abstract output state and its jaxpr
    def g():
      set_state(tuple(True if n in implied else v for n, v in zip(info.names, init)))
      _run(fn, info)
      return get_state()
    return _trace_closed(g)

  try:
    with _traced_region():
      (out_t, jaxpr_t), (out_f, jaxpr_f) = traced(body), traced(orelse, info.implied)
  finally:
    set_state(init)
  outs = (out_t, out_f)
  plan = {}  # name index -> (treedef, [static value | dtype])
  for i, name in enumerate(info.names):
    a, b = outs[0][i], outs[1][i]
    ua, ub = isinstance(a, Undefined), isinstance(b, Undefined)
    if name not in info.live or (ua and ub):
      continue
    if ua or ub:
      if name not in info.zero_ok:
        raise error(info, f"variable '{name}' is assigned only in the {'else' if ua else 'if'} branch of "
                          f"this `if` on a traced condition, but it is used after the `if`",
                    f"assign '{name}' before the `if` or in both branches (with the same shape and dtype)")
      a = b if ua else a
      b = a
      if info.ret and name == info.ret[1] and a is not None and 'guard' not in info.flags:
        _SPLIT[(info.file,) + info.ret] = info.line  # returns on one side only: named if it falls off later
    ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    if info.ret and name == info.ret[1] and ta != tb:
      raise _return_kinds(info, a, b)
    what = 'return value' if name in info.zero_ok else f"variable '{name}'"
    if ta != tb and (isinstance(a, (list, _Collect)) or name in info.zero_ok):
      na, nb = (len(v.items) if isinstance(v, _Collect) else len(v) if isinstance(v, list) else -1 for v in (a, b))
      if na >= 0 and nb >= 0 and na != nb:
        raise error(info, f"list '{name}' gets {na} element(s) in the if branch but {nb} in the else branch "
                          f"of this `if` on a traced condition: its length would depend on a traced value",
                    f"append the same number of elements in both branches (e.g. {name}.append(jnp.where(cond, a, b))), "
                    f"or write into a preallocated array")
    if ta != tb:
      raise error(info, f'{what} has a different structure in the two branches of this `if` on a '
                        f'traced condition: {ta} vs {tb}', 'make both branches produce the same kind of value')
    spec = []
    for x, y in zip(la, lb):
      dx, dy = isinstance(x, jax.ShapeDtypeStruct), isinstance(y, jax.ShapeDtypeStruct)
      if not dx and not dy and _same_static(x, y):
        spec.append(('s', x))
        continue
      x, y = _bool_sds(x), _bool_sds(y)  # Python bools that differ (or meet an array) become arrays
      dx, dy = isinstance(x, jax.ShapeDtypeStruct), isinstance(y, jax.ShapeDtypeStruct)
      if dx and dy and x.shape == y.shape:
        # weakly typed only if weak on both sides, as lax.cond does (a Python `scale = 2.0` in both branches
        # stays weak: bf16 activations * scale stay bf16, as in Python and under a hand-written lax.cond)
        weak = bool(getattr(x, 'weak_type', False) and getattr(y, 'weak_type', False))
        spec.append(('d', (x.shape, x.dtype if x.dtype == y.dtype else jnp.result_type(_promo(x), _promo(y)), weak)))
      else:
        raise error(info, f'{what} is {_describe(x)} in the if branch but {_describe(y)} in the else '
                          f'branch of this `if` on a traced condition',
                    'make both branches give it the same shape (dtypes may differ only by promotion)')
    plan[i] = (ta, spec)

  def emit(closed, out):  # replay the branch's jaxpr; keep, cast or zero-fill the plan's outputs
    vals = iter(jaxpr_as_fun(closed)())
    leaves, tree = jax.tree_util.tree_flatten(out)
    st = jax.tree_util.tree_unflatten(tree, [next(vals) if isinstance(l, jax.ShapeDtypeStruct) else l for l in leaves])
    res = []
    for i, (_, spec) in plan.items():
      ls = [None] * len(spec) if isinstance(st[i], Undefined) else jax.tree_util.tree_leaves(st[i])
      res += [_typed(jnp.zeros(sd[0], sd[1]) if v is None else v, sd[1], sd[2])
              for v, (k, sd) in zip(ls, spec) if k == 'd']
    return res

  if _moves_only(jaxpr_t) and _moves_only(jaxpr_f):  # flags / assignments: a select is cheaper and safe
    res = iter([jnp.where(p, a, b) for a, b in zip(emit(jaxpr_t, out_t), emit(jaxpr_f, out_f))])
  else:
    res = iter(lax.cond(p, lambda: emit(jaxpr_t, out_t), lambda: emit(jaxpr_f, out_f)))
  final = list(init)
  for i, (tree, spec) in plan.items():
    final[i] = jax.tree_util.tree_unflatten(tree, [next(res) if k == 'd' else v for k, v in spec])
  for i, name in enumerate(info.names):
    if i not in plan:
      final[i] = init[i] if name not in info.live else Undefined(name)
  set_state(tuple(final))


def _typed(v, dtype, weak: bool):
  """v as an array of dtype, weakly typed or not (jnp.asarray with a dtype always makes it strong)."""
  v = jnp.asarray(v, dtype)
  return _jax.with_weak_type(v, True) if weak and not _aval(v).weak_type else v


def _promo(a):
  """A stand-in for type promotion: a weakly typed value promotes as a Python scalar of its kind."""
  a = _aval(a)
  if not getattr(a, 'weak_type', False):
    return np.zeros((), a.dtype)
  return {'b': False, 'i': 0, 'u': 0, 'f': 0.0, 'c': 0j}.get(np.dtype(a.dtype).kind, np.zeros((), a.dtype))


def _bool_sds(v):
  return jax.ShapeDtypeStruct((), jnp.bool_) if type(v) is bool else v


def _return_kinds(info: Info, a, b) -> AutographError:
  """The two sides of a traced `if` return different kinds of values (None / a value /
  another structure): one traced program cannot return both."""
  name = info.ret[2]
  if 'guard' in info.flags:  # `if not do_return: <rest>`: else = an earlier return ran
    sides = (f'{_kind(b)} where an earlier `return` ran but {_kind(a)} on the path that continues here; '
             f'whether that `return` ran depends on a traced condition')
  else:
    sides = f'{_kind(a)} in the if branch but {_kind(b)} in the else branch of this `if` on a traced condition'
  none = '. A bare `return`, or reaching the end of the function, returns None' if a is None or b is None else ''
  return error(info, f"'{name}' returns {sides}, and a traced function returns one structure on every path{none}"
                     f"\n  its returns: {_returns(info.file, info.ret)}",
               'return values of the same structure, shape and dtype on every path (an explicit '
               '`return <value>` instead of a bare `return` or falling off the end), or make the condition a '
               'Python value (static)')


def if_exp(pred, a: Callable, b: Callable):
  """`a() if pred else b()`; traced pred -> lax.cond with dtype promotion between the arms."""
  if not is_traced(pred):
    return a() if pred else b()
  p = _pred(pred, Info('if', '<expression>', 0, (), (), (), (), (), ()))
  with _traced_region():
    ta, tb = jax.eval_shape(a), jax.eval_shape(b)
    dt = jax.tree_util.tree_map(lambda x, y: jnp.result_type(_aval(x), _aval(y)), ta, tb)
    cast = lambda f: lambda: jax.tree_util.tree_map(lambda v, d: jnp.asarray(v, d), f(), dt)
    return lax.cond(p, cast(a), cast(b))


# ---- expressions ---------------------------------------------------------------------

def and_(a: Callable, b: Callable):
  x = a()
  if is_traced(x):
    return jnp.logical_and(x, b())
  return b() if x else x


def or_(a: Callable, b: Callable):
  x = a()
  if is_traced(x):
    return jnp.logical_or(x, b())
  return x if x else b()


def not_(x):
  return jnp.logical_not(x) if is_traced(x) else not x
