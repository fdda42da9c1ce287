"""`op_table()`: what the front end does with each op class PyTensor's JAX backend registers
(native, partial, fallback, unsupported), so a new PyTensor's ops show before a model meets them.
"""
from __future__ import annotations

from .registry import CONVERTERS, SCALARS
from .walk import _jax_funcify
from .scan import _ofg_has_own_jax
from .ops import _ensure_registered


# Op classes whose converter handles the common cases and hands the rest to the fallback.
_PARTIAL = {"CAReduce": "bitwise and/or of integers", "Blockwise": "core ops without a converter",
            "AllocDiag": "offset != 0 or batched", "SolveTriangular": "transposed solves",
            "Scan": "mit-mot (gradient) scans", "OpFromGraph": "inner ops without a converter"}


def op_table() -> dict[str, str]:
    """What jaxform does with each op class PyTensor's JAX backend registers (and each scalar op PyMC-style
    graphs use inside Elemwise): 'native' (a jaxform converter), 'partial' (a converter for the common cases,
    the fallback for the rest), 'fallback' (PyTensor's jax_funcify, traced and spliced in) or 'unsupported'
    (jax_funcify raises here, e.g. ops needing tensorflow-probability). Keys are 'module.Class'.

    Lets tests (and users) see which ops a new PyTensor adds or changes before a model meets them.
    """
    import importlib
    from pytensor.graph.op import Op
    from pytensor.scalar.basic import ScalarOp
    for mod in ("pytensor.tensor", "pytensor.scan", "pytensor.ifelse", "pytensor.sparse", "pytensor.tensor.random"):
        importlib.import_module(mod)   # a fixed set of modules, so that the subclasses found do not vary
    from pytensor.tensor.random.op import RandomVariable
    _ensure_registered()
    jf = _jax_funcify()
    out: dict[str, str] = {}
    key = lambda c: f"{c.__module__}.{c.__qualname__}"
    # registered classes and PyTensor's own subclasses of them (dispatch follows the MRO: LogSumExp is an
    # OpFromGraph); the dozens of RandomVariables (never in a logp graph) as their base class only
    todo = [c for c in jf.registry if isinstance(c, type) and issubclass(c, Op) and not issubclass(c, ScalarOp)]
    seen: set = set()
    while todo:
        cls = todo.pop()
        if cls in seen or not cls.__module__.startswith("pytensor.") or cls.__module__.startswith("pytensor.link.") \
                and cls not in jf.registry or cls.__module__.startswith("pytensor.compile.debug"):
            continue   # (DebugMode's ops exist once a test imports it; never in a graph a mode compiles for JAX)
        seen.add(cls)
        owner = next((c for c in cls.__mro__ if c in CONVERTERS), None)   # the class whose converter applies
        if owner is not None and owner.__name__ == "OpFromGraph" and _ofg_has_own_jax(cls):
            owner = None
        out[key(cls)] = "fallback" if owner is None else "partial" if owner.__name__ in _PARTIAL else "native"
        if not issubclass(cls, RandomVariable):
            todo += cls.__subclasses__()
    scalars: dict[type, str] = {}
    for mod in ("pytensor.scalar.basic", "pytensor.scalar.math"):
        for v in vars(importlib.import_module(mod)).values():
            if isinstance(v, ScalarOp) and type(v) not in scalars:
                scalars[type(v)] = _scalar_status(jf, v)
    for cls in jf.registry:
        if isinstance(cls, type) and issubclass(cls, ScalarOp) and cls is not ScalarOp and cls not in scalars:
            scalars[cls] = "native" if cls.__name__ in SCALARS or cls.__name__ == "Composite" else "fallback"
    out.update({key(c): st for c, st in scalars.items()})
    return dict(sorted(out.items()))


def _scalar_status(jf, sop) -> str:
    if type(sop).__name__ in SCALARS or type(sop).__name__ == "Composite":
        return "native"
    import pytensor.scalar as ps
    n = sop.nin if sop.nin > 0 else 2
    for make in (ps.float64, ps.int64, ps.bool):
        try:
            node = sop.make_node(*[make() for _ in range(n)])
            break
        except Exception:
            node = None
    if node is None:
        return "unsupported"
    try:
        jf(sop, node=node)
    except Exception:
        return "unsupported"
    return "fallback"
