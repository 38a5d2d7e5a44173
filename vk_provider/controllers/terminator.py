"""Ending a pod: stopping its instance, deleting the pod from the API, releasing its budget.

The pod controller's steps that end something (``lifecycle.Step``: ``FAIL_LOST``,
``TERMINATE``, ``AWAIT_TERMINATION``, ``FINISH_DELETION``, ``RELEASE`` and the release after
``COMPLETE``), and what a pod that vanished from the API leaves behind (``forget``). The
controller decides which; ``Terminator`` acts.

Invariants:
- A deleted pod's instance gets the pod's remaining grace period (``terminate``); every other
  stop is immediate (grace 0).
- An instance the provider may already have released is deleted only if the tracker still
  lists it or cannot tell (a stale list): a second delete would drop what the provider
  retains for it (logs, until the pod is deleted).
- A pod is deleted from the API (UID precondition) even when its instance is not confirmed
  gone; the instance, which carries the pod's UID, is then terminated by reconciliation as an
  orphan. A force-deleted pod whose instance could not be stopped stays remembered, and in the
  budget, until it is gone.
- A lost instance's offer is avoided for ``instance_lost_cooldown_seconds``, so the
  replacement does not land in the same hole.
- Budget released is room announced (``room_appeared``): pods waiting for it try again.
- Every retry is the work queue's back-off of the pod's key, capped at ``retry_cap``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.placer import PodMemory
from vk_provider.controllers.podwriter import PodWriter
from vk_provider.controllers.reporter import StatusReporter
from vk_provider.controllers.workqueue import WorkQueue
from vk_provider.domain import explain
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound, ProviderError
from vk_provider.domain.lifecycle import Sighting
from vk_provider.domain.logfields import about
from vk_provider.domain.models import InstanceState
from vk_provider.domain.podview import PodKey, PodView
from vk_provider.settings.agent import IntervalsConfig

log = logging.getLogger(__name__)


class Terminator:
    """Ends pods for the pod controller; shares its memory of pods (``memory``: read by
    ``forget``, and a pod that is gone is dropped from it)."""

    def __init__(
        self,
        *,
        providers: dict[str, Provider],
        tracker: InstanceTracker,
        queue: WorkQueue[PodKey],
        writer: PodWriter,
        reporter: StatusReporter,
        launcher: Launcher,
        memory: dict[PodKey, PodMemory],
        intervals: IntervalsConfig,
        room_appeared: Callable[[str | None], None],
        retry_cap: float,
        now: Callable[[], datetime],
    ) -> None:
        self._providers = providers
        self._tracker = tracker
        self._queue = queue
        self._write = writer
        self._report = reporter
        self._launcher = launcher
        self._ledger = launcher.ledger
        self._memory = memory
        self._intervals = intervals
        self._room_appeared = room_appeared
        self._retry_cap = retry_cap
        self._now = now

    async def fail_lost(self, pod: PodView, why: str) -> None:
        """The provider lost the pod's instance (``why``): the offer is avoided for a
        cool-down, the pod fails (``InstanceLost``) and what it holds is released."""
        placed = pod.placed
        offer_key = placed.offer_key if placed else ""
        cooldown = self._intervals.instance_lost_cooldown_seconds
        if offer_key:
            self._launcher.avoid(offer_key, cooldown)
        event = explain.instance_lost(
            placed.instance_id if placed else "?",
            placed.provider if placed else "?",
            why,
            offer_key=offer_key,
            cooldown=cooldown,
        )
        await self._write.event(pod, event)
        await self._report.lost(pod, event.message)
        await self.release(pod)

    def deletion_poll(self, pod: PodView) -> float:
        # Poll gently: a provider may allow one request a second for all pods together.
        deadline = pod.deletion_deadline
        remaining = (deadline - self._now()).total_seconds() if deadline else 0.0
        return min(1.0, max(remaining, 0.5))

    async def terminate(self, pod: PodView, sighting: Sighting, grace: float) -> None:
        placed = pod.placed
        assert placed is not None  # TERMINATE is only decided for a placed pod
        instance = sighting.instance
        self._report.stopping(pod.uid)
        if instance is None or instance.state is not InstanceState.TERMINATING:
            killing = explain.Event(
                explain.NORMAL, explain.KILLING, f"Stopping container {pod.container_name}"
            )
            await self._write.event(pod, killing)
        try:
            await self._providers[placed.provider].delete(placed.instance_id, grace_seconds=grace)
        except ProviderError as exc:
            log.info(
                "pod %s/%s: stopping its instance failed: %s",
                *pod.key,
                exc,
                extra=about(pod.key, placed.instance_id, placed.provider),
            )
        else:
            # The listed state is stale now: the next look asks the provider how it goes.
            self._tracker.forget(placed.provider, placed.instance_id)
        self._queue.add_after(pod.key, self.deletion_poll(pod))

    async def _stop_leftover(self, provider: str, instance_id: str) -> bool:
        """Ask once more that nothing of the instance stays (it may hold logs or bill)."""
        try:
            await self._providers[provider].delete(instance_id, grace_seconds=0)
        except ProviderError as exc:
            log.warning(
                "terminating instance %s on %s failed: %s",
                instance_id,
                provider,
                exc,
                extra=about(instance=instance_id, provider=provider),
            )
            return False
        return True

    async def finish_deletion(self, pod: PodView, sighting: Sighting) -> None:
        """Release what is left, then delete the pod from the API.

        When the provider cannot confirm the instance is gone (errors, a slow terminate),
        the pod is deleted anyway once overdue and the instance, which still carries the
        pod's UID, is terminated by reconciliation as an orphan.
        """
        placed = pod.placed
        if (
            placed is not None
            and placed.provider in self._providers
            and not await self._stop_leftover(placed.provider, placed.instance_id)
        ):
            log.warning(
                "pod %s/%s: instance not confirmed gone; deleting the pod, "
                "reconciliation terminates the instance",
                *pod.key,
                extra=about(pod.key, placed.instance_id, placed.provider),
            )
        await self._write.delete(pod)
        log.info(
            # An eviction (hand-over, way home, drain) is finished only now, the pod gone.
            "eviction finished: deleted; its instance terminated"
            if pod.evicted
            else "deleted; its instance terminated",
            extra=about(pod.key, placed.instance_id if placed else None),
        )
        self._drop(pod.key, pod.uid, placed.offer_key if placed else None)

    async def release(self, pod: PodView) -> None:
        """A terminal pod keeps no instance running and holds no budget.

        Only an instance the provider may still have is deleted: deleting a released one again
        would also drop what the provider retains for it (logs, until the pod is deleted).
        """
        placed = pod.placed
        if placed is not None and placed.provider in self._providers:
            known = self._tracker.get(placed.provider, placed.instance_id)
            if known is not None or not self._tracker.fresh(placed.provider):
                try:
                    await self._providers[placed.provider].delete(
                        placed.instance_id, grace_seconds=0
                    )
                    log.info(
                        "ended; its instance terminated",
                        extra=about(pod.key, placed.instance_id, placed.provider),
                    )
                    self._tracker.forget(placed.provider, placed.instance_id)
                except NotFound:
                    self._tracker.forget(placed.provider, placed.instance_id)
                except ProviderError as exc:
                    log.info(
                        "pod %s/%s: releasing its instance: %s",
                        *pod.key,
                        exc,
                        extra=about(pod.key, placed.instance_id, placed.provider),
                    )
                    self._queue.add_rate_limited(pod.key, cap=self._retry_cap)
        self._report.forget(pod.uid)
        if self._ledger.forget_estimate(pod.uid):
            self._room_appeared(placed.offer_key if placed else None)

    async def forget(self, key: PodKey) -> None:
        """The pod is gone from the API (e.g. force-deleted): its instance must go too."""
        memory = self._memory.get(key)
        if memory is None:
            self._queue.drop(key)
            return
        if (
            memory.provider in self._providers
            and memory.instance_id
            and not await self._stop_leftover(memory.provider, memory.instance_id)
        ):
            # Still costs money: stays remembered (and in the budget) until it is gone.
            self._queue.add_rate_limited(key, cap=self._retry_cap)
            return
        self._drop(key, memory.uid, memory.offer_key)

    def _drop(self, key: PodKey, uid: str, offer_key: str | None = None) -> None:
        self._memory.pop(key, None)
        self._queue.drop(key)
        self._write.forget_events(uid)
        self._report.forget(uid)
        if self._ledger.forget_estimate(uid):
            self._room_appeared(offer_key)
