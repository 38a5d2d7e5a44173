"""The placement dry run: where a pod would go now, and why, with nothing launched.

``PlacementPreview.preview(pod)`` reads the pod as the placer does (``workload.to_request``,
the shape check), but without its containers' environment (``workload.without_environment``):
placement never depends on it, so no Secret or ConfigMap is fetched and no value of one can be
returned. It then asks the ``Launcher`` for the plan of a first launch (``Launcher.plan``: the
same ranking, blocks, breakers and budget room that ``launch`` uses) over the offers of the
same ``OfferBook``. So the offer it names first is the one the agent tries first when the pod
is created, unless something changes in between (an offer sells out, a provider fails, the
budget fills).

A pod of a manifest may lack a UID or a name (``kubectl create --dry-run`` output, a template):
they are filled with placeholders, as the pod is never written anywhere.

Invariants: no effects — nothing is launched, no budget reserved, no block set, no Event
written, no pod read or changed; the offer book may refresh its cache, as before any launch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.offers import OfferBook
from vk_provider.domain import explain
from vk_provider.domain.models import Offer
from vk_provider.domain.placement import (
    FILTERS,
    Penalties,
    PlacementRequest,
    ProviderHealth,
    penalties,
    score,
    shape_refused,
)
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.workload import to_request, without_environment

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # names no instance
PLACEHOLDER_NAME = "dry-run"


class Outcome(enum.Enum):
    PLACED = "placed"  # the first offer of ``ranked`` would be launched
    NO_CAPACITY = "no_capacity"  # nothing fits now (NoCapacity): the pod would wait
    BUDGET_EXCEEDED = "budget_exceeded"  # only a budget cap stands in the way
    INVALID = "invalid"  # no provider can ever run it as it is (InvalidSpec)


@dataclass(frozen=True, slots=True)
class RankedOffer:
    offer: Offer
    score: float  # the price after penalties, as ``place()`` ranks
    penalties: Penalties


@dataclass(frozen=True, slots=True)
class Refusal:
    offer: Offer
    filter: str  # the first filter of ``placement.FILTERS`` the offer failed
    reason: str


@dataclass(frozen=True, slots=True)
class Preview:
    namespace: str
    name: str
    outcome: Outcome
    message: str  # what the agent's Event would say (ProviderSelected, NoCapacity, ...)
    request: PlacementRequest | None  # None when the pod cannot be read (INVALID)
    offers_seen: int = 0
    ranked: tuple[RankedOffer, ...] = ()  # in the order a launch would try them
    tries_at_most: int = 0  # a launch walks this many of ``ranked`` before it gives up
    removed: tuple[tuple[str, int], ...] = ()
    refused: tuple[Refusal, ...] = ()
    unable: tuple[str, ...] = ()  # providers that cannot run the pod's shape
    invalid_field: str = ""
    why: str = ""  # why the first of ``ranked`` wins

    @property
    def chosen(self) -> Offer | None:
        return self.ranked[0].offer if self.outcome is Outcome.PLACED and self.ranked else None


class PlacementPreview:
    def __init__(
        self, *, launcher: Launcher, offers: OfferBook, node_name: str, host_ip: str
    ) -> None:
        self._launcher = launcher
        self._offers = offers
        self._node = node_name
        self._host_ip = host_ip

    async def preview(self, pod: Mapping[str, Any]) -> Preview:
        """Where ``pod`` (API JSON) would be placed now; see the module docstring."""
        filled = _with_identity(without_environment(pod))
        metadata = filled["metadata"]
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        try:
            translation = to_request(
                filled, secrets={}, config_maps={}, node_name=self._node, host_ip=self._host_ip
            )
        except InvalidPodSpec as exc:
            event = explain.invalid_spec(exc.field, str(exc))
            return Preview(
                namespace, name, Outcome.INVALID, event.message, None, invalid_field=exc.field
            )
        request = translation.request
        spec = translation.spec
        providers = shape_refused(request, self._launcher.capabilities)
        if providers:
            event = explain.shape_unsupported(request, providers)
            return Preview(
                namespace,
                name,
                Outcome.INVALID,
                event.message,
                request,
                invalid_field=request.shape.field,
            )
        offers = await self._offers.index()
        # A first launch: offers that lost an instance lately are avoided (as the placer does).
        plan = self._launcher.plan(request, offers, namespace=spec.namespace, allow_avoided=False)
        placement = plan.placement
        ranked = tuple(_ranked(offer, plan.health, self._launcher) for offer in plan.order)
        order = {filter_name: index for index, filter_name in enumerate(FILTERS)}
        refused = tuple(
            Refusal(
                offer, filter_name, explain.refusal(filter_name, request, offer, budget=plan.budget)
            )
            for offer, filter_name in sorted(
                placement.refused,
                key=lambda item: (order[item[1]], item[0].price_per_hour, item[0].key),
            )
        )
        if ranked:
            outcome = Outcome.PLACED
            message = explain.provider_selected(
                ranked[0].offer,
                placement,
                [],
                offers_seen=len(offers),
                shape=request.shape.describe(),
            ).message
        else:
            outcome = Outcome.BUDGET_EXCEEDED if placement.budget_limited else Outcome.NO_CAPACITY
            message = explain.unplaceable(
                request,
                placement,
                budget_limited=placement.budget_limited,
                failed_launches=0,
                retry_in=None,
            ).message
        return Preview(
            namespace=namespace,
            name=name,
            outcome=outcome,
            message=message,
            request=request,
            offers_seen=len(offers),
            ranked=ranked,
            tries_at_most=self._launcher.max_candidates,
            removed=placement.removed,
            refused=refused,
            unable=placement.unable,
            why=explain.why_chosen([(r.offer, r.score) for r in ranked]),
        )


def _ranked(offer: Offer, health: Mapping[str, ProviderHealth], launcher: Launcher) -> RankedOffer:
    state = health.get(offer.provider, ProviderHealth())
    return RankedOffer(
        offer, score(offer, state, launcher.policy), penalties(offer, state, launcher.policy)
    )


def _with_identity(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod with a namespace, a name and a UID (placeholders where it has none)."""
    raw = pod.get("metadata")
    metadata: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    metadata["namespace"] = metadata.get("namespace") or "default"
    metadata["name"] = metadata.get("name") or metadata.get("generateName") or PLACEHOLDER_NAME
    metadata["uid"] = metadata.get("uid") or PLACEHOLDER_UID
    return {**pod, "metadata": metadata}
