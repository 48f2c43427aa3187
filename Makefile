# One-command set-up: `make demo` and `make test` both create .venv and install tvr into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Which torch 2.13.0 build (docs/scaling.md, "A CUDA build of torch"; to switch an existing .venv: make clean first):
#   make install                  torch==2.13.0 as pip finds it: on the project's machines the CPU build on local disk
#   make install TORCH=cuda       PyPI's own 2.13.0, the Linux x86_64 build for CUDA 13.0 (NVIDIA driver 580 or newer);
#                                 the exact-version requirement '===' is never met by a local build such as 2.13.0+cpu
#   make install TORCH_INDEX=URL  torch==2.13.0 from another index, e.g. https://download.pytorch.org/whl/cu126
TORCH ?= cpu
TORCH_INDEX ?=
ifneq ($(TORCH_INDEX),)
TORCH_INSTALL := torch==2.13.0 --index-url $(TORCH_INDEX)
else ifeq ($(TORCH),cuda)
TORCH_INSTALL := torch===2.13.0
else ifeq ($(TORCH),cpu)
TORCH_INSTALL := torch==2.13.0
else
$(error TORCH=$(TORCH): expected cpu or cuda)
endif

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, the build chosen above, so that no dependency pulls another one
	$(BIN)/pip install -q "$(firstword $(TORCH_INSTALL))" $(wordlist 2,9,$(TORCH_INSTALL))
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

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
