"""The Grafana dashboard (``deploy/grafana-dashboard.json``) queries only what the agent exports.

The metric names come from the code, not from a list kept here: a ``Metrics`` registry over an
empty ``AgentView`` is rendered and its ``# TYPE`` lines read, so renaming a metric in
``vk_provider/api/metrics.py`` without fixing the dashboard fails this test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from vk_provider.api.metrics import Metrics
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.offers import OfferBook
from vk_provider.domain.budget import BudgetCaps, BudgetLedger

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

_TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.MULTILINE)
# The series a metric family of each type puts in the exposition (counters' TYPE line already
# carries ``_total``; ``_created`` series have TYPE lines of their own).
_SERIES_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
_METRIC_NAME = re.compile(r"\bvk_provider_[A-Za-z0-9_]+")


def exported_series() -> set[str]:
    view = AgentView(
        providers={},
        provider_types={},
        offers=OfferBook({}, ttl_seconds=30),
        ledger=BudgetLedger(BudgetCaps()),
        placements=list,
        readiness=lambda: Readiness(ready=True, reasons=()),
    )
    metrics = Metrics()
    metrics.attach(view)
    names: set[str] = set()
    for family, kind in _TYPE_LINE.findall(metrics.render().decode()):
        names.update(family + suffix for suffix in _SERIES_SUFFIXES.get(kind, ("",)))
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # collapsed rows keep their panels inside
    return found


def expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        exprs.append(query["query"] if isinstance(query, dict) else str(query))
    return exprs


def test_the_exposition_names_are_read_from_the_code() -> None:
    series = exported_series()
    assert "vk_provider_pods" in series
    assert "vk_provider_placement_attempts_total" in series
    assert "vk_provider_request_duration_seconds_bucket" in series
    assert "vk_provider_spend_dollars_total" in series
    assert "vk_provider_build_info" in series
    assert "vk_provider_placement_attempts" not in series  # counters are exposed with _total
    # No name repeats the prefix's "provider" (vk_provider_provider_...).
    assert not [name for name in series if name.startswith("vk_provider_provider_")]


def test_every_expression_queries_only_metrics_the_agent_exports(
    dashboard: dict[str, Any],
) -> None:
    series = exported_series()
    for expr in expressions(dashboard):
        names = set(_METRIC_NAME.findall(expr))
        assert names, f"queries no vk-provider metric: {expr}"
        assert names <= series, f"unknown metric(s) {sorted(names - series)} in: {expr}"


def test_the_dashboard_shows_what_operators_need(dashboard: dict[str, Any]) -> None:
    text = "\n".join(expressions(dashboard))
    for needed in (
        "vk_provider_pods",
        "vk_provider_placement_attempts_total",
        "vk_provider_launch_failures_total",
        "vk_provider_request_errors_total",
        "vk_provider_circuit_breaker_state",
        "vk_provider_up",
        "vk_provider_offer_cheapest_price_dollars_per_hour",
        "vk_provider_spend_dollars_per_hour",
        "vk_provider_spend_dollars_total",
        "vk_provider_instances_terminated_total",
        "vk_provider_lease_renewal_failures_total",
        "vk_provider_instances",
        "vk_provider_terminations_overdue",
        "vk_provider_workqueue_depth",
        "vk_provider_workqueue_adds_total",
        "vk_provider_workqueue_retries_total",
        "vk_provider_build_info",
    ):
        assert re.search(rf"\b{needed}\b", text), needed
    for histogram in (
        "request_duration_seconds",
        "reconcile_duration_seconds",
        "pod_start_duration_seconds",
        "workqueue_queue_duration_seconds",
        "workqueue_work_duration_seconds",
    ):
        for quantile in ("0.5", "0.95"):
            pattern = (
                rf"histogram_quantile\({quantile}, sum by \([^)]*\ble\b[^)]*\) "
                rf"\(rate\(vk_provider_{histogram}_bucket\b"
            )
            assert re.search(pattern, text), (histogram, quantile)
    # Counters are only ever shown as rates or increases, never as raw totals ...
    for counter in re.findall(r"vk_provider_\w+_total", text):
        if counter != "vk_provider_spend_dollars_total":  # ... except the accumulated spend
            assert re.search(rf"(rate|increase)\({counter}\b", text), counter


def test_the_dashboard_is_importable_with_a_prometheus_input(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] == "vk-provider"
    assert dashboard["uid"] == "vk-provider"
    assert dashboard["__inputs"] == [
        {
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "description": dashboard["__inputs"][0]["description"],
            "type": "datasource",
            "pluginId": "prometheus",
            "pluginName": "Prometheus",
        }
    ]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        assert panel.get("description"), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"] == DATASOURCE
