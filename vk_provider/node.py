"""The virtual node: registration, status and Lease, as three small pieces.

``build_node`` and ``node_status`` are pure: what the Node object should say, given the
configuration, what providers can give now, and the time. ``NodeController`` applies them:
register once, refresh status periodically, renew the Lease about every 10 s while at least
one provider answers. When the agent stops, nothing is written: the Lease simply expires and
the node-lifecycle controller marks the node NotReady, as for any kubelet.

Invariants:
- Capacity never goes negative and never exceeds the configured caps.
- Labels and taints the agent owns are set on registration and kept on update; other taints
  (e.g. ones the node-lifecycle controller or an operator adds) are never removed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from providers.models import Offer
from vk_provider import __version__
from vk_provider.config import NodeConfig
from vk_provider.kube import JSON, ConflictError, KubeClient
from vk_provider.offers import OfferBook

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeResources:
    gpus: int
    cpu: int
    memory_gib: int
    pods: int

    def as_quantities(self) -> dict[str, str]:
        return {
            "nvidia.com/gpu": str(self.gpus),
            "cpu": str(self.cpu),
            "memory": f"{self.memory_gib}Gi",
            "pods": str(self.pods),
        }


def node_capacity(
    offers: Iterable[Offer],
    config: NodeConfig,
    held: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> NodeResources:
    """What the providers can give right now plus what the node's pods hold, within the caps.

    Offers describe *free* capacity (adapters subtract the instances already running), while
    the scheduler subtracts the requests of the pods already on the node: so the node's
    capacity is the free part plus ``held`` (GPUs, vCPUs, GiB of the node's live pods).

    Offers of one provider, region and GPU model usually draw on one pool (1x, 2x, 4x and 8x
    shapes of the same machines), so a pool counts once, by its largest offer; distinct
    pools add up. Never negative, never above the caps.
    """
    pools: dict[tuple[str, str, str | None], tuple[float, float, float]] = {}
    for offer in offers:
        available = max(offer.available, 0)
        size = (
            max(offer.gpu_count, 0) * available,
            max(offer.vcpus, 0) * available,
            max(offer.memory_gib, 0) * available,
        )
        key = (offer.provider, offer.region, offer.gpu_model)
        best = pools.get(key, (0.0, 0.0, 0.0))
        pools[key] = (max(best[0], size[0]), max(best[1], size[1]), max(best[2], size[2]))
    gpus = sum(p[0] for p in pools.values()) + max(held[0], 0)
    cpu = sum(p[1] for p in pools.values()) + max(held[1], 0)
    memory = sum(p[2] for p in pools.values()) + max(held[2], 0)
    return NodeResources(
        gpus=min(int(gpus), config.max_gpus),
        cpu=min(int(cpu), config.max_cpu),
        memory_gib=min(int(memory), config.max_memory_gib),
        pods=config.max_pods,
    )


def node_labels(config: NodeConfig) -> dict[str, str]:
    return {
        **config.labels,
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": config.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "vk-provider",
    }


def _time(now: datetime) -> str:
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(now: datetime) -> str:
    """A MicroTime: always six fractional digits (the API server rejects other forms)."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_status(
    *,
    resources: NodeResources,
    ready: bool,
    reason: str,
    message: str,
    address: str,
    kubelet_port: int,
    node_name: str,
    now: datetime,
    previous: JSON | None = None,
) -> JSON:
    """The Node's status; transition times are kept when a condition's status is unchanged."""
    prior = {
        c.get("type"): c for c in ((previous or {}).get("status") or {}).get("conditions") or []
    }

    def condition(kind: str, status: str, why: str, text: str) -> dict[str, str]:
        old = prior.get(kind)
        transition = (
            old["lastTransitionTime"]
            if old and old.get("status") == status and old.get("lastTransitionTime")
            else _time(now)
        )
        return {
            "type": kind,
            "status": status,
            "reason": why,
            "message": text,
            "lastHeartbeatTime": _time(now),
            "lastTransitionTime": transition,
        }

    quantities = resources.as_quantities()
    return {
        "capacity": quantities,
        "allocatable": quantities,
        "conditions": [
            condition("Ready", "True" if ready else "False", reason, message),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": f"v1.37.2-vk-provider-{__version__}",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "vk-provider://" + __version__,
            "kernelVersion": "",
            "osImage": "vk-provider virtual node",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def build_node(config: NodeConfig) -> JSON:
    """The Node object to register (status is written separately through /status)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": config.name, "labels": node_labels(config)},
        "spec": {"taints": [t.model_dump() for t in config.taints]},
    }


def merged_taints(current: list[dict[str, Any]], config: NodeConfig) -> list[dict[str, Any]]:
    """Ours (from config) plus whatever others put there, without duplicates by key+effect."""
    ours = [t.model_dump() for t in config.taints]
    owned = {(t["key"], t["effect"]) for t in ours}
    others = [t for t in current if (t.get("key"), t.get("effect")) not in owned]
    return ours + others


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class NodeController:
    """Registers the node and keeps its status and Lease current."""

    def __init__(
        self,
        kube: KubeClient,
        config: NodeConfig,
        offers: OfferBook,
        *,
        address: str,
        kubelet_port: int,
        lease_seconds: float,
        lease_duration_seconds: int,
        status_seconds: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_lease_failure: Callable[[], None] = lambda: None,
        responsive: Callable[[float], set[str]] | None = None,
        held: Callable[[], tuple[float, float, float]] = lambda: (0.0, 0.0, 0.0),
    ) -> None:
        self._held = held
        self._on_lease_failure = on_lease_failure
        # Which providers answered any call lately; default: their offers calls.
        self._responsive = responsive or (lambda within: offers.responsive(within))
        self._kube = kube
        self._config = config
        self._offers = offers
        self._address = address
        self.kubelet_port = kubelet_port
        self._lease_seconds = lease_seconds
        self._lease_duration = lease_duration_seconds
        self._status_seconds = status_seconds
        self._clock = clock
        self._node_uid: str | None = None
        self.registered = asyncio.Event()

    @property
    def name(self) -> str:
        return self._config.name

    def _providers_answer(self) -> bool:
        # "Providers answer" = one answered within three lease periods (a slow provider must
        # not flap the node, a dead set of providers must stop the Lease).
        return bool(self._responsive(3 * self._lease_seconds + 30))

    async def register(self) -> None:
        existing = await self._kube.get_node(self.name)
        if existing is None:
            try:
                existing = await self._kube.create_node(build_node(self._config))
                log.info("registered node %s", self.name)
            except ConflictError:
                existing = await self._kube.get_node(self.name)
        if existing is not None:
            current = (existing.get("spec") or {}).get("taints") or []
            existing = await self._kube.patch_node(
                self.name,
                {
                    "metadata": {"labels": node_labels(self._config)},
                    "spec": {"taints": merged_taints(current, self._config)},
                },
            )
            self._node_uid = existing["metadata"]["uid"]
        await self.update_status()
        await self.renew_lease()
        self.registered.set()

    async def update_status(self) -> None:
        answering = self._providers_answer()
        resources = node_capacity(self._offers.cached(), self._config, self._held())
        previous = await self._kube.get_node(self.name)
        status = node_status(
            resources=resources,
            ready=answering,
            reason="KubeletReady" if answering else "ProvidersUnavailable",
            message=(
                "vk-provider is posting ready status"
                if answering
                else "no provider has answered recently"
            ),
            address=self._address,
            kubelet_port=self.kubelet_port,
            node_name=self.name,
            now=self._clock(),
            previous=previous,
        )
        await self._kube.patch_node_status(self.name, status)

    def _lease_body(self, resource_version: str | None) -> JSON:
        metadata: JSON = {"name": self.name, "namespace": "kube-node-lease"}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        if self._node_uid:
            # Owned by the Node, as a kubelet's Lease is, so it goes when the Node goes.
            metadata["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self._node_uid}
            ]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.name,
                "leaseDurationSeconds": self._lease_duration,
                "renewTime": micro_time(self._clock()),
            },
        }

    async def renew_lease(self) -> bool:
        """Renew (or create) the Lease if providers answer; return whether it was renewed."""
        if not self._providers_answer():
            log.warning("not renewing the node Lease: no provider has answered recently")
            return False
        current = await self._kube.get_lease(self.name)
        if current is None:
            try:
                await self._kube.create_lease(self._lease_body(None))
            except ConflictError:
                return False
            return True
        try:
            await self._kube.replace_lease(
                self.name, self._lease_body(current["metadata"]["resourceVersion"])
            )
        except ConflictError:
            return False  # someone else wrote it meanwhile; the next period retries
        return True

    async def run_lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lease_seconds)
            try:
                await self._offers.offers()  # keeps provider answers fresh
                renewed = await self.renew_lease()
            except Exception:  # a failed renewal is retried next period, never fatal
                log.exception("node Lease renewal failed")
                renewed = False
            if not renewed:
                self._on_lease_failure()

    async def run_status_loop(self) -> None:
        while True:
            await asyncio.sleep(self._status_seconds)
            try:
                await self.update_status()
            except Exception:
                log.exception("node status update failed")
