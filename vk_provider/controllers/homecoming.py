"""The way home (docs/overflow.md#the-way-home-dearest-first): while the overflow is closed,
evict the virtual node's rented pods dearest first, through the Eviction API, only where they
fit at home.

Every ``interval_seconds``, on the leader: read the virtual node; when its overflow taint says
closed and pods are bound to it, read the own nodes, the live pods and the
PodDisruptionBudgets, let ``domain.homecoming.choose`` pick, and evict in its order. The API
refuses an eviction beyond a pod's budget (HTTP 429): the tick ends there (a cheaper pod
never overtakes the refused one when the budget frees a moment later) and the next tries
again, so the dearest leaves first and the next one once the budget allows. Each eviction
gets an Event ``MovedHome`` on the pod with its price.

Invariants: nothing is evicted while the overflow is open or the virtual node is unknown;
only pods with a controller move (a bare pod evicted would be lost); claimed own nodes
(a hand-over's) give no room; a failed call is retried next tick.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from vk_provider.controllers.ticker import every
from vk_provider.domain import explain
from vk_provider.domain.handoverworld import budgeted, key, node_pod, node_views, terminating
from vk_provider.domain.homecoming import Rented, choose
from vk_provider.domain.logfields import about
from vk_provider.domain.overflow import OverflowState, state_from_taints
from vk_provider.domain.podview import ANN_PRICE
from vk_provider.kube.client import KubeClient
from vk_provider.settings.overflow import MoveHomeConfig

log = logging.getLogger(__name__)
JSON = dict[str, Any]
LIVE_PODS = {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}
MOVED_HOME = "MovedHome"


class Events(Protocol):
    async def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None: ...


class HomecomingController:
    def __init__(
        self,
        kube: KubeClient,
        *,
        node_name: str,
        config: MoveHomeConfig,
        overflow_taint_key: str,
        events: Events,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._config = config
        self._key = overflow_taint_key
        self._events = events

    async def run(self) -> None:
        await every(lambda: self._config.interval_seconds, self.tick, log=log, what="way home")

    async def tick(self) -> None:
        virtual = await self._kube.get_node(self._node)
        if virtual is None:
            return
        taints = (virtual.get("spec") or {}).get("taints") or []
        if state_from_taints(taints, key=self._key) is not OverflowState.CLOSED:
            return
        query = {"fieldSelector": f"spec.nodeName={self._node},{LIVE_PODS['fieldSelector']}"}
        here = await self._items("/api/v1/pods", query)
        if not here:
            return
        nodes = await self._items("/api/v1/nodes")
        pods = await self._items("/api/v1/pods", LIVE_PODS)
        pdbs = await self._items("/apis/policy/v1/poddisruptionbudgets")
        home_free = [v.free for v in node_views(nodes, pods) if v.usable and v.claim is None]
        by_key = {key(p): p for p in here}
        covered = budgeted((node_pod(p) for p in here), by_key, pdbs)
        rented = [self._rented(p, covered[key(p)]) for p in here]
        for pod in choose(rented, home_free, limit=self._config.evictions_without_budget):
            if not await self._evict(pod, by_key[pod.key]) and pod.budgeted:
                # Refused by its budget: a cheaper pod must not overtake it when the budget
                # frees a moment later, so this tick ends here.
                return

    async def _items(self, path: str, query: Mapping[str, str] | None = None) -> list[JSON]:
        body = await self._kube.request("GET", path, query=query)
        return list(body.get("items") or [])

    def _rented(self, pod: Mapping[str, Any], is_budgeted: bool) -> Rented:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        price = (meta.get("annotations") or {}).get(ANN_PRICE) or "0"
        try:
            per_hour = float(price)
        except ValueError:
            per_hour = 0.0
        owned = any(o.get("controller") for o in meta.get("ownerReferences") or [])
        return Rented(
            namespace=str(meta.get("namespace")),
            name=str(meta.get("name")),
            gpus=node_pod(pod).gpus,
            price=per_hour,
            budgeted=is_budgeted,
            leaving=terminating(pod),
            movable=owned and not _tolerates_closed(spec.get("tolerations") or [], self._key),
        )

    async def _evict(self, pod: Rented, body: Mapping[str, Any]) -> bool:
        """Evict ``pod``; False when its budget refused (HTTP 429)."""
        outcome = await self._kube.evict_pod(pod.namespace, pod.name)
        if outcome != "evicted":
            return outcome == "gone"  # refused: its budget allows no more now, next tick
        message = (
            f"moved home, dearest first: the overflow is closed and this replica cost "
            f"${pod.price:g}/h"
        )
        log.info("way home: evicted, dearest first ($%g/h)", pod.price, extra=about(pod.key))
        await self._events.record(dict(body), explain.NORMAL, MOVED_HOME, message)
        return True


def _tolerates_closed(tolerations: Sequence[Mapping[str, Any]], taint_key: str) -> bool:
    """Whether the tolerations take the closed overflow taint (key, NoSchedule)."""
    for toleration in tolerations:
        operator = toleration.get("operator") or "Equal"
        key_ok = toleration.get("key") == taint_key or (
            not toleration.get("key") and operator == "Exists"
        )
        effect_ok = toleration.get("effect") in (None, "", "NoSchedule")
        if key_ok and effect_ok:
            return True
    return False
