"""Differential fuzzer for AutoGraph: random Python programs, plain Python as the oracle.

A Hypothesis strategy writes a function over inputs x (float32[N]), s (float32 scalar) and
k (int32, a traced trip count) using the constructs AutoGraph converts: if/elif/else on
traced conditions, loops over static ranges, traced ranges and enumerate(x), while loops,
break/continue, early return (also inside loops), item assignment and augmented item
assignment, tuple swaps of items, annotated assignments, builtin min/max/abs/sum, list.append
in traced loops (-> stacked output), Python lists indexed by a loop index, and tail-recursive
helpers. Half of the programs mix return kinds: each `return` gives the value or is a bare
`return`, and the function may fall off its end (None).

Oracle: the unconverted function on NumPy float32 values. Checked: autograph(f) eagerly on
concrete JAX arrays, and jax.jit(autograph(f)) with static_range='python' and 'lax'.
Return kinds. Python is also run on KIND_INPUTS more inputs (observed kinds), and the source
says which kinds the program can give at all (static kinds: its `return value`s, bare `return`s
and a reachable end, every condition taken as free). Under jit every input is traced, so:
  * observed kinds mixed (None on some inputs, a value on others): the only correct outcome is
    an AutographError about return kinds -- any output is wrong for one of those inputs;
  * one static kind: the result must equal Python's (None included); any error is a mismatch;
  * one observed kind but both static kinds (e.g. a bare `return` under a traced condition that
    Python never takes, such as `min(x) <= x[1]`): AutoGraph traces both sides of a traced `if`,
    so the error is allowed (counted as `unobserved_kind_errors`); a result must equal Python's.
Eager calls (concrete values) must match Python exactly. The report counts each class, so a
run where no program mixes kinds, or no expected error fires, is visible.

    .venv/bin/python tests/autograph/fuzz_autograph.py 2000 SEED   # offline run (batched); prints a report
The CI share is tests/autograph/test_autograph_fuzz.py (fixed seed, a few dozen programs).
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import sys
import tempfile
import textwrap
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from jaxform.autograph import AutographError, autograph

N = 5
HELPERS = '''
def tail_decay(v, n, acc):
  if n <= 0:
    return acc
  return tail_decay(v, n - 1, acc * 0.5 + v)


def tail_count(v, lim, c):
  return c if v >= lim else tail_count(v + 1.5, lim, c + 1)
'''


class _Gen:
  """Draws one program; `loops` tracks the enclosing loops (for break/continue/append)."""

  def __init__(self, draw, mixed: bool = False):
    self.draw, self.lines, self.n_idx, self.appends, self.returned = draw, [], 0, False, False
    self.mixed = mixed  # the end may fall off; with `bare`, returns may be bare too
    self.bare = mixed and draw(st.booleans())

  def pick(self, xs):
    return self.draw(st.sampled_from(xs))

  def idx(self, loop_vars):
    loop_vars = [v for v in loop_vars if v != 'r']  # r is an element of x, not an index
    opts = [str(i) for i in range(N)] + [f'-{i}' for i in range(1, 3)]
    opts += [f'{v}' for v in loop_vars] + [f'({v} + 1) % {N}' for v in loop_vars]
    return self.pick(opts)

  def atom(self, loop_vars):
    opts = ['t', 's', f'a[{self.idx(loop_vars)}]', self.pick(['0.5', '1.0', '-2.0', '3.0']), 'x[1]']
    opts += [f'r' for _ in ['r'] if 'r' in loop_vars]
    return self.pick(opts)

  def expr(self, loop_vars, depth=0):
    kind = self.draw(st.integers(0, 9 if depth < 2 else 1))
    if kind <= 1:
      return self.atom(loop_vars)
    a, b = self.expr(loop_vars, depth + 1), self.expr(loop_vars, depth + 1)
    if kind <= 4:
      return f'({a} {self.pick(["+", "-"])} {b})'
    if kind == 5:
      return f'({a} * 0.5)'
    if kind == 6:
      return f'{self.pick(["min", "max"])}({a}, {b})'
    if kind == 7:
      return f'abs({a})'
    if kind == 8:
      return self.pick([f'sum(a) * 0.25', f'max(a)', f'min(x)', f'cs[{self.idx(loop_vars)}]' if loop_vars else 'cs[0]'])
    return f'(c * 0.5)'

  def cond(self, loop_vars):
    a, b = self.expr(loop_vars, 1), self.expr(loop_vars, 1)
    c = f'{a} {self.pick(["<", ">", "<=", ">="])} {b}'
    return self.pick([c, c, f'{c} and t > -1.0', f'not {c}', f'c < 3 or {c}'])

  def emit(self, ind, s):
    self.lines.append('  ' * ind + s)

  def block(self, ind, loops, loop_vars, depth, budget):
    n = self.draw(st.integers(1, 3))
    for _ in range(n):
      self.stmt(ind, loops, loop_vars, depth, budget)

  def stmt(self, ind, loops, loop_vars, depth, budget):
    opts = ['assign', 'assign', 'item', 'augitem', 'swap', 'ann', 'count']
    if depth < 2:
      opts += ['if', 'if', 'for_static', 'for_enum', 'for_traced', 'while']
    if loops and loops[-1] == 'jump':  # a collecting loop has a static trip count: no jumps
      opts += ['break', 'continue']
    if loops and loops[-1] == 'collect':  # appends only at a collecting loop's top level
      opts += ['append', 'append']
    if depth == 0:
      opts += ['early_return', 'recur'] + ['early_return'] * self.mixed
    elif not any(l.startswith('collect') for l in loops):  # a return would make a collecting loop exit early
      opts += ['early_return']
    k = self.pick(opts)
    e = lambda: self.expr(loop_vars)
    if k == 'assign':
      self.emit(ind, f't = {e()}')
    elif k == 'count':
      self.emit(ind, 'c = c + 1')
    elif k == 'item':
      self.emit(ind, f'a[{self.idx(loop_vars)}] = {e()}')
    elif k == 'augitem':
      self.emit(ind, f'a[{self.idx(loop_vars)}] {self.pick(["+=", "-=", "*="])} {self.pick(["0.5", "t * 0.25", "s"])}')
    elif k == 'swap':
      i, j = self.idx(loop_vars), self.idx(loop_vars)
      self.emit(ind, f'a[{i}], a[{j}] = a[{j}], a[{i}]')
    elif k == 'ann':
      self.n_idx += 1
      self.emit(ind, f'v{self.n_idx}: float = {e()}')
      self.emit(ind, f't = t + v{self.n_idx} * 0.5')
    elif k == 'if':
      if loops and loops[-1] == 'collect':  # no append under a traced condition
        loops = loops[:-1] + ['collect-if']
      self.emit(ind, f'if {self.cond(loop_vars)}:')
      self.block(ind + 1, loops, loop_vars, depth + 1, budget)
      if self.draw(st.booleans()):
        self.emit(ind, f'elif {self.cond(loop_vars)}:')
        self.block(ind + 1, loops, loop_vars, depth + 1, budget)
      if self.draw(st.booleans()):
        self.emit(ind, 'else:')
        self.block(ind + 1, loops, loop_vars, depth + 1, budget)
    elif k in ('for_static', 'for_enum', 'for_traced', 'while'):
      self.n_idx += 1
      i = f'i{self.n_idx}'
      # a loop either collects (appends at its top level; no break/continue, static trip count)
      # or may jump
      # (only at the top level, before any early return: appends under a traced `if` -- also the
      # `if not returned` guard after an early return -- would make the length traced)
      collect = k in ('for_static', 'for_enum') and depth == 0 and not self.returned and \
          self.draw(st.integers(0, 1)) == 0
      if k == 'for_static':
        self.emit(ind, f'for {i} in range({self.pick([N, 3, f"1, {N}", f"{N - 1}, -1, -1"])}):')
        lv = loop_vars + [i]
      elif k == 'for_enum':
        self.emit(ind, f'for {i}, r in enumerate(x):' if 'r' not in loop_vars else f'for {i} in range({N}):')
        lv = loop_vars + [i, 'r']
      elif k == 'for_traced':
        self.emit(ind, f'for {i} in range(k):')
        lv = loop_vars + [f'{i} % {N}']
      else:
        self.emit(ind, f'{i} = 0')
        self.emit(ind, f'while {i} < k + 1 and ({self.cond(loop_vars)}):')  # bounded: the test may contain `or`
        self.emit(ind + 1, f'{i} += 1')
        lv = loop_vars
      if collect:
        self.appends = True
        self.emit(ind + 1, f'ys.append({self.expr(lv)})')
        for _ in range(self.draw(st.integers(0, 2))):
          self.stmt(ind + 1, loops + ['collect'], lv, depth + 1, budget)
      else:
        self.block(ind + 1, loops + ['jump'], lv, depth + 1, budget)
    elif k == 'append':
      self.emit(ind, f'ys.append({self.expr(loop_vars)})')
    elif k in ('break', 'continue'):
      self.emit(ind, f'if {self.cond(loop_vars)}:')
      self.emit(ind + 1, k)
    elif k == 'early_return':
      self.returned = True
      self.emit(ind, f'if {self.cond(loop_vars)}:')
      self.emit(ind + 1, self.ret_stmt())
    elif k == 'recur':
      self.emit(ind, self.pick(['t = tail_decay(t, k, 0.0)', 'c = tail_count(t, 4.0, c)']))

  def ret(self):  # every return gives one structure (an early return may precede appends)
    return 't, a, c, (sum(ys) * 0.125 if ys else 0.0)'

  def ret_stmt(self):
    return 'return' if self.bare and self.draw(st.integers(0, 2)) == 0 else 'return ' + self.ret()


@st.composite
def programs(draw) -> str:
  g = _Gen(draw, mixed=draw(st.booleans()))
  g.emit(1, 'a = x * 1')
  g.emit(1, 't = s * 1')
  g.emit(1, 'c = 0')
  g.emit(1, 'ys = []')
  g.emit(1, f'cs = [{", ".join(str(0.5 * i - 1) for i in range(N))}]')
  for _ in range(draw(st.integers(1, 4))):
    g.stmt(1, [], [], 0, 0)
  end = g.pick(['value', 'bare', 'fall', 'fall'] if g.bare else ['value', 'fall', 'fall']) if g.mixed else 'value'
  if end != 'fall':
    g.emit(1, 'return ' + g.ret() if end == 'value' else 'return')
  else:
    g.emit(1, 't = t + 1.0')  # falls off its end: None
  return '\n'.join(g.lines)


def inputs(seed: int):
  r = np.random.RandomState(seed)
  return r.randn(N).astype(np.float32) * 2, np.float32(r.randn()), np.int32(r.randint(0, 4))


def load(body: str, tag: str):
  """Write the program to a file (autograph reads source) and import it."""
  d = os.path.join(tempfile.gettempdir(), f'jaxform_ag_fuzz_{os.getpid()}')  # per process: no cross-talk
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, f'prog_{tag}.py')
  with open(path, 'w') as f:
    f.write('import jax.numpy as jnp\n' + HELPERS + '\n\ndef prog(x, s, k):\n' + body + '\n')
  spec = importlib.util.spec_from_file_location(f'ag_fuzz_{tag}', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.prog


KIND_INPUTS = 32      # more inputs Python runs on to learn the program's return kinds
_PY_ERRORS = (RecursionError, ZeroDivisionError, OverflowError, FloatingPointError)
_SKIP = object()      # Python itself fails on the main input


def _norm(out):
  return [np.asarray(v, np.float64) for v in out]


def _close(got, want):
  g, w = _norm(got), _norm(want)
  for u, v in zip(g, w):
    if u.shape != v.shape or not np.allclose(u, v, rtol=1e-4, atol=1e-4, equal_nan=True):
      return False
  return True


def _kind(out) -> str:
  return 'none' if out is None else 'value'


def python_result(fn, seed: int):
  x, s, k = inputs(seed)
  try:
    return fn(x.copy(), s, int(k))
  except _PY_ERRORS:
    return _SKIP


def python_kinds(fn, seed: int, n: int = KIND_INPUTS) -> set:
  """The kinds of result ('none' / 'value') plain Python gives on n inputs drawn from seed."""
  kinds = set()
  for j in range(n):
    out = python_result(fn, (seed * 7919 + 1 + j) % 2 ** 32)
    if out is not _SKIP:
      kinds.add(_kind(out))
  return kinds


def static_kinds(fn) -> set:
  """The kinds the source can return with every condition free: 'value' for `return <expr>`,
  'none' for a bare `return` or a body that can reach its end."""
  node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
  kinds = {'none' if r.value is None else 'value' for r in ast.walk(node) if isinstance(r, ast.Return)}
  return kinds | ({'none'} if not isinstance(node.body[-1], ast.Return) else set())


def is_kind_error(e) -> bool:
  """autograph's error for a value on some traced paths and None on others."""
  return isinstance(e, AutographError) and 'one structure on every path' in str(e) and 'None' in str(e)


def judge(fn, seed: int, mode: str, got, err, want, kinds: set, stats: dict) -> str | None:
  """None when the converted function's outcome (got, or the exception err) is correct for
  Python's result `want` on this input, Python's return kinds over many inputs and the
  kinds its source can return (see the module docstring)."""
  if want is _SKIP:
    return None
  mixed = kinds >= {'none', 'value'}
  if err is not None:
    if mode == 'eager' or not is_kind_error(err):  # concrete values run as Python: never an error
      return f'{mode}: {type(err).__name__}: {err}'
    if mixed:
      stats['kind_errors'] += 1
      return None
    if len(static_kinds(fn)) == 2:  # a kind Python did not take here, behind a traced condition
      stats['unobserved_kind_errors'] += 1
      return None
    return f'{mode}: return-kind AutographError, but the source returns only {sorted(static_kinds(fn))}: {err}'
  if mixed and mode != 'eager':
    return f'{mode}: Python returns None on some inputs and a value on others, but jit gave {got!r} (no error)'
  if want is None or got is None:
    if want is None and got is None:
      stats['none_results'] += 1
      return None
    return f'{mode}: got {got!r} want {want!r}'
  return None if _close(got, want) else f'{mode}: got {_norm(got)} want {_norm(want)}'


def _convert_all(fns, mode: str, args):
  """Run each program converted (one jit for all in the jit modes); an exception while one
  program is converted / traced is that program's outcome. Returns [(got, err)]."""
  conv = [autograph(fn, recursive=True, static_range='python' if mode == 'eager' else mode) for fn in fns]
  errs = {}

  def each(*a):
    outs = []
    for i, c in enumerate(conv):
      try:
        outs.append(c(*a))
      except Exception as e:  # noqa: BLE001 -- judged per program
        errs[i] = e
        outs.append(None)
    return outs

  gots = each(*args) if mode == 'eager' else jax.jit(each)(*args)
  return [(None, errs[i]) if i in errs else (g, None) for i, g in enumerate(gots)]


def new_stats() -> dict:
  return dict(programs=0, mixed=0, none_only=0, value_only=0, kind_errors=0, unobserved_kind_errors=0,
              none_results=0)


def check(body: str, tag: str, seed: int, modes=('eager', 'python', 'lax'), stats: dict | None = None) -> str | None:
  """None if every mode is correct for plain Python, else a description of the mismatch."""
  stats = new_stats() if stats is None else stats
  fn = load(body, tag)
  want = python_result(fn, seed)
  if want is _SKIP:
    return None  # not a valid Python program on these inputs
  kinds = python_kinds(fn, seed)
  x, s, k = inputs(seed)
  args = (jnp.asarray(x), jnp.asarray(s), jnp.asarray(k))
  for mode in modes:
    try:
      (got, err), = _convert_all([fn], mode, args)
    except Exception as e:  # noqa: BLE001 -- jit itself failed (lowering / compiling)
      got, err = None, e
    bad = judge(fn, seed, mode, got, err, want, kinds, stats)
    if bad:
      tb = ''.join(traceback.format_exception(err, limit=-3)) if err is not None else ''
      return f'{bad}\n{tb}'
  return None


def check_batch(fns: list, wants: list, kinds: list, seed: int, mode: str, stats: dict) -> list | None:
  """Many programs under one jit (one XLA compile amortizes its fixed cost): None when all
  are correct, else the indices to re-check one by one. wants / kinds: Python's results
  on this seed's input and its return kinds (python_result / python_kinds)."""
  x, s, k = inputs(seed)
  args = (jnp.asarray(x), jnp.asarray(s), jnp.asarray(k))
  try:
    outs = _convert_all(fns, mode, args)
  except Exception:  # noqa: BLE001 -- the batch's jit failed as a whole: find the culprit one by one
    return list(range(len(fns)))
  bad = [i for i, (fn, (g, e), w, kd) in enumerate(zip(fns, outs, wants, kinds))
         if judge(fn, seed, mode, g, e, w, kd, stats)]
  return bad or None


def draw_programs(n: int, seed: int) -> list:
  """n program bodies, deterministic in seed."""
  from hypothesis import HealthCheck, given, settings
  from hypothesis import seed as hseed
  bodies = []

  @hseed(seed)
  @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
  @given(programs())
  def collect(body):
    bodies.append(body)
  collect()
  return bodies


def run_batched(n: int, seed: int = 0, batch: int = 20, verbose: bool = True, eager_every: int = 4):
  """Offline mode: programs checked in batches per mode; a failing batch is re-checked per
  program (check) so each mismatch is reported with its source. Returns (count, mismatches,
  stats): stats counts the programs whose Python results mix None and values ('mixed'), are
  all None / all values, the expected return-kind errors seen under jit, and None results."""
  bodies = draw_programs(n, seed)
  bad, stats = [], new_stats()
  for b0 in range(0, len(bodies), batch):
    chunk = bodies[b0:b0 + batch]
    bseed = seed * 100003 + b0
    fns = [load(body, f'{seed}_b{b0 + i}') for i, body in enumerate(chunk)]
    wants = [python_result(fn, bseed) for fn in fns]
    kinds = [python_kinds(fn, bseed) if w is not _SKIP else set() for fn, w in zip(fns, wants)]
    for kd in kinds:  # for the report
      stats['programs'] += 1
      key = 'mixed' if len(kd) == 2 else 'none_only' if kd == {'none'} else 'value_only' if kd else None
      if key:
        stats[key] += 1
    suspects = set()
    # eager (Python-mode dispatch, op by op) costs as much as a jit: every 4th batch only
    for mode in ('eager', 'python', 'lax') if eager_every and (b0 // batch) % eager_every == 0 else ('python', 'lax'):
      suspects |= set(check_batch(fns, wants, kinds, bseed, mode, stats) or [])
    for i in sorted(suspects):  # same inputs as the batch
      body = chunk[i]
      err = check(body, f'{seed}_r{b0 + i}', bseed)
      if err:
        bad.append((body, err))
        if verbose:
          print(f'--- mismatch #{len(bad)} (program {b0 + i}) ---\ndef prog(x, s, k):\n{body}\n{err}', flush=True)
    if verbose:
      print(f'{min(b0 + batch, len(bodies))} programs, {len(bad)} mismatches  {stats}', flush=True)
  return len(bodies), bad, stats


def run(n: int, seed: int = 0, modes=('eager', 'python', 'lax'), verbose: bool = True):
  """Draw n programs deterministically from `seed`, each checked on its own (no batching);
  returns (count, mismatches)."""
  bodies = draw_programs(n, seed)
  bad = []
  for i, body in enumerate(bodies):
    ms = modes if modes != 'alternate' else ('eager', ('python', 'lax')[i % 2])
    err = check(body, f'{seed}_{i}', seed * 100003 + i, ms)
    if err:
      bad.append((body, err))
      if verbose:
        print(f'--- mismatch #{len(bad)} (program {i}) ---\ndef prog(x, s, k):\n{body}\n{err}', flush=True)
    if verbose and (i + 1) % 100 == 0:
      print(f'{i + 1} programs, {len(bad)} mismatches', flush=True)
  return len(bodies), bad


if __name__ == '__main__':
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
  seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
  count, bad, stats = run_batched(n, seed)
  print(f'AutoGraph fuzz: {count} programs (seed {seed}), {len(bad)} mismatches; {stats}')
