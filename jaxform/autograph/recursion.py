"""Self-recursive functions: tail calls become a loop, other calls are checked at run time.

A recursive call under a *traced* condition cannot stop at trace time (both sides of a
traced `if` are traced, so the recursion unrolls forever). Two cases:

* every self-call is a tail call (`return f(a, b)`, also in an arm of `return x if c else
  f(...)`), none inside a loop or `try`: the body becomes `while True: ...` and each tail
  call rebinds the parameters and continues. On Python values this is the same recursion
  run as a loop; on traced values the loop's stop flag turns traced and it becomes a
  `lax.while_loop` (forward-differentiable only, as every while loop).
* otherwise each self-call becomes `ag__.recurse(...)`, which recurses into the converted
  function and raises an AutographError at the call's line when a traced `if`/loop was
  entered since the current activation began and an argument is traced.

`f` is recognised by name: a call to the function's own name that is not a local. At run
time the name must still refer to this function (`ag__.is_self`), else it is an ordinary call.
"""
from __future__ import annotations

import ast
from .analysis import walk_scope, writes

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _is_self_call(n: ast.AST, name: str) -> bool:
  return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name


def _split_ifexp_returns(stmts: list, name: str) -> list:
  """`return a if c else f(b)` -> `if c: return a / else: return f(b)` (exposes tail calls)."""
  out = []
  for s in stmts:
    if isinstance(s, ast.Return) and isinstance(s.value, ast.IfExp) and \
        any(_is_self_call(n, name) for n in ast.walk(s.value)):
      e = s.value
      s = ast.copy_location(ast.If(test=e.test, body=_split_ifexp_returns([ast.copy_location(ast.Return(value=e.body), s)], name),
                                   orelse=_split_ifexp_returns([ast.copy_location(ast.Return(value=e.orelse), s)], name)), s)
    else:
      for field in ('body', 'orelse', 'finalbody'):
        if isinstance(getattr(s, field, None), list) and not isinstance(s, _SCOPES):
          setattr(s, field, _split_ifexp_returns(getattr(s, field), name))
      for h in getattr(s, 'handlers', []):
        h.body = _split_ifexp_returns(h.body, name)
    out.append(s)
  return out


def _exits(stmts: list) -> bool:
  """Does the block always end in return / continue / raise?"""
  if not stmts:
    return False
  s = stmts[-1]
  if isinstance(s, (ast.Return, ast.Continue, ast.Raise)):
    return True
  return isinstance(s, ast.If) and _exits(s.body) and _exits(s.orelse)


def _call(attr: str, *args) -> ast.Call:
  return ast.Call(func=ast.Attribute(value=ast.Name(id='ag__', ctx=ast.Load()), attr=attr, ctx=ast.Load()),
                  args=list(args), keywords=[])


def _where(filename: str, node: ast.AST) -> ast.expr:
  return ast.Tuple(elts=[ast.Constant(filename), ast.Constant(node.lineno)], ctx=ast.Load())


def _tail_args(call: ast.Call, params: list) -> list | None:
  """The call's arguments in parameter order, or None when they do not bind every parameter once."""
  if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(params):
    return None
  bound = dict(zip(params, call.args))
  for k in call.keywords:
    if k.arg is None or k.arg not in params or k.arg in bound:
      return None
    bound[k.arg] = k.value
  return [bound[p] for p in params] if len(bound) == len(params) else None


def rewrite(fn: ast.FunctionDef, filename: str) -> str | None:
  """Rewrite fn's self-calls in place; returns 'tail', 'checked' or None (no self-calls)."""
  name, a = fn.name, fn.args
  params = [x.arg for x in a.posonlyargs + a.args]
  if name == '<lambda>' or name in writes(fn.body) | set(params) | {x.arg for x in a.kwonlyargs}:
    return None
  if not any(_is_self_call(n, name) for n in walk_scope(fn)):
    return None
  fn.body = _split_ifexp_returns(fn.body, name)
  calls = [n for n in walk_scope(fn) if _is_self_call(n, name)]
  tails = {id(s.value): s for s in walk_scope(fn) if isinstance(s, ast.Return) and _is_self_call(s.value, name)}
  in_loop = {id(n) for s in walk_scope(fn) if isinstance(s, (ast.For, ast.While, ast.Try, ast.With))
             for n in walk_scope(s) if s is not n}
  simple = not (a.vararg or a.kwarg or a.kwonlyargs or any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await))
                                                           for n in walk_scope(fn)))
  if simple and all(id(c) in tails and id(c) not in in_loop and _tail_args(c, params) is not None for c in calls):
    class Tail(ast.NodeTransformer):
      def visit_Return(self, s):
        if id(s.value) not in tails:
          return s
        new = [ast.Expr(value=_call('check_self', ast.Name(id=name, ctx=ast.Load()), ast.Name(id='ag__self', ctx=ast.Load()),
                                    _where(filename, s))),
               ast.Assign(targets=[ast.Tuple(elts=[ast.Name(id=p, ctx=ast.Store()) for p in params], ctx=ast.Store())],
                          value=ast.Tuple(elts=_tail_args(s.value, params), ctx=ast.Load())),
               ast.Continue()]
        return [ast.copy_location(x, s) for x in new]

      def generic_visit(self, node):
        return node if isinstance(node, _SCOPES) and node is not fn else super().generic_visit(node)

    Tail().visit(fn)
    end = [] if _exits(fn.body) else [ast.copy_location(ast.Return(value=None), fn.body[-1])]  # fell off the end
    for r in end:
      r.ag_falloff = True  # messages say "reaches the end", not "a bare return"
    loop = ast.copy_location(ast.While(test=ast.Constant(True), body=fn.body + end, orelse=[]), fn.body[0])
    fn.body = [loop]
    return 'tail'

  class Checked(ast.NodeTransformer):
    def visit_Call(self, c):
      self.generic_visit(c)
      if not _is_self_call(c, name):
        return c
      new = _call('recurse', ast.Name(id='ag__self', ctx=ast.Load()), ast.Name(id='ag__frame', ctx=ast.Load()),
                  _where(filename, c), c.func, *c.args)
      new.keywords = c.keywords
      return ast.copy_location(new, c)

    def generic_visit(self, node):
      return node if isinstance(node, _SCOPES) and node is not fn else super().generic_visit(node)

  Checked().visit(fn)
  fn.body = [ast.copy_location(ast.Assign(targets=[ast.Name(id='ag__frame', ctx=ast.Store())], value=_call('depth')),
                               fn.body[0])] + fn.body
  return 'checked'
