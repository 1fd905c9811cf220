"""Lint and render the Helm chart, and read YAML files, for tests/deploy (prints JSON).

Runs in the deploy-tools venv (`.venv-helm`, see deploy/requirements-helm.txt), not under pytest:
helm-python-sdk binds Helm v4's own Go library (the engine `helm lint` and `helm template` use),
so the chart is checked by Helm itself with no helm binary and no cluster.

stdin:  {"chart": dir, "release": name, "namespace": ns, "cases": {case: values}, "yaml": [paths],
         "upgrades": [cases rendered as an upgrade (.Release.IsUpgrade) rather than an install],
         "package": dir to package the chart into (`helm package`)}
stdout: {"cases": {case: {"lint": [messages], "objects": [{"template", "object"}], "notes": str,
                         "error": str|null}},
         "yaml": {path: [documents]},
         "package": {"archive": path, "metadata": Chart.yaml as packaged, "files": [names]},
         "helm": the Helm version linting and packaging}
"""

from __future__ import annotations

import json
import sys
from typing import Any

import helm_python as helm
import yaml

SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}


def render_case(
    chart: Any, path: str, values: dict[str, Any], release: str, ns: str, upgrade: bool = False
) -> dict[str, Any]:
    report = helm.lint(path, values, strict=True, namespace=ns)
    lint = [{**m, "severity": SEVERITY.get(m["severity"], "unknown")} for m in report["messages"]]
    out: dict[str, Any] = {"lint": lint, "objects": [], "notes": "", "error": None}
    try:
        manifests = chart.render(
            values,
            name=release,
            namespace=ns,
            is_install=not upgrade,
            is_upgrade=upgrade,
            revision=2 if upgrade else 1,
        )
    except helm.HelmError as exc:  # schema violations and `fail` in templates land here
        out["error"] = str(exc)
        return out
    for template, text in sorted(manifests.items()):
        if template.endswith("NOTES.txt"):
            out["notes"] = text
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out["objects"].append({"template": template.split("/templates/", 1)[-1], "object": doc})
    return out


def package(path: str, destination: str) -> dict[str, Any]:
    """`helm package` into `destination`; the archive read back as Helm would install it."""
    archive = helm.package(path, destination=destination)
    packaged = helm.Chart.load(archive)
    files = [f["name"] for f in (*packaged.files, *packaged.templates)]
    files += ["values.schema.json"] if packaged.schema else []  # Helm holds it apart from the files
    return {"archive": archive, "metadata": packaged.metadata, "files": files}


def main() -> None:
    req = json.load(sys.stdin)
    result: dict[str, Any] = {"cases": {}, "yaml": {}, "helm": helm.helm_sdk_version()}
    if req.get("chart"):
        chart = helm.Chart.load(req["chart"])
        for case, values in req.get("cases", {}).items():
            result["cases"][case] = render_case(
                chart,
                req["chart"],
                values,
                req.get("release", "demo"),
                req.get("namespace", "timers"),
                case in req.get("upgrades", []),
            )
    if req.get("package"):
        result["package"] = package(req["chart"], req["package"])
    for path in req.get("yaml", []):
        with open(path, encoding="utf-8") as f:
            result["yaml"][path] = list(yaml.safe_load_all(f))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
