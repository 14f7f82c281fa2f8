PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.zbrl-installed

.PHONY: setup test lint format demo bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# CPU torch first (a plain `pip install torch` pulls GBs of CUDA), then the package constrained to it.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

test: setup
	RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -q tests

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: setup
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

demo: setup
	$(BIN)/zbrl demo

bench: setup
	$(BIN)/python bench/sync_vs_async.py
	$(BIN)/python bench/rewards.py
	$(BIN)/python bench/logprob_memory.py
	$(BIN)/python bench/scaling.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
