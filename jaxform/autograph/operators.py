"""Runtime operators the converted code calls (imported there as `ag__`).

Dispatch happens at run time, like TensorFlow AutoGraph: an `if` whose predicate is a
Python value (or a concrete array) runs as plain Python; a traced predicate becomes
`lax.cond`. Loops likewise become `lax.scan` / `lax.while_loop` only when the iterable
or loop test is traced. The variables a statement may change are reached through
`get_state()` / `set_state(values)` closures (the converter makes them `nonlocal`);
the static `info` record says which of them are live afterwards, so only those are
branch outputs / loop carries.

Each branch is traced once to a jaxpr whose abstract outputs decide the plan (which
variables are outputs, their dtypes, zero-fill for a lowered `return` value) and name
the offending variable when branches disagree; the jaxprs are then replayed inside
`lax.cond` (or a select). A loop body is first traced abstractly (`jax.eval_shape`) to
fix the carry and catch a carry that changes shape or dtype.
"""
from __future__ import annotations

import builtins
import functools
import operator
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import jaxpr_as_fun

from .. import _jax
from .errors import AutographError, error


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
  import linecache
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
    from .errors import where
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
      from .errors import where
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


# ---- loops ---------------------------------------------------------------------------

def _noop():
  pass


def _loop_plan(info: Info, init: tuple, step: Callable, extra, skip=(), first: dict | None = None):
  """Which variables a traced loop carries, with initial values; checks the carry keeps
  its structure, shape and dtype (weakly typed Python scalars are promoted once).
  `skip`: lists collected by `append` (stacked outputs, not carries); `first` receives
  the Python bools the first iteration leaves (a `return` it always runs)."""
  state = list(init)
  carried = [i for i, n in enumerate(info.names) if n in info.head and i not in skip]
  for i, name in enumerate(info.names):
    if isinstance(state[i], Undefined) and name in info.entry:
      raise error(info, f"variable '{name}' is read in this traced `{info.kind}` loop before it is "
                        f"assigned, and it is not defined before the loop",
                  f"initialize '{name}' before the loop (with the shape and dtype it has in the loop)")
  for k in range(4):
    out = _trace(step, tuple(state), extra, first if k == 0 else None)
    changed, keep = False, []
    for i in carried:
      name, a, b = info.names[i], state[i], out[i]
      if isinstance(a, Undefined):
        if isinstance(b, Undefined):
          continue
        state[i] = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, jax.ShapeDtypeStruct) else s, b)
        changed = True
        keep.append(i)
        continue
      ta, tb = jax.tree_util.tree_structure(a), jax.tree_util.tree_structure(b)
      if ta != tb:
        raise error(info, f"loop-carried variable '{name}' changes structure in this traced "
                          f"`{info.kind}` loop: {ta} before, {tb} after one iteration",
                    f"keep '{name}' the same kind of value in every iteration")
      la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
      new = []
      for x, y in zip(la, lb):
        if not _is_dyn(x):
          if isinstance(y, jax.ShapeDtypeStruct) or not _same_static(x, y):
            raise error(info, f"loop-carried variable '{name}' is {_describe(x)} before this traced "
                              f"`{info.kind}` loop but becomes {_describe(y)}",
                        f"make '{name}' an array before the loop or keep it constant in the loop")
          new.append(x)
          continue
        ax = _aval(x)
        if ax.shape != y.shape or (ax.dtype != y.dtype and not ax.weak_type):
          raise error(info, f"loop-carried variable '{name}' has type {_describe(x)} before this traced "
                            f"`{info.kind}` loop but {_describe(y)} after one iteration",
                      f"keep the shape and dtype of '{name}' fixed: pre-allocate it at its final size "
                      f"(e.g. jnp.zeros(...)) or cast it before the loop (.astype(...))")
        if ax.dtype != y.dtype:
          x, changed = jnp.asarray(x, y.dtype), True
        new.append(x)
      state[i] = jax.tree_util.tree_unflatten(ta, new)
      keep.append(i)
    carried = keep
    if not changed:
      return state, carried
  raise error(info, 'the loop carry does not settle on fixed dtypes', 'cast the loop variables before the loop')


class _Carry:
  """Packs the carried variables' array leaves into a flat list for lax and back."""

  def __init__(self, state: list, carried: list):
    self.base, self.carried = list(state), carried
    self.trees = {i: jax.tree_util.tree_flatten(state[i]) for i in carried}

  def pack(self, state) -> list:
    out = []
    for i in self.carried:
      leaves, _ = jax.tree_util.tree_flatten(state[i])
      for v, ref in zip(leaves, self.trees[i][0]):
        if _is_dyn(ref):   # a weakly typed start (`s = 1.0`) stays weak, as lax loops keep it
          out.append(_typed(v, _aval(ref).dtype, _aval(ref).weak_type and _aval(v).weak_type))
    return out

  def unpack(self, flat) -> tuple:
    st, it = list(self.base), iter(flat)
    for i in self.carried:
      leaves, tree = self.trees[i]
      st[i] = jax.tree_util.tree_unflatten(tree, [next(it) if _is_dyn(l) else l for l in leaves])
    return tuple(st)


def _finish(set_state, info: Info, init: tuple, carry: _Carry, flat):
  st = list(carry.unpack(flat))
  for i, name in enumerate(info.names):
    if i not in carry.carried:
      st[i] = init[i]
  set_state(tuple(st))


def while_stmt(test: Callable, body: Callable, get_state: Callable, set_state: Callable, info: tuple):
  while True:
    t = test()
    if is_traced(t):
      return _while_lax(test, body, get_state, set_state, Info(*info))
    if not t:
      return
    body()


def _collected(info: Info, state) -> list:
  """Indices of the lists this loop appends to (they become stacked outputs)."""
  return [i for i, n in enumerate(info.names) if n in info.appends and isinstance(state[i], (list, _Collect))]


def _no_collect(info: Info, state, why: str):
  for i in _collected(info, state):
    name = info.names[i]
    raise error(info, f"list '{name}' is appended to in this traced `{info.kind}` loop, {why}: the number "
                      f"of elements would be a traced value",
                f"iterate over an array or a static range (no break/return) to get '{name}' as a stacked "
                f"output, or preallocate '{name} = jnp.zeros((max_len, ...))' and assign '{name}[i] = ...'")


def _while_lax(test, body, get_state, set_state, info: Info):
  init = get_state()
  _no_collect(info, init, 'whose trip count is traced')
  with _traced_region():
    _while_lax_traced(test, body, get_state, set_state, info, init)


def _while_lax_traced(test, body, get_state, set_state, info: Info, init):

  def step(state):
    set_state(state)
    _run(body, info, get_state=get_state, set_state=set_state)
    return get_state()

  try:
    state, carried = _loop_plan(info, init, step, ())
    carry = _Carry(state, carried)

    def cond_fn(flat):
      set_state(carry.unpack(flat))
      return _pred(test(), info)

    def body_fn(flat):
      return carry.pack(step(carry.unpack(flat)))

    out = lax.while_loop(cond_fn, body_fn, carry.pack(state))
  except BaseException:
    set_state(init)
    raise
  _finish(set_state, info, init, carry, out)


class _Iter:
  """A loop iterable with a traced part: `length()` iterations, `arrays` scanned over the
  leading axis, `item(i, slices)` the loop target at index i (`indexed`: item uses i)."""
  arrays: list
  indexed = True


class _ArrayIter(_Iter):
  indexed = False

  def __init__(self, x):
    self.x, self.arrays = x, [x]

  def length(self):
    return self.x.shape[0]

  def item(self, i, sl):
    return sl[0]


class _RangeIter(_Iter):
  def __init__(self, start, stop, step):
    self.start, self.stop, self.step, self.arrays = start, stop, step, []

  def length(self):
    if not any(map(is_traced, (self.start, self.stop, self.step))):
      return len(range(self.start, self.stop, self.step))
    d, st = jnp.asarray(self.stop) - jnp.asarray(self.start), self.step
    if isinstance(st, int):
      n = d if st == 1 else (d + st - 1) // st if st > 0 else (d + st + 1) // st
    else:
      n = jnp.where(st > 0, (d + st - 1) // st, (d + st + 1) // st)
    return jnp.maximum(n, 0).astype(jnp.int32)

  def item(self, i, sl):
    i = i if isinstance(self.step, int) and self.step == 1 else i * self.step
    return i if isinstance(self.start, int) and self.start == 0 else self.start + i


class _EnumerateIter(_Iter):
  def __init__(self, inner, start):
    self.inner, self.start, self.arrays = inner, start, inner.arrays

  def length(self):
    return self.inner.length()

  def item(self, i, sl):
    return (self.start + i, self.inner.item(i, sl))


class _ZipIter(_Iter):
  def __init__(self, inners):
    self.inners = inners
    self.arrays = [a for it in inners for a in it.arrays]
    self.indexed = any(it.indexed for it in inners)

  def length(self):
    ns = [it.length() for it in self.inners]
    return min(ns) if all(isinstance(n, int) for n in ns) else functools.reduce(jnp.minimum, ns)

  def item(self, i, sl):
    out, k = [], 0
    for it in self.inners:
      out.append(it.item(i, sl[k:k + len(it.arrays)]))
      k += len(it.arrays)
    return tuple(out)


def _as_iter(x):
  """The traced-iteration view of x, or None when x iterates as plain Python."""
  if isinstance(x, _Iter):
    return x
  if is_traced(x):
    if x.ndim == 0:
      raise AutographError('cannot iterate over a 0-d traced array')
    return _ArrayIter(x)
  return None


def range_(fn, *args, lax_: bool = False):
  """range(...) in a `for` header: a Python range unless a bound is traced (or the
  function asked for lax loops over static ranges too)."""
  if fn is not builtins.range:
    return fn(*args)
  if not lax_ and not any(map(is_traced, args)):
    return range(*(operator.index(a) for a in args))
  start, stop, step = (0, args[0], 1) if len(args) == 1 else (*args, 1)[:3]
  return _RangeIter(start, stop, step)


def enumerate_(fn, it, start=0):
  inner = _as_iter(it)
  if fn is not builtins.enumerate or inner is None:
    return fn(it, start)
  return _EnumerateIter(inner, start)


def zip_(fn, *its):
  views = [_as_iter(i) for i in its]
  if fn is not builtins.zip or all(v is None for v in views):
    return fn(*its)
  return _ZipIter([v if v is not None else _ArrayIter(jnp.asarray(i)) for v, i in zip(views, its)])


def for_stmt(iterable, extra_test: Callable | None, body: Callable, get_state: Callable,
             set_state: Callable, info: tuple):
  it = _as_iter(iterable)
  info = Info(*info)
  guard = info._replace(kind='if', live=info.head, flags=info.flags + ('guard',),
                        implied=info.stop if len(info.stop) == 1 else ())  # skipped iteration: the flag is set
  if it is None or (isinstance(it, _RangeIter) and not any(map(is_traced, jax.tree_util.tree_leaves(get_state())))
                    and not any(map(is_traced, (it.start, it.stop)))):
    for x in (iterable if it is None else range(it.start, it.stop, it.step)):
      if extra_test is not None:
        t = extra_test()
        if is_traced(t):
          if_stmt(t, functools.partial(body, x), _noop, get_state, set_state, guard)
          continue
        if not t:
          break
      body(x)
    return
  init = get_state()
  n = it.length()
  use_scan = isinstance(n, int)
  if not use_scan:
    _no_collect(info, init, 'whose trip count is traced')
  elif extra_test is not None:
    _no_collect(info, init, 'which can exit early (break / return)')
  coll = _collected(info, init)
  # the variables the loop may leave unset stay Undefined in the skipped-iteration branch of the
  # guard only while the plan probes the first iteration (they are zero-filled carries after it)
  guard = guard._replace(zero_ok=info.zero_ok + info.names)

  def step(state, i, sl):
    state = list(state)
    for k in coll:
      state[k] = _Collect(info.names[k], [])
    set_state(tuple(state))
    x = it.item(i, sl)
    run = functools.partial(_run, body, info, x, get_state=get_state, set_state=set_state)
    if extra_test is not None and use_scan:
      if_stmt(extra_test(), run, _noop, get_state, set_state, guard)
    else:
      run()
    return get_state()

  def ys(state):  # this iteration's appended elements, one scan output per append
    return [state[k].items for k in coll]

  try:
    with _traced_region():
      i0 = jax.ShapeDtypeStruct((), jnp.int32)
      sl0 = [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in it.arrays]
      first = {}
      state, carried = _loop_plan(info, init, step, (i0, sl0), skip=coll, first=first)
      carry = _Carry(state, carried)
      stacked = None
      if use_scan and not it.indexed:  # plain scan over the arrays' leading axis
        def scan_body(flat, sl):
          st = step(carry.unpack(flat), None, sl)
          return carry.pack(st), ys(st)
        out, stacked = lax.scan(scan_body, carry.pack(state), [a if a.shape[0] == n else a[:n] for a in it.arrays], length=n)
      elif use_scan:
        def scan_body(c, sl):
          i, flat = c
          st = step(carry.unpack(flat), i, sl)
          return (i + 1, carry.pack(st)), ys(st)
        xs = [a if a.shape[0] == n else a[:n] for a in it.arrays]
        (_, out), stacked = lax.scan(scan_body, (jnp.int32(0), carry.pack(state)), xs, length=n)
      else:
        def cond_fn(c):
          i, flat = c
          ok = i < n
          if extra_test is None:
            return ok
          set_state(carry.unpack(flat))
          return ok & _pred(extra_test(), info)

        def body_fn(c):
          i, flat = c
          return i + 1, carry.pack(step(carry.unpack(flat), i, [a[i] for a in it.arrays]))
        _, out = lax.while_loop(cond_fn, body_fn, (jnp.int32(0), carry.pack(state)))
  except BaseException:
    set_state(init)
    raise
  _finish(set_state, info, init, carry, out)
  if use_scan and n >= 1 and info.ret and info.ret[0] in info.names and \
      first.get(info.names.index(info.ret[0])) is True:
    # the first iteration always returns (`for v in xs: return v`): after the loop the function
    # has returned on every path, so the flag is a Python True (not a carry that merely is True)
    st = list(get_state())
    st[info.names.index(info.ret[0])] = True
    set_state(tuple(st))
  if coll:  # Python semantics: the list object itself grows by n * (appends per iteration) elements
    st = list(get_state())
    for k, per_iter in zip(coll, stacked):
      new = [jax.tree_util.tree_map(lambda a: a[t], item) for t in range(n) for item in per_iter]
      if isinstance(init[k], _Collect):  # a loop nested in a collecting loop: its rows join the outer's
        st[k] = _Collect(init[k].name, init[k].items + new)
      else:
        init[k].extend(new)
        st[k] = init[k]
    set_state(tuple(st))


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
    from .errors import where as _where
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
  from .errors import where as _where
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


# ---- builtins on traced values -----------------------------------------------------------

def _any_traced(*xs) -> bool:
  return any(is_traced(l) for l in jax.tree_util.tree_leaves(xs))


def builtin(fn, name: str, where: tuple, *args, **kwargs):
  """min / max / abs / sum / len / range, called by name: the Python builtin unless an
  argument is traced (and the name still means the builtin)."""
  if fn is not getattr(builtins, name) or not _any_traced(args, kwargs):
    return fn(*args, **kwargs)
  from .errors import where as _where
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
    from .errors import where as _where
    raise AutographError(f"'{me.__name__}' no longer names this function, but autograph turned its tail "
                         f"call into a loop when converting it\n  at {_where(*where)}\n  fix: do not rebind "
                         f"'{me.__name__}', or convert the function again after rebinding")


def recurse(me, frame: int, where: tuple, f, *args, **kwargs):
  """A self-call that is not a tail call. On Python values it recurses (into the converted
  function); under a traced condition entered in this activation it cannot terminate."""
  if not is_self(f, me):
    return f(*args, **kwargs)
  from .errors import where as _where
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


def static_iter(x, info: tuple):
  if isinstance(x, _Iter) or is_traced(x):
    info = Info(*info)
    why, fix = _kept_reason(info)
    raise error(info, f'this `for` iterates over a traced value but cannot be converted: {why}', fix)
  return x


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
  from .errors import where as _where
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


_SKIP_MODULES = ('jax', 'jaxlib', 'numpy', 'jaxform', 'builtins', 'functools', 'operator', 'math',
                 'optax', 'flax', 'equinox', 'scipy', 'collections', 'typing', 'abc')


def call(opts: tuple, f, /, *args, **kwargs):
  """f(*args, **kwargs), converting f first (with the caller's options) when it is a
  user Python function: autograph(recursive=True)."""
  from .convert import convert
  import types
  mod = (getattr(f, '__module__', None) or '').split('.')[0]
  if mod in _SKIP_MODULES or getattr(f, '__autograph__', False):
    return f(*args, **kwargs)
  if isinstance(f, types.MethodType) and isinstance(f.__func__, types.FunctionType):
    g = convert(f.__func__, *opts, strict=False)
    return f(*args, **kwargs) if g is None else g(f.__self__, *args, **kwargs)
  if isinstance(f, types.FunctionType):
    g = convert(f, *opts, strict=False)
    return (f if g is None else g)(*args, **kwargs)
  return f(*args, **kwargs)
