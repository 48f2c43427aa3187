# One-command set-up: `make demo` and `make test` both create .venv and install tvr into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first: the CPU build on local disk; a bare requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
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
