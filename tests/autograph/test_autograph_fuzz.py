"""The fixed-seed CI share of the AutoGraph differential fuzzer (fuzz_autograph.py): 16
programs, each checked eagerly and under jit with static_range='python' and 'lax' against
plain Python on NumPy values (batched: one jit per mode). The offline run
(`python tests/autograph/fuzz_autograph.py 300 SEED`, repeated over seeds) draws thousands."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import fuzz_autograph  # noqa: E402


def test_fuzz_fixed_seed():
  count, bad = fuzz_autograph.run_batched(16, seed=7, batch=16, verbose=False)
  assert count == 16
  assert not bad, '\n\n'.join(f'def prog(x, s, k):\n{body}\n{err}' for body, err in bad)
