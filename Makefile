# Two entry points: `make train` (the default experiment) and `make test` (the suite).
# Both create their own virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build; on a CUDA cluster use e.g. `make install TORCH_SPEC="torch==2.13.0 --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0
RUN_DIR ?= runs/default
STAMP := $(VENV)/.installed

.PHONY: install train test test-quick clean-runs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# The default experiment on a CPU mesh, one rank per core: dp=2 x tp=2 (4 ranks) on a machine
# with 4 or more cores, FSDP2 over dp=2 (2 ranks) on 2 or 3, where 4 ranks would share cores
# and their tensor-parallel all-reduces wait on each other (2.5x slower on a 2-core VM).
# 8 samples per data-parallel rank: a global batch of 16, as the single-process default. The
# model is small and gloo is slow per collective, so FSDP2 keeps gathered weights through
# backward and groups blocks into one unit per mesh (fewest collectives).
# `make train NPROC=4` runs dp=2 x tp=2 on any machine.
CORES := $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 4)
NPROC ?= $(if $(filter 1 2 3,$(CORES)),2,4)
MESH := $(if $(filter 4,$(NPROC)),parallelism=fsdp2_tp2,parallelism=fsdp2)
LAYOUT ?= $(MESH) trainer.batch_size=8 trainer.parallelism.reshard_after_forward=false trainer.parallelism.shard_granularity=grouped

train: $(STAMP)
	$(BIN)/credit train --nproc $(NPROC) $(LAYOUT) run_dir=$(RUN_DIR)

# Two pytest workers, each taking whole files (module fixtures run once): the multi-rank
# launches leave a core idle while they start up and wait on each other.
TEST_WORKERS ?= 2

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The edit-test loop: every test but the heavy files (tests/conftest.py lists them), with one
# multi-rank smoke test (tests/parallel/test_smoke.py).
test-quick: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not heavy"

clean-runs:
	rm -rf runs
