"""A fuzzing campaign outside pytest: count every mismatch instead of stopping at the first.

    .venv/bin/python tests/fuzz/campaign.py --examples 300 --seed 1 --budget 280 --out /tmp/c1.json
    .venv/bin/python tests/fuzz/campaign.py --merge /tmp/c*.json
    .venv/bin/python tests/fuzz/campaign.py --edge --examples 150 --seed 1 --out /tmp/e1.json   # issue 26 classes

Each program is checked like in test_fuzz.py (every pipeline, the round trip, and
the x64 ones, or with --api all, through the optimize() API too), but mismatches are collected per program
(kind of check x pipeline) and counted per construct the program contains; the
shortest program per (kind, pipeline) is kept as a reproducer. No shrinking: run
it in chunks of a few minutes with different seeds, then --merge.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzz.differential import STATS, check, pipelines  # noqa: E402
from fuzz.programs import edge_programs, programs  # noqa: E402


API = False  # --api: every program also through optimize() (default: the x64 ones)
EDGE = False  # --edge: issue 26's programs (edge_programs: special values, mixed precision, integer bodies, ...)


def run(examples: int, s: int, budget: float = float("inf"), out: str | None = None) -> dict:
    """Up to `examples` programs from seed `s`, stopping after `budget` seconds; results saved to `out`
    after every program (a chunk cut off by a time limit keeps what it did)."""
    found, repro, errors = collections.Counter(), {}, []
    t0 = time.time()

    def result():
        return {"stats": dict(STATS), "found": dict(found), "repro": repro, "errors": errors,
                "seconds": time.time() - t0, "pipelines": sorted(pipelines())}

    @seed(s)
    @settings(max_examples=examples, deadline=None, database=None, print_blob=False, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(edge_programs() if EDGE else programs())
    def one(prog):
        if time.time() - t0 > budget:
            return
        got = []
        try:
            check(prog, api=API or None, collect=got)
        except Exception as e:  # noqa: BLE001 - JAX itself rejects the program: a generator bug, counted
            if type(e).__name__ == "UnsatisfiedAssumption":
                raise               # the check rejected the program (JAX cannot transform the original)
            errors.append(f"{type(e).__name__}: {str(e)[:300]}\n{prog}")
            got = []
        if got:
            found["programs_with_mismatch"] += 1
        for key in {(e.kind, "/".join(e.who)) for e in got}:
            found["|".join(key)] += 1
            for f in prog.features:
                found[f"{f}|{key[0]}"] += 1
            msg = next(str(e) for e in got if (e.kind, "/".join(e.who)) == key)
            if "|".join(key) not in repro or len(str(prog)) < len(repro["|".join(key)][0]):
                repro["|".join(key)] = (str(prog), msg[:600])
        if out:
            with open(out, "w") as f:
                json.dump(result(), f)

    one()
    return result()


def show(data: dict) -> str:
    from fuzz.report import table
    stats, found = collections.Counter(data["stats"]), collections.Counter(data["found"])
    lines = [f"{stats['programs']} programs in {data['seconds']:.0f} s; {found['programs_with_mismatch']} with a "
             f"mismatch; {len(data['errors'])} rejected by JAX itself (generator errors)"]
    lines += table(stats, data["pipelines"])
    lines.append("mismatches (programs) per check kind | pipeline:")
    lines += [f"  {k:<50} {v:>5}" for k, v in sorted(found.items()) if k.count("|") == 1 and not
              any(k.startswith(f + "|") for f in (x[4:] for x in stats if x.startswith("has:")))]
    lines.append("mismatches (programs) per construct | check kind:")
    lines += [f"  {k:<50} {v:>5}" for k, v in sorted(found.items()) if
              any(k.startswith(f + "|") for f in (x[4:] for x in stats if x.startswith("has:")))]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--examples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out")
    ap.add_argument("--merge", nargs="*")
    ap.add_argument("--api", action="store_true")
    ap.add_argument("--edge", action="store_true", help="issue 26's edge programs instead of the general ones")
    ap.add_argument("--budget", type=float, default=float("inf"), help="seconds; stop generating after that")
    a = ap.parse_args()
    global API, EDGE
    API, EDGE = a.api, a.edge
    if a.merge:
        data = {"stats": collections.Counter(), "found": collections.Counter(), "repro": {}, "errors": [],
                "seconds": 0.0, "pipelines": set()}
        for path in a.merge:
            with open(path) as f:
                d = json.load(f)
            data["stats"].update(d["stats"])
            data["found"].update(d["found"])
            data["errors"] += d["errors"]
            data["seconds"] += d["seconds"]
            data["pipelines"] |= set(d["pipelines"])
            for k, v in d["repro"].items():
                if k not in data["repro"] or len(v[0]) < len(data["repro"][k][0]):
                    data["repro"][k] = v
        data["pipelines"] = sorted(data["pipelines"])
    else:
        data = run(a.examples, a.seed, a.budget, a.out)
    print(show(data))
    for k, (src, msg) in sorted(data["repro"].items()):
        print(f"\n===== {k}\n{msg}\n{src}")
    for e in data["errors"][:5]:
        print(f"\n===== generator error\n{e}")


if __name__ == "__main__":
    main()
