"""Where to cut a loop-free program into segments: the bytes alive across each cut and the bytes made
before it, and the k - 1 cut points that share the work evenly at narrow places.

Shared by the two memory passes that cut programs (`remat_program` checkpoints the segments of a
forward program; `recompute` recomputes them inside a program that is already a gradient), so that a
cut costs the same in both.
"""
from __future__ import annotations

from .. import _jax
from ..ir.flops import MATMULS
from ..ir.sizes import value_bytes

MIN_EQNS_PER_SEGMENT = 4


def cuts(jaxpr) -> tuple[list[float], list[float]]:
    """Per equation index i: bytes alive across a cut before equation i (made earlier, read at or
    after i), and bytes made by equations before i (a proxy for what AD stores up to there)."""
    eqns = jaxpr.eqns
    made_at, last = {}, {}
    for i, e in enumerate(eqns):
        for v in e.invars:
            if not _jax.is_literal(v):
                last[v] = i
        for v in e.outvars:
            made_at[v] = i
    for v in jaxpr.outvars:
        if not _jax.is_literal(v):
            last[v] = len(eqns)
    delta = [0.0] * (len(eqns) + 2)
    for v, i in made_at.items():
        if v in last and not _jax.is_dropvar(v):
            delta[i + 1] += value_bytes(v)
            delta[last[v] + 1] -= value_bytes(v)
    across, made, live, total = [], [], 0.0, 0.0
    for i in range(len(eqns) + 1):
        live += delta[i]
        across.append(live)
        made.append(total)
        if i < len(eqns):
            total += sum(value_bytes(v) for v in eqns[i].outvars if not _jax.is_dropvar(v))
    return across, made


def boundaries(jaxpr, k: int, *, reach: float = 0.25, narrow: float | None = None,
               guard: float = 0.0) -> list[int]:
    """k - 1 cut points: near equal shares of the bytes made, each at the narrowest cut within `reach`
    segments of its share (and not within `guard` segments of either end). narrow=None: the least bytes
    alive wins; a float: any point within that share of the least is narrow, and among those the tie rules
    decide. Ties: just before a matmul (its input is stored for the weight gradient anyway; measured on
    an MLP, a cut after the matmul instead kept 5.5 of 5.5 MiB, before it 4.5), then nearest the share."""
    across, made = cuts(jaxpr)
    n = len(jaxpr.eqns)
    total = made[-1] or 1.0
    window, edge = max(1, int(n * reach / k)), max(MIN_EQNS_PER_SEGMENT, int(n * guard / k))
    out: list[int] = []
    for j in range(1, k):
        target = next((i for i in range(n + 1) if made[i] >= total * j / k), n)
        lo = max(out[-1] + MIN_EQNS_PER_SEGMENT if out else edge, target - window)
        hi = min(n - edge, target + window)
        if lo > hi:
            continue
        least = min(across[lo:hi + 1])
        width = (lambda i: across[i]) if narrow is None else (lambda i: across[i] > (1 + narrow) * least)
        out.append(min(range(lo, hi + 1), key=lambda i: (width(i), i >= n or jaxpr.eqns[i].primitive.name
                                                         not in MATMULS, abs(i - target))))
    return out
