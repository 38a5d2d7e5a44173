"""The hand-over controller (docs/overflow.md#the-hand-over): training takes the own GPUs only
after the inference it displaces runs elsewhere.

Every ``interval_seconds``, on the leader: read the nodes, the pods, and (when Kueue is
installed) the Workloads and AdmissionChecks; for each held gang — pods gated by
``vk-provider.io/handover``, or a Workload whose ``vk-provider.io/handover`` check is
Pending with quota reserved — take the step ``domain.handoverstep.decide`` says:

- claim the planned own nodes (taint NoSchedule + label, with the node's resourceVersion);
- keep the overflow open (``holding_open``, read by the flip) while a claim stands;
- evict the displaced pods through the Eviction API once the overflow is open, paced by
  their PodDisruptionBudgets (the API refuses an eviction beyond the budget: HTTP 429, tried
  again next tick) and, for pods no budget covers, ``evictions_without_budget`` at a time;
- release, once the claimed nodes are free and every pod of the displaced pods' controllers
  (recorded on the claimed nodes) is Ready again: remove the gate (adding the claim's
  toleration and a node-affinity term for its label) or set the check Ready with
  ``podSetUpdates`` doing the same;
- drop a claim once its gang's pods are bound (or the gang is gone).

Before a claim, the displaced pods are rehearsed (``rehearse``: ``controllers.rehearsal``):
when their replacements cannot be placed within the budget caps, or no provider can run or
has room for one, the gang is held as when there is no room elsewhere.

When a hand-over cannot be done (no placement, no room elsewhere, no money) or runs longer than
``timeout_seconds``: policy ``wait`` keeps the training held (a timed-out hand-over drops
its claims and starts again; a Kueue check goes to Retry with ``requeueAfterSeconds``
``kueue_retry_seconds``, so Kueue releases the quota, requeues the Workload and resets the
check to Pending when it reserves quota again), policy ``force`` releases it unbound, as
without a hand-over. Events on the gang (the Workload, or each gated pod) and on the claimed
nodes say each step once; ``view`` is what ``GET /v1/overflow`` shows.

Invariants: level-triggered — every decision is taken from what the cluster shows, so a
restarted agent resumes a hand-over from its claims (only its timeout clock starts again);
nothing is evicted before its node is claimed or while the overflow is closed; a failed
call is retried next tick, never fatal.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from vk_provider.controllers.ticker import every
from vk_provider.domain import explain
from vk_provider.domain.handoverstep import (
    DISPLACED,
    HANDOVER,
    Action,
    Decision,
    HandoverView,
    HeldGang,
    NodeView,
    claim_of,
    claimed_taints,
    decide,
    owner_of,
    paced,
    pod_set_updates,
    release_pod_patch,
)
from vk_provider.domain.handoverworld import (
    GatedGang,
    budgeted,
    check_state,
    claims_in_use,
    displaced_owners,
    gated_gangs,
    kueue_gangs,
    node_views,
    terminating_keys,
    unready_replacements,
    virtual_room,
)
from vk_provider.domain.logfields import about
from vk_provider.domain.overflow import OverflowState, state_from_taints
from vk_provider.domain.podview import rfc3339
from vk_provider.kube.client import ConflictError, KubeClient, NotFoundError
from vk_provider.settings.overflow import HandoverConfig

log = logging.getLogger(__name__)
JSON = dict[str, Any]
KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1"
LIVE_PODS = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
UNBOUND_PODS = {"fieldSelector": "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"}
KUEUE_RECHECK_SECONDS = 60.0

PLANNED = "HandoverPlanned"
HELD = "HandoverHeld"
EVICTED = "HandoverEviction"
RELEASED = "HandoverReleased"
TIMED_OUT = "HandoverTimedOut"
FORCED = "HandoverForced"


class Events(Protocol):
    async def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Held:
    gang: HeldGang
    pods: tuple[Mapping[str, Any], ...] = ()  # gated pods (native)
    workload: Mapping[str, Any] | None = None  # Kueue


class HandoverController:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        config: HandoverConfig,
        overflow_taint_key: str,
        events: Events,
        rehearse: Callable[[Sequence[Mapping[str, Any]]], Awaitable[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._config = config
        self._overflow_key = overflow_taint_key
        self._events = events
        self._rehearse = rehearse
        self._clock = clock
        self._wall = wall_clock
        self._started: dict[str, float] = {}  # gang id -> when its hand-over began
        self._said: dict[str, str] = {}  # gang id -> the last step message recorded
        self._views: tuple[HandoverView, ...] = ()
        self._open_for = ""
        self._no_kueue_until = 0.0  # Kueue's API answered 404: look again after this

    # --- what others read ---------------------------------------------------------------

    def holding_open(self) -> str:
        """Why the overflow must be open now (a hand-over holds claims), or ""."""
        return self._open_for

    def view(self) -> tuple[HandoverView, ...]:
        return self._views

    # --- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        await every(lambda: self._config.interval_seconds, self.tick, log=log, what="hand-over")

    async def tick(self) -> None:
        nodes = await self._items("/api/v1/nodes")
        virtual = next((n for n in nodes if n["metadata"]["name"] == self._node), None)
        if virtual is None:
            return  # not registered yet
        # Idle, a tick reads the nodes, the unbound pods and Kueue's Workloads; the whole
        # cluster's pods only while something is held or claimed.
        unbound = await self._items("/api/v1/pods", UNBOUND_PODS)
        workloads, checks = await self._kueue_objects()
        if not (
            gated_gangs(unbound)
            or kueue_gangs(workloads, checks)
            or any(claim_of(n) is not None for n in nodes)
        ):
            self._views, self._open_for = (), ""
            self._started.clear()
            self._said.clear()
            return
        pods = await self._items("/api/v1/pods", LIVE_PODS)
        overflow_open = (
            state_from_taints(
                (virtual.get("spec") or {}).get("taints") or [], key=self._overflow_key
            )
            is OverflowState.OPEN
        )
        views = node_views(nodes, pods)
        by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
        leaving = terminating_keys(pods)
        room = virtual_room(virtual, pods)
        held = await self._held(pods, workloads, checks)
        shown: list[HandoverView] = []
        active: list[str] = []
        for entry in held:
            gang = entry.gang
            owners = displaced_owners(nodes, gang.id)
            decision = decide(
                gang,
                views,
                terminating=leaving,
                virtual_room=room,
                unready_replacements=unready_replacements(pods, owners),
            )
            if decision.action is Action.CLAIM:
                decision = await self._afford(decision, by_key)
            decision = await self._act(
                entry, decision, views, by_key, leaving, overflow_open, checks
            )
            if decision.action in (Action.CLAIM, Action.EVICT, Action.WAIT):
                active.append(gang.key)
                claimed = set(decision.nodes) | {v.name for v in views if v.claim == gang.id}
                views = [replace(v, claim=gang.id) if v.name in claimed else v for v in views]
                if decision.action is Action.CLAIM and decision.plan is not None:
                    room = max(room - decision.plan.cost.gpus, 0)  # the next gang's share
            shown.append(self._view_of(gang, decision, views))
        in_use = claims_in_use(pods, workloads, checks, (e.gang.id for e in held))
        for view in views:
            if view.claim is not None and view.claim not in in_use:
                await self._claim(view.name, None)
        for gone in (set(self._started) | set(self._said)) - {e.gang.id for e in held}:
            self._started.pop(gone, None)
            self._said.pop(gone, None)
        self._views = tuple(shown)
        self._open_for = f"the hand-over of {', '.join(active)}" if active else ""

    async def _afford(self, decision: Decision, by_key: Mapping[str, JSON]) -> Decision:
        """A planned claim, or HOLD when the displaced pods' replacements cannot be placed
        within the budget caps (``controllers.rehearsal``)."""
        if self._rehearse is None or decision.plan is None:
            return decision
        displaced = [by_key[p.key] for p in decision.plan.displaced if p.key in by_key]
        missing = await self._rehearse(displaced)
        if not missing:
            return decision
        return Decision(Action.HOLD, f"{missing}: {decision.plan.describe()}", decision.plan)

    # --- reading ------------------------------------------------------------------------

    async def _items(self, path: str, query: Mapping[str, str] | None = None) -> list[JSON]:
        body = await self._kube.request("GET", path, query=query)
        return list(body.get("items") or [])

    async def _kueue_objects(self) -> tuple[list[JSON], frozenset[str]]:
        if self._clock() < self._no_kueue_until:
            return [], frozenset()
        try:
            checks = [
                c
                for c in await self._items(f"{KUEUE}/admissionchecks")
                if (c.get("spec") or {}).get("controllerName") == HANDOVER
            ]
        except NotFoundError:
            if not self._no_kueue_until:
                log.info("hand-over: Kueue is not installed; holding by scheduling gate only")
            self._no_kueue_until = self._clock() + KUEUE_RECHECK_SECONDS
            return [], frozenset()
        for check in checks:
            await self._activate(check)
        names = frozenset(str(c["metadata"]["name"]) for c in checks)
        if not names:
            return [], names
        return await self._items(f"{KUEUE}/workloads"), names

    async def _held(
        self, pods: Sequence[JSON], workloads: Sequence[JSON], checks: frozenset[str]
    ) -> list[_Held]:
        held: list[_Held] = []
        for group in gated_gangs(pods):
            if group.members_present >= await self._min_count(group):
                held.append(_Held(group.gang, pods=group.pods))
        held.extend(_Held(gang, workload=w) for gang, w in kueue_gangs(workloads, checks))
        return held

    async def _min_count(self, group: GatedGang) -> int:
        """Pods the gang must have before it is planned: its PodGroup's minCount."""
        kind, _, ref = group.gang.key.partition(" ")
        if kind != "PodGroup":
            return 1
        namespace, _, name = ref.partition("/")
        try:
            found = await self._kube.request(
                "GET", f"{PODGROUPS}/namespaces/{namespace}/podgroups/{name}"
            )
        except NotFoundError:
            return len(group.pods)
        gang = ((found.get("spec") or {}).get("schedulingPolicy") or {}).get("gang") or {}
        return int(gang.get("minCount") or 1)

    # --- acting -------------------------------------------------------------------------

    async def _act(
        self,
        entry: _Held,
        decision: Decision,
        views: Sequence[NodeView],
        by_key: Mapping[str, JSON],
        leaving: frozenset[str],
        overflow_open: bool,
        checks: frozenset[str],
    ) -> Decision:
        gang = entry.gang
        now = self._clock()
        if decision.action in (Action.CLAIM, Action.EVICT, Action.WAIT):
            began = self._started.setdefault(gang.id, now)
            if now - began > self._config.timeout_seconds:
                return await self._timed_out(entry, decision, views, checks)
        if decision.action is Action.HOLD:
            if self._config.policy == "force":
                forced = Decision(Action.RELEASE, f"forced ({decision.reason})")
                await self._release(entry, forced, checks, FORCED, explain.WARNING)
                return forced
            # Kueue: Retry, so Kueue releases the quota and asks again after
            # kueue_retry_seconds (the check is reset to Pending then).
            await self._say(
                entry,
                HELD,
                explain.WARNING,
                f"training held: {decision.reason}",
                checks,
                check="Retry",
            )
        elif decision.action is Action.CLAIM:
            assert decision.plan is not None
            for placement in decision.plan.placements:
                owners = sorted(
                    {o for p in placement.displaced if (o := owner_of(by_key.get(p.key) or {}))}
                )
                await self._claim(placement.node, gang.id, owners)
            await self._say(entry, PLANNED, explain.NORMAL, decision.reason, checks, decision.nodes)
        elif decision.action is Action.EVICT:
            if not overflow_open:
                waiting = replace(
                    decision, action=Action.WAIT, reason="waiting for the overflow to open"
                )
                await self._say(entry, PLANNED, explain.NORMAL, waiting.reason, checks)
                return waiting
            await self._evict(gang, decision, views, by_key, leaving)
            await self._say(entry, PLANNED, explain.NORMAL, decision.reason, checks)
        elif decision.action is Action.WAIT:
            await self._say(entry, PLANNED, explain.NORMAL, decision.reason, checks)
        elif decision.action is Action.RELEASE:
            await self._release(entry, decision, checks, RELEASED, explain.NORMAL)
        elif decision.action is Action.UNCLAIM:
            await self._unclaim(gang, views)
        return decision

    async def _timed_out(
        self, entry: _Held, decision: Decision, views: Sequence[NodeView], checks: frozenset[str]
    ) -> Decision:
        gang = entry.gang
        self._started.pop(gang.id, None)
        message = (
            f"the hand-over took more than {self._config.timeout_seconds:g}s "
            f"(handover.timeout_seconds): {decision.reason}"
        )
        if self._config.policy == "force":
            forced = Decision(Action.RELEASE, f"forced: {message}")
            await self._release(entry, forced, checks, FORCED, explain.WARNING)
            await self._unclaim(gang, views)
            return forced
        await self._unclaim(gang, views)
        if entry.workload is not None:
            await self._set_check(entry.workload, checks, "Retry", f"{message}; retrying")
        await self._record(entry, TIMED_OUT, explain.WARNING, f"{message}; planning again")
        return Decision(Action.HOLD, message)

    async def _claim(self, name: str, gang_id: str | None, owners: Sequence[str] = ()) -> None:
        """Put (or, with None, take off) the hand-over claim on node ``name``, with the
        controllers of the pods it displaces there (``owners``)."""
        for _ in range(5):
            node = await self._kube.get_node(name)
            if node is None:
                return
            taints = (node.get("spec") or {}).get("taints") or []
            labels = (node.get("metadata") or {}).get("labels") or {}
            annotations = (node.get("metadata") or {}).get("annotations") or {}
            recorded = json.dumps(list(owners)) if gang_id is not None else None
            wanted = claimed_taints(taints, gang_id)
            if (
                wanted == taints
                and labels.get(HANDOVER) == gang_id
                and (gang_id is not None or DISPLACED not in annotations)
                and (gang_id is None or DISPLACED in annotations)
            ):
                return
            patch = {
                "metadata": {
                    "resourceVersion": node["metadata"].get("resourceVersion"),
                    "labels": {HANDOVER: gang_id},
                    "annotations": {DISPLACED: recorded},
                },
                "spec": {"taints": wanted},
            }
            try:
                await self._kube.request("PATCH", f"/api/v1/nodes/{name}", body=patch, merge=True)
                log.info(
                    "hand-over: node %s %s",
                    name,
                    f"claimed for {gang_id}" if gang_id else "unclaimed",
                )
                return
            except ConflictError:
                continue

    async def _unclaim(self, gang: HeldGang, views: Sequence[NodeView]) -> None:
        for view in views:
            if view.claim == gang.id:
                await self._claim(view.name, None)

    async def _evict(
        self,
        gang: HeldGang,
        decision: Decision,
        views: Sequence[NodeView],
        by_key: Mapping[str, JSON],
        leaving: frozenset[str],
    ) -> None:
        pdbs = await self._items("/apis/policy/v1/poddisruptionbudgets")
        claimed = [p for v in views if v.claim == gang.id for p in v.pods]
        covered = budgeted([*decision.evict, *claimed], by_key, pdbs)
        unbudgeted_leaving = sum(1 for p in claimed if p.key in leaving and not covered[p.key])
        for pod in paced(
            decision.evict,
            budgeted=covered,
            unbudgeted_leaving=unbudgeted_leaving,
            limit=self._config.evictions_without_budget,
        ):
            if await self._kube.evict_pod(pod.namespace, pod.name) != "evicted":
                continue  # gone, or its budget allows no more now: next tick
            log.info("hand-over: evicted for %s", gang.key, extra=about(pod.key))
            target = by_key.get(pod.key)
            if target is not None:
                await self._events.record(
                    dict(target),
                    explain.NORMAL,
                    EVICTED,
                    f"evicted to make room for {gang.key}; its replacement runs on the "
                    "virtual node",
                )

    async def _release(
        self, entry: _Held, decision: Decision, checks: frozenset[str], reason: str, kind: str
    ) -> None:
        gang_id = entry.gang.id if decision.nodes else None
        for pod in entry.pods:
            meta = pod["metadata"]
            try:
                await self._kube.request(
                    "PATCH",
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    body=release_pod_patch(pod, gang_id),
                    merge=True,
                )
            except (NotFoundError, ConflictError):
                continue  # gone, or changed: the next tick sees it again
        if entry.workload is not None:
            await self._set_check(
                entry.workload,
                checks,
                "Ready",
                decision.reason,
                pod_set_updates(entry.workload, gang_id),
            )
        self._started.pop(entry.gang.id, None)
        log.info("hand-over: released %s (%s)", entry.gang.key, decision.reason)
        await self._record(entry, reason, kind, f"training released: {decision.reason}")

    async def _set_check(
        self,
        workload: Mapping[str, Any],
        checks: frozenset[str],
        state: str,
        message: str,
        updates: list[JSON] | None = None,
    ) -> None:
        current = check_state(workload, checks)
        if current is None:
            return
        status = workload.get("status") or {}
        changed = current.get("state") != state
        wanted = {
            **current,
            "state": state,
            "message": message[:1000],
            "lastTransitionTime": rfc3339(self._wall())
            if changed
            else current.get("lastTransitionTime"),
        }
        if state == "Retry":
            wanted["requeueAfterSeconds"] = self._config.kueue_retry_seconds
        if updates:
            wanted["podSetUpdates"] = updates
        if wanted == current:
            return
        states = [
            wanted if s.get("name") == current["name"] else s
            for s in status.get("admissionChecks") or []
        ]
        meta = workload["metadata"]
        try:
            await self._kube.request(
                "PATCH",
                f"{KUEUE}/namespaces/{meta['namespace']}/workloads/{meta['name']}/status",
                body={
                    "metadata": {"resourceVersion": meta.get("resourceVersion")},
                    "status": {"admissionChecks": states},
                },
                merge=True,
            )
        except (ConflictError, NotFoundError):
            return  # changed meanwhile: the next tick decides again

    async def _activate(self, check: Mapping[str, Any]) -> None:
        """Mark our AdmissionCheck Active (Kueue keeps a ClusterQueue using it inactive until
        its controller does)."""
        for condition in (check.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Active" and condition.get("status") == "True":
                return
        active = {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": "vk-provider runs the hand-over for this check",
            "lastTransitionTime": rfc3339(self._wall()),
            "observedGeneration": (check.get("metadata") or {}).get("generation", 0),
        }
        name = check["metadata"]["name"]
        await self._kube.request(
            "PATCH",
            f"{KUEUE}/admissionchecks/{name}/status",
            body={"status": {"conditions": [active]}},
            merge=True,
        )
        log.info("hand-over: AdmissionCheck %s active", name)

    async def _say(
        self,
        entry: _Held,
        reason: str,
        kind: str,
        message: str,
        checks: frozenset[str],
        nodes: Sequence[str] = (),
        check: str = "Pending",
    ) -> None:
        """Record ``message`` once per change on the gang and the claimed nodes; a Kueue
        check is set to ``check`` with it at every tick (a no-op when it already is)."""
        if entry.workload is not None:
            await self._set_check(entry.workload, checks, check, message)
        if self._said.get(entry.gang.id) == message:
            return
        self._said[entry.gang.id] = message
        log.info("hand-over: %s: %s", entry.gang.key, message)
        await self._record(entry, reason, kind, message)
        for name in nodes:
            node = await self._kube.get_node(name)
            if node is not None:
                await self._events.record(node, kind, reason, f"{entry.gang.key}: {message}")

    async def _record(self, entry: _Held, reason: str, kind: str, message: str) -> None:
        if entry.workload is not None:
            await self._events.record(dict(entry.workload), kind, reason, message)
        for pod in entry.pods:
            await self._events.record(dict(pod), kind, reason, message)

    def _view_of(
        self, gang: HeldGang, decision: Decision, views: Sequence[NodeView]
    ) -> HandoverView:
        began = self._started.get(gang.id)
        nodes = decision.nodes or tuple(v.name for v in views if v.claim == gang.id)
        displaced = tuple(p.key for p in decision.plan.displaced) if decision.plan else ()
        return HandoverView(
            gang=gang.key,
            gpus=sum(gang.members),
            members=len(gang.members),
            step=decision.action.value,
            reason=decision.reason,
            nodes=nodes,
            displaced=displaced,
            for_seconds=0.0 if began is None else self._clock() - began,
        )
