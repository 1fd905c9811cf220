"""The alert rules: deploy/prometheus/alerts.yaml read as YAML, and the chart's PrometheusRule,
which must carry the same rules. (Metric names in the expressions:
tests/integration/test_observability.py.)"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker.metrics import LATENESS_SECONDS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "timer-service"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
Tool = Callable[[dict[str, Any]], dict[str, Any]]

RUNBOOK = "https://docs.example.com/timer-service/OPERATIONS.md"
CASES: dict[str, dict[str, Any]] = {
    "default": {},
    "rules": {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "monitoring"}}}},
    "rules_runbook": {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": RUNBOOK}}},
    "rules_relative_runbook": {
        "metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": "docs/OPERATIONS.md"}}
    },
    "rules_typo": {"metrics": {"prometheusRule": {"enable": True}}},
}


@pytest.fixture(scope="module")
def answer(deploy_tool: Tool) -> dict[str, Any]:
    return deploy_tool(
        {
            "chart": str(CHART),
            "release": "demo",
            "namespace": "timers",
            "cases": CASES,
            "yaml": [str(RULES), str(CHART / "values.yaml")],
        }
    )


@pytest.fixture(scope="module")
def groups(answer: dict[str, Any]) -> list[dict[str, Any]]:
    (document,) = answer["yaml"][str(RULES)]
    found: list[dict[str, Any]] = document["groups"]
    return found


def _rules(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for group in groups for rule in group["rules"]]


def _prometheus_rules(case: dict[str, Any]) -> list[dict[str, Any]]:
    assert case["error"] is None, case["error"]
    return [o["object"] for o in case["objects"] if o["object"]["kind"] == "PrometheusRule"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ +(.+?) *$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_alert_is_complete(answer: dict[str, Any], groups: list[dict[str, Any]]) -> None:
    rules = _rules(groups)
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 6
    for rule in rules:
        assert rule["expr"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), rule["alert"]
        # Absolute, so Alertmanager and Grafana can open it; the same base as the chart's default.
        assert annotations["runbook_url"] == f"{_default_runbook_base(answer)}#{rule['alert'].lower()}"


def _default_runbook_base(answer: dict[str, Any]) -> str:
    (values,) = answer["yaml"][str(CHART / "values.yaml")]
    base: str = values["metrics"]["prometheusRule"]["runbookBaseUrl"]
    assert re.fullmatch(r"https://[^#\s]+/docs/OPERATIONS\.md", base), base
    return base


def test_issue_alerts_are_there(groups: list[dict[str, Any]]) -> None:
    """The alerts issue 5 asks for, by the metric each one watches."""
    exprs = " ".join(r["expr"] for r in _rules(groups))
    for metric in [
        "timer_loop_last_tick_timestamp_seconds",
        "timer_oldest_overdue_seconds",
        "timer_commands_rejected_total",
        "timer_leases_reclaimed_total",
        "timer_ready",
        "timer_publish_failures_total",
    ]:
        assert metric in exprs


def test_every_runbook_link_lands_on_a_section(groups: list[dict[str, Any]]) -> None:
    anchors = _anchors(OPERATIONS.read_text())
    missing = [r["alert"] for r in _rules(groups) if r["alert"].lower() not in anchors]
    assert missing == [], f"no section in docs/OPERATIONS.md for {missing}"


def test_prometheus_rule_is_off_by_default(answer: dict[str, Any]) -> None:
    assert _prometheus_rules(answer["cases"]["default"]) == []


def test_prometheus_rule_carries_the_rule_file(answer: dict[str, Any], groups: list[dict[str, Any]]) -> None:
    case = answer["cases"]["rules"]
    assert [m for m in case["lint"] if m["severity"] in ("warning", "error")] == []
    (rule,) = _prometheus_rules(case)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "demo-timer-service"
    labels = rule["metadata"]["labels"]
    assert labels["release"] == "monitoring"
    assert labels["app.kubernetes.io/instance"] == "demo"
    assert rule["spec"]["groups"] == groups


def test_runbook_links_follow_the_value(answer: dict[str, Any], groups: list[dict[str, Any]]) -> None:
    (rule,) = _prometheus_rules(answer["cases"]["rules_runbook"])
    rendered = _rules(rule["spec"]["groups"])
    assert [r["annotations"]["runbook_url"] for r in rendered] == [
        f"{RUNBOOK}#{r['alert'].lower()}" for r in _rules(groups)
    ]
    # Prometheus' own templates pass through Helm untouched.
    assert "{{ $labels.instance }}" in rendered[0]["annotations"]["summary"]


def test_schema_rejects_a_typo(answer: dict[str, Any]) -> None:
    error = answer["cases"]["rules_typo"]["error"]
    assert error is not None and "additional properties 'enable' not allowed" in error
    # A relative link opens nothing from Alertmanager: the schema wants an absolute one.
    error = answer["cases"]["rules_relative_runbook"]["error"]
    assert error is not None and "/metrics/prometheusRule/runbookBaseUrl" in error, error


def _rule(groups: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (rule,) = [r for r in _rules(groups) if r["alert"] == name]
    return rule


def test_no_replica_up_is_an_alert(groups: list[dict[str, Any]]) -> None:
    """With every replica gone there is no series at all, which no comparison sees: only absent()."""
    rule = _rule(groups, "TimerNoReplicaReady")
    expr = " ".join(rule["expr"].split())
    assert "absent(timer_ready == 1)" in expr
    # ... and an installation whose replicas are all unready while another one is fine.
    assert "max by (namespace, job) (timer_ready) < 1" in expr
    assert rule["labels"]["severity"] == "critical"
    assert rule["for"] == "2m"


def test_lateness_objective_is_an_alert(groups: list[dict[str, Any]]) -> None:
    rule = _rule(groups, "TimerFiringLate")
    m = re.fullmatch(
        r"histogram_quantile\(0\.99, sum by \(namespace, job, le\) "
        r"\(rate\(timer_lateness_seconds_bucket\[10m\]\)\)\) > ([\d.]+)",
        " ".join(rule["expr"].split()),
    )
    assert m, rule["expr"]
    # The objective is a bucket boundary, so the quantile is exact there, not interpolated.
    assert float(m.group(1)) == 1.0
    assert 1.0 in LATENESS_SECONDS._upper_bounds
    assert rule["labels"]["severity"] == "warning"


def test_rejection_alert_has_series_before_the_first_rejection(groups: list[dict[str, Any]]) -> None:
    """TimerCommandRejections divides rate(timer_commands_rejected_total): a reason's series must
    exist at 0 from start-up, or the first rejections make no rate (increase from nothing)."""
    from prometheus_client import REGISTRY, generate_latest

    from worker.contract import REASONS

    assert "timer_commands_rejected_total" in _rule(groups, "TimerCommandRejections")["expr"]
    exposed = generate_latest(REGISTRY).decode()
    missing = [r for r in sorted(REASONS) if f'timer_commands_rejected_total{{reason="{r}"}}' not in exposed]
    assert missing == []
