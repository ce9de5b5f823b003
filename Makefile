# Two commands on a fresh machine with only python3 and pip:
#   make run    creates .venv, installs aenvs, runs `aenvs run` on the default env
#   make test   creates .venv (the dev dependency group and the ray extra) and .venv-torchrl,
#               runs lint (ruff, import contracts), types, the strict docs build, the package
#               build and check, and the whole test suite
#
# The development tools and the peers the tests and benchmarks run against are dependency
# groups in pyproject.toml (PEP 735: `pip install --group`, pip >= 25.1; each venv's pip is
# upgraded first), not extras: the extras are for users.
#
# Two venvs, because TorchRL pins an older tensordict: torchrl 0.14 (what pip picks beside
# torch 2.13) requires tensordict < 0.15. The main venv (.venv) has the newest tensordict and
# runs everything but the TorchRL interop tests (marker `torchrl`); .venv-torchrl has torchrl
# and tensordict 0.14 (and Ray, so they run on every executor) and runs only those, with
# AENVS_REQUIRE_TORCHRL=1 so that a broken torchrl fails them instead of skipping them.
# What each step costs in CI: docs/development.md.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --constraint constraints.txt
TORCHRL_VENV := .venv-torchrl
BENCH_VENV := .venv-bench
comma := ,

.PHONY: run test checks lint typecheck pytest pytest-ray pytest-rest pytest-torchrl docs docs-build package bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) --quiet -e ".[ray]" --group dev
	touch $@

# another venv: $(call other_venv,VENV,WHAT TO INSTALL)
define other_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet --constraint constraints.txt $(2)
	touch $(1)/.installed
endef

$(TORCHRL_VENV)/.installed: pyproject.toml constraints.txt
	$(call other_venv,$(TORCHRL_VENV),-e ".[torchrl$(comma)ray]" --group test)

$(BENCH_VENV)/.installed: pyproject.toml constraints.txt
	$(call other_venv,$(BENCH_VENV),-e . --group bench)

run: $(VENV)/.installed
	$(BIN)/aenvs run

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-test
	$(BIN)/pyright

# the main venv's tests (all but the TorchRL interop ones)
MAIN_TESTS := $(BIN)/python -m pytest -q -m "not torchrl"

pytest: $(VENV)/.installed-test
	$(MAIN_TESTS)

pytest-torchrl: $(TORCHRL_VENV)/.installed
	AENVS_REQUIRE_TORCHRL=1 $(TORCHRL_VENV)/bin/python -m pytest -q -m torchrl

# the main suite in two jobs: the tests on Ray (which share one local cluster) and the
# rest, which must not start one (tests/ray_session.py); together they are `make pytest`
pytest-ray: $(VENV)/.installed-test
	$(MAIN_TESTS) -k ray

pytest-rest: $(VENV)/.installed-test
	AENVS_TESTS_WITHOUT_RAY=1 $(MAIN_TESTS) -k "not ray"

# the checks run while the TorchRL venv installs, then the test suites side by side
# (each one's output in one piece): most of the tests wait on envs, workers and timeouts
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target checks $(TORCHRL_VENV)/.installed
	$(MAKE) --no-print-directory -j3 --output-sync=target pytest-ray pytest-rest pytest-torchrl

checks: lint typecheck docs-build package

# the documentation site (mkdocs.yml, docs/), served with live reload at http://127.0.0.1:8000
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

# the site built into site/, strictly: a broken link or anchor, a reference that names nothing,
# a public name without a docstring or without a reference page fails the build
# (NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor, printed on every build)
docs-build: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

# sdist and wheel in dist/, built as a user's pip would (isolated, setuptools from the index),
# then checked: twine's metadata check, no warning from the build, nothing but aenvs in the
# wheel, the tests (and what they run) in the sdist (.ci/check_dist.py).
# (PYTHONDONTWRITEBYTECODE= : with it set, setuptools warns that it skips byte-compiling.)
package: $(VENV)/.installed-test
	rm -rf dist
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m build --outdir dist . > $(VENV)/package.log 2>&1 \
		|| { cat $(VENV)/package.log; exit 1; }
	@if grep -i "warning" $(VENV)/package.log; then echo "the build warned: $(VENV)/package.log"; exit 1; fi
	$(BIN)/twine check --strict dist/*
	$(BIN)/python .ci/check_dist.py dist

# the benchmark suite against every peer (gymnasium, TorchRL, EnvPool, Ray), from this checkout:
# report and plots in docs/bench
bench: $(BENCH_VENV)/.installed
	$(BENCH_VENV)/bin/aenvs bench

clean:
	rm -rf $(VENV) $(TORCHRL_VENV) $(BENCH_VENV) .pytest_cache .ruff_cache site dist build
