# Two commands on a fresh machine with only python3 and pip:
#   make run    creates .venv, installs aenvs, runs `aenvs run` on the default env
#   make test   creates .venv (test extras, Ray included) and .venv-torchrl, runs lint, types and the whole test suite
#
# Two venvs, because TorchRL pins an older tensordict: torchrl 0.14 (what pip picks beside
# torch 2.13) requires tensordict < 0.15. The main venv (.venv) has the newest tensordict and
# runs everything but the TorchRL interop tests (marker `torchrl`); .venv-torchrl has torchrl
# and tensordict 0.14 (and Ray, so they run on every executor) and runs only those, with AENVS_REQUIRE_TORCHRL=1 so that a broken
# torchrl fails them instead of skipping them. The second venv adds about 1.3 min to CI
# (about 1 min to install, 18-45 s for its tests; `make test` took 10.6 min from a fresh clone, 2026-11-23).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --constraint constraints.txt
TORCHRL_VENV := .venv-torchrl
BENCH_VENV := .venv-bench
comma := ,

.PHONY: run test lint typecheck pytest pytest-torchrl bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) --quiet -e ".[test,ray]"
	touch $@

# a venv with an extra: $(call extra_venv,VENV,EXTRAS)
define extra_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet --constraint constraints.txt -e ".[$(2)]"
	touch $(1)/.installed
endef

$(TORCHRL_VENV)/.installed: pyproject.toml constraints.txt
	$(call extra_venv,$(TORCHRL_VENV),test$(comma)torchrl$(comma)ray)

$(BENCH_VENV)/.installed: pyproject.toml constraints.txt
	$(call extra_venv,$(BENCH_VENV),bench)

run: $(VENV)/.installed
	$(BIN)/aenvs run

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/pyright

pytest: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q -m "not torchrl"

pytest-torchrl: $(TORCHRL_VENV)/.installed
	AENVS_REQUIRE_TORCHRL=1 $(TORCHRL_VENV)/bin/python -m pytest -q -m torchrl

test: lint typecheck pytest pytest-torchrl

# the benchmark suite against every peer (gymnasium, TorchRL, EnvPool): report and plots in docs/bench
bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/aenvs bench

clean:
	rm -rf $(VENV) $(TORCHRL_VENV) $(BENCH_VENV) .pytest_cache .ruff_cache
