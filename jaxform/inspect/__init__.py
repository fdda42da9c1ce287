"""Seeing what the compiler did: `show` (text + diff), `explain` (report), `draw` (pictures)."""
from .show import Shown, show
from .explain import Change, Report, explain
from .draw import DrawError, draw

__all__ = ["show", "explain", "draw", "Shown", "Report", "Change", "DrawError"]
