"""The overflow flip controller against the real control plane, with a signal the test sets.

The controller runs in the test's event loop against the session's API server and a real
Node object; the GPU signal is a scripted source (what Prometheus would answer), so the
hysteresis, an outage, a hand edit and a restart can be driven exactly. The whole story with
the real Prometheus, kube-state-metrics, KWOK and the descheduler is ``test_flip_story``.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from vk_provider.controllers.node import NodeController
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowController
from vk_provider.controllers.prometheus import SignalUnavailable
from vk_provider.domain.node import build_node
from vk_provider.domain.overflow import OverflowPolicy, OverflowState, Reading
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.settings.agent import IntervalsConfig, NodeConfig
from vk_provider_adapters.memory.adapter import MemoryProvider
from vk_provider_adapters.memory.config import MemoryProviderConfig

pytestmark = pytest.mark.integration

KEY, VALUE = "virtual-kubelet.io/provider", "vk-provider"
FULL = Reading(allocatable=32, requested=32, unscheduled=4)
ROOM = Reading(allocatable=32, requested=8)


class ScriptedSignal:
    """The signal as the test sets it: a reading, or None for an outage."""

    def __init__(self, reading: Reading | None) -> None:
        self.reading = reading
        self.reads = 0
        self.once: list[Reading] = []  # read once each, before ``reading``

    async def read(self) -> Reading:
        self.reads += 1
        if self.once:
            return self.once.pop(0)
        if self.reading is None:
            raise SignalUnavailable("query 'flip:own_gpu_allocatable:sum': ConnectError")
        return self.reading

    async def close(self) -> None:
        return None


class Transitions:
    def __init__(self) -> None:
        self.to: list[OverflowState] = []

    def overflow_evaluated(self, view: Any) -> None:
        return None

    def overflow_transition(self, to: OverflowState) -> None:
        self.to.append(to)


@pytest.fixture
async def node(api: KubeClient) -> AsyncIterator[str]:
    name = f"flip-{uuid.uuid4().hex[:8]}"
    closed = {"key": KEY, "value": VALUE, "effect": "NoSchedule"}
    await api.create_node(build_node(name, {}, [closed]))
    yield name
    with contextlib.suppress(Exception):
        await api.delete_node(name)


def controller(
    api: KubeClient, node: str, signal: ScriptedSignal, observer: Transitions | None = None
) -> OverflowController:
    return OverflowController(
        api,
        node_name=node,
        signal=signal,
        policy=OverflowPolicy(open_after=1.0, close_after=1.0),
        taint_key=KEY,
        taint_value=VALUE,
        interval=0.2,
        events=EventRecorder(api, node_name=node),
        observer=observer,
    )


@contextlib.asynccontextmanager
async def running(flip: OverflowController) -> AsyncIterator[OverflowController]:
    task = asyncio.create_task(flip.run())
    try:
        yield flip
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def taints(api: KubeClient, node: str) -> list[dict[str, Any]]:
    found = await api.get_node(node)
    assert found is not None
    return list((found.get("spec") or {}).get("taints") or [])


async def effect(api: KubeClient, node: str) -> str | None:
    ours = [t for t in await taints(api, node) if t.get("key") == KEY]
    return ours[0]["effect"] if len(ours) == 1 else None


async def condition(api: KubeClient, node: str) -> dict[str, Any]:
    found = await api.get_node(node)
    assert found is not None
    for item in (found.get("status") or {}).get("conditions") or []:
        if item.get("type") == "Overflow":
            return dict(item)
    return {}


async def node_events(kube: ApiClient, node: str) -> list[Any]:
    events = await client.CoreV1Api(kube).list_namespaced_event("default")
    return [e for e in events.items if e.involved_object.name == node]


async def until_effect(api: KubeClient, node: str, wanted: str, *, timeout: float = 20) -> None:
    async def reached() -> bool:
        return await effect(api, node) == wanted

    await wait_for(reached, timeout=timeout, interval=0.1, what=f"{node} taint {wanted}")


async def test_opens_when_full_then_closes_when_free_with_events_and_condition(
    api: KubeClient, kube: ApiClient, node: str
) -> None:
    signal, seen = ScriptedSignal(ROOM), Transitions()
    async with running(controller(api, node, signal, seen)) as flip:
        await wait_for(lambda: _true(signal.reads >= 5), timeout=20, what="a few evaluations")
        assert await effect(api, node) == "NoSchedule"
        assert (await condition(api, node))["status"] == "False"
        signal.reading = FULL
        await until_effect(api, node, "PreferNoSchedule")

        async def condition_open() -> dict[str, Any] | None:
            found = await condition(api, node)
            return found if found.get("status") == "True" else None

        # The taint (spec) and the condition (status) are two writes: the condition follows.
        opened = await wait_for(condition_open, timeout=20, what="the Overflow condition True")
        assert (opened["status"], opened["reason"]) == ("True", "OwnGPUsFull")
        assert "32 of 32 requested" in opened["message"]
        view = flip.view()
        assert view is not None and view.state is OverflowState.OPEN
        signal.reading = ROOM
        await until_effect(api, node, "NoSchedule")
        # The taint first, then the metric, the condition and the Event: wait for them.
        await wait_for(
            lambda: _true(len(seen.to) == 2), timeout=20, what="the closing transition counted"
        )

        async def closed_event() -> bool:
            reasons = [e.reason for e in await node_events(kube, node)]
            return "OverflowClosed" in reasons

        await wait_for(closed_event, timeout=20, what="the OverflowClosed Event")
    assert seen.to == [OverflowState.OPEN, OverflowState.CLOSED]
    reasons = [e.reason for e in await node_events(kube, node)]
    assert reasons.count("OverflowOpened") == 1 and reasons.count("OverflowClosed") == 1
    (opened_event,) = [e for e in await node_events(kube, node) if e.reason == "OverflowOpened"]
    assert opened_event.involved_object.kind == "Node"
    assert "own GPUs full for" in opened_event.message and "32 of 32" in opened_event.message


async def test_an_outage_keeps_the_state_and_says_so(
    api: KubeClient, kube: ApiClient, node: str
) -> None:
    signal = ScriptedSignal(FULL)
    async with running(controller(api, node, signal)):
        await until_effect(api, node, "PreferNoSchedule")
        signal.reading = None
        reads = signal.reads

        async def said() -> bool:
            return (await condition(api, node)).get("reason") == "SignalUnavailable"

        await wait_for(said, timeout=20, interval=0.1, what="SignalUnavailable")
        await wait_for(lambda: _true(signal.reads >= reads + 15), timeout=30, what="3 s of outage")
        assert await effect(api, node) == "PreferNoSchedule"  # never flips on missing data
        outage = await condition(api, node)
        assert outage["status"] == "True" and "keeping the overflow open" in outage["message"]
        signal.reading = ROOM  # back, and free: it closes, but only after close_after

        async def restored() -> bool:
            return any(e.reason == "OverflowSignalRestored" for e in await node_events(kube, node))

        await wait_for(restored, timeout=20, interval=0.1, what="OverflowSignalRestored")
        await until_effect(api, node, "NoSchedule")
    reasons = [e.reason for e in await node_events(kube, node)]
    assert reasons.count("OverflowSignalUnavailable") == 1


async def test_a_hand_edit_is_corrected_and_other_taints_are_kept(
    api: KubeClient, node: str
) -> None:
    signal = ScriptedSignal(FULL)
    async with running(controller(api, node, signal)):
        await until_effect(api, node, "PreferNoSchedule")
        # Someone puts a NoExecute overflow taint and an unrelated one of their own.
        await api.patch_node(
            node,
            {
                "spec": {
                    "taints": [
                        {"key": KEY, "value": VALUE, "effect": "NoExecute"},
                        {"key": "team.example/maintenance", "effect": "NoSchedule"},
                    ]
                }
            },
        )
        await until_effect(api, node, "PreferNoSchedule")
        current = await taints(api, node)
    assert {"key": "team.example/maintenance", "effect": "NoSchedule"} in [
        {k: v for k, v in t.items() if k in ("key", "effect")} for t in current
    ]
    assert not any(t.get("effect") == "NoExecute" for t in current)


async def test_a_restarted_controller_keeps_the_state_it_finds(api: KubeClient, node: str) -> None:
    signal, first = ScriptedSignal(FULL), Transitions()
    async with running(controller(api, node, signal, first)):
        await until_effect(api, node, "PreferNoSchedule")
    # A new agent process: it reads "open" from the node and does not flip while full ...
    again = Transitions()
    async with running(controller(api, node, signal, again)):
        await wait_for(lambda: _true(signal.reads >= 20), timeout=30, what="evaluations")
        assert await effect(api, node) == "PreferNoSchedule"
        assert again.to == []
        # ... nor on one reading with room (shorter than close_after, however slow the tick).
        signal.once = [ROOM]
        reads = signal.reads
        await wait_for(lambda: _true(signal.reads >= reads + 10), timeout=30, what="evaluations")
        assert again.to == [] and await effect(api, node) == "PreferNoSchedule"


async def test_the_node_controller_leaves_the_flips_taint_and_condition_alone(
    api: KubeClient, node: str
) -> None:
    signal = ScriptedSignal(FULL)
    async with running(controller(api, node, signal)):
        await until_effect(api, node, "PreferNoSchedule")

        async def condition_written() -> bool:
            # The taint is written before the condition: leave only once both are there.
            return (await condition(api, node)).get("status") == "True"

        await wait_for(condition_written, timeout=20, interval=0.1, what="Overflow condition")
    memory = MemoryProvider(
        MemoryProviderConfig.model_validate(
            {
                "type": "memory",
                "name": "mem",
                "enabled": True,
                "offers": [
                    {"sku": "a100", "gpu_model": "A100-80GB", "gpu_count": 1, "price_per_hour": 1.0}
                ],
            }
        )
    )
    offers = OfferBook({"mem": memory}, ttl_seconds=30)
    await offers.refresh()
    config = NodeConfig.model_validate({"name": node})
    flip_taint = {"key": KEY, "value": VALUE, "effect": "NoSchedule"}
    nodes = NodeController(
        api,
        config,
        offers,
        intervals=IntervalsConfig(),
        address="127.0.0.1",
        kubelet_port=10250,
        flip_taint=flip_taint,
    )
    await nodes.register()  # an agent restart re-registers the node
    await nodes.update_status()
    assert await effect(api, node) == "PreferNoSchedule"  # not put back to NoSchedule
    assert (await condition(api, node)).get("status") == "True"  # the flip's condition stays
    found = await api.get_node(node)
    assert found is not None
    labels = found["metadata"]["labels"]
    assert labels["gpu.vk-provider.io/A100-80GB"] == "true"
    assert labels["nvidia.com/gpu.product"] == "A100-80GB"
    kinds = {c["type"] for c in found["status"]["conditions"]}
    assert {"Ready", "Overflow"} <= kinds


async def _true(value: bool) -> bool:
    return value
