"""Lists and item assignment: `ys.append(v)` inside a traced loop body (the stacked outputs of the
scan), `xs[i]` with a traced index into a Python list, `x[i] = v` and `x[i] op= v` as `.at[i].set`."""
from __future__ import annotations

import operator
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .errors import AutographError, where as _where
from .runtime import _DEPTH, _describe, _is_dyn, is_traced


# ---- lists: append, indexing by a traced index -----------------------------------------

class _Collect:
  """A list appended to in a traced loop body, as the body sees it: only this iteration's
  new elements (they become stacked outputs of the scan). Reading it there is an error."""
  __slots__ = ('name', 'items')

  def __init__(self, name: str, items: list):
    self.name, self.items = name, items

  def __repr__(self):
    return f'<list {self.name} being collected: +{len(self.items)}>'

  def _fail(self, *a, **k):
    raise AutographError(f"list '{self.name}' is appended to in a traced loop, so inside the loop it only "
                         f"collects elements (they become a stacked output of the loop); it cannot be read, "
                         f"indexed or measured there. Keep the value you need in a separate variable "
                         f"(e.g. last = v; {self.name}.append(v))")

  def __getattr__(self, attr):
    if attr.startswith('__'):
      raise AttributeError(attr)
    self._fail()

  __len__ = __getitem__ = __iter__ = __bool__ = __add__ = __radd__ = _fail

  def _slot(self, idx, where):
    """`idx` as a position in this iteration's elements: only a static negative index reaches them
    (xs[-1] is the element just appended); anything else names elements of other iterations."""
    if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool) and -len(self.items) <= idx < 0:
      return len(self.items) + int(idx)
    at = f'\n  at {_where(*where)}' if where else ''
    raise AutographError(f"list '{self.name}' is appended to in a traced loop, so inside the loop only the "
                         f"elements this iteration appended can be assigned (xs[-1] = v after xs.append(...)); "
                         f"index {idx!r} reaches elements of other iterations{at}\n  fix: assign the value "
                         f"before appending it, or assign after the loop (or preallocate an array and "
                         f"assign xs = xs.at[i].set(v))")

  def set(self, idx, v, where=None):
    items = list(self.items)
    items[self._slot(idx, where)] = v
    return _Collect(self.name, items)

  def get(self, idx, where=None):
    return self.items[self._slot(idx, where)]


jax.tree_util.register_pytree_node(_Collect, lambda c: (c.items, (c.name, len(c.items))),
                                   lambda aux, items: _Collect(aux[0], list(items)))


def append(lst, v):
  """`lst.append(v)`, rebinding lst: in a traced loop body lst is a _Collect; while a traced
  branch / body is traced a list is copied, not mutated (tracing both sides of a traced `if`
  must not append twice); otherwise Python's in-place append."""
  if isinstance(lst, _Collect):
    return _Collect(lst.name, lst.items + [v])
  if type(lst) is list and _DEPTH[0]:
    return lst + [v]
  lst.append(v)
  return lst


class _Switch:
  """`fns[i]` with a traced i, for a list of callables: calling it is lax.switch(i, fns, ...)."""

  def __init__(self, i, fns):
    self.i, self.fns = i, list(fns)

  def __call__(self, *args):
    i = jnp.clip(jnp.asarray(self.i, jnp.int32), -len(self.fns), len(self.fns) - 1)
    return lax.switch(jnp.where(i < 0, i + len(self.fns), i), self.fns, *args)


def getitem(xs, i, where: tuple):
  """xs[i]. A Python list/tuple indexed by a traced index (a traced loop's counter): elements
  that are arrays / numbers / pytrees of one structure and shape are stacked and indexed
  (one dynamic slice; dtypes promote); callables give a _Switch. Out-of-range indices clamp."""
  if not (type(xs) in (list, tuple) and is_traced(i)):
    return xs[i]
  at = _where(*where)
  if not xs:
    raise AutographError(f'cannot index an empty {type(xs).__name__} by a traced index\n  at {at}')
  if all(callable(x) and not _is_dyn(x) for x in xs):
    return _Switch(i, xs)
  trees = [jax.tree_util.tree_structure(x) for x in xs]
  leaves = [jax.tree_util.tree_leaves(x) for x in xs]
  bad = next((k for k, t in enumerate(trees) if t != trees[0]), None)
  if bad is None:
    for k in range(len(leaves[0])):
      col = [l[k] for l in leaves]
      if not all(_is_dyn(c) for c in col) or len({jnp.shape(c) for c in col}) > 1:
        bad = next(j for j, c in enumerate(col) if not _is_dyn(c) or jnp.shape(c) != jnp.shape(col[0]))
        break
  if bad is not None:
    desc = lambda x: _describe(x) if _is_dyn(x) else f'{type(x).__name__} {jax.tree_util.tree_structure(x)}'
    raise AutographError(f'cannot index this {type(xs).__name__} by a traced index: element 0 is {desc(xs[0])} '
                         f'but element {bad} is {desc(xs[bad])} (a traced index needs elements of one shape, '
                         f'which are stacked into an array)\n  at {at}\n  fix: give the elements one shape '
                         f'and dtype, or keep the index a Python int (a static loop: static_range=\'python\')')
  cols = [jnp.stack([jnp.asarray(l[k]) for l in leaves]) for k in range(len(leaves[0]))]
  return jax.tree_util.tree_unflatten(trees[0], [c[i] for c in cols])


# ---- item assignment: x[i] = v, x[i] op= v -------------------------------------------

_AT = {'+': 'add', '-': 'subtract', '*': 'multiply', '/': 'divide', '**': 'power'}
_OPS = {'+': operator.add, '-': operator.sub, '*': operator.mul, '/': operator.truediv,
        '//': operator.floordiv, '%': operator.mod, '**': operator.pow, '@': operator.matmul,
        '&': operator.and_, '|': operator.or_, '^': operator.xor, '<<': operator.lshift, '>>': operator.rshift}
_IOPS = {'+': operator.iadd, '-': operator.isub, '*': operator.imul, '/': operator.itruediv,
         '//': operator.ifloordiv, '%': operator.imod, '**': operator.ipow, '@': operator.imatmul,
         '&': operator.iand, '|': operator.ior, '^': operator.ixor, '<<': operator.ilshift, '>>': operator.irshift}


def setitem(x, idx, v, where: tuple | None = None):
  """x[idx] = v; on a JAX array this is x.at[idx].set(v) and the caller rebinds x."""
  if isinstance(x, jax.Array):
    return x.at[idx].set(v)
  if isinstance(x, _Collect):
    return x.set(idx, v, where)
  if type(x) is list and is_traced(idx):
    return _list_set(x, idx, lambda old: v, where)
  if type(x) in (list, dict) and _DEPTH[0]:  # tracing a traced branch: never mutate (see append)
    x = x.copy()
  x[idx] = v
  return x


def setitem_op(x, idx, op: str, v, where: tuple | None = None):
  """x[idx] op= v."""
  if isinstance(x, jax.Array):
    m = _AT.get(op)
    return getattr(x.at[idx], m)(v) if m else x.at[idx].set(_OPS[op](x[idx], v))
  if isinstance(x, _Collect):
    return x.set(idx, _IOPS[op](x.get(idx, where), v), where)
  if type(x) is list and is_traced(idx):
    return _list_set(x, idx, lambda old: _IOPS[op](old, v), where)
  if type(x) in (list, dict) and _DEPTH[0]:
    x = x.copy()
  x[idx] = _IOPS[op](x[idx], v)
  return x


def _list_set(xs: list, i, new: Callable, where: tuple | None):
  """`xs[i] = new(xs[i])` on a Python list with a traced index: every element becomes a select between
  itself and the new value (the list stays a list, as in Python); elements must be arrays of one type."""
  at = f'\n  at {_where(*where)}' if where else ''
  n = len(xs)
  vals = [new(e) if _is_dyn(e) else None for e in xs]
  if not xs or any(v is None or jnp.shape(v) != jnp.shape(e) or jnp.result_type(v) != jnp.result_type(e)
                   for v, e in zip(vals, xs)):
    raise AutographError(f'cannot assign into this list at a traced index: it needs elements that are arrays of '
                         f'the assigned value\'s shape and dtype{at}\n  fix: stack the list into an array first '
                         f'(xs = jnp.stack(xs); xs = xs.at[i].set(v)), or keep the index a Python int')
  k = jnp.where(i < 0, i + n, i)   # Python's negative indices
  out = [jnp.where(k == j, v, e) for j, (v, e) in enumerate(zip(vals, xs))]
  if _DEPTH[0]:
    return out
  xs[:] = out
  return xs
