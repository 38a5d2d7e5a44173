"""``vk_provider_adapters.modal.sandbox.SandboxClient`` on the real ``modal`` SDK
(``modal>=1.4.3``).

This is the only module that imports ``modal``, and ``ModalProvider`` imports it
only when a Modal provider is configured without an injected client. ``modal`` is loaded when a
``ModalSandboxClient`` is made (``ModalSdkMissing`` names the fix when it is not installed); the
connection (``modal.Client.from_credentials`` with the configured token, then
``modal.App.lookup(app_name, create_if_missing=True)``) is made on the first call. The SDK is
used through its async ``.aio`` forms and typed ``Any`` at this boundary, so the module
type-checks without ``modal`` installed.

SDK facts relied upon (modal-labs/modal-client, ``py/modal/sandbox.py``):
- ``Sandbox.create(*argv, app=, name=, tags=, image=, env=, secrets=, timeout=, gpu=, cpu=,
  memory=, region=, workdir=, client=)``; ``tags=`` exists since 1.4.3; a taken name raises
  ``AlreadyExistsError``. Names must match ``[A-Za-z0-9._-]{1,64}`` (enforced since 1.2.2).
- ``Sandbox.from_id`` fetches the result at once (``returncode``: None while running, 124 after
  a timeout, 137 after a termination); ``get_tags``/``set_tags`` (replaces the whole set);
  ``Sandbox.from_name(app_name, name)`` finds running sandboxes only, as does
  ``Sandbox.list(app_id=, tags=)``; its results carry no tags, so each is asked for them.
- ``sb.stdout``/``sb.stderr`` iterate lines from the start of the output to its end.
- ``Sandbox.create`` waits for the sandbox to be scheduled for up to 21 minutes
  (``sandbox.SCHEDULING_WAIT_SECONDS``; ``modal/sandbox/_impl_v1.py`` in 1.6), then terminates it
  and raises ``ResourceExhaustedError("Insufficient capacity to create sandbox.")``, which
  ``translate_error`` makes ``CapacityUnavailable``.
- Since 1.3 every gRPC failure is raised as a ``modal.exception`` class.
- ``Sandbox.create(encrypted_ports=, unencrypted_ports=)`` opens tunnels (1.6:
  ``sandbox/_common.py`` ``open_port_specs``); ``sb.tunnels(timeout=)`` (default 50 s) answers
  ``{container_port: Tunnel(host, port, unencrypted_host, unencrypted_port)}``
  (``modal/_tunnel.py``; ``unencrypted_host`` is empty for an encrypted port) once Modal has
  them, or raises ``SandboxTimeoutError`` when they are not there within ``timeout``
  (``tunnels_from_response``), which ``tunnels`` answers as None.

Invariants: every SDK failure leaves as ``domain.errors`` (or ``SandboxNameTaken``) through
``translate_error``, the one mapping table; credentials are resolved only when connecting and
never appear in messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Final

from vk_provider.sdk import (
    AuthFailed,
    CapacityUnavailable,
    ConfigError,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider_adapters.modal.config import ModalProviderConfig
from vk_provider_adapters.modal.sandbox import (
    SandboxInfo,
    SandboxNameTaken,
    SandboxRequest,
    SandboxTunnel,
)

log = logging.getLogger(__name__)

MODAL_MISSING_MESSAGE: Final = (
    "the Modal provider needs the `modal` package, which is not installed: "
    "pip install 'vk-provider[modal]' (or: pip install 'modal>=1.4.3')"
)
# Without `follow`, reading ends when no new line has come for this long: a running sandbox's
# streams only end with the sandbox.
_IDLE_END_SECONDS: Final = 2.0
_DESCRIBE_CONCURRENCY: Final = 16
_STREAM_BUFFER_LINES: Final = 1024
_IMAGE_FIELD: Final = "spec.containers[0].image"


class ModalSdkMissing(ImportError):
    """The optional ``modal`` package is not installed."""


def load_modal() -> Any:
    """The ``modal`` module, or ``ModalSdkMissing`` saying how to install it."""
    try:
        return importlib.import_module("modal")
    except ImportError as exc:
        raise ModalSdkMissing(MODAL_MISSING_MESSAGE) from exc


# --- the one error mapping -------------------------------------------------------------------

_NOT_FOUND = frozenset({"NotFoundError"})
_NAME_TAKEN = frozenset({"AlreadyExistsError"})
# VersionError: the server refuses this SDK version; like bad credentials, it blocks the
# whole provider until someone acts.
_AUTH = frozenset({"AuthError", "PermissionDeniedError", "VersionError"})
_EXHAUSTED = frozenset({"ResourceExhaustedError"})
_IMAGE = frozenset({"ImageBuildError"})
_INVALID = frozenset(
    {
        "InvalidError",
        "ConflictError",
        "UnimplementedError",
        "RequestSizeError",
        "SerializationError",
    }
)
# Everything else of modal's ("Error" is their base) is a failure to talk to Modal or of Modal:
# ServiceError, InternalError, InternalFailure, ConnectionError, TimeoutError, RemoteError, ...
_RATE_WORDS = ("rate limit", "ratelimit", "too many requests", "rate-limit")
# Status names of a raw grpclib.GRPCError (older SDK paths can still leak one).
_GRPC_STATUS = {
    "NOT_FOUND": _NOT_FOUND,
    "ALREADY_EXISTS": _NAME_TAKEN,
    "UNAUTHENTICATED": _AUTH,
    "PERMISSION_DENIED": _AUTH,
    "RESOURCE_EXHAUSTED": _EXHAUSTED,
    "INVALID_ARGUMENT": _INVALID,
    "FAILED_PRECONDITION": _INVALID,
    "OUT_OF_RANGE": _INVALID,
    "UNIMPLEMENTED": _INVALID,
}


def _modal_class_name(error: BaseException) -> str | None:
    """The most specific ``modal`` exception class ``error`` is an instance of."""
    for cls in type(error).__mro__:
        if cls.__module__.split(".")[0] == "modal":
            return cls.__name__
    return None


def translate_error(error: BaseException, operation: str) -> ProviderError | SandboxNameTaken:
    """Map an SDK failure to our taxonomy; matched by class name so that it needs no import.

    | modal.exception / cause                          | raised as                      |
    |--------------------------------------------------|--------------------------------|
    | AlreadyExistsError                               | SandboxNameTaken               |
    | NotFoundError                                    | NotFound                       |
    | AuthError, PermissionDeniedError, VersionError   | AuthFailed                     |
    | ResourceExhaustedError saying "rate limit"       | RateLimited                    |
    | ResourceExhaustedError (quota, no capacity)      | CapacityUnavailable            |
    | ImageBuildError                                  | InvalidSpec (image)            |
    | InvalidError, ConflictError, UnimplementedError, | InvalidSpec                    |
    | RequestSizeError, SerializationError             |                                |
    | any other modal Error (ServiceError, Internal-,  | Transient                      |
    | Connection-, TimeoutError, RemoteError, ...)     |                                |
    | builtin TimeoutError / OSError, anything else    | Transient                      |
    """
    detail = str(error) or type(error).__name__
    message = f"modal {operation}: {detail}"
    kinds: frozenset[str] = frozenset()
    name = _modal_class_name(error)
    if name is not None:
        kinds = frozenset({name})
    elif type(error).__name__ == "GRPCError":
        status = getattr(error, "status", None)
        kinds = _GRPC_STATUS.get(getattr(status, "name", ""), frozenset())
    if kinds & _NAME_TAKEN:
        return SandboxNameTaken(message)
    if kinds & _NOT_FOUND:
        return NotFound(message)
    if kinds & _AUTH:
        return AuthFailed(message)
    if kinds & _EXHAUSTED:
        if any(word in detail.lower() for word in _RATE_WORDS):
            return RateLimited(message)
        return CapacityUnavailable(message)
    if kinds & _IMAGE:
        return InvalidSpec(message, field=_IMAGE_FIELD)
    if kinds & _INVALID:
        return InvalidSpec(message)
    return Transient(message)


@contextlib.contextmanager
def _translated(operation: str) -> Iterator[None]:
    """Let our own errors through; translate everything else, keeping it as the cause."""
    try:
        yield
    except (ProviderError, SandboxNameTaken):
        raise
    except Exception as exc:
        raise translate_error(exc, operation) from exc


# --- the client ------------------------------------------------------------------------------


class ModalSandboxClient:
    """The sandboxes of one Modal app (``config.app_name``), reached with the configured token."""

    def __init__(self, config: ModalProviderConfig) -> None:
        self._modal = load_modal()
        self._config = config
        self._connect_lock = asyncio.Lock()
        self._client: Any = None
        self._app: Any = None

    async def create_sandbox(self, request: SandboxRequest) -> str:
        with _translated("create"):
            client, app = await self._connect()
            modal = self._modal
            image = modal.Image.from_registry(request.image)
            if request.command:
                # Kubernetes: `command` replaces the image's ENTRYPOINT (args replace its CMD).
                image = image.entrypoint([])
            secrets = (
                [modal.Secret.from_dict(dict(request.secret_env))] if request.secret_env else []
            )
            sandbox = await modal.Sandbox.create.aio(
                *request.command,
                *request.args,
                app=app,
                name=request.name,
                tags=dict(request.tags),
                image=image,
                env=dict(request.env) or None,
                secrets=secrets,
                timeout=request.timeout_seconds,  # explicit: the SDK's default is 300 s
                gpu=request.gpu,
                cpu=request.cpu,
                memory=request.memory_mib,
                region=list(request.regions) or None,
                workdir=request.workdir,
                encrypted_ports=list(request.encrypted_ports),
                unencrypted_ports=list(request.unencrypted_ports),
                client=client,
            )
            sandbox_id = str(sandbox.object_id)
            await _detach(sandbox)
            return sandbox_id

    async def get(self, sandbox_id: str) -> SandboxInfo:
        sandbox = await self._from_id(sandbox_id)
        try:
            return await self._describe(sandbox)
        finally:
            await _detach(sandbox)

    async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
        with _translated("list"):
            client, app = await self._connect()
            found = [
                sandbox
                async for sandbox in self._modal.Sandbox.list.aio(
                    app_id=app.app_id, tags=dict(tags), client=client
                )
            ]
        limit = asyncio.Semaphore(_DESCRIBE_CONCURRENCY)

        async def describe(sandbox: Any) -> SandboxInfo | None:
            async with limit:
                try:
                    return await self._describe(sandbox)
                except NotFound:
                    return None  # ended between the list and the question
                finally:
                    await _detach(sandbox)

        described = await asyncio.gather(*(describe(sandbox) for sandbox in found))
        return [info for info in described if info is not None]

    async def from_name(self, name: str) -> SandboxInfo | None:
        try:
            with _translated("from_name"):
                client, _ = await self._connect()
                sandbox = await self._modal.Sandbox.from_name.aio(
                    self._config.app_name, name, client=client
                )
        except NotFound:
            return None
        try:
            info = await self._describe(sandbox)
        finally:
            await _detach(sandbox)
        return SandboxInfo(
            info.sandbox_id, info.tags, exit_code=info.exit_code, name=name, started=info.started
        )

    async def set_tags(self, sandbox_id: str, tags: Mapping[str, str]) -> None:
        sandbox = await self._from_id(sandbox_id)
        try:
            with _translated("set_tags"):
                await sandbox.set_tags.aio(dict(tags))
        finally:
            await _detach(sandbox)

    async def terminate(self, sandbox_id: str) -> None:
        sandbox = await self._from_id(sandbox_id)
        try:
            with _translated("terminate"):
                await sandbox.terminate.aio()
        finally:
            await _detach(sandbox)

    async def tunnels(
        self, sandbox_id: str, *, wait_seconds: int
    ) -> dict[int, SandboxTunnel] | None:
        sandbox = await self._from_id(sandbox_id)
        try:
            with _translated("tunnels"):
                try:
                    found = await sandbox.tunnels.aio(timeout=wait_seconds)
                except Exception as exc:
                    if _modal_class_name(exc) == "SandboxTimeoutError":
                        return None  # not set up yet: the sandbox has not started
                    raise
                return {
                    int(port): SandboxTunnel(
                        host=str(tunnel.host or ""),
                        port=int(tunnel.port or 0),
                        unencrypted_host=str(tunnel.unencrypted_host or ""),
                        unencrypted_port=int(tunnel.unencrypted_port or 0),
                    )
                    for port, tunnel in found.items()
                }
        finally:
            await _detach(sandbox)

    async def logs(self, sandbox_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        sandbox = await self._from_id(sandbox_id)
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue(_STREAM_BUFFER_LINES)
        with _translated("logs"):
            streams = [sandbox.stdout, sandbox.stderr]
        pumps = [asyncio.create_task(_pump(stream, queue)) for stream in streams]
        open_streams = len(pumps)
        try:
            while open_streams:
                try:
                    if follow:
                        item = await queue.get()
                    else:
                        item = await asyncio.wait_for(queue.get(), _IDLE_END_SECONDS)
                except TimeoutError:
                    return  # nothing new: the output so far has been read
                if item is None:
                    open_streams -= 1
                elif isinstance(item, BaseException):
                    raise translate_error(item, "logs") from item
                else:
                    yield item.encode("utf-8", errors="replace")
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await _detach(sandbox)

    async def close(self) -> None:
        client, self._client, self._app = self._client, None, None
        if client is None:
            return
        try:
            await client.__aexit__(None, None, None)
        except Exception as exc:  # closing is best effort
            log.debug("closing the Modal client failed: %s", type(exc).__name__)

    # --- internals ---

    async def _connect(self) -> tuple[Any, Any]:
        """The SDK client and the app, made once (concurrent first calls share them)."""
        async with self._connect_lock:
            if self._client is None:
                try:
                    token_id = self._config.token_id.resolve()
                    token_secret = self._config.token_secret.resolve()
                except ConfigError as exc:  # its message names the reference, not the value
                    raise AuthFailed(str(exc)) from None
                client = await self._modal.Client.from_credentials.aio(token_id, token_secret)
                app = await self._modal.App.lookup.aio(
                    self._config.app_name, create_if_missing=True, client=client
                )
                self._client, self._app = client, app
        return self._client, self._app

    async def _from_id(self, sandbox_id: str) -> Any:
        try:
            with _translated("get"):
                client, _ = await self._connect()
                return await self._modal.Sandbox.from_id.aio(sandbox_id, client=client)
        except InvalidSpec as exc:  # a malformed id names no sandbox
            raise NotFound(f"no sandbox {sandbox_id!r}") from exc

    async def _describe(self, sandbox: Any) -> SandboxInfo:
        with _translated("get"):
            tags = await sandbox.get_tags.aio()
            return SandboxInfo(
                sandbox_id=str(sandbox.object_id),
                tags=dict(tags),
                exit_code=sandbox.returncode,
            )


async def _pump(stream: Any, queue: asyncio.Queue[str | BaseException | None]) -> None:
    """Copy one output stream into ``queue``, then its failure if any, then ``None``.

    Cancellation (the reader stopped) propagates without a final put, which could block on a
    full queue nobody reads any more.
    """
    try:
        async for line in stream:
            await queue.put(str(line))
    except Exception as exc:
        await queue.put(exc)
    await queue.put(None)


async def _detach(sandbox: Any) -> None:
    """Release the SDK's connection state of a handle we are done with (SDK >= 1.3.4)."""
    detach = getattr(sandbox, "detach", None)
    if detach is None:
        return
    try:
        await detach.aio()
    except Exception as exc:  # best effort: the sandbox itself is unaffected
        log.debug("detaching a sandbox handle failed: %s", type(exc).__name__)
