"""Calls in converted code: Python builtins (`len`, `min`, `max`, `abs`, ...) on traced values, and
the run-time side of self-recursion (`is_self`, `check_self`, `recurse`; the AST side is recursion.py)."""
from __future__ import annotations

import builtins
import functools

import jax
import jax.numpy as jnp

from .errors import AutographError, where as _where
from .runtime import _DEPTH, is_traced


# ---- builtins on traced values -----------------------------------------------------------

def _any_traced(*xs) -> bool:
  return any(is_traced(l) for l in jax.tree_util.tree_leaves(xs))


def builtin(fn, name: str, where: tuple, *args, **kwargs):
  """min / max / abs / sum / len / range, called by name: the Python builtin unless an
  argument is traced (and the name still means the builtin)."""
  if fn is not getattr(builtins, name) or not _any_traced(args, kwargs):
    return fn(*args, **kwargs)
  fail = lambda msg, fix: AutographError(f'{msg}\n  at {_where(*where)}\n  fix: {fix}')
  if name in ('min', 'max'):
    if kwargs:
      raise fail(f'{name}(..., {", ".join(kwargs)}=...) on traced values is not converted',
                 f'use jnp.{name} / jnp.arg{name} with jnp.where')
    red = jnp.minimum if name == 'min' else jnp.maximum
    if len(args) == 1:
      (it,) = args
      if is_traced(it):
        return (jnp.min if name == 'min' else jnp.max)(it, axis=0)
      args = tuple(it)
    if not args:
      raise fail(f'{name}() of an empty sequence', 'pass at least one value')
    return functools.reduce(red, args)
  if name == 'sum':
    if len(args) >= 1 and is_traced(args[0]) and args[0].ndim >= 1:
      x = args[0]
      start = args[1] if len(args) > 1 else kwargs.get('start', 0)
      total = jnp.sum(x, axis=0, dtype=None if x.dtype == jnp.bool_ else x.dtype)
      return total if isinstance(start, int) and start == 0 and not isinstance(start, bool) else start + total
    return fn(*args, **kwargs)
  if name == 'range':
    raise fail('range() with a traced bound outside a `for` header: its length would be a traced value',
               'loop over it directly (`for i in range(n):` becomes a while_loop), or use jnp.arange with a '
               'static size and a mask')
  return fn(*args, **kwargs)  # abs, len: JAX arrays implement them


# ---- recursion -------------------------------------------------------------------------------

def is_self(f, me) -> bool:
  """Does the name a self-call uses still refer to the converted function `me`?"""
  orig = me.__wrapped__
  return f is me or f is orig or getattr(f, '__wrapped__', None) is orig


def check_self(f, me, where: tuple):
  if not is_self(f, me):
    raise AutographError(f"'{me.__name__}' no longer names this function, but autograph turned its tail "
                         f"call into a loop when converting it\n  at {_where(*where)}\n  fix: do not rebind "
                         f"'{me.__name__}', or convert the function again after rebinding")


def recurse(me, frame: int, where: tuple, f, *args, **kwargs):
  """A self-call that is not a tail call. On Python values it recurses (into the converted
  function); under a traced condition entered in this activation it cannot terminate."""
  if not is_self(f, me):
    return f(*args, **kwargs)
  msg = (f"recursive call to '{me.__name__}' under a traced condition: both sides of a traced `if` are "
         f"traced, so the recursion cannot stop at trace time\n  at {_where(*where)}\n  fix: make it a tail call "
         f"(`return {me.__name__}(...)` as the last step; autograph turns tail recursion into a while loop), "
         f"write it as a loop, or make the condition depend only on Python values (static_argnums)")
  if _DEPTH[0] > frame and _any_traced(args, kwargs):
    raise AutographError(msg)
  try:
    return me(*args, **kwargs)
  except RecursionError as e:
    if _any_traced(args, kwargs):
      raise AutographError(msg) from None
    raise
