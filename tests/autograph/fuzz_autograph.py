"""Differential fuzzer for AutoGraph: random Python programs, plain Python as the oracle.

A Hypothesis strategy writes a function over inputs x (float32[N]), s (float32 scalar) and
k (int32, a traced trip count) using the constructs AutoGraph converts: if/elif/else on
traced conditions, loops over static ranges, traced ranges and enumerate(x), while loops,
break/continue, early return, item assignment and augmented item assignment, tuple swaps
of items, annotated assignments, builtin min/max/abs/sum, list.append in traced loops
(-> stacked output), Python lists indexed by a loop index, and tail-recursive helpers.

Oracle: the unconverted function on NumPy float32 values. Checked: autograph(f) eagerly on
concrete JAX arrays, and jax.jit(autograph(f)) with static_range='python' and 'lax'.

    .venv/bin/python tests/autograph/fuzz_autograph.py 2000 SEED   # offline run (batched); prints a report
The CI share is tests/autograph/test_autograph_fuzz.py (fixed seed, a few dozen programs).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from jaxform.autograph import autograph

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

  def __init__(self, draw):
    self.draw, self.lines, self.n_idx, self.appends, self.returned = draw, [], 0, False, False

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
      opts += ['early_return', 'recur']
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
        self.emit(ind, f'while {i} < k + 1 and {self.cond(loop_vars)}:')
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
      self.emit(ind + 1, 'return ' + self.ret())
    elif k == 'recur':
      self.emit(ind, self.pick(['t = tail_decay(t, k, 0.0)', 'c = tail_count(t, 4.0, c)']))

  def ret(self):  # every return gives one structure (an early return may precede appends)
    return 't, a, c, (sum(ys) * 0.125 if ys else 0.0)'


@st.composite
def programs(draw) -> str:
  g = _Gen(draw)
  g.emit(1, 'a = x * 1')
  g.emit(1, 't = s * 1')
  g.emit(1, 'c = 0')
  g.emit(1, 'ys = []')
  g.emit(1, f'cs = [{", ".join(str(0.5 * i - 1) for i in range(N))}]')
  for _ in range(draw(st.integers(1, 4))):
    g.stmt(1, [], [], 0, 0)
  g.emit(1, 'return ' + g.ret())
  return '\n'.join(g.lines)


def inputs(seed: int):
  r = np.random.RandomState(seed)
  return r.randn(N).astype(np.float32) * 2, np.float32(r.randn()), np.int32(r.randint(0, 4))


def load(body: str, tag: str):
  """Write the program to a file (autograph reads source) and import it."""
  d = os.path.join(tempfile.gettempdir(), 'jaxform_ag_fuzz')
  os.makedirs(d, exist_ok=True)
  path = os.path.join(d, f'prog_{tag}.py')
  with open(path, 'w') as f:
    f.write('import jax.numpy as jnp\n' + HELPERS + '\n\ndef prog(x, s, k):\n' + body + '\n')
  spec = importlib.util.spec_from_file_location(f'ag_fuzz_{tag}', path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.prog


def _norm(out):
  return [np.asarray(v, np.float64) for v in out]


def _close(got, want):
  g, w = _norm(got), _norm(want)
  for u, v in zip(g, w):
    if u.shape != v.shape or not np.allclose(u, v, rtol=1e-4, atol=1e-4, equal_nan=True):
      return False
  return True


def check(body: str, tag: str, seed: int, modes=('eager', 'python', 'lax')) -> str | None:
  """None if every mode matches plain Python, else a description of the mismatch."""
  fn = load(body, tag)
  x, s, k = inputs(seed)
  try:
    want = fn(x.copy(), s, int(k))
  except (RecursionError, ZeroDivisionError, OverflowError, FloatingPointError):
    return None  # not a valid Python program on these inputs
  args = (jnp.asarray(x), jnp.asarray(s), jnp.asarray(k))
  for mode in modes:
    try:
      if mode == 'eager':
        got = autograph(fn, recursive=True)(*args)
      else:
        got = jax.jit(autograph(fn, recursive=True, static_range=mode))(*args)
    except Exception as e:
      return f'{mode}: {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}'
    if not _close(got, want):
      return f'{mode}: got {_norm(got)} want {_norm(want)}'
  return None


def check_batch(bodies: list, tag: str, seed: int, mode: str) -> list | None:
  """Many programs under one jit (one XLA compile amortizes its fixed cost): None when all
  match, else the indices to re-check one by one."""
  fns = [load(b, f'{tag}_{i}') for i, b in enumerate(bodies)]
  x, s, k = inputs(seed)
  wants = []
  for fn in fns:
    try:
      wants.append(fn(x.copy(), s, int(k)))
    except (RecursionError, ZeroDivisionError, OverflowError, FloatingPointError):
      wants.append(None)
  conv = [autograph(fn, recursive=True, static_range='python' if mode == 'eager' else mode) for fn in fns]
  args = (jnp.asarray(x), jnp.asarray(s), jnp.asarray(k))
  try:
    if mode == 'eager':
      gots = [c(*args) for c in conv]
    else:
      gots = jax.jit(lambda *a: [c(*a) for c in conv])(*args)
  except Exception:
    return list(range(len(bodies)))
  return [i for i, (g, w) in enumerate(zip(gots, wants)) if w is not None and not _close(g, w)] or None


def run_batched(n: int, seed: int = 0, batch: int = 20, verbose: bool = True, eager_every: int = 4):
  """Offline mode: programs checked in batches per mode; a failing batch is re-checked per
  program (check) so each mismatch is reported with its source."""
  from hypothesis import HealthCheck, given, settings
  from hypothesis import seed as hseed
  bodies = []

  @hseed(seed)
  @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
  @given(programs())
  def collect(body):
    bodies.append(body)
  collect()
  bad = []
  for b0 in range(0, len(bodies), batch):
    chunk = bodies[b0:b0 + batch]
    suspects = set()
    # eager (Python-mode dispatch, op by op) costs as much as a jit: every 4th batch only
    for mode in ('eager', 'python', 'lax') if eager_every and (b0 // batch) % eager_every == 0 else ('python', 'lax'):
      suspects |= set(check_batch(chunk, f'{seed}_b{b0}', seed * 100003 + b0, mode) or [])
    for i in sorted(suspects):  # same inputs as the batch
      body = chunk[i]
      err = check(body, f'{seed}_r{b0 + i}', seed * 100003 + b0)
      if err:
        bad.append((body, err))
        if verbose:
          print(f'--- mismatch #{len(bad)} (program {b0 + i}) ---\ndef prog(x, s, k):\n{body}\n{err}', flush=True)
    if verbose:
      print(f'{min(b0 + batch, len(bodies))} programs, {len(bad)} mismatches', flush=True)
  return len(bodies), bad


def run(n: int, seed: int = 0, modes=('eager', 'python', 'lax'), verbose: bool = True):
  """Draw n programs deterministically from `seed`; returns (count, mismatches)."""
  from hypothesis import HealthCheck, given, settings
  from hypothesis import seed as hseed
  bodies = []

  @hseed(seed)
  @settings(max_examples=n, database=None, deadline=None, derandomize=False,
            suppress_health_check=list(HealthCheck))
  @given(programs())
  def collect(body):
    bodies.append(body)
  collect()
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
  count, bad = run_batched(n, seed)
  print(f'AutoGraph fuzz: {count} programs (seed {seed}), {len(bad)} mismatches')
