"""The monitoring kit in deploy/monitoring: alert rules that promtool accepts and
whose own tests pass, and a Grafana dashboard and rules that query only series
the edge and origin declare (a renamed metric fails here, not in an incident)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool: Debian's prometheus package (make test)"
)
#: A series name in an expression (suffixes of histograms and counters included).
_NAME = re.compile(r"\bgeoedge_[a-z0-9_]+")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], cwd=MONITORING, capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_alert_rules_are_valid_and_their_tests_pass() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 13 rules found" in checked.stdout
    tested = promtool("test", "rules", "alerts.test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        expressions += [target["expr"] for target in panel["targets"]]
    return expressions


def test_the_dashboard_is_grafana_json_with_unique_ids_and_no_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "geoedge-overview"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for row in range(grid["y"], grid["y"] + grid["h"]):
            for column in range(grid["x"], grid["x"] + grid["w"]):
                assert (row, column) not in cells, f"{panel['title']!r} overlaps another panel"
                cells.add((row, column))
    assert len(dashboard_expressions()) >= 20


def declared_names() -> set[str]:
    """Every series name the daemons declare, with the suffixes Prometheus adds
    (a labelled series with no sample yet is not in a scrape, but is declared)."""
    from prometheus_client import REGISTRY, CollectorRegistry

    from edge.metrics import EdgeMetrics
    from geoedge.cert_expiry import CertificateWatch
    from geoedge.metrics import ProcessMetrics
    from origin.metrics import ControlMetrics, WorkerMetrics

    ProcessMetrics("test")
    names = set()
    registries = [REGISTRY, EdgeMetrics(CollectorRegistry()).registry]
    registries.append(WorkerMetrics(CollectorRegistry()).registry)
    registries.append(ControlMetrics(CollectorRegistry()).registry)
    certificates = CollectorRegistry()
    certificates.register(CertificateWatch([]))
    registries.append(certificates)
    for registry in registries:
        for family in registry.collect():
            name = family.name
            names.add(name)
            if family.type == "counter":
                names.add(f"{name}_total")
            if family.type == "histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return names


def test_every_series_the_dashboard_and_rules_query_is_declared() -> None:
    queried = set()
    for expression in dashboard_expressions():
        queried |= set(_NAME.findall(expression))
    queried |= set(_NAME.findall(RULES.read_text()))
    assert len(queried) >= 20
    missing = sorted(queried - declared_names())
    assert not missing, f"queried but not declared: {missing}"
