"""The RunPod adapter: pods on RunPod's GPU cloud behind ``domain.contract.Provider``.

Three RunPod APIs, each for what it does best (shapes from ``shared/provider-apis``):

- **Offers: GraphQL ``gpuTypes``** (``config.graphql_url``). One request returns every GPU
  type with on-demand *and* spot prices, and aliased ``lowestPrice(input: {gpuCount, secureCloud,
  dataCenterId})`` fields give stock per GPU count, cloud and data centre in the same answer.
  The v2 catalog (``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&count=N``) was the
  alternative; it is rejected because it quotes no spot price at all (so no interruptible
  offers), needs one request per GPU count and cloud, and is a beta API.
- **Pods: REST v1** (``config.rest_url``): ``POST /pods``, ``GET /pods``, ``GET /pods/{id}``,
  ``DELETE /pods/{id}``.
- **Logs: REST v2** (``config.logs_url``): ``GET /pods/{id}/logs?source=container`` streams
  Server-Sent Events; the adapter follows the stream, so ``follow_logs`` is supported.

Offers. For every GPU type (limited to ``config.gpu_types`` when set), cloud (``cloud_type``:
SECURE, COMMUNITY or both), GPU count in 1, 2, 4, 8 up to ``maxGpuCount`` and data centre
(``config.regions``; none configured means one offer in region ``any`` and RunPod picks the data
centre) there is an on-demand offer and, when RunPod quotes a spot price, a spot one. RunPod
prices are per GPU per hour; an ``Offer`` is priced for the whole pod (price x count), and
offers dearer than ``max_price_per_hour`` are dropped. ``stockStatus`` becomes ``available``:
High 8, Medium 4, Low 1, null (none) 0 — a coarse "how many could start now", not a quota.
The sku carries what create needs: ``<cloud>:<on-demand|spot>:<count>x:<gpu type id>``, e.g.
``secure:spot:2x:NVIDIA H100 80GB HBM3``.

Identity. RunPod pod names need not be unique and there is no idempotency key, so every pod we
make is named ``vk-<pod uid>.<attempt>`` (the request id; RunPod allows 191 characters) and
carries ``VK_POD_UID`` / ``VK_REQUEST_ID`` in its environment. A pod is ours when its name
parses so and its ``env`` (when the payload has one) agrees. ``create`` first looks for a pod
of that name and returns it; the lookup and the ``POST`` are retried together, never the
``POST`` alone, so a retried create never makes a second pod.

States (``instance_state``). v1 ``desiredStatus`` RUNNING is PENDING until the container is up
(``runtime`` non-null when the payload has that field; otherwise, as the v1 schema documents,
``publicIp``/``portMappings`` stay empty while the pod initialises) and RUNNING after. EXITED
means the pod stopped — RunPod reclaiming an interruptible pod, a person stopping it, or the
container ending; the v1 payload does not tell these apart and carries no exit code, and this
adapter never stops pods. So an interruptible pod that EXITED counts as preempted (LOST, and the
agent avoids the offer for a while); an on-demand one is EXITED with no exit code (the agent
counts that as a failure and the pod's restart policy decides). TERMINATED is TERMINATED
after our delete, else LOST. A v2 ``status`` (PROVISIONING, STARTING, RUNNING, EXITED, ERROR,
TERMINATED) takes precedence when a payload carries one; ERROR is LOST. A pod we asked to
delete that still reports running is TERMINATING. ``costPerHr`` is the instance's price.

Errors are classified in one function, ``classify_failure``: text saying there is no capacity
wins over any status (RunPod v1 reports it as 400 or 500, GraphQL as HTTP 200 with
``errors``), then 401/403/402 and billing text → ``AuthFailed``, 404 → ``NotFound``, 422 →
``InvalidSpec``, 429 → ``RateLimited`` (``Retry-After`` in seconds or as an HTTP date), 400 →
``CapacityUnavailable`` on create (RunPod's guidance: try the next candidate) and ``NotFound``
on a pod id, everything else (5xx, timeouts, connection errors, malformed JSON or shapes) →
``Transient``. Retries live at the transport (``RetryPolicy``, the tenacity loop of
``providers.transport``): ``Transient`` and ``RateLimited`` whose ``Retry-After`` is short are
retried with exponential backoff, then the classified error is raised.

Invariants:
- The API key is resolved once at construction, sent only in the ``Authorization`` header, and
  removed from every message this module produces; secret environment values (``EnvVar.secret``)
  go into the pod's ``env`` (RunPod v1 has no secret store) and are likewise never logged nor
  put into an exception.
- Only ``domain.errors`` escape the public methods.
- Payload builders and parsers are pure; the HTTP layer is ``RunPodProvider._send`` and
  ``RunPodProvider._retrying``.

Known limits: RunPod's terminate has no grace period (``grace_seconds`` is not honoured);
``workingDir`` cannot be set (ignored with a warning); UDP ports cannot be exposed (skipped);
TCP ports are exposed as ``<port>/http`` (RunPod's HTTP proxy); a ``command`` without ``args``
still gets the image's CMD appended (``dockerStartCmd: []`` means "the image's"); v1 takes no
spot bid, so RunPod applies its own; a log read without ``follow`` ends when the backfill has
been quiet for ``log_idle_seconds``, because the endpoint only streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import math
import re
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx

from providers.runpod.config import RunPodProviderConfig
from providers.transport import Redactor, log_retries

# Re-exported: the policy and the parser are this adapter's API (its tests use them from here).
from providers.transport import RetryPolicy as RetryPolicy
from providers.transport import parse_retry_after as parse_retry_after
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    WorkloadSpec,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

NAME_PREFIX = "vk-"
ENV_POD_UID = "VK_POD_UID"
ENV_REQUEST_ID = "VK_REQUEST_ID"
ENV_OFFER_KEY = "VK_OFFER_KEY"
REGION_ANY = "any"
GPU_COUNTS = (1, 2, 4, 8)
NAME_MAX_LENGTH = 191  # PodCreateInput.name maxLength in the v1 document
LOG_TAIL_MAX = 5000  # the v2 logs endpoint's maximum ``tail``
STOCK_AVAILABLE: Mapping[str, int] = {"high": 8, "medium": 4, "low": 1, "none": 0}

_NAME = re.compile(r"vk-(?P<uid>[A-Za-z0-9][A-Za-z0-9_-]*)\.(?P<attempt>\d{1,9})")
_POD_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
# RunPod's defaults for GPU pods (PodCreateInput minVCPUPerGPU / minRAMPerGPU).
_DEFAULT_VCPU_PER_GPU = 2
_DEFAULT_RAM_GB_PER_GPU = 8
_CONTAINER = "spec.containers[0]"


# --- GPU names ----------------------------------------------------------------------------

_KNOWN_GPUS: Mapping[str, str] = {
    "nvidia h100 80gb hbm3": "H100-SXM",
    "nvidia h100 pcie": "H100-PCIE",
    "nvidia h100 nvl": "H100-NVL",
    "nvidia h200": "H200-SXM",
    "nvidia h200 nvl": "H200-NVL",
    "nvidia b200": "B200",
    "nvidia a100 80gb pcie": "A100-80GB",
    "nvidia a100-sxm4-80gb": "A100-80GB",
    "nvidia l40s": "L40S",
    "nvidia l40": "L40",
    "nvidia l4": "L4",
    "nvidia a40": "A40",
    "nvidia a30": "A30",
    "nvidia rtx a30": "A30",
    "nvidia rtx a6000": "RTXA6000",
    "nvidia rtx a5000": "RTXA5000",
    "nvidia rtx a4500": "RTXA4500",
    "nvidia rtx a4000": "RTXA4000",
    "nvidia rtx a2000": "RTXA2000",
    "nvidia rtx 6000 ada generation": "RTX6000-ADA",
    "nvidia rtx 5000 ada generation": "RTX5000-ADA",
    "nvidia a5000 ada": "RTX5000-ADA",
    "nvidia rtx 4000 ada generation": "RTX4000-ADA",
    "nvidia rtx 4000 sff ada generation": "RTX4000-ADA-SFF",
    "nvidia rtx 2000 ada generation": "RTX2000-ADA",
    "nvidia rtx pro 6000 blackwell server edition": "RTXPRO6000-SERVER",
    "nvidia rtx pro 6000 blackwell workstation edition": "RTXPRO6000-WS",
    "nvidia rtx pro 6000 blackwell max-q workstation edition": "RTXPRO6000-WS-MAXQ",
    "nvidia geforce rtx 5090": "RTX5090",
    "nvidia geforce rtx 5080": "RTX5080",
    "nvidia geforce rtx 4090": "RTX4090",
    "nvidia geforce rtx 4080 super": "RTX4080-SUPER",
    "nvidia geforce rtx 4080": "RTX4080",
    "nvidia geforce rtx 4070 ti": "RTX4070TI",
    "nvidia geforce rtx 3090 ti": "RTX3090TI",
    "nvidia geforce rtx 3090": "RTX3090",
    "nvidia geforce rtx 3080 ti": "RTX3080TI",
    "nvidia geforce rtx 3080ti": "RTX3080TI",
    "nvidia geforce rtx 3080": "RTX3080",
    "nvidia geforce rtx 3070": "RTX3070",
    "tesla v100-pcie-16gb": "V100-16GB-PCIE",
    "tesla v100-pcie-32gb": "V100-32GB-PCIE",
    "tesla v100-sxm2-16gb": "V100-16GB-SXM2",
    "tesla v100-sxm2-32gb": "V100-32GB-SXM2",
    "tesla v100-fhhl-16gb": "V100-16GB-FHHL",
    "tesla t4": "T4",
    "amd instinct mi300x oam": "MI300X",
}
_VENDOR_WORDS = frozenset({"NVIDIA", "GEFORCE", "TESLA", "AMD", "INSTINCT"})


def canonical_gpu_name(runpod_name: str) -> str:
    """RunPod's GPU type id (or display name) as a canonical model name.

    Known types map to names shared by every adapter (``H100-SXM``, ``A100-80GB``, ``RTX4090``:
    the family first, the variant after a dash, so ``H100`` matches every H100). Unknown ones
    keep a normalised form — vendor words dropped, upper case, words joined by dashes, ``RTX``
    glued to its number — so a new GPU is offered under a stable name instead of failing.
    """
    key = " ".join(runpod_name.split()).lower()
    known = _KNOWN_GPUS.get(key)
    if known is not None:
        return known
    words = [w for w in re.split(r"[\s_]+", runpod_name.upper()) if w and w not in _VENDOR_WORDS]
    merged: list[str] = []
    for word in words:
        if merged and merged[-1] == "RTX":
            merged[-1] = "RTX" + word
        else:
            merged.append(word)
    name = re.sub(r"[^A-Z0-9.-]", "", "-".join(merged)).strip("-")
    return name or "UNKNOWN"


# --- error classification -----------------------------------------------------------------


class Operation(enum.Enum):
    """What was being done; a 400 means different things to different calls."""

    CREATE = "create"  # POST /pods: 400 is a rule violation or no capacity
    POD = "pod"  # a call on one pod id: 400 is an id that cannot exist
    READ = "read"  # offers, list, logs


class MalformedResponse(ValueError):
    """RunPod answered with a shape this adapter cannot read; becomes ``Transient``."""


_CAPACITY_TEXT = re.compile(
    r"no longer any instances available|no (gpu )?instances? (are )?available"
    r"|not enough (free )?(gpus|capacity|machines)|insufficient capacity|out of capacity"
    r"|could not find any (pods|machines)"
)
_BILLING_TEXT = re.compile(
    r"insufficient (balance|funds|credits?)|not enough (funds|credits?|balance)"
    r"|balance (is )?too low"
)
_AUTH_TEXT = re.compile(
    r"unauthori[sz]ed|unauthenticated|not authori[sz]ed|forbidden|permission denied"
    r"|invalid api key|api key|access denied"
)
_RATE_TEXT = re.compile(r"rate limit|too many requests")
# GraphQL error codes that mean "this request can never succeed as written".
_GRAPHQL_INVALID_CODES = frozenset(
    {"GRAPHQL_VALIDATION_FAILED", "GRAPHQL_PARSE_FAILED", "BAD_USER_INPUT"}
)


def classify_failure(
    *,
    provider: str,
    operation: Operation,
    what: str,
    status: int | None,
    detail: str,
    retry_after: float | None = None,
    code: str = "",
) -> ProviderError:
    """The one place RunPod's failures become ``domain.errors``.

    ``status`` is the HTTP status, or None for a GraphQL error delivered with HTTP 200 (then
    ``code`` is its ``extensions.code``). ``detail`` must already be redacted.
    """
    text = detail.lower()
    message = f"RunPod {what}: " + (f"HTTP {status}: " if status is not None else "") + detail
    if _CAPACITY_TEXT.search(text):
        return CapacityUnavailable(message, provider=provider)
    if status == 402 or _BILLING_TEXT.search(text):
        return AuthFailed(message, provider=provider)
    if status in (401, 403) or (status is None and _AUTH_TEXT.search(text)):
        return AuthFailed(message, provider=provider)
    if status == 429 or (status is None and _RATE_TEXT.search(text)):
        return RateLimited(message, provider=provider, retry_after=retry_after)
    if status == 404:
        return NotFound(message, provider=provider)
    if status == 422 or (status is None and code in _GRAPHQL_INVALID_CODES):
        return InvalidSpec(message, provider=provider)
    if status == 400 and operation is Operation.CREATE:
        return CapacityUnavailable(message, provider=provider)
    if status == 400 and operation is Operation.POD:
        return NotFound(message, provider=provider)
    return Transient(message, provider=provider)


def error_detail(body: str, *, limit: int = 300) -> str:
    """A short human-readable reason from an error body: problem+json ``detail``, ``error``,
    ``message``, ``errors``, else the text itself."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    parts: list[str] = []
    if isinstance(data, dict):
        for key in ("title", "detail", "error", "message"):
            value = data.get(key)
            if isinstance(value, str) and value.strip() and value not in parts:
                parts.append(value.strip())
        errors = data.get("errors")
        if isinstance(errors, list):
            for item in errors[:3]:
                text = item.get("message") if isinstance(item, dict) else item
                if isinstance(text, str) and text.strip():
                    parts.append(text.strip())
    return shorten(": ".join(parts) if parts else body, limit=limit)


def shorten(text: str, *, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    text = " ".join(text.split()) or "(empty)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- payload readers ----------------------------------------------------------------------


def _text(data: Mapping[str, object], key: str, what: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise MalformedResponse(f"{what}: '{key}' is missing or not a string")
    return value


def _number(value: object) -> float | None:
    """A JSON number (or a numeric string, as v1 ``costPerHr`` is documented); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return None
    else:
        return None
    return number if math.isfinite(number) else None


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# --- offers -------------------------------------------------------------------------------


class CloudType(enum.Enum):
    SECURE = "SECURE"
    COMMUNITY = "COMMUNITY"


@dataclass(frozen=True, slots=True)
class Sku:
    """What an offer launches; encoded into ``Offer.sku``."""

    gpu_type_id: str
    gpu_count: int
    cloud: CloudType
    spot: bool

    def encode(self) -> str:
        capacity = "spot" if self.spot else "on-demand"
        return f"{self.cloud.value.lower()}:{capacity}:{self.gpu_count}x:{self.gpu_type_id}"

    @classmethod
    def parse(cls, sku: str) -> Sku | None:
        parts = sku.split(":", 3)
        if len(parts) != 4:
            return None
        cloud, capacity, count, gpu = parts
        if capacity not in ("spot", "on-demand") or not re.fullmatch(r"[1-9]\d{0,2}x", count):
            return None
        try:
            cloud_type = CloudType(cloud.upper())
        except ValueError:
            return None
        if not gpu.strip():
            return None
        return cls(gpu, int(count[:-1]), cloud_type, capacity == "spot")


@dataclass(frozen=True, slots=True)
class OfferScope:
    """Which offers the configuration asks for."""

    provider: str
    clouds: tuple[CloudType, ...]
    regions: tuple[str, ...]  # empty: RunPod chooses the data centre (region "any")
    gpu_types: frozenset[str]  # empty: all
    max_price_per_hour: float | None

    @classmethod
    def from_config(cls, config: RunPodProviderConfig) -> OfferScope:
        clouds = (
            (CloudType.SECURE, CloudType.COMMUNITY)
            if config.cloud_type == "ALL"
            else (CloudType(config.cloud_type),)
        )
        return cls(
            provider=config.name,
            clouds=clouds,
            regions=tuple(dict.fromkeys(config.regions)),
            gpu_types=frozenset(config.gpu_types),
            max_price_per_hour=config.max_price_per_hour,
        )

    def region_slots(self) -> tuple[tuple[int, str], ...]:
        if not self.regions:
            return ((0, REGION_ANY),)
        return tuple(enumerate(self.regions))


def _alias(cloud: CloudType, count: int, region_index: int) -> str:
    return f"lp_{cloud.value.lower()}_{count}_{region_index}"


def offers_query(scope: OfferScope) -> str:
    """The GraphQL query: GPU types, list prices, and one aliased ``lowestPrice`` per cloud,
    GPU count and data centre (all in one request)."""
    fields = "uninterruptablePrice minimumBidPrice stockStatus minVcpu minMemory"
    lines = []
    for cloud in scope.clouds:
        for count in GPU_COUNTS:
            for index, region in scope.region_slots():
                arguments = [f"gpuCount: {count}", f"secureCloud: {_graphql_bool(cloud)}"]
                if region != REGION_ANY:
                    arguments.append(f"dataCenterId: {json.dumps(region)}")
                lines.append(
                    f"    {_alias(cloud, count, index)}: lowestPrice(input: "
                    f"{{{', '.join(arguments)}}}) {{ {fields} }}"
                )
    return (
        "query VkProviderOffers {\n  gpuTypes {\n"
        "    id displayName memoryInGb maxGpuCount\n"
        "    securePrice communityPrice secureSpotPrice communitySpotPrice\n"
        + "\n".join(lines)
        + "\n  }\n}\n"
    )


def _graphql_bool(cloud: CloudType) -> str:
    return "true" if cloud is CloudType.SECURE else "false"


def stock_to_available(stock: object) -> int:
    """``stockStatus`` as a count of pods that could start now: High 8, Medium 4, Low 1,
    null or None 0; an unknown non-empty value counts as 1 (some stock, amount unknown)."""
    if not isinstance(stock, str) or not stock.strip():
        return 0
    return STOCK_AVAILABLE.get(stock.strip().lower(), 1)


def parse_offers(data: object, scope: OfferScope) -> list[Offer]:
    """Offers from the ``data`` of the GraphQL answer; raises ``MalformedResponse`` when
    ``gpuTypes`` is not a list. A malformed GPU type entry is skipped (and logged)."""
    if not isinstance(data, dict) or not isinstance(data.get("gpuTypes"), list):
        raise MalformedResponse("GraphQL gpuTypes: 'data.gpuTypes' is missing or not a list")
    offers: list[Offer] = []
    for entry in data["gpuTypes"]:
        try:
            offers.extend(_gpu_type_offers(entry, scope))
        except MalformedResponse as exc:
            log.warning("provider %s: skipping a GPU type: %s", scope.provider, exc)
    return offers


def _gpu_type_offers(entry: object, scope: OfferScope) -> Iterator[Offer]:
    if not isinstance(entry, dict):
        raise MalformedResponse("GraphQL gpuTypes: an entry is not an object")
    gpu_id = _text(entry, "id", "GraphQL gpuTypes entry")
    if scope.gpu_types and gpu_id not in scope.gpu_types:
        return
    max_count = _number(entry.get("maxGpuCount"))
    memory = _number(entry.get("memoryInGb")) or 0.0
    for cloud in scope.clouds:
        for count in GPU_COUNTS:
            if max_count is None or count > max_count:
                continue
            for index, region in scope.region_slots():
                lowest = entry.get(_alias(cloud, count, index))
                yield from _priced_offers(
                    entry,
                    lowest if isinstance(lowest, dict) else {},
                    Sku(gpu_id, count, cloud, spot=False),
                    region,
                    memory,
                    scope,
                )


def _priced_offers(
    entry: Mapping[str, object],
    lowest: Mapping[str, object],
    on_demand: Sku,
    region: str,
    gpu_memory: float,
    scope: OfferScope,
) -> Iterator[Offer]:
    secure = on_demand.cloud is CloudType.SECURE
    list_price = entry.get("securePrice" if secure else "communityPrice")
    list_spot = entry.get("secureSpotPrice" if secure else "communitySpotPrice")
    count = on_demand.gpu_count
    available = stock_to_available(lowest.get("stockStatus"))
    vcpus = _number(lowest.get("minVcpu")) or float(_DEFAULT_VCPU_PER_GPU * count)
    memory = _number(lowest.get("minMemory")) or float(_DEFAULT_RAM_GB_PER_GPU * count)
    variants = (
        (on_demand, _positive(lowest.get("uninterruptablePrice"), list_price)),
        (
            Sku(on_demand.gpu_type_id, count, on_demand.cloud, spot=True),
            _positive(lowest.get("minimumBidPrice"), list_spot),
        ),
    )
    for sku, per_gpu in variants:
        if per_gpu is None:
            continue  # no price quoted: not offered (spot is often unquoted)
        price = round(per_gpu * count, 6)
        if scope.max_price_per_hour is not None and price > scope.max_price_per_hour:
            continue
        yield Offer(
            provider=scope.provider,
            sku=sku.encode(),
            region=region,
            gpu_model=canonical_gpu_name(sku.gpu_type_id),
            gpu_count=count,
            gpu_memory_gib=gpu_memory,
            vcpus=vcpus,
            memory_gib=memory,
            price_per_hour=price,
            spot=sku.spot,
            available=available,
        )


def _positive(*candidates: object) -> float | None:
    """The first candidate that is a positive number (RunPod uses 0 and null for "none")."""
    for candidate in candidates:
        number = _number(candidate)
        if number is not None and number > 0:
            return number
    return None


def graphql_data(body: object) -> tuple[object, list[Mapping[str, object]]]:
    """``(data, errors)`` of a GraphQL answer; raises ``MalformedResponse`` for other shapes."""
    if not isinstance(body, dict):
        raise MalformedResponse("GraphQL answer is not a JSON object")
    errors = body.get("errors")
    if errors is not None and not isinstance(errors, list):
        raise MalformedResponse("GraphQL answer: 'errors' is not a list")
    found: list[Mapping[str, object]] = [
        e if isinstance(e, dict) else {"message": str(e)} for e in errors or []
    ]
    return body.get("data"), found


# --- pods ---------------------------------------------------------------------------------


def instance_name(spec: WorkloadSpec) -> str:
    """``vk-<pod uid>.<attempt>``: the request id, findable again with ``GET /pods?name=``."""
    return f"{NAME_PREFIX}{spec.request_id}"


@dataclass(frozen=True, slots=True)
class Owner:
    pod_uid: str
    attempt: int

    @property
    def request_id(self) -> str:
        return f"{self.pod_uid}.{self.attempt}"


def owner_of(pod: Mapping[str, object], *, provider: str | None = None) -> Owner | None:
    """Whose pod this is, if this agent made it: the name parses as ours and the environment,
    when the payload carries one, agrees with the name and (given ``provider``) names this
    provider in its offer key, so two agents with different provider names can share one
    RunPod account without taking each other's pods for orphans."""
    name = pod.get("name")
    if not isinstance(name, str):
        return None
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    owner = Owner(match["uid"], int(match["attempt"]))
    env = pod.get("env")
    if isinstance(env, dict):
        if env.get(ENV_REQUEST_ID) != owner.request_id or env.get(ENV_POD_UID) != owner.pod_uid:
            return None
        offer_key = env.get(ENV_OFFER_KEY)
        foreign = isinstance(offer_key, str) and not offer_key.startswith(f"{provider}/")
        if provider is not None and foreign:
            return None
    return owner


def build_create_body(
    spec: WorkloadSpec, sku: Sku, *, region: str, container_disk_gb: int, offer_key: str
) -> dict[str, object]:
    """The v1 ``PodCreateInput`` for ``spec`` on ``sku``; raises ``InvalidSpec``.

    Kubernetes ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD, as
    ``dockerEntrypoint``/``dockerStartCmd`` do (an empty list keeps the image's value).
    """
    if not _POD_UID.fullmatch(spec.pod_uid):
        raise InvalidSpec(
            f"pod uid {spec.pod_uid!r} cannot name a RunPod pod", field="metadata.uid"
        )
    if not spec.image.strip():
        raise InvalidSpec("a RunPod pod needs an image", field=f"{_CONTAINER}.image")
    name = instance_name(spec)
    if len(name) > NAME_MAX_LENGTH:
        raise InvalidSpec("pod uid is too long for a RunPod name", field="metadata.uid")
    env = {var.name: var.value for var in spec.env}
    # Ours last, so a pod's own variables cannot disguise whose pod it is.
    env.update({ENV_POD_UID: spec.pod_uid, ENV_REQUEST_ID: spec.request_id})
    env[ENV_OFFER_KEY] = offer_key
    count = sku.gpu_count
    body: dict[str, object] = {
        "name": name,
        "imageName": spec.image,
        "computeType": "GPU",
        "cloudType": sku.cloud.value,
        "gpuTypeIds": [sku.gpu_type_id],
        "gpuCount": count,
        "interruptible": sku.spot,
        "dockerEntrypoint": list(spec.command),
        "dockerStartCmd": list(spec.args),
        "env": env,
        "ports": exposed_ports(spec),
        "containerDiskInGb": container_disk_gb,
        "volumeInGb": 0,  # no persistent pod volume: a pod's state lives in its container
        "minVCPUPerGPU": max(_DEFAULT_VCPU_PER_GPU, math.ceil(spec.cpu / count)),
        "minRAMPerGPU": max(_DEFAULT_RAM_GB_PER_GPU, math.ceil(spec.memory_bytes / 2**30 / count)),
    }
    if region != REGION_ANY:
        body["dataCenterIds"] = [region]
    return body


def exposed_ports(spec: WorkloadSpec) -> list[str]:
    """``<port>/http`` for each TCP container port; UDP cannot be exposed on RunPod."""
    ports: list[str] = []
    for port in spec.ports:
        entry = f"{port.container_port}/http"
        if port.protocol.upper() == "TCP" and entry not in ports:
            ports.append(entry)
    return ports


class Lifecycle(enum.Enum):
    """A pod's lifecycle, in v2 ``PodStatus`` terms; v1 payloads are read into it."""

    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    EXITED = "EXITED"
    ERROR = "ERROR"
    TERMINATED = "TERMINATED"


_V1_DESIRED = frozenset({"RUNNING", "EXITED", "TERMINATED"})


def lifecycle_of(pod: Mapping[str, object]) -> Lifecycle:
    """The pod's lifecycle from a v2 ``status`` when present, else from v1 ``desiredStatus``
    and whether the container is up (``runtime``; else ``publicIp``/``portMappings``)."""
    status = pod.get("status")
    if isinstance(status, str) and status in Lifecycle.__members__:
        return Lifecycle[status]
    desired = pod.get("desiredStatus")
    if not isinstance(desired, str) or desired not in _V1_DESIRED:
        raise MalformedResponse(
            f"pod payload: 'desiredStatus' is {desired!r}, not one of RUNNING, EXITED, TERMINATED"
        )
    if desired != "RUNNING":
        return Lifecycle(desired)
    if "runtime" in pod:
        up = pod["runtime"] is not None
    else:
        up = bool(pod.get("publicIp")) or bool(pod.get("portMappings"))
    return Lifecycle.RUNNING if up else Lifecycle.STARTING


def instance_state(
    lifecycle: Lifecycle, *, deleting: bool, interruptible: bool
) -> tuple[InstanceState, str]:
    """The state table (see the module docstring): our state and a message for it."""
    if lifecycle is Lifecycle.TERMINATED:
        if deleting:
            return InstanceState.TERMINATED, "terminated on request"
        return InstanceState.LOST, "pod terminated by RunPod, not by this agent"
    if deleting:
        return InstanceState.TERMINATING, "termination requested"
    if lifecycle is Lifecycle.ERROR:
        return InstanceState.LOST, "RunPod reports the pod in an unrecoverable error state"
    if lifecycle is Lifecycle.EXITED:
        if interruptible:
            return InstanceState.LOST, "interruptible pod stopped by RunPod (preempted)"
        return InstanceState.EXITED, "pod stopped; RunPod reports no exit code"
    if lifecycle is Lifecycle.RUNNING:
        return InstanceState.RUNNING, ""
    return InstanceState.PENDING, f"pod {lifecycle.value.lower()}"


def parse_instance(
    pod: object, *, provider: str, deleting: Callable[[str], bool]
) -> Instance | None:
    """The ``Instance`` of a v1 Pod payload; None when the pod is not ours; raises
    ``MalformedResponse`` for a pod of ours whose payload cannot be read."""
    if not isinstance(pod, dict):
        raise MalformedResponse("pod payload is not a JSON object")
    owner = owner_of(pod, provider=provider)
    if owner is None:
        return None
    pod_id = _text(pod, "id", "pod payload")
    state, message = instance_state(
        lifecycle_of(pod),
        deleting=deleting(pod_id),
        interruptible=pod.get("interruptible") is True,
    )
    if state is InstanceState.PENDING and isinstance(pod.get("lastStatusChange"), str):
        message = f"{message}: {pod['lastStatusChange']}"
    env = pod.get("env")
    offer_key = env.get(ENV_OFFER_KEY) if isinstance(env, dict) else None
    ip = pod.get("publicIp")
    return Instance(
        provider=provider,
        instance_id=pod_id,
        pod_uid=owner.pod_uid,
        attempt=owner.attempt,
        state=state,
        offer_key=offer_key if isinstance(offer_key, str) else "",
        message=message,
        started_at=_timestamp(pod.get("lastStartedAt")),
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=_number(pod.get("costPerHr")) or 0.0,
    )


# --- logs ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEvent:
    ts: str
    line: str

    def render(self, *, timestamps: bool) -> bytes:
        text = self.line.rstrip("\r\n")
        prefix = f"{self.ts} " if timestamps and self.ts else ""
        return f"{prefix}{text}\n".encode()


@dataclass(slots=True)
class SseDecoder:
    """Server-Sent Events, one line at a time, into log events.

    The v2 payload is ``data: {"ts", "source", "line"}`` with the timestamp as ``id``; data
    that is not that JSON is passed through as the line, events of another source dropped.
    """

    _data: list[str] = field(default_factory=list)
    _id: str = ""

    def feed(self, line: str) -> LogEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def flush(self) -> LogEvent | None:
        if not self._data:
            return None
        raw, event_id = "\n".join(self._data), self._id
        self._data, self._id = [], ""
        try:
            payload = json.loads(raw)
        except ValueError:
            return LogEvent(event_id, raw)
        if not isinstance(payload, dict) or not isinstance(payload.get("line"), str):
            return LogEvent(event_id, raw)
        source = payload.get("source")
        if isinstance(source, str) and source != "container":
            return None
        ts = payload.get("ts")
        return LogEvent(ts if isinstance(ts, str) else event_id, payload["line"])


def log_params(options: LogOptions, *, now: datetime) -> dict[str, str]:
    tail = LOG_TAIL_MAX if options.tail_lines is None else options.tail_lines
    params = {"source": "container", "tail": str(max(0, min(LOG_TAIL_MAX, tail)))}
    if options.since_seconds is not None:
        since = now - timedelta(seconds=max(0, options.since_seconds))
        params["since"] = since.strftime("%Y-%m-%dT%H:%M:%SZ")
    return params


# --- the provider -------------------------------------------------------------------------


class RunPodProvider:
    """``domain.contract.Provider`` on RunPod (see the module docstring)."""

    def __init__(
        self,
        config: RunPodProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        log_idle_seconds: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``transport`` is the test seam; ``log_idle_seconds`` ends a non-following log
        read once the backfill has gone quiet (the endpoint only ever streams)."""
        self._config = config
        self._scope = OfferScope.from_config(config)
        api_key = config.api_key.resolve()
        self._redact = Redactor((api_key,))
        self._retry = retry or RetryPolicy()
        self._log_idle = log_idle_seconds
        self._clock = clock
        self._rest = config.rest_url.rstrip("/")
        self._logs = config.logs_url.rstrip("/")
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=config.timeout_seconds,
            headers={"Authorization": f"Bearer {api_key}", "Accept": "application/json"},
        )
        # Pods we asked to terminate: they report TERMINATING/TERMINATED rather than LOST.
        self._deleting: set[str] = set()

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=True)

    async def offers(self) -> list[Offer]:
        query = offers_query(self._scope)

        async def attempt() -> object:
            return await self._graphql(query, what="offers (gpuTypes)")

        data = await self._retrying(attempt)
        with self._readable("offers (gpuTypes)"):
            return parse_offers(data, self._scope)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        sku = Sku.parse(offer.sku)
        if sku is None or offer.provider != self.name:
            raise CapacityUnavailable(
                f"offer {offer.key} is not a RunPod offer", provider=self.name
            )
        try:
            body = build_create_body(
                spec,
                sku,
                region=offer.region,
                container_disk_gb=self._config.container_disk_gb,
                offer_key=offer.key,
            )
        except InvalidSpec as exc:
            raise InvalidSpec(str(exc), provider=self.name, field=exc.field) from None
        self._warn_unsupported(spec)
        redact = self._redact.with_secrets(var.value for var in spec.env if var.secret)

        # The lookup and the POST are retried together: a POST whose answer was lost is found
        # by the next attempt's lookup instead of being sent twice.
        async def attempt() -> Instance:
            return await self._create_once(spec, body, redact)

        return await self._retrying(attempt)

    async def get(self, instance_id: str) -> Instance:
        what = f"get pod {instance_id!r}"

        async def attempt() -> object:
            return await self._json("GET", self._pod_url(instance_id), Operation.POD, what)

        try:
            pod = await self._retrying(attempt)
        except NotFound:
            self._deleting.discard(instance_id)
            raise
        with self._readable(what):
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
        if instance is None:
            raise NotFound(f"RunPod pod {instance_id!r} is not one of ours", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        """Terminate now: RunPod's terminate has no grace period."""
        if not instance_id:
            return
        self._deleting.add(instance_id)
        what = f"delete pod {instance_id!r}"

        async def attempt() -> None:
            await self._send("DELETE", self._pod_url(instance_id), Operation.POD, what)

        try:
            await self._retrying(attempt)
        except NotFound:
            self._deleting.discard(instance_id)  # already gone: done
            return
        log.info("provider %s: terminating RunPod pod %s", self.name, instance_id)

    async def list_ours(self) -> list[Instance]:
        async def attempt() -> object:
            return await self._json("GET", f"{self._rest}/pods", Operation.READ, "list pods")

        pods = await self._retrying(attempt)
        with self._readable("list pods"):
            found = self._ours(pods)
        # Forget deletions RunPod no longer lists: they are done (this bounds the set).
        self._deleting &= {i.instance_id for i in found}
        return [i for i in found if i.state is not InstanceState.TERMINATED]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        async def attempt() -> httpx.Response:
            return await self._open_logs(instance_id, options)

        response = await self._retrying(attempt)
        try:
            async for chunk in self._log_chunks(response, options, instance_id):
                yield chunk
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._client.aclose()

    # --- internals ------------------------------------------------------------------------

    def _warn_unsupported(self, spec: WorkloadSpec) -> None:
        if spec.working_dir:
            log.warning("pod %s: RunPod cannot set workingDir; the image's applies", spec.pod_uid)
        for port in spec.ports:
            if port.protocol.upper() != "TCP":
                log.warning(
                    "pod %s: RunPod cannot expose %s port %d; not exposed",
                    spec.pod_uid,
                    port.protocol,
                    port.container_port,
                )

    async def _create_once(
        self, spec: WorkloadSpec, body: Mapping[str, object], redact: Redactor
    ) -> Instance:
        existing = await self._find(spec.request_id)
        if existing is not None:
            return existing
        what = f"create pod for {spec.request_id}"
        response = await self._send(
            "POST", f"{self._rest}/pods", Operation.CREATE, what, json_body=body, redact=redact
        )
        pod = self._decode(response, what)
        with self._readable(what):
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
            if instance is None:
                raise MalformedResponse(f"{what}: the created pod does not carry our name")
        log.info(
            "provider %s: created RunPod pod %s for %s (%s)",
            self.name,
            instance.instance_id,
            spec.request_id,
            body.get("gpuTypeIds"),
        )
        return instance

    async def _find(self, request_id: str) -> Instance | None:
        """Our pod for ``request_id``, live ones first; one attempt (the caller retries)."""
        name = f"{NAME_PREFIX}{request_id}"
        what = f"look up pod {name}"
        response = await self._send(
            "GET", f"{self._rest}/pods", Operation.READ, what, params={"name": name}
        )
        pods = self._decode(response, what)
        with self._readable(what):
            mine = [i for i in self._ours(pods) if f"{i.pod_uid}.{i.attempt}" == request_id]
        mine.sort(key=lambda i: i.state in (InstanceState.TERMINATED, InstanceState.LOST))
        return mine[0] if mine else None

    def _ours(self, pods: object) -> list[Instance]:
        if not isinstance(pods, list):
            raise MalformedResponse("the pod list is not a JSON array")
        found = []
        for pod in pods:
            if not isinstance(pod, dict):
                continue  # not readable, so not provably ours
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
            if instance is not None:
                found.append(instance)
        return found

    def _pod_url(self, instance_id: str) -> str:
        if not instance_id:
            raise NotFound("no RunPod pod has an empty id", provider=self.name)
        return f"{self._rest}/pods/{urllib.parse.quote(instance_id, safe='')}"

    async def _graphql(self, query: str, *, what: str) -> object:
        response = await self._send(
            "POST", self._config.graphql_url, Operation.READ, what, json_body={"query": query}
        )
        body = self._decode(response, what)
        with self._readable(what):
            data, errors = graphql_data(body)
        if errors:
            raise self._graphql_failure(errors, what)
        return data

    def _graphql_failure(self, errors: list[Mapping[str, object]], what: str) -> ProviderError:
        messages = [str(e.get("message", "")) for e in errors]
        extensions = errors[0].get("extensions")
        code = extensions.get("code") if isinstance(extensions, dict) else None
        detail = self._redact(shorten("; ".join(m for m in messages[:3] if m)))
        return classify_failure(
            provider=self.name,
            operation=Operation.READ,
            what=what,
            status=None,
            detail=detail,
            code=code if isinstance(code, str) else "",
        )

    async def _json(self, method: str, url: str, operation: Operation, what: str) -> object:
        response = await self._send(method, url, operation, what)
        return None if response.status_code == 204 else self._decode(response, what)

    async def _send(
        self,
        method: str,
        url: str,
        operation: Operation,
        what: str,
        *,
        params: Mapping[str, str] | None = None,
        json_body: Mapping[str, object] | None = None,
        redact: Redactor | None = None,
    ) -> httpx.Response:
        """One request; a failure of any kind is raised classified."""
        redact = redact or self._redact
        try:
            response = await self._client.request(method, url, params=params, json=json_body)
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc, what, redact) from exc
        if response.is_success:
            return response
        raise self._http_failure(response, operation, what, redact)

    def _transport_failure(self, exc: httpx.HTTPError, what: str, redact: Redactor) -> Transient:
        if isinstance(exc, httpx.TimeoutException):
            reason = f"no answer within {self._config.timeout_seconds:g}s"
        else:
            reason = f"{type(exc).__name__}: {redact(str(exc))}"
        return Transient(f"RunPod {what}: {reason}", provider=self.name)

    def _http_failure(
        self, response: httpx.Response, operation: Operation, what: str, redact: Redactor
    ) -> ProviderError:
        return classify_failure(
            provider=self.name,
            operation=operation,
            what=what,
            status=response.status_code,
            detail=redact(error_detail(response.text)),
            retry_after=parse_retry_after(response.headers.get("Retry-After"), now=self._clock()),
        )

    def _decode(self, response: httpx.Response, what: str) -> object:
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise Transient(
                f"RunPod {what}: malformed JSON in the answer ({exc})", provider=self.name
            ) from None

    @contextlib.contextmanager
    def _readable(self, what: str) -> Iterator[None]:
        """A payload this adapter cannot read is a ``Transient`` naming what was wrong."""
        try:
            yield
        except MalformedResponse as exc:
            raise Transient(
                f"RunPod {what}: unexpected answer: {self._redact(str(exc))}", provider=self.name
            ) from None

    async def _retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        return await self._retry.run(call, before_sleep=log_retries(log, self.name))

    async def _open_logs(self, instance_id: str, options: LogOptions) -> httpx.Response:
        what = f"logs of pod {instance_id!r}"
        url = f"{self._logs}/pods/{urllib.parse.quote(instance_id, safe='')}/logs"
        seconds = self._config.timeout_seconds
        request = self._client.build_request(
            "GET",
            url,
            params=log_params(options, now=self._clock()),
            headers={"Accept": "text/event-stream"},
            # A followed stream may stay quiet for as long as the container does.
            timeout=httpx.Timeout(seconds, read=None if options.follow else seconds),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_failure(exc, what, self._redact) from exc
        if response.is_success:
            return response
        try:
            with contextlib.suppress(httpx.HTTPError):  # the status alone classifies it
                await response.aread()
        finally:
            await response.aclose()
        raise self._http_failure(response, Operation.POD, what, self._redact)

    async def _log_chunks(
        self, response: httpx.Response, options: LogOptions, instance_id: str
    ) -> AsyncIterator[bytes]:
        decoder = SseDecoder()
        left = options.limit_bytes
        lines = response.aiter_lines()
        while True:
            try:
                line: str | None = await self._next_line(lines, follow=options.follow)
            except httpx.HTTPError as exc:
                raise Transient(
                    f"RunPod logs of pod {instance_id!r}: stream broke: {type(exc).__name__}",
                    provider=self.name,
                ) from exc
            event = decoder.flush() if line is None else decoder.feed(line)
            if event is not None:
                chunk = event.render(timestamps=options.timestamps)
                if left is not None:
                    chunk, left = chunk[:left], left - min(left, len(chunk))
                if chunk:
                    yield chunk
                if left is not None and left <= 0:
                    return
            if line is None:
                return

    async def _next_line(self, lines: AsyncIterator[str], *, follow: bool) -> str | None:
        """The next line; None at the end of the stream, or — when not following — once the
        backfill has been quiet for ``log_idle_seconds``."""
        try:
            if follow:
                return await anext(lines)
            async with asyncio.timeout(self._log_idle):
                return await anext(lines)
        except (StopAsyncIteration, TimeoutError):
            return None
