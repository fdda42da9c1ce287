"""AutoGraph for JAX: write Python if/for/while and x[i] = y; get lax control flow under jit.

    @jaxform.autograph
    def f(x, n):
      for i in range(n):          # traced n -> lax.while_loop; static n -> Python loop
        if x[i] > 0:              # traced predicate -> lax.cond
          x[i] = 0.0              # -> x = x.at[i].set(0.0)
      return x
"""
from __future__ import annotations

import functools
import types
from typing import Callable

from . import convert as _convert
from .errors import AutographError

__all__ = ['autograph', 'AutographError']


def autograph(fn: Callable | None = None, *, recursive: bool = False, static_range: str = 'python') -> Callable:
  """Convert fn's Python control flow to dispatch-at-run-time lax control flow.

  recursive=True also converts the user functions fn calls (not JAX/NumPy/library code).
  static_range='lax' turns `for i in range(<python ints>)` into lax.scan too (compact
  programs, reverse-mode differentiable) instead of unrolling it as Python does.
  The result is a plain Python function: wrap it in jax.jit / grad / vmap as usual."""
  if fn is None:
    return functools.partial(autograph, recursive=recursive, static_range=static_range)
  if isinstance(fn, types.MethodType):
    return types.MethodType(autograph(fn.__func__, recursive=recursive, static_range=static_range), fn.__self__)
  if getattr(fn, '__autograph__', False):
    fn = fn.__wrapped__  # converting again with (maybe) other options starts from the source
  if not isinstance(fn, types.FunctionType):
    raise AutographError(f'autograph converts Python functions; got {type(fn).__name__}. '
                         f'Decorate the function (or the __call__ method) instead')
  return _convert.convert(fn, recursive=recursive, static_range=static_range)
