"""Whole pods through the production controllers: placement by shape, per-container status,
init containers, restarts the provider makes, and the waiting reasons and Events of issue 12.

Runs on looptime with the fake API and in-memory providers (``controller_harness``); a
``whole_pods`` memory provider reports every container, as the local and Kubernetes
providers do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.controller_harness import Core, gpu_offer, loop_now, memory_provider, pod_manifest
from vk_provider.domain.containers import ContainerState, ContainerStatus, Termination
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PLACEMENT, ANN_PROVIDER, LABEL_PROVIDER

pytestmark = [pytest.mark.looptime, pytest.mark.usefixtures("no_leftover_tasks")]


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"


def whole_pod(name: str, *, policy: str = "Always", **spec: Any) -> dict[str, Any]:
    """Two app containers, a plain init container and a native sidecar."""
    pod = pod_manifest(name, policy=policy, **spec)
    pod["spec"]["containers"].append({"name": "metrics", "image": "example.com/exporter:1"})
    pod["spec"]["initContainers"] = [
        {"name": "fetch-weights", "image": "example.com/fetch:1"},
        {"name": "proxy", "image": "example.com/proxy:1", "restartPolicy": "Always"},
    ]
    return pod


def by_name(statuses: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in statuses}


async def test_a_whole_pod_is_routed_away_from_single_container_providers() -> None:
    cheap = memory_provider("cheap", gpu_offer(price=0.5))
    whole = memory_provider("whole", gpu_offer(price=2.0), whole_pods=True)
    core = Core(cheap, whole)
    async with core.running():
        await core.kube.create_pod(whole_pod("infer"))
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
        await core.until(lambda: core.condition("infer", "Ready") == "True", what="Ready")
    assert core.annotation("infer", ANN_PROVIDER) == "whole"
    assert cheap.instances() == []
    (selected,) = [e for e in core.kube.events if e["reason"] == "ProviderSelected"]
    assert (
        "skipped provider(s) cheap: cannot run 2 app container(s), 1 sidecar(s), 1 init"
        in (selected["message"])
    )
    # The explanation stays on the pod, and the provider is a label too.
    assert core.annotation("infer", ANN_PLACEMENT) == selected["message"]
    pod = core.kube.pod("ns", "infer")
    assert pod is not None and pod["metadata"]["labels"][LABEL_PROVIDER] == "whole"

    status = core.status("infer")
    apps = by_name(status["containerStatuses"])
    inits = by_name(status["initContainerStatuses"])
    assert list(apps) == ["main", "metrics"]
    assert list(inits) == ["fetch-weights", "proxy"]
    assert all(s["ready"] and "running" in s["state"] for s in apps.values())
    assert inits["fetch-weights"]["state"]["terminated"]["reason"] == "Completed"
    assert inits["fetch-weights"]["ready"] is True and inits["fetch-weights"]["started"] is False
    assert "running" in inits["proxy"]["state"] and inits["proxy"]["ready"] is True
    instance = core.annotation("infer", ANN_INSTANCE)
    assert apps["metrics"]["containerID"] == f"vk-provider://{instance}/metrics"
    for kind in ("Initialized", "ContainersReady", "Ready", "PodScheduled"):
        assert core.condition("infer", kind) == "True", kind
    started = [e["message"] for e in core.kube.events if e["reason"] == "Started"]
    assert sorted(started) == [
        f"Started container {n}" for n in ("fetch-weights", "main", "metrics", "proxy")
    ]


async def test_a_whole_pod_no_provider_can_run_is_invalid_naming_the_field() -> None:
    core = Core(memory_provider("a", gpu_offer()), memory_provider("b", gpu_offer()))
    async with core.running():
        await core.kube.create_pod(whole_pod("infer", policy="Never"))
        await core.until(lambda: "InvalidSpec" in core.kube.reasons("infer"), what="InvalidSpec")
        await core.until(lambda: core.phase("infer") == "Failed", what="Failed")
    (event,) = [e for e in core.kube.events if e["reason"] == "InvalidSpec"]
    assert event["message"].startswith("spec.containers[1]: no provider can run 2 app container")
    assert "provider(s) a, b cannot" in event["message"]
    assert core.status("infer")["reason"] == "InvalidSpec"


async def test_a_container_its_provider_refuses_waits_in_create_container_error() -> None:
    provider = memory_provider("a", gpu_offer())
    provider.fail_next(
        "create",
        InvalidSpec(
            "workingDir '/x' is not a directory",
            provider="a",
            field="spec.containers[0].workingDir",
        ),
    )
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(pod_manifest("infer"))
        await core.until(lambda: "InvalidSpec" in core.kube.reasons("infer"), what="InvalidSpec")
        await core.until(
            lambda: core.container_status("infer").get("state", {}).get("waiting"),
            what="waiting",
        )
    waiting = core.container_status("infer")["state"]["waiting"]
    assert waiting["reason"] == "CreateContainerError"  # the runtime's answer, as a kubelet's
    assert "spec.containers[0].workingDir" in waiting["message"]


async def test_an_init_container_still_running_keeps_the_pod_pending() -> None:
    provider = memory_provider("whole", gpu_offer(), whole_pods=True)
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(whole_pod("infer"))
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
        instance = core.annotation("infer", ANN_INSTANCE)
        assert instance is not None
        provider.set_container(
            instance,
            ContainerStatus("fetch-weights", ContainerState.RUNNING, started_at=loop_now()),
            init=True,
        )
        for app in ("main", "metrics"):
            provider.set_container(
                instance, ContainerStatus(app, ContainerState.WAITING, reason="PodInitializing")
            )
        await core.until(lambda: core.phase("infer") == "Pending", what="Pending")
    assert core.condition("infer", "Initialized") == "False"
    assert core.condition("infer", "Ready") == "False"
    apps = by_name(core.status("infer")["containerStatuses"])
    assert apps["main"]["state"] == {"waiting": {"reason": "PodInitializing"}}


async def test_restarts_the_provider_makes_show_per_container_with_back_off_events() -> None:
    provider = memory_provider("whole", gpu_offer(), whole_pods=True)
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(whole_pod("infer"))
        await core.until(lambda: core.condition("infer", "Ready") == "True", what="Ready")
        instance = core.annotation("infer", ANN_INSTANCE)
        assert instance is not None
        crashed = Termination(exit_code=2, reason="Error", finished_at=loop_now())
        provider.set_container(
            instance,
            ContainerStatus(
                "metrics",
                ContainerState.WAITING,
                reason="CrashLoopBackOff",
                message="back-off 20s restarting failed container",
                restart_count=2,
                last_termination=crashed,
            ),
        )
        await core.until(lambda: core.condition("infer", "Ready") == "False", what="not Ready")
        metrics = by_name(core.status("infer")["containerStatuses"])["metrics"]
        assert metrics["restartCount"] == 2
        assert metrics["lastState"]["terminated"]["exitCode"] == 2
        assert metrics["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert core.phase("infer") == "Running"
        assert "BackOff" in core.kube.reasons("infer")
        # Running again, with the count the provider keeps: Started once more, Ready again.
        provider.set_container(
            instance,
            ContainerStatus(
                "metrics",
                ContainerState.RUNNING,
                started_at=loop_now(),
                restart_count=2,
                last_termination=crashed,
            ),
        )
        await core.until(lambda: core.condition("infer", "Ready") == "True", what="Ready again")
    assert core.kube.reasons("infer").count("BackOff") == 1
    started = [e for e in core.kube.events if e["message"] == "Started container metrics"]
    assert sum(e["count"] for e in started) == 2
    assert len(provider.instances()) == 1  # the provider restarted it: no relaunch


@pytest.mark.parametrize(("code", "phase"), [(0, "Succeeded"), (3, "Failed")])
async def test_a_whole_pod_that_ends_is_final_and_never_relaunched(code: int, phase: str) -> None:
    provider = memory_provider("whole", gpu_offer(), whole_pods=True)
    core = Core(provider)
    async with core.running():
        await core.kube.create_pod(whole_pod("job", policy="Always"))
        await core.until(lambda: core.phase("job") == "Running", what="Running")
        instance = core.annotation("job", ANN_INSTANCE)
        assert instance is not None
        provider.exit(instance, code)
        await core.until(lambda: core.phase("job") == phase, what=phase)
        await core.until(lambda: provider.instances() == [], what="released")
        await asyncio.sleep(60)
    assert provider.calls["create"] == 1
    apps = by_name(core.status("job")["containerStatuses"])
    assert {s["state"]["terminated"]["exitCode"] for s in apps.values()} == {code}
    assert core.condition("job", "Ready") == "False"


async def test_a_readiness_probe_nobody_can_run_is_said_once() -> None:
    core = Core(memory_provider("plain", gpu_offer()))
    probe = {"httpGet": {"port": 8080, "path": "/ready"}}
    pod = pod_manifest("infer")
    pod["spec"]["containers"][0]["readinessProbe"] = probe
    async with core.running():
        await core.kube.create_pod(pod)
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
        await asyncio.sleep(30)
    (event,) = [e for e in core.kube.events if e["reason"] == "ProbeUnsupported"]
    assert event["type"] == "Warning" and event["count"] == 1
    assert "readiness follows the container running" in event["message"]
    assert core.condition("infer", "Ready") == "True"


async def test_waiting_for_capacity_and_budget_say_so() -> None:
    core = Core(memory_provider("full", gpu_offer(capacity=0)))
    async with core.running():
        await core.kube.create_pod(pod_manifest("waiting"))
        await core.until(lambda: "NoCapacity" in core.kube.reasons("waiting"), what="NoCapacity")
        await core.until(
            lambda: core.container_status("waiting").get("state", {}).get("waiting"),
            what="waiting status",
        )
    waiting = core.container_status("waiting")["state"]["waiting"]
    assert waiting["reason"] == "WaitingForCapacity"
    (event,) = [e for e in core.kube.events if e["reason"] == "NoCapacity"]
    assert waiting["message"] == event["message"]


async def test_missing_optional_references_are_skipped_with_an_event() -> None:
    core = Core(memory_provider("mem", gpu_offer()))
    pod = pod_manifest("infer")
    pod["spec"]["containers"][0]["env"] = [
        {
            "name": "TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "absent", "key": "t", "optional": True}},
        }
    ]
    async with core.running():
        await core.kube.create_pod(pod)
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
    (event,) = [e for e in core.kube.events if e["reason"] == "OptionalSecretNotFound"]
    assert event["type"] == "Warning"
    assert event["message"] == 'skipping optional envvar "TOKEN": secret "absent" not found'


async def test_a_missing_mandatory_reference_waits_with_create_container_config_error() -> None:
    provider = memory_provider("mem", gpu_offer())
    core = Core(provider)
    pod = pod_manifest("infer")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"configMapKeyRef": {"name": "later", "key": "t"}}}
    ]
    async with core.running():
        await core.kube.create_pod(pod)
        await core.until(
            lambda: core.container_status("infer").get("state", {}).get("waiting"),
            what="waiting",
        )
        waiting = core.container_status("infer")["state"]["waiting"]
        assert waiting["reason"] == "CreateContainerConfigError"
        assert "ConfigMap 'later' not found" in waiting["message"]
        (event,) = [e for e in core.kube.events if e["reason"] == "MandatoryConfigMapNotFound"]
        assert event["type"] == "Warning" and event["message"] == 'configmap "later" not found'
        assert provider.calls.get("create", 0) == 0, "nothing is created before it can start"
        core.kube.config_maps[("ns", "later")] = {
            "metadata": {"name": "later", "namespace": "ns"},
            "data": {"t": "v"},
        }
        await core.until(lambda: core.phase("infer") == "Running", within=600, what="Running")
