"""`show(fn, *args)`: the program before and after the passes, as text, with a diff."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..ir import Graph
from ..ir.printing import diff, format_graph
from . import program
from .match import Match, match


def paired(before: Graph, after: Graph, m: Match | None = None) -> tuple[str, str, dict, dict]:
    """Print both graphs so that corresponding values have the same names (the diff shows only changes).

    Returns both texts and both names dicts (Value.id -> name).
    """
    m = match(before, after) if m is None else m
    names: dict = {}
    text_before = format_graph(before, names)
    after_of = {old.id: vid for vid, old in m.names.items()}
    shared = {after_of.get(vid, vid): name for vid, name in names.items()}  # new names continue after these
    return text_before, format_graph(after, shared), names, shared


def paired_text(before: Graph, after: Graph, m: Match | None = None) -> tuple[str, str]:
    return paired(before, after, m)[:2]


@dataclass
class Shown:
    """Printable before/after of a program; `str()` gives both texts and their diff."""
    function: str
    passes: list            # the pipeline that ran
    fired: list             # the passes that changed the program
    before: str
    after: str
    diff: str

    def __str__(self) -> str:
        fired = ", ".join(self.fired) or "none"
        return "\n".join([f"# {self.function}: before", self.before,
                          f"# after {', '.join(self.passes)} (changed it: {fired})", self.after,
                          "# diff", self.diff or "(no change)"])

    def _repr_pretty_(self, p, cycle):   # IPython shows it like print()
        p.text(str(self))

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def show(fn: Callable, *args, passes: Sequence | str | None = None) -> Shown:
    """Trace `fn(*args)`, run the passes (default pipeline), and return before/after text and diff.

    args: arrays or `jax.ShapeDtypeStruct`s (pytrees of them). `print(show(...))`.
    """
    closed, _ = program.trace_flat(fn, args)
    fired: list = []
    after = program.run(closed, passes, lambda name, *_: fired.append(name))
    before_text, after_text = paired_text(Graph.from_jaxpr(closed), Graph.from_jaxpr(after))
    return Shown(program.fn_name(fn), [program.pass_name(p) for p in program.pipeline(passes)], fired,
                 before_text, after_text, diff(before_text, after_text))
