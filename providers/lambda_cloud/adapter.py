"""The Lambda Cloud provider: one Lambda VM per pod attempt, running the pod's image.

Lambda rents whole VMs (API 1.8.3, ``shared/provider-apis/lambda-cloud-openapi-1.8.3.json``).
The pod's container runs on the VM through cloud-init ``user_data`` built by
``providers.cloud_init`` (Docker with the NVIDIA runtime). Offers come from
``GET /instance-types``: one per (instance type, region with capacity), priced per instance.

Layers, top to bottom: ``LambdaCloudProvider`` (the contract) → pure builders and parsers of
the API's payloads (``parse_offers``, ``parse_instance``, ``launch_request``, ...) → one thin
HTTP call (``_call``) that rate-limits, retries (``providers.transport``'s tenacity loop) and
unwraps ``{"data": ...}``. Every failure becomes a ``domain.errors`` class in one function,
``classify_failure``.

Decisions (each has a test):

- **Ours** = tags ``vk-provider:managed=true`` and ``vk-provider:provider=<provider name>``;
  ``vk-provider:pod-uid=<uid>`` and ``vk-provider:request-id=<uid>.<attempt>`` say for which
  pod attempt. The API cannot filter by tag, so lists are filtered here. The instance name
  ``vk-<uid>.<attempt>`` is for people; it is never trusted. Two agents sharing one Lambda
  account must give their Lambda providers different names.
- **Idempotent create.** Lambda has no idempotency key: ``create`` first lists the account
  and returns an instance already tagged with the request id. A launch this process made in
  the last ``LAUNCH_VISIBILITY_SECONDS`` counts too, so an instance the list does not show yet
  is not launched twice (``get`` reports it PENDING for that long instead of ``NotFound``).
  A launch is never retried after the request may have reached Lambda (5xx, read timeout):
  that raises ``Transient``, and the agent's next ``create`` looks for the instance first.
- **States.** booting → PENDING; active → RUNNING; unhealthy → RUNNING with a message (Lambda
  may recover it; giving up on it is the agent's call, not a single poll's); terminating →
  TERMINATING; terminated → TERMINATED (the agent knows whether it asked; an unasked end is
  its to call lost); preempted → LOST. A status this code does not know → PENDING with a
  message (never LOST: that would launch a second VM while the first may run).
- **The container's exit is not observable.** Lambda's API reports the VM, not the container:
  an active VM is RUNNING even after the container ended (its exit code is in
  ``/var/lib/vk-provider/exit-code`` on the VM), so EXITED is never reported. There is no
  logs API either: ``capabilities.logs`` is False and ``logs()`` raises ``NotFound``.
- **Errors.** ``insufficient-capacity`` and ``quota-exceeded`` → ``CapacityUnavailable`` (a
  quota is a limit on how much this account may run, not refused credentials: other offers
  or a later try can fit, so the offer is blocked, not the provider). ``object-does-not-exist``
  on launch (unknown SSH key, firewall ruleset, type or region) → ``CapacityUnavailable`` (a
  firewall ruleset exists in one region only, so another offer can work); elsewhere
  → ``NotFound``. ``invalid-parameters`` → ``InvalidSpec``; 401/403 (bad key, inactive account,
  billing address) → ``AuthFailed``; 429 → ``RateLimited``; 5xx, ``provider/*``, transport
  errors and malformed bodies → ``Transient``.
- **Rate limits.** Requests are spaced ``request_interval`` (1 s) apart and launches
  ``launch_interval`` (12 s) apart, client-side; a 429 pushes every later request back by its
  ``Retry-After`` (or the first back-off). tenacity retries 429, 5xx and connection errors a
  few times with capped exponential waits; a ``Retry-After`` longer than
  ``RetryPolicy.max_retry_after`` is handed to the agent as ``RateLimited`` instead.
- ``delete`` terminates the VM: Lambda has no graceful stop, so ``grace_seconds`` only buys
  what the VM's own shutdown gives Docker. A repeated delete within
  ``TERMINATE_REPEAT_SECONDS`` sends nothing (the agent polls delete while TERMINATING).
  "Not found" means done, except for an instance this process launched moments ago, which
  Lambda may not show yet: that is ``Transient``, so the agent terminates it again.

Invariants: the API key is read once (``SecretRef.resolve``) and lives only in the
``Authorization`` header; no message, log line or ``repr`` contains it (server-provided text
is scrubbed of it too). Nothing but ``domain.errors`` escapes a public method.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
import urllib.parse
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Generator,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

import httpx

from providers.cloud_init import build_user_data
from providers.lambda_cloud.config import LambdaProviderConfig
from providers.transport import Redactor, Sleep
from providers.transport import RetryPolicy as TransportRetryPolicy

# Re-exported: the parser is this adapter's API (its tests use it from here).
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
from vk_provider.settings.secrets import ConfigError

log = logging.getLogger(__name__)

TAG_MANAGED: Final = "vk-provider:managed"
TAG_PROVIDER: Final = "vk-provider:provider"
TAG_POD_UID: Final = "vk-provider:pod-uid"
TAG_REQUEST_ID: Final = "vk-provider:request-id"
NAME_PREFIX: Final = "vk-"
# From the spec: RequestedTagEntry.value maxLength, InstanceLaunchRequest.name maxLength.
TAG_VALUE_MAX: Final = 128
NAME_MAX: Final = 64
# A VM boots, pulls the image and starts it: minutes, not seconds.
STARTUP_SECONDS_ESTIMATE: Final = 300.0
LAUNCH_VISIBILITY_SECONDS: Final = 300.0
TERMINATE_REPEAT_SECONDS: Final = 30.0

# Pod UIDs are UUIDs; anything in this alphabet fits a tag value and a name unchanged.
_POD_UID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_REQUEST_ID: Final = re.compile(r"(?P<uid>[A-Za-z0-9][A-Za-z0-9_-]{0,99})\.(?P<attempt>\d{1,9})")
_ERROR_TEXT_MAX: Final = 300

Operation = Literal["list instance types", "launch", "get instance", "list instances", "terminate"]

# --- error taxonomy (the one place Lambda's errors become ours) ---------------------------

_AUTH_CODES: Final = frozenset(
    {"global/invalid-api-key", "global/account-inactive", "global/invalid-address"}
)
_CAPACITY_CODES: Final = frozenset(
    {"instance-operations/launch/insufficient-capacity", "global/quota-exceeded"}
)
_INVALID_CODES: Final = frozenset(
    {"global/invalid-parameters", "instance-operations/launch/file-system-in-wrong-region"}
)
_NOT_FOUND_CODE: Final = "global/object-does-not-exist"
_TRANSIENT_CODES: Final = frozenset({"global/internal-error"})


class MalformedResponse(Exception):
    """A response that is not what the API documents; the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class ApiError:
    """The ``error`` object of a failed response."""

    code: str
    message: str
    suggestion: str | None = None


def parse_api_error(body: bytes) -> ApiError | None:
    """``{"error": {"code", "message", "suggestion"?}}``, or None if the body is not one."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = document.get("error") if isinstance(document, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("code"), str):
        return None
    message, suggestion = error.get("message"), error.get("suggestion")
    return ApiError(
        code=error["code"],
        message=message if isinstance(message, str) else "",
        suggestion=suggestion if isinstance(suggestion, str) else None,
    )


def classify_failure(
    operation: Operation,
    failure: httpx.Response | httpx.HTTPError | MalformedResponse,
    *,
    provider: str,
    secrets: Collection[str] = (),
    now: datetime | None = None,
) -> ProviderError:
    """The ``domain.errors`` class of one failed call, with a message for people.

    ``failure`` is a non-2xx response, a transport error, or a success response whose body
    was not what the API documents. ``secrets`` are scrubbed from server-provided text.
    """
    what = f"Lambda {operation}"
    if isinstance(failure, MalformedResponse):
        return Transient(f"{what}: malformed response: {failure}", provider=provider)
    if isinstance(failure, httpx.TimeoutException):
        return Transient(f"{what}: timed out ({type(failure).__name__})", provider=provider)
    if isinstance(failure, httpx.HTTPError):
        reason = _scrub(str(failure), secrets) or "no detail"
        return Transient(f"{what}: {type(failure).__name__}: {reason}", provider=provider)

    status = failure.status_code
    error = parse_api_error(failure.content)
    detail = f"{what}: HTTP {status}"
    if error is not None:
        detail += f" {error.code}: {_scrub(error.message, secrets)}"
        if error.suggestion:
            detail += f" ({_scrub(error.suggestion, secrets)})"
    code = error.code if error is not None else None

    if status == 429:
        retry_after = parse_retry_after(failure.headers.get("Retry-After"), now=now)
        return RateLimited(detail, provider=provider, retry_after=retry_after)
    if code in _AUTH_CODES:
        return AuthFailed(detail, provider=provider)
    if code in _CAPACITY_CODES:
        return CapacityUnavailable(detail, provider=provider)
    if code in _INVALID_CODES:
        return InvalidSpec(detail, provider=provider)
    if code == _NOT_FOUND_CODE or (code is None and status == 404):
        if operation == "launch":
            # What the launch names (SSH key, firewall ruleset, type, region) is unknown
            # there; another offer, e.g. in another region, can still work.
            return CapacityUnavailable(detail, provider=provider)
        return NotFound(detail, provider=provider)
    if code in _TRANSIENT_CODES or (code is not None and code.startswith("provider/")):
        return Transient(detail, provider=provider)
    # An unknown code, or none: by status.
    if status in (401, 403):
        return AuthFailed(detail, provider=provider)
    if status >= 500:
        return Transient(detail, provider=provider)
    if error is None:
        return Transient(f"{detail} with a body that is not a Lambda error", provider=provider)
    if 400 <= status < 500:
        return InvalidSpec(detail, provider=provider)
    return Transient(detail, provider=provider)


def _scrub(text: str, secrets: Collection[str]) -> str:
    return Redactor(tuple(secrets))(text)[:_ERROR_TEXT_MAX]


# --- reading JSON with named paths --------------------------------------------------------


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise MalformedResponse(f"{where} is {_kind(value)}, expected an object")
    return value


def _array(value: object, where: str) -> Sequence[object]:
    if not isinstance(value, list):
        raise MalformedResponse(f"{where} is {_kind(value)}, expected an array")
    return value


def _field(value: Mapping[str, object], key: str, where: str) -> object:
    if key not in value:
        raise MalformedResponse(f"{where} has no {key!r}")
    return value[key]


def _string(value: Mapping[str, object], key: str, where: str) -> str:
    got = _field(value, key, where)
    if not isinstance(got, str):
        raise MalformedResponse(f"{where}.{key} is {_kind(got)}, expected a string")
    return got


def _number(value: Mapping[str, object], key: str, where: str) -> float:
    got = _field(value, key, where)
    if isinstance(got, bool) or not isinstance(got, int | float) or not math.isfinite(got):
        raise MalformedResponse(f"{where}.{key} is {_kind(got)}, expected a number")
    return float(got)


def parse_data(response: httpx.Response) -> object:
    """The ``data`` of a success body ``{"data": ...}``."""
    try:
        document = json.loads(response.content)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedResponse(
            f"body of HTTP {response.status_code} is not JSON ({len(response.content)} bytes, "
            f"truncated?): {exc}"
        ) from exc
    body = _object(document, "body")
    if "data" not in body:
        keys = ", ".join(sorted(map(str, body))) or "none"
        raise MalformedResponse(f"body has no 'data' (keys: {keys})")
    return body["data"]


# --- offers -------------------------------------------------------------------------------

_TYPE_NAME: Final = re.compile(r"gpu_(?P<count>\d+)x_(?P<rest>[a-z0-9_]+)")
_STATED_MEMORY: Final = re.compile(r"(\d+(?:\.\d+)?)\s*GB", re.IGNORECASE)
_VENDOR_WORDS: Final = frozenset({"NVIDIA", "TESLA", "QUADRO", "GEFORCE"})
# Per-GPU memory when neither the description nor the type name states it.
_KNOWN_MEMORY_GIB: Final[Mapping[str, float]] = {
    "A10": 24,
    "A6000": 48,
    "RTX6000": 24,
    "V100": 16,
    "H100": 80,
    "GH200": 96,
    "B200": 180,
}


def _type_tokens(type_name: str) -> list[str]:
    match = _TYPE_NAME.fullmatch(type_name.lower())
    return match.group("rest").split("_") if match else []


def _stated_memory_gib(type_name: str, gpu_description: str) -> float | None:
    match = _STATED_MEMORY.search(gpu_description)
    stated = match.group(1) if match else None
    for token in _type_tokens(type_name):
        if stated is None and re.fullmatch(r"\d+gb", token):
            stated = token[:-2]
    if stated is None or not math.isfinite(float(stated)):
        return None
    return float(stated)


def _family(type_name: str, gpu_description: str) -> str | None:
    tokens = _type_tokens(type_name)
    if tokens:
        family = re.sub(r"[^A-Z0-9]", "", tokens[0].upper())
        if family:
            return family
    # Not a gpu_<n>x_<model> name: the model is what the description says before "(".
    words = gpu_description.split("(")[0].upper().split()
    family = "".join(re.sub(r"[^A-Z0-9]", "", w) for w in words if w not in _VENDOR_WORDS)
    return family or None


def canonical_gpu(type_name: str, gpu_description: str) -> str | None:
    """The canonical GPU model (``H100-SXM``, ``A100-80GB``, ``GH200``...) of a Lambda type.

    The model comes from the type name (``gpu_8x_h100_sxm5``), the variant and memory from it
    and the description (``H100 (80 GB SXM5)``). Unknown models come back normalised
    (upper case, letters and digits), never as an error; None when nothing names a GPU.
    """
    family = _family(type_name, gpu_description)
    if family is None:
        return None
    tokens = _type_tokens(type_name)
    description = gpu_description.upper()
    if family == "H100":
        if any(t.startswith("sxm") for t in tokens) or "SXM" in description:
            return "H100-SXM"
        if "pcie" in tokens or "PCIE" in description:
            return "H100-PCIE"
        if "nvl" in tokens or "NVL" in description:
            return "H100-NVL"
        return "H100"
    if family == "A100":
        memory = _stated_memory_gib(type_name, gpu_description)
        if memory is None:
            return "A100"
        return "A100-80GB" if memory >= 80 else "A100-40GB"
    return family


def gpu_memory_gib(type_name: str, gpu_description: str) -> float:
    """Memory per GPU: as stated (``80 GB``, ``_80gb``), else known for the model, else 0."""
    stated = _stated_memory_gib(type_name, gpu_description)
    if stated is not None:
        return stated
    family = _family(type_name, gpu_description)
    return float(_KNOWN_MEMORY_GIB.get(family or "", 0.0))


def parse_offers(
    data: object,
    *,
    provider: str,
    instance_types: Collection[str] = (),
    regions: Collection[str] = (),
    max_price_per_hour: float | None = None,
) -> list[Offer]:
    """One ``Offer`` per (instance type, region with capacity) of ``GET /instance-types``.

    Empty ``instance_types``/``regions`` mean all. A malformed entry is skipped with a
    warning (a new kind of type must not hide the others), unless every entry is.
    """
    entries = _object(data, "data")
    offers: list[Offer] = []
    problems: list[str] = []
    for key, entry in entries.items():
        try:
            offers.extend(
                _type_offers(
                    entry,
                    where=f"data[{key!r}]",
                    provider=provider,
                    instance_types=instance_types,
                    regions=regions,
                    max_price_per_hour=max_price_per_hour,
                )
            )
        except MalformedResponse as exc:
            log.warning("%s: ignoring instance type %r: %s", provider, key, exc)
            problems.append(str(exc))
    if problems and len(problems) == len(entries):
        raise MalformedResponse(f"every instance type is malformed, first: {problems[0]}")
    return sorted(offers, key=lambda offer: (offer.price_per_hour, offer.key))


def _type_offers(
    entry: object,
    *,
    where: str,
    provider: str,
    instance_types: Collection[str],
    regions: Collection[str],
    max_price_per_hour: float | None,
) -> list[Offer]:
    item = _object(entry, where)
    kind = _object(_field(item, "instance_type", where), f"{where}.instance_type")
    kind_where = f"{where}.instance_type"
    name = _string(kind, "name", kind_where)
    if instance_types and name not in instance_types:
        return []
    description = _string(kind, "gpu_description", kind_where)
    price = _number(kind, "price_cents_per_hour", kind_where) / 100
    if max_price_per_hour is not None and price > max_price_per_hour:
        return []
    specs = _object(_field(kind, "specs", kind_where), f"{kind_where}.specs")
    gpus = int(_number(specs, "gpus", f"{kind_where}.specs"))
    vcpus = _number(specs, "vcpus", f"{kind_where}.specs")
    memory = _number(specs, "memory_gib", f"{kind_where}.specs")
    available = _array(
        _field(item, "regions_with_capacity_available", where),
        f"{where}.regions_with_capacity_available",
    )
    offers = []
    for index, raw_region in enumerate(available):
        region_where = f"{where}.regions_with_capacity_available[{index}]"
        region = _string(_object(raw_region, region_where), "name", region_where)
        if regions and region not in regions:
            continue
        offers.append(
            Offer(
                provider=provider,
                sku=name,
                region=region,
                gpu_model=canonical_gpu(name, description) if gpus > 0 else None,
                gpu_count=gpus,
                gpu_memory_gib=gpu_memory_gib(name, description) if gpus > 0 else 0.0,
                vcpus=vcpus,
                memory_gib=memory,
                price_per_hour=price,
                spot=False,
                available=1,
                startup_seconds=STARTUP_SECONDS_ESTIMATE,
            )
        )
    return offers


# --- instances ----------------------------------------------------------------------------

# Every status of InstanceStatus in the spec, and what it means here.
STATES: Final[Mapping[str, tuple[InstanceState, str]]] = {
    "booting": (InstanceState.PENDING, "the Lambda VM is booting"),
    "active": (InstanceState.RUNNING, ""),
    "unhealthy": (
        InstanceState.RUNNING,
        "Lambda reports the VM unhealthy; the container may still run",
    ),
    "terminating": (InstanceState.TERMINATING, "the Lambda VM is terminating"),
    "terminated": (InstanceState.TERMINATED, "the Lambda VM is terminated"),
    "preempted": (InstanceState.LOST, "Lambda preempted the VM"),
}


def instance_state(status: str) -> tuple[InstanceState, str]:
    """The state and message of a Lambda status; an unknown one waits (PENDING), see above."""
    known = STATES.get(status)
    if known is not None:
        return known
    return InstanceState.PENDING, f"Lambda reports status {status[:40]!r}, unknown to vk-provider"


def instance_name(spec: WorkloadSpec) -> str:
    """The instance's name, for people reading the Lambda console: ``vk-<uid>.<attempt>``."""
    return f"{NAME_PREFIX}{spec.request_id}"[:NAME_MAX]


def launch_tags(spec: WorkloadSpec, *, provider: str) -> list[dict[str, str]]:
    """The tags that make an instance ours and say for which pod attempt."""
    if not _POD_UID.fullmatch(spec.pod_uid):
        raise InvalidSpec(
            f"pod uid {spec.pod_uid[:120]!r} cannot label a Lambda instance (letters, digits, "
            "'-' and '_', at most 100)",
            provider=provider,
            field="metadata.uid",
        )
    return [
        {"key": TAG_MANAGED, "value": "true"},
        {"key": TAG_PROVIDER, "value": provider},
        {"key": TAG_POD_UID, "value": spec.pod_uid},
        {"key": TAG_REQUEST_ID, "value": spec.request_id},
    ]


def launch_request(
    spec: WorkloadSpec,
    offer: Offer,
    *,
    config: LambdaProviderConfig,
    user_data: str,
) -> dict[str, object]:
    """The body of ``POST /instance-operations/launch`` (``InstanceLaunchRequest``)."""
    body: dict[str, object] = {
        "region_name": offer.region,
        "instance_type_name": offer.sku,
        "ssh_key_names": [config.ssh_key_name],  # the API wants exactly one
        "name": instance_name(spec),
        "user_data": user_data,
        "tags": launch_tags(spec, provider=config.name),
    }
    if config.firewall_ruleset_ids:
        body["firewall_rulesets"] = [{"id": ruleset} for ruleset in config.firewall_ruleset_ids]
    return body


def parse_launch(data: object) -> str:
    """The instance id of ``InstanceLaunchResponse``; we launch one at a time."""
    ids = _array(_field(_object(data, "data"), "instance_ids", "data"), "data.instance_ids")
    if not ids or not isinstance(ids[0], str) or not ids[0]:
        raise MalformedResponse(f"data.instance_ids holds no instance id ({len(ids)} entries)")
    if len(ids) > 1:
        log.warning("Lambda launched %d instances for one request: %s", len(ids), ids)
    return ids[0]


def _tags(item: Mapping[str, object]) -> dict[str, str]:
    """Tags as a dict; anything odd in them simply is not a tag (tolerant: foreign data)."""
    raw = item.get("tags")
    tags: dict[str, str] = {}
    if isinstance(raw, list):
        for entry in raw:
            if isinstance(entry, dict):
                key, value = entry.get("key"), entry.get("value")
                if isinstance(key, str) and isinstance(value, str):
                    tags[key] = value
    return tags


def parse_instance(raw: object, *, provider: str, where: str = "data") -> Instance | None:
    """Our ``Instance`` for one Lambda instance payload; None when it is not ours.

    Foreign instances are judged by their tags alone (their shape is not our business);
    ours must be well formed, or ``MalformedResponse`` names what is not.
    """
    item = _object(raw, where)
    tags = _tags(item)
    if tags.get(TAG_MANAGED) != "true" or tags.get(TAG_PROVIDER) != provider:
        return None
    request = _REQUEST_ID.fullmatch(tags.get(TAG_REQUEST_ID, ""))
    if request is None or tags.get(TAG_POD_UID) != request.group("uid"):
        log.warning(
            "%s: instance %r carries our tags but no consistent pod uid and request id; "
            "ignoring it",
            provider,
            item.get("id"),
        )
        return None
    instance_id = _string(item, "id", where)
    state, message = instance_state(_string(item, "status", where))
    region_where = f"{where}.region"
    region = _string(_object(_field(item, "region", where), region_where), "name", region_where)
    kind_where = f"{where}.instance_type"
    kind = _object(_field(item, "instance_type", where), kind_where)
    sku = _string(kind, "name", kind_where)
    price = _number(kind, "price_cents_per_hour", kind_where) / 100
    ip = item.get("ip")
    return Instance(
        provider=provider,
        instance_id=instance_id,
        pod_uid=request.group("uid"),
        attempt=int(request.group("attempt")),
        state=state,
        offer_key=f"{provider}/{sku}/{region}",
        message=message,
        ip=ip if isinstance(ip, str) and ip else None,
        price_per_hour=price,
    )


def parse_instances(data: object, *, provider: str) -> list[Instance]:
    """Our instances among ``GET /instances``' ``data``."""
    found = []
    for index, raw in enumerate(_array(data, "data")):
        instance = parse_instance(raw, provider=provider, where=f"data[{index}]")
        if instance is not None:
            found.append(instance)
    return found


# --- transport: rate limits and retries ---------------------------------------------------

Clock = Callable[[], float]


class RateLimiter:
    """Spaces calls at least ``interval`` seconds apart, first come first served.

    ``clock`` and ``sleep`` are injectable so tests run on simulated time.
    """

    def __init__(self, interval: float, *, clock: Clock, sleep: Sleep) -> None:
        self._interval = interval
        self._clock = clock
        self._sleep = sleep
        self._next = -math.inf
        # Held while waiting, so callers leave in arrival order, each one interval apart.
        self._lock = asyncio.Lock()

    @property
    def interval(self) -> float:
        return self._interval

    async def acquire(self) -> None:
        async with self._lock:
            wait = self._next - self._clock()
            if wait > 0:
                await self._sleep(wait)
            self._next = max(self._clock(), self._next) + self._interval

    def hold_off(self, seconds: float) -> None:
        """Let nobody through for ``seconds`` from now (the server said slow down)."""
        self._next = max(self._next, self._clock() + seconds)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """tenacity's limits at the transport, in this adapter's spelling; tests pass short ones
    (and the provider's fake ``sleep``). ``with_sleep`` makes the shared policy of them."""

    attempts: int = 4
    first_wait: float = 1.0
    max_wait: float = 16.0
    # A server asking for a longer pause gets it from the agent's queue, not from a
    # coroutine that holds a worker.
    max_retry_after: float = 30.0

    def with_sleep(self, sleep: Sleep) -> TransportRetryPolicy:
        """``providers.transport.RetryPolicy`` with these limits, sleeping with ``sleep`` (the
        one the rate limiters use, so tests run on one simulated clock)."""
        return TransportRetryPolicy(
            attempts=self.attempts,
            backoff_seconds=self.first_wait,
            max_backoff_seconds=self.max_wait,
            max_retry_after_seconds=self.max_retry_after,
            sleep=sleep,
        )


@dataclass(frozen=True, slots=True)
class _Call:
    method: Literal["GET", "POST"]
    path: str
    body: Mapping[str, object] | None = None
    launch: bool = False

    @property
    def idempotent(self) -> bool:
        # A launch that may have reached Lambda must not be sent again: it could make a
        # second VM. Everything else (reads, terminate) is safe to repeat.
        return not self.launch


class _RetryableStatus(Exception):
    """A 429 or 5xx, raised inside the retry loop so tenacity sees it."""

    def __init__(self, response: httpx.Response, retry_after: float | None) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response
        self.retry_after = retry_after


def _status_retry_after(error: BaseException | None) -> float | None:
    """The ``Retry-After`` of a 429 raised inside the retry loop; None for anything else."""
    return error.retry_after if isinstance(error, _RetryableStatus) else None


class _FailedResponse(Exception):
    """A non-2xx response that is not retried (or no longer): classified by ``_errors``."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


# Failures that happen before the request leaves this machine: safe to retry even a launch.
_NOT_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class _BearerAuth(httpx.Auth):
    def __init__(self, api_key: str) -> None:
        self._header = f"Bearer {api_key}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header
        yield request

    def __repr__(self) -> str:
        return "_BearerAuth(<redacted>)"


@dataclass(frozen=True, slots=True)
class _Launched:
    instance: Instance
    at: float


# --- the provider -------------------------------------------------------------------------


class LambdaCloudProvider:
    """``domain.contract.Provider`` on Lambda Cloud VMs (see the module docstring)."""

    def __init__(
        self,
        config: LambdaProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        retry: RetryPolicy | None = None,
        request_interval: float = 1.0,
        launch_interval: float = 12.0,
    ) -> None:
        if len(config.name) > TAG_VALUE_MAX:
            raise ConfigError(
                f"provider {config.name[:40]!r}...: the name is a Lambda tag value, at most "
                f"{TAG_VALUE_MAX} characters"
            )
        api_key = config.api_key.resolve()  # ConfigError names the reference, not the value
        if not api_key:
            raise ConfigError(f"credential {config.api_key.ref}: is empty")
        self._config = config
        self._secrets = (api_key,)
        self._clock = clock
        self._retry = (retry or RetryPolicy()).with_sleep(sleep)
        self._requests = RateLimiter(request_interval, clock=clock, sleep=sleep)
        self._launches = RateLimiter(launch_interval, clock=clock, sleep=sleep)
        self._client = httpx.AsyncClient(
            base_url=config.base_url,
            transport=transport,
            auth=_BearerAuth(api_key),
            timeout=config.timeout_seconds,
            headers={"Accept": "application/json", "User-Agent": "vk-provider"},
        )
        # One create at a time: the look-up of a request id and its launch must not
        # interleave with another create of the same request (launches are 12 s apart anyway).
        self._create_lock = asyncio.Lock()
        self._launched: dict[str, _Launched] = {}  # by instance id
        self._terminate_sent: dict[str, float] = {}  # by instance id

    def __repr__(self) -> str:
        return f"LambdaCloudProvider(name={self.name!r}, base_url={self._config.base_url!r})"

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=False, follow_logs=False, log_timestamps=False)

    async def offers(self) -> list[Offer]:
        with self._errors("list instance types"):
            data = await self._call(_Call("GET", "/instance-types"))
            return parse_offers(
                data,
                provider=self.name,
                instance_types=self._config.instance_types,
                regions=self._config.regions,
                max_price_per_hour=self._config.max_price_per_hour,
            )

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        if offer.provider != self.name:
            raise CapacityUnavailable(f"offer {offer.key} is not {self.name}'s", provider=self.name)
        # Everything that can refuse the spec runs before any request.
        body = launch_request(
            spec,
            offer,
            config=self._config,
            user_data=build_user_data(
                spec, gpus=spec.gpu_count > 0 and offer.gpu_count > 0, provider=self.name
            ),
        )
        async with self._create_lock:
            existing = await self._find(spec)
            if existing is not None:
                return existing
            with self._errors("launch"):
                data = await self._call(
                    _Call("POST", "/instance-operations/launch", body=body, launch=True)
                )
                instance_id = parse_launch(data)
            log.info(
                "%s: launched %s (%s in %s) for pod %s attempt %d",
                self.name,
                instance_id,
                offer.sku,
                offer.region,
                spec.pod_uid,
                spec.attempt,
            )
            instance = Instance(
                provider=self.name,
                instance_id=instance_id,
                pod_uid=spec.pod_uid,
                attempt=spec.attempt,
                state=InstanceState.PENDING,
                offer_key=offer.key,
                message="launch requested",
                price_per_hour=offer.price_per_hour,
            )
            self._launched[instance_id] = _Launched(instance, self._clock())
            return instance

    async def get(self, instance_id: str) -> Instance:
        if not instance_id:
            raise NotFound("no Lambda instance has an empty id", provider=self.name)
        try:
            with self._errors("get instance"):
                data = await self._call(
                    _Call("GET", f"/instances/{urllib.parse.quote(instance_id, safe='')}")
                )
                instance = parse_instance(data, provider=self.name)
        except NotFound:
            recent = self._recent_launch(instance_id)
            if recent is None:
                raise
            return recent  # launched moments ago; Lambda's reads lag its writes
        if instance is None:
            raise NotFound(f"Lambda instance {instance_id} is not one of ours", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        """Terminate the VM. Lambda has no graceful stop: ``grace_seconds`` cannot be honoured
        beyond what the VM's own shutdown gives Docker."""
        if not instance_id:
            return
        sent = self._terminate_sent.get(instance_id)
        if sent is not None and self._clock() - sent < TERMINATE_REPEAT_SECONDS:
            return  # asked moments ago; the termination is under way
        try:
            with self._errors("terminate"):
                await self._call(
                    _Call("POST", "/instance-operations/terminate", {"instance_ids": [instance_id]})
                )
        except NotFound as exc:
            if self._recent_launch(instance_id) is not None:
                # Launched moments ago and not visible yet: "not found" is not "gone", and
                # taking it for done would leave a VM running.
                raise Transient(
                    f"Lambda does not show instance {instance_id} yet (launched moments ago); "
                    "terminate it again shortly",
                    provider=self.name,
                ) from exc
            return  # gone already: done
        self._launched.pop(instance_id, None)
        self._forget_old_terminations()
        self._terminate_sent[instance_id] = self._clock()
        log.info("%s: terminating %s", self.name, instance_id)

    async def list_ours(self) -> list[Instance]:
        with self._errors("list instances"):
            data = await self._call(_Call("GET", "/instances"))
            instances = parse_instances(data, provider=self.name)
        return [i for i in instances if i.state is not InstanceState.TERMINATED]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        raise NotFound(
            f"Lambda Cloud has no logs API; on the VM of {instance_id}, "
            "`journalctl -u vk-provider-workload` or `docker logs` shows the container's output",
            provider=self.name,
        )
        yield b""  # an async generator, like every provider's logs()

    async def close(self) -> None:
        await self._client.aclose()

    # --- internals ------------------------------------------------------------------------

    async def _find(self, spec: WorkloadSpec) -> Instance | None:
        """The instance already made for ``spec.request_id``, if any (one list call)."""
        with self._errors("list instances"):
            data = await self._call(_Call("GET", "/instances"))
            instances = parse_instances(data, provider=self.name)
        for instance in instances:
            if (instance.pod_uid, instance.attempt) == (spec.pod_uid, spec.attempt):
                return instance
        # Not listed yet, but launched by this process moments ago: the list lags.
        self._forget_old_launches()
        for launched in self._launched.values():
            found = launched.instance
            if (found.pod_uid, found.attempt) == (spec.pod_uid, spec.attempt):
                return found
        return None

    def _recent_launch(self, instance_id: str) -> Instance | None:
        self._forget_old_launches()
        launched = self._launched.get(instance_id)
        return None if launched is None else launched.instance

    def _forget_old_launches(self) -> None:
        now = self._clock()
        for key, launched in list(self._launched.items()):
            if now - launched.at > LAUNCH_VISIBILITY_SECONDS:
                del self._launched[key]

    def _forget_old_terminations(self) -> None:
        now = self._clock()
        for key, at in list(self._terminate_sent.items()):
            if now - at >= TERMINATE_REPEAT_SECONDS:
                del self._terminate_sent[key]

    @contextlib.contextmanager
    def _errors(self, operation: Operation) -> Iterator[None]:
        """Everything a call can fail with, as ``domain.errors`` (``classify_failure``)."""
        try:
            yield
        except _RetryableStatus as exc:
            raise self._classify(operation, exc.response) from exc
        except (httpx.HTTPError, MalformedResponse) as exc:
            raise self._classify(operation, exc) from exc
        except _FailedResponse as exc:
            raise self._classify(operation, exc.response) from None

    def _classify(
        self, operation: Operation, failure: httpx.Response | httpx.HTTPError | MalformedResponse
    ) -> ProviderError:
        return classify_failure(operation, failure, provider=self.name, secrets=self._secrets)

    async def _call(self, call: _Call) -> object:
        """One API call: rate-limited, retried where safe; the ``data`` of its body."""
        response = await self._retry.run(
            lambda: self._attempt(call),
            retry=lambda exc: self._retryable(exc, call),
            retry_after=_status_retry_after,
        )
        if not response.is_success:
            raise _FailedResponse(response)
        return parse_data(response)

    async def _attempt(self, call: _Call) -> httpx.Response:
        if call.launch:
            await self._launches.acquire()
        await self._requests.acquire()
        if call.launch:
            # The wait for the request slot delayed this launch: the next one counts from now.
            self._launches.hold_off(self._launches.interval)
        response = await self._client.request(call.method, call.path, json=call.body)
        if response.status_code == 429:
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            # Every caller waits, not just this one: the limit is the account's.
            # Capped: a longer pause is the agent's to take (RateLimited), not every caller's.
            pause = self._retry.backoff(1) if retry_after is None else retry_after
            self._requests.hold_off(min(pause, self._retry.max_retry_after_seconds))
            raise _RetryableStatus(response, retry_after)
        if response.status_code >= 500:
            raise _RetryableStatus(response, None)
        return response

    def _retryable(self, exc: BaseException, call: _Call) -> bool:
        if isinstance(exc, _RetryableStatus):
            if exc.response.status_code == 429:
                return self._retry.waits_for(exc.retry_after)
            return call.idempotent
        if isinstance(exc, httpx.TransportError):
            return call.idempotent or isinstance(exc, _NOT_SENT)
        return False
