#!/usr/bin/env bash
# CI: the PyMC front-end tests in their own environment (PyMC 5.28 pins pytensor>=2.38.2,<2.39 while the main
# test environment has pytensor 3.x). Builds ENV (default .venv-pymc) from scratch and runs tests/frontends,
# so both the PyMC models and the PyTensor front end are checked on pytensor 2.38. About 2 min to install here.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV="${1:-.venv-pymc}"
PY="${PYTHON:-python3}"
start=$(date +%s)
rm -rf "$ENV"
"$PY" -m venv "$ENV"
"$ENV/bin/pip" install -q "jax>=0.10,<0.11" "jaxlib>=0.10,<0.11" "pymc>=5.28,<5.29" numpyro pytest pytest-xdist hypothesis
"$ENV/bin/python" -c "import jax, pymc, pytensor, numpyro; print('CI pymc env: jax', jax.__version__, 'pymc', pymc.__version__, 'pytensor', pytensor.__version__, 'numpyro', numpyro.__version__)"
echo "CI pymc env: installed in $(( $(date +%s) - start )) s"
"$ENV/bin/python" -m pytest tests/frontends -q -n "${PYMC_JOBS:-2}" -m "not slow" -p no:cacheprovider -W ignore::UserWarning
echo "CI pymc: done in $(( $(date +%s) - start )) s"
