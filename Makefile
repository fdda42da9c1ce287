# Two commands on a fresh machine with only python3:  make demo  |  make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

.PHONY: demo test test-slow test-jax-latest test-scan3 bench
demo: $(BIN)/.installed
	$(BIN)/jaxform demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 -q -m "not slow"

test-slow: $(BIN)/.installed   # the long tier: full JAX harness set, full library differential tests, ...
	$(BIN)/python -m pytest -n 2 -q -m slow

# The fast tier on the newest JAX with Python 3.13 (this machine has no Python >= 3.12: py313.sh makes one
# from Debian 13 packages; jax-latest-env.sh makes a venv with the newest jax + the test extras).
TOOLS ?= ../shared/tools
PY313 ?= .py313
LATEST ?= .venv-jax-latest
test-jax-latest:
	PY313_DIR=$(PY313) bash $(TOOLS)/py313.sh $(PY313) >/dev/null
	PY313_DIR=$(PY313) bash $(TOOLS)/jax-latest-env.sh $(LATEST) . >/dev/null
	$(LATEST)/bin/python -m pytest -n 2 -q -m "not slow and not heavy" --ignore=tests/frontends   # .ci/pymc6.sh runs those; heavy: tests/durations.txt

# The loop-pass tests with JAX's loops on refs turned on (jax_scan3 + jax_remat3, JAX 0.12's opt-in flags), in the
# newest-JAX env that test-jax-latest builds (LATEST=... to use another). The other loop-pass files differentiate and
# vmap scans in JAX itself, which JAX 0.12 cannot do for a Scan3 (docs/state.md, "Loops over refs").
SCAN3_TESTS ?= tests/passes/test_scan3.py tests/passes/test_fusion_real.py tests/test_jax_flags.py
test-scan3:
	JAXFORM_TEST_SCAN3=1 $(LATEST)/bin/python -m pytest -n 2 -q -m "not slow" $(SCAN3_TESTS)

# Every benchmark script, its output written to docs/benchmarks.md under the machine, JAX version, date and commit
# it ran at (the README's headline numbers link there). Long: an hour or more on 2 cores.
bench: $(BIN)/.installed
	{ echo "# Benchmarks (written by \`make bench\`)"; echo; \
	  echo "Run on $$(date -u +%F) at commit $$(git rev-parse --short HEAD 2>/dev/null || echo '?'); $$(uname -m), $$(nproc) cores; \
	  $$($(BIN)/python -c 'import jax; print("JAX", jax.__version__, "on", jax.devices()[0].device_kind)')."; \
	  for b in benchmarks/*.py; do echo; echo "## $$b"; echo; echo '```'; $(BIN)/python $$b 2>&1 || echo "(exit status $$?: this script needs what .venv lacks, e.g. PyMC: .ci/pymc.sh)"; echo '```'; done; \
	} > docs/benchmarks.md.new && mv docs/benchmarks.md.new docs/benchmarks.md
