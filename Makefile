# Two commands on a fresh machine with only python3:  make demo  |  make test
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $@

.PHONY: demo test test-slow bench
demo: $(BIN)/.installed
	$(BIN)/jaxform demo

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 -q -m "not slow"

test-slow: $(BIN)/.installed   # the long tier: full JAX harness set, full library differential tests, ...
	$(BIN)/python -m pytest -n 2 -q -m slow

bench: $(BIN)/.installed
	for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done
