"""`for` and `while` loops: `lax.scan` / `lax.while_loop` when the iterable or the test is traced,
plain Python otherwise; `range` / `enumerate` / `zip` over traced bounds, lists appended to in a
traced body (stacked outputs), `break` / `return` flags as part of the carry."""
from __future__ import annotations

import builtins
import functools
import operator
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

from .errors import AutographError, error
from .runtime import (Info, Undefined, _aval, _describe, _is_dyn, _kept_reason, _pred, _run, _same_static,
                      _trace, _traced_region, is_traced)
from .conditionals import _typed, if_stmt
from .lists import _Collect


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


def static_iter(x, info: tuple):
  if isinstance(x, _Iter) or is_traced(x):
    info = Info(*info)
    why, fix = _kept_reason(info)
    raise error(info, f'this `for` iterates over a traced value but cannot be converted: {why}', fix)
  return x
