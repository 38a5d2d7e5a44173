"""The server kit: run any in-process ``Provider`` as its own process over gRPC.

``serve(provider, address)`` serves ``proto/vkprovider/v1/provider.proto`` for ``provider`` on
a Unix socket (``unix:///path.sock``) or TCP (``host:port``, with ``ServerTLS``) until it is
cancelled, then stops with a grace period. ``on_listening`` is told the address actually
bound (a TCP port 0 becomes the port chosen). `vk-provider plugin serve` wraps it for every
registered provider type; a third-party adapter calls it from its own ``main``.

Whoever can call a plugin spends its cloud account, so it serves authenticated callers only
(``exposure()`` says what would be exposed otherwise, docs/reference.md "Plugin protocol"):
- TCP: mutual TLS, ``ServerTLS`` with ``client_ca_file`` (a caller without a certificate
  that CA signed is refused in the handshake);
- a Unix socket: its file is created with mode 0600 (bound under umask 0o177, so there is no
  moment with a wider mode), owned by this user; its directory must be owned by this user or
  root and writable by neither group nor others (so nobody else can replace the socket).
  Ancestors of the directory are not checked.
Anything else (plain TCP on loopback, TLS without a client CA, a socket in a directory others
may write) raises ``InsecureServe`` before anything is bound, unless ``insecure=True``, which
is logged as a WARNING naming what is exposed. Plain TCP on a host that is not loopback is
refused even then (the workloads' secret values would cross the network in clear).

Invariants: every call ends in a response or in a status that carries the error taxonomy
(``status.to_status``); an exception that is not a ``ProviderError`` is logged here and sent
as ``Transient`` without its text (it may hold anything). A log stream closes the adapter's
iterator when the caller goes away. The kit never closes the provider: its caller owns it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, TypeVar

import grpc

from vk_provider.sdk import (
    InvalidSpec,
    Provider,
    ProviderError,
    SupportsContainerRestart,
    SupportsUsage,
    Transient,
)
from vk_provider_adapters.plugin import rpc, wire, wire_workload
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.address import PluginAddress, parse_address
from vk_provider_adapters.plugin.status import to_status

log = logging.getLogger(__name__)
T = TypeVar("T")
GRACE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """The server's certificate and key (PEM files), and the CA whose client certificates it
    requires (mutual TLS). Without ``client_ca_file`` no caller is authenticated: ``serve()``
    refuses that unless ``insecure``."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        client_ca = self.client_ca_file.read_bytes() if self.client_ca_file else None
        return grpc.ssl_server_credentials(
            [(self.key_file.read_bytes(), self.cert_file.read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


# --------------------------------------------------------------------------- who may call

_SPENDS = "can create instances billed to the provider's account, delete them and read their logs"


@dataclass(frozen=True, slots=True)
class Exposure:
    """Why the callers at an address would not be authenticated, and what that allows."""

    kind: Literal["plaintext", "no-client-ca", "socket-directory"]
    problem: str  # "plain TCP authenticates no caller"
    consequence: str  # "every local user and process can create instances ..."


class InsecureServe(ValueError):
    """``serve()`` was asked to accept callers it cannot authenticate, without ``insecure``."""

    def __init__(self, where: PluginAddress, exposure: Exposure) -> None:
        advice = {
            "plaintext": "give tls=ServerTLS(..., client_ca_file=...) or a unix:// address",
            "no-client-ca": "give ServerTLS.client_ca_file (mutual TLS)",
            "socket-directory": "put the socket in a directory of this user that neither "
            "group nor others may write (mode 0700)",
        }[exposure.kind]
        super().__init__(
            f"{where}: {exposure.problem} ({exposure.consequence}): {advice}, or pass "
            "insecure=True to serve anyway"
        )
        self.exposure = exposure


def socket_directory_problem(socket: Path) -> str | None:
    """What lets another user replace ``socket`` (its directory's owner or mode), or None.

    The directory (symlinks followed) must be owned by this process's effective user or by
    root, and writable by neither its group nor others; a sticky bit does not make it safe.
    Raises ``ValueError`` when the directory does not exist, is not one or cannot be examined.
    """
    directory = socket.parent
    try:
        info = directory.stat()
    except FileNotFoundError:
        raise ValueError(f"{directory}: the socket's directory does not exist") from None
    except OSError as exc:
        raise ValueError(f"{directory}: cannot examine the socket's directory ({exc})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{directory}: the socket's directory is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        return (
            f"its directory {directory} is owned by uid {info.st_uid}, neither this user "
            f"(uid {me}) nor root"
        )
    writers = [who for who, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit]
    if writers:
        return f"its directory {directory} is writable by {' and '.join(writers)} ({mode:#o})"
    return None


def exposure(where: PluginAddress, tls: ServerTLS | None) -> Exposure | None:
    """Who could call at ``where`` without authenticating; None when only authenticated
    callers can (mutual TLS, or a Unix socket in a safe directory).

    Raises ``ValueError`` for what no option allows: TLS on a Unix socket, a socket
    directory that does not exist, plain TCP on a host that is not loopback.
    """
    if where.unix_path is not None:
        if tls is not None:
            raise ValueError("TLS is for TCP; a Unix socket is guarded by its file permissions")
        problem = socket_directory_problem(where.unix_path)
        if problem is None:
            return None
        replaced = (
            "another local user could replace the socket with their own and receive the "
            "agent's calls, the workloads' secret values with them"
        )
        return Exposure("socket-directory", problem, replaced)
    who = "every local user and process" if where.loopback else "anyone who can reach the port"
    if tls is None:
        if not where.loopback:
            raise ValueError(
                f"{where} is reachable from other hosts: plain TCP would carry the workloads' "
                "secret values in clear; give TLS"
            )
        return Exposure("plaintext", "plain TCP authenticates no caller", f"{who} {_SPENDS}")
    if tls.client_ca_file is None:
        problem = "TLS without a client CA authenticates no caller"
        return Exposure("no-client-ca", problem, f"{who} {_SPENDS}")
    return None


class _Servicer:
    """One provider behind the service; each method is one RPC."""

    def __init__(self, provider: Provider) -> None:
        self._provider = provider
        self._restart = isinstance(provider, SupportsContainerRestart)

    async def _run(self, context: grpc.aio.ServicerContext[Any, Any], work: Awaitable[T]) -> T:
        try:
            return await work
        except StopAsyncIteration:
            raise  # the end of a log stream, not a failure
        except ProviderError as exc:
            await _abort(context, exc)
        except wire.WireError as exc:
            await _abort(context, InvalidSpec(str(exc), field=exc.field))
        except Exception:
            log.exception("provider %s failed unexpectedly", self._provider.name)
            await _abort(context, Transient(f"provider {self._provider.name} failed unexpectedly"))

    async def describe(self, _request: pb.DescribeRequest, _context: Any) -> pb.DescribeResponse:
        provider = self._provider
        capabilities = wire.capabilities_to_pb(
            provider.capabilities, restart_container=self._restart
        )
        return pb.DescribeResponse(name=provider.name, capabilities=capabilities)

    async def offers(self, _request: pb.OffersRequest, context: Any) -> pb.OffersResponse:
        found = await self._run(context, self._provider.offers())
        return pb.OffersResponse(offers=[wire.offer_to_pb(o) for o in found])

    async def create(self, request: pb.CreateRequest, context: Any) -> pb.Instance:
        async def work() -> pb.Instance:
            spec = wire_workload.spec_from_pb(request.spec)
            offer = wire.offer_from_pb(request.offer)
            return wire.instance_to_pb(await self._provider.create(spec, offer))

        return await self._run(context, work())

    async def get(self, request: pb.GetRequest, context: Any) -> pb.Instance:
        got = await self._run(context, self._provider.get(request.instance_id))
        return wire.instance_to_pb(got)

    async def delete(self, request: pb.DeleteRequest, context: Any) -> pb.DeleteResponse:
        work = self._provider.delete(request.instance_id, grace_seconds=request.grace_seconds)
        await self._run(context, work)
        return pb.DeleteResponse()

    async def list_ours(self, _request: pb.ListOursRequest, context: Any) -> pb.ListOursResponse:
        found = await self._run(context, self._provider.list_ours())
        return pb.ListOursResponse(instances=[wire.instance_to_pb(i) for i in found])

    async def logs(self, request: pb.LogsRequest, context: Any) -> AsyncIterator[pb.LogChunk]:
        options = wire.log_options_from_pb(request)
        chunks = self._provider.logs(request.instance_id, options)
        try:
            while True:
                try:
                    chunk = await self._run(context, anext(chunks))
                except StopAsyncIteration:
                    return
                yield pb.LogChunk(data=chunk)
        finally:
            # The caller went away (or the stream ended): stop the adapter's reader too.
            closing = getattr(chunks, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()

    async def usage(self, request: pb.UsageRequest, context: Any) -> pb.UsageResponse:
        provider = self._provider
        if not isinstance(provider, SupportsUsage) or not provider.capabilities.usage:
            await _abort(context, InvalidSpec(f"provider {provider.name} does not report usage"))
        return wire.usage_to_pb(await self._run(context, provider.usage(request.instance_id)))

    async def restart_container(
        self, request: pb.RestartContainerRequest, context: Any
    ) -> pb.RestartContainerResponse:
        provider = self._provider
        if not isinstance(provider, SupportsContainerRestart):
            await _abort(
                context, InvalidSpec(f"provider {provider.name} cannot restart a container")
            )
        await self._run(context, provider.restart_container(request.instance_id, request.container))
        return pb.RestartContainerResponse()


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: ProviderError) -> NoReturn:
    code, message, trailers = to_status(error)
    await context.abort(code, message, trailing_metadata=trailers)


def _handlers(servicer: _Servicer) -> grpc.GenericRpcHandler:
    def unary(
        behaviour: Callable[..., Any], request: Callable[[bytes], Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=request, response_serializer=_serialize
        )

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Describe": unary(servicer.describe, pb.DescribeRequest.FromString),
        "Offers": unary(servicer.offers, pb.OffersRequest.FromString),
        "Create": unary(servicer.create, pb.CreateRequest.FromString),
        "Get": unary(servicer.get, pb.GetRequest.FromString),
        "Delete": unary(servicer.delete, pb.DeleteRequest.FromString),
        "ListOurs": unary(servicer.list_ours, pb.ListOursRequest.FromString),
        "Logs": grpc.unary_stream_rpc_method_handler(
            servicer.logs,
            request_deserializer=pb.LogsRequest.FromString,
            response_serializer=_serialize,
        ),
        "Usage": unary(servicer.usage, pb.UsageRequest.FromString),
        "RestartContainer": unary(
            servicer.restart_container, pb.RestartContainerRequest.FromString
        ),
    }
    assert set(handlers) == rpc.METHODS, "every RPC of the proto is served"
    return grpc.method_handlers_generic_handler(rpc.SERVICE, handlers)


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def _bind_unix(server: grpc.aio.Server, path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()  # a stale socket of a previous run
    # grpc creates the socket file here: under this umask it is 0600 from its first moment
    # (a chmod afterwards would leave a window). The umask is the process's: restored at once.
    previous = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix://{path}")
    finally:
        os.umask(previous)
    info = path.lstat()
    if (
        not stat.S_ISSOCK(info.st_mode)
        or info.st_uid != os.geteuid()
        or stat.S_IMODE(info.st_mode) & 0o077
    ):
        raise RuntimeError(f"{path}: the socket bound is not this user's with mode 0600")


def _bind(server: grpc.aio.Server, where: PluginAddress, tls: ServerTLS | None) -> PluginAddress:
    if where.unix_path is not None:
        _bind_unix(server, where.unix_path)
        return where
    port = (
        server.add_secure_port(where.target, tls.credentials())
        if tls is not None
        else server.add_insecure_port(where.target)
    )
    if port == 0:
        raise OSError(f"cannot listen on {where.target}")
    return PluginAddress(host=where.host, port=port)


async def serve(
    provider: Provider,
    address: str,
    *,
    tls: ServerTLS | None = None,
    insecure: bool = False,
    on_listening: Callable[[PluginAddress], None] | None = None,
) -> None:
    """Serve ``provider`` at ``address`` until cancelled (then stop within ``GRACE_SECONDS``).

    Raises ``InsecureServe`` before binding anything when callers would not be authenticated
    (``exposure()``), unless ``insecure``: then it serves and logs a WARNING saying so.
    """
    where = parse_address(address, server=True)
    exposed = exposure(where, tls)
    if exposed is not None and not insecure:
        raise InsecureServe(where, exposed)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((_handlers(_Servicer(provider)),))
    bound = _bind(server, where, tls)
    await server.start()
    try:
        if exposed is None:
            log.info("serving provider %s at %s", provider.name, bound)
        else:
            log.warning(
                "serving provider %s at %s WITHOUT CLIENT AUTHENTICATION (insecure): %s; %s",
                provider.name,
                bound,
                exposed.problem,
                exposed.consequence,
            )
        if on_listening is not None:
            on_listening(bound)
        await server.wait_for_termination()
    finally:
        await server.stop(GRACE_SECONDS)
