"""Pattern-matching rewrites: Pat, Rules, rule_by_example (`jaxform.rewrite(fn, rules)` applies them to a function:
`jaxform/rewriting.py`, above `optimize`).

See docs/rewrite.md for a tutorial.
"""
from __future__ import annotations

from .by_example import rule_by_example
from .engine import Ctx, RewriteError, RewriteStats, Rule, Rules
from .pattern import Pat


__all__ = ["Pat", "Rules", "Rule", "Ctx", "RewriteStats", "RewriteError", "rule_by_example"]
