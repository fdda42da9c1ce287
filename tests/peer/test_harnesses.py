"""Peer suite: JAX's own primitive test harnesses through jaxform.

JAX ships, inside its wheel, one small program per use case of each primitive
(5,594 harnesses over 132 primitives in JAX 0.10.2; see
`jaxform._jax.primitive_harnesses`). Nobody here wrote them, so they probe
params, dtypes and shapes we would not think of. Each harness must survive:

1. the Graph round trip `Graph.from_jaxpr(closed).to_jaxpr()`: check_jaxpr, the
   same signature, bit-identical results; the Graph printer runs, shows every
   primitive, and prints the re-read round trip identically;
2. the default pipeline (`passes.default_pipeline()`, what `optimize` runs),
   strictly (a pass that fails raises) and verified after every pass
   (JAXFORM_CHECK=1 from conftest): bit-identical results, or within
   `jaxform.testing._close` tolerance (counted apart; the only non-exact
   default pass, fuse_scan_reductions, touches scans only).

Skipped: harnesses JAX itself marks unimplemented on CPU (`harness.filter("cpu")`
is False; the reason is JAX's Limitation, listed per primitive and dtype).

Values are compared eagerly (eval_jaxpr, op by op): the original and the
round trip bind the same primitives with the same params, so the second run
hits JAX's per-primitive compile cache. Measured on 549 harnesses: 38 s of CPU
eagerly vs 82 s with one `jax.jit` per version (compilation dominates).

CI runs a stratified sample (every 5th harness of each primitive group, so all
132 groups, 1,165 harnesses) in 12 chunks; the full set is @pytest.mark.slow
(about 6 CPU-minutes). `python tests/peer/test_harnesses.py [--full]` prints the
figures per category.
"""
from __future__ import annotations

import collections
import functools
import os
import re
import sys
import time

if __name__ == "__main__":  # as in tests/conftest.py
    os.environ.setdefault("JAXFORM_CHECK", "1")
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import numpy as np
import pytest

pytest.importorskip("absl")  # JAX's harness module imports absl.testing

import jax  # noqa: E402

from jaxform import _jax, passes  # noqa: E402
from jaxform.ir import Graph  # noqa: E402
from jaxform.ir.printing import format_graph  # noqa: E402
from jaxform.optimize import run_passes, verify  # noqa: E402
from jaxform.testing import _close  # noqa: E402

SAMPLE_EVERY, SAMPLE_CHUNKS, FULL_CHUNKS = 5, 12, 16


@functools.cache
def harnesses() -> tuple:
    hs = _jax.primitive_harnesses()
    if hs is None:
        pytest.skip("JAX's harnesses need absl-py")
    return tuple(hs)


@functools.cache
def sample() -> tuple:
    """Deterministic, stratified: every SAMPLE_EVERY-th harness of each primitive group (first one included)."""
    groups: dict[str, list] = collections.defaultdict(list)
    for h in harnesses():
        groups[h.group_name].append(h)
    return tuple(h for hs in groups.values() for h in hs[::SAMPLE_EVERY])


def unimplemented_on_cpu(h) -> str | None:
    """JAX's own reason for not running `h` on CPU, or None if it runs."""
    if h.filter("cpu"):
        return None
    why = {l.description for l in h.jax_unimplemented if l.filter(device="cpu", dtype=h.dtype)}
    return f"{h.group_name} {np.dtype(h.dtype).name}: {', '.join(sorted(why))} on CPU (JAX Limitation)"


def _arrays(outs) -> list[np.ndarray]:
    return [np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
            for x in outs]


def _bitwise(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b))


def _printed(g: Graph) -> str:
    text = format_graph(g)
    missing = {n.prim.name for n, _ in g.walk()} - set(re.findall(r"= ([\w-]+)", text))
    assert not missing, f"printer lost primitives {missing}"
    return text


def check(h) -> tuple[str, bool]:
    """Round trip + default pipeline on harness `h`: ('bitwise' | 'close', whether the pipeline changed it); raises on failure."""
    args = h.dyn_args_maker(np.random.RandomState(0))
    flat = jax.tree_util.tree_leaves(args)
    closed = jax.make_jaxpr(h.dyn_fun)(*args)
    run = lambda c: _arrays(_jax.jaxpr_as_fun(c)(*flat))
    ref = run(closed)

    g = Graph.from_jaxpr(closed)
    text = _printed(g)
    rt = g.to_jaxpr()
    verify(rt, closed)  # check_jaxpr + signature
    assert format_graph(Graph.from_jaxpr(rt)) == text, "round trip prints differently"
    assert _bitwise(ref, run(rt)), "round trip changed the results"

    opt = run_passes(closed, passes.default_pipeline(), strict=True)
    changed = _printed(Graph.from_jaxpr(opt)) != text
    out = run(opt)
    if _bitwise(ref, out):
        return "bitwise", changed
    _close(ref, out, f"{h.fullname} after the default pipeline")
    return "close", changed


def run_all(hs) -> tuple[collections.Counter, dict, list]:
    """Counts per category, skip reasons with counts, and failures (name, error)."""
    counts, reasons, failures = collections.Counter(), collections.Counter(), []
    for h in hs:
        why = unimplemented_on_cpu(h)
        if why is not None:
            counts["skipped"] += 1
            reasons[why] += 1
            continue
        try:
            how, changed = check(h)
            counts["passed " + how] += 1
            counts["(of which changed by the pipeline)"] += changed
        except Exception as e:
            counts["failed"] += 1
            failures.append((h.fullname, f"{type(e).__name__}: {str(e)[:400]}"))
    return counts, dict(reasons), failures


def _run_chunk(hs):
    t = time.process_time()
    counts, reasons, failures = run_all(hs)
    print(f"{len(hs)} harnesses: {dict(counts)} in {time.process_time() - t:.1f} CPU-s; skipped: {reasons}")
    assert not failures, "\n".join(f"{n}: {e}" for n, e in failures[:20])
    assert counts["passed bitwise"] + counts["passed close"] + counts["skipped"] == len(hs)


def test_sample_is_stratified():
    s, groups = sample(), {h.group_name for h in harnesses()}
    assert len(s) >= 1000 and {h.group_name for h in s} == groups
    assert len({h.fullname for h in s}) == len(s)


@pytest.mark.parametrize("chunk", range(SAMPLE_CHUNKS))
def test_harness_sample(chunk):
    _run_chunk(sample()[chunk::SAMPLE_CHUNKS])


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(FULL_CHUNKS))
def test_all_harnesses(chunk):
    _run_chunk(harnesses()[chunk::FULL_CHUNKS])


if __name__ == "__main__":  # figures for the README: python tests/peer/test_harnesses.py [--full]
    hs = harnesses() if "--full" in sys.argv else sample()
    t0 = time.process_time()
    counts, reasons, failures = run_all(hs)
    print(f"{len(hs)} harnesses over {len({h.group_name for h in hs})} primitive groups, "
          f"{time.process_time() - t0:.0f} CPU-s")
    for k, v in sorted(counts.items()):
        print(f"  {k}: {v}")
    for r, v in sorted(reasons.items()):
        print(f"    skipped {v}: {r}")
    for n, e in failures:
        print(f"  FAILED {n}: {e}")
