#!/usr/bin/env bash
# CI: the PyMC front-end tests on what new users install: PyMC 6 + pytensor 3.3 + the newest JAX, on Python 3.13
# (PyMC 6 needs Python >= 3.12). The interpreter is the .py313 that `make test-jax-latest` builds with
# ../shared/tools/py313.sh (built once, re-checked here). Builds ENV (default .venv-pymc6) from scratch and runs
# tests/frontends (the fast tier). PyMC 5.28 / pytensor 2.38 on Python 3.11 stays in .ci/pymc.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV="${1:-.venv-pymc6}"
TOOLS=${JAXFORM_TOOLS:-../shared/tools}
PY313=${PY313:-.py313}
# blackjax < 1.6: PyMC 6.4 passes `progress_bar` to blackjax's window adaptation, which 1.6+ no longer takes
# (pm.sample(nuts_sampler="blackjax") fails there with PyTensor's own backend too).
start=$(date +%s)
PY313_DIR="$PY313" bash "$TOOLS/py313.sh" "$PY313" >/dev/null
rm -rf "$ENV"
"$PY313/bin/python3" -m venv "$ENV"
"$ENV/bin/pip" install -q --disable-pip-version-check "pymc>=6,<7" jax jaxlib numpyro "blackjax>=1.5,<1.6" pytest pytest-xdist hypothesis
"$ENV/bin/python" -c "import sys, jax, pymc, pytensor, numpyro; print('CI pymc6 env: python', sys.version.split()[0], 'jax', jax.__version__, 'pymc', pymc.__version__, 'pytensor', pytensor.__version__, 'numpyro', numpyro.__version__)"
echo "CI pymc6 env: installed in $(( $(date +%s) - start )) s"
"$ENV/bin/python" -m pytest tests/frontends -q -n "${PYMC_JOBS:-2}" -m "not slow" -p no:cacheprovider -W ignore::UserWarning
echo "CI pymc6: done in $(( $(date +%s) - start )) s"
