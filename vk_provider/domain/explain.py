"""The Events the agent writes about pods: reasons (docs/reference.md#events) and wording.

Every message says what happened and why, with the numbers behind it (prices, how many
offers each filter removed, which launches failed), so ``kubectl describe pod`` answers
"why is it here" and "why is it not running" without the agent's log.

Invariants: pure; messages are built from offers, placement results and error classes and
messages that adapters have already redacted — never from a Secret or a credential.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vk_provider.domain.budget import BudgetView
from vk_provider.domain.errors import ProviderError
from vk_provider.domain.models import Offer
from vk_provider.domain.placement import CapacityType, Penalties, Placement, PlacementRequest
from vk_provider.domain.podspec import InvalidPodSpec
from vk_provider.domain.references import MissingReference, Skipped

# Reasons (docs/reference.md#events).
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
FAILED_CREATE = "CreateContainerError"  # the runtime refused the container as specified
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
    retry_in: float | None,
) -> Event:
    """NoCapacity or BudgetExceeded; ``retry_in`` None (a dry run) leaves out the retry."""
    retry = "" if retry_in is None else f"; retrying in {retry_in:.0f}s"
    if budget_limited:
        return Event(
            WARNING,
            BUDGET_EXCEEDED,
            f"launching {wanted(request)} would exceed a budget cap "
            f"(offers removed {placement.explain()}){retry}",
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
        f"{unable}{retry}",
    )


def _price(value: float) -> str:
    return f"${value:.4f}/h"


def _listed(values: Sequence[str]) -> str:
    return ", ".join(values)


def refusal(
    name: str, request: PlacementRequest, offer: Offer, *, budget: BudgetView | None = None
) -> str:
    """Why the placement filter ``name`` (``placement.FILTERS``) removed ``offer``: what the
    offer has against what the pod asks, naming the annotation that asks it."""
    gpus = f"{offer.gpu_count} GPU(s)"
    if name == "provider":
        return f"{offer.provider} is not in vk-provider.io/providers ({_listed(request.providers)})"
    if name == "shape":
        return f"{offer.provider} cannot run {request.shape.describe()}"
    if name == "gpu-count":
        if request.gpu_count == 0:
            return f"has {gpus}; the pod asks for none, so only CPU offers fit"
        return f"has {gpus}; the pod needs {request.gpu_count}"
    if name == "gpu-model":
        model = offer.gpu_model or "no GPU"
        return f"{model} is not one of vk-provider.io/gpu ({_listed(request.gpu_models)})"
    if name == "gpu-memory":
        return (
            f"{offer.gpu_memory_gib:g} GiB per GPU; vk-provider.io/min-gpu-memory asks "
            f"{request.min_gpu_memory_gib:g} GiB"
        )
    if name == "cpu":
        return f"{offer.vcpus:g} vCPUs; the pod requests {request.cpu:g}"
    if name == "memory":
        return f"{offer.memory_gib:g} GiB memory; the pod requests {request.memory_gib:g} GiB"
    if name == "region":
        regions = _listed(request.regions)
        return f"region {offer.region} is not one of vk-provider.io/regions ({regions})"
    if name == "capacity-type":
        kind = "spot" if offer.spot else "on-demand"
        asked = request.capacity_type.value
        default = " (the default)" if request.capacity_type is CapacityType.ON_DEMAND else ""
        return f"{kind}; vk-provider.io/capacity-type is {asked}{default}"
    if name == "price":
        limit = request.max_price_per_hour or 0.0
        return (
            f"{_price(offer.price_per_hour)} is more than vk-provider.io/max-price {_price(limit)}"
        )
    if name == "sold-out":
        return "sold out: the provider can start none now"
    if name == "taken":
        return (
            f"its {offer.available} free instance(s) are taken by creates under way or made "
            "since the provider last answered"
        )
    if name == "provider-health":
        return (
            f"{offer.provider}'s circuit breaker holds calls back (it kept failing); "
            "it is probed again later"
        )
    if name == "blocked":
        return (
            "skipped for a while: the provider refused it (no capacity) or refused the "
            "credentials, or an instance was lost there lately"
        )
    if name == "budget":
        rooms = []
        if budget is not None and budget.namespace_room is not None:
            rooms.append(f"{_price(max(budget.namespace_room, 0.0))} left in the namespace")
        if budget is not None and budget.global_room is not None:
            rooms.append(f"{_price(max(budget.global_room, 0.0))} left in all")
        left = f" ({'; '.join(rooms)})" if rooms else ""
        return f"{_price(offer.price_per_hour)} would exceed a budget cap{left}"
    return name


def penalty_notes(penalties: Penalties) -> str:
    """``+5% last instance, +1% start-up`` (empty when there are none)."""
    parts = [
        f"+{value * 100:.3g}% {label}"
        for value, label in (
            (penalties.low_availability, "last instance"),
            (penalties.startup, "slow start-up"),
            (penalties.recent_failures, "recent provider failures"),
        )
        if value > 0
    ]
    return ", ".join(parts)


def why_chosen(ranked: Sequence[tuple[Offer, float]]) -> str:
    """Why the first of ``ranked`` (offers with their scores, in ``place()``'s order) wins."""
    if not ranked:
        return ""
    first, score = ranked[0]
    if len(ranked) == 1:
        return f"the only offer that fits (score {score:.4f})"
    second, runner_up = ranked[1]
    versus = f"{second.key} scores {runner_up:.4f}"
    if score < runner_up:
        return (
            f"lowest price after penalties: {first.key} scores {score:.4f} "
            f"({_price(first.price_per_hour)} before penalties); next, {versus}"
        )
    if first.price_per_hour < second.price_per_hour:
        return f"tied after penalties with {second.key}; the lower price wins"
    return f"tied on score and price with {second.key}: provider priority, then the offer key"


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


def skipped_reference(skipped: Skipped) -> Event:
    """An optional reference that does not exist, or envFrom keys that are no variable
    names: a Warning with virtual-kubelet's reason (``domain.references``)."""
    return Event(WARNING, skipped.reason, skipped.message)


def config_error(error: InvalidPodSpec) -> Event:
    """The pod cannot start until something appears: for a missing mandatory reference,
    virtual-kubelet's reason (``MandatorySecretNotFound`` ...); else the kubelet's
    ``CreateContainerConfigError``."""
    missing = getattr(error, "missing", None)
    if isinstance(missing, MissingReference):
        return Event(WARNING, missing.reason, missing.message)
    return Event(WARNING, FAILED_CONFIG, str(error))
