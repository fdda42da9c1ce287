"""PyMC models of the kinds PyMC's example gallery uses, for the PyMC front-end tests and benchmark.

Data are small and seeded; each `make()` returns a fresh `pm.Model`. Sources of the
model structures: pymc-devs/pymc-examples (examples/case_studies/multilevel_modeling.ipynb for
radon, examples/generalized_linear_models/GLM-*.ipynb, examples/gaussian_processes/GP-Marginal.ipynb,
examples/mixture_models/gaussian_mixture_model.ipynb, examples/time_series/*.ipynb,
examples/survival_analysis/censored_data.ipynb), and the eight-schools model of
pymc-devs/pymc/benchmarks (Rubin 1981). Issue 28's additions: examples/gaussian_processes/HSGP-Boundary-Conditions
(HSGP), examples/generalized_linear_models/GLM-poisson-regression (zero-inflated / hurdle counts),
examples/generalized_linear_models/GLM-truncated-censored-regression (truncated counts),
examples/mixture_models/dirichlet_mixture_of_multinomials (Dirichlet-multinomial), examples/time_series/AR and
pymc's own GARCH11 (pymc/distributions/timeseries.py), examples/case_studies/LKJ, examples/custom_distribution
(CustomDist), examples/fundamentals/data_container (pm.Data + pm.set_data with dims),
examples/generalized_linear_models/GLM-hierarchical-binomial-model (large hierarchical logistic).
"""
from __future__ import annotations

import numpy as np

import pymc as pm
import pytensor
import pytensor.tensor as pt

Y8 = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
S8 = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools_centered():
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfCauchy("tau", 5)
        theta = pm.Normal("theta", mu, tau, shape=8)
        pm.Normal("y", theta, S8, observed=Y8)
    return m


def eight_schools_noncentered():
    with pm.Model(coords={"school": [f"s{i}" for i in range(8)]}) as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfCauchy("tau", 5)
        theta_t = pm.Normal("theta_t", 0, 1, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_t, dims="school")
        pm.Normal("y", theta, S8, observed=Y8, dims="school")
    return m


def radon(n_counties=12, n=120, seed=0):
    """Varying-intercept, varying-slope radon model with coords and pm.Data (index gather)."""
    rng = np.random.default_rng(seed)
    county = rng.integers(0, n_counties, n)
    floor = rng.integers(0, 2, n).astype(float)
    y = rng.normal(1.0 + 0.3 * county / n_counties - 0.6 * floor, 0.7)
    with pm.Model(coords={"county": np.arange(n_counties), "obs": np.arange(n)}) as m:
        floor_d = pm.Data("floor", floor, dims="obs")
        county_d = pm.Data("county_idx", county, dims="obs")
        mu_a = pm.Normal("mu_a", 0, 10)
        sigma_a = pm.Exponential("sigma_a", 1)
        z_a = pm.Normal("z_a", 0, 1, dims="county")
        b = pm.Normal("b", 0, 10, dims="county")
        a = mu_a + sigma_a * z_a
        sigma = pm.Exponential("sigma", 1)
        pm.Normal("y", a[county_d] + b[county_d] * floor_d, sigma, observed=y, dims="obs")
    return m


def logistic(seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 3))
    y = (X @ np.array([1.0, -2.0, 0.5]) + rng.normal(size=50) > 0).astype(int)
    with pm.Model() as m:
        Xd = pm.Data("X", X)
        w = pm.Normal("w", 0, 2, shape=3)
        b = pm.Normal("b", 0, 2)
        pm.Bernoulli("y", logit_p=Xd @ w + b, observed=y)
    return m


def poisson_zeros(seed=2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=40)
    y = rng.poisson(np.exp(0.2 + 0.5 * x))
    y[:5] = 0
    with pm.Model() as m:
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        pm.Poisson("y", pm.math.exp(a + b * x), observed=y)
    return m


def negbin_zeros(seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=40)
    y = rng.negative_binomial(3, 3 / (3 + np.exp(0.5 + 0.3 * x)))
    y[:4] = 0
    with pm.Model() as m:
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        alpha = pm.Gamma("alpha", 2, 0.5)
        pm.NegativeBinomial("y", mu=pm.math.exp(a + b * x), alpha=alpha, observed=y)
    return m


def zero_inflated_poisson(seed=4):
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(60) < 0.3, 0, rng.poisson(3.0, 60))
    with pm.Model() as m:
        psi = pm.Beta("psi", 2, 2)
        mu = pm.Gamma("mu", 2, 1)
        pm.ZeroInflatedPoisson("y", psi=psi, mu=mu, observed=y)
    return m


def gp_marginal(seed=5):
    rng = np.random.default_rng(seed)
    X = np.linspace(0, 5, 20)[:, None]
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=20)
    with pm.Model() as m:
        ell = pm.Gamma("ell", 2, 1)
        eta = pm.HalfNormal("eta", 1)
        sigma = pm.HalfNormal("sigma", 1)
        gp = pm.gp.Marginal(cov_func=eta ** 2 * pm.gp.cov.ExpQuad(1, ell))
        gp.marginal_likelihood("y", X=X, y=y, sigma=sigma)
    return m


def mvnormal_lkj(seed=6):
    rng = np.random.default_rng(seed)
    data = rng.multivariate_normal([0, 1, -1], [[1, 0.5, 0.2], [0.5, 1, 0.3], [0.2, 0.3, 1]], size=30)
    with pm.Model() as m:
        chol, _, _ = pm.LKJCholeskyCov("chol", n=3, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=3))
        mu = pm.Normal("mu", 0, 2, shape=3)
        pm.MvNormal("y", mu=mu, chol=chol, observed=data)
    return m


def gaussian_mixture(seed=7):
    rng = np.random.default_rng(seed)
    y = np.concatenate([rng.normal(-2, 0.7, 30), rng.normal(2, 1.0, 40)])
    with pm.Model() as m:
        w = pm.Dirichlet("w", np.ones(2))
        mu = pm.Normal("mu", 0, 5, shape=2, transform=pm.distributions.transforms.ordered,
                       initval=np.array([-1.0, 1.0]))
        sigma = pm.HalfNormal("sigma", 2, shape=2)
        pm.NormalMixture("y", w=w, mu=mu, sigma=sigma, observed=y)
    return m


def stochastic_volatility(seed=8, n=60):
    rng = np.random.default_rng(seed)
    r = rng.standard_t(5, n) * 0.02
    with pm.Model() as m:
        step = pm.Exponential("step", 10)
        vol = pm.GaussianRandomWalk("vol", sigma=step, init_dist=pm.Normal.dist(0, 1), shape=n)
        nu = pm.Exponential("nu", 0.1)
        pm.StudentT("r", nu=nu, lam=pm.math.exp(-2 * vol), observed=r)
    return m


def ar1(seed=9, n=50):
    rng = np.random.default_rng(seed)
    y = np.zeros(n)
    for t in range(1, n):
        y[t] = 0.7 * y[t - 1] + rng.normal(0, 0.5)
    with pm.Model() as m:
        rho = pm.Normal("rho", 0, 1, shape=1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.AR("y", rho=rho, sigma=sigma, init_dist=pm.Normal.dist(0, 1), observed=y)
    return m


def exp_smoothing_scan(seed=10, n=40):
    """Simple exponential smoothing written with pytensor.scan (a sit-sot recurrence)."""
    rng = np.random.default_rng(seed)
    y = np.cumsum(rng.normal(0, 0.3, n)) + rng.normal(0, 0.2, n)
    with pm.Model() as m:
        alpha = pm.Beta("alpha", 2, 2)
        l0 = pm.Normal("l0", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        yt = pt.as_tensor_variable(y)
        levels, _ = pytensor.scan(lambda yt_, l, a: a * yt_ + (1 - a) * l, sequences=[yt[:-1]],
                                  outputs_info=[l0], non_sequences=[alpha])
        pred = pt.concatenate([l0[None], levels])
        pm.Normal("y", pred, sigma, observed=y)
    return m


def ar2_scan(seed=11, n=40):
    """An AR(2) mean recurrence with two taps (a mit-sot scan)."""
    rng = np.random.default_rng(seed)
    y = rng.normal(0, 1, n)
    with pm.Model() as m:
        phi = pm.Normal("phi", 0, 0.5, shape=2)
        sigma = pm.HalfNormal("sigma", 1)
        init = pt.as_tensor_variable(y[:2])
        mus, _ = pytensor.scan(lambda y2, y1, p: p[0] * y1 + p[1] * y2,
                               outputs_info=[{"initial": init, "taps": [-2, -1]}], non_sequences=[phi],
                               n_steps=n - 2)
        pm.Normal("y", mus, sigma, observed=y[2:])
    return m


def censored_normal(seed=12):
    rng = np.random.default_rng(seed)
    y = np.clip(rng.normal(1.0, 2.0, 50), -1.0, 3.0)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 3)
        pm.Censored("y", pm.Normal.dist(mu, sigma), lower=-1.0, upper=3.0, observed=y)
    return m


def truncated_normal(seed=13):
    rng = np.random.default_rng(seed)
    y = rng.normal(1.0, 1.0, 200)
    y = y[(y > 0) & (y < 2.5)][:50]
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        sigma = pm.HalfNormal("sigma", 3)
        pm.Truncated("y", pm.Normal.dist(mu, sigma), lower=0.0, upper=2.5, observed=y)
    return m


def robust_regression_dims(seed=14):
    """StudentT regression with coords/dims and pm.Data for both predictors and outcome."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=30)
    y = 1.0 + 2.0 * x + rng.standard_t(3, 30)
    with pm.Model(coords={"obs": np.arange(30), "coef": ["a", "b"]}) as m:
        xd = pm.Data("x", x, dims="obs")
        yd = pm.Data("y_obs", y, dims="obs")
        beta = pm.Normal("beta", 0, 5, dims="coef")
        nu = pm.Gamma("nu", 2, 0.1)
        sigma = pm.HalfNormal("sigma", 2)
        pm.StudentT("y", nu=nu, mu=beta[0] + beta[1] * xd, sigma=sigma, observed=yd, dims="obs")
    return m


def ordered_logistic(seed=15):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=40)
    y = np.digitize(x + rng.logistic(size=40), [-1.0, 0.0, 1.0])
    with pm.Model() as m:
        beta = pm.Normal("beta", 0, 2)
        cut = pm.Normal("cut", 0, 3, shape=3, transform=pm.distributions.transforms.ordered,
                        initval=np.array([-1.0, 0.0, 1.0]))
        pm.OrderedLogistic("y", eta=beta * x, cutpoints=cut, observed=y)
    return m


def large_hierarchical(groups=200, n_per=5, seed=16):
    """A big unrolled hierarchical model: one Normal per group (≈ 50 nodes each)."""
    rng = np.random.default_rng(seed)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        sigma = pm.HalfNormal("sigma", 2)
        for g in range(groups):
            th = pm.Normal(f"th{g}", mu, tau)
            pm.Normal(f"y{g}", th, sigma, observed=rng.normal(0.5, 1.0, n_per))
    return m


def zero_inflated_negbin(seed=17):
    """ZINB: a logsumexp of the zero and count branches (LogSumExp op on pytensor >= 3)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=60)
    y = np.where(rng.random(60) < 0.3, 0, rng.negative_binomial(4, 4 / (4 + np.exp(1.0 + 0.4 * x))))
    with pm.Model() as m:
        psi = pm.Beta("psi", 2, 2)
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        alpha = pm.Gamma("alpha", 2, 0.5)
        pm.ZeroInflatedNegativeBinomial("y", psi=psi, mu=pm.math.exp(a + b * x), alpha=alpha, observed=y)
    return m


def hurdle_poisson(seed=18):
    """Hurdle Poisson: the count part is a zero-truncated Poisson, whose normalizer is GammaIncC."""
    rng = np.random.default_rng(seed)
    y = np.where(rng.random(60) < 0.4, 0, rng.poisson(3.0, 60))
    with pm.Model() as m:
        psi = pm.Beta("psi", 2, 2)
        mu = pm.Gamma("mu", 2, 1)
        pm.HurdlePoisson("y", psi=psi, mu=mu, observed=y)
    return m


def truncated_poisson(seed=19):
    """Poisson regression truncated above (GammaIncC in the normalizer)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=50)
    y = np.minimum(rng.poisson(np.exp(1.0 + 0.3 * x)), 6)
    with pm.Model() as m:
        a = pm.Normal("a", 0, 1)
        b = pm.Normal("b", 0, 1)
        pm.Truncated("y", pm.Poisson.dist(pm.math.exp(a + b * x)), upper=6, observed=y)
    return m


def dirichlet_multinomial(seed=20):
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(30, [0.5, 0.3, 0.2], size=20)
    with pm.Model() as m:
        frac = pm.Dirichlet("frac", np.ones(3))
        conc = pm.Lognormal("conc", 1, 1)
        pm.DirichletMultinomial("y", n=30, a=frac * conc, observed=counts)
    return m


def hsgp(seed=21, n=60):
    """Hilbert-space approximate GP (pm.gp.HSGP) with a Normal likelihood."""
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0, 10, n))[:, None]
    y = np.sin(X[:, 0]) + 0.2 * rng.normal(size=n)
    with pm.Model() as m:
        ell = pm.InverseGamma("ell", 3, 6)
        eta = pm.HalfNormal("eta", 1)
        gp = pm.gp.HSGP(m=[20], c=1.5, cov_func=eta ** 2 * pm.gp.cov.Matern52(1, ls=ell))
        f = gp.prior("f", X=X)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", f, sigma, observed=y)
    return m


def garch11(seed=22, n=60):
    rng = np.random.default_rng(seed)
    r = rng.standard_t(6, n) * 0.05
    with pm.Model() as m:
        omega = pm.HalfNormal("omega", 0.1)
        a1 = pm.Uniform("alpha_1", 0, 0.5)
        b1 = pm.Uniform("beta_1", 0, 0.5)
        pm.GARCH11("r", omega=omega, alpha_1=a1, beta_1=b1, initial_vol=0.05, observed=r, shape=n)
    return m


def custom_dist(seed=23):
    """pm.CustomDist with a user logp (a Gumbel written by hand)."""
    rng = np.random.default_rng(seed)
    y = rng.gumbel(1.0, 2.0, 40)

    def logp(value, mu, beta):
        z = (value - mu) / beta
        return -z - pt.exp(-z) - pt.log(beta)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        beta = pm.HalfNormal("beta", 3)
        pm.CustomDist("y", mu, beta, logp=logp, observed=y)
    return m


def multilevel_set_data(seed=24, groups=10, n=200):
    """Varying intercepts with dims, pm.Data for index and outcome; `set_data` swaps in new data (same shape)."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    y = rng.normal(0.3 * g / groups, 1.0)
    with pm.Model(coords={"group": np.arange(groups), "obs": np.arange(n)}) as m:
        gi = pm.Data("g", g, dims="obs")
        yd = pm.Data("y_obs", y, dims="obs")
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, dims="group")
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", mu + tau * z[gi], sigma, observed=yd, dims="obs")
    return m


def regression_10k(seed=25, n=10_000, k=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, k))
    y = X @ rng.normal(size=k) + 0.5 + rng.normal(size=n)
    with pm.Model() as m:
        Xd = pm.Data("X", X)
        beta = pm.Normal("beta", 0, 1, shape=k)
        a = pm.Normal("a", 0, 1)
        sigma = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a + Xd @ beta, sigma, observed=y)
    return m


def hier_logistic_8k(seed=26, groups=40, n=8_000, k=3):
    """Hierarchical logistic regression, 8k rows: varying intercepts and slopes, gathered by group index."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    X = rng.normal(size=(n, k))
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ np.array([0.5, -1.0, 0.3]) + 0.2 * (g % 5 - 2))))).astype(int)
    with pm.Model(coords={"group": np.arange(groups), "coef": np.arange(k)}) as m:
        mu_a = pm.Normal("mu_a", 0, 1)
        sigma_a = pm.HalfNormal("sigma_a", 1)
        z_a = pm.Normal("z_a", 0, 1, dims="group")
        beta = pm.Normal("beta", 0, 1, dims="coef")
        eta = mu_a + sigma_a * z_a[g] + pm.math.dot(X, beta)
        pm.Bernoulli("y", logit_p=eta, observed=y)
    return m


def mvnormal_lkj_observed(seed=27, n=500, d=5):
    """LKJ prior on the correlation of observed 5-d data (examples/case_studies/LKJ)."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    data = rng.multivariate_normal(np.arange(d) * 0.5, A @ A.T / d + np.eye(d), size=n)
    with pm.Model() as m:
        chol, _, _ = pm.LKJCholeskyCov("chol", n=d, eta=2.0, sd_dist=pm.Exponential.dist(1.0, shape=d))
        mu = pm.Normal("mu", 0, 3, shape=d)
        pm.MvNormal("y", mu=mu, chol=chol, observed=data)
    return m


MODELS = {f.__name__: f for f in [
    eight_schools_centered, eight_schools_noncentered, radon, logistic, poisson_zeros, negbin_zeros,
    zero_inflated_poisson, gp_marginal, mvnormal_lkj, gaussian_mixture, stochastic_volatility, ar1,
    exp_smoothing_scan, ar2_scan, censored_normal, truncated_normal, robust_regression_dims, ordered_logistic,
    zero_inflated_negbin, hurdle_poisson, truncated_poisson, dirichlet_multinomial, hsgp, garch11, custom_dist,
    multilevel_set_data,
]}
# Larger models: the benchmark (benchmarks/pymc_models.py) and a few targeted tests, not the every-model test.
LARGE = {f.__name__: f for f in [regression_10k, hier_logistic_8k, mvnormal_lkj_observed]}
