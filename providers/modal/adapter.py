"""The Modal provider: each instance is a Modal Sandbox running the pod's one container.

Modal has no public REST API for sandboxes; its Python SDK speaks gRPC. The adapter is built on
a small interface of our own, ``SandboxClient``: ``providers.modal.sdk`` implements it on the
``modal`` SDK (an optional dependency, imported there only, and only when a Modal provider is
configured without an injected client), and the tests use an in-memory fake of it
(``tests/unit/fake_modal.py``). Modal has no price or capacity API: offers and prices come from
the configuration (``ModalProviderConfig.offers``), with canonical GPU names (``MODAL_GPUS``:
Modal's ``H100`` is ``H100-SXM``, ``A100`` is ``A100-40GB``), ``gpu=`` strings spelled
``H100`` / ``A100-80GB:2``, and ``regions`` / ``max_price_per_hour`` / ``max_gpus`` applied.

The workload: the image by registry reference; ``command`` replaces the image's ENTRYPOINT and
``args`` follow it, as in Kubernetes; a container with neither is refused (a sandbox without a
command does not run the image's default). Ports are not exposed (Modal tunnels are public).
Logs are stdout and stderr, without timestamps; ``since_seconds`` is not supported.

Names and tags of a sandbox::

    name  vk-<pod uid>.<attempt>            ``spec.request_id`` behind a prefix, when it fits
                                            Modal's name rules ([A-Za-z0-9._-], <= 64 chars)
          vk-h-<sha256(request id)[:40]>    otherwise (``sandbox_name``)
    tags  vk-provider.managed-by            the provider's name: ``list_ours`` filters on it
          vk-provider.pod-uid / .attempt    whose launch it is
          vk-provider.sku / .region / .price / .gpus    the offer it was launched on
          vk-provider.terminate             "requested", written by ``delete`` before it
                                            terminates the sandbox

States (``sandbox_state``), from ``poll()`` (Modal reports 124 for a sandbox that hit its
timeout and 137 for one that was terminated) and whether we asked for termination:

    | poll()  | we asked | state       | message                                          |
    |---------|----------|-------------|--------------------------------------------------|
    | None    | no       | PENDING     | not scheduled yet (only when the client can tell)|
    | None    | no       | RUNNING     |                                                  |
    | None    | yes      | TERMINATING | termination requested                            |
    | any     | yes      | TERMINATED  | terminated on request                            |
    | 124     | no       | LOST        | sandbox timed out                                |
    | 137     | no       | LOST        | sandbox terminated by Modal                      |
    | other   | no       | EXITED      | ``exit_code`` carries the code                   |

Invariants:
- One running sandbox per ``spec.request_id``: the name is derived from the request id and
  Modal keeps names unique among an app's running sandboxes, so a repeated create meets
  ``SandboxNameTaken`` and returns the running sandbox. Modal frees a name when its sandbox
  ends, so a create repeated after the first sandbox finished makes a second one; the agent
  records the instance id on the pod as soon as the first create returns.
- Every sandbox gets an explicit ``timeout`` (``sandbox_timeout_seconds``): Modal's default of
  300 s would kill inference servers after five minutes.
- A termination request is remembered in memory and as a tag on the sandbox, so its exit 137
  reads TERMINATED (not LOST), also after an agent restart. Modal's terminate has no grace
  period; ``grace_seconds`` is not honoured.
- Secret environment values go to the client apart from the plain ones (it passes them as a
  Modal Secret); they are never logged, and error messages are scrubbed of them.
- Every client call is bounded by the configured per-request timeout (a create, which builds
  the image, by ``_CREATE_TIMEOUT_SECONDS``) and retried on ``Transient`` and ``RateLimited``
  (honouring ``retry_after``, capped) by ``providers.transport``'s tenacity loop. Only
  ``domain.errors`` leave the adapter, carrying this provider's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol, TypeVar

from tenacity import RetryCallState, wait_exponential, wait_random

from providers.modal.config import ModalGpuOffer, ModalProviderConfig
from providers.transport import Redactor, failure_of, rate_limit_retry_after, retrying
from vk_provider.domain.errors import (
    AuthFailed,
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

_T = TypeVar("_T")

TAG_PREFIX: Final = "vk-provider."
MANAGED_BY_TAG: Final = TAG_PREFIX + "managed-by"
POD_UID_TAG: Final = TAG_PREFIX + "pod-uid"
ATTEMPT_TAG: Final = TAG_PREFIX + "attempt"
SKU_TAG: Final = TAG_PREFIX + "sku"
REGION_TAG: Final = TAG_PREFIX + "region"
PRICE_TAG: Final = TAG_PREFIX + "price"
GPUS_TAG: Final = TAG_PREFIX + "gpus"
TERMINATE_TAG: Final = TAG_PREFIX + "terminate"
TERMINATE_REQUESTED: Final = "requested"

EXIT_TIMED_OUT: Final = 124  # Modal's return code for a sandbox that reached its timeout
EXIT_TERMINATED: Final = 137  # ... and for one that was terminated
ANY_REGION: Final = "any"

# Modal's rules (modal/_utils/name_utils.py): object names and tag keys/values.
_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_TAG = re.compile(r"[A-Za-z0-9._-]{1,63}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A create builds the image from the registry reference on first use, inside the call.
_CREATE_TIMEOUT_SECONDS: Final = 900.0
_RETRY_ATTEMPTS: Final = 4
_MAX_RETRY_WAIT_SECONDS: Final = 30.0
_BACKOFF: Final = wait_exponential(multiplier=0.5, max=_MAX_RETRY_WAIT_SECONDS) + wait_random(
    0, 0.5
)

_IMAGE_FIELD: Final = "spec.containers[0].image"
_COMMAND_FIELD: Final = "spec.containers[0].command"
_ENV_FIELD: Final = "spec.containers[0].env"

# Modal GPU names (modal.com/docs/guide/gpu) -> (canonical model, memory per GPU in GiB).
# Where Modal may upgrade (A100 -> 80 GB, H100 -> H200), the floor is what we promise.
# Modal's H100s are SXM parts.
MODAL_GPUS: Final[Mapping[str, tuple[str, float]]] = {
    "T4": ("T4", 16),
    "L4": ("L4", 24),
    "A10": ("A10", 24),
    "A10G": ("A10G", 24),
    "L40S": ("L40S", 48),
    "A100": ("A100-40GB", 40),
    "A100-40GB": ("A100-40GB", 40),
    "A100-80GB": ("A100-80GB", 80),
    "RTX-PRO-6000": ("RTX-PRO-6000", 96),
    "H100": ("H100-SXM", 80),
    "H100!": ("H100-SXM", 80),
    "H200": ("H200", 141),
    "B200": ("B200", 180),
    "B200+": ("B200", 180),
}


# --- the interface the adapter is built on ---------------------------------------------------


class SandboxNameTaken(Exception):
    """A running sandbox of the app already has the requested name (Modal's AlreadyExists)."""


@dataclass(frozen=True, slots=True)
class SandboxRequest:
    """One sandbox to create; ``secret_env`` never shows in ``repr``."""

    name: str
    tags: Mapping[str, str]
    image: str
    command: tuple[str, ...]  # replaces the image's ENTRYPOINT when not empty (Kubernetes rule)
    args: tuple[str, ...]
    env: Mapping[str, str]
    secret_env: Mapping[str, str] = field(repr=False)
    gpu: str | None  # Modal's spelling: "H100", "A100-80GB:2"
    cpu: float
    memory_mib: int
    regions: tuple[str, ...]  # empty: anywhere
    timeout_seconds: int
    workdir: str | None = None


@dataclass(frozen=True, slots=True)
class SandboxInfo:
    """What the client knows of one sandbox; ``exit_code`` is ``poll()``'s answer."""

    sandbox_id: str
    tags: Mapping[str, str]
    exit_code: int | None = None
    name: str | None = None
    started: bool | None = None  # None: the client cannot tell (RUNNING is assumed)
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


class SandboxClient(Protocol):
    """The few sandbox operations the adapter needs, on one Modal app.

    Implementations raise ``domain.errors`` (mapped in one place) and ``SandboxNameTaken``,
    nothing else.
    """

    async def create_sandbox(self, request: SandboxRequest) -> str:
        """Create and start a sandbox; its id. ``SandboxNameTaken`` if the name is in use."""
        ...

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """Any sandbox of the app, running or finished; ``NotFound`` if there is none."""
        ...

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        """The app's running sandboxes that carry at least ``tags`` (finished ones are not)."""
        ...

    async def from_name(self, name: str) -> SandboxInfo | None:
        """The app's running sandbox of that name, or None."""
        ...

    async def set_tags(self, sandbox_id: str, tags: Mapping[str, str]) -> None:
        """Replace the sandbox's whole tag set."""
        ...

    async def terminate(self, sandbox_id: str) -> None:
        """Terminate the sandbox; a no-op when it has finished."""
        ...

    def logs(self, sandbox_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        """stdout and stderr from the start, one line per chunk; without ``follow`` the stream
        ends with the output produced so far, with it when the sandbox ends."""
        ...

    async def close(self) -> None: ...


# --- pure helpers ----------------------------------------------------------------------------


def sandbox_name(request_id: str) -> str:
    """The sandbox name (idempotency key) of a launch; see the module docstring."""
    name = f"vk-{request_id}"
    if _NAME.fullmatch(name):
        return name
    return "vk-h-" + hashlib.sha256(request_id.encode()).hexdigest()[:40]


def tag_value(value: str) -> str:
    """``value`` when Modal accepts it as a tag value, else a stable digest of it."""
    if _TAG.fullmatch(value):
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:32]


def modal_gpu_string(gpu: str, count: int) -> str:
    """Modal's ``gpu=`` argument: ``H100`` for one GPU, ``A100-80GB:2`` for several."""
    return gpu if count == 1 else f"{gpu}:{count}"


def offer_sku(gpu: str, count: int) -> str:
    """``h100-x1``, ``a100-80gb-x2``, ``h100-exact-x1`` (for ``H100!``)."""
    slug = gpu.strip().lower().replace("!", "-exact").replace("+", "-plus")
    slug = re.sub(r"[^a-z0-9.]+", "-", slug).strip("-")
    return f"{slug}-x{count}"


def sandbox_state(info: SandboxInfo, *, termination_requested: bool) -> tuple[InstanceState, str]:
    """The state table of the module docstring."""
    code = info.exit_code
    if code is None:
        if termination_requested:
            return InstanceState.TERMINATING, "termination requested"
        if info.started is False:
            return InstanceState.PENDING, "waiting for Modal to schedule the sandbox"
        return InstanceState.RUNNING, ""
    if termination_requested:
        return InstanceState.TERMINATED, "terminated on request"
    if code == EXIT_TIMED_OUT:
        return InstanceState.LOST, "sandbox timed out"
    if code == EXIT_TERMINATED:
        return InstanceState.LOST, "sandbox terminated by Modal"
    return InstanceState.EXITED, ""


def _default_wait(state: RetryCallState) -> float:
    """Exponential back-off with jitter; a rate limit's ``retry_after`` when it gives one."""
    retry_after = rate_limit_retry_after(failure_of(state))
    if retry_after is not None:
        return min(retry_after, _MAX_RETRY_WAIT_SECONDS)
    return float(_BACKOFF(state))


def _retryable(error: BaseException) -> bool:
    """Every ``Transient`` and every ``RateLimited``, however long its ``retry_after``
    (``_default_wait`` caps the pause instead of handing it to the agent)."""
    return isinstance(error, Transient | RateLimited)


def _scrub(error: ProviderError, secrets: tuple[str, ...]) -> None:
    """Remove secret values from ``error``'s message (and drop its cause, which may hold them)."""
    message = str(error)
    clean = Redactor(secrets)(message)
    if clean != message:
        error.args = (clean,)
        error.__cause__ = None
        error.__context__ = None
        error.__suppress_context__ = True


def _parse_int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _parse_float(value: str | None) -> float:
    try:
        return float(value) if value is not None else 0.0
    except ValueError:
        return 0.0


@dataclass(frozen=True, slots=True)
class _Catalogued:
    """One configured offer and how to launch it."""

    offer: Offer
    gpu: str  # Modal's spelling, with the count
    regions: tuple[str, ...]


def _catalogue(config: ModalProviderConfig) -> dict[str, _Catalogued]:
    """The configured offers allowed by ``regions`` and ``max_price_per_hour``, by offer key."""
    entries: dict[str, _Catalogued] = {}
    for configured in config.offers:
        entry = _catalogued(config, configured)
        if entry is None:
            continue
        if entry.offer.key in entries:
            raise ConfigError(
                f"providers[{config.name}].offers: two offers of {configured.gpu} x"
                f"{configured.count} in region {configured.region!r}"
            )
        entries[entry.offer.key] = entry
    return entries


def _catalogued(config: ModalProviderConfig, configured: ModalGpuOffer) -> _Catalogued | None:
    if config.max_price_per_hour is not None and configured.price_per_hour > (
        config.max_price_per_hour
    ):
        return None
    if configured.region == ANY_REGION:
        regions = tuple(config.regions)  # Modal may place it in any of the allowed regions
    elif not config.regions or configured.region in config.regions:
        regions = (configured.region,)
    else:
        return None
    gpu = configured.gpu.strip()
    canonical, memory = MODAL_GPUS.get(gpu.upper(), (gpu.upper(), 0.0))
    offer = Offer(
        provider=config.name,
        sku=offer_sku(gpu, configured.count),
        region=configured.region,
        gpu_model=canonical,
        gpu_count=configured.count,
        gpu_memory_gib=memory,
        vcpus=configured.vcpus,
        memory_gib=configured.memory_gib,
        price_per_hour=configured.price_per_hour,
        available=config.max_gpus // configured.count,
    )
    return _Catalogued(offer, modal_gpu_string(gpu, configured.count), regions)


# --- the adapter -----------------------------------------------------------------------------


class ModalProvider:
    """``domain.contract.Provider`` on Modal sandboxes of one app."""

    def __init__(
        self,
        config: ModalProviderConfig,
        *,
        client: SandboxClient | None = None,
        retry_attempts: int = _RETRY_ATTEMPTS,
        retry_wait: Callable[[RetryCallState], float] = _default_wait,
    ) -> None:
        self._catalogue = _catalogue(config)
        if client is None:
            # Imported here so that `modal` is only needed when Modal is really used.
            from providers.modal.sdk import ModalSandboxClient

            client = ModalSandboxClient(config)
        self._config = config
        self._client = client
        self._managed_by = tag_value(config.name)
        self._retry_attempts = retry_attempts
        self._retry_wait = retry_wait
        # Sandboxes this process asked to terminate; the tag says so across restarts.
        self._terminating: set[str] = set()

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=False)

    async def offers(self) -> list[Offer]:
        in_use = sum(_parse_int(info.tags.get(GPUS_TAG)) for info in await self._list_infos())
        free_gpus = max(0, self._config.max_gpus - in_use)
        return [
            dataclasses.replace(entry.offer, available=free_gpus // entry.offer.gpu_count)
            for entry in self._catalogue.values()
        ]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        entry = self._catalogue.get(offer.key)
        if entry is None or offer.provider != self.name:
            raise InvalidSpec(
                f"offer {offer.key} is not one of this provider's", provider=self.name
            )
        request = self._request(spec, entry)
        secrets = tuple(var.value for var in spec.env if var.secret and var.value)
        try:
            sandbox_id = await self._call(
                "create",
                lambda: self._client.create_sandbox(request),
                limit_seconds=_CREATE_TIMEOUT_SECONDS,
                secrets=secrets,
            )
        except SandboxNameTaken:
            return await self._existing(spec, request.name)
        log.info(
            "created sandbox %s (%s) for pod %s on %s",
            sandbox_id,
            request.name,
            spec.pod_uid,
            offer.key,
        )
        return self._instance(
            SandboxInfo(sandbox_id, request.tags, name=request.name, started=False)
        )

    async def get(self, instance_id: str) -> Instance:
        info = await self._call("get", lambda: self._client.get(instance_id))
        if not self._is_ours(info):
            raise NotFound(f"no sandbox {instance_id} of this provider", provider=self.name)
        return self._instance(info)

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        try:
            info = await self._call("get", lambda: self._client.get(instance_id))
        except NotFound:
            return
        if not self._is_ours(info):
            return  # never touch a sandbox this provider did not make
        self._terminating.add(instance_id)
        if info.exit_code is not None:
            return
        if info.tags.get(TERMINATE_TAG) != TERMINATE_REQUESTED:
            tags = {**info.tags, TERMINATE_TAG: TERMINATE_REQUESTED}
            try:
                await self._call("set_tags", lambda: self._client.set_tags(instance_id, tags))
            except NotFound:
                return
            except AuthFailed:
                raise
            except ProviderError as exc:
                # Only durability across restarts is lost; the termination must still happen.
                log.warning("%s: cannot tag the termination request: %s", instance_id, exc)
        try:
            await self._call("terminate", lambda: self._client.terminate(instance_id))
        except NotFound:
            return
        log.info("terminating sandbox %s (Modal has no grace period)", instance_id)

    async def list_ours(self) -> list[Instance]:
        return [self._instance(info) for info in await self._list_infos()]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        await self.get(instance_id)  # NotFound for unknown and foreign sandboxes
        lines: AsyncGenerator[bytes, None]
        if options.follow:
            skip = 0
            if options.tail_lines is not None:
                history = [line async for line in self._lines(instance_id, follow=False)]
                skip = max(0, len(history) - options.tail_lines)
            # The followed stream starts again from the beginning: skip to the last lines.
            lines = _after(self._lines(instance_id, follow=True), skip)
        else:
            history = [line async for line in self._lines(instance_id, follow=False)]
            if options.tail_lines is not None:
                history = history[max(0, len(history) - options.tail_lines) :]
            lines = _each(history)
        async with contextlib.aclosing(_within(lines, options.limit_bytes)) as limited:
            async for chunk in limited:
                yield chunk

    async def close(self) -> None:
        await self._client.close()

    # --- internals ---

    def _request(self, spec: WorkloadSpec, entry: _Catalogued) -> SandboxRequest:
        """The sandbox for ``spec`` on ``entry``; ``InvalidSpec`` when Modal cannot run it."""
        if not spec.image.strip():
            raise InvalidSpec("the container has no image", provider=self.name, field=_IMAGE_FIELD)
        if not spec.command and not spec.args:
            raise InvalidSpec(
                "Modal sandboxes do not run an image's default command: set command or args",
                provider=self.name,
                field=_COMMAND_FIELD,
            )
        if spec.gpu_count > entry.offer.gpu_count:
            raise InvalidSpec(
                f"{spec.gpu_count} GPUs requested, offer {entry.offer.key} has "
                f"{entry.offer.gpu_count}",
                provider=self.name,
                field="spec.containers[0].resources.limits['nvidia.com/gpu']",
            )
        if spec.working_dir is not None and not spec.working_dir.startswith("/"):
            raise InvalidSpec(
                "workingDir must be an absolute path",
                provider=self.name,
                field="spec.containers[0].workingDir",
            )
        for var in spec.env:
            if not _ENV_NAME.fullmatch(var.name):
                raise InvalidSpec(
                    f"environment variable name {var.name!r} is not allowed on Modal "
                    "(letters, digits and '_' only)",
                    provider=self.name,
                    field=_ENV_FIELD,
                )
        if not _TAG.fullmatch(spec.pod_uid):
            raise InvalidSpec(
                "the pod UID cannot be a Modal tag", provider=self.name, field="metadata.uid"
            )
        offer = entry.offer
        return SandboxRequest(
            name=sandbox_name(spec.request_id),
            tags={
                MANAGED_BY_TAG: self._managed_by,
                POD_UID_TAG: spec.pod_uid,
                ATTEMPT_TAG: str(spec.attempt),
                SKU_TAG: tag_value(offer.sku),
                REGION_TAG: tag_value(offer.region),
                PRICE_TAG: f"{offer.price_per_hour:.4f}",
                GPUS_TAG: str(offer.gpu_count),
            },
            image=spec.image,
            command=spec.command,
            args=spec.args,
            env={var.name: var.value for var in spec.env if not var.secret},
            secret_env={var.name: var.value for var in spec.env if var.secret},
            gpu=entry.gpu,
            cpu=offer.vcpus,
            memory_mib=int(offer.memory_gib * 1024),
            regions=entry.regions,
            timeout_seconds=self._config.sandbox_timeout_seconds,
            workdir=spec.working_dir,
        )

    async def _existing(self, spec: WorkloadSpec, name: str) -> Instance:
        """The running sandbox that holds ``name``, after a create met ``SandboxNameTaken``."""
        info = await self._call("from_name", lambda: self._client.from_name(name))
        if info is None:
            raise Transient(
                f"sandbox name {name} was taken but its sandbox has ended; retry",
                provider=self.name,
            )
        same_launch = info.tags.get(POD_UID_TAG) == spec.pod_uid and info.tags.get(
            ATTEMPT_TAG
        ) == str(spec.attempt)
        if not self._is_ours(info) or not same_launch:
            raise InvalidSpec(
                f"sandbox name {name} is held by a sandbox this provider did not make",
                provider=self.name,
            )
        log.info("sandbox %s (%s) already exists for pod %s", info.sandbox_id, name, spec.pod_uid)
        return self._instance(info)

    async def _list_infos(self) -> list[SandboxInfo]:
        infos = await self._call(
            "list", lambda: self._client.list({MANAGED_BY_TAG: self._managed_by})
        )
        return [info for info in infos if self._is_ours(info)]

    def _is_ours(self, info: SandboxInfo) -> bool:
        return info.tags.get(MANAGED_BY_TAG) == self._managed_by and POD_UID_TAG in info.tags

    def _instance(self, info: SandboxInfo) -> Instance:
        tags = info.tags
        requested = (
            info.sandbox_id in self._terminating or tags.get(TERMINATE_TAG) == TERMINATE_REQUESTED
        )
        state, message = sandbox_state(info, termination_requested=requested)
        sku, region = tags.get(SKU_TAG), tags.get(REGION_TAG)
        return Instance(
            provider=self.name,
            instance_id=info.sandbox_id,
            pod_uid=tags.get(POD_UID_TAG, ""),
            attempt=_parse_int(tags.get(ATTEMPT_TAG)),
            state=state,
            offer_key=f"{self.name}/{sku}/{region}" if sku and region else "",
            exit_code=info.exit_code,
            message=message,
            started_at=info.started_at,
            finished_at=info.finished_at,
            price_per_hour=_parse_float(tags.get(PRICE_TAG)),
        )

    async def _lines(self, instance_id: str, *, follow: bool) -> AsyncGenerator[bytes, None]:
        """The client's log lines, each ending with a newline; the client stream is closed
        when this one is (it may hold tasks reading Modal's streams)."""
        stream = self._client.logs(instance_id, follow=follow)
        try:
            async for line in stream:
                yield line if line.endswith(b"\n") else line + b"\n"
        except ProviderError as exc:
            exc.provider = exc.provider or self.name
            raise
        except Exception as exc:  # a client must raise vk_provider.domain.errors only; be safe
            raise Transient(f"modal logs: {type(exc).__name__}: {exc}", provider=self.name) from exc
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _call(
        self,
        operation: str,
        call: Callable[[], Awaitable[_T]],
        *,
        limit_seconds: float | None = None,
        secrets: tuple[str, ...] = (),
    ) -> _T:
        """One client call: time-bounded, retried when retryable, errors stamped and scrubbed."""
        limit = self._config.timeout_seconds if limit_seconds is None else limit_seconds

        async def attempt() -> _T:
            try:
                async with asyncio.timeout(limit):
                    return await call()
            except TimeoutError:
                raise Transient(f"modal {operation}: no answer in {limit:.0f}s") from None
            except (ProviderError, SandboxNameTaken):
                raise
            except Exception as exc:  # a client must raise vk_provider.domain.errors only; be safe
                raise Transient(f"modal {operation}: {type(exc).__name__}: {exc}") from exc

        try:
            return await retrying(
                attempt, attempts=self._retry_attempts, retry=_retryable, wait=self._retry_wait
            )
        except ProviderError as exc:
            exc.provider = exc.provider or self.name
            _scrub(exc, secrets)
            raise


async def _each(lines: list[bytes]) -> AsyncGenerator[bytes, None]:
    for line in lines:
        yield line


async def _after(lines: AsyncGenerator[bytes, None], skip: int) -> AsyncGenerator[bytes, None]:
    """``lines`` without the first ``skip``."""
    async with contextlib.aclosing(lines):
        async for line in lines:
            if skip > 0:
                skip -= 1
                continue
            yield line


async def _within(
    lines: AsyncGenerator[bytes, None], limit_bytes: int | None
) -> AsyncGenerator[bytes, None]:
    """``lines`` cut off after ``limit_bytes`` bytes (None: no limit)."""
    budget = limit_bytes
    async with contextlib.aclosing(lines):
        async for line in lines:
            if budget is None:
                yield line
                continue
            yield line[:budget]
            budget -= len(line)
            if budget <= 0:
                return
