"""The Event recorder queues only what an Event names about its object, never the object, and
writes at its rate."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vk_provider.domain.eventcorrelator import EventCorrelator
from vk_provider.domain.tokenbucket import TokenBucket
from vk_provider.kube.events import EventRecorder, involved


def a_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "7",
            "labels": {"app": "web"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"containers": [{"name": "main", "image": "x", "env": [{"name": "A"}]}]},
        "status": {"phase": "Running"},
    }


def test_an_event_refers_to_kind_name_namespace_uid_and_version_only() -> None:
    assert involved(a_pod()) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
    }
    node = {"kind": "Node", "metadata": {"name": "vk", "uid": "n-1"}}
    assert involved(node) == {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "vk", "uid": "n-1"},
    }
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-train", "namespace": "ml", "uid": "w-1"},
    }
    assert involved(workload)["apiVersion"] == "kueue.x-k8s.io/v1beta2"


async def test_a_queued_event_holds_the_reference_not_the_pod() -> None:
    recorder = EventRecorder(None, node_name="vk")  # type: ignore[arg-type]
    recorder._outbox = asyncio.Queue()
    await recorder.record(a_pod(), "Normal", "Started", "started")
    queued, kind, reason, message = recorder._outbox.get_nowait()
    assert queued == involved(a_pod())
    assert (kind, reason, message) == ("Normal", "Started", "started")


class _Kube:
    """What the recorder calls to write an Event: records the creates."""

    def __init__(self) -> None:
        self.created: list[str] = []

    async def create_event(self, namespace: str, event: dict[str, Any]) -> dict[str, Any]:
        self.created.append(event["reason"])
        return {"metadata": {"name": f"e{len(self.created)}"}}


async def test_event_writes_past_the_burst_wait_their_turn_and_spam_costs_no_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def no_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr("vk_provider.kube.events.asyncio.sleep", no_sleep)
    kube = _Kube()
    recorder = EventRecorder(
        kube,  # type: ignore[arg-type]
        node_name="vk",
        clock=lambda: 0.0,
        correlator=EventCorrelator(burst=3),  # a pod's fourth Event is spam
        limit=TokenBucket(rate=10.0, burst=2),
    )
    for i in range(5):
        pod = a_pod()
        pod["metadata"]["uid"] = f"u-{i}"
        await recorder.record(pod, "Normal", f"R{i}", "m")
    for n in range(3):  # more Events of the last pod: the third of them is dropped as spam
        await recorder.record(pod, "Normal", f"S{n}", "m")
    assert kube.created == ["R0", "R1", "R2", "R3", "R4", "S0", "S1"]
    # Two at once (the burst), then one per 0.1 s of debt; the dropped one took no token.
    assert waits == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
