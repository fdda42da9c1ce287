"""What every autograph operator shares: the static `Info` record of a converted statement,
undefined variables (`Undefined`, `retval`, `checked`), the depth of traced regions, and tracing
a branch or loop body to a jaxpr (`_trace`, `_run`)."""
from __future__ import annotations

import linecache
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .errors import AutographError, error, where


class Info(NamedTuple):
  """Static facts about one converted statement (emitted as a constant by convert.py)."""
  kind: str             # 'if' | 'for' | 'while'
  file: str
  line: int
  names: tuple          # variables the statement may assign
  live: tuple           # ... of which live after it
  head: tuple           # ... of which live at the loop head (loops), incl. `live`
  entry: tuple          # ... of which read in the body before being assigned (loops)
  flags: tuple          # 'raise', 'try', 'contains-try', 'yield'
  zero_ok: tuple        # names that may be zero-filled (the lowered return value)
  stop: tuple = ()      # the loop's break/return flags: False whenever its body starts
  appends: tuple = ()   # lists the loop body appends to (`ys.append(v)`)
  ret: tuple = ()       # (return flag, return value, function name, its returns, end line) or ()
  implied: tuple = ()   # flags known True in the else branch (of a guard `if not flag:`)


# ---- undefined variables ---------------------------------------------------------------

class Undefined:
  """Value of a local that has not been assigned yet (Python would raise UnboundLocalError)."""
  __slots__ = ('name',)

  def __init__(self, name: str):
    self.name = name

  def __repr__(self):
    return f'<undefined {self.name}>'

  def _fail(self, *a, **k):
    raise AutographError(f"local variable '{self.name}' is used before it is assigned "
                         f"(it is not assigned on every path that reaches this use)")

  def __getattr__(self, attr):
    if attr.startswith('__'):  # protocol probes (copy, hasattr(x, '__array__'), ...)
      raise AttributeError(attr)
    self._fail()

  __bool__ = __call__ = __iter__ = __len__ = __getitem__ = __index__ = _fail
  __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = _fail
  __neg__ = __lt__ = __le__ = __gt__ = __ge__ = _fail


jax.tree_util.register_pytree_node(Undefined, lambda u: ((), u.name), lambda name, _: Undefined(name))


_SPLIT: dict = {}  # function (file + ret record) -> line of the last traced `if` that returned on one side only


def _returns(file: str, ret: tuple) -> str:
  """The function's return statements, for messages: `line 6: return x * 2`."""
  out = [f'line {line}: {linecache.getline(file, line).strip() or "return"}' for line, _, fall in ret[3] if not fall]
  return '; '.join(out) or 'none'


def _kind(v) -> str:
  """A returned value's structure with shapes: None, float32[], (float32[3], weak int32[])."""
  if v is None:
    return 'None'
  if isinstance(v, (tuple, list)):
    inner = ', '.join(map(_kind, v)) + (',' if isinstance(v, tuple) and len(v) == 1 else '')
    return f'({inner})' if isinstance(v, tuple) else f'[{inner}]'
  if isinstance(v, dict):
    return '{' + ', '.join(f'{k!r}: {_kind(x)}' for k, x in v.items()) + '}'
  if _is_dyn(v) or isinstance(v, jax.ShapeDtypeStruct):
    return _describe(v)
  return type(v).__name__


def retval(v, flag=False, ret: tuple = ()):
  """Value of the lowered return variable at the end of the function: None when the
  function fell off its end. A traced flag means that whether a `return` ran depends on a
  traced value: a value on some paths and None (falling off) on others cannot be traced."""
  if isinstance(v, Undefined):
    return None
  if ret and v is not None and is_traced(flag):
    file, name, end = ret[0], ret[3], ret[5]
    at = _SPLIT.get(ret)
    cond = 'this traced condition' if at else f"a traced condition or loop in '{name}'"
    raise AutographError(
        f"'{name}' returns {_kind(v)} on some paths but on others reaches its end (after line {end}) without a "
        f"`return`, where Python returns None; which path is taken depends on {cond}, and a traced function "
        f"returns one structure on every path\n"
        f"  at {where(file, at or end)}\n"
        f"  its returns: {_returns(file, ret[1:])}\n"
        f"  fix: end every path with a `return` of the same structure, shape and dtype (e.g. add "
        f"`return <default value>` at the end of '{name}', or an `else:` that returns), or make the condition "
        f"a Python value (static)")
  return v


def checked(v, file: str, line: int):
  """A returned value must not contain an unassigned local (Python: UnboundLocalError)."""
  for leaf in jax.tree_util.tree_leaves(v, is_leaf=lambda x: isinstance(x, Undefined)):
    if isinstance(leaf, Undefined):
      raise AutographError(f"local variable '{leaf.name}' is returned but was not assigned on the path "
                           f"taken (Python would raise UnboundLocalError)\n  at {where(file, line)}\n"
                           f"  fix: assign '{leaf.name}' on every path before this return")
  return v


# ---- traced regions ----------------------------------------------------------------------

_DEPTH = [0]  # how many traced branches / loop bodies are being traced right now


class _traced_region:
  """Marks the tracing of a traced `if` / loop body: recursion entered there cannot stop at
  trace time, and `append` there must not mutate the user's list (the trace is not a run)."""

  def __enter__(self):
    _DEPTH[0] += 1

  def __exit__(self, *exc):
    _DEPTH[0] -= 1


def depth() -> int:
  return _DEPTH[0]


# ---- helpers ---------------------------------------------------------------------------

def is_traced(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def _is_dyn(leaf) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))


def _aval(x):
  return x if isinstance(x, jax.ShapeDtypeStruct) else jax.typeof(x)


def _same_static(a, b) -> bool:
  if a is b:
    return True
  try:
    return type(a) is type(b) and bool(a == b)
  except Exception:
    return False


def _pred(p, info: Info):
  p = jnp.asarray(p)
  if p.shape != ():
    raise error(info, f'the condition of this `{info.kind}` is a traced array of shape {p.shape}, '
                      f'not a scalar', 'reduce it with jnp.any(...) / jnp.all(...), or use '
                      'jnp.where(cond, a, b) for an elementwise choice')
  return p if p.dtype == jnp.bool_ else p != 0


def _trace(fn: Callable, state: tuple, extra=(), py: dict | None = None):
  """Abstractly run fn(state, *extra) -> state. Returns the output state with array
  leaves as ShapeDtypeStruct and non-array leaves as they are; `py` receives the output
  state's entries that are Python bools (by index)."""
  leaves, tree = jax.tree_util.tree_flatten(state)
  dyn = [i for i, l in enumerate(leaves) if _is_dyn(l)]
  box = {}

  def f(dyn_vals, extra):
    ls = list(leaves)
    for i, v in zip(dyn, dyn_vals):
      ls[i] = v
    res = fn(jax.tree_util.tree_unflatten(tree, ls), *extra)
    if py is not None:
      py.update({i: v for i, v in enumerate(res) if type(v) is bool})
    out_leaves, box['tree'] = jax.tree_util.tree_flatten(res)
    box['static'] = [None if _is_dyn(l) else l for l in out_leaves]
    return [l for l in out_leaves if _is_dyn(l)]

  avals = iter(jax.eval_shape(f, [leaves[i] for i in dyn], extra))
  out = [next(avals) if s is None else s for s in box['static']]
  return jax.tree_util.tree_unflatten(box['tree'], out)


def _trace_closed(fn: Callable):
  """Trace fn() -> state once: (output state with array leaves as ShapeDtypeStruct,
  ClosedJaxpr computing those array leaves). Python bools stay Python values (the `if`
  keeps a flag static when both branches set it alike, e.g. `do_return = True`)."""
  box = {}

  def f():
    out_leaves, box['tree'] = jax.tree_util.tree_flatten(fn())
    box['static'] = [None if _is_dyn(l) and type(l) is not bool else l for l in out_leaves]
    return [l for l, s in zip(out_leaves, box['static']) if s is None]

  closed = jax.make_jaxpr(f)()
  avals = iter(jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in closed.out_avals)
  out = [next(avals) if s is None else s for s in box['static']]
  return jax.tree_util.tree_unflatten(box['tree'], out), closed


def _describe(leaf) -> str:
  if _is_dyn(leaf) or isinstance(leaf, jax.ShapeDtypeStruct):
    a = _aval(leaf)
    return ('weak ' if getattr(a, 'weak_type', False) else '') + f"{a.dtype.name}[{','.join(map(str, a.shape))}]"
  return repr(leaf)


def _run(fn, info: Info, *args, get_state=None, set_state=None):
  """Run a traced branch / body; a `raise` reached while tracing is a user error to teach.
  With get/set_state (a loop body): the stop flags are known False when a body starts
  (the loop test checked them), so they enter as Python False and stay static until set
  (`brk = True` then becomes a cheap select, not a select of a carried flag)."""
  if info.stop and set_state is not None:
    set_state(tuple(False if n in info.stop else v for n, v in zip(info.names, get_state())))
  try:
    return fn(*args)
  except AutographError as e:
    if '\n  at ' in str(e):
      raise
    raise error(info, str(e), 'see above') from e  # an error without a place: give it this statement's line
  except Exception as e:
    if 'raise' in info.flags:
      raise error(info, f'a `raise` inside this `{info.kind}` ran while tracing it on a traced '
                        f'condition ({type(e).__name__}: {e})', 'move the check out of the traced '
                        'control flow, or use jax.experimental.checkify.check') from e
    raise


# ---- statements kept as Python (inside try, generators) --------------------------------

def _kept_reason(info: Info) -> tuple[str, str]:
  if 'yield' in info.flags:
    return ('it is in a generator (uses `yield`), and a traced loop cannot yield',
            'collect results in an array instead of yielding, or make the condition static')
  if 'try' in info.flags:
    return ('it is inside a `try` block: an exception in a traced branch happens at trace time, '
            'whatever the condition', 'move the `try` out of the function or make the condition static')
  return ('it contains a `try` block, which cannot run inside lax control flow',
          'move the `try` out of this statement or make the condition static')


def static_test(x, info: tuple):
  if is_traced(x):
    info = Info(*info)
    why, fix = _kept_reason(info)
    raise error(info, f'this `{info.kind}` depends on a traced value but cannot be converted: {why}', fix)
  return x
