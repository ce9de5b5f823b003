# Two commands on a fresh machine with only python3 and pip:
#   make run    creates .venv, installs aenvs, runs `aenvs run` on the default env
#   make test   creates .venv, installs the test extras (Ray included), runs lint, types and the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --constraint constraints.txt

.PHONY: run test lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml constraints.txt
	$(PIP) --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) --quiet -e ".[test,ray]"
	touch $@

run: $(VENV)/.installed
	$(BIN)/aenvs run

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-test
	$(BIN)/pyright

pytest: $(VENV)/.installed-test
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/latency.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
