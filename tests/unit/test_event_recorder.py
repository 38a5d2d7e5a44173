"""The Event recorder queues only what an Event names about its object, never the object."""

from __future__ import annotations

import asyncio
from typing import Any

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
