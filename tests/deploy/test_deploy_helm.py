"""The Helm chart, linted and rendered by Helm's library, checked object by object."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]  # no stubs in the dev extra

from worker.config import ConsoleSettings, Settings, parse_duration
from worker.ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "timer-service"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
Tool = Callable[[dict[str, Any]], dict[str, Any]]

# Settings that never go to the ConfigMap: secrets, mounted files, the pod name.
SECRET_SETTINGS = {"database_url", "nats_password", "nats_token", "nats_nkey_seed"}
FILE_SETTINGS = {"nats_creds", "nats_tls_ca", "nats_tls_cert", "nats_tls_key"}
POD_SETTINGS = {"worker_id", "migrate"}  # the pod name; migration.enabled
# values.yaml defaults that differ from the service's on purpose.
CHART_DEFAULTS = {"nats_url": "nats://nats:4222"}

SECRET_STRINGS = {
    "databaseUrl": "postgresql://timer:S3cret-db@pg:5432/timers",
    "natsPassword": "S3cret-nats-password",
    "natsToken": "S3cret-nats-token",
    "natsNkeySeed": "SUACS3CRETNKEYSEED",
}

HA: dict[str, Any] = {"postgresCluster": {"enabled": True}, "config": {"streamReplicas": 3}}

CASES: dict[str, dict[str, Any]] = {
    "default": {},
    # Everything switched on, as a production install would be.
    "production": {
        "config": {
            "drainTimeoutMs": 25000,
            "leaseMs": 3600000,
            "natsUrl": "tls://nats.messaging:4222",
            "natsUser": "timer",
            "natsTlsServerName": "nats.messaging.svc",
            "carryHeaders": "X-Request-Id",
        },
        "secrets": {"existingSecret": "timer-secrets", "natsPasswordKey": "nats-password"},
        "natsCreds": {"existingSecret": "timer-nats-creds"},
        "natsTls": {"existingSecret": "timer-nats-tls"},
        "postgresTls": {"existingSecret": "timer-pg-tls"},
        "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 80},
        "metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "extraEnv": [{"name": "OTEL_SERVICE_NAME", "value": "timer-service"}],
    },
    "chart_secret": {"secrets": SECRET_STRINGS},
    # Server-only TLS (a CA, no client certificate) and every NATS secret from an existing Secret.
    "tls_server_only": {
        "config": {"natsUrl": "tls://nats:4222"},
        "secrets": {
            "existingSecret": "timer-secrets",
            "natsTokenKey": "nats-token",
            "natsNkeySeedKey": "nats-seed",
        },
        "natsTls": {"existingSecret": "nats-ca", "certKey": "", "keyKey": ""},
    },
    "config_changed": {"config": {"batchSize": 500}},
    "no_migration_job": {"migration": {"enabled": False}},
    "not_config": {"replicaCount": 5, "topologySpread": {"nodes": "", "zones": ""}},
    "pdb_min_available": {"podDisruptionBudget": {"minAvailable": 2}},
    "grace_given": {"terminationGracePeriodSeconds": 60},
    "grace_too_short": {"terminationGracePeriodSeconds": 10},
    # The recommended HA setup: a CloudNativePG cluster with a synchronous standby, R3 streams.
    "ha": HA,
    "ha_upgrade": HA,  # the same, rendered as an upgrade
    "ha_external_db": {**HA, "secrets": {"existingSecret": "timer-secrets"}},
    "ha_no_standby_to_spare": {
        "postgresCluster": {"enabled": True, "instances": 2, "synchronousStandbys": 2}
    },
    "keda": {"keda": {"enabled": True}},
    "keda_backlog_only": {"keda": {"enabled": True, "cpuUtilization": None, "query": "sum(timer_overdue)"}},
    "keda_and_hpa": {"keda": {"enabled": True}, "autoscaling": {"enabled": True}},
    # Every optional extra of issue 22 on at once.
    "extras": {
        "image": {"registry": "registry.example.com:5000"},
        "commonLabels": {"team": "payments", "app.kubernetes.io/component": "not-a-selector"},
        "commonAnnotations": {"owner": "payments@example.com", "helm.sh/hook": "not-a-hook"},
        "extraEnvFrom": [{"secretRef": {"name": "timer-otel"}}],
        "initContainers": [{"name": "wait-for-proxy", "image": "busybox:1.37"}],
        "sidecars": [{"name": "proxy", "image": "envoyproxy/envoy:v1.33"}],
        "networkPolicy": {
            "enabled": True,
            "consoleFrom": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}],
        },
        "secrets": {"existingSecret": "timer-secrets"},
        "natsTls": {"existingSecret": "timer-nats-tls"},
        "console": {
            "enabled": True,
            "existingSecret": "console-creds",
            "user": "operator",
            "tokenKey": "",  # user and password only
            "passwordKey": "password",
            "ingress": {"enabled": True, "className": "nginx", "tlsSecret": "console-tls"},
        },
        "metrics": {"prometheusRule": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "podDisruptionBudget": {"enabled": True},
        "autoscaling": {"enabled": True},
    },
    "console_trial": {
        "secrets": {"databaseUrl": SECRET_STRINGS["databaseUrl"]},
        "console": {"enabled": True, "token": "S3cret-console-token", "actions": True},
    },
    "console_behind_proxy": {
        "console": {
            "enabled": True,
            "tokenKey": "",
            "actions": True,
            "operators": ["bob", "token"],
            "operatorGroups": ["sre"],
            "identityProxy": {
                "userHeader": "X-Forwarded-User",
                "groupsHeader": "X-Forwarded-Groups",
                "trustedProxies": ["10.0.0.0/8", "127.0.0.1"],
            },
        },
    },
    "console_readme_proxy": {},  # the chart README's single sign-on block: _readme_values
    "console_proxy_trusting_nobody": {
        "console": {"enabled": True, "identityProxy": {"userHeader": "X-Forwarded-User"}},
    },
    "console_no_credentials": {"console": {"enabled": True}},
    "console_password_without_user": {"console": {"enabled": True, "password": "S3cret-console-pw"}},
    "console_existing_secret_no_key": {"console": {"enabled": True, "existingSecret": "c", "tokenKey": ""}},
    "network_policy_any_namespace": {
        "networkPolicy": {
            "enabled": True,
            "metricsNamespace": "",
            "metricsPodSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        },
    },
    "no_tests": {"tests": {"enabled": False}},
    "typo_console": {"console": {"enable": True}},
    "typo_network_policy": {"networkPolicy": {"metricsNamespaceSelectr": {}}},
    "bad_registry": {"image": {"registry": "https://registry.example.com"}},
    "typo_top": {"replicaCout": 2},
    "typo_config": {"config": {"batchSzie": 10}},
    "typo_security": {"securityContext": {"readOnlyRootFileSystem": True}},
    "typo_probe": {"probes": {"liveness": {"periodSecond": 5}}},
    "wrong_type": {"config": {"leaseMs": "3s"}},
    "out_of_range": {"config": {"batchSize": 0}},
}


def _readme_values(section: str) -> dict[str, Any]:
    """The values block (```yaml) of a section of the chart README."""
    text = (CHART / "README.md").read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert block, f"the chart README's {section} section lost its values block"
    values: dict[str, Any] = yaml.safe_load(block.group(1))
    return values


CASES["console_readme_proxy"] = _readme_values("The console")


@pytest.fixture(scope="module")
def rendered(deploy_tool: Tool) -> dict[str, Any]:
    request = {"chart": str(CHART), "release": "demo", "namespace": "timers", "cases": CASES}
    answer = deploy_tool({**request, "upgrades": ["ha_upgrade"]})
    cases: dict[str, Any] = answer["cases"]
    return cases


class Release:
    """One rendered case: its objects by kind, and lookups the tests share."""

    def __init__(self, case: dict[str, Any]) -> None:
        assert case["error"] is None, case["error"]
        self.objects: list[dict[str, Any]] = [o["object"] for o in case["objects"]]
        self.notes: str = case["notes"]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, component: str = "server") -> dict[str, Any]:
        found = [o for o in self.all(kind) if _labels(o).get("app.kubernetes.io/component") == component]
        assert len(found) == 1, f"{len(found)} {kind} objects of component {component}"
        return found[0]

    @property
    def deployment(self) -> dict[str, Any]:
        return self.one("Deployment")

    @property
    def pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.deployment["spec"]["template"]["spec"]
        return spec

    @property
    def container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.pod["containers"]
        return containers[0]

    @property
    def job(self) -> dict[str, Any]:
        return self.one("Job", component="migrate")

    @property
    def job_pod(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.job["spec"]["template"]["spec"]
        return spec

    @property
    def job_container(self) -> dict[str, Any]:
        containers: list[dict[str, Any]] = self.job_pod["containers"]
        return containers[0]

    @property
    def config(self) -> dict[str, str]:
        data: dict[str, str] = self.one("ConfigMap")["data"]
        return data


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = obj["metadata"].get("labels", {})
    return labels


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.fixture(scope="module")
def default(rendered: dict[str, Any]) -> Release:
    return Release(rendered["default"])


@pytest.fixture(scope="module")
def production(rendered: dict[str, Any]) -> Release:
    return Release(rendered["production"])


# --- lint and shape ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["default", "production", "chart_secret", "ha", "extras", "console_trial"])
def test_helm_lint_is_clean(rendered: dict[str, Any], case: str) -> None:
    serious = [m for m in rendered[case]["lint"] if m["severity"] in ("warning", "error")]
    assert serious == []


def test_default_release_objects(default: Release) -> None:
    kinds = sorted(o["kind"] for o in default.objects)
    # The Pod is the `helm test` hook; the console and NetworkPolicy are off by default.
    assert kinds == [
        "ConfigMap",
        "Deployment",
        "Job",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    assert default.deployment["spec"]["replicas"] == 3


def test_production_release_objects(production: Release) -> None:
    kinds = {o["kind"] for o in production.objects}
    assert {"HorizontalPodAutoscaler", "PodMonitor", "ServiceMonitor"} <= kinds
    assert "Secret" not in kinds  # existingSecret: the chart makes none


def test_hpa_owns_the_replica_count(production: Release) -> None:
    assert "replicas" not in production.deployment["spec"]
    hpa = production.one("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == production.deployment["metadata"]["name"]
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}


# --- settings and secrets ---------------------------------------------------------------------


def test_keda_scales_on_the_overdue_backlog(rendered: dict[str, Any]) -> None:
    keda = Release(rendered["keda"])
    scaled = keda.one("ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"]["name"] == keda.deployment["metadata"]["name"]
    assert "replicas" not in keda.deployment["spec"], "KEDA owns the replica count"
    assert keda.all("HorizontalPodAutoscaler") == []
    backlog, cpu = scaled["spec"]["triggers"]
    assert backlog["type"] == "prometheus" and cpu == {
        "type": "cpu",
        "metricType": "Utilization",
        "metadata": {"value": "70"},
    }
    assert backlog["metadata"]["query"] == 'max(timer_oldest_overdue_seconds{namespace="timers"})'
    assert backlog["metadata"]["threshold"] == "5"
    only = Release(rendered["keda_backlog_only"]).one("ScaledObject")["spec"]["triggers"]
    assert [t["metadata"]["query"] for t in only] == ["sum(timer_overdue)"]


def test_keda_and_the_hpa_are_mutually_exclusive(rendered: dict[str, Any]) -> None:
    error = rendered["keda_and_hpa"]["error"]
    assert error is not None and "keda.enabled and autoscaling.enabled: choose one" in error


def test_every_setting_reaches_the_pod(rendered: dict[str, Any], production: Release) -> None:
    """Each field of worker.config.Settings is a ConfigMap key, a secret env or a file env."""
    wanted = {f"TIMER_{name.upper()}" for name in Settings.model_fields}
    chart_secret = Release(rendered["chart_secret"])
    given = set(production.config) | set(_env(production.container)) | set(_env(chart_secret.container))
    missing = wanted - given
    assert not missing, f"settings the chart cannot set: {sorted(missing)}"


def test_values_mirror_the_service_defaults() -> None:
    """values.yaml `config` holds every non-secret setting, with the service's own default."""
    values = _values_yaml_config()
    by_env = {f"TIMER_{_snake(k).upper()}": v for k, v in values.items()}
    for name, field in Settings.model_fields.items():
        env = f"TIMER_{name.upper()}"
        if name in SECRET_SETTINGS | FILE_SETTINGS | POD_SETTINGS:
            assert env not in by_env, f"{env} must not be a plain value"
            continue
        assert env in by_env, f"{env} is not in values.yaml config"
        want = CHART_DEFAULTS.get(name, field.default if field.default is not None else "")
        got = by_env[env]
        if isinstance(want, timedelta):
            got = parse_duration(got)
        assert got == want, f"{env}: values.yaml has {got!r}, the service defaults to {want!r}"


def test_every_value_is_documented() -> None:
    """Every value of the chart (a row of the README's values table) says what it is: a key of
    values.yaml by its comment there (at its line's end, above it, or above the run of top-level
    keys it belongs to), a key only the schema has (a Kubernetes field left unset) by the schema's
    description. A key added without one fails here, so the table never gains an empty cell."""
    table = _values_table_module()
    text = (CHART / "values.yaml").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    notes = table.comments(text)
    rows = {key: node for key, node, _ in table.leaves(schema, {})}
    bare = [
        key for key, node in rows.items() if not (notes[key] if key in notes else node.get("description"))
    ]
    assert bare == [], f"values without a description: {bare}"
    # Each key of values.yaml is a row, holds rows, or lies inside one (an object taken whole).
    outside = [
        k for k in notes if not any(f"{k}.".startswith(f"{r}.") or r.startswith(f"{k}.") for r in rows)
    ]
    assert outside == [], f"values.yaml keys the values table does not show: {outside}"


def test_worker_id_is_the_pod_name(default: Release) -> None:
    worker_id = _env(default.container)["TIMER_WORKER_ID"]
    assert worker_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_config_map_holds_settings_only(default: Release) -> None:
    config = default.config
    assert config["TIMER_BATCH_SIZE"] == "1000"
    assert config["TIMER_LEASE_MS"] == "3000"
    assert not any(re.search(r"DATABASE|PASSWORD|TOKEN|SEED|CREDS|TLS_KEY", k) for k in config)
    assert default.container["envFrom"] == [
        {"configMapRef": {"name": default.one("ConfigMap")["metadata"]["name"]}}
    ]


def test_large_numbers_stay_integers(production: Release) -> None:
    assert production.config["TIMER_LEASE_MS"] == "3600000"  # not 3.6e+06


def test_secrets_come_from_the_existing_secret(production: Release) -> None:
    env = _env(production.container)
    for name, key in [("TIMER_DATABASE_URL", "database-url"), ("TIMER_NATS_PASSWORD", "nats-password")]:
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "timer-secrets", "key": key}
        assert name not in production.config
    assert "TIMER_NATS_TOKEN" not in env  # no key named for it
    job_env = _env(production.job_container)
    assert job_env["TIMER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "timer-secrets"
    assert "TIMER_NATS_PASSWORD" not in job_env


def test_chart_made_secret_never_leaks(rendered: dict[str, Any]) -> None:
    release = Release(rendered["chart_secret"])
    secrets = {o["metadata"]["name"]: o for o in release.all("Secret")}
    assert set(secrets) == {"demo-timer-service", "demo-timer-service-migrate"}
    assert set(secrets["demo-timer-service"]["data"]) == {
        "database-url",
        "nats-password",
        "nats-token",
        "nats-nkey-seed",
    }
    env = _env(release.container)
    assert env["TIMER_NATS_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-timer-service",
        "key": "nats-token",
    }
    # No secret string in clear anywhere but inside the Secrets (whose data is base64).
    clear = json.dumps([o for o in release.objects if o["kind"] != "Secret"]) + release.notes
    for value in SECRET_STRINGS.values():
        assert value not in clear
    # The migration hook runs before the release's Secret exists: it reads its own hook copy.
    hook_secret = secrets["demo-timer-service-migrate"]["metadata"]["annotations"]
    hook_job = release.job["metadata"]["annotations"]
    job_env = _env(release.job_container)
    assert job_env["TIMER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "demo-timer-service-migrate"
    assert hook_secret["helm.sh/hook"] == hook_job["helm.sh/hook"]
    assert set(secrets["demo-timer-service-migrate"]["data"]) == {"database-url"}
    assert not any("NATS" in name for name in job_env)
    assert int(hook_secret["helm.sh/hook-weight"]) < int(hook_job["helm.sh/hook-weight"])


def test_no_database_url_warns_in_notes(default: Release, production: Release) -> None:
    assert "WARNING: no Postgres DSN" in default.notes
    assert "WARNING" not in production.notes


def test_checksum_rolls_pods_on_config_change(rendered: dict[str, Any], default: Release) -> None:
    def checksum(release: Release) -> str:
        annotations: dict[str, str] = release.deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/config"]

    assert re.fullmatch(r"[0-9a-f]{64}", checksum(default))
    assert checksum(Release(rendered["config_changed"])) != checksum(default)
    assert checksum(Release(rendered["not_config"])) == checksum(default)
    secret_sum = default.deployment["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
    chart_secret = Release(rendered["chart_secret"]).deployment["spec"]["template"]["metadata"]["annotations"]
    assert chart_secret["checksum/secret"] != secret_sum


# --- files from secrets -----------------------------------------------------------------------


def test_creds_and_tls_files_are_mounted_from_secrets(production: Release) -> None:
    volumes = {v["name"]: v for v in production.pod["volumes"]}
    mounts = {m["name"]: m for m in production.container["volumeMounts"]}
    env = _env(production.container)
    for volume, secret in [
        ("nats-creds", "timer-nats-creds"),
        ("nats-tls", "timer-nats-tls"),
        ("postgres-tls", "timer-pg-tls"),
    ]:
        assert volumes[volume]["secret"]["secretName"] == secret
        assert mounts[volume]["readOnly"] is True
    assert env["TIMER_NATS_CREDS"]["value"] == mounts["nats-creds"]["mountPath"] + "/nats.creds"
    tls = mounts["nats-tls"]["mountPath"]
    assert env["TIMER_NATS_TLS_CA"]["value"] == f"{tls}/ca.crt"
    assert env["TIMER_NATS_TLS_CERT"]["value"] == f"{tls}/tls.crt"
    assert env["TIMER_NATS_TLS_KEY"]["value"] == f"{tls}/tls.key"
    # The migration reaches Postgres the same way, TLS files included.
    job_mounts = {m["name"] for m in production.job_container["volumeMounts"]}
    assert job_mounts == {"tmp", "postgres-tls"}  # no NATS credentials: migrating needs none


def test_nats_tls_and_user_settings_reach_the_config_map(production: Release) -> None:
    assert production.config["TIMER_NATS_URL"] == "tls://nats.messaging:4222"
    assert production.config["TIMER_NATS_USER"] == "timer"
    assert production.config["TIMER_NATS_TLS_SERVER_NAME"] == "nats.messaging.svc"


def test_server_only_tls_and_token_and_seed_from_the_existing_secret(rendered: dict[str, Any]) -> None:
    release = Release(rendered["tls_server_only"])
    env = _env(release.container)
    assert env["TIMER_NATS_TLS_CA"]["value"] == "/etc/timer-service/nats-tls/ca.crt"
    assert "TIMER_NATS_TLS_CERT" not in env and "TIMER_NATS_TLS_KEY" not in env
    for name, key in [("TIMER_NATS_TOKEN", "nats-token"), ("TIMER_NATS_NKEY_SEED", "nats-seed")]:
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "timer-secrets", "key": key}
    assert "TIMER_NATS_PASSWORD" not in env  # no key named for it
    assert not release.all("Secret")


def test_mounted_secret_files_are_readable_by_the_pod_only(production: Release) -> None:
    """0440 and the pod's fsGroup: the service user (not root) reads them, nobody else; libpq
    accepts a client key that is root-owned and 0640 or less."""
    group = production.pod["securityContext"]["fsGroup"]
    assert group == production.pod["securityContext"]["runAsGroup"]
    for volume in production.pod["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o440, volume["name"]


# --- pods: probes, shutdown, placement, security ----------------------------------------------


def test_probes_use_the_named_port(default: Release) -> None:
    container = default.container
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert default.one("Service")["spec"]["ports"][0]["targetPort"] == "http"


def test_grace_period_outlasts_the_drain(
    rendered: dict[str, Any], default: Release, production: Release
) -> None:
    for release in (default, production):
        drain_s = int(release.config["TIMER_DRAIN_TIMEOUT_MS"]) / 1000
        assert release.pod["terminationGracePeriodSeconds"] > drain_s
    assert production.pod["terminationGracePeriodSeconds"] == 30
    assert Release(rendered["grace_given"]).pod["terminationGracePeriodSeconds"] == 60
    assert "must exceed config.drainTimeoutMs" in rendered["grace_too_short"]["error"]


def test_pdb(rendered: dict[str, Any], default: Release) -> None:
    pdb = default.one("PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == default.deployment["spec"]["selector"]["matchLabels"]
    other = Release(rendered["pdb_min_available"]).one("PodDisruptionBudget")["spec"]
    assert other["minAvailable"] == 2 and "maxUnavailable" not in other


def test_selectors_match_servers_not_the_migration(default: Release) -> None:
    selector = default.deployment["spec"]["selector"]["matchLabels"]
    pod_labels = default.deployment["spec"]["template"]["metadata"]["labels"]
    job_labels = default.job["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    assert not selector.items() <= job_labels.items()
    assert default.one("Service")["spec"]["selector"] == selector


def test_replicas_spread_across_nodes(rendered: dict[str, Any], default: Release) -> None:
    spread = default.pod["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    selector = default.deployment["spec"]["selector"]["matchLabels"]
    assert all(c["labelSelector"]["matchLabels"] == selector for c in spread)
    assert "topologySpreadConstraints" not in Release(rendered["not_config"]).pod


@pytest.mark.parametrize("which", ["deployment", "job", "console", "test"])
def test_restricted_security_context(rendered: dict[str, Any], which: str) -> None:
    release = Release(rendered["console_trial"])
    pod = {
        "deployment": release.pod,
        "job": release.job_pod,
        "console": release.one("Deployment", "console")["spec"]["template"]["spec"],
        "test": release.one("Pod", "test")["spec"],
    }[which]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"]:
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "resources" in container and container["resources"]["requests"]
        if which != "test":  # the test pod's Python writes nothing
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    if which != "test":
        assert {v["name"]: v for v in pod["volumes"]}["tmp"]["emptyDir"]


def test_service_account(default: Release) -> None:
    account = default.one("ServiceAccount")
    assert default.pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["automountServiceAccountToken"] is False


# --- migration hook ---------------------------------------------------------------------------


def test_migration_is_a_pre_install_and_pre_upgrade_hook(default: Release) -> None:
    annotations = default.job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    pod = default.job_pod
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["args"] == ["migrate"]
    assert pod["containers"][0]["image"] == default.container["image"]
    # Hooks run before the release's ServiceAccount exists: the Job must not name it.
    assert "serviceAccountName" not in pod


def test_replicas_leave_the_schema_to_the_job(default: Release, rendered: dict[str, Any]) -> None:
    env = {e["name"]: e.get("value") for e in default.container["env"]}
    assert env["TIMER_MIGRATE"] == "false"
    assert "TIMER_MIGRATE" not in {e["name"] for e in default.job_container["env"]}
    # No Job: each replica migrates at start, as the service does by default.
    without = Release(rendered["no_migration_job"])
    assert not without.all("Job")
    assert "TIMER_MIGRATE" not in {e["name"] for e in without.container["env"]}


# --- high availability ------------------------------------------------------------------------


def test_ha_database_is_a_cloudnativepg_cluster_with_a_synchronous_standby(rendered: dict[str, Any]) -> None:
    ha = Release(rendered["ha"])
    cluster = ha.one("Cluster", component="database")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    spec = cluster["spec"]
    assert spec["instances"] == 3
    assert spec["postgresql"]["synchronous"] == {"method": "any", "number": 1, "dataDurability": "required"}
    assert spec["enablePDB"] is True  # the operator's PDBs: primary and standbys
    assert spec["affinity"]["podAntiAffinityType"] == "required"
    assert ha.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1  # the replicas' own
    assert ha.config["TIMER_STREAM_REPLICAS"] == "3"
    assert not Release(rendered["default"]).all("Cluster")


def test_ha_replicas_reach_the_primary_through_the_rw_service(rendered: dict[str, Any]) -> None:
    """The operator's -app Secret: its `uri` names the -rw Service, which follows the primary."""
    for case in ("ha", "ha_upgrade"):
        release = Release(rendered[case])
        containers = [release.container] + ([release.job_container] if release.all("Job") else [])
        for container in containers:
            ref = _env(container)["TIMER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "demo-timer-service-pg-app", "key": "uri"}
        assert "WARNING" not in release.notes
    external = Release(rendered["ha_external_db"])
    ref = _env(external.container)["TIMER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "timer-secrets", "key": "database-url"}


def test_ha_first_install_migrates_in_the_replicas_then_the_job_each_upgrade(
    rendered: dict[str, Any],
) -> None:
    """The cluster is born with the release, after pre-install hooks: the replicas migrate it on the
    first install (advisory lock), the hook Job before every upgrade."""
    install, upgrade = Release(rendered["ha"]), Release(rendered["ha_upgrade"])
    assert install.job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    assert "TIMER_MIGRATE" not in _env(install.container)
    assert _env(upgrade.container)["TIMER_MIGRATE"]["value"] == "false"
    external = Release(rendered["ha_external_db"])  # a database that exists before the release
    assert external.job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert _env(external.container)["TIMER_MIGRATE"]["value"] == "false"


def test_ha_needs_a_standby_to_spare(rendered: dict[str, Any]) -> None:
    assert "must be fewer than postgresCluster.instances" in rendered["ha_no_standby_to_spare"]["error"]


# --- monitors ---------------------------------------------------------------------------------


def test_monitors_scrape_the_http_port(production: Release) -> None:
    pod_monitor = production.one("PodMonitor")["spec"]
    service_monitor = production.one("ServiceMonitor")["spec"]
    assert pod_monitor["podMetricsEndpoints"][0]["port"] == "http"
    assert service_monitor["endpoints"][0]["port"] == "http"
    assert pod_monitor["podMetricsEndpoints"][0]["path"] == "/metrics"
    selector = production.deployment["spec"]["selector"]["matchLabels"]
    assert pod_monitor["selector"]["matchLabels"] == selector


# --- issue 22: extras, NetworkPolicy, the console, `helm test` ---------------------------------


def _pod_specs(release: Release) -> list[dict[str, Any]]:
    """Every pod template: Deployments' and Jobs' (spec.template), and bare Pods."""
    specs = []
    for obj in release.objects:
        if obj["kind"] in ("Deployment", "Job"):
            specs.append(obj["spec"]["template"])
        elif obj["kind"] == "Pod":
            specs.append(obj)
    return specs


def test_common_labels_and_annotations_reach_every_object(rendered: dict[str, Any], default: Release) -> None:
    extras = Release(rendered["extras"])
    assert len(extras.objects) >= 15
    for obj in extras.objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        assert _labels(obj)["team"] == "payments", what
        assert obj["metadata"]["annotations"]["owner"] == "payments@example.com", what
        # The chart's own labels and annotations win: selectors and hooks stay what they are.
        assert _labels(obj)["app.kubernetes.io/component"] != "not-a-selector", what
        if obj["kind"] == "Job":
            assert obj["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    for pod in _pod_specs(extras):
        assert pod["metadata"]["labels"]["team"] == "payments"
    assert extras.deployment["spec"]["selector"] == default.deployment["spec"]["selector"]
    # Off: no stray keys (the default release's objects carry neither).
    assert not any("team" in _labels(o) for o in default.objects)
    assert not any("owner" in o["metadata"].get("annotations", {}) for o in default.objects)


def test_image_registry_prefixes_every_image(rendered: dict[str, Any], default: Release) -> None:
    extras = Release(rendered["extras"])
    ours = [c for p in _pod_specs(extras) for c in p["spec"]["containers"] if c["name"] != "proxy"]
    assert len(ours) == 4  # replica, migration, console, test
    assert {c["image"] for c in ours} == {f"registry.example.com:5000/timer-service:{VERSION}"}
    assert default.container["image"] == f"timer-service:{VERSION}"  # the chart's appVersion


def test_extra_env_from_init_containers_and_sidecars(rendered: dict[str, Any], default: Release) -> None:
    extras = Release(rendered["extras"])
    env_from = {"secretRef": {"name": "timer-otel"}}
    console = extras.one("Deployment", "console")["spec"]["template"]["spec"]["containers"][0]
    for container in (extras.container, extras.job_container, console):
        assert env_from in container["envFrom"], container["name"]
    # The ConfigMap stays first: extraEnvFrom adds, it does not replace.
    assert extras.container["envFrom"][0] == default.container["envFrom"][0]
    assert [c["name"] for c in extras.pod["initContainers"]] == ["wait-for-proxy"]
    assert [c["name"] for c in extras.pod["containers"]] == ["timer-service", "proxy"]
    assert "initContainers" not in default.pod and len(default.pod["containers"]) == 1
    assert "envFrom" not in default.job_container


def test_network_policy_lets_only_monitoring_scrape(rendered: dict[str, Any], default: Release) -> None:
    assert not default.all("NetworkPolicy")
    extras = Release(rendered["extras"])
    policy = extras.one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == extras.deployment["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    monitoring, test_pod = rule["from"]
    # One peer, both selectors: Prometheus' pods in the monitoring namespace, nobody else there.
    assert monitoring == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {},
    }
    # The `helm test` pod must get through, or the test fails only when the policy is on.
    test_labels = _labels(extras.one("Pod", "test"))
    assert test_pod["podSelector"]["matchLabels"].items() <= test_labels.items()
    other = Release(rendered["network_policy_any_namespace"]).one("NetworkPolicy")["spec"]
    assert other["ingress"][0]["from"][0] == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    # The console's own policy: its port only, from consoleFrom.
    console = extras.one("NetworkPolicy", "console")["spec"]
    console_pod = extras.one("Deployment", "console")["spec"]["template"]
    assert console["podSelector"]["matchLabels"].items() <= _labels(console_pod).items()
    assert console["ingress"] == [
        {
            "ports": [{"port": "console", "protocol": "TCP"}],
            "from": [{"namespaceSelector": {"matchLabels": {"name": "ingress"}}}],
        }
    ]


def test_console_is_off_by_default(default: Release) -> None:
    assert [d["metadata"]["name"] for d in default.all("Deployment")] == ["demo-timer-service"]
    assert not default.all("Ingress")


def test_console_runs_beside_the_replicas(rendered: dict[str, Any]) -> None:
    extras = Release(rendered["extras"])
    deployment = extras.one("Deployment", "console")
    assert deployment["spec"]["replicas"] == 1  # sessions live in the process
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["console"]
    build_parser().parse_args(container["args"])
    assert container["ports"] == [{"name": "console", "containerPort": 8081, "protocol": "TCP"}]
    env = _env(container)
    assert env["TIMER_CONSOLE_HOST"]["value"] == "0.0.0.0"
    assert env["TIMER_CONSOLE_PORT"]["value"] == "8081"
    assert env["TIMER_CONSOLE_ACTIONS"]["value"] == "false"
    assert env["TIMER_CONSOLE_USER"]["value"] == "operator"
    assert env["TIMER_CONSOLE_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "console-creds",
        "key": "password",
    }
    assert "TIMER_CONSOLE_TOKEN" not in env  # tokenKey emptied: not read
    # The replicas' settings: the ConfigMap, the DSN and the NATS files, as the replicas get them.
    assert env["TIMER_DATABASE_URL"] == _env(extras.container)["TIMER_DATABASE_URL"]
    assert env["TIMER_NATS_TLS_CA"] == _env(extras.container)["TIMER_NATS_TLS_CA"]
    assert container["envFrom"][0] == extras.container["envFrom"][0]
    assert "TIMER_WORKER_ID" not in env  # not a replica: it holds no lease
    assert container["readinessProbe"]["httpGet"] == {"path": "/login", "port": "console"}
    # Its Service selects the console only; the replicas' Service never selects the console.
    service = extras.one("Service", "console")
    assert service["spec"]["selector"].items() <= _labels(pod).items()
    assert not extras.one("Service")["spec"]["selector"].items() <= _labels(pod).items()
    assert service["spec"]["ports"] == [
        {"name": "console", "port": 8081, "targetPort": "console", "protocol": "TCP"}
    ]
    ingress = extras.one("Ingress", "console")["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [{"hosts": ["timer-console.example.com"], "secretName": "console-tls"}]
    (path,) = ingress["rules"][0]["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"name": "console"}}
    assert not Release(rendered["console_trial"]).all("Ingress")  # off unless asked


def test_console_trial_credentials_stay_in_a_secret(rendered: dict[str, Any]) -> None:
    trial = Release(rendered["console_trial"])
    secret = next(o for o in trial.all("Secret") if o["metadata"]["name"] == "demo-timer-service-console")
    assert set(secret["data"]) == {"console-token"}
    container = trial.one("Deployment", "console")["spec"]["template"]["spec"]["containers"][0]
    env = _env(container)
    assert env["TIMER_CONSOLE_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-timer-service-console",
        "key": "console-token",
    }
    assert env["TIMER_CONSOLE_ACTIONS"]["value"] == "true"
    clear = json.dumps([o for o in trial.objects if o["kind"] != "Secret"]) + trial.notes
    assert "S3cret-console-token" not in clear
    assert not any("CONSOLE" in key for key in trial.config)  # never in the ConfigMap
    # A new token rolls the console pod.
    assert (
        "checksum/console-secret"
        in trial.one("Deployment", "console")["spec"]["template"]["metadata"]["annotations"]
    )


def test_console_behind_an_identity_proxy_needs_no_credentials_and_trusts_the_proxy_alone(
    rendered: dict[str, Any],
) -> None:
    container = Release(rendered["console_behind_proxy"]).one("Deployment", "console")["spec"]["template"]
    env = _env(container["spec"]["containers"][0])
    values = {k: v["value"] for k, v in env.items() if k.startswith("TIMER_CONSOLE_") and "value" in v}
    assert values == {
        "TIMER_CONSOLE_HOST": "0.0.0.0",
        "TIMER_CONSOLE_PORT": "8081",
        "TIMER_CONSOLE_ACTIONS": "true",
        "TIMER_CONSOLE_OPERATORS": "bob,token",
        "TIMER_CONSOLE_OPERATOR_GROUPS": "sre",
        "TIMER_CONSOLE_USER_HEADER": "X-Forwarded-User",
        "TIMER_CONSOLE_TRUSTED_PROXIES": "10.0.0.0/8,127.0.0.1",
        "TIMER_CONSOLE_GROUPS_HEADER": "X-Forwarded-Groups",
    }
    assert "TIMER_CONSOLE_TOKEN" not in env
    # What the console makes of them: settings it starts with.
    settings = ConsoleSettings(**{k.removeprefix("TIMER_").lower(): v for k, v in values.items()})
    assert settings.operator_names == {"bob", "token"} and len(settings.trusted_proxies) == 2


def test_the_readmes_single_sign_on_values_install_a_console_that_trusts_the_ingress_alone(
    rendered: dict[str, Any],
) -> None:
    release = Release(rendered["console_readme_proxy"])
    pod = release.one("Deployment", "console")["spec"]["template"]
    env = _env(pod["spec"]["containers"][0])
    assert env["TIMER_CONSOLE_USER_HEADER"]["value"] == "X-Auth-Request-User"
    assert env["TIMER_CONSOLE_TRUSTED_PROXIES"]["value"] == "10.244.0.0/16"
    assert env["TIMER_CONSOLE_OPERATORS"]["value"] == "alice" and "TIMER_CONSOLE_TOKEN" not in env
    policy = release.one("NetworkPolicy", "console")["spec"]
    assert policy["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}
    ]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("console_no_credentials", "console.enabled needs credentials"),
        ("console_existing_secret_no_key", "console.enabled needs credentials"),
        ("console_password_without_user", "a password needs console.user"),
        ("console_proxy_trusting_nobody", "userHeader needs console.identityProxy.trustedProxies"),
    ],
)
def test_console_refuses_to_install_without_credentials(
    rendered: dict[str, Any], case: str, message: str
) -> None:
    error = rendered[case]["error"]
    assert error is not None and message in error, error


def test_helm_test_pod_checks_readyz_through_the_service(rendered: dict[str, Any], default: Release) -> None:
    pod = default.one("Pod", "test")
    annotations = pod["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "test"
    assert "before-hook-creation" in annotations["helm.sh/hook-delete-policy"]
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == default.container["image"]
    service = default.one("Service")
    url = f"http://{service['metadata']['name']}.timers.svc:{service['spec']['ports'][0]['port']}/readyz"
    assert container["command"][:2] == ["python", "-c"] and container["command"][-1] == url
    compile(container["command"][2], "readyz", "exec")  # the script at least parses
    assert not Release(rendered["no_tests"]).all("Pod")


def test_chart_links_match_the_package() -> None:
    """Chart.yaml's home and sources, and pyproject's [project.urls], name one repository."""
    chart = (CHART / "Chart.yaml").read_text()
    home = re.search(r"^home: (\S+)$", chart, re.M)
    sources = re.findall(r"^  - (https://\S+)$", chart, re.M)
    assert home and sources, "Chart.yaml has no home or sources"
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert urls["Source"] == home.group(1) == sources[0]


# --- the values schema ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("typo_top", "additional properties 'replicaCout' not allowed"),
        ("typo_config", "additional properties 'batchSzie' not allowed"),
        ("typo_security", "additional properties 'readOnlyRootFileSystem' not allowed"),
        ("typo_probe", "additional properties 'periodSecond' not allowed"),
        ("wrong_type", "/config/leaseMs"),
        ("out_of_range", "/config/batchSize"),
        ("typo_console", "additional properties 'enable' not allowed"),
        ("typo_network_policy", "additional properties 'metricsNamespaceSelectr' not allowed"),
        ("bad_registry", "/image/registry"),
    ],
)
def test_schema_rejects_bad_values(rendered: dict[str, Any], case: str, message: str) -> None:
    error = rendered[case]["error"]
    assert error is not None and message in error, error
    assert any(m["severity"] == "error" for m in rendered[case]["lint"])


def test_schema_closes_every_object() -> None:
    """additionalProperties: false everywhere, except string maps and objects Kubernetes checks."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" or "properties" in node:
            closed = node.get("additionalProperties") is False
            string_map = node.get("additionalProperties") == {"type": "string"}
            kubernetes = str(node.get("description", "")).startswith(("Kubernetes", "Set by a parent"))
            if not (closed or string_map or kubernetes):
                open_objects.append(path)
        for key, child in node.get("properties", {}).items():
            walk(child, f"{path}.{key}")
        for key, child in node.get("definitions", {}).items():
            walk(child, f"#{key}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(schema, "values")
    assert open_objects == []


# --- helpers ----------------------------------------------------------------------------------


def _values_table_module() -> Any:
    """deploy/helm/gen_values_table.py, which reads the comments the README's table shows."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_values_table", CHART.parent / "gen_values_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _block(lines: list[str], header: str) -> list[str]:
    start = lines.index(header) + 1
    end = next(i for i in range(start, len(lines)) if lines[i] and not lines[i].startswith(" "))
    return lines[start:end]


def _values_yaml_config() -> dict[str, Any]:
    """The `config` block of values.yaml, read with a tiny parser (flat `key: scalar` lines)."""
    values: dict[str, Any] = {}
    for line in _block((CHART / "values.yaml").read_text().splitlines(), "config:"):
        m = re.match(r"^  ([A-Za-z]\w*): *(.*?)\s*(#.*)?$", line)
        if m:
            values[m.group(1)] = _scalar(m.group(2))
    return values


def _scalar(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text.strip("\"'")


def test_chart_readme_values_table_is_current() -> None:
    """The README's table is what deploy/helm/gen_values_table.py makes of today's schema and
    values.yaml, and lists every key of the schema."""
    import subprocess
    import sys

    script = CHART.parent / "gen_values_table.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    readme = (CHART / "README.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    for key in ("console.ingress.tlsSecret", "networkPolicy.metricsNamespace", "image.registry", "sidecars"):
        assert f"| `{key}` |" in readme
    assert len(re.findall(r"^\| `", readme, re.M)) >= len(schema["properties"]) - 1  # all but `global`
