"""The pod controller: an executor of the pure lifecycle's steps, one pod at a time.

Shape (as virtual-kubelet's ``node/`` and kopf's per-object queues): the pod watch
(``podwatch``) keeps the node's pods in a store and queues the key of every pod that changed;
the instance tracker queues the pods whose instance changed. Workers take keys from the
``WorkQueue`` (one worker per pod at a time, bounded concurrency) and ``sync`` each: parse the
stored pod once (``PodView``), look at the instance it names, ask ``lifecycle.decide`` for the
next step and execute it. Deciding is pure and tested edge by edge; this module only acts.

Invariants:
- Everything needed to resume after a restart is in the pod (annotations, status) and at the
  provider (instances carry the pod UID); what this controller keeps in memory is a cache.
- Every create goes through the ``Launcher`` (first launch and relaunch alike): budget
  reservation, failover, offer blocks, ``Retry-After``.
- Every back-off is the work queue's, per pod key (``add_rate_limited`` / ``forget``).
- A pod with a ``deletionTimestamp`` is deleted from the API (grace 0, UID precondition) as
  soon as its instance is gone, and at the latest ``deletion_slack_seconds`` after its grace
  period; the instance gets the pod's remaining grace period.
- Provider-side failure makes the pod ``Failed`` (reason ``InstanceLost``) and avoids the
  offer for a cool-down so the replacement does not land in the same hole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.launch import Launcher, LaunchResult
from vk_provider.controllers.observer import NO_OBSERVER, ControllerObserver
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.podwatch import PodStore
from vk_provider.controllers.workqueue import Backoff, QueueClosed, WorkQueue
from vk_provider.domain import explain
from vk_provider.domain.contract import Provider
from vk_provider.domain.env import references
from vk_provider.domain.errors import NotFound, ProviderError
from vk_provider.domain.lifecycle import (
    MAX_CRASH_BACKOFF_SECONDS,
    MISSING,
    NOT_PLACED,
    UNREACHABLE,
    Decision,
    Sighting,
    Step,
    crash_backoff,
    decide,
)
from vk_provider.domain.models import Instance, InstanceState, WorkloadSpec
from vk_provider.domain.placement import PlacementRequest
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.podstatus import ContainerView, pod_status, status_changed, waiting_view
from vk_provider.domain.podview import (
    ANN_INSTANCE,
    ANN_OFFER,
    ANN_PRICE,
    ANN_PROVIDER,
    JSON,
    PodKey,
    PodPlacement,
    PodView,
    Running,
    Terminated,
    Waiting,
)
from vk_provider.domain.reconcile import choose_adoptee
from vk_provider.domain.workload import Held, held_resources, to_request
from vk_provider.kube.client import ApiError, ConflictError, KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.settings.agent import IntervalsConfig

log = logging.getLogger(__name__)

# A sync that failed (a provider's 429/5xx, an API hiccup) is retried soon: the failure says
# nothing about how long to wait, and a deleting pod must not sit out a long back-off.
SYNC_ERROR_CAP_SECONDS = 10.0


def _wall_clock() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Memory:
    """What the controller remembers of one pod between syncs (a cache, see the invariants)."""

    uid: str
    provider: str | None = None  # the last instance the pod named, to stop it if the pod
    instance_id: str | None = None  # is force-deleted behind our back
    offer_key: str | None = None
    adopt: Instance | None = None  # reconciliation's choice among the pod's unclaimed instances
    prefer: str | None = None  # offer to try first after a 429 / 5xx
    waiting: bool = False  # unplaceable: kicked when room appears


class PodController:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        host_ip: str,
        providers: Mapping[str, Provider],
        offers: OfferBook,
        recorder: EventRecorder,
        launcher: Launcher,
        store: PodStore,
        intervals: IntervalsConfig,
        workers: int,
        observer: ControllerObserver = NO_OBSERVER,
        now: Callable[[], datetime] = _wall_clock,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._host_ip = host_ip
        self._providers = dict(providers)
        self._offers = offers
        self._events = recorder
        self._launcher = launcher
        self._ledger = launcher.ledger
        self._store = store
        self._intervals = intervals
        self._workers = workers
        self._observer = observer
        self._now = now
        # One back-off per pod key: placement retries double from retry_backoff_seconds.
        self.queue: WorkQueue[PodKey] = WorkQueue(
            Backoff(base=intervals.retry_backoff_seconds, cap=MAX_CRASH_BACKOFF_SECONDS)
        )
        self.tracker = InstanceTracker(self._providers, on_change=self._instance_changed)
        self._memory: dict[PodKey, _Memory] = {}

    # ------------------------------------------------------------------ feeding the queue

    def pod_changed(self, key: PodKey) -> None:
        """The watch saw ``key`` change (or go): account for it, then sync it."""
        raw = self._store.get(key)
        if raw is not None:
            self._account(PodView.parse(raw))
        self.queue.add(key)

    def _instance_changed(self, pod_uid: str) -> None:
        key = self._store.key_of(pod_uid)
        if key is not None:
            self.queue.add(key)

    def adopt(self, key: PodKey, instance: Instance) -> None:
        """Reconciliation chose ``instance`` for the unplaced pod ``key``: apply exactly it."""
        memory = self._memory.get(key)
        if memory is not None:
            memory.adopt = instance
        self.queue.add(key)

    def _account(self, pod: PodView) -> None:
        """Keep the budget ledger equal to what the pods' annotations say runs.

        Called for every observed pod, so after a restart the ledger is rebuilt from the
        API before any new placement can be made against it.
        """
        if pod.terminal:
            if self._ledger.release(pod.uid):
                self._room_appeared(pod.placed.offer_key if pod.placed else None)
            return
        placed = pod.placed
        if placed is not None and placed.price_per_hour is not None:
            self._ledger.commit(
                pod.uid,
                namespace=pod.namespace,
                provider=placed.provider,
                price=placed.price_per_hour,
            )

    def _room_appeared(self, offer_key: str | None = None) -> None:
        """An instance ended or a pod left: pods waiting for capacity or budget try again.

        When the instance's offer is known, its "no capacity" block is lifted and the offer
        cache refreshed, so the freed slot is seen at once rather than after the cache's TTL.
        """
        if offer_key:
            self._launcher.capacity_freed(offer_key)
            self._offers.invalidate()
        for key, memory in self._memory.items():
            if memory.waiting:
                memory.waiting = False
                self.queue.forget(key)
                self.queue.add(key)

    # ------------------------------------------------------------------ views for others

    def placements(self) -> list[PodPlacement]:
        placed = (PodPlacement.of(PodView.parse(pod)) for pod in self._store.values())
        return [p for p in placed if p is not None]

    def held_resources(self) -> tuple[float, float, float]:
        """GPUs, vCPUs and GiB requested by the node's live, placed pods (node capacity)."""
        total = Held()
        for raw in self._store.values():
            pod = PodView.parse(raw)
            if pod.terminal or pod.placed is None:
                continue
            held = held_resources(raw)
            total = Held(
                total.gpus + held.gpus, total.cpu + held.cpu, total.memory_gib + held.memory_gib
            )
        return total.gpus, total.cpu, total.memory_gib

    # ------------------------------------------------------------------ workers

    async def run_workers(self) -> None:
        await asyncio.gather(*(self._worker() for _ in range(self._workers)))

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueClosed:
                return
            try:
                await self.sync(key)
            except ConflictError:
                self.queue.add_after(key, 0.2)  # someone wrote the pod meanwhile: re-read
            except (ProviderError, ApiError) as exc:
                delay = self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
                log.warning("sync of pod %s/%s: %s; retrying in %.1fs", *key, exc, delay)
            except Exception:
                log.exception("sync of pod %s/%s failed; retrying", *key)
                self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
            finally:
                self.queue.done(key)

    # ------------------------------------------------------------------ the sync

    async def sync(self, key: PodKey) -> None:
        raw = self._store.get(key)
        if raw is None:
            await self._forget(key)
            return
        pod = PodView.parse(raw)
        memory = self._remember(pod)
        sighting = await self._sight(pod)
        now = self._now()
        held = self.queue.held_for(key)
        decision = decide(
            pod,
            sighting,
            now=now,
            hold_until=now + timedelta(seconds=held) if held else None,
            restart_backoff=self._intervals.restart_backoff_seconds,
            deletion_slack=self._intervals.deletion_slack_seconds,
        )
        await self._execute(pod, memory, sighting, decision)

    def _remember(self, pod: PodView) -> _Memory:
        memory = self._memory.get(pod.key)
        if memory is None or memory.uid != pod.uid:
            memory = self._memory[pod.key] = _Memory(uid=pod.uid)
        if pod.placed is not None:
            memory.provider, memory.instance_id = pod.placed.provider, pod.placed.instance_id
            memory.offer_key = pod.placed.offer_key
        return memory

    async def _sight(self, pod: PodView) -> Sighting:
        placed = pod.placed
        if placed is None or placed.provider not in self._providers:
            return NOT_PLACED
        cached = self.tracker.get(placed.provider, placed.instance_id)
        if self.tracker.fresh(placed.provider):
            if cached is None and pod.terminal:
                return MISSING  # released already: a fresh list does not have it
            if cached is not None and not pod.terminal:
                return Sighting.of(cached)
        # Otherwise ask: a new instance may not be listed yet, and an ended pod's instance
        # is released at most once (a second delete would drop the logs it retains).
        try:
            instance = await self._providers[placed.provider].get(placed.instance_id)
        except NotFound:
            return MISSING
        except ProviderError as exc:
            log.info("pod %s/%s: cannot read its instance: %s", *pod.key, exc)
            return UNREACHABLE
        self.tracker.remember(instance)
        return Sighting.of(instance)

    async def _execute(
        self, pod: PodView, memory: _Memory, sighting: Sighting, decision: Decision
    ) -> None:
        step, key, instance = decision.step, pod.key, sighting.instance
        if step is Step.PLACE:
            await self._launch(pod, memory, attempt=pod.status.restart_count, previous=None)
        elif step is Step.RELAUNCH:
            assert instance is not None
            await self._launch(pod, memory, attempt=decision.attempt, previous=instance)
        elif step is Step.WAIT:
            self.queue.add_after(key, decision.wait_seconds)
        elif step is Step.RETRY:
            self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
        elif step is Step.SHOW_PENDING:
            assert instance is not None
            await self._show(pod, instance, Waiting("ContainerCreating", instance.message))
            self.queue.add_after(key, self._intervals.pod_status_seconds)
        elif step is Step.SHOW_RUNNING:
            assert instance is not None
            await self._show_running(pod, instance)
        elif step is Step.FAIL_LOST:
            why = "the provider no longer knows it"
            if instance is not None:
                why = instance.message or instance.state.value
            await self._fail_lost(pod, why)
        elif step is Step.COMPLETE:
            assert instance is not None
            await self._complete(pod, instance)
        elif step is Step.BACK_OFF:
            assert instance is not None
            await self._back_off(pod, instance, decision.wait_seconds)
        elif step is Step.TERMINATE:
            await self._terminate(pod, sighting, decision.grace_seconds)
        elif step is Step.AWAIT_TERMINATION:
            self.queue.add_after(key, self._deletion_poll(pod))
        elif step is Step.FINISH_DELETION:
            await self._finish_deletion(pod, sighting)
        elif step is Step.RELEASE:
            await self._release(pod)
        elif self._ledger.release(pod.uid):  # Step.NOTHING: only the budget may be left
            self._room_appeared(pod.placed.offer_key if pod.placed else None)

    # ------------------------------------------------------------------ status

    def _container_id(self, instance_id: str) -> str:
        return f"vk-provider://{instance_id}"

    async def _write_status(
        self,
        pod: PodView,
        view: ContainerView,
        *,
        pod_ip: str | None = None,
        phase: str | None = None,
        reason: str = "",
        message: str = "",
    ) -> None:
        wanted = pod_status(
            pod,
            view,
            now=self._now(),
            host_ip=self._host_ip,
            pod_ip=pod_ip,
            phase=phase,
            reason=reason,
            message=message,
        )
        if status_changed(pod.raw.get("status") or {}, wanted):
            updated = await self._kube.patch_pod_status(pod.namespace, pod.name, wanted)
            self._store.update(updated)

    async def _record(self, pod: PodView, event: explain.Event) -> None:
        await self._events.record(pod.raw, event.kind, event.reason, event.message)

    async def _show(self, pod: PodView, instance: Instance, state: Waiting) -> None:
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            state,
            self._container_id(instance.instance_id),
            pod.status.last_termination,
            pod.status.restart_count,
        )
        await self._write_status(pod, view)

    async def _show_running(self, pod: PodView, instance: Instance) -> None:
        recorded = pod.status.running_since
        # Some providers do not say when the container started: keep what we wrote first.
        started = instance.started_at or recorded or self._now()
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            Running(started),
            self._container_id(instance.instance_id),
            pod.status.last_termination,
            pod.status.restart_count,
        )
        await self._write_status(pod, view, pod_ip=instance.ip)
        if recorded is None:
            event = explain.Event(
                explain.NORMAL, explain.STARTED, f"Started container {pod.container_name}"
            )
            await self._record(pod, event)
        self.queue.add_after(pod.key, self._intervals.pod_status_seconds * 5)

    async def _fail_lost(self, pod: PodView, why: str) -> None:
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
        await self._record(pod, event)
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            Terminated(
                exit_code=137,
                reason="InstanceLost",
                started_at=pod.status.running_since,
                finished_at=self._now(),
                message=event.message,
            ),
            pod.status.container_id,
            pod.status.last_termination,
            pod.status.restart_count,
        )
        await self._write_status(
            pod, view, phase="Failed", reason="InstanceLost", message=event.message
        )
        await self._release(pod)

    def _terminated(self, instance: Instance) -> Terminated:
        code = instance.exit_code if instance.exit_code is not None else 1
        return Terminated(
            exit_code=code,
            reason="Completed" if code == 0 else "Error",
            started_at=instance.started_at,
            finished_at=instance.finished_at or self._now(),
        )

    async def _complete(self, pod: PodView, instance: Instance) -> None:
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            self._terminated(instance),
            self._container_id(instance.instance_id),
            pod.status.last_termination,
            pod.status.restart_count,
        )
        await self._write_status(pod, view, pod_ip=instance.ip)
        await self._release(pod)

    async def _back_off(self, pod: PodView, instance: Instance, wait: float) -> None:
        delay = crash_backoff(self._intervals.restart_backoff_seconds, pod.status.restart_count)
        event = explain.crash_loop(pod.container_name, pod.name, delay)
        if pod.status.waiting_reason != "CrashLoopBackOff":
            await self._record(pod, event)
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            Waiting("CrashLoopBackOff", event.message),
            self._container_id(instance.instance_id),
            self._terminated(instance),
            pod.status.restart_count,
        )
        await self._write_status(pod, view)
        self.queue.add_after(pod.key, wait)

    # ------------------------------------------------------------------ placement and create

    async def _translate(self, pod: PodView, attempt: int) -> tuple[WorkloadSpec, PlacementRequest]:
        refs = references(pod.raw)
        secrets: dict[str, JSON] = {}
        config_maps: dict[str, JSON] = {}
        for name in sorted(refs.secrets):
            found = await self._kube.get_secret(pod.namespace, name)
            if found is not None:
                secrets[name] = found
        for name in sorted(refs.config_maps):
            found = await self._kube.get_config_map(pod.namespace, name)
            if found is not None:
                config_maps[name] = found
        return to_request(
            pod.raw,
            secrets=secrets,
            config_maps=config_maps,
            node_name=self._node,
            host_ip=self._host_ip,
            attempt=attempt,
        )

    async def _launch(
        self, pod: PodView, memory: _Memory, *, attempt: int, previous: Instance | None
    ) -> None:
        """The one create path: a first launch (``previous`` None) or a relaunch."""
        key = pod.key
        try:
            spec, request = await self._translate(pod, attempt)
        except InvalidPodSpec as exc:
            if exc.retryable:
                event = explain.Event(explain.WARNING, explain.FAILED_CONFIG, str(exc))
                await self._record(pod, event)
                await self._write_status(pod, waiting_view(pod, explain.FAILED_CONFIG, str(exc)))
                self.queue.add_rate_limited(key, cap=self._intervals.retry_backoff_max_seconds)
                return
            await self._invalid(pod, exc.field, str(exc))
            return
        if previous is None and await self._adopt_existing(pod, memory):
            return
        offers = await self._offers.offers()
        prefer = memory.prefer or (previous.offer_key if previous else None)
        result = await self._launcher.launch(
            spec,
            request,
            offers,
            prefer=prefer,
            # A first attempt avoids offers that lost an instance lately; retries may use them.
            allow_avoided=previous is not None or self.queue.failures(key) > 0,
        )
        self._count(result)
        for attempt_failed in result.attempts:
            await self._record(
                pod, explain.create_failed(attempt_failed.offer, attempt_failed.error)
            )
        if result.instance is not None and result.offer is not None:
            memory.prefer, memory.waiting = None, False
            self.queue.forget(key)
            if previous is None or previous.offer_key != result.offer.key:
                failed = [(a.offer, a.error) for a in result.attempts]
                await self._record(
                    pod,
                    explain.provider_selected(
                        result.offer, result.placement, failed, offers_seen=len(offers)
                    ),
                )
            await self._placed(pod, memory, result, previous)
            return
        if result.invalid is not None:
            await self._invalid(pod, result.invalid.field, str(result.invalid))
            return
        if result.retry_after is not None:
            # 429 / 5xx: the same candidate again, after Retry-After or our back-off.
            memory.prefer = result.attempts[-1].offer.key if result.attempts else None
            self.queue.add_rate_limited(
                key, at_least=result.retry_after, cap=self._intervals.retry_backoff_max_seconds
            )
            return
        await self._unplaceable(pod, memory, result, request, previous)

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

    async def _adopt_existing(self, pod: PodView, memory: _Memory) -> bool:
        """After a crash, an instance of this pod may exist that the pod does not name yet:
        adopt it (reconciliation's choice when it made one) rather than create a duplicate."""
        await self.tracker.polled.wait()
        listed = self.tracker.for_pod(pod.uid)
        chosen, memory.adopt = memory.adopt, None
        if chosen is None or all(i.instance_id != chosen.instance_id for i in listed):
            chosen = choose_adoptee(listed)
        if chosen is None:
            return False
        log.info("adopting instance %s of pod %s/%s", chosen.instance_id, *pod.key)
        await self._annotate(
            pod, memory, chosen, offer_key=chosen.offer_key, price=chosen.price_per_hour
        )
        self.queue.add(pod.key)
        return True

    async def _annotate(
        self, pod: PodView, memory: _Memory, instance: Instance, *, offer_key: str, price: float
    ) -> JSON:
        updated = await self._kube.patch_pod_annotations(
            pod.namespace,
            pod.name,
            {
                ANN_PROVIDER: instance.provider,
                ANN_INSTANCE: instance.instance_id,
                ANN_OFFER: offer_key,
                ANN_PRICE: f"{price:.4f}",
            },
            uid=pod.uid,
        )
        self._store.update(updated)
        memory.provider, memory.instance_id = instance.provider, instance.instance_id
        self.tracker.remember(instance)
        return updated

    async def _placed(
        self,
        pod: PodView,
        memory: _Memory,
        result: LaunchResult,
        previous: Instance | None,
    ) -> None:
        """Record a launch on the pod; a relaunch then releases the exited instance.

        The exited instance is released only once the next one exists, so a failed create
        leaves the pod naming an instance that exists.
        """
        instance, offer = result.instance, result.offer
        assert instance is not None and offer is not None
        updated = PodView.parse(
            await self._annotate(
                pod, memory, instance, offer_key=offer.key, price=offer.price_per_hour
            )
        )
        if previous is not None and previous.instance_id != instance.instance_id:
            try:
                await self._providers[previous.provider].delete(
                    previous.instance_id, grace_seconds=0
                )
            except ProviderError as exc:  # reconciliation removes it as an old attempt
                log.info("releasing %s after a relaunch failed: %s", previous.instance_id, exc)
        view = ContainerView(
            updated.container_name,
            updated.container_image,
            Waiting("ContainerCreating"),
            self._container_id(instance.instance_id),
            self._terminated(previous) if previous is not None else None,
            updated.status.restart_count + (1 if previous is not None else 0),
        )
        await self._write_status(updated, view)
        self.queue.add_after(pod.key, self._intervals.pod_status_seconds)

    async def _unplaceable(
        self,
        pod: PodView,
        memory: _Memory,
        result: LaunchResult,
        request: PlacementRequest,
        previous: Instance | None,
    ) -> None:
        memory.waiting = True
        delay = self.queue.add_rate_limited(pod.key, cap=self._intervals.retry_backoff_max_seconds)
        event = explain.unplaceable(
            request,
            result.placement,
            budget_limited=result.budget_limited,
            failed_launches=len(result.attempts),
            retry_in=delay,
        )
        await self._record(pod, event)
        if previous is None:
            await self._write_status(pod, waiting_view(pod, "ContainerCreating", event.message))
            return
        view = ContainerView(
            pod.container_name,
            pod.container_image,
            Waiting("CrashLoopBackOff", event.message),
            self._container_id(previous.instance_id),
            self._terminated(previous),
            pod.status.restart_count,
        )
        await self._write_status(pod, view)

    async def _invalid(self, pod: PodView, field: str, message: str) -> None:
        event = explain.invalid_spec(field, message)
        await self._record(pod, event)
        view = waiting_view(pod, explain.INVALID_SPEC, event.message)
        if pod.restart_policy == "Never":
            await self._write_status(
                pod, view, phase="Failed", reason=explain.INVALID_SPEC, message=event.message
            )
        else:
            await self._write_status(pod, view, reason=explain.INVALID_SPEC, message=event.message)
        # Not retried: the next change of the pod queues it again.

    # ------------------------------------------------------------------ ending

    def _deletion_poll(self, pod: PodView) -> float:
        # Poll gently: a provider may allow one request a second for all pods together.
        deadline = pod.deletion_deadline
        remaining = (deadline - self._now()).total_seconds() if deadline else 0.0
        return min(1.0, max(remaining, 0.5))

    async def _terminate(self, pod: PodView, sighting: Sighting, grace: float) -> None:
        placed = pod.placed
        assert placed is not None  # TERMINATE is only decided for a placed pod
        instance = sighting.instance
        if instance is None or instance.state is not InstanceState.TERMINATING:
            event = explain.Event(
                explain.NORMAL, explain.KILLING, f"Stopping container {pod.container_name}"
            )
            await self._record(pod, event)
        try:
            await self._providers[placed.provider].delete(placed.instance_id, grace_seconds=grace)
        except ProviderError as exc:
            log.info("pod %s/%s: stopping its instance failed: %s", *pod.key, exc)
        else:
            # The listed state is stale now: the next look asks the provider how it goes.
            self.tracker.forget(placed.provider, placed.instance_id)
        self.queue.add_after(pod.key, self._deletion_poll(pod))

    async def _stop_leftover(self, provider: str, instance_id: str) -> bool:
        """Ask once more that nothing of the instance stays (it may hold logs or bill)."""
        try:
            await self._providers[provider].delete(instance_id, grace_seconds=0)
        except ProviderError as exc:
            log.warning("terminating instance %s on %s failed: %s", instance_id, provider, exc)
            return False
        return True

    async def _finish_deletion(self, pod: PodView, sighting: Sighting) -> None:
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
            )
        await self._kube.delete_pod_now(pod.namespace, pod.name, uid=pod.uid)
        self._drop(pod.key, pod.uid, placed.offer_key if placed else None)

    async def _release(self, pod: PodView) -> None:
        """A terminal pod keeps no instance running and holds no budget.

        Only an instance the provider may still have is deleted: deleting a released one again
        would also drop what the provider retains for it (logs, until the pod is deleted).
        """
        placed = pod.placed
        if placed is not None and placed.provider in self._providers:
            known = self.tracker.get(placed.provider, placed.instance_id)
            if known is not None or not self.tracker.fresh(placed.provider):
                try:
                    await self._providers[placed.provider].delete(
                        placed.instance_id, grace_seconds=0
                    )
                    self.tracker.forget(placed.provider, placed.instance_id)
                except NotFound:
                    self.tracker.forget(placed.provider, placed.instance_id)
                except ProviderError as exc:
                    log.info("pod %s/%s: releasing its instance: %s", *pod.key, exc)
                    self.queue.add_rate_limited(pod.key, cap=SYNC_ERROR_CAP_SECONDS)
        if self._ledger.release(pod.uid):
            self._room_appeared(placed.offer_key if placed else None)

    async def _forget(self, key: PodKey) -> None:
        """The pod is gone from the API (e.g. force-deleted): its instance must go too."""
        memory = self._memory.get(key)
        if memory is None:
            self.queue.drop(key)
            return
        if (
            memory.provider in self._providers
            and memory.instance_id
            and not await self._stop_leftover(memory.provider, memory.instance_id)
        ):
            # Still costs money: stays remembered (and in the budget) until it is gone.
            self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
            return
        self._drop(key, memory.uid, memory.offer_key)

    def _drop(self, key: PodKey, uid: str, offer_key: str | None = None) -> None:
        self._memory.pop(key, None)
        self.queue.drop(key)
        self._events.forget(uid)
        if self._ledger.release(uid):
            self._room_appeared(offer_key)
