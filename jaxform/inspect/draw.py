"""`draw(fn, *args, path=...)`: the program before and after the passes, as a picture.

`.html`: a self-contained page (inline SVG from our own layout, no scripts,
no network, no Graphviz) with both graphs, the pass summary and the text
diff. `.svg` / `.png` / `.pdf`: Graphviz (`pip install graphviz` and the
`dot` binary, `apt-get install graphviz`). Bodies of scan/while/cond/jit
are nested clusters; nodes the passes added or changed are orange in
"after", nodes they removed are red in "before".
"""
from __future__ import annotations

import os
import shutil
from html import escape
from typing import Callable, Sequence

from ..ir import Graph, Node, Value
from ..ir.printing import diff as text_diff
from . import layout as L
from . import program
from .match import Match, match
from .show import paired


class DrawError(RuntimeError):
    """The picture cannot be made as asked (unknown format, Graphviz missing)."""


GRAPHVIZ_FORMATS = ("svg", "png", "pdf")


def draw(fn: Callable, *args, path: str | os.PathLike, passes: Sequence | str | None = None,
         engine: str = "auto") -> str:
    """Write before/after graphs of `fn(*args)` to `path` (.html, .svg, .png, .pdf); returns the path.

    engine: "auto" (HTML: our layout; others: Graphviz), "graphviz", or "builtin"
    (our layout, also for .svg: no Graphviz needed).
    """
    path = os.fspath(path)
    fmt, builtin = plan(path, engine)
    closed, _ = program.trace_flat(fn, args)
    fired: list = []
    after = program.run(closed, passes, lambda name, *_: fired.append(name))
    before_g, after_g = Graph.from_jaxpr(closed), Graph.from_jaxpr(after)
    m = match(before_g, after_g)
    text_b, text_a, names_b, names_a = paired(before_g, after_g, m)
    title = program.fn_name(fn)
    if builtin and fmt == "html":
        data = html_page(title, fired, before_g, after_g, m, names_b, names_a, text_diff(text_b, text_a)).encode()
    elif builtin:
        data = builtin_svg(title, fired, before_g, after_g, m, names_b, names_a).encode()
    else:
        data = to_dot(title, fired, before_g, after_g, m, names_b, names_a).pipe(format=fmt)
    with open(path, "wb") as f:
        f.write(data)
    return path


def plan(path: str, engine: str = "auto") -> tuple[str, bool]:
    """(format, use our layout?) for writing `path`; raises DrawError early for what cannot be written."""
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    fmt = "html" if fmt == "htm" else fmt
    if fmt not in ("html", *GRAPHVIZ_FORMATS):
        raise DrawError(f"jaxform.draw: cannot write {path!r}: use a path ending in .html, .svg, .png or .pdf")
    if engine not in ("auto", "graphviz", "builtin"):
        raise DrawError(f"jaxform.draw: engine must be 'auto', 'graphviz' or 'builtin', not {engine!r}")
    builtin = engine == "builtin" or (engine == "auto" and fmt == "html")
    if builtin and fmt not in ("html", "svg"):
        raise DrawError(f"jaxform.draw: the builtin engine writes .html or .svg, not .{fmt}")
    if not builtin and fmt not in GRAPHVIZ_FORMATS:
        raise DrawError(f"jaxform.draw: Graphviz writes .svg, .png or .pdf, not .{fmt}")
    if not builtin:
        _need_graphviz(path)
    return fmt, builtin


def _need_graphviz(path: str) -> None:
    try:
        import graphviz  # noqa: F401
    except ImportError:
        raise DrawError(f"jaxform.draw: writing {path!r} needs the graphviz Python package "
                        "(pip install graphviz); or write an .html path, which needs no Graphviz") from None
    if shutil.which("dot") is None:
        raise DrawError(f"jaxform.draw: writing {path!r} needs Graphviz's `dot` program (apt-get install graphviz "
                        "or brew install graphviz); or write an .html path, which needs no Graphviz")


def _namer(names: dict) -> Callable[[Value], str]:
    return lambda v: f"{v.literal}" if v.is_literal else names.get(v.id, "_")


def _summary(fired, before: Graph, after: Graph) -> str:
    return (f"passes that changed it: {', '.join(fired) or 'none'}; "
            f"equations {len(before)} -> {len(after)}")


# ---- our own layout: HTML page or one SVG ------------------------------------------

def _boxes(before, after, m: Match, names_b, names_a):
    return (L.layout(before, _namer(names_b), lambda n: "removed" if m.is_removed(n) else None),
            L.layout(after, _namer(names_a), lambda n: "new" if m.is_new(n) else None))


def builtin_svg(title, fired, before, after, m, names_b, names_a) -> str:
    b, a = _boxes(before, after, m, names_b, names_a)
    both = L.Box(b.w + a.w + 3 * L.GAP_X, max(b.h, a.h) + 2 * L.LINE_H)
    for label, box, x in (("before", b, L.GAP_X), ("after", a, b.w + 2 * L.GAP_X)):
        both.parts += [f'<text x="{x:.1f}" y="{L.LINE_H}" style="font-weight:bold">{label}</text>',
                       f'<g transform="translate({x:.1f},{L.LINE_H * 1.5})">', *box.parts, "</g>"]
    return L.svg(both, f"{title}: {_summary(fired, before, after)}")


PAGE_CSS = """body{font:14px system-ui,sans-serif;margin:16px;color:#212121;background:#fff}
h1{font-size:18px}h2{font-size:15px;margin:8px 0}.panes{display:flex;gap:16px;align-items:flex-start}
.pane{flex:1;min-width:0;border:1px solid #cfd8dc;border-radius:6px;padding:8px}.scroll{overflow:auto;max-height:80vh}
.legend span{display:inline-block;padding:2px 8px;margin-right:8px;border-radius:4px;border:1px solid}
pre{background:#fafafa;border:1px solid #eceff1;padding:8px;overflow:auto;font-size:12px}
.add{color:#1b5e20;background:#e8f5e9}.del{color:#b71c1c;background:#ffebee}"""


def html_page(title, fired, before, after, m, names_b, names_a, diff: str) -> str:
    """A self-contained page: summary, legend, both graphs side by side, and the text diff."""
    b, a = _boxes(before, after, m, names_b, names_a)
    legend = "".join(f'<span style="background:{L.STYLE[k][0]};border-color:{L.STYLE[k][1]}">{label}</span>'
                     for k, label in ((None, "unchanged"), ("new", "added or changed by the passes"),
                                      ("removed", "removed by the passes"), ("region", "body (scan/while/cond/jit)")))
    lines = [f'<span class="{"add" if l.startswith("+") else "del" if l.startswith("-") else ""}">{escape(l)}</span>'
             for l in (diff or "(no change)").splitlines()]
    panes = "".join(f'<div class="pane"><h2>{label}</h2><div class="scroll">{L.svg(box)}</div></div>'
                    for label, box in (("before", b), ("after", a)))
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>jaxform: {escape(title)}</title>'
            f'<style>{PAGE_CSS}</style></head><body><h1>jaxform: {escape(title)}</h1>'
            f'<p>{escape(_summary(fired, before, after))}</p><p class="legend">{legend}</p>'
            f'<div class="panes">{panes}</div><h2>diff</h2><pre>{chr(10).join(lines)}</pre></body></html>')


# ---- Graphviz ------------------------------------------------------------------------

def to_dot(title, fired, before: Graph, after: Graph, m: Match, names_b, names_a):
    """A graphviz.Digraph with 'before' and 'after' clusters, bodies as nested clusters."""
    import graphviz
    dot = graphviz.Digraph(graph_attr=dict(compound="true", rankdir="TB", fontname="Helvetica", labelloc="t",
                                           label=f"{title}\n{_summary(fired, before, after)}\n"
                                           "orange: added or changed by the passes, red: removed; "
                                           "dashed: bodies of scan/while/cond/jit", newrank="true"),
                           node_attr=dict(fontname="Courier", fontsize="10", shape="box", style="rounded,filled"),
                           edge_attr=dict(color="#78909c", arrowsize="0.6"))
    for side, g, names, mark in (("b", before, names_b, lambda n: "removed" if m.is_removed(n) else None),
                                 ("a", after, names_a, lambda n: "new" if m.is_new(n) else None)):
        with dot.subgraph(name=f"cluster_{side}") as c:
            c.attr(label="before" if side == "b" else "after", style="rounded", color="#cfd8dc")
            _dot_graph(c, g, _Ids(side), _namer(names), mark)
    return dot


class _Ids:
    """Stable Graphviz ids ('b1', 'b2', ...) in drawing order, so the same program gives the same file."""

    def __init__(self, side: str):
        self.side, self.ids = side, {}

    def __call__(self, obj) -> str:
        return self.ids.setdefault(id(obj), f"{self.side}{len(self.ids)}")


def _dot_graph(dot, g: Graph, uid: _Ids, name, mark) -> str:
    """Add g's nodes and edges to `dot`; returns the id of a node inside (an anchor for cluster edges)."""
    src = {}
    io = dict(fillcolor=L.STYLE["io"][0], color=L.STYLE["io"][1])
    with dot.subgraph() as row:   # inputs in a row, in order
        row.attr(rank="same")
        for v in [*g.consts, *g.inputs]:
            src[v.id] = nid = uid(v)
            row.node(nid, f"{name(v)}: {L.aval_str(v)}", shape="ellipse",
                     tooltip="constant" if v.is_const else "input", **io)
        ids = [src[v.id] for v in [*g.consts, *g.inputs]]
        for x, y in zip(ids, ids[1:]):
            row.edge(x, y, style="invis")
    for n in g.nodes:
        nid = uid(n)
        fill, stroke = L.STYLE[mark(n) if mark(n) or not n.regions else "region"]
        dot.node(nid, "\n".join(L.node_lines(n, name)), tooltip=L.node_tip(n), fillcolor=fill, color=stroke,
                 **({"penwidth": "2"} if mark(n) else {}))
        for v in n.inputs:
            if not v.is_literal and v.id in src:
                dot.edge(src[v.id], nid)
        for rname, r in n.regions.items():
            subs = r if isinstance(r, tuple) else (r,)
            for i, sub in enumerate(subs):
                cname = f"cluster_{uid(sub)}"
                with dot.subgraph(name=cname) as c:
                    c.attr(label=f"{n.name} {rname}" + (f"[{i}]" if isinstance(r, tuple) else ""),
                           style="rounded,dashed", color=L.STYLE["region"][1], fontname="Helvetica")
                    anchor = _dot_graph(c, sub, uid, name, mark)
                dot.edge(nid, anchor, lhead=cname, style="dotted", arrowhead="none")
        for o in n.outputs:
            src[o.id] = nid
    out, label = uid(g.outputs), "out: " + " ".join(name(v) for v in g.outputs)
    dot.node(out, label if len(label) <= 48 else label[:45] + "...", shape="ellipse", tooltip="outputs", **io)
    for v in g.outputs:
        if not v.is_literal and v.id in src:
            dot.edge(src[v.id], out)
    return uid(g.inputs[0]) if g.inputs else out
