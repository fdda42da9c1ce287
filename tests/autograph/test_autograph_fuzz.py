"""The fixed-seed CI share of the AutoGraph differential fuzzer (fuzz_autograph.py): a few
programs per run, each checked eagerly and under jit with static_range='python' and 'lax'
against plain Python on NumPy values. The offline run (`python tests/autograph/fuzz_autograph.py
2000`) draws thousands."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import fuzz_autograph  # noqa: E402


@pytest.mark.parametrize('seed', [11, 12])
def test_fuzz_fixed_seed(seed):
  count, bad = fuzz_autograph.run(6, seed=seed, verbose=False)
  assert count == 6
  assert not bad, '\n\n'.join(f'def prog(x, s, k):\n{body}\n{err}' for body, err in bad)
