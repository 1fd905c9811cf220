"""A release short of its pushes (`make release-check`; part of `make test`): the version in step
wherever it is written, the sdist and wheel as `python -m build` makes them (twine's check, what
they hold), the chart linted and packaged by Helm, the chart README's own-image commands, and the
workflow that publishes all of it on a tag (.github/workflows/release.yml: it cannot run here, so
it is read step by step). Everything is built in temporary directories; the tree is left as it was.
RELEASING.md says how a maintainer cuts a release."""

from __future__ import annotations

import hashlib
import itertools
import re
import shlex
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "timer-service"
CHART_YAML = CHART / "Chart.yaml"
COMPOSE = ROOT / "docker-compose.yml"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
VERSION: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
OUR_IMAGE = "timer-service"  # the chart's default repository, compose's image name
Tool = Callable[[dict[str, Any]], dict[str, Any]]


def _changelog_releases() -> list[str]:
    """CHANGELOG.md's `## ` headings after `## [Unreleased]`, newest first, as written."""
    headings = re.findall(r"^## (.*)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[:1] == ["[Unreleased]"], "CHANGELOG.md starts with ## [Unreleased] (Keep a Changelog)"
    return headings[1:]


def _dockerfile_version() -> str:
    (default,) = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    return default


def _own_image_commands() -> tuple[dict[str, str], list[list[str]]]:
    """The chart README's "Your own image" block: its variables, and each command (the `# or:`
    alternative included) split as the shell would, the variables substituted."""
    section = (CHART / "README.md").read_text().split("\n## Your own image\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    lines = block.replace("\\\n", " ").splitlines()
    variables = dict(re.findall(r"^(\w+)=(\S+)", block, re.M))
    commands = []
    for line in lines:
        line = line.removeprefix("# or: ")
        if re.match(r"\w+=", line) or line.startswith("#"):
            continue
        line = re.sub(r"\$(\w+)", lambda m: variables[m[1]], line)
        commands += [shlex.split(part, comments=True) for part in line.split("&&")]
    return variables, commands


def _set_values(argv: list[str]) -> dict[str, Any]:
    """`--set a.b=c` pairs as the values they make."""
    values: dict[str, Any] = {}
    for flag, pair in itertools.pairwise(argv):
        if flag == "--set":
            path, value = pair.split("=", 1)
            *parents, leaf = path.split(".")
            node = values
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
    return values


def _images(node: Any) -> Iterator[str]:
    """Every `image:` in rendered objects."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chart")


@pytest.fixture(scope="module")
def helm(deploy_tool: Tool, chart_dir: Path) -> dict[str, Any]:
    """One call of Helm's library: the chart linted and rendered by default and with the README's
    own-image values, packaged into chart_dir; Chart.yaml, compose and the workflow read."""
    _, commands = _own_image_commands()
    (install,) = [c for c in commands if c[:2] == ["helm", "install"]]
    return deploy_tool(
        {
            "chart": str(CHART),
            "cases": {"default": {}, "own_image": _set_values(install)},
            "package": str(chart_dir),
            "yaml": [str(CHART_YAML), str(COMPOSE), str(WORKFLOW)],
        }
    )


def _yaml(helm: dict[str, Any], path: Path) -> dict[str, Any]:
    (doc,) = helm["yaml"][str(path)]
    assert isinstance(doc, dict)
    return doc


# --- the version, in step ------------------------------------------------------------------------


def test_the_version_is_written_in_step(helm: dict[str, Any]) -> None:
    """pyproject.toml's version is the release's; every other place that names it agrees."""
    # Plain X.Y.Z: where PEP 440 (the package) and SemVer (the chart) spell a version alike.
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), VERSION
    chart = _yaml(helm, CHART_YAML)
    (default_image,) = set(_images(helm["cases"]["default"]["objects"]))
    newest = _changelog_releases()[0]
    places = {
        "Chart.yaml version": chart["version"],
        "Chart.yaml appVersion": chart["appVersion"],
        "the chart's default image tag": default_image.removeprefix(f"{OUR_IMAGE}:"),
        "Dockerfile ARG VERSION": _dockerfile_version(),
        "CHANGELOG.md's newest release": re.sub(r"^\[(.*?)\].*", r"\1", newest),
        "the chart README's VERSION=": _own_image_commands()[0]["VERSION"],
    }
    assert {place: v for place, v in places.items() if v != VERSION} == {}, f"pyproject.toml: {VERSION}"


def test_compose_builds_its_image_from_this_checkout(helm: dict[str, Any]) -> None:
    """Compose's image is this checkout's build, tagged `local`: never a release's tag it did not
    pull, and never an older one."""
    services = _yaml(helm, COMPOSE)["services"]
    ours = {n: s for n, s in services.items() if s.get("image", "").split(":")[0] == OUR_IMAGE}
    assert len(ours) >= 3, sorted(services)  # migrate, the replicas, demo
    for name, service in ours.items():
        assert service["image"] in {f"{OUR_IMAGE}:local", f"{OUR_IMAGE}:{VERSION}"}, name
        assert service["image"].endswith(VERSION) or service.get("build") == ".", name


def test_the_changelog_has_a_section_per_release() -> None:
    """Keep a Changelog: [Unreleased], then one `## [X.Y.Z] - YYYY-MM-DD` per release, newest first
    (0.1.0 came before the dates were kept)."""
    releases = _changelog_releases()
    found = [re.fullmatch(r"\[(\d+)\.(\d+)\.(\d+)\](?: - (\d{4}-\d\d-\d\d))?", h) for h in releases]
    assert all(found), releases
    versions = [tuple(int(n) for n in m.groups()[:3]) for m in found if m]
    assert versions == sorted(set(versions), reverse=True), releases
    dates = [m[4] for m in found if m and m[4]]
    assert dates == sorted(dates, reverse=True), releases
    assert [h for h, m in zip(releases, found, strict=True) if m and not m[4]] in ([], ["[0.1.0]"])


# --- the sdist and the wheel -----------------------------------------------------------------------


def test_twine_accepts_the_sdist_and_wheel(dist: Path) -> None:
    """What PyPI would refuse (metadata, a README that does not render) is refused here first."""
    files = sorted(str(p) for p in dist.glob("timer_service-*"))
    assert [Path(f).name for f in files] == [
        f"timer_service-{VERSION}-py3-none-any.whl",
        f"timer_service-{VERSION}.tar.gz",
    ]
    argv = [sys.executable, "-m", "twine", "check", "--strict", *files]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_build_warns_of_nothing(dist: Path) -> None:
    """setuptools' warnings (a data directory left out of `packages`, a deprecated setting) are
    how a file goes missing from the wheel or a release breaks on the next setuptools."""
    warnings = [line for line in (dist / "build.log").read_text().splitlines() if "warn" in line.lower()]
    assert warnings == []


def test_the_sdist_carries_the_docs_and_changelog(dist: Path) -> None:
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert "CHANGELOG.md" in names
    for path in (ROOT / "docs").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert path.relative_to(ROOT).as_posix() in names, path
    assert not any(n.startswith("tests/") for n in names)


def test_the_wheel_ships_every_module_and_file(dist: Path) -> None:
    (wheel,) = dist.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in (ROOT / "worker").rglob("*.py"):
        assert path.relative_to(ROOT).as_posix() in names
    for path in (ROOT / "sql").rglob("*.sql"):
        assert f"worker/{path.relative_to(ROOT).as_posix()}" in names
    # The named statements, the migrations and the generated schema, each found (not a vacuous loop).
    assert "worker/sql/schema.sql" in names
    for folder in ("queries", "migrations"):
        assert len([n for n in names if re.fullmatch(rf"worker/sql/{folder}/[^/]+\.sql", n)]) >= 7, folder
    assert f"timer_service-{VERSION}.dist-info/licenses/LICENSE" in names


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_wheel_and_sdist_hold_no_tests_and_no_benchmark_code(dist: Path) -> None:
    # The benchmarks (tools/) and the tests stay in the repository: not as a package, not under
    # another name.
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        contents = {_digest(whl.read(n)): n for n in names if not n.endswith("/")}
    assert {n.split("/")[0] for n in names} == {"worker", f"timer_service-{VERSION}.dist-info"}
    banned = {"bench", "peers", "tools", "tests", "conftest"}
    named = [n for n in names if banned & set(PurePosixPath(n).with_suffix("").parts)]
    assert named == [], "a test, bench or peers module, or tools/, in the wheel"
    kept_out = [
        p
        for folder in ("tools", "tests")
        for p in (ROOT / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.stat().st_size > 0
    ]
    assert len(kept_out) >= 100, "the benchmarks or tests moved: point this test at them"
    copies = {contents[d]: p for p in kept_out if (d := _digest(p.read_bytes())) in contents}
    assert copies == {}, "test or benchmark code in the wheel"
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        top = f"timer_service-{VERSION}/"
        members = {m.name.removeprefix(top).split("/")[0] for m in tar.getmembers() if m.name != top[:-1]}
    assert not {"tools", "tests"} & members and {"worker", "sql"} <= members, sorted(members)


# --- the chart -------------------------------------------------------------------------------------


def test_the_chart_lints_and_packages(helm: dict[str, Any], chart_dir: Path) -> None:
    """`helm lint --strict` has nothing to say; `helm package` makes timer-service-X.Y.Z.tgz, outside
    the tree, holding the schema, the README and every template."""
    assert [m for m in helm["cases"]["default"]["lint"] if m["severity"] in ("warning", "error")] == []
    package = helm["package"]
    assert Path(package["archive"]) == chart_dir / f"timer-service-{VERSION}.tgz"
    assert (package["metadata"]["version"], package["metadata"]["appVersion"]) == (VERSION, VERSION)
    templates = {p.relative_to(CHART).as_posix() for p in (CHART / "templates").rglob("*") if p.is_file()}
    assert {"README.md", "values.schema.json", *templates} <= set(package["files"])
    assert not list(ROOT.glob("*.tgz")) and not list(CHART.glob("*.tgz"))


def test_the_readme_builds_pushes_and_installs_one_image(helm: dict[str, Any]) -> None:
    """The chart README's commands build, push and install the same name and tag, with the image's
    version label, and the chart runs what they pushed."""
    variables, commands = _own_image_commands()
    wanted = f"{variables['IMAGE']}:{VERSION}"
    builds = [c for c in commands if c[0] in ("docker", "buildah") and c[1] == "build"]
    pushes = [c for c in commands if c[0] in ("docker", "buildah") and c[1] == "push"]
    assert {c[0] for c in builds} == {c[0] for c in pushes} == {"docker", "buildah"}
    for build in builds:
        assert build[build.index("-t") + 1] == wanted and build[-1] == "."
        assert build[build.index("--build-arg") + 1] == f"VERSION={VERSION}"
    assert {c[2] for c in pushes} == {wanted}
    own = helm["cases"]["own_image"]
    assert own["error"] is None, own["error"]
    assert set(_images(own["objects"])) == {wanted}


# --- the workflow ----------------------------------------------------------------------------------


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = job["steps"]
    return steps


def _uses(job: dict[str, Any], action: str) -> dict[str, Any]:
    (step,) = [s for s in _steps(job) if s.get("uses", "").split("@")[0] == action]
    return step


def test_the_release_workflow_publishes_only_what_passed(helm: dict[str, Any]) -> None:
    workflow = _yaml(helm, WORKFLOW)
    trigger = workflow.get("on", workflow.get("true"))  # YAML 1.1 reads a bare `on` as true
    assert trigger == {"push": {"tags": ["v*"]}}
    assert workflow["permissions"] == {"contents": "read"}
    jobs: dict[str, dict[str, Any]] = workflow["jobs"]
    # Every action pinned to a major version at least (a moving branch only where the action's
    # maintainers publish one, as PyPA does).
    for job in jobs.values():
        for step in _steps(job):
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@(v\d+(\.\d+)*|release/v\d+)", step["uses"]), step

    # The tag must be pyproject.toml's version, and every test passes before anything is pushed.
    check = "\n".join(s.get("run", "") for s in _steps(jobs["check"]))
    assert "GITHUB_REF_NAME" in check and '["project"]["version"]' in check and ".ci/run" in check
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("make test")

    def upstream(name: str) -> set[str]:
        needs = jobs[name].get("needs", [])
        direct = {needs} if isinstance(needs, str) else set(needs)
        return direct.union(*(upstream(n) for n in direct))

    assert {name for name in jobs if "check" not in upstream(name)} == {"check"}

    # sdist and wheel: built and checked by twine, handed to PyPI by trusted publishing, last.
    dist = "\n".join(s.get("run", "") for s in _steps(jobs["dist"]))
    assert "python -m build" in dist and "twine check --strict dist/*" in dist
    assert _uses(jobs["dist"], "actions/upload-artifact")["with"]["name"] == "dist"
    pypi = jobs["pypi"]
    assert pypi["permissions"] == {"id-token": "write"} and pypi["environment"]["name"] == "pypi"
    assert "with" not in _uses(pypi, "pypa/gh-action-pypi-publish")  # no password: OIDC
    assert upstream("pypi") == set(jobs) - {"pypi"}

    # The image: the Dockerfile, an SBOM and provenance, the OCI labels, pushed to ghcr.io.
    build = _uses(jobs["image"], "docker/build-push-action")["with"]
    assert build["push"] is True and build["sbom"] is True and build["provenance"] == "mode=max"
    labels = dict(line.split("=", 1) for line in build["labels"].splitlines())
    assert set(labels) == {f"org.opencontainers.image.{k}" for k in ("version", "revision", "source")}
    assert labels["org.opencontainers.image.version"] == "${{ needs.check.outputs.version }}"
    assert build["build-args"].splitlines() == ["VERSION=${{ needs.check.outputs.version }}"]
    (tag,) = build["tags"].splitlines()
    assert tag == "${{ steps.name.outputs.image }}:${{ needs.check.outputs.version }}"
    assert jobs["image"]["permissions"]["packages"] == "write"

    # The chart: packaged by the Helm the tests use, pushed to an OCI registry after the image it names.
    chart = jobs["chart"]
    assert _uses(chart, "azure/setup-helm")["with"]["version"] == helm["helm"]
    script = "\n".join(s.get("run", "") for s in _steps(chart))
    assert "helm package deploy/helm/timer-service" in script and "helm push" in script and "oci://" in script
    assert "image" in upstream("chart")
