"""`optimize(fn, tune=True)`: time what the cost model cannot separate, on the device, once.

Two candidate programs (the current one and a pass's proposal) are compiled
and timed interleaved, min of `REPS`, on the actual backend; the proposal wins
only if faster by more than the noise margin. The verdict is cached on disk,
keyed by both programs' structure, shapes, backend, device kind and JAX
version (as JAX's persistent compilation cache is keyed), so the next process
pays nothing. The cache holds verdicts, never programs: a stale or colliding
entry can only pick the slower of two correct programs.
"""
from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np

from .. import _jax

REPS = 7
NOISE = 0.03          # a proposal must be this much faster to win on measurement alone
CACHE_DIR = os.environ.get("JAXFORM_TUNE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "jaxform", "tune"))


def _key(a, b) -> str:
    dev = jax.devices()[0]
    text = "\n".join([str(a), str(b), jax.default_backend(), getattr(dev, "device_kind", ""), jax.__version__])
    return hashlib.sha256(text.encode()).hexdigest()


def _inputs(closed, example_args):
    if example_args is not None:
        return list(example_args)
    rng = np.random.default_rng(0)
    out = []
    for a in closed.in_avals:
        if np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.complexfloating):
            out.append(jax.numpy.asarray(rng.standard_normal(a.shape), a.dtype))
        else:
            out.append(jax.numpy.zeros(a.shape, a.dtype))
    return out


def time_programs(programs, args, reps: int = REPS) -> list[float]:
    """Min-of-`reps` seconds of each jitted program, runs interleaved (the machine's noise hits all alike)."""
    from ..inspect.program import min_time
    return min_time([jax.jit(lambda *x, c=c: _jax.eval_jaxpr(c, *x)) for c in programs], args, reps)


def measured(before, after, example_args=None) -> tuple[float, float] | None:
    """(seconds before, seconds after), from the disk cache or measured now; None if it cannot run."""
    key = _key(before, after)
    path = os.path.join(CACHE_DIR, key[:2], key + ".json")
    try:
        with open(path) as f:
            return tuple(json.load(f)["seconds"])
    except (OSError, ValueError, KeyError):
        pass
    if any(isinstance(c, _jax.Tracer) for c in list(before.consts) + list(after.consts)):
        return None
    try:
        args = _inputs(before, example_args)
        if any(isinstance(x, _jax.Tracer) for x in args):
            args = _inputs(before, None)
        t = time_programs([before, after], args)
    except Exception:  # noqa: BLE001 - a program that cannot run on its own (sharding, callbacks): no measurement
        return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"seconds": t}, f)
    except OSError:
        pass
    return tuple(t)
