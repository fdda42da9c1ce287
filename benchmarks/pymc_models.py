"""PyMC models of the gallery's kinds (issue 28): jaxform vs PyTensor's JAX backend, in one run.

Per model, both paths start from the same PyMC logp graph (built once, not timed):
  conv ms    the logp graph -> a JAX callable: `pymc.sampling.jax.get_jaxified_graph` (PyTensor's rewrites +
             jax_funcify) vs `jaxform.frontends.pymc.model_graph(checks="drop")` + `to_function` (what
             `jpm.get_jaxified_graph` / `jpm.jaxify()` build for samplers); min of 3
  first ms   conversion + jit(value_and_grad) trace, compile and first call, from scratch: the time a sampler
             waits before its first gradient; min of 2
  loop us    steady state as a sampler sees it: one value-and-grad inside a compiled `fori_loop` (numpyro's and
             blackjax's NUTS run their gradients inside XLA's while loop), each step moving the point by the last
             gradient so nothing is hoisted; K steps per timing with K chosen so one timing takes ~5 ms, interleaved
             min of 15 rounds (order reversed every other round); A/A: PyTensor's loop compiled a second time and
             timed in the same rounds, the spread two compiles of one program show here. The issue's steady-state
             target is read here.
  call us    one value-and-grad call of the compiled executable from Python on device arrays, interleaved min of 31
             rounds, same A/A: mostly JAX's per-call dispatch (~8 us), the same for both, which hides the program
             (XLA:CPU single-threaded for both, see below)
  HLO        instructions (and fusions) of XLA's optimized value-and-grad module; ops: "same" when both modules
             have the same multiset of (shape, opcode), i.e. the same work (a steady-state difference is then noise)
Ratios are jaxform / PyTensor (below 1: jaxform is faster). `multilevel_set_data+set` is the same model after
`pm.set_data` (both paths re-convert, as PyMC's JAX samplers do).

Needs PyMC (PyMC 6 env: .ci/pymc6.sh builds one):  python benchmarks/pymc_models.py [--quick] [model ...]
"""
import functools
import os
import runpy
import sys
import time
import warnings

_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]  # benchmarks/pymc.py would shadow pymc
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]
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


# the models the tests check (tests/frontends/pymc_models.py), run by path: by name, `pymc_models` is this
# script itself
_models = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "frontends",
                                      "pymc_models.py"))
LARGE, MODELS = _models["LARGE"], _models["MODELS"]

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


LOOP_ROUNDS = 15


def _looped(vg):
    """`k` value-and-grad steps in one compiled loop, each at x0 + 1e-6 tanh(last gradient): the point depends
    on the previous gradient (XLA cannot hoist the work out of the loop) and stays next to x0."""
    def run(k, *x0):
        def step(_, carry):
            xs, acc = carry
            v, g = vg(*xs)
            return tuple(x + 1e-6 * jax.numpy.tanh(gi) for x, gi in zip(x0, g)), acc + v
        return jax.lax.fori_loop(0, k, step, (tuple(x0), jax.numpy.zeros((), jax.numpy.float64)))[1]
    return jax.jit(run)


def _pt_jf_pt(runs, rounds):
    """Interleaved min of `rounds` of three timed callables (ABC CBA: no program always runs first), each
    returning how many units of work it did: seconds per unit for PyTensor (the better of its two runs) and
    jaxform, and the spread of PyTensor's two (the A/A control, next to which the ratio is read)."""
    best = [float("inf")] * 3
    for r in range(rounds):
        for i in (range(3) if r % 2 == 0 else reversed(range(3))):
            t = time.perf_counter()
            units = runs[i]()
            best[i] = min(best[i], (time.perf_counter() - t) / units)
    pt = min(best[0], best[2])
    return pt, best[1], max(best[0], best[2]) / pt


def _in_loop(fns, args, dev):
    """Seconds per value-and-grad inside a compiled loop, PyTensor's and jaxform's, and the A/A spread."""
    n = len(args)
    # A/A: PyTensor's loop compiled twice, two executables (one compile to the next differs here by up to
    # 1.5x on the LKJ model, whose LAPACK calls sit in the loop)
    exes = [_looped(jax.value_and_grad(f, argnums=tuple(range(n)))).lower(np.int32(1), *args).compile()
            for f in (fns["pt"], fns["jf"], fns["pt"])]
    for e in exes:
        jax.block_until_ready(e(np.int32(1), *dev))
    t0 = time.perf_counter()
    jax.block_until_ready(exes[0](np.int32(200), *dev))
    k = int(min(max(0.005 / ((time.perf_counter() - t0) / 200), 200), 100_000))

    def run(e):
        jax.block_until_ready(e(np.int32(k), *dev))
        return k
    return _pt_jf_pt([functools.partial(run, e) for e in exes], LOOP_ROUNDS)


def measure(model, args):
    logp = model.logp()
    n = len(args)
    out, fns = {}, {}
    for label, conv in (("pt", convert_pytensor), ("jf", convert_jaxform)):
        out[label + "_conv"] = _min(lambda: conv(model, logp), 3)

        def first():
            jax.clear_caches()
            jax.block_until_ready(_vg(conv(model, logp), n)(*args))
        out[label + "_first"] = _min(first, 2)
        fns[label] = conv(model, logp)
        comp = _vg(fns[label], n).lower(*args).compile()
        out[label + "_exe"] = comp
        out[label + "_hlo"] = _hlo_size(comp)
        out[label + "_ops"] = _hlo_ops(comp)
    # per call: the same PyTensor executable timed twice as its own control ("A/A")
    exes = [out["pt_exe"], out["jf_exe"], out["pt_exe"]]
    dev = [jax.device_put(a) for a in args]
    for e in exes:
        jax.block_until_ready(e(*dev))
    t0 = time.perf_counter()
    jax.block_until_ready(exes[0](*dev))
    per = max(time.perf_counter() - t0, 1e-6)
    reps = int(min(max(0.02 / per, 5), 2000))

    def calls(e):
        for _ in range(reps):
            r = e(*dev)
        jax.block_until_ready(r)
        return reps
    out["pt_steady"], out["jf_steady"], out["aa"] = _pt_jf_pt([functools.partial(calls, e) for e in exes], ROUNDS)
    out["pt_loop"], out["jf_loop"], out["aa_loop"] = _in_loop(fns, args, dev)
    v_pt, v_jf = exes[0](*dev)[0], exes[1](*dev)[0]
    assert np.allclose(v_pt, v_jf, rtol=1e-9, atol=1e-9), (float(v_pt), float(v_jf))
    return out


def row(name, r):
    rc, rf = r["jf_conv"] / r["pt_conv"], r["jf_first"] / r["pt_first"]
    rl, rs = r["jf_loop"] / r["pt_loop"], r["jf_steady"] / r["pt_steady"]
    print(f"{name:26s} {r['pt_conv']*1e3:5.0f} {r['jf_conv']*1e3:5.0f} {rc:5.2f}x | {r['pt_first']*1e3:5.0f} "
          f"{r['jf_first']*1e3:5.0f} {rf:5.2f}x | {r['pt_loop']*1e6:7.2f} {r['jf_loop']*1e6:7.2f} {rl:5.2f}x "
          f"{r['aa_loop']:5.2f}x | {r['pt_steady']*1e6:6.1f} {r['jf_steady']*1e6:6.1f} {rs:5.2f}x {r['aa']:5.2f}x | "
          f"{r['pt_hlo'][0]:4d}/{r['pt_hlo'][1]:<2d} {r['jf_hlo'][0]:4d}/{r['jf_hlo'][1]:<2d} "
          f"{'same' if r['pt_ops'] == r['jf_ops'] else 'diff'}", flush=True)
    return rc, rf, rl, r["aa_loop"], rs, r["aa"]


def main(names):
    print(f"jax {jax.__version__}, pymc {pm.__version__}, pytensor {__import__('pytensor').__version__}, "
          f"{jax.devices()[0].platform}, float64; ratios jaxform / PyTensor")
    print(f"{'model':26s} {'conv ms PT':>10s} {'jf':>3s} ratio | {'first ms PT':>11s} {'jf':>2s} ratio | "
          f"{'loop us PT':>10s} {'jf':>5s} ratio   A/A | {'call us PT':>10s} {'jf':>2s} ratio   A/A | HLO PT  jf ops")
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
    med = np.median(r, axis=0)
    print(f"{'median (' + str(len(r)) + ' rows)':26s} {med[0]:17.2f}x | {med[1]:17.2f}x | {med[2]:21.2f}x "
          f"{med[3]:5.2f}x | {med[4]:19.2f}x {med[5]:5.2f}x")
    for what, c in (("in a loop", 2), ("per call", 4)):
        slow = r[:, c] > 1.05
        print(f"steady state {what} slower than 1.05x: {sum(slow)} of {len(r)} ({sum(slow & (r[:, c] > r[:, c + 1]))} "
              f"also beyond their A/A spread); A/A spread median {np.median(r[:, c + 1]):.3f}x, max "
              f"{r[:, c + 1].max():.3f}x")
    print(f"first gradient faster: {sum(r[:, 1] < 1)} of {len(r)}")


if __name__ == "__main__":
    picked = [a for a in sys.argv[1:] if not a.startswith("--")]
    quick = "--quick" in sys.argv
    main(picked or (["eight_schools_noncentered", "stochastic_volatility", "zero_inflated_negbin",
                     "hurdle_poisson", "hier_logistic_8k"] if quick else list(ALL)))
