# Two commands do all set-up on a fresh machine: `make dev` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev test lint typecheck bench chaos-soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/timer-service dev

test: $(STAMP) lint typecheck
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check worker tests
	$(BIN)/ruff format --check worker tests

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/timer-service bench

clean:
	rm -rf $(VENV) .venv-helm .pytest_cache .mypy_cache .ruff_cache
