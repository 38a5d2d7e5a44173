"""Periodic reconciliation: a pure plan from snapshots (``controllers.reconcile`` applies it).

``plan_reconcile`` compares what Kubernetes says (the pods on the node, with the instance each
one's annotations name) with what the providers say (one ``list_ours`` per provider) and
returns the actions that make them agree:

- an instance whose pod UID matches no live pod on the node, for longer than ``grace``:
  ``Terminate`` it (orphan);
- an instance of a pod that already ended (Succeeded/Failed) and still runs: ``Terminate``;
- instances of a live pod that names none (a crash between create and annotate): ``Adopt``
  the one ``choose_adoptee`` picks, ``Terminate`` the others (duplicates) after ``grace``;
- an instance of a live pod that names a different one, for longer than ``grace``:
  ``Terminate`` (duplicate, or an old attempt);
- a pod naming an instance its provider no longer lists (fresh list): ``Resync`` the pod;
- an instance that should be gone but has been TERMINATING for longer than
  ``termination_deadline`` since termination was first asked for (or first seen, after a
  restart): ``Terminate`` again, with back-off per instance (``TerminationRecord``), until the
  provider confirms (a paid instance is never left to a provider's lost delete).

One adoption rule: ``choose_adoptee`` (running before pending, then the latest attempt) is the
only ranking of a pod's instances; the pod controller applies the plan's choice instead of
deriving its own.

Invariants:
- Pure: no I/O, no clock; ``now``, when each instance was first seen and what termination
  was asked for already are inputs; the updated first-seen map is an output.
- Only *fresh* provider lists are trusted: a provider whose list call failed contributes no
  terminations and no resyncs (a failed poll is not evidence that instances vanished).
- The grace period protects instances that are younger than the Kubernetes view of them
  (a create whose annotation write is in flight, a relaunch in progress).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vk_provider.domain.models import Instance, InstanceState

PodKey = tuple[str, str]
InstanceKey = tuple[str, str]  # (provider, instance id)

ADOPTABLE = frozenset({InstanceState.PENDING, InstanceState.RUNNING})
_ALIVE_RANK = {InstanceState.RUNNING: 1, InstanceState.PENDING: 0}
MAX_TERMINATION_BACKOFF = 300.0


def choose_adoptee(instances: Sequence[Instance]) -> Instance | None:
    """The one instance of a pod to keep: running before pending, then the latest attempt."""
    alive = [i for i in instances if i.state in ADOPTABLE]
    if not alive:
        return None
    return max(alive, key=lambda i: (_ALIVE_RANK[i.state], i.attempt, i.instance_id))


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    key: PodKey
    uid: str
    provider: str | None
    instance_id: str | None
    terminal: bool
    deleting: bool


@dataclass(frozen=True, slots=True)
class ProviderSnapshot:
    provider: str
    instances: tuple[Instance, ...]
    fresh: bool


@dataclass(frozen=True, slots=True)
class TerminationRecord:
    """What the agent asked of one instance: when first, how often, when last."""

    first_asked: float
    attempts: int
    last_asked: float

    def asked_again(self, now: float) -> TerminationRecord:
        return TerminationRecord(self.first_asked, self.attempts + 1, now)


@dataclass(frozen=True, slots=True)
class Adopt:
    key: PodKey
    instance: Instance


@dataclass(frozen=True, slots=True)
class Terminate:
    provider: str
    instance_id: str
    pod_uid: str
    reason: str


@dataclass(frozen=True, slots=True)
class Resync:
    key: PodKey
    reason: str


Action = Adopt | Terminate | Resync


@dataclass(frozen=True, slots=True)
class Plan:
    actions: tuple[Action, ...]
    first_seen: Mapping[InstanceKey, float]
    # Instances that should be gone whose termination is older than the deadline.
    overdue: tuple[InstanceKey, ...] = ()


@dataclass(frozen=True, slots=True)
class TerminationPolicy:
    deadline: float = 120.0  # asked this long ago and still there: overdue, ask again
    backoff: float = 10.0  # first re-ask after the deadline; doubles per attempt

    def retry_due(self, record: TerminationRecord, now: float) -> bool:
        if now - record.first_asked < self.deadline:
            return False
        pause = min(self.backoff * 2.0 ** max(record.attempts - 1, 0), MAX_TERMINATION_BACKOFF)
        return bool(now - record.last_asked >= pause)


def plan_reconcile(
    pods: Sequence[PodSnapshot],
    providers: Sequence[ProviderSnapshot],
    *,
    first_seen: Mapping[InstanceKey, float],
    now: float,
    grace: float,
    terminations: Mapping[InstanceKey, TerminationRecord] | None = None,
    policy: TerminationPolicy = TerminationPolicy(),  # frozen: one shared default is safe
) -> Plan:
    by_uid = {pod.uid: pod for pod in pods}
    asked = terminations or {}
    seen: dict[InstanceKey, float] = {}
    actions: list[Action] = []
    overdue: list[InstanceKey] = []
    listed: dict[str, set[str]] = {}

    def old_enough(key: InstanceKey) -> bool:
        return now - seen[key] >= grace

    def terminate(instance: Instance, key: InstanceKey, reason: str) -> None:
        """Ask for a termination, or re-ask one that stalled (TERMINATING past the deadline)."""
        record = asked.get(key)
        if instance.state is InstanceState.TERMINATING:
            # After a restart nothing is remembered: count from when it was first seen.
            record = record or TerminationRecord(seen[key], 1, seen[key])
            if now - record.first_asked >= policy.deadline:
                overdue.append(key)
            if not policy.retry_due(record, now):
                return
        elif record is not None and now - record.first_asked >= policy.deadline:
            overdue.append(key)  # asked, yet it still runs
        actions.append(Terminate(instance.provider, instance.instance_id, instance.pod_uid, reason))

    unclaimed: dict[str, list[Instance]] = {}
    stale = {snapshot.provider for snapshot in providers if not snapshot.fresh}
    # A failed poll is no evidence either way: what was seen keeps its first-seen time, or a
    # provider that fails every other poll would restart every grace period for ever.
    seen.update({key: at for key, at in first_seen.items() if key[0] in stale})
    for snapshot in providers:
        if not snapshot.fresh:
            continue
        listed[snapshot.provider] = {i.instance_id for i in snapshot.instances}
        for instance in snapshot.instances:
            if instance.state is InstanceState.TERMINATED:
                continue
            key = (snapshot.provider, instance.instance_id)
            seen[key] = first_seen.get(key, now)
            pod = by_uid.get(instance.pod_uid)
            if pod is None:
                if old_enough(key):
                    terminate(instance, key, "orphan")
            elif pod.terminal:
                if instance.state in ADOPTABLE or instance.state is InstanceState.TERMINATING:
                    terminate(instance, key, "its pod has ended")
            elif pod.instance_id is None:
                if not pod.deleting:
                    unclaimed.setdefault(pod.uid, []).append(instance)
            elif (pod.provider, pod.instance_id) != key and old_enough(key):
                terminate(instance, key, "duplicate")

    for uid, instances in sorted(unclaimed.items()):
        keep = choose_adoptee(instances)
        if keep is not None:
            actions.append(Adopt(by_uid[uid].key, keep))
        for other in instances:
            key = (other.provider, other.instance_id)
            if other is not keep and old_enough(key):
                terminate(other, key, "duplicate")

    for pod in pods:
        names = listed.get(pod.provider or "")
        vanished = names is not None and pod.instance_id not in names
        if vanished and pod.instance_id and not pod.terminal:
            actions.append(Resync(pod.key, "its instance is no longer listed"))

    return Plan(actions=tuple(actions), first_seen=seen, overdue=tuple(overdue))
