"""What the EndpointSlice controller knows of the node's pods: never a replica dropped
because the agent has not yet learnt, or momentarily forgot, where it is reached."""

from __future__ import annotations

from typing import Any

from vk_provider.controllers.endpointslices import EndpointSliceController
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.models import Instance, InstanceState, PortEndpoint
from vk_provider.domain.podview import ANN_INSTANCE, ANN_PROVIDER

UP = PortEndpoint(8000, "TCP", "10.9.0.1", 8000)


class Listing:
    """A provider as the tracker lists it: ``instances``."""

    def __init__(self) -> None:
        self.instances: list[Instance] = []

    async def list_ours(self) -> list[Instance]:
        return list(self.instances)


def _pod(phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ml",
            "name": "infer-1",
            "uid": "u1",
            "resourceVersion": "1",
            "labels": {"app": "infer"},
            "annotations": {ANN_PROVIDER: "p", ANN_INSTANCE: "i1"},
        },
        "spec": {
            "nodeName": "vk",
            "containers": [{"name": "main", "ports": [{"containerPort": 8000}]}],
        },
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _controller() -> tuple[EndpointSliceController, PodStore, InstanceTracker, Listing]:
    listing = Listing()
    store = PodStore()
    tracker = InstanceTracker({"p": listing}, on_change=lambda _uid: None)  # type: ignore[dict-item]
    controller = EndpointSliceController(
        None,  # type: ignore[arg-type]  # pods() reads no API
        store,
        tracker,
        node="vk",
        resync_seconds=1,
    )
    return controller, store, tracker, listing


async def test_after_a_start_nothing_is_known_until_the_provider_was_listed() -> None:
    controller, store, tracker, listing = _controller()
    store.update(_pod())
    assert controller.pods() is None  # writing now would drop a replica that serves
    listing.instances = [Instance("p", "i1", "u1", 0, InstanceState.RUNNING, endpoints=(UP,))]
    await tracker.poll()
    (pod,) = controller.pods() or []
    assert pod.exposed == (UP,) and pod.ready


async def test_a_stopping_instance_the_tracker_forgot_keeps_its_last_endpoints() -> None:
    controller, store, tracker, listing = _controller()
    store.update(_pod())
    tracker.remember(Instance("p", "i1", "u1", 0, InstanceState.RUNNING, endpoints=(UP,)))
    assert [p.exposed for p in controller.pods() or []] == [(UP,)]
    tracker.forget("p", "i1")  # a stop was asked: the next listing says how it goes
    assert [p.exposed for p in controller.pods() or []] == [(UP,)]
    # Lost: no longer reached, whatever the provider still says of its ports.
    listing.instances = [Instance("p", "i1", "u1", 0, InstanceState.LOST, endpoints=(UP,))]
    await tracker.poll()
    assert [p.exposed for p in controller.pods() or []] == [()]


async def test_an_ended_pod_serves_nothing_and_is_forgotten() -> None:
    controller, store, tracker, _ = _controller()
    store.update(_pod())
    tracker.remember(Instance("p", "i1", "u1", 0, InstanceState.RUNNING, endpoints=(UP,)))
    assert len(controller.pods() or []) == 1
    store.update({**_pod("Succeeded"), "metadata": {**_pod()["metadata"], "resourceVersion": "2"}})
    assert controller.pods() == []
    tracker.forget("p", "i1")
    assert controller.pods() == []


class Api:
    """The writes the controller makes (``request``), each answered as the API server would
    (a resourceVersion of its own); reads are the reflectors', filled by the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self._version = 100

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> Any:
        self.calls.append((method, path))
        self._version += 1
        if body is None:
            return {}
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(self._version)}}


SERVICE = {
    "metadata": {"namespace": "ml", "name": "infer", "uid": "s1", "resourceVersion": "5"},
    "spec": {"selector": {"app": "infer"}, "ports": [{"port": 80, "targetPort": 8000}]},
}


def _listed(controller: EndpointSliceController, *services: dict[str, Any]) -> None:
    """Both watches have listed: these Services, none of our slices yet."""
    for service in services:
        controller.services.written(service)
    for reflector in (controller.services, controller.slices):
        reflector.live.set()


async def test_the_slices_are_written_once_and_an_idle_node_costs_no_request() -> None:
    """A change is written once (the answer held, so the next look writes nothing again);
    while nothing changes — no Service, slice, pod or endpoint — a look makes no request."""
    api = Api()
    store, listing = PodStore(), Listing()
    tracker = InstanceTracker({"p": listing}, on_change=lambda _uid: None)  # type: ignore[dict-item]
    controller = EndpointSliceController(
        api,  # type: ignore[arg-type]
        store,
        tracker,
        node="vk",
        resync_seconds=1,
    )
    await controller.tick()
    assert api.calls == []  # the watches have not listed yet: nothing is known
    _listed(controller, SERVICE)
    store.update(_pod())
    tracker.remember(Instance("p", "i1", "u1", 0, InstanceState.RUNNING, endpoints=(UP,)))
    await controller.tick()
    assert [method for method, _ in api.calls] == ["POST"]
    (held,) = controller.slices.objects.values()
    assert held["endpoints"][0]["addresses"] == ["10.9.0.1"]
    for _ in range(3):
        await controller.tick()
    assert len(api.calls) == 1

    moved = PortEndpoint(8000, "TCP", "10.9.0.2", 8000)  # the provider reports another address
    tracker.remember(Instance("p", "i1", "u1", 0, InstanceState.RUNNING, endpoints=(moved,)))
    await controller.tick()
    assert [method for method, _ in api.calls] == ["POST", "PUT"]
    await controller.tick()
    assert len(api.calls) == 2

    controller.services.removed(("ml", "infer"))  # the Service is deleted
    await controller.tick()
    assert [method for method, _ in api.calls] == ["POST", "PUT", "DELETE"]
    assert controller.slices.objects == {}
