"""deploy/prometheus/alerts.yml, its promtool tests, deploy/grafana/coldbrew.json and
docs/runbook.md: every metric they name is one coldbrew exports, every alert is tested and
explained, the dashboard imports into Grafana 10+."""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from coldbrew.metrics import ApiMetrics, Metrics
from coldbrew.stats import StatsSnapshot
from tests import promql_names
from tests.promql_names import (
    ALERT_TESTS,
    ALERTS,
    RUNBOOK,
    alert_rules,
    dashboard,
    dashboard_panels,
    exposition_names,
    metric_names,
    unknown_names,
)


class _Pool:
    """What ``Metrics.watch_process_pool`` reads of a pool."""

    replaced: dict[str, int] = {"crashed": 0}
    alive = 1


def worker_and_api_names() -> set[str]:
    """Every sample name an in-process worker (with a process pool) and API register."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    StatsSnapshot(store=None, max_tenants=10).register(metrics)  # type: ignore[arg-type]
    metrics.watch_group_commits([])
    metrics.watch_process_pool(_Pool())  # type: ignore[arg-type]
    metrics.watch_worker(
        ready=lambda: True, database_up=lambda: True, broker_up=lambda: True, slots=1
    )
    api = ApiMetrics(CollectorRegistry())
    api.watch_waiters(dict)
    return exposition_names(registry) | exposition_names(api.registry)


def test_every_referenced_metric_is_exported() -> None:
    """A typo, a renamed metric or a counter without its _total fails here, not at 3 a.m."""
    assert unknown_names(worker_and_api_names()) == {}


def test_the_name_parser_sees_through_promql() -> None:
    """Functions, aggregations, label lists, matchers, ranges and variables are not metrics."""
    expr = (
        "histogram_quantile(0.95, sum by (type, le) (rate(coldbrew_job_duration_seconds_bucket"
        '{queue=~"$queue"}[$__rate_interval]))) > on (queue) group_left coldbrew:lane_depth '
        'and count_values by (schedule) ("tick", coldbrew_cron_last_tick_timestamp_seconds) '
        'or label_replace(vector(1), "queue", "x", "", "") unless up{job="a b"} offset 5m'
    )
    assert metric_names(expr) == {
        "coldbrew_job_duration_seconds_bucket",
        "coldbrew:lane_depth",
        "coldbrew_cron_last_tick_timestamp_seconds",
        "up",
    }
    # the check reports what it cannot place: a missing _total, an unknown name
    assert unknown_names(set()).keys() >= {"coldbrew_queue_depth"}
    assert "coldbrew_pool_children_replaced" not in worker_and_api_names()


def test_every_alert_has_a_firing_and_a_silent_test() -> None:
    tests = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))["tests"]
    fired: set[str] = set()
    tested: set[str] = set()
    for case in tests:
        for check in case.get("alert_rule_test", []):
            tested.add(check["alertname"])
            if check.get("exp_alerts"):
                fired.add(check["alertname"])
    alerts = {rule["alert"] for rule in alert_rules() if "alert" in rule}
    assert alerts - fired == set(), "alerts no test makes fire"
    assert tested <= alerts


def test_every_alert_has_a_runbook_section_and_annotations() -> None:
    runbook = RUNBOOK.read_text(encoding="utf-8")
    headings = {m.lower() for m in re.findall(r"^## (\w+)\s*$", runbook, re.MULTILINE)}
    for rule in alert_rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warning", "info"), name
        assert rule["annotations"]["runbook"] == f"docs/runbook.md#{name.lower()}", name
        assert name.lower() in headings, f"docs/runbook.md has no '## {name}'"
        section = runbook.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("Means", "Confirm", "Do"):
            assert f"**{part}**" in section, f"{name}: no **{part}** in its runbook section"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_checks_and_tests_the_rules() -> None:
    """The same run as `make alerts` (.ci/run installs promtool, so CI never skips it)."""
    check = subprocess.run(
        ["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    run = subprocess.run(
        ["promtool", "test", "rules", ALERT_TESTS.name],
        cwd=ALERT_TESTS.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _datasources(value: Any) -> list[Any]:
    if isinstance(value, dict):
        found = [value["datasource"]] if "datasource" in value else []
        return found + [d for v in value.values() for d in _datasources(v)]
    if isinstance(value, list):
        return [d for v in value for d in _datasources(v)]
    return []


def test_dashboard_imports_into_grafana_10() -> None:
    """schemaVersion >= 38, the datasource an import input, unique ids, no overlapping rows."""
    board = dashboard()
    assert board["schemaVersion"] >= 38
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    assert board["__inputs"][0]["pluginId"] == "prometheus"
    sources = _datasources(board["panels"]) + _datasources(board["templating"])
    assert sources
    assert all(s == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"} for s in sources)
    panels = list(dashboard_panels())
    assert len({p["id"] for p in panels}) == len(panels)
    cells = set()
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps another panel"
                cells.add((x, y))
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize(
    "topic",
    [
        "Throughput by outcome",
        "Start latency",
        "Duration by type",
        "Backlog per lane and tenant",
        "Oldest waiting job per lane and tenant",
        "Estimated wait",
        "Redeliveries by cause",
        "Dead letters by reason",
        "Leases extended and lost",
        "Pool restarts",
        "Cap waits",
        "Rate-limit waits",
        "Breaker state",
        "Utilisation",
        "Load L",
    ],
)
def test_dashboard_has_the_issues_panels(topic: str) -> None:
    titles = [p["title"] for p in dashboard_panels()]
    assert any(t.startswith(topic) for t in titles), f"no panel {topic!r} in {titles}"


def test_dashboard_queries_reference_names_the_parser_finds() -> None:
    """Each panel's query names at least one metric (a parser that found none checks nothing)."""
    for title, expr in promql_names.dashboard_exprs():
        assert metric_names(expr), f"panel {title!r}: no metric found in {expr!r}"
    for where, expr in promql_names.all_exprs():
        assert metric_names(expr), f"{where}: no metric found in {expr!r}"
