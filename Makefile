# Quick start: `make run` (difftest run on the embedded default) and `make test` (the suite).
# Both create .venv and install everything on a fresh machine first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
AITER := amd-aiter==0.1.7.post2.dev18
FLAGGEMS := flag-gems==5.0.2

.PHONY: run test lint bench clean

$(BIN)/difftest: pyproject.toml requirements-ci.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-ci.txt
	# amd-aiter's declared requirements are ROCm tooling its Triton kernels do not use; flag-gems' adapters
	# load its Triton files by path (its __init__, which registers aten overrides, never runs): neither needs
	# its dependencies.
	$(BIN)/pip install -q --disable-pip-version-check --no-deps $(AITER) $(FLAGGEMS)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

# difftest exits 1 when a backend fails (today AITER's kernels do: a finding, not a broken run);
# only a usage error or a crash (any other status) fails `make run`. --isolate runs the backends'
# workers side by side: the Triton interpreter keeps both cores busy. --overwrite: a second `make run`
# replaces the first one's report (difftest refuses to write over a report otherwise).
run: $(BIN)/difftest
	$(BIN)/difftest run --isolate --report reports/cpu/default.json --overwrite || test $$? -eq 1

test: $(BIN)/difftest
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(BIN)/difftest
	$(BIN)/python bench/oracle_vs_loop.py

clean:
	rm -rf $(VENV) reports/cpu
