"""`jaxform.rewrite(fn, rules)`: a function with your rules (only them) applied to its program.

It sits above `optimize` (it is `optimize` with one pass made of the rules), and the rule machinery
(`jaxform.rewrite`: Pat, Rules, rule_by_example) sits below the passes, which use it: imports run one way.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .optimize import optimize
from .rewrite.engine import RewriteStats, Rule, Rules


def rewrite(fn: Callable | None = None, rules: Rules | Iterable = (), *, strict: bool = True,
            static_argnums: int | Sequence[int] | None = None,
            static_argnames: str | Sequence[str] | None = None) -> Callable:
    """Apply `rules` (only them) to `fn`: a drop-in wrapper like `optimize`, composable with jit/grad/vmap.

    The wrapper's `.stats` (a RewriteStats) counts which rule fired where, over every
    signature traced so far. strict=True (default) raises if the rules fail (a cycle,
    a replacement of the wrong type): they are your rules, so you want to know.
    """
    if fn is None:
        return lambda f: rewrite(f, rules, strict=strict, static_argnums=static_argnums,
                                 static_argnames=static_argnames)
    rules = rules if isinstance(rules, Rules) else Rules([rules]) if isinstance(rules, Rule) else Rules(rules)
    stats = RewriteStats()

    def apply_rules(graph):
        rules.apply(graph, stats)
        return graph

    apply_rules.pass_name, apply_rules.exact = rules.pass_name, rules.exact
    wrapped = optimize(fn, passes=[apply_rules], strict=strict, static_argnums=static_argnums,
                       static_argnames=static_argnames)
    wrapped.stats = stats
    wrapped.rules = rules
    return wrapped
