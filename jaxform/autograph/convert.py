"""The AST pass: Python control flow -> calls into `operators` (bound as `ag__`).

Per function, in order:
  1. item assignment      x[i] = y   ->  x = ag__.setitem(x, i, y)
  2. jump lowering        break / continue / return -> flag variables; statements after a
                          possible jump are guarded by `if not flag:`; loops get a stop test
  3. liveness             (analysis.py) on the lowered body
  4. control flow         if / for / while -> nested functions + ag__.if_stmt / for_stmt /
                          while_stmt; written variables become `nonlocal` state
  5. expressions          and / or / not / chained comparisons / x if c else y -> ag__
                          operators that dispatch at run time; calls, when recursive -> ag__call
Every generated node carries the line of the statement it came from and the code is
compiled under the user's filename, so tracebacks show the user's source lines.
The new function is rebuilt around the original closure cells, globals and defaults.
"""
from __future__ import annotations

import ast
import copy
import inspect
import textwrap
import types
from typing import Callable

from . import operators, recursion
from .analysis import Liveness, walk_scope, nested_reads, writes
from .errors import AutographError, where

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
_CACHE: dict = {}


def _name(id_: str, store: bool = False) -> ast.Name:
  return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def _ag(attr: str) -> ast.Attribute:
  return ast.Attribute(value=_name('ag__'), attr=attr, ctx=ast.Load())


def _call(attr: str, *args, **kw) -> ast.Call:
  return ast.Call(func=_ag(attr), args=list(args), keywords=[ast.keyword(arg=k, value=v) for k, v in kw.items()])


def _assign(name: str, value: ast.expr) -> ast.Assign:
  return ast.Assign(targets=[_name(name, True)], value=value)


def _with_ctx(e: ast.expr, ctx) -> ast.expr:
  e = copy.deepcopy(e)
  e.ctx = ctx
  return e


def _any_flag(flags) -> ast.expr:
  names = [_name(f) for f in sorted(flags)]
  return names[0] if len(names) == 1 else ast.BoolOp(op=ast.Or(), values=names)


def _const(v) -> ast.expr:
  if isinstance(v, tuple):
    return ast.Tuple(elts=[_const(x) for x in v], ctx=ast.Load())
  return ast.Constant(value=v)


def _located(nodes: list, src: ast.AST) -> list:
  """Give generated nodes the first line of the statement they replace (single-line
  positions: CPython 3.11 moves method calls to the *end* line of a multi-line span)."""
  for n in nodes:
    for m in ast.walk(n):
      if 'lineno' in m._attributes and getattr(m, 'lineno', None) is None:
        m.lineno, m.col_offset = src.lineno, src.col_offset
        m.end_lineno, m.end_col_offset = src.lineno, src.col_offset
  return nodes


# ---- 1. item assignment ------------------------------------------------------------

def _leaves(t: ast.expr) -> list:
  """Assignment target leaves in Python's left-to-right assignment order."""
  if isinstance(t, (ast.Tuple, ast.List)):
    return [x for e in t.elts for x in _leaves(e)]
  return _leaves(t.value) if isinstance(t, ast.Starred) else [t]


class _SetItem(ast.NodeTransformer):
  """Item assignment becomes rebinding; `del name` becomes `name = Undefined` (the name may
  be part of a converted statement's state, which must stay readable); `ys.append(v)`
  becomes `ys = ag__.append(ys, v)` (so a traced loop can turn it into a stacked output);
  `y: T = v` becomes `y = v` (an annotated name cannot be `nonlocal` state)."""

  def __init__(self, fresh: Callable[[str], str], filename: str = ''):
    self.fresh, self.locals, self.filename = fresh, [set()], filename

  def visit_FunctionDef(self, node):  # `ys.append` is rebound only where ys is a local (a
    a = node.args                     # global / closure list would become an unbound local)
    decl = {x for n in walk_scope(node) if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | {x.arg for x in (a.vararg, a.kwarg) if x}
    self.locals.append((writes(node.body) | params) - decl)
    self.generic_visit(node)
    self.locals.pop()
    return node

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_ClassDef(self, node):  # class-level annotations are fields (dataclasses): keep them
    for i, m in enumerate(node.body):
      node.body[i] = m if isinstance(m, ast.AnnAssign) else self.visit(m)
    node.body = [x for m in node.body for x in (m if isinstance(m, list) else [m])]
    return node

  def visit_AnnAssign(self, node):
    if node.value is None:
      return ast.copy_location(ast.Pass(), node)
    return self.visit(ast.copy_location(ast.Assign(targets=[node.target], value=node.value), node))

  def visit_Expr(self, node):
    self.generic_visit(node)
    c = node.value
    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == 'append' and \
        isinstance(c.func.value, ast.Name) and len(c.args) == 1 and not c.keywords and \
        not isinstance(c.args[0], ast.Starred) and c.func.value.id in self.locals[-1]:
      n = c.func.value.id
      out = ast.copy_location(_assign(n, _call('append', _name(n), c.args[0])), node)
      out.ag_append = n
      return out
    return node

  def visit_Delete(self, node):
    if all(isinstance(t, ast.Name) for t in node.targets):
      return [ast.copy_location(_assign(t.id, _call('Undefined', ast.Constant(t.id))), node) for t in node.targets]
    return node

  def _assign(self, target, value):
    while isinstance(target, ast.Subscript):
      value = _call('setitem', _with_ctx(target.value, ast.Load()), target.slice, value,
                    _const((self.filename, getattr(target, 'lineno', 0))))
      target = target.value
    return ast.Assign(targets=[_with_ctx(target, ast.Store())], value=value)

  def visit_Assign(self, node):
    self.generic_visit(node)
    if len(node.targets) == 1 and isinstance(node.targets[0], ast.Subscript):
      return ast.copy_location(self._assign(node.targets[0], node.value), node)
    if not any(isinstance(x, ast.Subscript) for t in node.targets for x in _leaves(t)):
      return node
    # `a[i], a[j] = a[j], a[i]` / `a = b[i] = v`: evaluate the right side once (a snapshot),
    # unpack it into temporaries, then assign the targets one by one, left to right, as Python does
    tmp = self.fresh('ag__rhs')
    out = [_assign(tmp, node.value)]
    for t in node.targets:
      if isinstance(t, (ast.Tuple, ast.List)):
        temps = {}

        def rename(e):
          if isinstance(e, (ast.Tuple, ast.List)):
            return ast.Tuple(elts=[rename(x) for x in e.elts], ctx=ast.Store())
          if isinstance(e, ast.Starred):
            return ast.Starred(value=rename(e.value), ctx=ast.Store())
          temps[id(e)] = self.fresh('ag__elt')
          return _name(temps[id(e)], True)
        out.append(ast.Assign(targets=[rename(t)], value=_name(tmp)))
        pairs = [(x, _name(temps[id(x)])) for x in _leaves(t)]
      else:
        pairs = [(t, _name(tmp))]
      for x, v in pairs:
        out.append(self._assign(x, v) if isinstance(x, ast.Subscript) else ast.Assign(targets=[x], value=v))
    return [ast.copy_location(o, node) for o in out]

  def visit_AugAssign(self, node):
    self.generic_visit(node)
    t = node.target
    if isinstance(t, ast.Subscript):
      op = {ast.Add: '+', ast.Sub: '-', ast.Mult: '*', ast.Div: '/', ast.FloorDiv: '//', ast.Mod: '%',
            ast.Pow: '**', ast.MatMult: '@', ast.BitAnd: '&', ast.BitOr: '|', ast.BitXor: '^',
            ast.LShift: '<<', ast.RShift: '>>'}[type(node.op)]
      value = _call('setitem_op', _with_ctx(t.value, ast.Load()), t.slice, ast.Constant(op), node.value,
                    _const((self.filename, node.lineno)))
      return ast.copy_location(self._assign(t.value, value) if isinstance(t.value, ast.Subscript) else
                               ast.Assign(targets=[_with_ctx(t.value, ast.Store())], value=value), node)
    return node


# ---- 2. jump lowering ----------------------------------------------------------------

class _Lower:
  """break/continue/return -> flags (TF AutoGraph's scheme), so that every block is left
  only at its end and loop bodies can become functions."""

  def __init__(self, fresh: Callable[[str], str], filename: str):
    self.fresh, self.ret, self.filename = fresh, None, filename

  def function(self, fn: ast.FunctionDef) -> tuple | None:
    """Returns None (no lowered return) or (flag, value, function name, its `return`s as
    (line, gives a value, is the fall-off of a tail-converted body), the line where it falls
    off its end): static facts for the messages about return kinds."""
    rets = [n for n in walk_scope(fn) if isinstance(n, ast.Return)]
    nested = len(rets) - sum(isinstance(s, ast.Return) for s in fn.body)
    if nested:
      self.ret = (self.fresh('do_return'), self.fresh('retval'))
    end_line = max(getattr(n, 'end_lineno', None) or 0 for n in walk_scope(fn) if n is not fn)
    desc = (fn.name, tuple(sorted((r.lineno, r.value is not None, bool(getattr(r, 'ag_falloff', False)))
                                  for r in rets)), end_line)
    body, _ = self.block(fn.body, None)
    if self.ret:
      flag, val = self.ret
      body = [_assign(flag, ast.Constant(False)), _assign(val, _call('Undefined', ast.Constant(val)))] + body
      # falling off the end returns None: with a traced flag some paths returned and others did not
      body.append(ast.Return(value=_call('retval', _name(val), _name(flag),
                                         _const((self.filename, flag, val) + desc))))
    fn.body = _located(body, fn)
    return self.ret and self.ret + desc

  def checked(self, s: ast.Return) -> ast.expr:
    """Returned values are checked for unassigned locals (Python's UnboundLocalError)."""
    if s.value is None:
      return ast.Constant(None)
    return _call('checked', s.value, ast.Constant(self.filename), ast.Constant(s.lineno))

  def block(self, stmts: list, loop: dict | None) -> tuple[list, set]:
    out, flags = [], set()
    for k, s in enumerate(stmts):
      new, f = self.stmt(s, loop)
      out += _located(new, s)
      flags |= f
      if isinstance(s, (ast.Break, ast.Continue)) or (isinstance(s, ast.Return) and self.ret):
        break  # the rest of the block is unreachable
      if f:
        rest, f2 = self.block(stmts[k + 1:], loop)
        if rest:
          guard = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=_any_flag(f)), body=rest, orelse=[])
          guard.ag_guard = tuple(sorted(f))  # its else branch runs only when one of these flags is set
          out += _located([guard], stmts[k + 1])
        return out, flags | f2
    return out, flags

  def stmt(self, s: ast.stmt, loop: dict | None) -> tuple[list, set]:
    if isinstance(s, (ast.Break, ast.Continue)):
      if loop is None:
        return [s], set()
      key = 'brk' if isinstance(s, ast.Break) else 'cont'
      loop[key] = loop[key] or self.fresh(key)
      return [_assign(loop[key], ast.Constant(True))], {loop[key]}
    if isinstance(s, ast.Return) and self.ret:
      flag, val = self.ret
      return [_assign(val, self.checked(s)), _assign(flag, ast.Constant(True))], {flag}
    if isinstance(s, ast.Return) and s.value is not None:
      s.value = self.checked(s)
      return [s], set()
    if isinstance(s, ast.If):
      s.body, f1 = self.block(s.body, loop)
      s.orelse, f2 = self.block(s.orelse, loop)
      s.body = s.body or [ast.Pass()]
      return [s], f1 | f2
    if isinstance(s, (ast.With, ast.AsyncWith)):
      s.body, f = self.block(s.body, loop)
      return [s], f
    if isinstance(s, ast.Try):
      f = set()
      for attr in ('body', 'orelse', 'finalbody'):
        b, g = self.block(getattr(s, attr), loop)
        setattr(s, attr, b if b or attr != 'body' else [ast.Pass()])
        f |= g
      for h in s.handlers:
        h.body, g = self.block(h.body, loop)
        h.body, f = h.body or [ast.Pass()], f | g
      return [s], f
    if isinstance(s, ast.While) and any(isinstance(n, ast.NamedExpr) for n in ast.walk(s.test)):
      # `while (i := i + 1) < n:` -> `while True: if not (i := i + 1) < n: break` so that the
      # assignment is part of the loop body (a lax.while_loop test cannot update the carry)
      if s.orelse:
        raise AutographError(f'{self.filename}:{s.lineno}: a `while` whose test assigns with := cannot '
                             f'have an `else` clause under autograph; move the assignment into the loop')
      guard = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=s.test), body=[ast.Break()], orelse=[])
      s.test, s.body = ast.Constant(True), _located([guard], s) + s.body
    if isinstance(s, (ast.For, ast.While)):
      forever = isinstance(s, ast.While) and isinstance(s.test, ast.Constant) and bool(s.test.value)
      inner = {'brk': None, 'cont': None}
      body, f = self.block(s.body, inner)
      if inner['cont']:
        body = [_assign(inner['cont'], ast.Constant(False))] + body
      s.body = _located(body, s) or [ast.Pass()]
      stop = [x for x in (inner['brk'], self.ret and self.ret[0]) if x and (x == inner['brk'] or x in f)]
      s.ag_stop = stop
      if stop and isinstance(s, ast.While):
        s.test = ast.BoolOp(op=ast.And(), values=[ast.UnaryOp(op=ast.Not(), operand=_any_flag(stop)), s.test])
      pre = [_assign(inner['brk'], ast.Constant(False))] if inner['brk'] else []
      post = []
      if s.orelse:
        orelse, f3 = self.block(s.orelse, loop)
        f |= f3
        post = [ast.If(test=ast.UnaryOp(op=ast.Not(), operand=_any_flag(stop)), body=orelse, orelse=[])] if stop else orelse
        s.orelse = []
      if forever and self.ret and stop == [self.ret[0]]:
        # `while True:` left only by `return` (a tail-converted body): afterwards the function has
        # returned on every path; saying so keeps the flag a Python True after a traced loop
        post.append(_assign(self.ret[0], ast.Constant(True)))
      return pre + [s] + post, f - {inner['brk'], inner['cont']}
    return [s], set()


# ---- 4. control flow -------------------------------------------------------------------

class _Scope:
  def __init__(self, fn, live: Liveness, ret, generator: bool):
    self.fn, self.live, self.ret, self.generator = fn, live, ret, generator
    decl = [n for n in walk_scope(fn) if isinstance(n, (ast.Global, ast.Nonlocal))]
    self.globals = {x for n in decl if isinstance(n, ast.Global) for x in n.names}
    self.nonlocals = {x for n in decl if isinstance(n, ast.Nonlocal) for x in n.names}
    self.state: set[str] = set()


def _contains(s: ast.AST, types_) -> bool:
  return any(isinstance(n, types_) for n in walk_scope(s))


class _Converter:
  def __init__(self, filename: str, recursive: bool, static_range: str):
    self.filename, self.recursive, self.lax_range = filename, recursive, static_range == 'lax'
    self.count, self.scopes = 0, []

  def fresh(self, base: str) -> str:
    self.count += 1
    return f'{base}__{self.count}'

  def function(self, fn: ast.FunctionDef):
    generator = _contains(ast.Module(body=fn.body, type_ignores=[]), (ast.Yield, ast.YieldFrom)) or \
        isinstance(fn, ast.AsyncFunctionDef)
    ret = None if generator else _Lower(self.fresh, self.filename).function(fn)
    live = Liveness(nested_reads(fn))
    live.run(fn.body)
    scope = _Scope(fn, live, ret, generator)
    self.scopes.append(scope)
    body = self.block(fn.body, False)
    self.scopes.pop()
    a = fn.args
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | {x.arg for x in (a.vararg, a.kwarg) if x}
    init = sorted(scope.state - params - scope.globals - scope.nonlocals)
    fn.body = _located([_assign(n, _call('Undefined', ast.Constant(n))) for n in init], fn) + body

  def block(self, stmts: list, in_try: bool) -> list:
    return [x for s in stmts for x in self.stmt(s, in_try)]

  def stmt(self, s: ast.stmt, in_try: bool) -> list:
    if isinstance(s, _FUNCS):
      self.function(s)
    elif isinstance(s, ast.ClassDef):
      for m in s.body:
        if isinstance(m, _FUNCS):
          self.function(m)
    elif isinstance(s, ast.Try):
      s.body = self.block(s.body, True)
      for h in s.handlers:
        h.body = self.block(h.body, True)
      s.orelse, s.finalbody = self.block(s.orelse, True), self.block(s.finalbody, True)
    elif isinstance(s, (ast.With, ast.AsyncWith)):
      s.body = self.block(s.body, in_try)
    elif isinstance(s, (ast.If, ast.For, ast.While)):
      scope = self.scopes[-1]
      flags = tuple(f for f, c in (('try', in_try), ('yield', scope.generator),
                                   ('contains-try', _contains(s, (ast.Try, ast.Await))),
                                   ('raise', _contains(s, ast.Raise))) if c)
      if set(flags) & {'try', 'yield', 'contains-try'}:
        return self.kept(s, flags, in_try)
      return _located(self.convert(s, flags), s)
    return [s]

  def info(self, s, flags, names=(), live=(), head=(), entry=()) -> ast.expr:
    kind = {ast.If: 'if', ast.For: 'for', ast.While: 'while'}[type(s)]
    ret = self.scopes[-1].ret or ()
    zero_ok = (ret[1],) if ret else ()
    stop = tuple(getattr(s, 'ag_stop', ()))
    appends = tuple(sorted({n.ag_append for n in walk_scope(s) if getattr(n, 'ag_append', None)})) \
        if kind != 'if' else ()
    guard = getattr(s, 'ag_guard', ())
    implied = guard if len(guard) == 1 and guard[0] in names else ()  # `if not flag:` -- else: flag is True
    flags = flags + (('guard',) if guard else ())
    return _const((kind, self.filename, s.lineno, tuple(names), tuple(live), tuple(head), tuple(entry), flags,
                   zero_ok, stop, appends, ret, implied))

  def iter_expr(self, e: ast.expr) -> ast.expr:
    """range/enumerate/zip in a `for` header -> ag__ versions that see traced arguments."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not any(isinstance(a, ast.Starred) for a in e.args):
      f = e.func.id
      if f == 'range' and not e.keywords:
        kw = {'lax_': ast.Constant(True)} if self.lax_range else {}
        return ast.copy_location(_call('range_', e.func, *e.args, **kw), e)
      if f == 'enumerate' and e.args:
        start = e.args[1:] or [k.value for k in e.keywords if k.arg == 'start']
        return ast.copy_location(_call('enumerate_', e.func, self.iter_expr(e.args[0]), *start), e)
      if f == 'zip' and not e.keywords:
        return ast.copy_location(_call('zip_', e.func, *map(self.iter_expr, e.args)), e)
    return e

  def kept(self, s, flags, in_try) -> list:
    """A statement that must stay Python: its test is checked to be static at run time."""
    info = self.info(s, flags)
    if isinstance(s, ast.For):
      s.iter = _call('static_iter', self.iter_expr(s.iter), info)
      s.body = self.block(s.body, in_try)
      if getattr(s, 'ag_stop', None):
        s.body.append(ast.If(test=_call('static_test', _any_flag(s.ag_stop), info), body=[ast.Break()], orelse=[]))
    else:
      s.test = _call('static_test', s.test, info)
      s.body = self.block(s.body, in_try)
      s.orelse = self.block(s.orelse, in_try)
    return [_located([s], s)[0]]

  def _def(self, name: str, args: list, names: list, body: list) -> ast.FunctionDef:
    scope = self.scopes[-1]
    decl = ([ast.Nonlocal(names=[n for n in names if n not in scope.globals])]
            if [n for n in names if n not in scope.globals] else [])
    glob = sorted(scope.globals)
    decl += [ast.Global(names=glob)] if glob else []
    return ast.FunctionDef(name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in args],
                                                         vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
                           body=decl + (body or [ast.Pass()]), decorator_list=[], returns=None)

  def _state_fns(self, k: int, names: list) -> list:
    tup = lambda store: ast.Tuple(elts=[_name(n, store) for n in names], ctx=ast.Store() if store else ast.Load())
    get = self._def(f'get_state__{k}', [], [], [ast.Return(value=tup(False))])
    body = [ast.Assign(targets=[tup(True)], value=_name('vals__'))] if names else []
    return [get, self._def(f'set_state__{k}', ['vals__'], names, body)]

  def convert(self, s, flags) -> list:
    scope, lv = self.scopes[-1], self.scopes[-1].live
    names = sorted(writes(s) - scope.globals)
    scope.state |= set(names)
    live = [n for n in names if n in lv.live_out[id(s)]]
    k = self.count = self.count + 1
    if isinstance(s, ast.If):
      body, orelse = self.block(s.body, False), self.block(s.orelse, False)
      defs = [self._def(f'if_body__{k}', [], names, body), self._def(f'else_body__{k}', [], names, orelse)]
      call = _call('if_stmt', s.test, _name(f'if_body__{k}'), _name(f'else_body__{k}'), _name(f'get_state__{k}'),
                   _name(f'set_state__{k}'), self.info(s, flags, names, live))
      return defs + self._state_fns(k, names) + [ast.Expr(value=call)]
    head = [n for n in names if n in lv.live_head[id(s)]]
    entry = [n for n in names if n in lv.live_entry[id(s)]]
    info = self.info(s, flags, names, live, head, entry)
    body = self.block(s.body, False)
    if isinstance(s, ast.While):
      defs = [self._def(f'loop_test__{k}', [], names, [ast.Return(value=s.test)]),
              self._def(f'loop_body__{k}', [], names, body)]
      call = _call('while_stmt', _name(f'loop_test__{k}'), _name(f'loop_body__{k}'), _name(f'get_state__{k}'),
                   _name(f'set_state__{k}'), info)
      return defs + self._state_fns(k, names) + [ast.Expr(value=call)]
    target = ast.Assign(targets=[s.target], value=_name('itr__'))
    defs = [self._def(f'loop_body__{k}', ['itr__'], names, [target] + body)]
    extra = ast.Constant(None)
    if s.ag_stop:
      defs.append(self._def(f'extra_test__{k}', [], [], [ast.Return(value=ast.UnaryOp(op=ast.Not(), operand=_any_flag(s.ag_stop)))]))
      extra = _name(f'extra_test__{k}')
    call = _call('for_stmt', self.iter_expr(s.iter), extra, _name(f'loop_body__{k}'), _name(f'get_state__{k}'),
                 _name(f'set_state__{k}'), info)
    return defs + self._state_fns(k, names) + [ast.Expr(value=call)]


# ---- 5. expressions ------------------------------------------------------------------

_BUILTINS = ('min', 'max', 'abs', 'sum', 'len', 'range')


class _Exprs(ast.NodeTransformer):
  def __init__(self, recursive: bool, opts: tuple, filename: str):
    self.recursive, self.opts, self.filename = recursive, opts, filename

  def _where(self, node) -> ast.expr:
    return _const((self.filename, node.lineno))

  def visit_Subscript(self, node):
    """`xs[i]` with a non-constant index -> ag__.getitem: a Python list/tuple indexed by a
    traced loop index is stacked (arrays) or switched over (callables) at run time."""
    self.generic_visit(node)
    if isinstance(node.ctx, ast.Load) and not isinstance(node.slice, (ast.Constant, ast.Slice, ast.Tuple)):
      return ast.copy_location(_call('getitem', node.value, node.slice, self._where(node)), node)
    return node

  def visit_BoolOp(self, node):
    self.generic_visit(node)
    if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
      return node
    fn = 'and_' if isinstance(node.op, ast.And) else 'or_'
    lam = lambda e: ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                                                  kw_defaults=[], kwarg=None, defaults=[]), body=e)
    out = node.values[-1]
    for v in reversed(node.values[:-1]):
      out = _call(fn, lam(v), lam(out))
    return ast.copy_location(out, node)

  def visit_UnaryOp(self, node):
    self.generic_visit(node)
    return ast.copy_location(_call('not_', node.operand), node) if isinstance(node.op, ast.Not) else node

  def visit_Compare(self, node):
    if len(node.ops) == 1 or any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
      return self.generic_visit(node)
    vals = [node.left] + node.comparators
    parts = [ast.Compare(left=copy.deepcopy(vals[i]), ops=[op], comparators=[copy.deepcopy(vals[i + 1])])
             for i, op in enumerate(node.ops)]
    return self.visit(ast.copy_location(ast.BoolOp(op=ast.And(), values=parts), node))

  def visit_IfExp(self, node):
    self.generic_visit(node)
    if any(isinstance(n, ast.NamedExpr) for n in ast.walk(node)):
      return node
    lam = lambda e: ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], vararg=None, kwonlyargs=[],
                                                  kw_defaults=[], kwarg=None, defaults=[]), body=e)
    return ast.copy_location(_call('if_exp', node.test, lam(node.body), lam(node.orelse)), node)

  def visit_Call(self, node):
    self.generic_visit(node)
    f = node.func
    if isinstance(f, ast.Name) and f.id in _BUILTINS and not any(isinstance(a, ast.Starred) for a in node.args):
      return ast.copy_location(ast.Call(func=_ag('builtin'), args=[f, ast.Constant(f.id), self._where(node)] + node.args,
                                        keywords=node.keywords), node)
    if not self.recursive or (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == 'ag__') \
        or (isinstance(f, ast.Name) and f.id in ('super', 'ag__call')):
      return node
    return ast.copy_location(ast.Call(func=_name('ag__call'), args=[_const(self.opts), f] + node.args,
                                      keywords=node.keywords), node)


# ---- entry point -----------------------------------------------------------------------

def _parse(fn: types.FunctionType) -> ast.FunctionDef:
  try:
    src = textwrap.dedent(inspect.getsource(fn))
  except (OSError, TypeError) as e:
    raise AutographError(f"cannot read the source of {fn.__qualname__} ({e}); autograph needs the "
                         f"function's source file: define it in a .py file, not in a REPL/exec string") from e
  first = fn.__code__.co_firstlineno
  if fn.__name__ == '<lambda>':
    try:
      tree = ast.parse(src)
    except SyntaxError:
      try:
        tree = ast.parse('(' + src.strip().rstrip(',') + ')') if src.strip() else None
      except SyntaxError:  # a lambda inside a statement header (`for f in (lambda x: ...,):`)
        tree = None
    if tree is None:
      raise AutographError(f'cannot read the source of the lambda at {fn.__code__.co_filename}:{first} '
                           f'(it is part of a larger statement); use a def function')
    argnames = list(fn.__code__.co_varnames[:fn.__code__.co_argcount])
    lams = [n for n in ast.walk(tree) if isinstance(n, ast.Lambda) and [a.arg for a in n.args.args] == argnames]
    if len(lams) != 1:
      raise AutographError(f'cannot locate the source of lambda at {fn.__code__.co_filename}:{first} '
                           f'(found {len(lams)} candidates); use a def function')
    lam = lams[0]
    node = ast.FunctionDef(name='<lambda>', args=lam.args, body=[ast.Return(value=lam.body)], decorator_list=[],
                           returns=None)
    ast.copy_location(node, lam)
    ast.copy_location(node.body[0], lam.body)
    node = ast.fix_missing_locations(node)
  else:
    node = ast.parse(src).body[0]
    if not isinstance(node, _FUNCS) or node.name != fn.__code__.co_name:
      raise AutographError(f'cannot locate the source of {fn.__qualname__} at {fn.__code__.co_filename}:{first}')
  ast.increment_lineno(node, first - 1)
  node.decorator_list = []
  return node


def _transform(node: ast.FunctionDef, fn: types.FunctionType, filename: str, recursive: bool,
               static_range: str) -> types.CodeType:
  cv = _Converter(filename, recursive, static_range)
  recursion.rewrite(node, filename)
  _SetItem(cv.fresh, filename).visit(node)
  cv.function(node)
  _Exprs(recursive, (recursive, static_range), filename).visit(node)
  free = [v for v in fn.__code__.co_freevars if v not in ('ag__', 'ag__self', 'ag__call')]  # fn may itself be converted code
  node.name = 'ag__fn'  # not the user's name: a self-call must resolve as in the original (global / cell)
  factory = ast.FunctionDef(
      name='ag__factory', args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=a) for a in ['ag__', 'ag__self', 'ag__call'] + free],
                                             vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[]),
      body=[node, ast.Return(value=_name(node.name))], decorator_list=[], returns=None)
  mod = ast.Module(body=[_located([factory], node)[0]], type_ignores=[])
  ast.fix_missing_locations(mod)
  outer = compile(mod, filename, 'exec')
  fcode = next(c for c in outer.co_consts if isinstance(c, types.CodeType))
  code = next(c for c in fcode.co_consts if isinstance(c, types.CodeType) and c.co_name == node.name)
  return code.replace(co_name=fn.__code__.co_name)


def convert(fn: types.FunctionType, recursive: bool = False, static_range: str = 'python',
            strict: bool = True) -> types.FunctionType | None:
  """Returns the converted function (cached per code object and options). With
  strict=False (used for functions reached through recursive calls) a function whose
  source cannot be read is returned as None instead of raising."""
  if static_range not in ('python', 'lax'):
    raise ValueError("static_range must be 'python' or 'lax'")
  key = (fn.__code__, fn.__code__.co_filename, recursive, static_range)  # equal code in two files: two entries
  code = _CACHE.get(key)
  if code is None:
    try:
      node = _parse(fn)
    except AutographError:
      if strict:
        raise
      return None
    filename = fn.__code__.co_filename
    try:
      code = _CACHE[key] = _transform(node, fn, filename, recursive, static_range)
    except AutographError:
      raise
    except Exception as e:  # a construct the pass does not handle: name the user's line, never ours
      line = getattr(e, 'lineno', None) or node.lineno
      raise AutographError(f'autograph cannot convert {fn.__qualname__} ({type(e).__name__}: {e})\n'
                           f'  at {where(filename, line)}\n  fix: rewrite this construct, or call the function '
                           f'without autograph (plain Python / lax control flow)') from e
  cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
  me = types.CellType()
  closure = tuple(types.CellType(operators) if n == 'ag__' else me if n == 'ag__self' else
                  types.CellType(call) if n == 'ag__call' else cells[n]
                  for n in code.co_freevars)
  new = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
  me.cell_contents = new
  new.__kwdefaults__ = fn.__kwdefaults__
  new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
  new.__annotations__ = dict(getattr(fn, '__annotations__', {}))
  new.__dict__.update(fn.__dict__)
  new.__wrapped__, new.__autograph__ = fn, True
  return new


# ---- autograph(recursive=True): the functions converted code calls --------------------------
# Bound as `ag__call` next to the `ag__` operators (the operators never import the converter).

_SKIP_MODULES = ('jax', 'jaxlib', 'numpy', 'jaxform', 'builtins', 'functools', 'operator', 'math',
                 'optax', 'flax', 'equinox', 'scipy', 'collections', 'typing', 'abc')


def call(opts: tuple, f, /, *args, **kwargs):
  """f(*args, **kwargs), converting f first (with the caller's options) when it is a
  user Python function: autograph(recursive=True)."""
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
