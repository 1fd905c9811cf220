"""Observability: docs/OPERATIONS.md, worker/metrics.py, a running replica's /metrics, the alert
rules and the dashboard name the same metrics, so none of them can drift from the others."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import http_get, iso_in, jetstream, publish_raw, row, running_replica, until
from worker import metrics
from worker.config import Settings

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "timer-service-dashboard.json"

# Series each metric type exposes, after prometheus_client (counters keep `_total` in their name;
# no `_created` series: worker/metrics.py turns them off).
SUFFIXES = {
    "counter": [""],
    "gauge": [""],
    "histogram": ["_bucket", "_count", "_sum"],
}
PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "inf", "nan"}


# --- what the code defines, what the doc says -------------------------------------------------


def code_metrics() -> dict[str, tuple[str, set[str]]]:
    """Exposed name -> (type, label names) of every metric in worker/metrics.py."""
    found = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            family = value.describe()[0]
            name = family.name + "_total" if family.type == "counter" else family.name
            found[name] = (family.type, set(value._labelnames))
    return found


def series_names() -> set[str]:
    """Every series name a query may use: the metrics with their type's suffixes."""
    return {name + suffix for name, (kind, _) in code_metrics().items() for suffix in SUFFIXES[kind]}


def section(markdown: str, heading: str) -> str:
    start = markdown.index(f"\n## {heading}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start : end if end >= 0 else None]


def documented_metrics() -> dict[str, tuple[str, set[str]]]:
    """The Metrics table of docs/OPERATIONS.md: name -> (type, label names)."""
    found = {}
    for line in section(OPERATIONS.read_text(), "Metrics").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"`(timer_\w+)`", cells[0])):
            found[m.group(1)] = (cells[1], set(re.findall(r"`(\w+)`", cells[2])))
    return found


def test_documented_metrics_are_the_code_metrics() -> None:
    documented, code = documented_metrics(), code_metrics()
    assert len(documented) >= 18
    assert set(documented) == set(code), "docs/OPERATIONS.md Metrics table vs worker/metrics.py"
    for name, (kind, labels) in code.items():
        assert documented[name] == (kind, labels), name


def test_documented_log_actions_are_the_code_actions() -> None:
    code = {
        a
        for path in (ROOT / "worker").rglob("*.py")
        for a in re.findall(r'"action": "(\w+)"', path.read_text())
    }
    table = section(OPERATIONS.read_text(), "Logs")
    documented = set(re.findall(r"^\| `(\w+)` \|", table, flags=re.MULTILINE))
    assert documented == code, "docs/OPERATIONS.md Logs table vs the `action` keys in worker/"


def test_lateness_buckets_resolve_the_usual_lateness() -> None:
    """p50 is about 2 ms (docs/BENCHMARKS.md): buckets must split the first 5 ms, or every on-time
    firing lands in one bucket and p50 reads as whatever interpolation makes of it."""
    bounds = [b for b in metrics.LATENESS_SECONDS._upper_bounds if b <= 0.005]
    assert bounds[0] <= 0.001
    assert len(bounds) >= 4, bounds
    assert 1.0 in metrics.LATENESS_SECONDS._upper_bounds  # the TimerFiringLate objective


# --- alert rules and dashboard ----------------------------------------------------------------


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords,
    label names (in matchers and by/on/... lists), strings, ranges or Grafana variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    expr = re.sub(r"\$\{?\w+\}?", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", expr):
        if m.group(0).lower() not in PROMQL_KEYWORDS and not expr[m.end() :].lstrip().startswith("("):
            names.add(m.group(0))
    return names


def test_metric_names_parser() -> None:
    expr = (
        'sum by (reason) (rate(timer_commands_rejected_total{job=~"$job"}[$__rate_interval]))'
        " / on () group_left () histogram_quantile(0.99, sum by (le) (rate(timer_claim_seconds_bucket[5m])))"
        " > 1e3 and timestamp(timer_ready) - timer_ready offset 5m > bool 0.5"
    )
    assert metric_names(expr) == {
        "timer_commands_rejected_total",
        "timer_claim_seconds_bucket",
        "timer_ready",
    }


def alert_rules(text: str) -> dict[str, dict[str, str]]:
    """alerts.yaml, read as the subset it is written in: `- alert:` items whose keys are one-line
    values or block scalars (`|`, `>-`). (tests/deploy reads it with a real YAML parser.)"""
    rules: dict[str, dict[str, str]] = {}
    for item in re.split(r"^ *- alert: *", text, flags=re.MULTILINE)[1:]:
        name, *lines = item.splitlines()
        keys: dict[str, str] = {}
        for i, line in enumerate(lines):
            m = re.match(r"^( *)(\w+): *(.*)$", line)
            if not m:
                continue
            indent, key, value = len(m.group(1)), m.group(2), m.group(3)
            if value in ("|", "|-", ">", ">-"):
                block = []
                for more in lines[i + 1 :]:
                    if more.strip() and len(more) - len(more.lstrip()) <= indent:
                        break
                    block.append(more.strip())
                value = " ".join(block).strip()
            keys[key] = value
        rules[name.strip()] = keys
    return rules


def test_alert_rules_use_only_defined_metrics() -> None:
    rules = alert_rules(ALERTS.read_text())
    assert len(rules) >= 6
    known = series_names()
    for name, keys in rules.items():
        used = metric_names(keys["expr"])
        assert used, f"{name}: no metric in {keys['expr']!r}"
        assert used <= known, f"{name}: unknown metrics {sorted(used - known)}"
        assert {"summary", "description", "runbook_url", "severity"} <= set(keys), name


def _walk(node: Any) -> list[dict[str, Any]]:
    """Every object in a JSON document."""
    if isinstance(node, dict):
        return [node] + [d for v in node.values() for d in _walk(v)]
    if isinstance(node, list):
        return [d for v in node for d in _walk(v)]
    return []


def test_dashboard_uses_only_defined_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    objects = _walk(dashboard)
    exprs = [o["expr"] for o in objects if isinstance(o.get("expr"), str)]
    variables = [
        o["query"] for o in objects if isinstance(o.get("query"), str) and "label_values" in o["query"]
    ]
    assert len(exprs) >= 20 and variables
    known = series_names()
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names and names <= known, f"unknown metrics in {expr!r}: {sorted(names - known)}"
        used |= names
    for query in variables:
        m = re.match(r"label_values\((\w+)", query)
        assert m and m.group(1) in known, query
    # Every metric of the service is on the dashboard somewhere.
    shown = {n.removesuffix("_bucket") for n in used}
    assert set(code_metrics()) <= shown
    panels = [o for o in objects if "gridPos" in o]
    assert len({p["id"] for p in panels}) == len(panels)


# --- a running replica ------------------------------------------------------------------------


def scrape(text: str) -> dict[str, list[dict[str, str]]]:
    """Series name -> the label sets it has samples for."""
    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample.labels)
    return series


async def test_replica_serves_health_and_every_documented_metric(settings: Settings, db_url: str) -> None:
    async with running_replica(settings) as replica:
        assert replica.http_port
        port = replica.http_port
        assert (await http_get(port, "/healthz"))[0] == 200

        async def ready() -> bool:
            return (await http_get(port, "/readyz"))[0] == 200

        await until(ready, what="/readyz 200")

        async def invalid_json_count() -> float:
            # Every reason's series exists at 0 from start-up; the registry is this process's, so
            # earlier tests' replicas may have counted some: wait for this command's increment.
            text = (await http_get(port, "/metrics"))[1]
            found = re.search(r'^timer_commands_rejected_total\{reason="invalid_json"\} (\S+)$', text, re.M)
            assert found is not None, "the invalid_json series is missing"
            return float(found[1])

        counted_before = await invalid_json_count()
        # One timer that fires, one command that is rejected: every labelled series gets a sample.
        async with jetstream(settings) as js:
            due = {"tenantId": "acme", "serviceCallId": "obs-1", "dueAt": iso_in(-1, db_url)}
            await publish_raw(js, settings, "acme", "schedule", due)
            await publish_raw(js, settings, "acme", "schedule", b"{not json")

        def fired() -> bool:
            timer = row(db_url, "acme", "obs-1")
            return timer is not None and timer["state"] == "Reached"

        async def rejected() -> bool:
            return await invalid_json_count() > counted_before

        await until(fired, what="the timer fired")
        await until(rejected, what="the bad command counted")

        async def gauge_ready() -> bool:
            text = (await http_get(port, "/metrics"))[1]
            return re.search(r"^timer_ready 1\.0$", text, flags=re.MULTILINE) is not None

        await until(gauge_ready, what="timer_ready 1")

        status, text = await http_get(port, "/metrics")
        assert status == 200
        series = scrape(text)
        for name, (kind, labels) in documented_metrics().items():
            assert re.search(rf"^# TYPE {name} {kind}$", text, flags=re.MULTILINE), name
            sample = name if kind != "histogram" else f"{name}_count"
            assert sample in series, f"{name}: no sample on /metrics"
            assert any(labels == set(s) for s in series[sample]), f"{name}: labels {series[sample]}"
        assert {s["loop"] for s in series["timer_loop_last_tick_timestamp_seconds"]} == {"intake", "firing"}
        # Connections and requests are two metrics: a sum over the gauge's states means something.
        assert {s["state"] for s in series["timer_db_pool_connections"]} == {"size", "available"}
        assert {"kind": "schedule", "outcome": "applied"} in series["timer_commands_applied_total"]
        assert (await http_get(port, "/nope"))[0] == 404
