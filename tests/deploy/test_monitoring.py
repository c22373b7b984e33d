"""deploy/prometheus and deploy/grafana: the alerting rules parse and pass their unit tests
(promtool), the dashboard's queries parse, and every metric either names is one the gateway
exports (read from app.metrics, not from a list kept here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.metrics import Metrics
from tests.helm.manifests import REPO

RULES = REPO / "deploy" / "prometheus" / "jsgw-rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "jsgw-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "jsgw-dashboard.json"

# Sample names each metric type is exposed with (the OpenMetrics/Prometheus text formats).
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
_METRIC = re.compile(r"(?<![A-Za-z0-9_:$])(jsgw_[a-z0-9_]+)")
# Grafana's variables, as a query would read once Grafana substituted them.
_GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$namespace": ".*",
    "$job": ".*",
}

promtool = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    promtool is None,
    reason="promtool not installed (Debian/Ubuntu: apt-get install prometheus)",
)


def exported() -> set[str]:
    """Every sample name the gateway's registry can expose."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        suffixes = _SUFFIXES[family.type]
        names.update(family.name + suffix for suffix in suffixes)
    return names


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def dashboard_exprs() -> list[str]:
    exprs = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", ()):
            exprs.append(target["expr"])
    return exprs


def grafana_substituted(expr: str) -> str:
    for variable, value in _GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a Grafana variable the test does not know: {expr}"
    return expr


def test_the_registry_exports_what_the_rules_rely_on() -> None:
    names = exported()
    # The families the alerts are built on (if one is renamed, the rules must follow).
    assert {
        "jsgw_http_requests_total",
        "jsgw_http_request_duration_seconds_bucket",
        "jsgw_nats_pool_connections_up",
        "jsgw_nats_pool_size",
        "jsgw_sse_streams_open",
        "jsgw_sse_streams_limit",
        "jsgw_sse_streams_refused_total",
        "jsgw_kv_watches_open",
        "jsgw_kv_watches_limit",
        "jsgw_kv_watches_dropped_total",
        "jsgw_publish_outcome_unknown_total",
    } <= names


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_exported(source: str) -> None:
    exprs = rule_exprs() if source == "rules" else dashboard_exprs()
    assert exprs
    names = exported()
    for expr in exprs:
        used = set(_METRIC.findall(expr))
        assert used, f"no jsgw metric in {expr!r}"
        unknown = used - names
        assert not unknown, f"{sorted(unknown)} are not exported by the gateway: {expr}"


def test_the_alerts_the_operations_guide_names() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {rule["alert"] for group in groups for rule in group["rules"]}
    assert {
        "JsgwHigh5xxRate",
        "JsgwNatsConnectionsDown",
        "JsgwEventStreamSlotsNearCap",
        "JsgwEventStreamsRefused",
        "JsgwKvWatchesDroppedTooSlow",
        "JsgwPublishOutcomeUnknown",
    } <= alerts
    operations = (REPO / "docs" / "operations.md").read_text()
    for alert in alerts:
        assert alert in operations, f"{alert} is not described in docs/operations.md"
    for group in groups:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"critical", "warning"}
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    assert promtool is not None
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_promtool_unit_tests_of_the_rules() -> None:
    assert promtool is not None
    result = subprocess.run(
        [promtool, "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # At least the 5xx alert is tested, firing and not firing.
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    checked = [
        (case["alertname"], bool(case["exp_alerts"]))
        for test in tests
        for case in test.get("alert_rule_test", ())
    ]
    # Every alert is tested, firing and not firing.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for alert in {rule["alert"] for group in groups for rule in group["rules"]}:
        assert (alert, True) in checked and (alert, False) in checked, alert


@needs_promtool
def test_promtool_parses_the_dashboard_queries(tmp_path: Path) -> None:
    """The dashboard's queries, with Grafana's variables substituted, as recording rules:
    promtool parses each expression."""
    assert promtool is not None
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"jsgw_dashboard:query_{i}", "expr": grafana_substituted(expr)}
                    for i, expr in enumerate(dashboard_exprs())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_shape() -> None:
    dash = dashboard()
    assert dash["uid"] == "jsgw-gateway"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "namespace", "job"} <= variables
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    titles = " ".join(p["title"] for p in dash["panels"]).lower()
    for topic in ("route", "latency", "pool", "stream", "watch", "publish"):
        assert topic in titles, topic
