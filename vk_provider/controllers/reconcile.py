"""The reconcile loop: poll every provider once, plan against the pods, apply the plan.

Every ``interval`` (once the pod watch has listed the node's pods, so it never plans against
a partial view) the loop polls the instance tracker (one ``list_ours`` per provider), builds
snapshots of the stored pods, asks the pure ``plan_reconcile`` what to do and does it:

- ``Terminate``: ``delete`` at the provider (grace 0), remembered per instance so a
  termination the provider does not confirm is asked again with back-off and counted as
  overdue (``overdue``, exported as a metric and on the REST API);
- ``Adopt``: handed to the pod controller, which applies exactly that instance;
- ``Resync``: the pod is queued.

Invariants: one failed action never stops the others or the loop; only fresh provider lists
lead to terminations (the plan's rule); the first complete cycle after a start is logged with
its duration (restart recovery is measured, not assumed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from vk_provider.controllers.observer import NO_OBSERVER, ControllerObserver
from vk_provider.controllers.pods import PodController
from vk_provider.controllers.podwatch import PodStore, PodWatch
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import ProviderError
from vk_provider.domain.logfields import about
from vk_provider.domain.reconcile import (
    Action,
    Adopt,
    InstanceKey,
    Plan,
    PodSnapshot,
    ProviderSnapshot,
    Terminate,
    TerminationPolicy,
    TerminationRecord,
    plan_reconcile,
)
from vk_provider.kube.client import ApiError

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        *,
        store: PodStore,
        watch: PodWatch,
        pods: PodController,
        providers: Mapping[str, Provider],
        interval: float,
        grace: float,
        policy: TerminationPolicy,
        observer: ControllerObserver = NO_OBSERVER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._watch = watch
        self._pods = pods
        self._providers = dict(providers)
        self._interval = interval
        self._grace = grace
        self._policy = policy
        self._observer = observer
        self._clock = clock
        self._first_seen: Mapping[InstanceKey, float] = {}
        self._terminations: dict[InstanceKey, TerminationRecord] = {}
        self.overdue: tuple[InstanceKey, ...] = ()

    def _snapshots(self) -> list[PodSnapshot]:
        snapshots = []
        for pod in self._store.views():
            snapshots.append(
                PodSnapshot(
                    key=pod.key,
                    uid=pod.uid,
                    provider=pod.placed.provider if pod.placed else None,
                    instance_id=pod.placed.instance_id if pod.placed else None,
                    terminal=pod.terminal,
                    deleting=pod.deleting,
                )
            )
        return snapshots

    async def reconcile_once(self) -> Plan:
        started = self._clock()
        tracker = self._pods.tracker
        await tracker.poll()
        observed = [
            ProviderSnapshot(name, tracker.listed(name), tracker.fresh(name))
            for name in self._providers
        ]
        now = self._clock()
        plan = plan_reconcile(
            self._snapshots(),
            observed,
            first_seen=self._first_seen,
            now=now,
            grace=self._grace,
            terminations=self._terminations,
            policy=self._policy,
        )
        self._first_seen = plan.first_seen
        # What left the lists needs no remembering; what stays keeps its history.
        self._terminations = {k: r for k, r in self._terminations.items() if k in plan.first_seen}
        self.overdue = plan.overdue
        for action in plan.actions:
            try:
                await self._apply(action, now)
            except (ApiError, ProviderError) as exc:
                log.warning("reconcile action %s failed: %s", action, exc)
        self._observer.reconciled(self._clock() - started)
        return plan

    async def _apply(self, action: Action, now: float) -> None:
        if isinstance(action, Terminate):
            key = (action.provider, action.instance_id)
            seen = self._first_seen.get(key, now)
            record = self._terminations.get(key, TerminationRecord(seen, 0, seen))
            self._terminations[key] = record.asked_again(now)
            log.warning(
                "terminating instance %s on %s (pod %s): %s%s",
                action.instance_id,
                action.provider,
                action.pod_uid,
                action.reason,
                f" (attempt {record.attempts + 1})" if record.attempts else "",
                extra=about(instance=action.instance_id, provider=action.provider),
            )
            await self._providers[action.provider].delete(action.instance_id, grace_seconds=0)
            self._observer.instance_terminated(action.provider, action.reason)
        elif isinstance(action, Adopt):
            # Adoption is a pod write: it goes through the pod's own queue (one worker per
            # pod), where the controller applies exactly this instance.
            self._pods.adopt(action.key, action.instance)
        else:
            self._pods.queue.add(action.key)

    async def run(self) -> None:
        """Reconcile every ``interval`` once the pod watch has listed the node's pods."""
        born = self._clock()
        first = True
        while True:
            await self._watch.live.wait()  # never plan against a partial view of the pods
            try:
                plan = await self.reconcile_once()
            except Exception:  # one bad cycle must not stop reconciliation
                log.exception("reconcile cycle failed")
            else:
                tracker = self._pods.tracker
                if first and all(tracker.fresh(name) for name in self._providers):
                    first = False
                    log.info(
                        "first reconciliation complete %.1fs after start: %d pods, "
                        "%d instances, %d actions",
                        self._clock() - born,
                        len(self._store),
                        len(tracker.all()),
                        len(plan.actions),
                    )
            try:
                # After the cycle and its report: a slow offers answer delays neither.
                await self._pods.recheck_capacity()
            except Exception:
                log.exception("refreshing offers for waiting pods failed")
            await asyncio.sleep(self._interval)
