"""The overflow flip controller: applies ``domain.overflow`` to the virtual node every tick.

Every ``interval_seconds``: read the GPU signal (``PrometheusSignal``), step the pure flip,
and re-assert the desired state on the node whatever happened in between (an agent restart,
a human edit, the node controller re-registering): the overflow taint (NoSchedule closed,
PreferNoSchedule open, never NoExecute; other taints untouched), the node condition
``Overflow`` with the numbers behind it, Events ``OverflowOpened`` / ``OverflowClosed`` on the
node at each transition, ``OverflowSignalUnavailable`` when the signal is lost (once per
outage) and ``OverflowSignalRestored`` when it is back. ``view()`` is what the REST API and
the metrics show.

On start the state is read from the node's taints (an agent that restarts mid-story keeps
the overflow as it was); the hysteresis timers start afresh, so a restart can delay a
transition but never cause one. A reading whose newest sample is older than
``max_sample_age_seconds`` counts as a lost signal (``domain.overflow.stale``).

While the hand-over (``controllers.handover``) holds claims, ``holding_open`` names it and
the flip is open whatever the signal says (``domain.overflow.held_open``).

A transition is committed only once the node's taint says so: when the taint write fails,
the controller keeps the previous state and timers, so the next tick makes the same
transition again, with its Event and metric, instead of losing them.

Invariants: nothing is written on missing data except the condition saying so; the taint
write carries the node's resourceVersion (a concurrent edit is re-read, never overwritten);
a failed tick is retried at the next one, never fatal; the state in memory never runs ahead
of the node's taint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from vk_provider.controllers.prometheus import SignalUnavailable
from vk_provider.domain import explain
from vk_provider.domain.handoverstep import HandoverView
from vk_provider.domain.overflow import (
    CONDITION,
    Flip,
    OverflowPolicy,
    OverflowState,
    Reading,
    Transition,
    condition_fields,
    held_open,
    needed_free,
    overflow_taints,
    stale,
    state_from_taints,
    step,
)
from vk_provider.domain.podview import rfc3339
from vk_provider.kube.client import ApiError, ConflictError, KubeClient

log = logging.getLogger(__name__)

OVERFLOW_OPENED = "OverflowOpened"
OVERFLOW_CLOSED = "OverflowClosed"
SIGNAL_UNAVAILABLE = "OverflowSignalUnavailable"
SIGNAL_RESTORED = "OverflowSignalRestored"
_TAINT_ATTEMPTS = 5


class Signal(Protocol):
    async def read(self) -> Reading: ...

    async def close(self) -> None: ...


class NodeEvents(Protocol):
    async def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None: ...


class Handover(Protocol):
    def holding_open(self) -> str: ...

    def view(self) -> tuple[HandoverView, ...]: ...


class OverflowObserver(Protocol):
    def overflow_evaluated(self, view: OverflowView) -> None: ...

    def overflow_transition(self, to: OverflowState) -> None: ...


class _NoObserver:
    def overflow_evaluated(self, view: OverflowView) -> None:
        return None

    def overflow_transition(self, to: OverflowState) -> None:
        return None


@dataclass(frozen=True, slots=True)
class OverflowView:
    """The flip as the REST API (``GET /v1/overflow``) and the metrics show it."""

    state: OverflowState
    since: datetime | None  # last transition (from the node condition across restarts)
    signal_ok: bool
    signal_error: str
    reading: Reading | None
    last_evaluation: datetime | None
    needed_free_gpus: int
    full_for_seconds: float | None
    free_for_seconds: float | None
    taint: dict[str, str]
    transitions: int  # made by this agent process
    held_open_for: str = ""  # the hand-over keeping it open, if one does
    handovers: tuple[HandoverView, ...] = ()


class OverflowController:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        signal: Signal,
        policy: OverflowPolicy,
        taint_key: str,
        taint_value: str,
        interval: float,
        events: NodeEvents,
        gpu_requests: Callable[[], Iterable[float]] = list,
        observer: OverflowObserver | None = None,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        node_admin: KubeClient | None = None,
        handover: Handover | None = None,
    ) -> None:
        self._kube = kube
        self._handover = handover
        # The taint is the node object's spec: with a node identity NodeRestriction forbids
        # the node to change it, so it is read and written with the bootstrap credentials.
        self._admin = node_admin or kube
        self._node = node_name
        self._signal = signal
        self._policy = policy
        self._key, self._value = taint_key, taint_value
        self._interval = interval
        self._events = events
        self._gpu_requests = gpu_requests
        self._observer = observer or _NoObserver()
        self._wall = wall_clock
        self._flip: Flip | None = None
        self._since: datetime | None = None
        self._reading: Reading | None = None
        self._error = ""
        self._last: datetime | None = None
        self._needed = 1
        self._transitions = 0
        self._signal_lost_said = False

    # --- what others read ---------------------------------------------------------------

    def view(self) -> OverflowView | None:
        flip = self._flip
        if flip is None:
            return None
        now = self._wall().timestamp()
        return OverflowView(
            state=flip.state,
            since=self._since,
            signal_ok=flip.signal_ok,
            signal_error=self._error,
            reading=self._reading,
            last_evaluation=self._last,
            needed_free_gpus=self._needed,
            full_for_seconds=None if flip.full_since is None else now - flip.full_since,
            free_for_seconds=None if flip.free_since is None else now - flip.free_since,
            taint={
                "key": self._key,
                "value": self._value,
                "effect": "PreferNoSchedule" if flip.state is OverflowState.OPEN else "NoSchedule",
            },
            transitions=self._transitions,
            held_open_for=self._handover.holding_open() if self._handover else "",
            handovers=self._handover.view() if self._handover else (),
        )

    async def close(self) -> None:
        await self._signal.close()

    # --- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except (ApiError, ConflictError) as exc:
                log.warning("overflow: node update failed (%s); retrying next tick", exc)
            except Exception:
                log.exception("overflow: evaluation failed; retrying next tick")
            await asyncio.sleep(self._interval)

    async def tick(self) -> None:
        node = await self._admin.get_node(self._node)
        if node is None:
            return  # not registered yet
        taints: list[dict[str, Any]] = (node.get("spec") or {}).get("taints") or []
        if self._flip is None:
            self._flip = Flip(state_from_taints(taints, key=self._key))
            self._since = _condition_since(node)
            log.info("overflow: starting %s (from the node's taints)", self._flip.state.value)
        now = self._wall()
        reading: Reading | None
        try:
            reading = await self._signal.read()
            self._error = stale(reading, now=now.timestamp(), policy=self._policy) or ""
            if self._error:
                reading = None
        except SignalUnavailable as exc:
            reading, self._error = None, str(exc)
        before = self._flip
        self._needed = needed_free(self._policy, self._gpu_requests())
        after, transition = step(
            before, reading, now=now.timestamp(), policy=self._policy, needed=self._needed
        )
        after, transition = held_open(
            after,
            transition,
            reason=self._handover.holding_open() if self._handover else "",
            now=now.timestamp(),
        )
        if reading is not None:
            self._reading = reading
        self._last = now
        if not await self._assert_taint(node, taints, after.state):
            return  # not committed: the same transition is made again next tick
        self._flip = after
        if transition is not None:
            self._transitions += 1
            self._since = self._last
            log.info("overflow: %s", transition.message)
            self._observer.overflow_transition(transition.to)
        await self._write_condition()
        await self._say(node, transition, before.signal_ok)
        view = self.view()
        if view is not None:
            self._observer.overflow_evaluated(view)

    async def _assert_taint(
        self, node: dict[str, Any], taints: list[dict[str, Any]], state: OverflowState
    ) -> bool:
        """The node's taints as ``state`` wants them; a concurrent edit is re-read (a few
        times). True once the node says ``state``; an API error propagates (not committed)."""
        for _ in range(_TAINT_ATTEMPTS):
            wanted = overflow_taints(taints, state, key=self._key, value=self._value)
            if wanted == taints:
                return True
            version = (node.get("metadata") or {}).get("resourceVersion")
            try:
                await self._admin.patch_node(
                    self._node,
                    {"metadata": {"resourceVersion": version}, "spec": {"taints": wanted}},
                )
                return True
            except ConflictError:
                fresh = await self._admin.get_node(self._node)
                if fresh is None:
                    return False
                node, taints = fresh, (fresh.get("spec") or {}).get("taints") or []
        log.warning("overflow: the node's taints kept changing; asserting them next tick")
        return False

    async def _write_condition(self) -> None:
        assert self._flip is not None
        status, reason, message = condition_fields(self._flip, self._reading, self._error)
        now = rfc3339(self._wall())
        since = rfc3339(self._since) if self._since else now
        condition = {
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": since,
        }
        await self._kube.patch_node_status(self._node, {"conditions": [condition]})

    async def _say(self, node: dict[str, Any], transition: Transition | None, was_ok: bool) -> None:
        assert self._flip is not None
        if transition is not None:
            reason = OVERFLOW_OPENED if transition.to is OverflowState.OPEN else OVERFLOW_CLOSED
            await self._events.record(node, explain.NORMAL, reason, transition.message)
        if not self._flip.signal_ok and not self._signal_lost_said:
            self._signal_lost_said = True
            message = (
                f"the GPU signal cannot be read ({self._error}); keeping the overflow "
                f"{self._flip.state.value} until it can"
            )
            log.warning("overflow: %s", message)
            await self._events.record(node, explain.WARNING, SIGNAL_UNAVAILABLE, message)
        elif self._flip.signal_ok and not was_ok and self._signal_lost_said:
            self._signal_lost_said = False
            log.info("overflow: the GPU signal can be read again")
            await self._events.record(
                node, explain.NORMAL, SIGNAL_RESTORED, "the GPU signal can be read again"
            )


def _condition_since(node: dict[str, Any]) -> datetime | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == CONDITION and condition.get("lastTransitionTime"):
            text = str(condition["lastTransitionTime"]).replace("Z", "+00:00")
            try:
                return datetime.fromisoformat(text)
            except ValueError:
                return None
    return None
