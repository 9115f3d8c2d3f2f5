# Every target sets up .venv first, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast lint gpu-check demo bench clean

setup: $(STAMP)

# torch is pinned to the CPU build that lies on this machine's disk; installing it first keeps
# pip from pulling a multi-GB CUDA build to satisfy the project's torch range.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: setup
	$(BIN)/python -m pytest -q

# ruff (style, imports, bugbear, McCabe complexity <= 15) and mypy (types) on the package
lint: setup
	$(BIN)/ruff check rlpipe tests bench
	$(BIN)/mypy rlpipe

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# on a machine with CUDA GPUs: NCCL stages, live repartitions, a PPO controller (skipped without GPUs)
gpu-check: setup
	$(BIN)/pip install --quiet 'nvidia-ml-py>=12'
	$(BIN)/python -m pytest -q -m gpu -rs

demo: setup
	$(BIN)/rlpipe demo --out demo-out

bench: setup
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) demo-out .pytest_cache .hypothesis
