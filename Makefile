# topas-bench: `make run` runs the main job, `make test` the checks. Both build .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements/constraints.txt
RUN_ARGS ?= --workload metagpt-tl --scheduler all

.PHONY: run test lint typecheck pytest bench figures clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements/constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,figures]'
	touch $@

## run: the main job: every scheduler on metagpt-tl in the simulator, then the JCT table
run: $(VENV)/.installed
	$(BIN)/topas-bench run $(RUN_ARGS)

## test: ruff, mypy and the whole pytest suite (slow tests included)
test: lint typecheck pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev
	$(BIN)/pytest -q

## bench: simulator speed (simulated seconds per wall second, iterations per second)
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_sim.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
