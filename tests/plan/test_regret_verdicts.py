"""The regret benchmark's reading of the planner's decisions (benchmarks/regret.py, issue 37): which verdict it
judges and against which candidates. The benchmark is not a test; what it counts as reversed is, since the issue's
target (reversed <= 5%) rests on it."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
regret = pytest.importorskip("regret")
from jaxform.plan.planner import Cost, Decision  # noqa: E402

NONE = Cost(())


class Planned:
    """A stand-in for `optimize(f)`: only its `decisions()`."""

    def __init__(self, *decisions):
        self._d = decisions

    def decisions(self):
        return list(self._d)


def d(name, kept, use=""):
    return Decision(name, kept, NONE, NONE, "", use=use)


def test_a_decision_undone_later_is_judged_rejected():
    """plan.sincos' forward: fusion kept, then undone for fission; the planner runs fission alone."""
    fn = Planned(d("fuse_scan_reductions", True), d("fuse_scan_reductions", False), d("fission", True))
    got, memory = regret.pass_verdicts(fn, "fwd")
    assert dict(got) == {"fuse_scan_reductions": False, "fission": True} and memory is None


def test_a_pass_kept_for_some_loops_only_is_partial():
    fn = Planned(d("fission [loop 1 of 2, x.py:1]", True), d("fission [loop 2 of 2, x.py:1]", False),
                 d("hoist_loop_invariants [loop 1 of 2, x.py:1]", True),
                 d("hoist_loop_invariants [loop 2 of 2, x.py:1]", True))
    got, _ = regret.pass_verdicts(fn, "opt_of_grad")
    assert dict(got) == {"fission": None, "hoist_loop_invariants": True}


def test_the_memory_setting_follows_remat_and_the_view():
    fn = Planned(d("hoist_loop_invariants", True, use="gradient"), d("remat_loops(memory='auto')", True,
                                                                       use="gradient"),
                 d("fission", True, use="forward"))
    got, memory = regret.pass_verdicts(fn, "grad_of_opt")
    assert dict(got) == {"hoist_loop_invariants": True} and memory == "auto"
    got, memory = regret.pass_verdicts(fn, "fwd")
    assert dict(got) == {"fission": True} and memory is None


def _res(**kw):
    base = {"plain": (1.0, 100_000), "planner": (0.9, 90_000)}
    base.update({k.replace("_", "/"): v for k, v in kw.items()})
    return base


def test_growth_within_a_page_is_not_a_reversal_and_beyond_it_is():
    V = regret.Verdict
    cands = {"hoist/auto": None, "-/auto": None}
    small = _res(**{"hoist_auto": (0.9, 8_488), "-_auto": (0.9, 8_344)})
    assert regret.verdicts(small, cands, [V("hoist_loop_invariants", True)], "auto")["reversed"] == []
    big = _res(**{"hoist_auto": (0.9, 18_488), "-_auto": (0.9, 8_344)})
    assert regret.verdicts(big, cands, [V("hoist_loop_invariants", True)], "auto")["reversed"] == \
        ["hoist_loop_invariants"]
    # ... and judged at the planner's memory setting: the unscheduled pair is not looked at
    assert regret.verdicts(big, cands, [V("hoist_loop_invariants", True)], None)["reversed"] == []


def test_a_partial_verdict_is_counted_apart_not_judged():
    V = regret.Verdict
    cands = {"fis/None": None, "-/None": None}
    res = _res(**{"fis_None": (2.0, 200_000), "-_None": (0.5, 50_000)})
    r = regret.verdicts(res, cands, [V("fission", None)])
    assert r["reversed"] == [] and r["decisions"] == 0 and r["partial"] == ["fission"]
    r = regret.verdicts(res, cands, [V("fission", True)])
    assert r["reversed"] == ["fission"] and r["decisions"] == 1
