"""The agent's metrics as the controllers feed them, and docs/metrics.md that lists them.

The controllers run as in production (``controller_harness.Core``) on a fake API, in-memory
providers and simulated time; the exposition is read back as Prometheus would scrape it.
``docs/metrics.md`` is checked against the families the code exports, so a metric cannot be
added, renamed or dropped without the list following.
"""

from __future__ import annotations

import asyncio
import platform
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider import __version__
from vk_provider.api.metrics import Metrics
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowView
from vk_provider.domain.budget import BudgetCaps, BudgetLedger
from vk_provider.domain.overflow import OverflowState, Reading
from vk_provider.domain.podview import ANN_INSTANCE

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"


def sample(exposition: str, series: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {series} in:\n{exposition}")


@pytest.mark.looptime
@pytest.mark.usefixtures("no_leftover_tasks")
async def test_a_running_pod_feeds_the_start_histogram_once_and_the_work_queue() -> None:
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider)
    core.view()
    async with core.running():
        await asyncio.sleep(7)  # bound at t=0 (its creation): Running is measured from there
        await core.kube.create_pod(pod_manifest("infer"))
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
        text = core.metrics.render().decode()
        assert sample(text, 'vk_provider_pod_start_duration_seconds_count{provider="mem"}') == 1
        assert sample(text, 'vk_provider_pod_start_duration_seconds_sum{provider="mem"}') < 3
        # A crash and a relaunch: Running again, but the pod started once.
        first = core.annotation("infer", ANN_INSTANCE)
        assert first is not None
        provider.exit(first, 1)
        await core.until(
            lambda: core.annotation("infer", ANN_INSTANCE) not in (None, first), what="relaunch"
        )
        await core.until(lambda: core.container_status("infer").get("ready"), what="Ready")
        text = core.metrics.render().decode()
    assert sample(text, 'vk_provider_pod_start_duration_seconds_count{provider="mem"}') == 1
    assert sample(text, 'vk_provider_workqueue_adds_total{name="pods"}') >= 3
    assert sample(text, 'vk_provider_workqueue_queue_duration_seconds_count{name="pods"}') >= 3
    assert sample(text, 'vk_provider_workqueue_work_duration_seconds_count{name="pods"}') >= 3
    assert sample(text, 'vk_provider_workqueue_depth{name="pods"}') == 0
    assert sample(text, 'vk_provider_instances{provider="mem",state="Running"}') == 1
    assert sample(text, 'vk_provider_instances{provider="mem",state="Lost"}') == 0
    assert sample(text, 'vk_provider_up{provider="mem"}') == 1


@pytest.mark.looptime
@pytest.mark.usefixtures("no_leftover_tasks")
async def test_the_start_is_measured_from_the_pods_binding() -> None:
    core = Core(memory_provider("mem", gpu_offer()))
    core.view()
    pod = pod_manifest("bound")
    # The scheduler bound it 40 s before the agent saw it.
    pod["status"] = {
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}
        ]
    }
    async with core.running():
        await asyncio.sleep(40)
        await core.kube.create_pod(pod)
        await core.until(lambda: core.phase("bound") == "Running", what="Running")
    text = core.metrics.render().decode()
    seconds = sample(text, 'vk_provider_pod_start_duration_seconds_sum{provider="mem"}')
    assert 40 <= seconds < 43


def test_build_info_names_the_version() -> None:
    text = Metrics().render().decode()
    labels = f'python_version="{platform.python_version()}",version="{__version__}"'
    assert sample(text, f"vk_provider_build_info{{{labels}}}") == 1


def test_terminations_are_counted_by_reason_as_a_label() -> None:
    metrics = Metrics()
    metrics.instance_terminated("mem", "its pod has ended")
    metrics.instance_terminated("mem", "orphan")
    text = metrics.render().decode()
    assert sample(text, 'vk_provider_instances_terminated_total{provider="mem",reason="orphan"}')
    series = 'vk_provider_instances_terminated_total{provider="mem",reason="its_pod_has_ended"}'
    assert sample(text, series) == 1


# --------------------------------------------------------------------------- docs/metrics.md


def exported_families() -> dict[str, str]:
    """Every family the agent can export (overflow on), name -> type, from the code."""
    view = AgentView(
        providers={},
        provider_types={},
        offers=OfferBook({}, ttl_seconds=30),
        ledger=BudgetLedger(BudgetCaps()),
        placements=list,
        readiness=lambda: Readiness(ready=True, reasons=()),
        overflow=lambda: OverflowView(
            state=OverflowState.OPEN,
            since=None,
            signal_ok=True,
            signal_error="",
            reading=Reading(allocatable=1, requested=1, unscheduled=0),
            last_evaluation=datetime(2026, 12, 1, tzinfo=UTC),
            needed_free_gpus=1,
            full_for_seconds=None,
            free_for_seconds=None,
            taint={"key": "k", "value": "v", "effect": "NoSchedule"},
            transitions=0,
        ),
    )
    metrics = Metrics()
    metrics.attach(view)
    text = metrics.render().decode()
    families = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    # ``_created`` series are prometheus_client's own, one per counter and histogram.
    return {name: kind for name, kind in families.items() if not name.endswith("_created")}


def documented() -> dict[str, str]:
    """The metric table of docs/metrics.md: name -> type."""
    rows = re.findall(r"^\| `(vk_provider_\w+)(?:\{[^}]*\})?` \| (\w+) \|", DOC.read_text(), re.M)
    return dict(rows)


def test_docs_list_every_exported_metric_with_its_type() -> None:
    exported, listed = exported_families(), documented()
    assert set(listed) == set(exported), (
        f"missing from docs/metrics.md: {sorted(set(exported) - set(listed))}; "
        f"listed but not exported: {sorted(set(listed) - set(exported))}"
    )
    assert listed == exported


def test_docs_list_the_renames() -> None:
    text = DOC.read_text()
    for old in (
        "vk_provider_provider_request_duration_seconds",
        "vk_provider_provider_errors_total",
        "vk_provider_provider_circuit_state",
        "vk_provider_provider_up",
        "vk_provider_orphans_terminated_total",
    ):
        assert f"`{old}`" in text, old
