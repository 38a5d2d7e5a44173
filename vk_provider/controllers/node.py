"""The virtual node: registration, status and Lease, as three small pieces.

What the Node says is computed by the pure ``vk_provider.domain.node``; ``NodeController``
applies it:
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
from collections.abc import Callable
from datetime import UTC, datetime

from vk_provider.controllers.offers import OfferBook
from vk_provider.domain.node import (
    build_node,
    gpu_label_patch,
    gpu_labels,
    merged_taints,
    node_capacity,
    node_labels,
    node_status,
)
from vk_provider.domain.podview import micro_time
from vk_provider.kube.client import JSON, ConflictError, KubeClient
from vk_provider.settings.agent import IntervalsConfig, NodeConfig

log = logging.getLogger(__name__)


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
        intervals: IntervalsConfig,
        address: str,
        kubelet_port: int,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_lease_failure: Callable[[], None] = lambda: None,
        responsive: Callable[[float], set[str]] | None = None,
        held: Callable[[], tuple[float, float, float]] = lambda: (0.0, 0.0, 0.0),
        flip_taint: JSON | None = None,
    ) -> None:
        self._held = held
        # With the overflow flip on, its taint is the flip's: set (closed) only on a node that
        # has none with its key, never re-asserted here (controllers.overflow owns it).
        self._flip_taint = flip_taint
        self._on_lease_failure = on_lease_failure
        # Which providers answered any call lately; default: their offers calls.
        self._responsive = responsive or (lambda within: offers.responsive(within))
        self._kube = kube
        self._config = config
        self._offers = offers
        self._address = address
        self.kubelet_port = kubelet_port
        self._intervals = intervals
        self._clock = clock
        self._node_uid: str | None = None
        self.registered = asyncio.Event()

    @property
    def name(self) -> str:
        return self._config.name

    def _providers_answer(self) -> bool:
        # "Providers answer" = one answered within three lease periods (a slow provider must
        # not flap the node, a dead set of providers must stop the Lease).
        return bool(self._responsive(3 * self._intervals.lease_seconds + 30))

    def _our_taints(self) -> list[JSON]:
        """The configured taints this controller keeps asserting (not the flip's)."""
        flip_key = self._flip_taint["key"] if self._flip_taint else None
        return [dict(t) for t in self._config.taint_objects() if t["key"] != flip_key]

    def _taints(self, current: list[JSON]) -> list[JSON]:
        taints = merged_taints(current, self._our_taints())
        flip = self._flip_taint
        if flip is not None and not any(t.get("key") == flip["key"] for t in taints):
            taints.append(dict(flip))  # a node new to the flip starts closed
        return taints

    async def register(self) -> None:
        existing = await self._kube.get_node(self.name)
        if existing is None:
            try:
                existing = await self._kube.create_node(
                    build_node(self._config.name, self._config.labels, self._taints([]))
                )
                log.info("registered node %s", self.name)
            except ConflictError:
                existing = await self._kube.get_node(self.name)
        if existing is not None:
            current = (existing.get("spec") or {}).get("taints") or []
            existing = await self._kube.patch_node(
                self.name,
                {
                    "metadata": {"labels": node_labels(self.name, self._config.labels)},
                    "spec": {"taints": self._taints(current)},
                },
            )
            self._node_uid = existing["metadata"]["uid"]
        # The Lease first: whoever sees the node Ready can rely on its Lease being there.
        await self.renew_lease()
        await self.update_status()
        self.registered.set()

    async def update_status(self) -> None:
        answering = self._providers_answer()
        resources = node_capacity(self._offers.cached(), self._config.caps, self._held())
        previous = await self._kube.get_node(self.name)
        labels = ((previous or {}).get("metadata") or {}).get("labels") or {}
        patch = gpu_label_patch(labels, gpu_labels(self._offers.cached()))
        if previous is not None and patch:
            await self._kube.patch_node(self.name, {"metadata": {"labels": patch}})
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
                "leaseDurationSeconds": self._intervals.lease_duration_seconds,
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
            await asyncio.sleep(self._intervals.lease_seconds)
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
            await asyncio.sleep(self._intervals.node_status_seconds)
            try:
                await self.update_status()
            except Exception:
                log.exception("node status update failed")
