"""How each higher-order primitive holds its sub-programs.

A *region* is a sub-jaxpr stored in an equation's params. For the primitives
listed here the IR turns it into a sub-Graph that passes can rewrite; the
params are rebuilt from the sub-Graph on the way back. Primitives not listed
stay opaque: their params (and any jaxprs inside) are carried through untouched.
Names of every supported JAX version are listed (0.11 replaced `closed_call` and
`core_call` by `eval_jaxpr`); params are in jaxform's canonical layout (see _jax.py).

    kind "closed":       params[key] is a ClosedJaxpr
    kind "open":         params[key] is a Jaxpr (no consts)
    kind "closed_tuple": params[key] is a tuple of ClosedJaxprs (cond branches)
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Region:
    param: str      # the params key that holds the sub-jaxpr(s)
    name: str       # the region's name on the Node: node.regions[name]
    kind: str       # "closed" | "open" | "closed_tuple"


REGIONS: dict[str, tuple[Region, ...]] = {
    "scan": (Region("jaxpr", "body", "closed"),),
    "while": (Region("cond_jaxpr", "cond", "closed"), Region("body_jaxpr", "body", "closed")),
    "cond": (Region("branches", "branches", "closed_tuple"),),
    "jit": (Region("jaxpr", "body", "closed"),),
    "pjit": (Region("jaxpr", "body", "closed"),),
    "closed_call": (Region("call_jaxpr", "body", "closed"),),
    "eval_jaxpr": (Region("call_jaxpr", "body", "closed"),),   # JAX 0.11+: closed_call and core_call
    "core_call": (Region("call_jaxpr", "body", "open"),),
    "custom_jvp_call": (Region("call_jaxpr", "body", "closed"),),
    "custom_vjp_call": (Region("call_jaxpr", "body", "closed"),),
    "remat2": (Region("jaxpr", "body", "open"),),
    "checkpoint": (Region("jaxpr", "body", "open"),),
    "shard_map": (Region("jaxpr", "body", "open"),),
}

# Bodies that are plain calls: inputs map 1:1 to operands, outputs to results.
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "eval_jaxpr"})


def regions_of(prim_name: str) -> tuple[Region, ...]:
    return REGIONS.get(prim_name, ())


# ---- roles: named slices of a loop's operands, body inputs and results -------

def scan_roles(params) -> dict[str, slice]:
    """scan operands = consts | carry | xs ; results = carry | ys (same for body)."""
    c, k = params["num_consts"], params["num_carry"]
    return {"consts": slice(0, c), "carry": slice(c, c + k), "xs": slice(c + k, None),
            "carry_out": slice(0, k), "ys": slice(k, None)}


def while_roles(params) -> dict[str, slice]:
    """while operands = cond_consts | body_consts | carry ; results = carry."""
    c, b = params["cond_nconsts"], params["body_nconsts"]
    return {"cond_consts": slice(0, c), "body_consts": slice(c, c + b), "carry": slice(c + b, None)}


def cond_roles(params) -> dict[str, slice]:
    """cond operands = index | operands (each branch takes the operands)."""
    return {"index": slice(0, 1), "operands": slice(1, None)}
