"""The pod status a kubelet would write: phase (``getPhase``), conditions, per-container ready.

The expected phases are written out from kubelet's ``getPhase`` (pkg/kubelet/kubelet_pods.go),
case by case, not derived from the module.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from vk_provider.domain.podstatus import (
    ContainerView,
    PodContainers,
    container_status,
    pod_phase,
    pod_status,
    status_changed,
)
from vk_provider.domain.podview import PodView, Running, Terminated, Waiting

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def running(name: str = "app", **fields: Any) -> ContainerView:
    return ContainerView(name, "img", Running(NOW), **fields)


def waiting(name: str = "app", reason: str = "ContainerCreating", **fields: Any) -> ContainerView:
    return ContainerView(name, "img", Waiting(reason), **fields)


def ended(name: str = "app", code: int = 0, **fields: Any) -> ContainerView:
    reason = "Completed" if code == 0 else "Error"
    return ContainerView(name, "img", Terminated(code, reason, NOW, NOW), **fields)


CRASHED = Terminated(1, "Error", NOW, NOW)


@pytest.mark.parametrize(
    ("apps", "inits", "policy", "phase"),
    [
        pytest.param([waiting()], [], "Always", "Pending", id="not-started"),
        pytest.param([running()], [], "Always", "Running", id="running"),
        pytest.param([running("a"), waiting("b")], [], "Always", "Pending", id="one-not-started"),
        pytest.param([running("a"), ended("b", 1)], [], "Never", "Running", id="one-still-runs"),
        pytest.param([ended(code=0)], [], "Always", "Running", id="always-restarts"),
        pytest.param([ended(code=0)], [], "OnFailure", "Succeeded", id="onfailure-done"),
        pytest.param([ended(code=1)], [], "OnFailure", "Running", id="onfailure-restarts"),
        pytest.param([ended(code=1)], [], "Never", "Failed", id="never-failed"),
        pytest.param([ended("a", 0), ended("b", 1)], [], "Never", "Failed", id="one-failed"),
        pytest.param([ended("a", 0), ended("b", 0)], [], "Never", "Succeeded", id="all-done"),
        pytest.param(
            [waiting(reason="CrashLoopBackOff", last_state=CRASHED)],
            [],
            "Always",
            "Running",
            id="crash-loop",
        ),
        pytest.param(
            [waiting(reason="PodInitializing")],
            [running("init")],
            "Always",
            "Pending",
            id="init-running",
        ),
        pytest.param(
            [waiting(reason="PodInitializing")],
            [ended("init", 1)],
            "Never",
            "Failed",
            id="init-failed-never",
        ),
        pytest.param(
            [waiting(reason="PodInitializing")],
            [waiting("init", "CrashLoopBackOff", last_state=CRASHED)],
            "Always",
            "Pending",
            id="init-crash-loop",
        ),
        pytest.param([running()], [ended("init", 0)], "Never", "Running", id="init-done"),
        pytest.param(
            [waiting(reason="PodInitializing")],
            [running("side", sidecar=True, started=False)],
            "Always",
            "Pending",
            id="sidecar-not-started",
        ),
        pytest.param(
            [running()], [running("side", sidecar=True)], "Always", "Running", id="sidecar-runs"
        ),
        pytest.param(
            [ended(code=0)],
            [ended("side", 137, sidecar=True)],
            "Never",
            "Succeeded",
            id="sidecar-stopped-after-app",
        ),
    ],
)
def test_phase_follows_kubelet(
    apps: list[ContainerView], inits: list[ContainerView], policy: str, phase: str
) -> None:
    assert pod_phase(PodContainers(tuple(apps), tuple(inits)), policy) == phase


def pod(**status: Any) -> PodView:
    return PodView.parse(
        {
            "metadata": {"namespace": "ns", "name": "p", "uid": "u"},
            "spec": {
                "containers": [{"name": "app", "image": "img"}],
                "initContainers": [{"name": "init", "image": "img"}],
            },
            "status": status,
        }
    )


def conditions(status: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status["conditions"]}


def test_ready_needs_every_app_container_and_sidecar_ready() -> None:
    both = PodContainers(
        (running("a"), running("b", ready=False)), (running("side", sidecar=True),)
    )
    status = pod_status(pod(), both, now=NOW, host_ip="10.0.0.1", pod_ip=None)
    assert conditions(status)["Ready"] == "False"
    assert conditions(status)["ContainersReady"] == "False"
    assert [c["ready"] for c in status["containerStatuses"]] == [True, False]
    sidecar_not_ready = PodContainers(
        (running("a"),), (running("side", sidecar=True, ready=False),)
    )
    status = pod_status(pod(), sidecar_not_ready, now=NOW, host_ip="10.0.0.1", pod_ip=None)
    assert conditions(status)["Ready"] == "False"
    all_ready = PodContainers((running("a"),), (running("side", sidecar=True), ended("init")))
    status = pod_status(pod(), all_ready, now=NOW, host_ip="10.0.0.1", pod_ip="10.9.0.4")
    assert conditions(status) == {
        "PodReadyToStartContainers": "False",  # no container id known
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
        "PodScheduled": "True",
    }
    assert status["podIP"] == "10.9.0.4" and status["podIPs"] == [{"ip": "10.9.0.4"}]
    assert [c["name"] for c in status["initContainerStatuses"]] == ["side", "init"]


def test_a_running_container_whose_startup_probe_has_not_passed_is_not_started() -> None:
    view = running(started=False, ready=False)
    body = container_status(view)
    assert (body["started"], body["ready"]) == (False, False)


def test_a_completed_init_container_is_ready_and_not_started() -> None:
    body = container_status(ended("init", 0), init=True)
    assert (body["ready"], body["started"]) == (True, False)
    failed = container_status(ended("init", 1), init=True)
    assert failed["ready"] is False


def test_initialized_is_false_until_init_containers_complete() -> None:
    containers = PodContainers((waiting(reason="PodInitializing"),), (running("init"),))
    status = pod_status(pod(), containers, now=NOW, host_ip="10.0.0.1", pod_ip=None)
    initialized = next(c for c in status["conditions"] if c["type"] == "Initialized")
    assert initialized["status"] == "False"
    assert initialized["reason"] == "ContainersNotInitialized"


def test_an_ended_pod_is_never_ready() -> None:
    containers = PodContainers((running(),))
    status = pod_status(pod(), containers, now=NOW, host_ip="10.0.0.1", pod_ip=None, phase="Failed")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "PodCompleted")


def test_rewriting_the_same_state_changes_nothing_and_init_statuses_are_compared() -> None:
    containers = PodContainers((running(),), (running("init"),))
    first = pod_status(pod(), containers, now=NOW, host_ip="10.0.0.1", pod_ip=None)
    later = datetime(2026, 12, 1, 13, tzinfo=UTC)
    again = pod_status(pod(**first), containers, now=later, host_ip="10.0.0.1", pod_ip=None)
    assert not status_changed(first, again)
    done = PodContainers((running(),), (ended("init"),))
    moved = pod_status(pod(**first), done, now=later, host_ip="10.0.0.1", pod_ip=None)
    assert status_changed(first, moved)


def test_conditions_others_own_are_kept_as_a_kubelet_keeps_them() -> None:
    """The eviction API's DisruptionTarget (and a readiness gate's condition) survive every
    status the agent writes: the merge patch replaces the list, so they are written back."""
    evicted = {
        "type": "DisruptionTarget",
        "status": "True",
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    }
    gate = {"type": "example.com/lb-ready", "status": "False"}
    containers = PodContainers((running(),), (ended("init"),))
    status = pod_status(
        pod(conditions=[evicted, gate]), containers, now=NOW, host_ip="10.0.0.1", pod_ip=None
    )
    assert evicted in status["conditions"] and gate in status["conditions"]
    assert [c["type"] for c in status["conditions"]].count("Ready") == 1
    assert not status_changed(
        status, pod_status(pod(**status), containers, now=NOW, host_ip="10.0.0.1", pod_ip=None)
    )
