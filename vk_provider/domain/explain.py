"""The Events the agent writes about pods: reasons (PRODUCT.md §6) and the wording of each.

Every message says what happened and why, with the numbers behind it (prices, how many
offers each filter removed, which launches failed), so ``kubectl describe pod`` answers
"why is it here" and "why is it not running" without the agent's log.

Invariants: pure; messages are built from offers, placement results and error classes and
messages that adapters have already redacted — never from a Secret or a credential.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vk_provider.domain.errors import ProviderError
from vk_provider.domain.models import Offer
from vk_provider.domain.placement import Placement, PlacementRequest

# Reasons (PRODUCT.md §6).
PROVIDER_SELECTED = "ProviderSelected"
NO_CAPACITY = "NoCapacity"
BUDGET_EXCEEDED = "BudgetExceeded"
INVALID_SPEC = "InvalidSpec"
PROVIDER_CREATE_FAILED = "ProviderCreateFailed"
INSTANCE_LOST = "InstanceLost"
# Kubelet-style reasons for the container's own life.
STARTED = "Started"
BACK_OFF = "BackOff"
KILLING = "Killing"
FAILED_CONFIG = "CreateContainerConfigError"
OPTIONAL_REFERENCE_MISSING = "OptionalReferenceMissing"
PROBE_UNSUPPORTED = "ProbeUnsupported"
# Waiting reasons of a pod no provider takes now (not ContainerCreating: nothing is created).
WAITING_FOR_CAPACITY = "WaitingForCapacity"
WAITING_FOR_BUDGET = "WaitingForBudget"

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # Normal or Warning
    reason: str
    message: str


def create_failed(offer: Offer, error: ProviderError) -> Event:
    return Event(
        WARNING,
        PROVIDER_CREATE_FAILED,
        f"{offer.provider} refused offer {offer.sku} in {offer.region}: "
        f"{type(error).__name__}: {error}",
    )


def provider_selected(
    offer: Offer,
    placement: Placement,
    failed: Sequence[tuple[Offer, ProviderError]],
    *,
    offers_seen: int,
    shape: str = "",
) -> Event:
    skipped = [f"{o.key}: {type(e).__name__}" for o, e in failed]
    ranked = [o for o in placement.candidates if o.key != offer.key]
    cheaper = [o for o in ranked if o.price_per_hour < offer.price_per_hour]
    why = f" ({'; '.join(skipped)})" if skipped else ""
    gpu = f"{offer.gpu_count}x {offer.gpu_model}" if offer.gpu_model else "no GPU"
    unable = (
        f"; skipped provider(s) {', '.join(placement.unable)}: cannot run {shape}"
        if placement.unable
        else ""
    )
    return Event(
        NORMAL,
        PROVIDER_SELECTED,
        f"placed on {offer.provider} offer {offer.sku} ({gpu}) in {offer.region} at "
        f"${offer.price_per_hour:.4f}/h; {len(cheaper)} cheaper offer(s) skipped{why}; "
        f"{offers_seen} offer(s) considered, removed {placement.explain()}{unable}",
    )


def wanted(request: PlacementRequest) -> str:
    models = f" ({','.join(request.gpu_models)})" if request.gpu_models else ""
    return f"{request.gpu_count} GPU{models}"


def unplaceable(
    request: PlacementRequest,
    placement: Placement,
    *,
    budget_limited: bool,
    failed_launches: int,
    retry_in: float,
) -> Event:
    if budget_limited:
        return Event(
            WARNING,
            BUDGET_EXCEEDED,
            f"launching {wanted(request)} would exceed a budget cap "
            f"(offers removed {placement.explain()}); retrying in {retry_in:.0f}s",
        )
    tried = f"; {failed_launches} launch(es) failed" if failed_launches else ""
    unable = (
        f"; provider(s) {', '.join(placement.unable)} cannot run {request.shape.describe()}"
        if placement.unable
        else ""
    )
    return Event(
        WARNING,
        NO_CAPACITY,
        f"no offer fits {wanted(request)}: offers removed {placement.explain()}{tried}"
        f"{unable}; retrying in {retry_in:.0f}s",
    )


def instance_lost(
    instance_id: str, provider: str, why: str, *, offer_key: str, cooldown: float
) -> Event:
    return Event(
        WARNING,
        INSTANCE_LOST,
        f"instance {instance_id} on {provider} was lost: {why}; "
        f"offer {offer_key or '?'} avoided for {cooldown:.0f}s",
    )


def invalid_spec(field: str, message: str) -> Event:
    text = f"{field}: {message}" if field and field not in message else message
    return Event(WARNING, INVALID_SPEC, text)


def crash_loop(container: str, pod: str, delay: float) -> Event:
    return Event(
        WARNING,
        BACK_OFF,
        f"back-off {delay:.0f}s restarting failed container={container} pod={pod}",
    )


def shape_unsupported(request: PlacementRequest, providers: Sequence[str]) -> Event:
    """No configured (and allowed) provider can run the pod's containers: InvalidSpec."""
    return invalid_spec(
        request.shape.field,
        f"no provider can run {request.shape.describe()}: provider(s) {', '.join(providers)} "
        "cannot (see their capabilities)",
    )


def optional_references_missing(skipped: Sequence[str]) -> Event:
    return Event(NORMAL, OPTIONAL_REFERENCE_MISSING, "; ".join(skipped))
