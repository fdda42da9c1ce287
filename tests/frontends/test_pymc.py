"""PyMC models converted by jaxform: every op native, logp and gradient equal PyTensor's C backend.

Needs PyMC (its own environment: PyMC pins pytensor 2.38; `.ci/pymc.sh` builds it); skipped without.
"""
import numpy as np
import pytest

import jax


def test_module_imports_without_pymc():
    """jaxform.frontends.pymc imports PyMC lazily (it is an optional extra)."""
    from jaxform.frontends import pymc as jpm
    assert callable(jpm.logp_fn) and callable(jpm.get_jaxified_graph)


pm = pytest.importorskip("pymc")

from jaxform.frontends import pymc as jpm  # noqa: E402
from pymc_models import MODELS  # noqa: E402  (tests/frontends is on sys.path for this module)


def _points(model, k=2, seed=0):
    """The initial point and k jittered points (value-variable space)."""
    rng = np.random.default_rng(seed)
    ip = model.initial_point()
    pts = [ip]
    for _ in range(k):
        pts.append({n: np.asarray(v + 0.3 * rng.normal(size=np.shape(v)), dtype=v.dtype) for n, v in ip.items()})
    return pts


# PyTensor's C `psi` (the gradient of gammaln in its symbolic dlogp) is accurate to ~1e-8; in these models
# jaxform's gradient equals jax.grad of PyTensor's own JAX backend to 1e-13 and a Richardson finite difference
# of the C logp to 1e-9, while the C dlogp is 1.6e-8 off (measured at the initial point).
PSI_GRAD = {"robust_regression_dims", "stochastic_volatility", "zero_inflated_negbin", "dirichlet_multinomial"}
# Under jit, JAX 0.10.2's XLA gives the marginal GP's clipped squared distances, exactly 0 on the diagonal, a
# reverse-mode derivative of O(1) where the true one is 0 (dlogp/d log(ell) -8.58 where the C backend and a
# finite difference give -0.62 at a jittered point). PyTensor's own JAX backend (the same select) gets the
# same numbers: there the gradient is compared with it (docs/builder.md). JAX 0.12 gets it right.
XLA_CLIP_TIE = {"gp_marginal"} if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11) else set()


def _pytensor_jax_grad(model):
    """jit(grad) of the logp PyMC's own JAX path builds (get_jaxified_graph: PyTensor's JAX backend)."""
    from pymc.sampling.jax import get_jaxified_graph
    f = get_jaxified_graph(model.value_vars, [model.logp()])
    g = jax.jit(jax.grad(lambda *a: f(*a)[0], argnums=tuple(range(len(model.value_vars)))))
    return lambda pt: np.concatenate([np.ravel(x) for x in g(*[pt[v.name] for v in model.value_vars])])


@pytest.mark.parametrize("rewrite", [True, False], ids=["rewrite", "no_rewrite"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_c_backend(name, rewrite):
    """rewrite=True: the graph PyMC compiles, at rtol 1e-10. rewrite=False: the graph as PyMC builds it, which
    computes some constants in float32 (e.g. log(float32(2))) that PyTensor's rewrites compute in float64, so
    it differs from PyMC's numbers by up to ~5e-7 absolute (2e-8 relative): compared at rtol 5e-8."""
    model = MODELS[name]()
    stats = {}
    g, names = jpm.model_graph(model, rewrite=rewrite, stats=stats)
    assert stats["fallback"] == 0, stats["fallback_ops"]
    prims = {n.name for n, _ in g.walk()}
    assert not prims & {"jit", "pjit", "closed_call", "pure_callback"}, prims
    c_logp, c_dlogp = model.compile_logp(), model.compile_dlogp()
    if name in XLA_CLIP_TIE:
        c_dlogp = _pytensor_jax_grad(model)
    tol = 1e-10 if rewrite else 5e-8
    vg = jpm.value_and_grad_fn(model, rewrite=rewrite)
    for pt in _points(model):
        want = c_logp(pt)
        got, grad = vg(pt)
        np.testing.assert_allclose(np.asarray(got), want, rtol=tol, atol=tol)
        flat = np.concatenate([np.ravel(grad[n]) for n in names])
        # compile_dlogp orders the gradient by model.value_vars, as `names` does
        rtol = 5e-8 if name in PSI_GRAD else tol
        np.testing.assert_allclose(flat, c_dlogp(pt), rtol=rtol, atol=1e-9)


def test_poisson_zero_count_bool_arithmetic():
    """PyTensor multiplies booleans (the Poisson logp of a zero count); that converts to `and`."""
    g, _ = jpm.model_graph(MODELS["poisson_zeros"](), rewrite=False)
    assert "and" in {n.name for n, _ in g.walk()}


def test_squares_are_integer_pow():
    g, _ = jpm.model_graph(MODELS["eight_schools_noncentered"](), rewrite=False)
    prims = [n.name for n, _ in g.walk()]
    assert "integer_pow" in prims


def test_scan_is_lax_scan():
    g, _ = jpm.model_graph(MODELS["ar2_scan"]())
    assert "scan" in {n.name for n, _ in g.walk()}


def test_data_and_coords_become_constants():
    """pm.Data values are frozen at conversion, like PyMC's JAX path; set_data + reconvert sees new data."""
    model = MODELS["robust_regression_dims"]()
    f = jpm.logp_fn(model)
    pt = model.initial_point()
    before = f(pt)
    with model:
        pm.set_data({"y_obs": np.zeros(30)})
    np.testing.assert_allclose(jpm.logp_fn(model)(pt), model.compile_logp()(pt), rtol=1e-10)
    assert not np.allclose(before, jpm.logp_fn(model)(pt))


def test_get_jaxified_graph_dropin_matches_pymc():
    from pymc.sampling.jax import get_jaxified_graph
    model = MODELS["radon"]()
    ours = jpm.get_jaxified_graph(model.value_vars, [model.logp()])
    theirs = get_jaxified_graph(model.value_vars, [model.logp()])
    pt = model.initial_point()
    args = [pt[v.name] for v in model.value_vars]
    np.testing.assert_allclose(ours(*args)[0], theirs(*args)[0], rtol=1e-12)
    np.testing.assert_allclose(jax.jit(lambda *a: ours(*a)[0])(*args), theirs(*args)[0], rtol=1e-12)


def test_gaussian_random_walk_split():
    """Issue 28: every pm.GaussianRandomWalk model failed on pytensor >= 3.1 (Split takes (x, splits), the axis
    is a property). Its logp graph splits the walk into init and innovations; conversion, logp and gradient."""
    from pytensor.compile.mode import get_mode
    from pytensor.graph.fg import FunctionGraph
    model = MODELS["stochastic_volatility"]()
    fg = FunctionGraph(model.value_vars, [model.logp()], clone=True)
    get_mode("JAX").optimizer.rewrite(fg)
    assert "Split" in {type(n.op).__name__ for n in fg.apply_nodes}
    stats = {}
    jpm.model_graph(model, stats=stats)
    assert stats["fallback"] == 0, stats["fallback_ops"]
    pt_ = model.initial_point()
    got, grad = jpm.value_and_grad_fn(model)(pt_)
    np.testing.assert_allclose(np.asarray(got), model.compile_logp()(pt_), rtol=1e-10)
    flat = np.concatenate([np.ravel(grad[v.name]) for v in model.value_vars])
    np.testing.assert_allclose(flat, model.compile_dlogp()(pt_), rtol=5e-8, atol=1e-9)


@pytest.mark.parametrize("name", ["radon", "ar2_scan", "gp_marginal", "zero_inflated_negbin"])
def test_jaxified_graph_first_called_inside_jit(name):
    """Issue 28: the first call of get_jaxified_graph's function inside jax.jit built (and cached) a graph whose
    constants were that trace's tracers; jit(f) then jit(grad(f)) raised UnexpectedTracerError. Any order of
    traces now gives the eager values."""
    model = MODELS[name]()
    f = jpm.get_jaxified_graph(model.value_vars, [model.logp()])
    pt_ = model.initial_point()
    args = [pt_[v.name] for v in model.value_vars]
    logp = lambda *a: f(*a)[0]
    first = jax.jit(logp)(*args)                  # the graph is built while tracing
    grads = jax.jit(jax.grad(logp, argnums=tuple(range(len(args)))))(*args)   # a second trace reuses it
    again = jax.jit(lambda *a: logp(*a) * 1.0)(*args)
    np.testing.assert_allclose(np.asarray(first), model.compile_logp()(pt_), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(again), np.asarray(first), rtol=0)
    flat = np.concatenate([np.ravel(g) for g in grads])
    np.testing.assert_allclose(flat, model.compile_dlogp()(pt_), rtol=5e-8, atol=1e-9)


def test_set_data_multilevel_reconverts():
    """pm.set_data on a multilevel model with dims: the next conversion sees the new outcome and index data."""
    model = MODELS["multilevel_set_data"]()
    pt_ = model.initial_point()
    before = jpm.logp_fn(model)(pt_)
    rng = np.random.default_rng(1)
    with model:
        pm.set_data({"y_obs": rng.normal(size=200), "g": rng.integers(0, 10, 200)})
    after = jpm.logp_fn(model)(pt_)
    np.testing.assert_allclose(np.asarray(after), model.compile_logp()(pt_), rtol=1e-10)
    assert not np.allclose(before, after)


def test_check_that_can_fail_stays_minus_inf():
    """A parameter check that can fail (sigma a raw, untransformed Normal) still gives -inf, as PyMC's C
    backend; a check that cannot (sigma = exp(.) > 0) leaves no select in the graph."""
    with pm.Model() as model:
        s = pm.Normal("s", 1, 1, transform=None)
        pm.Normal("y", 0, s, observed=np.array([0.1, -0.3]))
    f = jpm.logp_fn(model)
    assert np.isneginf(f({"s": np.array(-1.0)})) and np.isneginf(model.compile_logp()({"s": np.array(-1.0)}))
    np.testing.assert_allclose(f({"s": np.array(0.7)}), model.compile_logp()({"s": np.array(0.7)}), rtol=1e-12)
    # the samplers' drop-in drops checks as PyMC's own JAX path does (same value where one fails), or not
    from pymc.sampling.jax import get_jaxified_graph
    theirs = get_jaxified_graph(model.value_vars, [model.logp()])(np.array(-1.0))[0]
    ours = jpm.get_jaxified_graph(model.value_vars, [model.logp()])(np.array(-1.0))[0]
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert not np.isneginf(theirs)
    assert np.isneginf(jpm.get_jaxified_graph(model.value_vars, [model.logp()], checks="ninf")(np.array(-1.0))[0])
    g, _ = jpm.model_graph(MODELS["eight_schools_centered"]())
    # the one select left is HalfCauchy's own switch(tau >= 0, ...), which PyTensor's backend keeps too
    assert [n.name for n, _ in g.walk()].count("select_n") == 1


def test_hier_logistic_8k_hlo_not_larger_than_pytensor():
    """Issue 28: on the 8k-row hierarchical logistic regression jaxform's value-and-grad HLO had 334 (here
    328) instructions and 28 fusions vs PyTensor's 19: a select per row for the check 0 <= sigmoid <= 1,
    which cannot fail. XLA's optimized module is now no larger than PyTensor's JAX backend's."""
    from pymc.sampling.jax import get_jaxified_graph
    from pymc_models import LARGE
    model = LARGE["hier_logistic_8k"]()
    ip = model.initial_point()
    args = [ip[v.name] for v in model.value_vars]
    an = tuple(range(len(args)))
    logp = model.logp()
    fp = get_jaxified_graph(model.value_vars, [logp])
    fj = jpm.get_jaxified_graph(model.value_vars, [logp])

    def size(f):
        text = jax.jit(jax.value_and_grad(lambda *a: f(*a)[0], argnums=an)).lower(*args).compile().as_text()
        return sum(" = " in ln for ln in text.splitlines()), text.count(" fusion(")
    ours, theirs = size(fj), size(fp)
    assert ours[0] <= theirs[0] and ours[1] <= theirs[1], (ours, theirs)


def test_pyproject_pymc_extra_markers():
    """`pip install jaxform[pymc]` gets PyMC 6 on Python >= 3.12 and PyMC 5.28 on 3.11 (issue 28)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet  # noqa: F401
    import pathlib
    extra = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["pymc"]
    reqs = [Requirement(r) for r in extra if Requirement(r).name == "pymc"]

    def allowed(py, version):
        env = {"python_version": py, "python_full_version": py + ".0"}
        return any((r.marker is None or r.marker.evaluate(env)) and version in r.specifier for r in reqs)
    assert allowed("3.11", "5.28.5") and not allowed("3.11", "6.4.0")
    assert allowed("3.13", "6.4.0") and allowed("3.12", "6.0.0") and not allowed("3.13", "5.28.5")
    assert not allowed("3.13", "7.0.0")


SAMPLE_MODELS = ["eight_schools_noncentered", "logistic", "exp_smoothing_scan"]


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["numpyro", "blackjax"])
@pytest.mark.parametrize("name", SAMPLE_MODELS)
def test_nuts_posterior_matches_pytensor_jax_backend(name, sampler, monkeypatch):
    """pm.sample(nuts_sampler=numpyro|blackjax) inside jpm.jaxify() vs PyTensor's JAX backend, independent seeds:
    every posterior mean (each element) agrees within 4 Monte Carlo standard errors, the MCSE of each run
    estimated by ArviZ from its effective sample size (az.mcse, method="mean")."""
    pytest.importorskip(sampler)
    az = pytest.importorskip("arviz")
    calls = []
    real = jpm.get_jaxified_graph
    monkeypatch.setattr(jpm, "get_jaxified_graph", lambda *a, **k: calls.append(1) or real(*a, **k))
    kw = dict(nuts_sampler=sampler, draws=500, tune=500, chains=2, progressbar=False,
              compute_convergence_checks=False)
    with MODELS[name]():
        ref = pm.sample(**kw, random_seed=1)
    assert not calls
    with MODELS[name](), jpm.jaxify():
        ours = pm.sample(**kw, random_seed=2)
    assert calls, "pm.sample did not build its logp with jaxform"
    # ArviZ 1 (PyMC 6) returns DataTree groups; the statistics take Datasets on both ArviZ versions
    post = [r.posterior.to_dataset() if hasattr(r.posterior, "to_dataset") else r.posterior for r in (ref, ours)]
    for var in post[0].data_vars:
        means = [np.asarray(p[var].mean(("chain", "draw"))) for p in post]
        mcse = [np.asarray(az.mcse(p[[var]], method="mean")[var]) for p in post]
        ess = [np.asarray(az.ess(p[[var]], method="mean")[var]) for p in post]
        sd = np.asarray(post[0][var].std(("chain", "draw")))
        assert np.all(np.concatenate([np.ravel(e) for e in ess]) > 150), (var, ess)  # MCSE estimates are usable
        se = np.sqrt(mcse[0] ** 2 + mcse[1] ** 2)
        assert np.all(4 * se <= 0.5 * sd + 1e-12), (var, se, sd)  # the test can tell a shifted posterior
        assert np.all(np.abs(means[0] - means[1]) <= 4 * se), (var, means, se)
