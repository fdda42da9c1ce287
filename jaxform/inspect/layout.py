"""A small layered layout, drawn as SVG: graphs without Graphviz.

Each graph is laid out top to bottom in layers (a node one layer below its
deepest operand); within a layer nodes are ordered by the mean x of their
operands (one barycenter sweep, enough for the chains jaxprs are). A node
with bodies (scan, while, cond, jit, ...) is a box that holds its bodies'
layouts: nested graphs become nested clusters.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from html import escape
from typing import Callable

from ..ir import Graph, Node, Value
from .program import short_location

CHAR_W, LINE_H, PAD, GAP_X, GAP_Y = 7.0, 15, 8, 16, 30
STYLE = {  # mark -> (fill, stroke)
    None: ("#e3f2fd", "#1e88e5"), "new": ("#ffcc80", "#e65100"), "removed": ("#ef9a9a", "#c62828"),
    "io": ("#f5f5f5", "#757575"), "region": ("#fafafa", "#90a4ae"),
}


def aval_str(v: Value) -> str:
    return v.aval.str_short(short_dtypes=True)


@dataclass
class Box:
    """A laid-out graph: its size and SVG elements in its own coordinates."""
    w: float
    h: float
    parts: list = field(default_factory=list)


@dataclass
class _Item:
    kind: str                    # "in" | "node" | "out"
    lines: list
    tip: str
    mark: str | None
    node: Node | None = None
    inner: list = field(default_factory=list)   # (label, Box) of bodies
    srcs: list = field(default_factory=list)    # source items, one per drawn operand
    layer: int = 0
    x: float = 0.0
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0


def node_lines(n: Node, name: Callable[[Value], str]) -> list[str]:
    outs = " ".join(name(o) for o in n.outputs) or "_"
    lits = " ".join(name(v) for v in n.inputs if v.is_literal)
    avals = " ".join(aval_str(o) for o in n.outputs[:3]) + (" ..." if len(n.outputs) > 3 else "")
    return [f"{outs} = {n.name}{' ' + lits if lits else ''}"[:48], avals[:48]]


def node_tip(n: Node) -> str:
    params = ", ".join(f"{k}={v}"[:80] for k, v in sorted(n.params.items()))
    return f"{n.name}[{params}]" + (f"\n{short_location(n.location())}" if n.location() else "")


def layout(g: Graph, name: Callable[[Value], str], mark: Callable[[Node], str | None]) -> Box:
    items, src = [], {}
    for v in [*g.consts, *g.inputs]:
        it = _Item("in", [f"{name(v)}: {aval_str(v)}"], "constant" if v.is_const else "input", "io")
        items.append(it)
        src[v.id] = it
    for n in g.nodes:
        it = _Item("node", node_lines(n, name), node_tip(n), mark(n), n)
        for rname, r in n.regions.items():
            subs = r if isinstance(r, tuple) else (r,)
            for i, sub in enumerate(subs):
                it.inner.append((f"{rname}[{i}]" if isinstance(r, tuple) else rname, layout(sub, name, mark)))
        it.srcs = [src[v.id] for v in n.inputs if not v.is_literal and v.id in src]
        for o in n.outputs:
            src[o.id] = it
        items.append(it)
    outs = "out: " + " ".join(name(v) for v in g.outputs)
    out = _Item("out", [outs if len(outs) <= 48 else outs[:45] + "..."], "outputs", "io")
    out.srcs = [src[v.id] for v in g.outputs if not v.is_literal and v.id in src]
    items.append(out)
    for it in items:   # sizes and layers (items are in dependency order)
        it.layer = 1 + max((s.layer for s in it.srcs), default=-1) if it.kind != "in" else 0
        it.w = max(len(s) for s in it.lines) * CHAR_W + 2 * PAD
        it.h = len(it.lines) * LINE_H + PAD
        if it.inner:
            it.w = max(it.w, sum(b.w for _, b in it.inner) + GAP_X * (len(it.inner) + 1))
            it.h += LINE_H + max(b.h for _, b in it.inner) + PAD
    out.layer = max(out.layer, max(it.layer for it in items[:-1]) + 1) if len(items) > 1 else 0
    layers: dict[int, list] = {}
    for it in items:
        layers.setdefault(it.layer, []).append(it)
    width = max(sum(it.w for it in row) + GAP_X * (len(row) + 1) for row in layers.values())
    y = PAD
    for k in sorted(layers):
        row = layers[k]
        row.sort(key=lambda it: sum(s.x + s.w / 2 for s in it.srcs) / len(it.srcs) if it.srcs else 0)
        x = (width - sum(it.w for it in row) - GAP_X * (len(row) - 1)) / 2
        for it in row:
            it.x, it.y, x = x, y, x + it.w + GAP_X
        y += max(it.h for it in row) + GAP_Y
    box = Box(width, y - GAP_Y + PAD)
    for it in items:   # edges first, under the nodes
        for j, s in enumerate(sorted(it.srcs, key=lambda s: s.x)):   # ports in the order of their sources
            sx, sy = s.x + s.w / 2, s.y + s.h
            tx, ty = it.x + it.w * (j + 1) / (len(it.srcs) + 1), it.y
            box.parts.append(f'<path d="M{sx:.1f},{sy:.1f} C{sx:.1f},{sy + GAP_Y / 2:.1f} {tx:.1f},'
                             f'{ty - GAP_Y / 2:.1f} {tx:.1f},{ty - 3:.1f}" class="edge" marker-end="url(#arrow)"/>')
    for it in items:
        box.parts.extend(_draw(it))
    return box


def _draw(it: _Item) -> list[str]:
    fill, stroke = STYLE[it.mark]
    if it.inner:   # a node with bodies: a light cluster, its border says whether it changed
        fill, stroke = STYLE["region"][0], stroke if it.mark else STYLE["region"][1]
    dash = ' stroke-dasharray="5,3"' if it.inner else ""
    dash += ' stroke-width="2"' if it.mark in ("new", "removed") else ""
    rx = 14 if it.kind == "in" else 4
    p = [f'<g class="{it.kind} {it.mark or ""}"><title>{escape(it.tip)}</title>',
         f'<rect x="{it.x:.1f}" y="{it.y:.1f}" width="{it.w:.1f}" height="{it.h:.1f}" rx="{rx}" '
         f'fill="{fill}" stroke="{stroke}"{dash}/>']
    for i, line in enumerate(it.lines):
        p.append(f'<text x="{it.x + PAD:.1f}" y="{it.y + PAD / 2 + LINE_H * (i + 0.8):.1f}"'
                 f'{" class=" + chr(34) + "aval" + chr(34) if i else ""}>{escape(line)}</text>')
    x, y = it.x + GAP_X, it.y + len(it.lines) * LINE_H + PAD
    for label, b in it.inner:
        p.append(f'<text x="{x:.1f}" y="{y + LINE_H * 0.8:.1f}" class="region">{escape(label)}</text>')
        p.append(f'<g transform="translate({x:.1f},{y + LINE_H:.1f})">')
        p.append(f'<rect width="{b.w:.1f}" height="{b.h:.1f}" fill="#ffffff" stroke="{STYLE["region"][1]}" '
                 'stroke-dasharray="2,2"/>')
        p.extend(b.parts)
        p.append("</g>")
        x += b.w + GAP_X
    p.append("</g>")
    return p


CSS = """text{font:12px monospace;fill:#212121}text.aval{fill:#546e7a}text.region{font-style:italic;fill:#607d8b}
.edge{fill:none;stroke:#78909c;stroke-width:1.2}"""


def svg(box: Box, title: str = "") -> str:
    """A standalone <svg> element for a laid-out graph."""
    head = f'<text x="{PAD}" y="{LINE_H}" style="font-weight:bold">{escape(title)}</text>' if title else ""
    dy = LINE_H + PAD if title else 0
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{box.w:.0f}" height="{box.h + dy:.0f}" '
            f'viewBox="0 0 {box.w:.0f} {box.h + dy:.0f}"><style>{CSS}</style>'
            '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
            'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#78909c"/></marker></defs>'
            f'{head}<g transform="translate(0,{dy})">{"".join(box.parts)}</g></svg>')
