"""The pod controller: pods bound to the virtual node, run through providers, status written back.

Shape (as virtual-kubelet's ``node/`` and kopf's per-object queues):

- ``watch_loop`` lists and watches pods with ``spec.nodeName=<node>`` and queues their keys;
  on 410 Gone or a broken connection it re-lists. It never acts on an event's payload.
- workers take keys from a ``WorkQueue`` (one worker per pod at a time, bounded concurrency)
  and run ``sync``, which re-reads the pod, looks at the provider's view of its instance and
  does the one next thing: place and create, write status, relaunch with back-off, fail the
  pod when the provider lost the instance, or finish a deletion.

Invariants:
- Everything needed to resume after a restart is in the pod (annotations, status) and at the
  provider (instances carry the pod UID); the in-memory maps here are caches.
- A pod with a ``deletionTimestamp`` is deleted from the API (grace 0, UID precondition) as
  soon as its instance is gone; the instance gets the pod's remaining grace period.
- Provider-side failure makes the pod ``Failed`` (reason ``InstanceLost``) and blocks the
  offer for a cool-down so the replacement does not land in the same hole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.launch import Launcher, LaunchResult
from vk_provider.controllers.observer import NO_OBSERVER, ControllerObserver
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.workqueue import QueueClosed, WorkQueue
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
)
from vk_provider.domain.models import Instance, InstanceState, Offer, WorkloadSpec
from vk_provider.domain.placement import InvalidRequest, PlacementRequest
from vk_provider.domain.podstatus import (
    ContainerView,
    Running,
    Terminated,
    Waiting,
    last_termination,
    pod_status,
    status_changed,
    waiting_view,
)
from vk_provider.domain.podview import (
    ANN_INSTANCE,
    ANN_OFFER,
    ANN_PRICE,
    ANN_PROVIDER,
    PodKey,
    PodPlacement,
    annotations_of,
    container_spec,
    container_status,
    is_terminal,
    meta,
    parse_time,
    pod_key,
)
from vk_provider.domain.quantity import parse_quantity
from vk_provider.domain.reconcile import (
    Action,
    Adopt,
    Plan,
    PodSnapshot,
    ProviderSnapshot,
    Terminate,
    plan_reconcile,
)
from vk_provider.domain.workload import (
    GPU_RESOURCE,
    InvalidPodSpec,
    references,
    to_workload,
)
from vk_provider.kube import events
from vk_provider.kube.client import JSON, ApiError, ConflictError, GoneError, KubeClient
from vk_provider.kube.events import EventRecorder

log = logging.getLogger(__name__)

_ADOPTABLE = (InstanceState.PENDING, InstanceState.RUNNING)
_FINISHED = (InstanceState.TERMINATED, InstanceState.EXITED, InstanceState.LOST)
# How far past its grace period a deleted pod may stay while we wait for its instance.
DELETION_SLACK_SECONDS = 5.0

MAX_BACKOFF = 300.0


@dataclass(frozen=True, slots=True)
class PodTimings:
    status_poll_seconds: float = 2.0
    restart_backoff_seconds: float = 10.0
    retry_backoff_seconds: float = 5.0
    instance_lost_cooldown_seconds: float = 300.0
    retry_backoff_max_seconds: float = 60.0
    capacity_block_seconds: float = 60.0
    watch_timeout_seconds: int = 60


@dataclass
class _PodMemory:
    """Per-pod cache: what we last knew, for cleanup after a force delete and for back-off."""

    uid: str
    provider: str | None = None
    instance_id: str | None = None
    retries: int = 0
    prefer: str | None = None  # offer key to retry first after a 429 / 5xx
    failures: int = 0  # syncs in a row that raised (back-off of the next retry)
    not_before: float = 0.0  # monotonic time before which placement is not retried


def backoff(base: float, attempt: int) -> float:
    return float(min(base * (2 ** max(attempt, 0)), MAX_BACKOFF))


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
        timings: PodTimings,
        workers: int,
        observer: ControllerObserver = NO_OBSERVER,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._host_ip = host_ip
        self._providers = dict(providers)
        self._offers = offers
        self._events = recorder
        self._timings = timings
        self._workers = workers
        self._launcher = launcher
        self._ledger = launcher.ledger
        self._observer = observer
        self.queue: WorkQueue[PodKey] = WorkQueue()
        self.tracker = InstanceTracker(self._providers, on_change=self._instance_changed)
        self._memory: dict[PodKey, _PodMemory] = {}
        self._uid_keys: dict[str, PodKey] = {}
        self._waiting: set[PodKey] = set()  # unplaceable pods, kicked when room appears
        self._placements: dict[PodKey, PodPlacement] = {}  # for the REST API and metrics
        self._pods: dict[PodKey, JSON] = {}  # latest pod objects seen (reconcile snapshots)
        self._first_seen: Mapping[tuple[str, str], float] = {}
        self.watch_live = asyncio.Event()

    # ------------------------------------------------------------------ feeding the queue

    def _instance_changed(self, pod_uid: str) -> None:
        key = self._uid_keys.get(pod_uid)
        if key is not None:
            self.queue.add(key)

    def _observe(self, pod: JSON) -> None:
        key = pod_key(pod)
        uid = str(meta(pod).get("uid", ""))
        memory = self._memory.get(key)
        if memory is None or memory.uid != uid:
            if memory is not None:
                self._uid_keys.pop(memory.uid, None)
            memory = self._memory[key] = _PodMemory(uid=uid)
        annotations = annotations_of(pod)
        if ANN_INSTANCE in annotations:
            memory.provider = annotations.get(ANN_PROVIDER)
            memory.instance_id = annotations[ANN_INSTANCE]
        self._account(pod)
        self._pods[key] = pod
        self._uid_keys[uid] = key
        self.queue.add(key)

    def _track(self, key: PodKey, pod: JSON) -> None:
        """Remember where a placed, live pod runs (REST ``/v1/pods``, metrics)."""
        annotations = annotations_of(pod)
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
        if ANN_INSTANCE not in annotations or phase in ("Succeeded", "Failed"):
            self._placements.pop(key, None)
            return
        status = pod.get("status") or {}
        try:
            price = float(annotations.get(ANN_PRICE, "0"))
        except ValueError:
            price = 0.0
        self._placements[key] = PodPlacement(
            namespace=key[0],
            name=key[1],
            uid=str(meta(pod).get("uid", "")),
            provider=annotations.get(ANN_PROVIDER, ""),
            instance_id=annotations[ANN_INSTANCE],
            offer=annotations.get(ANN_OFFER, ""),
            price_per_hour=price,
            phase=phase,
            since=parse_time(status.get("startTime")),
        )

    def placements(self) -> list[PodPlacement]:
        return list(self._placements.values())

    def held_resources(self) -> tuple[float, float, float]:
        """GPUs, vCPUs and GiB requested by the node's live, placed pods (node capacity)."""
        gpus = cpu = memory = 0.0
        for pod in self._pods.values():
            if is_terminal(pod) or ANN_INSTANCE not in annotations_of(pod):
                continue
            resources = container_spec(pod).get("resources") or {}
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            try:
                gpus += float(parse_quantity(str(limits.get(GPU_RESOURCE, "0"))))
                cpu += float(parse_quantity(str(requests.get("cpu", limits.get("cpu", "0")))))
                memory += (
                    float(parse_quantity(str(requests.get("memory", limits.get("memory", "0")))))
                    / 2**30
                )
            except ValueError:
                continue  # translation refuses such pods; they hold nothing
        return gpus, cpu, memory

    def _account(self, pod: JSON) -> None:
        """Keep the budget ledger equal to what the pods' annotations say runs.

        Called for every observed pod, so after a restart the ledger is rebuilt from the
        API before any new placement can be made against it.
        """
        metadata = meta(pod)
        uid = str(metadata.get("uid", ""))
        annotations = annotations_of(pod)
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            if self._ledger.release(uid):
                self._room_appeared()
            return
        if ANN_PROVIDER in annotations and ANN_PRICE in annotations:
            try:
                price = float(annotations[ANN_PRICE])
            except ValueError:
                return
            self._ledger.commit(
                uid,
                namespace=str(metadata.get("namespace")),
                provider=annotations[ANN_PROVIDER],
                price=price,
            )

    async def watch_loop(self) -> None:
        """List, then watch from the list's version; re-list on 410 or a dropped watch."""
        while True:
            try:
                pods, version = await self._kube.list_node_pods(self._node)
                listed = {pod_key(p) for p in pods}
                for pod in pods:
                    self._observe(pod)
                # Pods we remember that are gone from the list were deleted while unwatched.
                for key in list(self._memory):
                    if key not in listed:
                        self.queue.add(key)
                self.watch_live.set()
                while True:
                    # A watch the server ends on its timeout resumes from the last version
                    # seen; only a 410 or an error costs a full re-list.
                    async for kind, pod in self._kube.watch_node_pods(
                        self._node, version, timeout_seconds=self._timings.watch_timeout_seconds
                    ):
                        version = str(meta(pod).get("resourceVersion") or version)
                        if kind != "BOOKMARK":
                            self._observe(pod)
            except GoneError:
                log.info("pod watch expired (410); re-listing")
            except (ApiError, OSError, TimeoutError, ValueError) as exc:
                self.watch_live.clear()
                log.warning("pod watch broken (%s); re-listing in 1s", exc)
                await asyncio.sleep(1.0)
            except Exception as exc:
                # aiohttp raises its own ClientError family; treat every transport hiccup alike.
                self.watch_live.clear()
                log.warning("pod watch failed (%s: %s); re-listing in 1s", type(exc).__name__, exc)
                await asyncio.sleep(1.0)

    async def worker(self) -> None:
        while True:
            try:
                key = await self.queue.get()
            except QueueClosed:
                return
            try:
                await self.sync(key)
                memory = self._memory.get(key)
                if memory:
                    memory.failures = 0
            except ConflictError:
                self.queue.add_after(key, 0.2)  # someone wrote the pod meanwhile: re-read
            except (ProviderError, ApiError) as exc:
                # Expected weather (a provider's 429/5xx, an API hiccup): retry with back-off.
                memory = self._memory.get(key)
                attempt = memory.failures if memory else 0
                if memory:
                    memory.failures += 1
                # Capped low: a sync error (unlike "no capacity") says nothing about how long
                # to wait, and a deleting pod must not sit out a long back-off.
                delay = min(backoff(self._timings.retry_backoff_seconds, attempt), 10.0)
                log.warning("sync of pod %s/%s: %s; retrying in %.1fs", *key, exc, delay)
                self.queue.add_after(key, delay)
            except Exception:
                log.exception("sync of pod %s/%s failed; retrying", *key)
                self.queue.add_after(key, 2.0)
            finally:
                self.queue.done(key)

    # ------------------------------------------------------------------ the sync

    async def sync(self, key: PodKey) -> None:
        namespace, name = key
        pod = await self._kube.get_pod(namespace, name)
        if pod is None or (pod.get("spec") or {}).get("nodeName") != self._node:
            self._placements.pop(key, None)
            self._pods.pop(key, None)
            await self._forget(key)
            return
        self._pods[key] = pod
        memory = self._memory.get(key)
        if memory is None or memory.uid != meta(pod).get("uid"):
            self._observe(pod)
            memory = self._memory[key]
        self._track(key, pod)
        if meta(pod).get("deletionTimestamp"):
            await self._sync_deletion(key, pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            await self._release(pod)
            return
        self._account(pod)
        annotations = annotations_of(pod)
        provider_name = annotations.get(ANN_PROVIDER)
        instance_id = annotations.get(ANN_INSTANCE)
        if not provider_name or not instance_id or provider_name not in self._providers:
            await self._place(key, pod, memory)
            return
        instance = await self._instance(provider_name, instance_id)
        if instance is None:
            await self._fail_lost(
                pod, provider_name, annotations, "the provider no longer knows it"
            )
            return
        await self._sync_instance(key, pod, instance)

    async def _instance(self, provider: str, instance_id: str) -> Instance | None:
        cached = self.tracker.get(provider, instance_id)
        if cached is not None and self.tracker.fresh(provider):
            return cached
        try:
            instance = await self._providers[provider].get(instance_id)
        except NotFound:
            return None
        self.tracker.remember(instance)
        return instance

    async def _forget(self, key: PodKey) -> None:
        """The pod is gone from the API (e.g. force-deleted): its instance must go too."""
        memory = self._memory.pop(key, None)
        self._waiting.discard(key)
        if memory is None:
            return
        self._uid_keys.pop(memory.uid, None)
        self._events.forget(memory.uid)
        if memory.provider in self._providers and memory.instance_id:
            try:
                await self._providers[memory.provider].delete(memory.instance_id, grace_seconds=0)
            except ProviderError as exc:
                log.warning("terminating instance of deleted pod %s/%s failed: %s", *key, exc)
                self._memory[key] = memory  # keep it so a retry still knows what to delete
                self._uid_keys[memory.uid] = key
                self.queue.add_after(key, 5.0)
                return  # still costs money: stays in the budget until the delete succeeds
        if self._ledger.release(memory.uid):
            self._room_appeared()

    # ------------------------------------------------------------------ deletion

    async def _sync_deletion(self, key: PodKey, pod: JSON) -> None:
        """Terminate the instance within the pod's grace period, then delete the pod.

        The pod never outlives its grace period by more than ``DELETION_SLACK_SECONDS``
        because of us: if the provider cannot confirm the instance is gone by then (errors,
        a slow terminate), the pod is deleted anyway and the instance, which still carries
        the pod's UID, is terminated by reconciliation as an orphan.
        """
        metadata = meta(pod)
        deadline = parse_time(metadata.get("deletionTimestamp"))
        now = datetime.now(UTC)
        remaining = max((deadline - now).total_seconds(), 0.0) if deadline else 0.0
        overdue = deadline is not None and (now - deadline).total_seconds() > DELETION_SLACK_SECONDS
        try:
            finished = await self._terminate_for_deletion(pod, remaining)
        except ProviderError as exc:
            if not overdue:
                self.queue.add_after(key, min(1.0, max(remaining, 0.2)))
                return
            log.warning(
                "pod %s/%s: instance not confirmed gone (%s); deleting the pod, "
                "reconciliation terminates the instance",
                *key,
                exc,
            )
            finished = True
        if not finished and not overdue:
            # Poll gently: a provider may allow one request a second for all pods together.
            self.queue.add_after(key, min(1.0, max(remaining, 0.5)))
            return
        await self._kube.delete_pod_now(
            str(metadata["namespace"]), str(metadata["name"]), uid=str(metadata["uid"])
        )
        self._memory.pop(key, None)
        self._pods.pop(key, None)
        self._waiting.discard(key)
        self._uid_keys.pop(str(metadata.get("uid")), None)
        self._events.forget(str(metadata.get("uid")))
        if self._ledger.release(str(metadata.get("uid"))):
            self._room_appeared()

    async def _terminate_for_deletion(self, pod: JSON, remaining: float) -> bool:
        """One step of terminating a deleted pod's instance; True once nothing runs.

        The delete request is sent once (a TERMINATING instance is only watched), and also
        when the provider cannot be asked for the instance's state: stopping a paid instance
        matters more than knowing exactly how it is.
        """
        annotations = annotations_of(pod)
        provider_name = annotations.get(ANN_PROVIDER)
        instance_id = annotations.get(ANN_INSTANCE)
        if provider_name not in self._providers or not instance_id:
            return True
        provider = self._providers[provider_name]
        try:
            instance: Instance | None = await provider.get(instance_id)
        except NotFound:
            instance = None
        except ProviderError:
            await provider.delete(instance_id, grace_seconds=remaining)
            raise
        if instance is not None and instance.state not in _FINISHED:
            if instance.state is not InstanceState.TERMINATING:
                await self._events.record(
                    pod,
                    "Normal",
                    events.KILLING,
                    f"Stopping container {container_spec(pod).get('name', '')}",
                )
                await provider.delete(instance_id, grace_seconds=remaining)
            return False
        # Release what is left (a finished instance, or a provider's retained logs).
        await provider.delete(instance_id, grace_seconds=0)
        return True

    async def _release(self, pod: JSON) -> None:
        """A terminal pod keeps no instance running.

        Only an instance the provider still lists is deleted: deleting a released one again
        would also drop what the provider retains for it (logs, until the pod is deleted).
        """
        annotations = annotations_of(pod)
        provider_name = annotations.get(ANN_PROVIDER)
        instance_id = annotations.get(ANN_INSTANCE)
        if provider_name in self._providers and instance_id:
            provider = self._providers[provider_name]
            known = self.tracker.get(provider_name, instance_id)
            # Skip the provider call when a fresh list says the instance is already gone:
            # terminal pods stay in the API for long and are re-synced now and then.
            if known is not None or not self.tracker.fresh(provider_name):
                with contextlib.suppress(NotFound):
                    await provider.get(instance_id)
                    await provider.delete(instance_id, grace_seconds=0)
        if self._ledger.release(str(meta(pod).get("uid", ""))):
            self._room_appeared()

    # ------------------------------------------------------------------ placement and create

    async def _workload(self, pod: JSON, attempt: int) -> WorkloadSpec:
        namespace = str(meta(pod).get("namespace"))
        refs = references(pod)
        secrets: dict[str, JSON] = {}
        config_maps: dict[str, JSON] = {}
        for secret_name in sorted(refs.secrets):
            found = await self._kube.get_secret(namespace, secret_name)
            if found is not None:
                secrets[secret_name] = found
        for cm_name in sorted(refs.config_maps):
            found = await self._kube.get_config_map(namespace, cm_name)
            if found is not None:
                config_maps[cm_name] = found
        return to_workload(
            pod,
            secrets=secrets,
            config_maps=config_maps,
            node_name=self._node,
            host_ip=self._host_ip,
            attempt=attempt,
        )

    async def _write_status(
        self,
        pod: JSON,
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
            now=datetime.now(UTC),
            host_ip=self._host_ip,
            pod_ip=pod_ip,
            phase=phase,
            reason=reason,
            message=message,
        )
        if status_changed(pod.get("status") or {}, wanted):
            namespace, name = pod_key(pod)
            await self._kube.patch_pod_status(namespace, name, wanted)

    async def _invalid(self, pod: JSON, field_name: str, message: str) -> None:
        text = f"{field_name}: {message}" if field_name and field_name not in message else message
        await self._events.record(pod, "Warning", events.INVALID_SPEC, text)
        restart_policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        view = waiting_view(pod, "InvalidSpec", text)
        if restart_policy == "Never":
            await self._write_status(pod, view, phase="Failed", reason="InvalidSpec", message=text)
        else:
            await self._write_status(pod, view, reason="InvalidSpec", message=text)
        # Not retried: the next change of the pod queues it again.

    def _retry_later(self, key: PodKey, memory: _PodMemory) -> float:
        delay = min(
            backoff(self._timings.retry_backoff_seconds, memory.retries),
            self._timings.retry_backoff_max_seconds,
        )
        memory.retries += 1
        # Remembered, not just scheduled: our own status write (or any pod change) queues the
        # pod again at once, and that must not cut the back-off short.
        memory.not_before = time.monotonic() + delay
        self.queue.add_after(key, delay)
        return delay

    async def _place(self, key: PodKey, pod: JSON, memory: _PodMemory) -> None:
        wait = memory.not_before - time.monotonic()
        if wait > 0:
            self.queue.add_after(key, wait)
            return
        restart_count = int(container_status(pod).get("restartCount") or 0)
        try:
            spec = await self._workload(pod, attempt=restart_count)
            request = PlacementRequest.from_workload(spec, annotations_of(pod))
        except InvalidPodSpec as exc:
            if exc.retryable:
                await self._events.record(pod, "Warning", events.FAILED_CONFIG, str(exc))
                view = waiting_view(pod, events.FAILED_CONFIG, str(exc))
                await self._write_status(pod, view)
                self._retry_later(key, memory)
                return
            await self._invalid(pod, exc.field, str(exc))
            return
        except InvalidRequest as exc:
            await self._invalid(pod, exc.field, str(exc))
            return
        # After a restart, a crash may have left an instance of this pod that the pod does
        # not name yet: adopt it rather than launch a duplicate.
        await self.tracker.polled.wait()
        existing = [i for i in self.tracker.for_pod(memory.uid) if i.state in _ADOPTABLE]
        if existing:
            await self._adopt_existing(key, pod, max(existing, key=lambda i: i.attempt))
            return
        offers = await self._offers.offers()
        result = await self._launcher.launch(
            spec, request, offers, prefer=memory.prefer, allow_avoided=memory.retries > 0
        )
        self._count(result)
        for attempt in result.attempts:
            await self._events.record(
                pod,
                "Warning",
                events.PROVIDER_CREATE_FAILED,
                f"{attempt.offer.provider} refused offer {attempt.offer.sku} in "
                f"{attempt.offer.region}: {type(attempt.error).__name__}: {attempt.error}",
            )
        if result.instance is not None and result.offer is not None:
            self._waiting.discard(key)
            memory.retries = 0
            memory.prefer = None
            await self._announce(pod, result, len(offers))
            await self._adopt(pod, memory, result.instance, result.offer)
            return
        if result.invalid is not None:
            await self._invalid(pod, result.invalid.field, str(result.invalid))
            return
        if result.retry_after is not None:
            # 429 / 5xx: the same candidate again, after Retry-After or our back-off.
            memory.prefer = result.attempts[-1].offer.key if result.attempts else None
            delay = result.retry_after or backoff(
                self._timings.retry_backoff_seconds, memory.retries
            )
            memory.retries += 1
            self.queue.add_after(key, delay)
            return
        await self._unplaceable(key, pod, memory, result, request)

    async def _adopt_existing(self, key: PodKey, pod: JSON, instance: Instance) -> None:
        namespace, name = key
        log.info("adopting instance %s of pod %s/%s", instance.instance_id, namespace, name)
        await self._kube.patch_pod_annotations(
            namespace,
            name,
            {
                ANN_PROVIDER: instance.provider,
                ANN_INSTANCE: instance.instance_id,
                ANN_OFFER: instance.offer_key,
                ANN_PRICE: f"{instance.price_per_hour:.4f}",
            },
            uid=str(meta(pod).get("uid")),
        )
        self.queue.add(key)

    # ------------------------------------------------------------------ reconciliation

    async def reconcile_once(self, *, grace: float) -> Plan:
        """Poll every provider once, plan against the pods, apply the plan."""
        started = time.monotonic()
        await self.tracker.poll()
        snapshots = [
            PodSnapshot(
                key=key,
                uid=str(meta(pod).get("uid", "")),
                provider=annotations_of(pod).get(ANN_PROVIDER),
                instance_id=annotations_of(pod).get(ANN_INSTANCE),
                terminal=(pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
                deleting=bool(meta(pod).get("deletionTimestamp")),
            )
            for key, pod in self._pods.items()
        ]
        observed = [
            ProviderSnapshot(name, self.tracker.listed(name), self.tracker.fresh(name))
            for name in self._providers
        ]
        plan = plan_reconcile(
            snapshots, observed, first_seen=self._first_seen, now=time.monotonic(), grace=grace
        )
        self._first_seen = plan.first_seen
        for action in plan.actions:
            try:
                await self._apply(action)
            except (ApiError, ProviderError) as exc:
                log.warning("reconcile action %s failed: %s", action, exc)
        self._observer.reconciled(time.monotonic() - started)
        return plan

    async def _apply(self, action: Action) -> None:
        if isinstance(action, Terminate):
            log.warning(
                "terminating instance %s on %s (pod %s): %s",
                action.instance_id,
                action.provider,
                action.pod_uid,
                action.reason,
            )
            await self._providers[action.provider].delete(action.instance_id, grace_seconds=0)
            self._observer.instance_terminated(action.provider, action.reason)
        elif isinstance(action, Adopt):
            # Adoption is a pod write: it goes through the pod's own queue (one worker per
            # pod), where placement adopts the instance the tracker lists for the pod.
            self.queue.add(action.key)
        else:
            self.queue.add(action.key)

    async def reconcile_loop(self, *, interval: float, grace: float) -> None:
        """Reconcile every ``interval`` once the pod watch has listed the node's pods."""
        born = time.monotonic()
        first = True
        while True:
            await self.watch_live.wait()  # never plan against a partial view of the pods
            try:
                plan = await self.reconcile_once(grace=grace)
            except Exception:  # one bad cycle must not stop reconciliation
                log.exception("reconcile cycle failed")
            else:
                if first and all(self.tracker.fresh(name) for name in self._providers):
                    first = False
                    log.info(
                        "first reconciliation complete %.1fs after start: %d pods, "
                        "%d instances, %d actions",
                        time.monotonic() - born,
                        len(self._pods),
                        len(self.tracker.all()),
                        len(plan.actions),
                    )
            await asyncio.sleep(interval)

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

    async def _announce(self, pod: JSON, result: LaunchResult, offers_seen: int) -> None:
        offer = result.offer
        assert offer is not None
        skipped = [f"{a.offer.key}: {type(a.error).__name__}" for a in result.attempts]
        ranked = [o for o in result.placement.candidates if o.key != offer.key]
        cheaper = [o for o in ranked if o.price_per_hour < offer.price_per_hour]
        why = f" ({'; '.join(skipped)})" if skipped else ""
        gpu = f"{offer.gpu_count}x {offer.gpu_model}" if offer.gpu_model else "no GPU"
        await self._events.record(
            pod,
            "Normal",
            events.PROVIDER_SELECTED,
            f"placed on {offer.provider} offer {offer.sku} ({gpu}) in {offer.region} at "
            f"${offer.price_per_hour:.4f}/h; {len(cheaper)} cheaper offer(s) skipped{why}; "
            f"{offers_seen} offer(s) considered, removed {result.placement.explain()}",
        )

    async def _unplaceable(
        self,
        key: PodKey,
        pod: JSON,
        memory: _PodMemory,
        result: LaunchResult,
        request: PlacementRequest,
    ) -> None:
        self._waiting.add(key)
        delay = self._retry_later(key, memory)
        wanted = f"{request.gpu_count} GPU" + (
            f" ({','.join(request.gpu_models)})" if request.gpu_models else ""
        )
        if result.budget_limited:
            reason = events.BUDGET_EXCEEDED
            message = (
                f"launching {wanted} would exceed a budget cap "
                f"(offers removed {result.placement.explain()}); retrying in {delay:.0f}s"
            )
        else:
            reason = events.NO_CAPACITY
            tried = f"; {len(result.attempts)} launch(es) failed" if result.attempts else ""
            message = (
                f"no offer fits {wanted}: offers removed {result.placement.explain()}{tried}; "
                f"retrying in {delay:.0f}s"
            )
        await self._events.record(pod, "Warning", reason, message)
        await self._write_status(pod, waiting_view(pod, "ContainerCreating", message))

    def _room_appeared(self) -> None:
        """An instance ended or a pod left: pods waiting for capacity or budget try again."""
        waiting, self._waiting = self._waiting, set()
        for key in waiting:
            memory = self._memory.get(key)
            if memory is not None:
                memory.not_before = 0.0
            self.queue.add(key)

    async def _adopt(self, pod: JSON, memory: _PodMemory, instance: Instance, offer: Offer) -> None:
        namespace, name = pod_key(pod)
        updated = await self._kube.patch_pod_annotations(
            namespace,
            name,
            {
                ANN_PROVIDER: offer.provider,
                ANN_INSTANCE: instance.instance_id,
                ANN_OFFER: offer.key,
                ANN_PRICE: f"{offer.price_per_hour:.4f}",
            },
            uid=memory.uid,
        )
        memory.provider = offer.provider
        memory.instance_id = instance.instance_id
        self.tracker.remember(instance)
        await self._sync_instance(pod_key(pod), updated, instance)

    # ------------------------------------------------------------------ a running instance

    async def _fail_lost(
        self, pod: JSON, provider_name: str, annotations: Mapping[str, str], why: str
    ) -> None:
        offer_key = annotations.get(ANN_OFFER, "")
        if offer_key:
            self._launcher.avoid(offer_key, self._timings.instance_lost_cooldown_seconds)
        message = (
            f"instance {annotations.get(ANN_INSTANCE)} on {provider_name} was lost: {why}; "
            f"offer {offer_key or '?'} avoided for "
            f"{self._timings.instance_lost_cooldown_seconds:.0f}s"
        )
        await self._events.record(pod, "Warning", events.INSTANCE_LOST, message)
        view = waiting_view(pod, "InstanceLost", message)
        previous = container_status(pod)
        started = parse_time(((previous.get("state") or {}).get("running") or {}).get("startedAt"))
        view = ContainerView(
            name=view.name,
            image=view.image,
            state=Terminated(
                exit_code=137,
                reason="InstanceLost",
                started_at=started,
                finished_at=datetime.now(UTC),
                message=message,
            ),
            container_id=str(previous.get("containerID") or ""),
            restart_count=view.restart_count,
            last_state=view.last_state,
        )
        await self._write_status(pod, view, phase="Failed", reason="InstanceLost", message=message)
        await self._release(pod)

    async def _sync_instance(self, key: PodKey, pod: JSON, instance: Instance) -> None:
        container = container_spec(pod)
        name = str(container.get("name", ""))
        image = str(container.get("image", ""))
        previous = container_status(pod)
        restart_count = int(previous.get("restartCount") or 0)
        last_state = last_termination(pod)
        container_id = f"vk-provider://{instance.instance_id}"
        state = instance.state
        if state is InstanceState.LOST or state in (
            InstanceState.TERMINATING,
            InstanceState.TERMINATED,
        ):
            # We never asked (no deletionTimestamp): the provider ended it on its own.
            await self._fail_lost(
                pod, instance.provider, annotations_of(pod), instance.message or state.value
            )
            return
        if state is InstanceState.PENDING:
            view = ContainerView(
                name,
                image,
                Waiting("ContainerCreating", instance.message),
                container_id,
                last_state,
                restart_count,
            )
            await self._write_status(pod, view)
            self.queue.add_after(key, self._timings.status_poll_seconds)
            return
        if state is InstanceState.RUNNING:
            recorded = parse_time(
                ((previous.get("state") or {}).get("running") or {}).get("startedAt")
            )
            # Some providers do not say when the container started: keep what we wrote first.
            started = instance.started_at or recorded or datetime.now(UTC)
            was_running = bool((previous.get("state") or {}).get("running"))
            view = ContainerView(
                name, image, Running(started), container_id, last_state, restart_count
            )
            await self._write_status(pod, view, pod_ip=instance.ip)
            if not was_running:
                await self._events.record(
                    pod, "Normal", events.STARTED, f"Started container {name}"
                )
            self.queue.add_after(key, self._timings.status_poll_seconds * 5)
            return
        # EXITED: the container ended on its own; restartPolicy decides.
        await self._container_exited(key, pod, instance, container_id, last_state, restart_count)

    async def _container_exited(
        self,
        key: PodKey,
        pod: JSON,
        instance: Instance,
        container_id: str,
        last_state: Terminated | None,
        restart_count: int,
    ) -> None:
        container = container_spec(pod)
        name, image = str(container.get("name", "")), str(container.get("image", ""))
        code = instance.exit_code if instance.exit_code is not None else 1
        terminated = Terminated(
            exit_code=code,
            reason="Completed" if code == 0 else "Error",
            started_at=instance.started_at,
            finished_at=instance.finished_at or datetime.now(UTC),
        )
        policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            view = ContainerView(name, image, terminated, container_id, last_state, restart_count)
            await self._write_status(pod, view, pod_ip=instance.ip)
            await self._release(pod)
            return
        delay = backoff(self._timings.restart_backoff_seconds, restart_count)
        finished = terminated.finished_at or datetime.now(UTC)
        wait = delay - (datetime.now(UTC) - finished).total_seconds()
        if wait > 0:
            message = f"back-off {delay:.0f}s restarting failed container={name} pod={key[1]}"
            view = ContainerView(
                name,
                image,
                Waiting("CrashLoopBackOff", message),
                container_id,
                terminated,
                restart_count,
            )
            if (container_status(pod).get("state") or {}).get("waiting", {}).get(
                "reason"
            ) != "CrashLoopBackOff":
                await self._events.record(pod, "Warning", events.BACK_OFF, message)
            await self._write_status(pod, view)
            self.queue.add_after(key, wait)
            return
        await self._relaunch(key, pod, instance, terminated, restart_count)

    async def _relaunch(
        self, key: PodKey, pod: JSON, old: Instance, terminated: Terminated, restart_count: int
    ) -> None:
        """Launch the next attempt of a crash-looping container on the same offer.

        The exited instance is released only once the next one exists, so a failed create
        leaves the pod naming an instance that exists; the pod shows the termination while
        it waits. A relaunch that can never succeed (the offer is gone, no capacity, refused
        credentials, an invalid spec) fails the pod so its controller replaces it.
        """
        provider = self._providers[old.provider]
        annotations = annotations_of(pod)
        container = container_spec(pod)
        name, image = str(container.get("name", "")), str(container.get("image", ""))
        waiting = ContainerView(
            name,
            image,
            Waiting("CrashLoopBackOff", "restarting"),
            f"vk-provider://{old.instance_id}",
            terminated,
            restart_count,
        )
        await self._write_status(pod, waiting)
        offers = await self._offers.offers()
        if not self._offers.answer(old.provider).offers:
            # The provider gave no offers (breaker open, an outage): not a verdict on the pod.
            self.queue.add_after(key, self._timings.retry_backoff_seconds)
            return
        offer = next((o for o in offers if o.key == annotations.get(ANN_OFFER)), None)
        if offer is None:
            await self._fail_lost(pod, old.provider, annotations, "its offer is no longer offered")
            return
        # The attempt must be new even if a status write was lost (restartCount stale).
        attempt = max(restart_count, old.attempt) + 1
        try:
            spec = await self._workload(pod, attempt=attempt)
        except InvalidPodSpec as exc:
            await self._invalid(pod, exc.field, str(exc))
            return
        try:
            instance = await provider.create(spec, offer)
        except (CapacityUnavailable, AuthFailed, InvalidSpec) as exc:
            await self._fail_lost(
                pod, old.provider, annotations, f"relaunch refused: {type(exc).__name__}: {exc}"
            )
            return
        namespace, pod_name = pod_key(pod)
        view = ContainerView(
            name,
            image,
            Waiting("ContainerCreating"),
            f"vk-provider://{instance.instance_id}",
            terminated,
            restart_count + 1,
        )
        updated = await self._kube.patch_pod_annotations(
            namespace, pod_name, {ANN_INSTANCE: instance.instance_id}, uid=str(meta(pod)["uid"])
        )
        if instance.instance_id != old.instance_id:
            try:
                await provider.delete(old.instance_id, grace_seconds=0)
            except ProviderError as exc:  # reconciliation removes it as an old attempt
                log.info("releasing %s after relaunch failed: %s", old.instance_id, exc)
        self.tracker.remember(instance)
        memory = self._memory.get(key)
        if memory is not None:
            memory.instance_id = instance.instance_id
        await self._write_status(updated, view)
        self.queue.add_after(key, self._timings.status_poll_seconds)

    # ------------------------------------------------------------------ running it

    async def run_workers(self) -> None:
        await asyncio.gather(*(self.worker() for _ in range(self._workers)))
