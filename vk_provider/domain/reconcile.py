"""Periodic reconciliation: a pure plan from snapshots, applied by the pod controller.

``plan_reconcile`` compares what Kubernetes says (the pods on the node, with the instance each
one's annotations name) with what the providers say (one ``list_ours`` per provider) and
returns the actions that make them agree:

- an instance whose pod UID matches no live pod on the node, for longer than ``grace``:
  ``Terminate`` it (orphan);
- an instance of a pod that already ended (Succeeded/Failed) and still runs: ``Terminate``;
- instances of a live pod that names none (a crash between create and annotate): ``Adopt``
  the best one, ``Terminate`` the others (duplicates);
- an instance of a live pod that names a different one, for longer than ``grace``:
  ``Terminate`` (duplicate, or an old attempt);
- a pod naming an instance its provider no longer lists (fresh list): ``Resync`` the pod
  (its sync fails it with InstanceLost).

Invariants:
- Pure: no I/O, no clock; ``now`` and the first time each instance was seen are inputs, and
  the updated first-seen map is an output.
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

_GONE = (InstanceState.TERMINATED, InstanceState.TERMINATING)
_ALIVE_RANK = {
    InstanceState.RUNNING: 3,
    InstanceState.PENDING: 2,
    InstanceState.EXITED: 1,
    InstanceState.LOST: 0,
}


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


def _best(instances: Sequence[Instance]) -> Instance:
    """The instance to keep among several of one pod: most alive, then latest attempt."""
    return max(instances, key=lambda i: (_ALIVE_RANK.get(i.state, 0), i.attempt, i.instance_id))


def plan_reconcile(
    pods: Sequence[PodSnapshot],
    providers: Sequence[ProviderSnapshot],
    *,
    first_seen: Mapping[InstanceKey, float],
    now: float,
    grace: float,
) -> Plan:
    by_uid = {pod.uid: pod for pod in pods}
    seen: dict[InstanceKey, float] = {}
    actions: list[Action] = []
    listed: dict[str, set[str]] = {}

    def old_enough(key: InstanceKey) -> bool:
        return now - seen[key] >= grace

    unclaimed: dict[str, list[Instance]] = {}
    for snapshot in providers:
        if not snapshot.fresh:
            continue
        listed[snapshot.provider] = {i.instance_id for i in snapshot.instances}
        for instance in snapshot.instances:
            if instance.state in _GONE:
                continue
            key = (snapshot.provider, instance.instance_id)
            seen[key] = first_seen.get(key, now)
            pod = by_uid.get(instance.pod_uid)
            if pod is None:
                if old_enough(key):
                    actions.append(
                        Terminate(
                            snapshot.provider, instance.instance_id, instance.pod_uid, "orphan"
                        )
                    )
            elif pod.terminal:
                if instance.state in (InstanceState.RUNNING, InstanceState.PENDING):
                    actions.append(
                        Terminate(
                            snapshot.provider, instance.instance_id, pod.uid, "its pod has ended"
                        )
                    )
            elif pod.instance_id is None:
                if not pod.deleting:
                    unclaimed.setdefault(pod.uid, []).append(instance)
            elif (pod.provider, pod.instance_id) != key and old_enough(key):
                actions.append(
                    Terminate(snapshot.provider, instance.instance_id, pod.uid, "duplicate")
                )

    for uid, instances in sorted(unclaimed.items()):
        keep = _best(instances)
        actions.append(Adopt(by_uid[uid].key, keep))
        for other in instances:
            if other is not keep and old_enough((other.provider, other.instance_id)):
                actions.append(Terminate(other.provider, other.instance_id, uid, "duplicate"))

    for pod in pods:
        names = listed.get(pod.provider or "")
        vanished = names is not None and pod.instance_id not in names
        if vanished and pod.instance_id and not pod.terminal:
            actions.append(Resync(pod.key, "its instance is no longer listed"))

    return Plan(actions=tuple(actions), first_seen=seen)
