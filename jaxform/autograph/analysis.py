"""Static analysis on one function body: which names a statement writes, and liveness.

Liveness decides what a converted `if`/loop must carry: a variable written inside
is a branch output / loop carry only if it is live afterwards (or, for loops, live
at the loop head). Without it every temporary would be threaded through lax.cond
and scan, and a temporary defined in only one branch would be a false error.
The analysis is structured (no CFG): break/continue/return are already lowered
to flag variables (see convert.py) so control only leaves a block at its end.
"""
from __future__ import annotations

import ast

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
           ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def walk_scope(node: ast.AST, enter_root: bool = True):
  """ast.walk that does not enter nested scopes (but yields the scope nodes themselves)."""
  todo = [node]
  while todo:
    n = todo.pop()
    yield n
    if isinstance(n, _SCOPES) and (n is not node or not enter_root):
      continue
    todo.extend(ast.iter_child_nodes(n))


def reads(node: ast.AST | None) -> set[str]:
  """Names an expression (or statement header) loads, including free names of lambdas
  and comprehensions inside it (conservatively: every name loaded there)."""
  if node is None:
    return set()
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _target_names(t: ast.AST) -> set[str]:
  return {n.id for n in ast.walk(t) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}


def writes(stmts: list[ast.stmt] | ast.AST) -> set[str]:
  """Names bound by statements, not looking into nested function/class bodies."""
  out: set[str] = set()
  for s in stmts if isinstance(stmts, list) else [stmts]:
    for n in walk_scope(s, enter_root=False):
      if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
        out.add(n.id)
      elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        out.add(n.name)
      elif isinstance(n, (ast.Import, ast.ImportFrom)):
        out |= {(a.asname or a.name).split('.')[0] for a in n.names}
      elif isinstance(n, ast.ExceptHandler) and n.name:
        out.add(n.name)
      elif isinstance(n, ast.NamedExpr):
        out.add(n.target.id)
  return out


def nested_reads(fn: ast.FunctionDef) -> set[str]:
  """Names read inside nested functions/lambdas of `fn`: a closure may read them at any
  later time, so they count as live everywhere."""
  out: set[str] = set()
  for n in walk_scope(fn):
    if n is not fn and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
      out |= reads(n)
  return out


class Liveness:
  """Backward liveness over a structured function body.

  After `run`, `live_out[id(stmt)]` is the set of names live after each if/for/while and
  `live_head[id(loop)]` the names live at a loop's head (read by the test, the next
  iteration, or after the loop) and `live_entry[id(loop)]` those read in an iteration
  before being assigned in it."""

  def __init__(self, always_live: set[str] = frozenset()):
    self.always = set(always_live)
    self.live_out: dict[int, set[str]] = {}
    self.live_head: dict[int, set[str]] = {}
    self.live_entry: dict[int, set[str]] = {}

  def run(self, body: list[ast.stmt]) -> set[str]:
    return self.block(body, set())

  def block(self, stmts: list[ast.stmt], live: set[str]) -> set[str]:
    for s in reversed(stmts):
      live = self.stmt(s, live) | self.always
    return live

  def stmt(self, s: ast.stmt, live: set[str]) -> set[str]:
    if isinstance(s, ast.If):
      self.live_out[id(s)] = set(live)
      return reads(s.test) | self.block(s.body, live) | self.block(s.orelse, live)
    if isinstance(s, (ast.For, ast.While)):
      self.live_out[id(s)] = set(live)
      extra = set(getattr(s, 'ag_stop', ()))
      test = reads(s.test) if isinstance(s, ast.While) else set()
      exposed = self.block(s.body, set()) - self.always  # read before assigned in one iteration
      if isinstance(s, ast.For):
        exposed -= _target_names(s.target)
      head = live | self.block(s.orelse, live) | test | extra  # (records below overwrite these)
      while True:  # fixpoint around the back edge
        entry = self.block(s.body, head)
        if isinstance(s, ast.For):
          entry = (entry - _target_names(s.target)) | reads(s.target)
        new = head | entry
        if new == head:
          break
        head = new
      self.live_head[id(s)] = head
      self.live_entry[id(s)] = exposed | test | extra
      return head | (reads(s.iter) if isinstance(s, ast.For) else set())
    if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      deco = set().union(*(reads(d) for d in s.decorator_list)) if s.decorator_list else set()
      args = reads(s.args) if not isinstance(s, ast.ClassDef) else set().union(*(reads(b) for b in s.bases)) if s.bases else set()
      return (live - {s.name}) | deco | args | (reads(s) if not isinstance(s, ast.ClassDef) else set())
    if isinstance(s, ast.Try):
      after = live | self.block(s.finalbody, live)
      handlers = set().union(*(self.block(h.body, after) | reads(h.type) for h in s.handlers)) if s.handlers else set()
      mid = after | handlers | self.block(s.orelse, after)
      return mid | self.block(s.body, mid)  # any point in the body may jump to a handler
    if isinstance(s, ast.With):
      inner = self.block(s.body, live)
      return (inner - writes([ast.Expr(i.optional_vars) for i in s.items if i.optional_vars])) | \
          set().union(*(reads(i.context_expr) for i in s.items))
    if isinstance(s, (ast.Return, ast.Raise)):
      return reads(s) | self.always
    if isinstance(s, ast.AugAssign):
      return live | reads(s.value) | reads(s.target) | _target_names(s.target)
    if isinstance(s, (ast.Assign, ast.AnnAssign)):
      targets = s.targets if isinstance(s, ast.Assign) else [s.target]
      defs = set().union(*(_target_names(t) for t in targets))
      return (live - defs) | reads(s)
    if isinstance(s, (ast.Global, ast.Nonlocal, ast.Pass)):
      return live
    return (live - writes(s)) | reads(s)  # Expr, Delete, Import, Assert, ...
