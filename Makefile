# One-command set-up: `make demo` and `make test` both create .venv and install tvr into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Which torch 2.13.0 build goes into .venv (tools/torch_build.sh chooses, and says which and why; docs/scaling.md,
# "Which torch build"; to switch an existing .venv: make clean first; `make torch-choice` only says what it would take):
#   make install                  auto: the CUDA build where an NVIDIA GPU is found (nvidia-smi -L lists one, or
#                                 /proc/driver/nvidia/gpus holds one), else the CPU build from PyTorch's CPU wheel
#                                 index; where that index cannot be reached (checked with a 5 s timeout), torch==2.13.0
#                                 as pip finds it: on the project's machines the CPU build on local disk
#   make install TORCH=cpu        the CPU build, GPU or not
#   make install TORCH=cuda       PyPI's own 2.13.0, the Linux x86_64 build for CUDA 13.0 (NVIDIA driver 580 or newer)
#   make install TORCH_INDEX=URL  torch==2.13.0 from another index, e.g. https://download.pytorch.org/whl/cu126
TORCH ?= auto
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
NVIDIA_PROC ?= /proc/driver/nvidia/gpus
export TORCH TORCH_INDEX TORCH_CPU_INDEX NVIDIA_PROC PYTHON

.PHONY: install torch-choice demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, the build chosen above, so that no dependency pulls another one
	torch=$$(sh tools/torch_build.sh) && $(BIN)/pip install -q $$torch
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

torch-choice:
	@torch=$$(sh tools/torch_build.sh) && echo "pip install $$torch"

demo: $(STAMP)
	$(BIN)/tvr demo

test: $(STAMP)
	$(BIN)/ruff check tvr tests benchmarks
	$(BIN)/ruff format --check tvr tests benchmarks
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check tvr tests benchmarks
	$(BIN)/ruff format --check tvr tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
