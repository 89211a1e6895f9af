"""The metric names PromQL in deploy/ refers to, and the names coldbrew exports.

Shared by the lint-level test (tests/unit/test_ops_files.py: the names an
in-process worker and API register) and the Prometheus integration test
(tests/integration/test_prometheus.py: the names a real scrape returned).
The parser is deliberately small: PromQL here is ours, and an identifier it
cannot place is reported rather than guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "coldbrew.json"
RUNBOOK = REPO / "docs" / "runbook.md"

# what Prometheus makes itself, not coldbrew
BUILTIN = frozenset({"up"})
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right", "inf", "nan"}
)
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_VARIABLE = re.compile(r"\$\{?\w+\}?")
_NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(\s*\()?")
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][\w:]*)")


def metric_names(expr: str) -> set[str]:
    """The metric names (and recorded rule names) a PromQL expression selects."""
    text = _VARIABLE.sub("", expr)
    text = _STRING.sub('""', text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _CLAUSE.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue  # a function or aggregation, or an operator
        names.add(name)
    return names


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def recorded_names() -> set[str]:
    return {rule["record"] for rule in alert_rules() if "record" in rule}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_exprs() -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every target of every panel."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


def template_metric_names() -> set[str]:
    """The metrics the dashboard's variables read (``label_values(metric, label)``)."""
    names = set()
    for variable in dashboard()["templating"]["list"]:
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        names.update(_LABEL_VALUES.findall(text))
    return names


def all_exprs() -> list[tuple[str, str]]:
    """``(where, expr)`` for every PromQL expression in alerts.yml and the dashboard."""
    rules = [(rule.get("alert") or rule["record"], rule["expr"]) for rule in alert_rules()]
    return rules + [(f"panel {title!r}", expr) for title, expr in dashboard_exprs()]


def referenced_names() -> dict[str, set[str]]:
    """Every name referenced, with where (alert, record or panel)."""
    found: dict[str, set[str]] = {}
    for where, expr in all_exprs():
        for name in metric_names(expr):
            found.setdefault(name, set()).add(where)
    for name in template_metric_names():
        found.setdefault(name, set()).add("dashboard variables")
    return found


def exposition_names(registry: CollectorRegistry) -> set[str]:
    """The sample names a registry's families can expose, whether or not a child exists yet."""
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.update({f"{family.name}_total", f"{family.name}_created"})
        elif family.type == "histogram":
            names.update(f"{family.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            names.add(f"{family.name}_created")
        else:
            names.add(family.name)
    return names


def scraped_names(text: str) -> set[str]:
    """The sample names in a /metrics text exposition (and its # HELP/# TYPE names)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            if kind == "histogram":  # a labelled one has no sample before its first child
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def unknown_names(exported: set[str]) -> dict[str, set[str]]:
    """Referenced names that are neither exported, recorded in alerts.yml, nor built in."""
    known = exported | recorded_names() | BUILTIN
    return {name: where for name, where in referenced_names().items() if name not in known}
