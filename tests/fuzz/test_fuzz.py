"""Differential fuzzing: every registered pass and the default pipeline on random programs.

A fixed seed per chunk makes CI reproducible; the chunks run in parallel
under `pytest -n`. JAXFORM_FUZZ_EXAMPLES=5000 tries more programs (default
80 in all: programs now carry callbacks, RNG, low precision and scan-then-reduce
losses, and cost about 6x more CPU each: 80 keep CI within ~1.5x of the old 320). Counts go to a report in the temp dir (see
report.py), printed at the end of the session; one chunk in four also checks
every program through the optimize() API. For a campaign that counts every
mismatch instead of stopping at the first, see campaign.py.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from fuzz import report
from fuzz.differential import STATS, check, pipelines
from fuzz.programs import programs

EXAMPLES = int(os.environ.get("JAXFORM_FUZZ_EXAMPLES", "80"))
CHUNKS = 8


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_passes_on_random_programs(chunk):
    before = STATS.copy()

    @seed(20240 + chunk)
    @settings(max_examples=-(-EXAMPLES // CHUNKS), deadline=None, database=None, print_blob=False,
              phases=[Phase.generate, Phase.target, Phase.shrink], suppress_health_check=list(HealthCheck))
    @given(programs())
    def run(prog):
        check(prog, api=True if chunk % 4 == 0 else None)

    run()
    mine = STATS.copy()
    mine.subtract(before)
    report.record(chunk, mine, sorted(pipelines()))
    assert mine["programs"] > 0
