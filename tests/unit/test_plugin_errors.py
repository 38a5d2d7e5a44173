"""The error taxonomy across the wire, both ways: a plugin's error reaches the agent as the
same class (with ``retry_after`` and ``field``); a garbled detail, a missing one or a plugin
that crashes in a call is ``Transient`` naming what is wrong. Real gRPC on a Unix socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc.status_pb2 import Status

from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import Capabilities, Instance, LogOptions, Offer, WorkloadSpec
from vk_provider_adapters.plugin import rpc, status
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig
from vk_provider_adapters.plugin.server import serve


class Failing:
    """A provider whose every call raises ``error`` (or returns nothing)."""

    name = "plugin-side"
    capabilities = Capabilities(follow_logs=True)

    def __init__(self) -> None:
        self.error: BaseException | None = None

    async def _maybe(self) -> None:
        if self.error is not None:
            raise self.error

    async def offers(self) -> list[Offer]:
        await self._maybe()
        return []

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        await self._maybe()
        raise AssertionError("unused")

    async def get(self, instance_id: str) -> Instance:
        await self._maybe()
        raise NotFound(instance_id)

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        await self._maybe()

    async def list_ours(self) -> list[Instance]:
        await self._maybe()
        return []

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        yield b"first line\n"
        await self._maybe()

    async def close(self) -> None:
        return None


def _client(socket: Path) -> GrpcProvider:
    return GrpcProvider(
        GrpcProviderConfig.model_validate(
            {"type": "grpc", "name": "agent-side", "address": f"unix://{socket}"}
        )
    )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[Failing, GrpcProvider]]:
    provider = Failing()
    socket = tmp_path / "p.sock"
    listening = asyncio.Event()
    task = asyncio.create_task(
        serve(provider, f"unix://{socket}", on_listening=lambda _: listening.set())
    )
    await asyncio.wait_for(listening.wait(), 30)
    client = _client(socket)
    await client.start()
    try:
        yield provider, client
    finally:
        await client.close()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(
    "error",
    [
        NotFound("no such instance"),
        CapacityUnavailable("sold out"),
        RateLimited("slow down", retry_after=2.5),
        RateLimited("slow down, no hint"),
        Transient("503 from upstream"),
        InvalidSpec("cannot run that image", field="spec.containers[0].image"),
        AuthFailed("billing refused"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_each_error_crosses_the_wire_as_itself(
    served: tuple[Failing, GrpcProvider], error: ProviderError
) -> None:
    provider, client = served
    provider.error = error
    with pytest.raises(ProviderError) as raised:
        await client.offers()
    got = raised.value
    assert type(got) is type(error)
    assert str(got) == str(error)
    assert got.provider == "agent-side"  # the agent's name for the provider, not the plugin's
    if isinstance(error, RateLimited):
        assert isinstance(got, RateLimited) and got.retry_after == error.retry_after
    if isinstance(error, InvalidSpec):
        assert isinstance(got, InvalidSpec) and got.field == error.field


async def test_an_unexpected_exception_is_transient_without_its_text(
    served: tuple[Failing, GrpcProvider],
) -> None:
    provider, client = served
    provider.error = KeyError("api_key=hunter2")
    with pytest.raises(Transient) as raised:
        await client.list_ours()
    assert "hunter2" not in str(raised.value)
    assert "failed unexpectedly" in str(raised.value)


async def test_an_error_in_the_middle_of_a_log_stream_arrives_after_the_lines(
    served: tuple[Failing, GrpcProvider],
) -> None:
    provider, client = served
    provider.error = NotFound("gone while reading")
    got = []
    with pytest.raises(NotFound, match="gone while reading"):
        async for chunk in client.logs("i", LogOptions(follow=True)):
            got.append(chunk)
    assert got == [b"first line\n"]


def test_the_server_side_mapping_uses_the_documented_codes() -> None:
    code, message, trailers = status.to_status(CapacityUnavailable("sold out"))
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and message == "sold out"
    [(key, raw)] = trailers
    assert key == "grpc-status-details-bin"
    parsed = Status.FromString(raw)
    assert parsed.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    detail = pb.ProviderErrorDetail()
    assert parsed.details[0].Unpack(detail)
    assert detail.kind == pb.ProviderErrorDetail.CAPACITY_UNAVAILABLE
    assert status.to_status(Transient("x"))[0] is grpc.StatusCode.UNAVAILABLE
    assert status.to_status(ProviderError("x"))[0] is grpc.StatusCode.UNAVAILABLE


def test_a_detail_of_an_unknown_kind_or_a_nonsense_retry_after_is_handled() -> None:
    unknown = pb.ProviderErrorDetail(kind=42, message="new in v2")  # type: ignore[arg-type]
    got = status.from_detail(unknown, provider="p")
    assert isinstance(got, Transient) and "ProviderErrorDetail.kind 42" in str(got)
    nonsense = pb.ProviderErrorDetail(
        kind=pb.ProviderErrorDetail.RATE_LIMITED, retry_after_seconds=-5
    )
    limited = status.from_detail(nonsense, provider="p")
    assert isinstance(limited, RateLimited) and limited.retry_after is None


# ----------------------------------------------------------------------- garbled trailers

Abort = Callable[[Any], Awaitable[None]]


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


GARBLED: dict[str, tuple[grpc.StatusCode, tuple[tuple[str, Any], ...], str]] = {
    "not-a-status": (
        grpc.StatusCode.NOT_FOUND,
        (("grpc-status-details-bin", b"\xff\xfe garbage"),),
        "grpc-status-details-bin: not a google.rpc.Status",
    ),
    "status-without-our-detail": (
        grpc.StatusCode.NOT_FOUND,
        (
            (
                "grpc-status-details-bin",
                Status(code=5, details=[_packed(pb.Offer(sku="x"))]).SerializeToString(),
            ),
        ),
        "no vkprovider.v1.ProviderErrorDetail in it",
    ),
    "detail-that-does-not-decode": (
        grpc.StatusCode.NOT_FOUND,
        (
            (
                "grpc-status-details-bin",
                Status(
                    code=5,
                    details=[
                        any_pb2.Any(
                            type_url="type.googleapis.com/vkprovider.v1.ProviderErrorDetail",
                            value=b"\xff\xff\xff",
                        )
                    ],
                ).SerializeToString(),
            ),
        ),
        "vkprovider.v1.ProviderErrorDetail does not decode",
    ),
    "no-detail-at-all": (grpc.StatusCode.NOT_FOUND, (), "NOT_FOUND: bare"),
    "internal": (grpc.StatusCode.INTERNAL, (), "INTERNAL: bare"),
}


@pytest.mark.parametrize("case", list(GARBLED))
async def test_a_garbled_or_missing_detail_is_transient_naming_what_is_wrong(
    tmp_path: Path, case: str
) -> None:
    code, trailers, expected = GARBLED[case]

    async def get(_request: pb.GetRequest, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, "bare", trailing_metadata=trailers)

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        get, request_deserializer=pb.GetRequest.FromString
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(rpc.SERVICE, {"Get": handler}),)
    )
    socket = tmp_path / "raw.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    client = _client(socket)
    try:
        with pytest.raises(Transient) as raised:
            await client.get("i-1")
        assert expected in str(raised.value)
        assert raised.value.provider == "agent-side"
    finally:
        await client.close()
        await server.stop(0)


async def test_a_plugin_that_is_not_there_is_transient(tmp_path: Path) -> None:
    client = _client(tmp_path / "nobody.sock")
    try:
        with pytest.raises(Transient, match="UNAVAILABLE"):
            await client.offers()
    finally:
        await client.close()
