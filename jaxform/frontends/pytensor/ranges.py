"""Value ranges of PyTensor variables, to prove a parameter check always holds (`_always_holds`):
a check known to hold needs no select in the converted program.
"""
from __future__ import annotations

import numpy as np



# Scalar ops' mathematical ranges (lo, hi, lo open, hi open) for every non-NaN input. Open ends are reached
# in floating point only by underflow (exp(-800) == 0), where a logp is already -inf or NaN.
_RANGES = {"Sigmoid": (0.0, 1.0, True, True), "Exp": (0.0, np.inf, True, False),
           "Softplus": (0.0, np.inf, True, False), "Abs": (0.0, np.inf, False, False),
           "Sqr": (0.0, np.inf, False, False), "Sqrt": (0.0, np.inf, False, False),
           "Erfc": (0.0, 2.0, True, True), "Cosh": (1.0, np.inf, False, False)}
_CMP = {"GE": lambda r, c: r[0] >= c, "GT": lambda r, c: r[0] > c or (r[0] == c and r[2]),
        "LE": lambda r, c: r[1] <= c, "LT": lambda r, c: r[1] < c or (r[1] == c and r[3])}
_FLIP = {"GE": "LE", "GT": "LT", "LE": "GE", "LT": "GT"}


def _producer(var, env=None):
    """(op name, inputs, env) of the op computing `var`, looking into fused Composites (pytensor 2.38's JAX
    mode fuses checks): an Elemwise is named by its scalar op; `env` maps a Composite's inner inputs to the
    outer variables. None for graph inputs and constants."""
    env = env or {}
    var = env.get(var, var)
    owner = var.owner
    if owner is None:
        return None
    name = type(owner.op).__name__
    if name == "Elemwise":
        sop = owner.op.scalar_op
        if type(sop).__name__ == "Composite":
            inner = sop.fgraph.outputs[owner.outputs.index(var)]
            return _producer(inner, dict(zip(sop.fgraph.inputs, [env.get(i, i) for i in owner.inputs])))
        return type(sop).__name__, owner.inputs, env
    return name, owner.inputs, env


def _value_range(var, env=None):
    """(lo, hi, lo open, hi open) bounding every non-NaN value of a PyTensor variable, or None if unknown."""
    k = _scalar_constant((env or {}).get(var, var))
    if k is not None:
        return (k, k, False, False)
    p = _producer(var, env)
    if p is None:
        return None
    name, ins, env = p
    if name in ("DimShuffle", "SpecifyShape", "Identity", "Cast", "ScalarFromTensor", "TensorFromScalar"):
        return _value_range(ins[0], env)
    return _RANGES.get(name)


def _always_holds(var, env=None) -> bool:
    """A boolean PyTensor condition that is true for every non-NaN input: comparisons of a bounded value
    with a constant (`exp(x) > 0` counts: mathematically true, false only once exp underflows), and
    all/and/stacks of such. Where an input is NaN (or underflows) the check would give -inf; without it the
    logp is NaN, as PyTensor's JAX backend gives (it drops every check). Samplers reject both."""
    from pytensor.graph.basic import Constant
    v = (env or {}).get(var, var)
    if isinstance(v, Constant):
        return bool(np.all(v.data))
    p = _producer(var, env)
    if p is None:
        return False
    name, ins, env = p
    if name in ("DimShuffle", "SpecifyShape", "MakeVector", "ScalarFromTensor", "TensorFromScalar", "AND",
                "Identity"):
        return all(_always_holds(i, env) for i in ins)
    if name == "Join":
        # pytensor <= 3.0: the axis is the first input; later a property of the op
        return all(_always_holds(i, env) for i in (ins[1:] if getattr(v.owner.op, "axis", None) is None else ins))
    if name in ("All", "CAReduce") and type(getattr(v.owner.op, "scalar_op", None)).__name__ == "AND":
        return _always_holds(ins[0], env)
    if name in _CMP:
        a, c = ins
        if _scalar_constant(env.get(c, c)) is None:
            a, c, name = c, a, _FLIP[name]
        k = _scalar_constant(env.get(c, c))
        r = _value_range(a, env)
        return k is not None and r is not None and bool(_CMP[name](r, k))
    return False


def _scalar_constant(var) -> float | None:
    """The value of a one-element constant (possibly broadcast by a DimShuffle), else None."""
    from pytensor.graph.basic import Constant
    while var.owner is not None and type(var.owner.op).__name__ == "DimShuffle":
        var = var.owner.inputs[0]
    if isinstance(var, Constant) and np.asarray(var.data).size == 1 and np.asarray(var.data).dtype.kind in "biuf":
        return float(np.asarray(var.data).reshape(()))
    return None
