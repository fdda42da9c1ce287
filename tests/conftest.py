"""Test setup: verify every graph a pass emits; 8 host CPU devices for sharding tests."""
import os
import tempfile

import pytest

os.environ.setdefault("JAXFORM_CHECK", "1")
# The planner asks XLA for memory but times nothing (timing every candidate would make the suite slow and its
# verdicts noise-dependent); tests/plan/test_measured.py turns timing on where it tests it.
os.environ.setdefault("JAXFORM_MEASURE", "memory")
os.environ.setdefault("JAXFORM_TUNE_CACHE", tempfile.mkdtemp(prefix="jaxform-test-cache-"))   # no stale answers
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

if os.environ.get("JAXFORM_TEST_SCAN3") == "1":
    # `make test-scan3`: the loop-pass tests with JAX's loops and remat on refs (jax_scan3, jax_remat3),
    # as the day JAX turns them on by default. A JAX without the flags has nothing to test here: say so.
    import jax
    from jaxform import _jax
    missing = [f for f in _jax.LOOP_FLAGS if f not in _jax.loop_flags()]
    if missing:
        raise RuntimeError(f"JAXFORM_TEST_SCAN3=1, but JAX {jax.__version__} has no {', '.join(missing)}")
    for _flag in _jax.LOOP_FLAGS:
        jax.config.update(_flag, True)


SLOW_SECONDS, HEAVY_SECONDS = 4.0, 3.0     # by tests/durations.txt (measured): the long tier; left out of newest-JAX
PLAN_SLOW_SECONDS = 20.0   # the planner's own verdicts (tests/plan/) stay in the fast tier up to this


def _measured() -> dict:
    here = os.path.join(os.path.dirname(__file__), "durations.txt")
    with open(here) as f:
        return {p[1]: float(p[0]) for line in f if not line.startswith("#") and len(p := line.split()) == 2}


def pytest_collection_modifyitems(config, items):
    """Mark tests by their measured time (tests/durations.txt): `slow` from SLOW_SECONDS (the long tier, `make
    test-slow`), `heavy` from HEAVY_SECONDS (`make test-jax-latest` leaves these out: the JAX 0.10.2 tier ran
    them; the newest JAX gets every test under 3 s, its adapters are exercised there). Keeps CI under an hour:
    the fast tier on 2 cores is about 20 min (at 20 s it ran past 45 and CI past its 90, 2026-11-28; stop 56's CI
    took 3691 s with every tests/plan test and the 5 s mark, so 4 s and a 20 s cap for tests/plan, 2026-11-29)."""
    import pytest
    seconds = _measured()
    for item in items:
        t = seconds.get(item.nodeid)
        plan = item.nodeid.startswith("tests/plan/")     # (the planner's own verdicts stay in the fast tier longer)
        if t is not None and t >= (PLAN_SLOW_SECONDS if plan else SLOW_SECONDS):
            item.add_marker(pytest.mark.slow)
        if t is not None and t >= HEAVY_SECONDS:
            item.add_marker(pytest.mark.heavy)


def pytest_terminal_summary(terminalreporter, config):
    """Print the fuzzing report (tests/fuzz/report.py). Here, not in tests/fuzz/conftest.py: under
    pytest-xdist the controller does not collect, so it only loads the conftest files of its arguments."""
    if hasattr(config, "workerinput"):
        return
    from fuzz import report
    d = report.run_dir(controller=True)
    text = report.summary(d)
    if text:
        terminalreporter.write_sep("-", "fuzz report")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"  (written to {os.path.join(d, 'report.txt')})")


@pytest.fixture
def revolve_as_scheduled(monkeypatch):
    """For tests that attack revolve itself. Since a byte budget on loops is measured (`plan.memory.fit_loops`,
    b2d4e1f: the least XLA measures of the model's schedule and the uniform ones is kept), a 1-byte budget is
    not revolve wherever XLA measures remat of each step smaller (JAX 0.10.2 on an AMD EPYC, 2026-11-30): the
    tests' `_is_revolve` preconditions failed, and strict xfails "held" on them. The loops get the schedule the
    model gives the budget (revolve, 1 slot; "min": sqrt), unmeasured, as when those tests were written."""
    from jaxform.passes import decisions

    def as_scheduled(graph, memory, schedule, warn=True):
        schedule(graph, memory)
        return graph
    monkeypatch.setitem(decisions._DECIDERS, "fit_loops", as_scheduled)
