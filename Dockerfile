# syntax=docker/dockerfile:1
# timer-service: one replica per container (`run`), or the operator console (`console`).
# `docker build --build-arg VERSION=$(git describe --tags --always) -t timer-service .`
# The tag is pinned (Python and Debian release); add @sha256:... to pin bytes too.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# --- build: install the package and its wheels into a venv, nothing else ----------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/timer-service
WORKDIR /src
# Only what the wheel is built from (see .dockerignore), so edits to tests or docs keep the cache.
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE constraints.txt ./
COPY worker ./worker
COPY sql ./sql
# With the console extra, so `timer-service console` runs from the same image; every dependency
# at the version constraints.txt pins (how to regenerate it: its header).
RUN /opt/timer-service/bin/pip install --constraint constraints.txt '.[console]' \
    && /opt/timer-service/bin/pip uninstall --yes pip setuptools wheel

# --- runtime: the venv on a clean base, as an unprivileged user --------------------------------
FROM ${PYTHON_IMAGE}
# The image's version label: pass the release's (a tag, a commit); the default is pyproject's.
ARG VERSION=0.2.0
# OCI annotations (registries and scanners show them). The source is a placeholder until the
# project has a public address (pyproject.toml's [project.urls] names the same one).
LABEL org.opencontainers.image.title="timer-service" \
      org.opencontainers.image.description="Durable, multi-tenant timers on Postgres and NATS JetStream" \
      org.opencontainers.image.source="https://example.com/timer-service" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# A fixed numeric id, so Kubernetes' runAsNonRoot can check it and the chart can match it.
RUN groupadd --system --gid 10001 timer \
    && useradd --system --uid 10001 --gid timer --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin timer
COPY --from=build /opt/timer-service /opt/timer-service
ENV PATH=/opt/timer-service/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TIMER_HTTP_PORT=8080
USER 10001:10001
EXPOSE 8080
# /healthz: the replica's loops are alive. Python's urllib, because slim images have no curl.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('TIMER_HTTP_PORT', '8080') + '/healthz', timeout=2)"]
# SIGTERM goes straight to the service (exec form, PID 1), which drains and exits 0.
ENTRYPOINT ["timer-service"]
CMD ["run"]
