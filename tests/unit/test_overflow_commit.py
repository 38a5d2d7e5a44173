"""The flip controller commits a transition only once the node's taint says so.

The node API here is a few lines in memory (get, patch with a failure on demand, status),
standing in for the API server so that a taint write can fail at one exact tick; the real
API server drives the controller in tests/integration/test_overflow_controller.py.
"""

from __future__ import annotations

import contextlib
import copy
from datetime import UTC, datetime
from typing import Any

from vk_provider.controllers.overflow import OVERFLOW_OPENED, OverflowController
from vk_provider.domain.overflow import OverflowPolicy, OverflowState, Reading
from vk_provider.kube.client import ApiError

KEY, VALUE = "virtual-kubelet.io/provider", "vk-provider"
NODE = "vk-gpu"


class Node:
    def __init__(self) -> None:
        self.node: dict[str, Any] = {
            "metadata": {"name": NODE, "resourceVersion": "1"},
            "spec": {"taints": [{"key": KEY, "value": VALUE, "effect": "NoSchedule"}]},
            "status": {},
        }
        self.failures = 0

    async def get_node(self, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.node)

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.failures:
            self.failures -= 1
            raise ApiError(503, "the API server is restarting")
        self.node["spec"]["taints"] = patch["spec"]["taints"]
        return copy.deepcopy(self.node)

    async def patch_node_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.node["status"] = status
        return copy.deepcopy(self.node)

    def effect(self) -> str:
        return next(t["effect"] for t in self.node["spec"]["taints"] if t["key"] == KEY)


class Signal:
    def __init__(self) -> None:
        self.at = 1000.0

    async def read(self) -> Reading:
        self.at += 5  # a fresh sample every tick
        return Reading(allocatable=8, requested=8, sampled_at=self.at)

    async def close(self) -> None:
        return None


class Events:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    async def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        self.reasons.append(reason)


class Transitions:
    def __init__(self) -> None:
        self.to: list[OverflowState] = []

    def overflow_evaluated(self, view: Any) -> None:
        return None

    def overflow_transition(self, to: OverflowState) -> None:
        self.to.append(to)


async def test_a_failed_taint_write_keeps_the_state_and_the_next_tick_transitions_again() -> None:
    node, signal, events, seen = Node(), Signal(), Events(), Transitions()
    flip = OverflowController(
        node,  # type: ignore[arg-type]  # duck-typed: the three calls the controller makes
        node_name=NODE,
        signal=signal,
        policy=OverflowPolicy(open_after=5, close_after=60),
        taint_key=KEY,
        taint_value=VALUE,
        interval=1,
        events=events,
        observer=seen,
        wall_clock=lambda: datetime.fromtimestamp(signal.at, UTC),
    )
    await flip.tick()  # full since this sample
    node.failures = 1
    with contextlib.suppress(ApiError):
        await flip.tick()  # would open: the write fails
    view = flip.view()
    assert view is not None and view.state is OverflowState.CLOSED
    assert node.effect() == "NoSchedule" and events.reasons == [] and seen.to == []
    await flip.tick()  # the same transition, now written
    assert node.effect() == "PreferNoSchedule"
    assert events.reasons == [OVERFLOW_OPENED] and seen.to == [OverflowState.OPEN]
    view = flip.view()
    assert view is not None and view.state is OverflowState.OPEN and view.transitions == 1
