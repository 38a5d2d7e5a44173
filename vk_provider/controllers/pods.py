"""The pod controller: an executor of the pure lifecycle's steps, one pod at a time.

Shape (as virtual-kubelet's ``node/`` and kopf's per-object queues): the pod watch
(``podwatch``) keeps the node's pods in a store and queues the key of every pod that changed;
the instance tracker queues the pods whose instance changed. Workers take keys from the
``WorkQueue`` (one worker per pod at a time, bounded concurrency) and ``sync`` each: parse the
stored pod once (``PodView``), look at the instance it names, ask ``lifecycle.decide`` for the
next step and execute it: launches through the ``Placer``, status through the
``StatusReporter``, stops, deletions and releases through the ``Terminator``. Deciding is pure
and tested edge by edge; this module only acts.

Invariants:
- Everything needed to resume after a restart is in the pod (annotations, status) and at the
  provider (instances carry the pod UID); what this controller keeps in memory is a cache.
- Every create goes through the ``Launcher`` (first launch and relaunch alike): budget
  reservation, failover, offer blocks, ``Retry-After``.
- Every back-off is the work queue's, per pod key (``add_rate_limited`` / ``forget``). A pod
  whose sync failed against the API server (unreachable, 429, 5xx, or 401/403 from a
  restarted API server whose authorizer has not caught up yet) starts its back-off afresh
  when the pod watch lists again (``api_answers``): failures counted during an outage say
  nothing about the API once it is back, and must not leave a deletion waiting the cap.
- Pods being deleted are synced before the others (the queue's urgent lane).
- A pod with a ``deletionTimestamp`` is deleted from the API (grace 0, UID precondition) as
  soon as its instance is gone, and at the latest ``deletion_slack_seconds`` after its grace
  period; the instance gets the pod's remaining grace period.
- Provider-side failure makes the pod ``Failed`` (reason ``InstanceLost``) and avoids the
  offer for a cool-down so the replacement does not land in the same hole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import assert_never

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.observer import NO_OBSERVER, ControllerObserver
from vk_provider.controllers.offers import RECHECK_SECONDS, OfferBook
from vk_provider.controllers.placer import Placer, PodMemory
from vk_provider.controllers.podwatch import PodStore
from vk_provider.controllers.podwriter import PodWriter
from vk_provider.controllers.prober import Prober
from vk_provider.controllers.reporter import StatusReporter
from vk_provider.controllers.terminator import Terminator
from vk_provider.controllers.workqueue import (
    UNOBSERVED,
    Backoff,
    QueueClosed,
    QueueObserver,
    WorkQueue,
)
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound, ProviderError
from vk_provider.domain.lifecycle import (
    MAX_CRASH_BACKOFF_SECONDS,
    MISSING,
    NOT_PLACED,
    UNREACHABLE,
    Decision,
    Seen,
    Sighting,
    Step,
    decide,
)
from vk_provider.domain.logfields import about
from vk_provider.domain.models import Instance
from vk_provider.domain.offerindex import OfferIndex
from vk_provider.domain.podview import PodKey, PodPlacement, PodView
from vk_provider.domain.workload import Held
from vk_provider.kube.client import ApiError, ConflictError, KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.settings.agent import IntervalsConfig

log = logging.getLogger(__name__)

RUNNING_RESYNC_SECONDS = 60.0  # a running pod with no news is synced again after this


def _as_released(pod: PodView, memory: PodMemory, sighting: Sighting) -> Sighting:
    """A pod whose exited instance was deleted to make room for its relaunch still names
    it: that instance, as last seen, is what the pod's container did last."""
    released = memory.released_for_relaunch
    if (
        released is None
        or sighting.seen is Seen.FOUND
        or pod.terminal
        or pod.placed is None
        or pod.placed.instance_id != released.instance_id
    ):
        return sighting
    return Sighting.of(released)


# A sync that failed (a provider's 429/5xx, an API hiccup) is retried soon: the failure says
# nothing about how long to wait, and a deleting pod must not sit out a long back-off.
SYNC_ERROR_CAP_SECONDS = 10.0


def _unavailable(error: ApiError) -> bool:
    """The API server did not answer, or was too busy to (not a refusal of this request)."""
    return error.status == 0 or error.status == 429 or error.status >= 500


def _refused_identity(error: ApiError) -> bool:
    """401/403: an API server that has just started refuses every identity but its admins'
    until its authorizer has caught up. Retried as soon as the pod watch lists again (the
    agent's own identity answered: ``api_answers``); the watch lists only after it breaks,
    so a lasting refusal does not spin."""
    return error.status in (401, 403)


def _wall_clock() -> datetime:
    return datetime.now(UTC)


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
        queue_observer: QueueObserver = UNOBSERVED,
        now: Callable[[], datetime] = _wall_clock,
        label_pods: bool = True,
    ) -> None:
        self._providers = dict(providers)
        self._offers = offers
        self._launcher = launcher
        self._ledger = launcher.ledger
        self._store = store
        self._intervals = intervals
        self._workers = workers
        self._now = now
        # One back-off per pod key: placement retries double from retry_backoff_seconds.
        # Pods being deleted go first: their grace period runs, the rest can wait.
        self.queue: WorkQueue[PodKey] = WorkQueue(
            Backoff(base=intervals.retry_backoff_seconds, cap=MAX_CRASH_BACKOFF_SECONDS),
            observer=queue_observer,
            urgent=self._deleting,
        )
        self.tracker = InstanceTracker(
            self._providers,
            on_change=self._instance_changed,
            on_listing=self._ledger.listing,
            on_listed=self._listed,
        )
        self._memory: dict[PodKey, PodMemory] = {}
        self._api_failed: set[PodKey] = set()  # last sync failed against the API server
        self._available: dict[str, int] = {}  # offer key -> available, at the last refresh
        offers.on_asking(lambda: self._launcher.room.asking(self.placed_holdings()))
        offers.on_refresh(self._offers_refreshed)
        self._write = PodWriter(
            kube,
            store=store,
            recorder=recorder,
            host_ip=host_ip,
            now=now,
            observer=observer,
            label_pods=label_pods,
        )
        # Probes the agent runs (providers whose containers it can reach); a verdict that
        # changes re-syncs the pod, whose status then shows it.
        self.prober = Prober(self._providers, on_change=self.queue.add, events=self._write.event)
        self._report = StatusReporter(
            self._write,
            self._providers,
            probes=self.prober,
            restart_backoff=intervals.restart_backoff_seconds,
            now=now,
        )
        self._placer = Placer(
            kube,
            node_name=node_name,
            host_ip=host_ip,
            providers=self._providers,
            offers=offers,
            launcher=launcher,
            tracker=self.tracker,
            queue=self.queue,
            writer=self._write,
            reporter=self._report,
            intervals=intervals,
            observer=observer,
            now=now,
        )
        self._terminator = Terminator(
            providers=self._providers,
            tracker=self.tracker,
            queue=self.queue,
            writer=self._write,
            reporter=self._report,
            launcher=launcher,
            memory=self._memory,
            intervals=intervals,
            room_appeared=self._room_appeared,
            retry_cap=SYNC_ERROR_CAP_SECONDS,
            now=now,
        )

    # ------------------------------------------------------------------ feeding the queue

    def _deleting(self, key: PodKey) -> bool:
        pod = self._store.view(key)
        return pod is not None and pod.deletion_deadline is not None

    def pod_changed(self, key: PodKey) -> None:
        """The watch saw ``key`` change (or go): account for it, then sync it."""
        pod = self._store.view(key)
        if pod is not None:
            self._account(pod)
        self.queue.add(key)

    def api_answers(self) -> None:
        """The pod watch listed (again): pods whose sync failed against the API server retry
        now, their back-off started afresh."""
        for key in self._api_failed:
            self.queue.forget(key)
            self.queue.add(key)
        self._api_failed.clear()

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
        """Until its provider is listed (after a restart), a pod's annotations are the
        ledger's estimate of what it costs; a terminal pod's estimate goes. The providers'
        listings, not the pods, say what is billed (``_listed``); the pod says in which
        namespace its instances count."""
        self._ledger.name_pod(pod.uid, pod.namespace)
        if pod.terminal:
            if self._ledger.forget_estimate(pod.uid):
                self._room_appeared(pod.placed.offer_key if pod.placed else None)
            return
        placed = pod.placed
        if placed is not None and placed.price_per_hour is not None:
            self._ledger.estimate(
                pod.uid,
                namespace=pod.namespace,
                provider=placed.provider,
                offer_key=placed.offer_key,
                price=placed.price_per_hour,
            )

    def _listed(self, provider: str, instances: Sequence[Instance], mark: int) -> None:
        """A provider listed its instances: the ledger counts exactly those (and the creates
        still unanswered); what it proved gone is room for the pods that wait."""

        def namespace_of(uid: str) -> str | None:
            key = self._store.key_of(uid)
            return key[0] if key is not None else None

        for freed in self._ledger.listed(provider, instances, mark, namespace_of=namespace_of):
            self._room_appeared(freed.offer_key)

    def _room_appeared(self, offer_key: str | None = None) -> None:
        """An instance ended or a pod left: pods waiting for capacity or budget try again.

        When the instance's offer is known, its "no capacity" block is lifted and the offer
        cache refreshed, so the freed slot is seen at once rather than after the cache's TTL.
        """
        if offer_key:
            self._launcher.capacity_freed(offer_key)
            self._offers.invalidate()
        self._kick_waiting()

    def _offers_refreshed(self, index: OfferIndex, asked_at: float) -> None:
        """Fresh offers: capacity blocks they contradict are lifted, and when any offer has
        more room than before, the pods waiting for capacity try again now."""
        self._launcher.room.answered()
        lifted = self._launcher.capacity_seen(index, asked_at)
        available: dict[str, int] = {}
        for offer in index:
            available[offer.key] = available.get(offer.key, 0) + max(offer.available, 0)
        room = sum(max(0, n - self._available.get(k, 0)) for k, n in available.items())
        self._available = available
        # Only as many waiting pods as there is new room: under churn, availability moves
        # all the time, and kicking every waiting pod at each refresh would reset their
        # back-off for good and crowd out the pods being deleted.
        if lifted or room:
            self._kick_waiting(limit=max(room, len(lifted)))

    async def recheck_capacity(self) -> None:
        """While pods wait for capacity, keep the offers at most ``RECHECK_SECONDS`` old
        (called by reconciliation each cycle; a refresh that finds room kicks them)."""
        if any(m.waiting for m in self._memory.values()):
            await self._offers.index(max_age=RECHECK_SECONDS)

    def _kick_waiting(self, *, limit: int | None = None) -> None:
        """Pods waiting for capacity or budget try again now (at most ``limit`` of them)."""
        kicked = 0
        for key, memory in self._memory.items():
            if limit is not None and kicked >= limit:
                return
            if memory.waiting:
                memory.waiting = False
                self.queue.forget(key)
                self.queue.add(key)
                kicked += 1

    # ------------------------------------------------------------------ views for others

    def placements(self) -> list[PodPlacement]:
        placed = (PodPlacement.of(pod) for pod in self._store.views())
        return [p for p in placed if p is not None]

    def gpu_requests(self) -> list[float]:
        """GPUs each live pod on the node requests (the flip's "enough free to go home")."""
        return [self._store.held(pod.key).gpus for pod in self._store.views() if not pod.terminal]

    def placed_holdings(self) -> dict[str, Held]:
        """What each live, placed pod of the node requests, by pod uid."""
        return {
            pod.uid: self._store.held(pod.key)
            for pod in self._store.views()
            if not pod.terminal and pod.placed is not None
        }

    def reflected_resources(self) -> tuple[float, float, float]:
        """GPUs, vCPUs and GiB the providers' last answer counts as our pods' (node
        capacity: that answer's free room plus this, ``domain.room``)."""
        total = self._launcher.room.reflected(self.placed_holdings())
        return total.gpus, total.cpu, total.memory_gib

    # ------------------------------------------------------------------ workers

    async def run_workers(self) -> None:
        try:
            await asyncio.gather(*(self._worker() for _ in range(self._workers)))
        finally:
            await self.prober.close()

    async def _worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueClosed:
                return
            try:
                await self.sync(key)
                self._api_failed.discard(key)
            except ConflictError:
                self.queue.add_after(key, 0.2)  # someone wrote the pod meanwhile: re-read
            except (ProviderError, ApiError) as exc:
                if isinstance(exc, ApiError) and (_unavailable(exc) or _refused_identity(exc)):
                    self._api_failed.add(key)
                delay = self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
                log.warning(
                    "sync of pod %s/%s: %s; retrying in %.1fs", *key, exc, delay, extra=about(key)
                )
            except Exception:
                log.exception("sync of pod %s/%s failed; retrying", *key, extra=about(key))
                self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
            finally:
                self.queue.done(key)

    # ------------------------------------------------------------------ the sync

    async def sync(self, key: PodKey) -> None:
        pod = self._store.view(key)
        if pod is None:
            await self._terminator.forget(key)
            return
        memory = self._remember(pod)
        sighting = _as_released(pod, memory, await self._sight(pod))
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

    def _remember(self, pod: PodView) -> PodMemory:
        memory = self._memory.get(pod.key)
        if memory is None or memory.uid != pod.uid:
            memory = self._memory[pod.key] = PodMemory(uid=pod.uid)
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
            log.info("pod %s/%s: cannot read its instance: %s", *pod.key, exc, extra=about(pod.key))
            return UNREACHABLE
        self.tracker.remember(instance)
        return Sighting.of(instance)

    async def _execute(
        self, pod: PodView, memory: PodMemory, sighting: Sighting, decision: Decision
    ) -> None:
        key, instance = pod.key, sighting.instance
        # One case per step; assert_never makes mypy (scripts/check) refuse a step that has
        # none, and tests/unit/test_lifecycle_executor.py checks the same at run time.
        match decision.step:
            case Step.PLACE:
                attempt = pod.status.restart_count
                await self._placer.launch(pod, memory, attempt=attempt, previous=None)
            case Step.RELAUNCH:
                assert instance is not None
                await self._placer.launch(pod, memory, attempt=decision.attempt, previous=instance)
            case Step.WAIT:
                self.queue.add_after(key, decision.wait_seconds)
            case Step.RETRY:
                self.queue.add_rate_limited(key, cap=SYNC_ERROR_CAP_SECONDS)
            case Step.SHOW_PENDING:
                assert instance is not None
                await self._report.pending(pod, instance)
                self.queue.add_after(key, memory.next_start_poll(self._intervals))
            case Step.SHOW_RUNNING:
                assert instance is not None
                await self._report.running(pod, instance)
                # Changes come as edges (the watch, the tracker's diff of each listing, a
                # probe verdict); this is the level-triggered safety net, a kubelet's
                # syncFrequency: rare, so 10,000 unchanged pods cost next to nothing.
                self.queue.add_after(key, RUNNING_RESYNC_SECONDS)
            case Step.FAIL_LOST:
                why = "the provider no longer knows it"
                if instance is not None:
                    why = instance.message or instance.state.value
                await self._terminator.fail_lost(pod, why)
            case Step.COMPLETE:
                assert instance is not None
                await self._report.complete(pod, instance)
                await self._terminator.release(pod)
            case Step.BACK_OFF:
                assert instance is not None
                await self._report.back_off(pod, instance)
                self.queue.add_after(key, decision.wait_seconds)
            case Step.TERMINATE:
                await self._terminator.terminate(pod, sighting, decision.grace_seconds)
            case Step.AWAIT_TERMINATION:
                self.queue.add_after(key, self._terminator.deletion_poll(pod))
            case Step.FINISH_DELETION:
                await self._terminator.finish_deletion(pod, sighting)
            case Step.RELEASE:
                await self._terminator.release(pod)
            case Step.NOTHING:  # only the budget's estimate may be left
                if self._ledger.forget_estimate(pod.uid):
                    self._room_appeared(pod.placed.offer_key if pod.placed else None)
            case unhandled:
                assert_never(unhandled)
