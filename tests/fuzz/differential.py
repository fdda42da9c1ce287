"""Differential runner: every registered pass and the default pipeline on one program.

For each pipeline: run it strictly (an exception fails the check), verify the
emitted jaxpr (`check_jaxpr` + same signature), then compare with the
original. Outputs are compared up to the Graph round trip (a pipeline whose
output prints like the round-tripped original, constants included, changed
nothing), pipelines with the same output share one comparison, and all
distinct outputs are compared in ONE jitted probe computing, per version,
values, derivatives (forward mode where the program has a while_loop, which
has no reverse mode) and vmap over a stacked batch: compiling is the cost.
"""
from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from jaxform import _jax, passes
from jaxform.ir import Graph
from jaxform.optimize import PassError, run_passes, verify
from jaxform.testing import _close

STATS: collections.Counter = collections.Counter()  # "programs", "<pipeline>:changed": for the report


def pipelines() -> dict[str, list[str]]:
    """Every registered pass alone, and the default pipeline (read now: passes are added over time)."""
    out = {name: [name] for name in sorted(passes.PASSES)}
    out["DEFAULT"] = list(passes.DEFAULT)
    return out


def _key(closed):
    """Identity of a program up to variable naming: re-emit through Graph, print, hash constants."""
    canon = Graph.from_jaxpr(closed).to_jaxpr()
    consts = tuple((np.shape(c), str(np.asarray(c).dtype), np.asarray(c).tobytes()) for c in canon.consts)
    return str(canon.jaxpr), consts


def probe(versions, leaves, reverse: bool = True):
    """Per flat jaxpr in `versions`: (values, derivatives, vmapped values), all in one jit."""
    stacked = [jnp.stack([x, x * 0.5]) for x in leaves]
    tangents = tuple(jnp.ones_like(x) for x in leaves)
    argnums = tuple(range(len(leaves)))

    def one(closed, xs):
        f = lambda *a: _jax.eval_jaxpr(closed, *a)
        loss = lambda *a: sum(jnp.sum(jnp.sin(o)) for o in f(*a) if jnp.issubdtype(o.dtype, jnp.floating))
        if not any(jnp.issubdtype(a.dtype, jnp.floating) for a in closed.out_avals):
            d = ()
        elif reverse:
            d = jax.grad(loss, argnums=argnums)(*xs)
        else:
            d = jax.jvp(loss, tuple(xs), tangents)[1]
        return f(*xs), d, jax.vmap(f)(*stacked)

    return jax.jit(lambda *xs: [one(c, xs) for c in versions])(*leaves)


def check(prog, names: dict[str, list[str]] | None = None) -> list[str]:
    """Check `prog` (a fuzz Program) under each pipeline; return the names of those that changed it."""
    names = pipelines() if names is None else names
    args = prog.args()
    leaves = jax.tree_util.tree_leaves(args)
    closed = jax.make_jaxpr(prog.fn)(*args)
    same = _key(closed)
    versions: dict = {}
    for name, pipeline in names.items():
        try:
            out = run_passes(closed, pipeline, strict=True)
            verify(out, closed)
        except (PassError, TypeError, _jax.JaxprTypeError) as e:
            raise AssertionError(f"{name} failed on this program:\n{prog}\n{type(e).__name__}: {e}") from e
        k = _key(out)
        if k != same:
            versions.setdefault(k, (out, []))[1].append(name)
    STATS["programs"] += 1
    if not versions:
        return []
    want, *got = probe([closed] + [out for out, _ in versions.values()], leaves, prog.reverse_diff)
    changed = []
    for g, (_, who) in zip(got, versions.values()):
        _close(want, g, f"{'/'.join(who)} changed the results of this program:\n{prog}\n(values, derivatives, vmap)")
        changed += who
    for name in changed:
        STATS[f"{name}:changed"] += 1
    return changed
