"""The Dockerfile built into an image and run, with no Docker daemon: `make image-test`.

Debian's buildah builds the real Dockerfile (vfs storage, chroot isolation). No registry is
reached for the base: mmdebstrap makes a Debian bookworm root with Python 3.11 and it is passed
as PYTHON_IMAGE, the Dockerfile's one build argument. That base also gets this machine's CA bundle
and pip.conf `cert`, so pip inside the build trusts what the host's pip trusts. The image's
entrypoint then runs against the test servers: `--version`, and `run` until /healthz answers.

Not in `make test` (about three minutes and the Debian mirror); tests/integration/test_installed.py runs the
Dockerfile's install steps in a fresh venv there instead.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import settings_env, until
from worker import __version__
from worker.config import Settings
from worker.devkit.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
BUILDAH = ["buildah", "--storage-driver", "vfs"]
BASE = "localhost/timer-service-test-base:bookworm"
IMAGE = "localhost/timer-service:image-test"
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


def sh(*argv: str | Path, **kw: object) -> str:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True, text=True, **kw).stdout  # type: ignore[call-overload,no-any-return]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for tool in ("buildah", "mmdebstrap"):
        assert shutil.which(tool), f"{tool} missing: `make image-test` installs it (apt-get install {tool})"
    tmp = tmp_path_factory.mktemp("image")
    started = time.monotonic()
    rootfs = tmp / "rootfs.tar"
    sh(
        "mmdebstrap",
        "--variant=minbase",
        "--include=python3,python3-venv,python-is-python3,passwd,ca-certificates",
        "bookworm",
        rootfs,
    )
    base = sh(*BUILDAH, "from", "scratch").strip()
    sh(*BUILDAH, "add", base, rootfs, "/")
    (tmp / "pip.conf").write_text(f"[global]\ncert = {HOST_CA}\n")
    sh(*BUILDAH, "copy", base, HOST_CA, HOST_CA)
    sh(*BUILDAH, "copy", base, tmp / "pip.conf", "/etc/pip.conf")
    sh(*BUILDAH, "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", base)
    sh(*BUILDAH, "commit", "--rm", "-q", base, BASE)
    based = time.monotonic()
    sh(*BUILDAH, "bud", "--isolation", "chroot", "--build-arg", f"PYTHON_IMAGE={BASE}", "-t", IMAGE, ROOT)
    print(f"\nbase image {based - started:.0f} s, Dockerfile build {time.monotonic() - based:.0f} s")
    yield IMAGE
    sh(*BUILDAH, "rmi", "-f", IMAGE, BASE)


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = sh(*BUILDAH, "from", image).strip()
    yield name
    sh(*BUILDAH, "rm", name)


def test_image_version(container: str) -> None:
    out = sh(*BUILDAH, "run", "--isolation", "chroot", container, "--", "timer-service", "--version")
    assert out.strip() == f"timer-service {__version__}"


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "w") as out:
        return subprocess.Popen(argv, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)


async def test_image_runs_a_healthy_replica(container: str, settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    env = settings_env(settings) | {"TIMER_HTTP_PORT": str(port)}
    # The image's own ENTRYPOINT and CMD (`timer-service run`), as a container runtime starts it.
    template = "{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}{{range .OCIv1.Config.Cmd}}{{.}} {{end}}"
    command = sh(*BUILDAH, "inspect", "--format", template, container).split()
    assert command == ["timer-service", "run"]
    argv = [
        *BUILDAH,
        "run",
        "--isolation",
        "chroot",
        *(f"--env={k}={v}" for k, v in env.items()),
        container,
        "--",
        *command,
    ]
    log = tmp_path / "run.log"
    proc = await asyncio.to_thread(_start, argv, log)

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                ready = r.status == 200
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return ready and r.status == 200
        except OSError:
            return False

    try:
        await until(healthy, timeout=60, what="the image's /readyz and /healthz")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: buildah and the replica under it
        await asyncio.to_thread(proc.wait, 30)
