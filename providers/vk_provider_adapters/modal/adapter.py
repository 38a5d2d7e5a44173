"""The Modal provider: each instance is a Modal Sandbox running the pod's one container.

The adapter is built on ``vk_provider_adapters.modal.sandbox.SandboxClient``, a small interface of
our own: ``vk_provider_adapters.modal.sdk`` implements it on the ``modal`` SDK (an optional
dependency, imported there only, and only when a Modal provider is configured without an injected
client), and the tests use an in-memory fake of it (``tests/unit/fake_modal.py``). Offers and prices
come from the configuration (``vk_provider_adapters.modal.catalogue``); names, tags and the state
table are in ``vk_provider_adapters.modal.identity``.

The workload: the image by registry reference; ``command`` replaces the image's ENTRYPOINT and
``args`` follow it, as in Kubernetes; a container with neither is refused (a sandbox without a
command does not run the image's default). Each declared TCP port is opened as a Modal tunnel
(``expose``: raw TCP by default, or TLS-terminated by Modal; ``vk_provider_adapters.modal.ports``)
and reported in ``Instance.endpoints`` once ``Sandbox.tunnels()`` has it; UDP and SCTP ports
cannot be tunnelled (a warning at create, the pod runs without them). Logs are stdout and
stderr, without timestamps; ``since_seconds`` is not supported.

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
  the image and then waits for capacity, by ``CREATE_TIMEOUT_SECONDS``: longer than the SDK's
  own scheduling wait, whose capacity error is ``CapacityUnavailable``) and retried on
  ``Transient`` and short ``RateLimited`` by ``vk_provider_adapters.transport.RetryPolicy``
  (``DEFAULT_RETRY``: exponential backoff with jitter, up to 30 s). Only ``domain.errors``
  leave the adapter, carrying this provider's name.
- Endpoints come from Modal's own tunnel answer and only while the sandbox runs. A sandbox's
  tunnels do not change for its life, so once every opened port has one it is kept in memory
  and never asked for again; until then each status read (``get``, ``list_ours``) asks Modal,
  concurrently and within ``TUNNEL_LOOKUP_SECONDS`` in all, without retries, and a failed or
  unfinished question only leaves that sandbox's endpoints for the next read: it never fails
  the read nor slows it beyond that bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Final, TypeVar

from vk_provider.sdk import (
    AuthFailed,
    Capabilities,
    ConfigError,
    Instance,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    PortEndpoint,
    ProviderError,
    Redactor,
    Transient,
    WorkloadSpec,
)
from vk_provider_adapters.modal.catalogue import Catalogued, catalogue
from vk_provider_adapters.modal.config import ModalProviderConfig
from vk_provider_adapters.modal.identity import (
    ATTEMPT_TAG,
    GPUS_TAG,
    MANAGED_BY_TAG,
    POD_UID_TAG,
    PORTS_TAG,
    PRICE_TAG,
    REGION_TAG,
    SKU_TAG,
    TAG_PATTERN,
    TERMINATE_REQUESTED,
    TERMINATE_TAG,
    sandbox_name,
    sandbox_state,
    tag_value,
)
from vk_provider_adapters.modal.ports import (
    OpenedPorts,
    opened_ports,
    ports_tag,
    reached_at,
    tcp_ports,
    unexposable,
)
from vk_provider_adapters.modal.sandbox import (
    SCHEDULING_WAIT_SECONDS,
    SandboxClient,
    SandboxInfo,
    SandboxNameTaken,
    SandboxRequest,
)
from vk_provider_adapters.transport import RetryPolicy, log_retries

log = logging.getLogger(__name__)

_T = TypeVar("_T")

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A create builds the image from the registry reference on first use, inside the call, then
# waits for capacity as long as the SDK does: the SDK must answer first, so that a GPU
# shortage arrives as its CapacityUnavailable (the offer is blocked) and not as a timeout of
# ours (Transient: retried on the same offer for an hour).
_IMAGE_BUILD_SECONDS: Final = 900.0
CREATE_TIMEOUT_SECONDS: Final = SCHEDULING_WAIT_SECONDS + _IMAGE_BUILD_SECONDS
# Modal's limits: four tries, backoff from 0.5 s doubling up to 30 s with up to 0.5 s of jitter.
DEFAULT_RETRY: Final = RetryPolicy(
    attempts=4,
    backoff_seconds=0.5,
    max_backoff_seconds=30.0,
    max_retry_after_seconds=30.0,
    jitter_seconds=0.5,
)

# How long Modal is asked to wait for the tunnels of a sandbox that has not published them yet
# (Modal sets them up within moments of the container's start); a sandbox still scheduling
# costs a read this long at most, and is asked again at the next one.
TUNNEL_WAIT_SECONDS: Final = 2
# All tunnel questions of one status read together, however many sandboxes they are for.
TUNNEL_LOOKUP_SECONDS: Final = 5.0
_TUNNEL_CONCURRENCY: Final = 16
# A sandbox's tunnels exist while it runs, also while its termination is under way (the agent
# lists a stopping replica as terminating); they are asked for while it is RUNNING only.
_TUNNELLED: Final = frozenset({InstanceState.RUNNING, InstanceState.TERMINATING})

_IMAGE_FIELD: Final = "spec.containers[0].image"
_COMMAND_FIELD: Final = "spec.containers[0].command"
_ENV_FIELD: Final = "spec.containers[0].env"


def _scrub(error: BaseException, redact: Redactor) -> BaseException:
    """``error`` with every form of every secret removed from its message (and its cause and
    context dropped, which may hold them); returned for ``raise``."""
    message = str(error)
    clean = redact(message)
    if clean != message:
        error.args = (clean,)
        error.__cause__ = None
        error.__context__ = None
        error.__suppress_context__ = True
    return error


def _credentials(config: ModalProviderConfig) -> Redactor:
    """The configured token, for redaction; one that cannot be resolved now is the SDK
    client's to report (its message names the reference, never a value)."""
    values = []
    for ref in (config.token_id, config.token_secret):
        try:
            values.append(ref.resolve())
        except ConfigError:
            continue
    return Redactor(tuple(values))


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


# --- the adapter -----------------------------------------------------------------------------


class ModalProvider:
    """``domain.contract.Provider`` on Modal sandboxes of one app."""

    def __init__(
        self,
        config: ModalProviderConfig,
        *,
        client: SandboxClient | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        """``client`` is the test seam (None: the ``modal`` SDK, imported now); ``retry`` the
        limits of every client call's retries."""
        self._catalogue = catalogue(config)
        if client is None:
            # Imported here so that `modal` is only needed when Modal is really used.
            from vk_provider_adapters.modal.sdk import ModalSandboxClient

            client = ModalSandboxClient(config)
        self._config = config
        self._client = client
        self._managed_by = tag_value(config.name)
        self._retry = retry
        self._redact = _credentials(config)
        # Sandboxes this process asked to terminate; the tag says so across restarts.
        self._terminating: set[str] = set()
        # The endpoints of running sandboxes whose every opened port has its tunnel: fixed for
        # the sandbox's life, so Modal is not asked again (dropped when the sandbox ends).
        self._reached: dict[str, tuple[PortEndpoint, ...]] = {}
        self._tunnel_limit = asyncio.Semaphore(_TUNNEL_CONCURRENCY)
        # Sandboxes whose tunnel question failed and was warned about: once each until it
        # succeeds, since every status read asks again.
        self._tunnel_warned: set[str] = set()

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
        for port in unexposable(spec):
            log.warning("pod %s: Modal cannot tunnel port %s; not exposed", spec.pod_uid, port)
        secrets = spec.secret_values
        try:
            sandbox_id = await self._call(
                "create",
                lambda: self._client.create_sandbox(request),
                limit_seconds=CREATE_TIMEOUT_SECONDS,
                secrets=secrets,
            )
        except SandboxNameTaken:
            return await self._existing(spec, request.name, secrets)
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
        (instance,) = await self._instances([await self._ours(instance_id)])
        return instance

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
        infos = await self._list_infos()
        running = {info.sandbox_id for info in infos}
        for gone in self._reached.keys() - running:  # the list holds every running one
            del self._reached[gone]
        self._tunnel_warned &= running
        return await self._instances(infos)

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        await self._ours(instance_id)  # NotFound for unknown and foreign sandboxes
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

    def _request(self, spec: WorkloadSpec, entry: Catalogued) -> SandboxRequest:
        """The sandbox for ``spec`` on ``entry``; ``InvalidSpec`` when Modal cannot run it."""
        if not spec.main.image.strip():
            raise InvalidSpec("the container has no image", provider=self.name, field=_IMAGE_FIELD)
        if not spec.main.command and not spec.main.args:
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
        if spec.main.working_dir is not None and not spec.main.working_dir.startswith("/"):
            raise InvalidSpec(
                "workingDir must be an absolute path",
                provider=self.name,
                field="spec.containers[0].workingDir",
            )
        for var in spec.main.env:
            if not _ENV_NAME.fullmatch(var.name):
                raise InvalidSpec(
                    f"environment variable name {var.name!r} is not allowed on Modal "
                    "(letters, digits and '_' only)",
                    provider=self.name,
                    field=_ENV_FIELD,
                )
        if not TAG_PATTERN.fullmatch(spec.pod_uid):
            raise InvalidSpec(
                "the pod UID cannot be a Modal tag", provider=self.name, field="metadata.uid"
            )
        offer = entry.offer
        tags = {
            MANAGED_BY_TAG: self._managed_by,
            POD_UID_TAG: spec.pod_uid,
            ATTEMPT_TAG: str(spec.attempt),
            SKU_TAG: tag_value(offer.sku),
            REGION_TAG: tag_value(offer.region),
            PRICE_TAG: f"{offer.price_per_hour:.4f}",
            GPUS_TAG: str(offer.gpu_count),
        }
        ports = tcp_ports(spec)
        expose = self._config.expose
        if ports:
            tags[PORTS_TAG] = ports_tag(expose, len(ports))
        return SandboxRequest(
            name=sandbox_name(spec.request_id),
            tags=tags,
            image=spec.main.image,
            command=spec.main.command,
            args=spec.main.args,
            env={var.name: var.value for var in spec.main.env if not var.secret},
            secret_env={var.name: var.value for var in spec.main.env if var.secret},
            gpu=entry.gpu,
            cpu=offer.vcpus,
            memory_mib=int(offer.memory_gib * 1024),
            regions=entry.regions,
            timeout_seconds=self._config.sandbox_timeout_seconds,
            workdir=spec.main.working_dir,
            encrypted_ports=ports if expose == "tls" else (),
            unencrypted_ports=ports if expose == "tcp" else (),
        )

    async def _existing(self, spec: WorkloadSpec, name: str, secrets: tuple[str, ...]) -> Instance:
        """The running sandbox that holds ``name``, after a create met ``SandboxNameTaken``."""
        info = await self._call("from_name", lambda: self._client.from_name(name), secrets=secrets)
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

    async def _ours(self, instance_id: str) -> SandboxInfo:
        """The sandbox, or ``NotFound`` when there is none or this provider did not make it."""
        info = await self._call("get", lambda: self._client.get(instance_id))
        if not self._is_ours(info):
            raise NotFound(f"no sandbox {instance_id} of this provider", provider=self.name)
        return info

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
            endpoints=self._reached.get(info.sandbox_id, ()) if state in _TUNNELLED else (),
        )

    async def _instances(self, infos: list[SandboxInfo]) -> list[Instance]:
        """``_instance`` of each, with the endpoints of running sandboxes whose tunnels are not
        known yet asked for (see the module docstring's invariant)."""
        instances = [self._instance(info) for info in infos]
        for instance in instances:
            if instance.state not in _TUNNELLED:
                self._reached.pop(instance.instance_id, None)
        asked = {
            info.sandbox_id: opened
            for info, instance in zip(infos, instances, strict=True)
            if instance.state is InstanceState.RUNNING
            and info.sandbox_id not in self._reached
            and (opened := opened_ports(info.tags.get(PORTS_TAG))) is not None
        }
        if not asked:
            return instances
        tasks = {
            sandbox_id: asyncio.create_task(self._reached_now(sandbox_id, opened))
            for sandbox_id, opened in asked.items()
        }
        _, unfinished = await asyncio.wait(tasks.values(), timeout=TUNNEL_LOOKUP_SECONDS)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        found = {
            sandbox_id: task.result()
            for sandbox_id, task in tasks.items()
            if task not in unfinished and not task.cancelled()
        }
        return [
            dataclasses.replace(instance, endpoints=found[instance.instance_id])
            if instance.instance_id in found
            else instance
            for instance in instances
        ]

    async def _reached_now(self, sandbox_id: str, opened: OpenedPorts) -> tuple[PortEndpoint, ...]:
        """The endpoints Modal's tunnel answer gives now (empty when it has none yet, or the
        question failed: asked again at the next read); kept once every opened port has one."""
        try:
            async with self._tunnel_limit:
                tunnels = await self._client.tunnels(sandbox_id, wait_seconds=TUNNEL_WAIT_SECONDS)
        except NotFound:
            return ()  # ended since it was listed
        except Exception as exc:  # a status read goes on without this sandbox's endpoints
            error = (
                exc
                if isinstance(exc, ProviderError)
                else Transient(f"modal tunnels: {type(exc).__name__}: {exc}", provider=self.name)
            )
            level = logging.DEBUG if sandbox_id in self._tunnel_warned else logging.WARNING
            self._tunnel_warned.add(sandbox_id)
            log.log(
                level,
                "%s: cannot read the tunnels of sandbox %s (asked again at every read): %s",
                self.name,
                sandbox_id,
                _scrub(error, self._redact),
            )
            return ()
        self._tunnel_warned.discard(sandbox_id)
        if tunnels is None:
            return ()
        endpoints = reached_at(tunnels, opened.expose)
        if len(endpoints) >= opened.count:
            self._reached[sandbox_id] = endpoints
        return endpoints

    async def _lines(self, instance_id: str, *, follow: bool) -> AsyncGenerator[bytes, None]:
        """The client's log lines, each ending with a newline; the client stream is closed
        when this one is (it may hold tasks reading Modal's streams)."""
        stream = self._client.logs(instance_id, follow=follow)
        try:
            async for line in stream:
                yield line if line.endswith(b"\n") else line + b"\n"
        except ProviderError as exc:
            exc.provider = exc.provider or self.name
            raise _scrub(exc, self._redact) from exc.__cause__
        except Exception as exc:  # a client must raise vk_provider.domain.errors only; be safe
            error = Transient(f"modal logs: {type(exc).__name__}: {exc}", provider=self.name)
            error.__cause__ = exc
            raise _scrub(error, self._redact) from error.__cause__
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
        """One client call: time-bounded, retried when retryable, errors stamped and scrubbed
        (before the retry loop logs them) of the credentials and of ``secrets``."""
        limit = self._config.timeout_seconds if limit_seconds is None else limit_seconds
        redact = self._redact.with_secrets(secrets)

        async def attempt() -> _T:
            try:
                async with asyncio.timeout(limit):
                    return await call()
            except TimeoutError:
                raise Transient(
                    f"modal {operation}: no answer in {limit:.0f}s", provider=self.name
                ) from None
            except SandboxNameTaken:
                raise
            except ProviderError as exc:
                exc.provider = exc.provider or self.name
                raise _scrub(exc, redact) from exc.__cause__
            except Exception as exc:  # a client must raise vk_provider.domain.errors only; be safe
                error = Transient(f"modal {operation}: {type(exc).__name__}: {exc}")
                error.provider = self.name
                error.__cause__ = exc
                raise _scrub(error, redact) from error.__cause__

        return await self._retry.run(attempt, before_sleep=log_retries(log, self.name))


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
