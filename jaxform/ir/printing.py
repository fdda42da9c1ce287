"""Text form of a Graph (reads like a jaxpr) and a before/after diff.

Names are kept in a `names` dict keyed by Value identity, so printing the same
graph before and after a pass (which edits it in place) names the untouched
values alike and the diff shows only what changed.
"""
from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # types only: graph.py imports this module (Graph.__str__)
    from .graph import Graph, Value


def _fresh(names: dict) -> str:
    n, s = len(names), ""
    while True:
        s = chr(ord("a") + n % 26) + s
        n = n // 26 - 1
        if n < 0:
            return s


def _shown(v) -> bool:
    """Hide params that only say 'nothing requested' (unspecified shardings, empty meshes, None)."""
    items = v if isinstance(v, tuple) else (v,)
    return not all(x is None or x is False or type(x).__name__ in ("UnspecifiedValue", "Mesh", "AbstractMesh", "LayoutHint")
                   for x in items) or v == ()


def _param(v) -> str:
    s = repr(v) if isinstance(v, str) else str(v)
    return s if len(s) < 60 else s[:57] + "..."


def format_graph(g: Graph, names: dict | None = None, indent: int = 0) -> str:
    names = {} if names is None else names

    def name(v: Value) -> str:
        if v.is_literal:
            lit = np.asarray(v.literal)  # TypedInt/TypedFloat and numpy scalars print as plain numbers
            return f"{lit.item() if lit.ndim == 0 else lit}:{v.aval.str_short(short_dtypes=True)}"
        if v.id not in names:
            names[v.id] = _fresh(names)
        return names[v.id]

    def decl(v: Value) -> str:
        return f"{name(v)}:{v.aval.str_short(short_dtypes=True)}" if v.uses else "_"

    pad = "  " * indent
    consts = " ".join(decl(v) for v in g.consts)
    ins = " ".join(decl(v) if v.uses else f"{name(v)}:{v.aval.str_short(short_dtypes=True)}" for v in g.inputs)
    lines = [f"{pad}{{ lambda {consts}; {ins}. let"]
    for n in g.nodes:
        params = " ".join(f"{k}={_param(v)}" for k, v in sorted(n.params.items()) if _shown(v) and not (isinstance(v, tuple) and not v))
        head = f"{pad}    {' '.join(decl(o) for o in n.outputs)} = {n.prim.name}"
        args = " ".join(name(v) for v in n.inputs)
        if not n.regions:
            lines.append(f"{head}{f'[{params}]' if params else ''} {args}")
            continue
        lines.append(f"{head}[{params}")
        for rname, r in n.regions.items():
            for i, sub in enumerate(r if isinstance(r, tuple) else (r,)):
                label = f"{rname}[{i}]" if isinstance(r, tuple) else rname
                lines.append(f"{pad}      {label}=")
                lines.append(format_graph(sub, names, indent + 4))
        lines.append(f"{pad}    ] {args}")
    lines.append(f"{pad}  in ({', '.join(name(v) for v in g.outputs)}) }}")
    return "\n".join(lines)


def diff(before: str, after: str, context: int = 2) -> str:
    """Unified diff of two printed graphs ('' when equal)."""
    return "\n".join(difflib.unified_diff(before.splitlines(), after.splitlines(), "before", "after",
                                          n=context, lineterm=""))
