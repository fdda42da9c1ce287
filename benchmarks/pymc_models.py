"""PyMC models of the gallery's kinds (issue 28): jaxform vs PyTensor's JAX backend, in one run.

Per model, both paths start from the same PyMC logp graph (built once, not timed):
  conv ms    the logp graph -> a JAX callable: `pymc.sampling.jax.get_jaxified_graph` (PyTensor's rewrites +
             jax_funcify) vs `jaxform.frontends.pymc.model_graph(checks="drop")` + `to_function` (what
             `jpm.get_jaxified_graph` / `jpm.jaxify()` build for samplers); min of 3
  first ms   conversion + jit(value_and_grad) trace, compile and first call, from scratch: the time a sampler
             waits before its first gradient; min of 2
  steady us  one value-and-grad call of the compiled executable on device arrays, interleaved min of 31 rounds (order
             reversed every other round); A/A: the PyTensor executable timed a second time in the same rounds, the
             spread two identical programs show here
             (XLA:CPU single-threaded for both, see below)
  HLO        instructions (and fusions) of XLA's optimized value-and-grad module; ops: "same" when both modules
             have the same multiset of (shape, opcode), i.e. the same work (a steady-state difference is then noise)
Ratios are jaxform / PyTensor (below 1: jaxform is faster). `multilevel_set_data+set` is the same model after
`pm.set_data` (both paths re-convert, as PyMC's JAX samplers do).

Needs PyMC (PyMC 6 env: .ci/pymc6.sh builds one):  python benchmarks/pymc_models.py [--quick] [model ...]
"""
import os
import sys
import time
import warnings

_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]  # benchmarks/pymc.py would shadow pymc
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "frontends"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
warnings.simplefilter("ignore")

# one XLA:CPU thread per call for both paths: on a shared machine the thread pool's scheduling noise otherwise
# dominates the steady-state times of these microsecond-scale programs (set XLA_FLAGS to override)
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
from pymc.sampling.jax import get_jaxified_graph  # noqa: E402

from jaxform import to_function  # noqa: E402
from jaxform.frontends import pymc as jpm  # noqa: E402
from pymc_models import LARGE, MODELS  # noqa: E402

ALL = {**MODELS, **LARGE}


def convert_pytensor(model, logp):
    f = get_jaxified_graph(model.value_vars, [logp])
    return lambda *a: f(*a)[0]


def convert_jaxform(model, logp):
    # parameter checks dropped, as PyMC's JAX path (what get_jaxified_graph/jaxify() give samplers)
    g, _ = jpm.model_graph(model, [logp], checks="drop")
    f = to_function(g)
    return lambda *a: f(*a)[0]


def _vg(f, n):
    return jax.jit(jax.value_and_grad(f, argnums=tuple(range(n))))


ROUNDS = 31


def _min(fn, k):
    best = float("inf")
    for _ in range(k):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _hlo_size(compiled):
    text = compiled.as_text()
    return sum(1 for line in text.splitlines() if " = " in line and not line.lstrip().startswith(("HloModule", "//"))), \
        text.count(" fusion(")


def _hlo_ops(compiled):
    """The multiset of (result shape, opcode) of XLA's optimized module: equal for two programs that do the
    same work in the same kernels, whatever their instruction names (their steady-state difference is noise)."""
    import collections
    import re
    ops = collections.Counter()
    for line in compiled.as_text().splitlines():
        m = re.match(r"\s*(?:ROOT )?%?[\w.\-]+ = (.+?) ([a-z\-]+)\(", line)
        if m:
            ops[(m.group(1), m.group(2))] += 1
    return ops


def measure(model, args):
    logp = model.logp()
    n = len(args)
    out = {}
    for label, conv in (("pt", convert_pytensor), ("jf", convert_jaxform)):
        out[label + "_conv"] = _min(lambda: conv(model, logp), 3)

        def first():
            jax.clear_caches()
            jax.block_until_ready(_vg(conv(model, logp), n)(*args))
        out[label + "_first"] = _min(first, 2)
        comp = _vg(conv(model, logp), n).lower(*args).compile()
        out[label + "_exe"] = comp
        out[label + "_hlo"] = _hlo_size(comp)
        out[label + "_ops"] = _hlo_ops(comp)
    # the same PyTensor executable timed twice as its own control ("A/A"): the spread two identical programs
    # show on this machine, next to which the jaxform/PyTensor ratio is read
    exes = [out["pt_exe"], out["jf_exe"], out["pt_exe"]]
    dev = [jax.device_put(a) for a in args]
    for e in exes:
        jax.block_until_ready(e(*dev))
    t0 = time.perf_counter()
    jax.block_until_ready(exes[0](*dev))
    per = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max(0.02 / per, 5), 2000))
    best = [float("inf")] * 3
    for k in range(ROUNDS):
        for i in (range(3) if k % 2 == 0 else reversed(range(3))):   # ABC CBA: no program always runs first
            e = exes[i]
            t = time.perf_counter()
            for _ in range(reps):
                r = e(*dev)
            jax.block_until_ready(r)
            best[i] = min(best[i], (time.perf_counter() - t) / reps)
    out["aa"] = max(best[0], best[2]) / min(best[0], best[2])
    best = [min(best[0], best[2]), best[1]]
    out["pt_steady"], out["jf_steady"] = best
    v_pt, v_jf = exes[0](*dev)[0], exes[1](*dev)[0]
    assert np.allclose(v_pt, v_jf, rtol=1e-9, atol=1e-9), (float(v_pt), float(v_jf))
    return out


def row(name, r):
    rc, rf, rs = r["jf_conv"] / r["pt_conv"], r["jf_first"] / r["pt_first"], r["jf_steady"] / r["pt_steady"]
    print(f"{name:28s} {r['pt_conv']*1e3:7.0f} {r['jf_conv']*1e3:7.0f} {rc:5.2f}x | {r['pt_first']*1e3:7.0f} "
          f"{r['jf_first']*1e3:7.0f} {rf:5.2f}x | {r['pt_steady']*1e6:9.1f} {r['jf_steady']*1e6:9.1f} {rs:5.2f}x | "
          f"{r['pt_hlo'][0]:5d}/{r['pt_hlo'][1]:<3d} {r['jf_hlo'][0]:5d}/{r['jf_hlo'][1]:<3d} "
          f"{'same' if r['pt_ops'] == r['jf_ops'] else 'diff'} | {r['aa']:5.2f}x", flush=True)
    return rc, rf, rs, r["aa"], r["pt_ops"] == r["jf_ops"]


def main(names):
    print(f"jax {jax.__version__}, pymc {pm.__version__}, pytensor {__import__('pytensor').__version__}, "
          f"{jax.devices()[0].platform}, float64")
    print(f"{'model':28s} {'conv ms PT':>10s} {'jf':>4s}  ratio | {'first ms PT':>11s} {'jf':>4s}  ratio | "
          f"{'steady us PT':>12s} {'jf':>6s}  ratio | HLO instr/fusions PT  jf ops | A/A")
    ratios = []
    for name in names:
        model = ALL[name]()
        ip = model.initial_point()
        args = [np.asarray(ip[v.name]) for v in model.value_vars]
        ratios.append(row(name, measure(model, args)))
        if name == "multilevel_set_data":
            rng = np.random.default_rng(7)
            with model:
                pm.set_data({"y_obs": rng.normal(size=200), "g": rng.integers(0, 10, 200)})
            ratios.append(row(name + "+set", measure(model, args)))
    r = np.array(ratios)
    print(f"{'median (' + str(len(r)) + ' rows)':28s} {'':15s} {np.median(r[:, 0]):5.2f}x | {'':15s} "
          f"{np.median(r[:, 1]):5.2f}x | {'':19s} {np.median(r[:, 2]):5.2f}x")
    slow = r[:, 2] > 1.05
    beyond = slow & (r[:, 2] > r[:, 3])          # slower than the row's own A/A spread
    print(f"steady state slower than 1.05x: {sum(slow)} of {len(r)} ({sum(slow & (r[:, 4] == 1))} with the same HLO "
          f"ops as PyTensor's; {sum(beyond)} also beyond their A/A spread); first gradient faster: {sum(r[:, 1] < 1)} of "
          f"{len(r)}; A/A spread median {np.median(r[:, 3]):.2f}x, max {r[:, 3].max():.2f}x")


if __name__ == "__main__":
    picked = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    main(picked or (["eight_schools_noncentered", "stochastic_volatility", "zero_inflated_negbin",
                     "hurdle_poisson", "hier_logistic_8k"] if quick else list(ALL)))
