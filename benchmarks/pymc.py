"""PyMC models: PyTensor's JAX backend (`pymc.sampling.jax.get_jaxified_graph`) vs jaxform, in one run.

Per model: conversion ms (PyMC logp graph → JAX callable; min of 3), first-call ms (jit compile + first
value-and-grad), steady-state µs (value-and-grad, interleaved min of N), and jaxform with rewrite=False.
Then a large unrolled hierarchical model (about 1k, 10k, 20k PyTensor nodes): the time to the first gradient
broken down (PyMC's logp graph, PyTensor's rewrites, conversion, JAX trace+lower, XLA compile) for PyTensor's
JAX backend and jaxform with and without PyTensor's rewrites.

Needs the PyMC environment (`.ci/pymc.sh` builds it):
    .venv-pymc/bin/python benchmarks/pymc.py [--quick]
"""
import os
import runpy
import sys
import time
import warnings

_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]  # this file is named like the package
sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..")]
warnings.simplefilter("ignore")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

from jaxform.frontends import pymc as jpm  # noqa: E402
from pymc.sampling.jax import get_jaxified_graph  # noqa: E402


# the models the tests check (tests/frontends/pymc_models.py), run by path: by name, `pymc_models`
# could be benchmarks/pymc_models.py, which imports `pymc` (this file's name): the scripts would import each other
_models = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "frontends",
                                      "pymc_models.py"))
MODELS, large_hierarchical = _models["MODELS"], _models["large_hierarchical"]


def _vg_pytensor(model):
    f = get_jaxified_graph(model.value_vars, [model.logp()])
    return jax.jit(jax.value_and_grad(lambda *a: f(*a)[0], argnums=tuple(range(len(model.value_vars)))))


def _vg_jaxform(model, rewrite=True):
    g, names = jpm.model_graph(model, rewrite=rewrite)
    from jaxform import to_function
    f = to_function(g)
    return jax.jit(jax.value_and_grad(f, argnums=tuple(range(len(names)))))


def _min_time(fn, n=3):
    best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _first_call(vg, args):
    t = time.perf_counter()
    jax.block_until_ready(vg(*args))
    return time.perf_counter() - t


def _steady(fns, args, n=200):
    best = [float("inf")] * len(fns)
    for _ in range(5):
        for i, f in enumerate(fns):
            t = time.perf_counter()
            for _ in range(n // 5):
                jax.block_until_ready(f(*args))
            best[i] = min(best[i], (time.perf_counter() - t) / (n // 5))
    return best


def per_model(names):
    print(f"{'model':28s} {'conv ms PT/jf/jf-norw':>24s} {'first ms PT/jf':>16s} {'steady µs PT/jf':>18s} ratio")
    for name in names:
        model = MODELS[name]()
        pt = model.initial_point()
        args = [pt[v.name] for v in model.value_vars]
        try:
            c_pt, vg_pt = _min_time(lambda: _vg_pytensor(model))
        except Exception as e:  # PyTensor's JAX backend lacks e.g. erfcx (censored/truncated models)
            c_pt, vg_pt = None, None
            why = f"{type(e).__name__}"
        c_jf, vg_jf = _min_time(lambda: _vg_jaxform(model))
        c_nr, _ = _min_time(lambda: _vg_jaxform(model, rewrite=False))
        f_jf = _first_call(vg_jf, args)
        if vg_pt is None:
            s_jf, = _steady([vg_jf], args)
            print(f"{name:28s} {'n/a':>7s}/{c_jf*1e3:7.1f}/{c_nr*1e3:7.1f} {'n/a':>7s}/{f_jf*1e3:7.0f} "
                  f"{'n/a':>8s}/{s_jf*1e6:8.1f}  (PyTensor JAX backend: {why})")
            continue
        f_pt = _first_call(vg_pt, args)
        s_pt, s_jf = _steady([vg_pt, vg_jf], args)
        print(f"{name:28s} {c_pt*1e3:7.1f}/{c_jf*1e3:7.1f}/{c_nr*1e3:7.1f} {f_pt*1e3:7.0f}/{f_jf*1e3:7.0f} "
              f"{s_pt*1e6:8.1f}/{s_jf*1e6:8.1f}  {s_jf/s_pt:.2f}x")


def _first_grad(make_vg, args):
    """(seconds to build the value-and-grad callable, to trace+lower it, to XLA-compile it, to run it once)."""
    t0 = time.perf_counter()
    vg = make_vg()
    t1 = time.perf_counter()
    lowered = vg.lower(*args)
    t2 = time.perf_counter()
    comp = lowered.compile()
    t3 = time.perf_counter()
    jax.block_until_ready(comp(*args))
    return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3


def large(groups_list):
    """Time to the first gradient from a fresh PyMC model, split into stages (seconds). PyMC's logp graph
    is built once per path (its cost is shared by every path). 'PT conv' is PyTensor's JAX backend
    (rewrites + jax_funcify); for jaxform: 'PT rewrite' (PyTensor's rewrites, rewrite=True only) and
    'jf conv' (ours: graph walk, conversion, CSE). 'jf share' is jf conv / the path's total."""
    from pytensor.graph.fg import FunctionGraph
    from jaxform import to_function
    from jaxform.frontends import pytensor as jpt
    print("\nlarge hierarchical model (one Normal per group), time to the first gradient: seconds")
    print(f"{'groups':>6s} {'nodes':>6s} {'path':>12s} {'logp graph':>10s} {'PT rewrite':>10s} {'conv':>6s} "
          f"{'trace+lower':>11s} {'XLA':>6s} {'total':>7s} {'jf share':>8s} {'jaxpr eqns':>10s}")
    for groups in groups_list:
        model = large_hierarchical(groups=groups)
        pt = model.initial_point()
        args = [pt[v.name] for v in model.value_vars]
        t0 = time.perf_counter()
        logp = model.logp()
        t_logp = time.perf_counter() - t0
        nodes = len(FunctionGraph(model.value_vars, [logp], clone=False).apply_nodes)
        an = tuple(range(len(args)))
        rows = []
        for label in ("PyTensor JAX", "jf rewrite", "jf no-rewrite"):
            info = {}

            def make():
                if label == "PyTensor JAX":
                    f = get_jaxified_graph(model.value_vars, [logp])
                    return jax.jit(jax.value_and_grad(lambda *a: f(*a)[0], argnums=an))
                out = jpm._replace_shared([logp])
                shapes = jpm._value_shapes(model, list(model.value_vars))
                g = jpt.to_graph(list(model.value_vars), out[0], shapes=shapes, rewrite=label == "jf rewrite",
                                 stats=info)
                info["eqns"] = len(g.nodes)
                return jax.jit(jax.value_and_grad(to_function(g), argnums=an))
            conv, lower, xla, run = _first_grad(make, args)
            rw = info.get("time_rewrite_s", 0.0)
            ours = conv - rw if info else 0.0
            total = t_logp + conv + lower + xla + run
            share = f"{ours / total:8.1%}" if info else f"{'':8s}"
            eq = f"{info['eqns']:10d}" if info else f"{'':10s}"
            print(f"{groups:6d} {nodes:6d} {label:>12s} {t_logp:10.2f} {rw if info else float('nan'):10.2f} "
                  f"{(ours if info else conv):6.2f} {lower:11.2f} {xla:6.2f} {total:7.2f} {share} {eq}")


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    per_model(["eight_schools_noncentered", "radon", "logistic", "gp_marginal", "stochastic_volatility",
               "exp_smoothing_scan", "censored_normal"] if quick else sorted(MODELS))
    large([25] if quick else [25, 250, 500])  # about 1k, 10k, 20k PyTensor nodes
