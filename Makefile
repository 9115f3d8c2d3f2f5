# Every target sets up .venv first, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast lint gpu-check gpu-wheels demo bench clean

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
	$(BIN)/python -m pytest -q --durations=20

# ruff (style, imports, bugbear, McCabe complexity <= 15) and mypy (types) on the package
lint: setup
	$(BIN)/ruff check rlpipe tests bench
	$(BIN)/mypy rlpipe

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

# the CUDA path on this host's GPUs, one or more (bench/gpu_check.py); one line and exit 0 without a GPU.
# On a GPU host whose own CUDA torch has rlpipe installed (bench/gpu_host.sh): make gpu-check GPU_PYTHON=python3
# GPU_CHECK_ARGS='--out DIR' keeps the runs' files.
GPU_PYTHON ?=
GPU_CHECK_ARGS ?=
gpu-check:
ifeq ($(GPU_PYTHON),)
	$(MAKE) setup
	$(BIN)/python -m bench.gpu_check $(GPU_CHECK_ARGS)
else
	$(GPU_PYTHON) -m bench.gpu_check $(GPU_CHECK_ARGS)
endif

# the wheels the GPU host lacks (it has no package registry), for bench/gpu_host.sh
gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl \
		gymnasium==1.4.0 farama-notifications==0.0.6 stable-baselines3==2.9.2 sb3-contrib==2.9.2

demo: setup
	$(BIN)/rlpipe demo --out demo-out

bench: setup
	$(BIN)/python -m bench.run_all

clean:
	rm -rf $(VENV) demo-out .pytest_cache .hypothesis
