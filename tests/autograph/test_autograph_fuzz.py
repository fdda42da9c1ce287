"""The fixed-seed CI share of the AutoGraph differential fuzzer (fuzz_autograph.py): 24
programs, each checked eagerly and under jit with static_range='python' and 'lax' against
plain Python on NumPy values (batched: one jit per mode). The offline run
(`python tests/autograph/fuzz_autograph.py 300 SEED`, repeated over seeds) draws thousands."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fuzz_autograph  # noqa: E402
from jaxform.autograph import operators  # noqa: E402

SEED, COUNT = 3, 24


def test_fuzz_fixed_seed():
  count, bad, stats = fuzz_autograph.run_batched(COUNT, seed=SEED, batch=COUNT, verbose=False)
  assert count == COUNT
  assert not bad, '\n\n'.join(f'def prog(x, s, k):\n{body}\n{err}' for body, err in bad)
  # not vacuous: this share has programs whose Python results mix None and values (each must
  # raise the return-kind error under jit, in both static_range modes) and programs returning None
  assert stats['mixed'] >= 3 and stats['kind_errors'] == 2 * stats['mixed'], stats
  assert stats['none_only'] >= 3 and stats['none_results'] >= stats['none_only'], stats


def test_fuzz_catches_the_zero_filled_fall_off(monkeypatch):
  """The oracle fails when the old bug is put back (a traced fall-off returned the zero-filled
  value instead of raising): every mixed-kind program of the share is then a mismatch."""
  def old_retval(v, flag=False, ret=()):
    return None if isinstance(v, operators.Undefined) else v

  monkeypatch.setattr(operators, 'retval', old_retval)
  bodies = fuzz_autograph.draw_programs(COUNT, SEED)
  seed = SEED * 100003  # the inputs run_batched gives the first batch
  mixed = bad = 0
  for i, body in enumerate(bodies):
    lines = body.splitlines()
    if lines[-1].strip().startswith('return') or any(l.strip() == 'return' for l in lines):
      continue  # only value returns and a fall-off end: the mixing the old code zero-filled
    fn = fuzz_autograph.load(body, f'meta_{i}')
    if fuzz_autograph.python_result(fn, seed) is fuzz_autograph._SKIP or len(fuzz_autograph.python_kinds(fn, seed)) < 2:
      continue
    mixed += 1
    err = fuzz_autograph.check(body, f'meta_r{i}', seed, modes=('python',))
    bad += bool(err and 'no error' in err)
  assert mixed >= 1 and bad == mixed, (mixed, bad)
