"""Placing a pod: the pod controller's one create path, for first launches and relaunches.

``Placer.launch`` reads the pod once into ``(WorkloadSpec, PlacementRequest)`` (fetching the
Secrets and ConfigMaps it references), adopts an instance a crash left behind before it
creates anything (first launches only; reconciliation's choice first), and otherwise asks
the ``Launcher`` — budget reservation, failover, offer blocks, ``Retry-After``. It then writes
what happened: annotations and ``ContainerCreating`` after a launch (a relaunch releases the
exited instance only once the next one exists), Events for every refusal, and a waiting
status with the reason when nothing fits.

Invariants: every retry is the work queue's back-off of the pod's key (``add_rate_limited``);
a pod whose spec can never run (``InvalidSpec``) is not retried until it changes; a launch
clears the key's back-off (``forget``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.launch import Launcher, LaunchResult
from vk_provider.controllers.observer import ControllerObserver
from vk_provider.controllers.offers import RECHECK_SECONDS, OfferBook
from vk_provider.controllers.podwriter import PodWriter
from vk_provider.controllers.reporter import StatusReporter
from vk_provider.controllers.workqueue import WorkQueue
from vk_provider.domain import explain
from vk_provider.domain.contract import Provider
from vk_provider.domain.env import references
from vk_provider.domain.errors import CapacityUnavailable, ProviderError
from vk_provider.domain.lifecycle import start_poll_delay
from vk_provider.domain.logfields import about
from vk_provider.domain.models import Instance
from vk_provider.domain.placement import PlacementRequest
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.podstatus import container_view, terminated_of, waiting_view
from vk_provider.domain.podview import JSON, PodKey, PodView, Waiting
from vk_provider.domain.reconcile import choose_adoptee
from vk_provider.domain.workload import Translation, to_request
from vk_provider.kube.client import ForbiddenError, KubeClient
from vk_provider.settings.agent import IntervalsConfig

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PodMemory:
    """What the controller remembers of one pod between syncs (a cache: the pod and the
    providers hold the truth)."""

    uid: str
    provider: str | None = None  # the last instance the pod named, to stop it if the pod
    instance_id: str | None = None  # is force-deleted behind our back
    offer_key: str | None = None
    adopt: Instance | None = None  # reconciliation's choice among the pod's unclaimed instances
    prefer: str | None = None  # offer to try first after a 429 / 5xx
    waiting: bool = False  # unplaceable: kicked when room appears
    # The exited instance deleted so that its relaunch fits the budget: the pod still names
    # it, and it is still what the pod's container did last.
    released_for_relaunch: Instance | None = None
    explanation: str = ""  # why it was placed where it is (kept on the pod)
    unplaceable_since: datetime | None = None  # first failed placement of this pod, since
    pending_polls: int = 0  # status polls since the launch that found the instance pending

    def next_start_poll(self, intervals: IntervalsConfig) -> float:
        """The delay of the next status poll of a pending instance (and count this one)."""
        delay = start_poll_delay(
            intervals.pod_start_poll_seconds, intervals.pod_status_seconds, self.pending_polls
        )
        self.pending_polls += 1
        return delay


class Placer:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        host_ip: str,
        providers: Mapping[str, Provider],
        offers: OfferBook,
        launcher: Launcher,
        tracker: InstanceTracker,
        queue: WorkQueue[PodKey],
        writer: PodWriter,
        reporter: StatusReporter,
        intervals: IntervalsConfig,
        observer: ControllerObserver,
        now: Callable[[], datetime],
    ) -> None:
        self._report = reporter
        self._kube = kube
        self._node = node_name
        self._host_ip = host_ip
        self._providers = providers
        self._offers = offers
        self._launcher = launcher
        self._tracker = tracker
        self._queue = queue
        self._write = writer
        self._intervals = intervals
        self._observer = observer
        self._now = now

    async def launch(
        self, pod: PodView, memory: PodMemory, *, attempt: int, previous: Instance | None
    ) -> None:
        """A first launch (``previous`` None) or a relaunch after ``previous`` exited."""
        key = pod.key
        try:
            translation = await self._translate(pod, attempt)
        except InvalidPodSpec as exc:
            if exc.retryable:  # a referenced Secret or ConfigMap may still appear
                await self._write.event(pod, explain.config_error(exc))
                await self._write.status(pod, waiting_view(pod, explain.FAILED_CONFIG, str(exc)))
                self._queue.add_rate_limited(key, cap=self._intervals.retry_backoff_max_seconds)
                return
            await self.invalid(pod, exc.field, str(exc))
            return
        spec, request = translation.spec, translation.request
        for skipped in translation.skipped:
            await self._write.event(pod, explain.skipped_reference(skipped))
        if not request.shape.single:
            allowed = [
                name
                for name in self._launcher.capabilities
                if not request.providers or name in request.providers
            ]
            if allowed and not any(
                request.shape.runs_on(self._launcher.capabilities[name]) for name in allowed
            ):
                event = explain.shape_unsupported(request, allowed)
                await self.invalid(pod, request.shape.field, event.message)
                return
        # The ledger counts what the providers bill once each was listed: no create before.
        await self._tracker.polled.wait()
        if previous is None and await self._adopt_existing(pod, memory):
            return
        # A pod waiting for capacity is retried against fresh offers, not the TTL's.
        offers = await self._offers.index(max_age=RECHECK_SECONDS if memory.waiting else None)
        result = await self._launcher.launch(
            spec,
            request,
            offers,
            prefer=memory.prefer or (previous.offer_key if previous else None),
            # A first attempt avoids offers that lost an instance lately; retries may use them.
            allow_avoided=previous is not None or self._queue.failures(key) > 0,
        )
        self._count(result)
        if any(isinstance(a.error, CapacityUnavailable) for a in result.attempts):
            self._offers.invalidate()  # the cached availability was wrong: ask again next time
        for failed in result.attempts:
            await self._write.event(pod, explain.create_failed(failed.offer, failed.error))
        if result.instance is not None and result.offer is not None:
            memory.prefer, memory.waiting = None, False
            self._queue.forget(key)
            if previous is None or previous.offer_key != result.offer.key:
                refused = [(a.offer, a.error) for a in result.attempts]
                selected = explain.provider_selected(
                    result.offer,
                    result.placement,
                    refused,
                    offers_seen=len(offers),
                    shape=request.shape.describe(),
                )
                await self._write.event(pod, selected)
                memory.explanation = selected.message
            await self._placed(pod, memory, result, previous)
            instance = result.instance
            log.info(
                "placed on %s at $%.4f/h%s",
                result.offer.key,
                result.offer.price_per_hour,
                "" if previous is None else " (relaunch)",
                extra=about(pod.key, instance.instance_id, instance.provider),
            )
        elif result.invalid is not None:
            # The provider refused the container as specified: the runtime's answer.
            await self.invalid(
                pod, result.invalid.field, str(result.invalid), waiting=explain.FAILED_CREATE
            )
        elif result.retry_after is not None:
            # 429 / 5xx: the same candidate again, after Retry-After or our back-off.
            memory.prefer = result.attempts[-1].offer.key if result.attempts else None
            self._queue.add_rate_limited(
                key, at_least=result.retry_after, cap=self._intervals.retry_backoff_max_seconds
            )
        else:
            await self._unplaceable(pod, memory, result, request, previous)

    async def invalid(
        self, pod: PodView, field: str, message: str, *, waiting: str = explain.INVALID_SPEC
    ) -> None:
        """The pod asks for what no provider can ever run: say so; not retried until it
        changes. ``waiting`` is the container's waiting reason: ``InvalidSpec``, or the
        runtime's ``CreateContainerError`` when a provider refused the container at create."""
        event = explain.invalid_spec(field, message)
        log.warning("cannot run: %s", event.message, extra=about(pod.key))
        await self._write.event(pod, event)
        view = waiting_view(pod, waiting, event.message)
        phase = "Failed" if pod.restart_policy == "Never" else None
        await self._write.status(
            pod, view, phase=phase, reason=explain.INVALID_SPEC, message=event.message
        )

    async def _translate(self, pod: PodView, attempt: int) -> Translation:
        refs = references(pod.raw)
        secrets: dict[str, JSON] = {}
        config_maps: dict[str, JSON] = {}
        for kind, names, read, into in (
            ("Secret", refs.secrets, self._kube.get_secret, secrets),
            ("ConfigMap", refs.config_maps, self._kube.get_config_map, config_maps),
        ):
            for name in sorted(names):
                try:
                    found = await read(pod.namespace, name)
                except ForbiddenError as exc:
                    # Confined RBAC (the chart's rbac.secretNamespaces): retried, as a
                    # missing object is, in case the operator widens the role.
                    raise InvalidPodSpec(
                        f"{kind} {name!r}",
                        f"the agent may not read it in namespace {pod.namespace!r} ({exc}); "
                        "grant it get on secrets and configmaps there",
                        retryable=True,
                    ) from exc
                if found is not None:
                    into[name] = found
        return to_request(
            pod.raw,
            secrets=secrets,
            config_maps=config_maps,
            node_name=self._node,
            host_ip=self._host_ip,
            attempt=attempt,
        )

    def _count(self, result: LaunchResult) -> None:
        for attempt in result.attempts:
            self._observer.launch_failed(attempt.offer.provider, type(attempt.error).__name__)
        if result.launched:
            outcome = "launched"
        elif result.invalid is not None:
            outcome = "invalid"
        elif result.retry_after is not None:
            outcome = "retry"
        elif result.budget_limited:
            outcome = "budget_exceeded"
        else:
            outcome = "no_capacity"
        self._observer.placement(outcome)

    async def _adopt_existing(self, pod: PodView, memory: PodMemory) -> bool:
        """After a crash, an instance of this pod may exist that the pod does not name yet:
        adopt it (reconciliation's choice when it made one) rather than create a duplicate."""
        await self._tracker.polled.wait()
        listed = self._tracker.for_pod(pod.uid)
        chosen, memory.adopt = memory.adopt, None
        if chosen is None or all(i.instance_id != chosen.instance_id for i in listed):
            chosen = choose_adoptee(listed)
        if chosen is None:
            return False
        if not self._launcher.ledger.within_caps(pod.namespace):
            await self._refuse_adoption(pod, chosen)
            return True
        log.info(
            "adopting the instance a previous run launched",
            extra=about(pod.key, chosen.instance_id, chosen.provider),
        )
        memory.explanation = "adopted an instance a previous run of the agent had launched"
        self._record_placed(pod, memory, chosen, chosen.offer_key, chosen.price_per_hour)
        await self._report.placed(pod, chosen)
        self._queue.add(pod.key)
        return True

    async def _refuse_adoption(self, pod: PodView, instance: Instance) -> None:
        """The instance a previous run left for this pod would break a budget cap (the
        ledger counts it already: it is billed): terminate it and say why; the pod waits for
        budget like any other (the ledger frees the room once the provider lists it gone)."""
        message = (
            f"not adopting instance {instance.instance_id} on {instance.provider} "
            f"(${instance.price_per_hour:.2f}/h): with it the spend would exceed a budget cap; "
            "terminating it"
        )
        log.warning("pod %s/%s: %s", *pod.key, message, extra=about(pod.key, instance.instance_id))
        await self._write.event(
            pod, explain.Event(explain.WARNING, explain.BUDGET_EXCEEDED, message)
        )
        await self._write.status(pod, waiting_view(pod, explain.WAITING_FOR_BUDGET, message))
        try:
            await self._providers[instance.provider].delete(instance.instance_id, grace_seconds=0)
        except ProviderError as exc:  # reconciliation terminates it as an orphan meanwhile
            log.info(
                "terminating %s (not adopted) failed: %s",
                instance.instance_id,
                exc,
                extra=about(pod.key, instance.instance_id, instance.provider),
            )
        self._tracker.forget(instance.provider, instance.instance_id)
        self._queue.add_rate_limited(pod.key, cap=self._intervals.retry_backoff_max_seconds)

    def _record_placed(
        self, pod: PodView, memory: PodMemory, instance: Instance, offer_key: str, price: float
    ) -> None:
        """Remember where the pod runs and stage it for the pod's next status write."""
        self._write.place(
            pod, instance, offer_key=offer_key, price=price, explanation=memory.explanation
        )
        memory.provider, memory.instance_id = instance.provider, instance.instance_id
        memory.offer_key = offer_key
        self._tracker.remember(instance)

    async def _placed(
        self, pod: PodView, memory: PodMemory, result: LaunchResult, previous: Instance | None
    ) -> None:
        """Record a launch on the pod (one write: where it runs and its status); a relaunch
        then releases the exited instance.

        The exited instance is released only once the next one exists, so a failed create
        leaves the pod naming an instance that exists.
        """
        instance, offer = result.instance, result.offer
        assert instance is not None and offer is not None
        memory.unplaceable_since = None
        memory.released_for_relaunch = None
        self._record_placed(pod, memory, instance, offer.key, offer.price_per_hour)
        if previous is None:
            await self._report.placed(pod, instance)
        else:
            view = container_view(
                pod,
                Waiting("ContainerCreating"),
                instance_id=instance.instance_id,
                last=terminated_of(previous, now=self._now()),
                restarts=pod.status.restart_count + 1,
            )
            await self._write.status(pod, view)
        if previous is not None and previous.instance_id != instance.instance_id:
            try:
                await self._providers[previous.provider].delete(
                    previous.instance_id, grace_seconds=0
                )
            except ProviderError as exc:  # reconciliation removes it as an old attempt
                log.info(
                    "releasing %s after a relaunch failed: %s",
                    previous.instance_id,
                    exc,
                    extra=about(pod.key, previous.instance_id, previous.provider),
                )
        memory.pending_polls = 0
        self._queue.add_after(pod.key, memory.next_start_poll(self._intervals))

    async def _unplaceable(
        self,
        pod: PodView,
        memory: PodMemory,
        result: LaunchResult,
        request: PlacementRequest,
        previous: Instance | None,
    ) -> None:
        memory.waiting = True
        # The exited instance still counts (its provider bills it until it is gone): release
        # it now, so the relaunch fits once the provider lists it gone.
        if (
            previous is not None
            and result.budget_limited
            and memory.released_for_relaunch is None
            and await self._release_exited(previous)
        ):
            memory.released_for_relaunch = previous
        now = self._now()
        since = memory.unplaceable_since = memory.unplaceable_since or now
        limit = self._intervals.unplaceable_fail_seconds
        if pod.controlled and limit is not None and (now - since).total_seconds() >= limit:
            await self._nowhere_to_go(pod, result, limit)
            return
        delay = self._queue.add_rate_limited(pod.key, cap=self._intervals.retry_backoff_max_seconds)
        event = explain.unplaceable(
            request,
            result.placement,
            budget_limited=result.budget_limited,
            failed_launches=len(result.attempts),
            retry_in=delay,
        )
        await self._write.event(pod, event)
        if previous is None:
            reason = (
                explain.WAITING_FOR_BUDGET
                if result.budget_limited
                else explain.WAITING_FOR_CAPACITY
            )
            await self._write.status(pod, waiting_view(pod, reason, event.message))
            return
        view = container_view(
            pod,
            Waiting("CrashLoopBackOff", event.message),
            instance_id=previous.instance_id,
            last=terminated_of(previous, now=self._now()),
        )
        await self._write.status(pod, view)

    async def _release_exited(self, previous: Instance) -> bool:
        try:
            await self._providers[previous.provider].delete(previous.instance_id, grace_seconds=0)
        except ProviderError as exc:  # retried with the next relaunch attempt
            log.info(
                "releasing exited %s for its relaunch failed: %s",
                previous.instance_id,
                exc,
                extra=about(instance=previous.instance_id, provider=previous.provider),
            )
            return False
        return True

    async def _nowhere_to_go(self, pod: PodView, result: LaunchResult, limit: float) -> None:
        """No provider could run a controlled pod for ``limit`` seconds: Failed (NoCapacity),
        so its controller makes a new pod and the scheduler chooses a node again."""
        message = (
            f"no provider could run this pod for {limit:.0f}s "
            f"(offers removed {result.placement.explain()}); failing it so that its controller "
            "recreates it and the scheduler chooses again"
        )
        event = explain.Event(explain.WARNING, explain.NO_CAPACITY, message)
        await self._write.event(pod, event)
        view = waiting_view(pod, explain.NO_CAPACITY, message)
        await self._write.status(
            pod, view, phase="Failed", reason=explain.NO_CAPACITY, message=message
        )
