"""Fuzzing counts across pytest-xdist workers: one JSON file per chunk in a temp dir, one summary.

The directory is keyed by the pytest controller's pid (a worker's parent), so
the summary printed at the end of the session (tests/conftest.py) covers this run only.
"""
from __future__ import annotations

import collections
import json
import os
import tempfile


def run_dir(controller: bool = False) -> str:
    pid = os.getpid() if controller or "PYTEST_XDIST_WORKER" not in os.environ else os.getppid()
    return os.path.join(tempfile.gettempdir(), "jaxform-fuzz", str(pid))


def record(chunk: int, stats: collections.Counter, names: list[str]) -> None:
    d = run_dir()
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"chunk-{chunk}.json"), "w") as f:
        json.dump({"stats": dict(stats), "pipelines": names}, f)


def table(total: collections.Counter, names) -> list[str]:
    """Per pipeline: programs changed; per construct: programs containing it and changed by each pipeline."""
    n = total["programs"]
    names = sorted(names)
    w = max([24] + [len(name) for name in names])
    lines = [f"  {name:<{w}} changed {total[f'{name}:changed']:>5} / {n}" for name in names]
    lines += [f"  {k.split(':')[0]:<{w}} its last pass changed the first's output in {v:>5} / "
              f"{total['has:grad_program']} grad programs" for k, v in sorted(total.items())
              if k.endswith(":last_changed") and "|" not in k]
    feats = sorted(k[4:] for k in total if k.startswith("has:"))
    if feats:
        short = [nm.replace("hoist_loop_invariants", "licm").replace("fuse_scan_reductions", "fusion")
                 .replace("algebra_exact", "alg_ex")[:8] for nm in names]
        lines.append(f"  {'construct (programs with it; changed by)':<40} {'progs':>6} "
                     + " ".join(f"{s:>8}" for s in short))
        for f in feats:
            lines.append(f"  {f:<40} {total['has:' + f]:>6} "
                         + " ".join(f"{total[f'{f}|{nm}:changed']:>8}" for nm in names))
    return lines


def summary(d: str) -> str | None:
    """The report text for the chunks recorded in `d` (None if there are none); also written to d/report.txt."""
    files = sorted(f for f in os.listdir(d) if f.startswith("chunk-")) if os.path.isdir(d) else []
    if not files:
        return None
    total, names = collections.Counter(), set()
    for f in files:
        with open(os.path.join(d, f)) as fh:
            data = json.load(fh)
        total.update(data["stats"])
        names.update(data["pipelines"])
    n = total["programs"]
    lines = [f"jaxform differential fuzzing: {n} programs x {len(names)} pipelines + round trip ({len(files)} chunks), "
             "all checked: check_jaxpr, values, derivatives, vmap, dtypes + weak types, callback sequences; "
             f"{total['api']} also through optimize()"]
    text = "\n".join(lines + table(total, names))
    with open(os.path.join(d, "report.txt"), "w") as fh:
        fh.write(text + "\n")
    return text
