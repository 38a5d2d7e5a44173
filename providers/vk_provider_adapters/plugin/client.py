"""The agent's side of the plugin protocol: a ``Provider`` that calls a plugin over gRPC.

``GrpcProvider`` implements the contract by calling ``proto/vkprovider/v1/provider.proto`` at
the configured address: a Unix socket, or TCP with TLS that checks the plugin's certificate
against ``tls.ca_file`` (and its name) and presents ours when given (the mutual TLS that
`vk-provider plugin serve` requires); plain TCP only to loopback with
``allow_insecure_loopback`` (``config``).
``start()`` waits for the plugin and reads its capabilities once (``Describe``); every other
call has the configured deadline, except a followed log stream, which lasts until the plugin
ends it or the reader stops.

Invariants:
- Only ``ProviderError`` escapes: a status with a detail becomes the same class the plugin
  raised; a plugin that died, is unreachable or timed out is ``Transient``; an answer this
  agent cannot read (``wire.WireError``) is ``Transient`` naming the field. So the agent's
  breaker and its pods treat a dead plugin exactly as a provider outage. That includes a
  number out of range (a NaN or negative price, a negative count: ``wire``): the whole answer
  is refused, so it never reaches placement or the ledger.
- Calls fail fast while the plugin is down (no ``wait_for_ready``) and the channel reconnects
  on its own with a short back-off, so calls succeed again soon after the plugin is back.
- Offers and instances (their ``provider`` and ``offer_key``) carry this provider's configured
  name, whatever the plugin calls itself; a create sends the plugin its own name back. Exec
  and port-forward are never offered (they are not on the wire).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import grpc

from vk_provider.sdk import (
    Capabilities,
    ContainerUsage,
    Instance,
    InvalidSpec,
    LogOptions,
    Offer,
    ProviderError,
    Transient,
    WorkloadSpec,
)
from vk_provider_adapters.plugin import rpc, wire, wire_workload
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.config import GrpcProviderConfig
from vk_provider_adapters.plugin.status import from_rpc_error

log = logging.getLogger(__name__)
T = TypeVar("T")

# Reconnect quickly after the plugin comes back (gRPC's default grows to two minutes).
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 20000),
)


def _read(path: Path, field: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{field}: cannot read {path} ({exc.strerror})") from exc


class GrpcProvider:
    """A provider served by another process (``vk-provider plugin serve`` or any other
    implementation of the protocol)."""

    def __init__(self, settings: GrpcProviderConfig) -> None:
        self._settings = settings
        self._address = settings.parsed_address
        self._credentials: grpc.ChannelCredentials | None = None
        self._options: list[tuple[str, int | str]] = list(_CHANNEL_OPTIONS)
        tls = settings.tls
        if tls is not None:  # read now: check-config names an unreadable file by its field
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca_file, "tls.ca_file"),
                private_key=_read(tls.key_file, "tls.key_file") if tls.key_file else None,
                certificate_chain=_read(tls.cert_file, "tls.cert_file") if tls.cert_file else None,
            )
            if tls.server_name:
                self._options.append(("grpc.ssl_target_name_override", tls.server_name))
        self._channel: grpc.aio.Channel | None = None
        self._capabilities = Capabilities()
        self._restart_container = False
        self.plugin_name = ""  # what the plugin calls itself (Describe), for logs

    # ------------------------------------------------------------------ plumbing

    def _open(self) -> grpc.aio.Channel:
        # Made on first use: a grpc.aio channel belongs to the running event loop.
        if self._channel is None:
            target = self._address.target
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(target, options=self._options)
            else:
                self._channel = grpc.aio.secure_channel(
                    target, self._credentials, options=self._options
                )
        return self._channel

    def _error(self, exc: Exception) -> ProviderError:
        if isinstance(exc, grpc.aio.AioRpcError):
            return from_rpc_error(exc, provider=self.name, address=str(self._address))
        if isinstance(exc, wire.WireError):
            return Transient(
                f"plugin at {self._address} answered what this agent cannot read: {exc}",
                provider=self.name,
            )
        return Transient(f"plugin at {self._address}: {type(exc).__name__}", provider=self.name)

    async def _call(
        self,
        method: str,
        request: object,
        response: Callable[[bytes], T],
    ) -> T:
        callable_ = self._open().unary_unary(
            rpc.path(method),
            request_serializer=_serialize,
            response_deserializer=response,
        )
        try:
            return await callable_(request, timeout=self._settings.timeout_seconds)
        except grpc.aio.AioRpcError as exc:
            error = self._error(exc)
        # Raised outside the handler: the domain error keeps no reference to gRPC's call
        # objects (its message has the code and details), which outlive their event loop.
        raise error

    # ------------------------------------------------------------------ the contract

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def capabilities(self) -> Capabilities:
        """What the plugin said at ``start()``; before it, nothing optional."""
        return self._capabilities

    async def start(self) -> None:
        """Wait up to ``connect_timeout_seconds`` for the plugin, then read its capabilities."""
        deadline = self._settings.connect_timeout_seconds
        channel = self._open()
        try:
            await asyncio.wait_for(channel.channel_ready(), timeout=deadline)
        except TimeoutError:
            raise Transient(
                f"plugin at {self._address} did not answer within {deadline:g} s "
                "(connect_timeout_seconds)",
                provider=self.name,
            ) from None
        described = await self._call(
            "Describe", pb.DescribeRequest(), pb.DescribeResponse.FromString
        )
        try:
            self._capabilities = wire.capabilities_from_pb(described.capabilities)
        except wire.WireError as exc:
            raise self._error(exc) from exc
        self._restart_container = described.capabilities.restart_container
        self.plugin_name = described.name
        log.info(
            "provider %s: plugin %r at %s, capabilities %s",
            self.name,
            described.name,
            self._address,
            self._capabilities,
        )

    async def offers(self) -> list[Offer]:
        got = await self._call("Offers", pb.OffersRequest(), pb.OffersResponse.FromString)
        try:
            decoded = [wire.offer_from_pb(o, f"offers[{i}]") for i, o in enumerate(got.offers)]
        except wire.WireError as exc:  # a NaN price, say: no offer of this answer is used
            raise self._error(exc) from exc
        # Offers are the agent's by this provider's configured name (placement, ledger,
        # annotations); the plugin gets its own name back with a create.
        return [replace(o, provider=self.name) for o in decoded]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        theirs = replace(offer, provider=self.plugin_name or offer.provider)
        request = pb.CreateRequest(
            spec=wire_workload.spec_to_pb(spec), offer=wire.offer_to_pb(theirs)
        )
        got = await self._call("Create", request, pb.Instance.FromString)
        return self._instance(got)

    async def get(self, instance_id: str) -> Instance:
        got = await self._call(
            "Get", pb.GetRequest(instance_id=instance_id), pb.Instance.FromString
        )
        return self._instance(got)

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        request = pb.DeleteRequest(instance_id=instance_id, grace_seconds=grace_seconds)
        await self._call("Delete", request, pb.DeleteResponse.FromString)

    async def list_ours(self) -> list[Instance]:
        got = await self._call("ListOurs", pb.ListOursRequest(), pb.ListOursResponse.FromString)
        return [self._instance(i) for i in got.instances]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        stream = self._open().unary_stream(
            rpc.path("Logs"),
            request_serializer=_serialize,
            response_deserializer=pb.LogChunk.FromString,
        )
        # A followed stream lasts as long as the container writes; a plain read is one call.
        timeout = None if options.follow else self._settings.timeout_seconds
        call = stream(wire.log_request_to_pb(instance_id, options), timeout=timeout)
        failed: ProviderError | None = None
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as exc:
            failed = self._error(exc)
        finally:
            call.cancel()  # the reader stopped early: end the stream at the plugin too
        if failed is not None:
            raise failed

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        if not self._capabilities.usage:
            raise InvalidSpec(f"provider {self.name} does not report usage", provider=self.name)
        got = await self._call(
            "Usage", pb.UsageRequest(instance_id=instance_id), pb.UsageResponse.FromString
        )
        try:
            return wire.usage_from_pb(got)
        except wire.WireError as exc:
            raise self._error(exc) from exc

    async def restart_container(self, instance_id: str, container: str) -> None:
        if not self._restart_container:
            raise InvalidSpec(
                f"provider {self.name} cannot restart a container", provider=self.name
            )
        request = pb.RestartContainerRequest(instance_id=instance_id, container=container)
        await self._call("RestartContainer", request, pb.RestartContainerResponse.FromString)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _instance(self, message: pb.Instance) -> Instance:
        try:
            instance = wire.instance_from_pb(message, provider=self.name)
        except wire.WireError as exc:
            raise self._error(exc) from exc
        theirs = f"{self.plugin_name}/"
        if self.plugin_name and instance.offer_key.startswith(theirs):
            ours = f"{self.name}/{instance.offer_key.removeprefix(theirs)}"
            instance = replace(instance, offer_key=ours)
        return instance


def _serialize(message: object) -> bytes:
    serialize = getattr(message, "SerializeToString", None)
    assert serialize is not None, type(message)
    data: bytes = serialize()
    return data
