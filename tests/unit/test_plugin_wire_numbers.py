"""Every number a plugin answers is checked when the agent decodes it: a NaN, an infinity, a
negative or an absurd value of a price, a count, a size or a duration is a ``WireError`` naming
the field, which the client reports as ``Transient`` (a provider error): it never reaches
placement or the ledger (a NaN price would pass every budget cap: ``nan > cap`` is False)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.unit.controller_harness import Core, pod_manifest
from vk_provider.domain.errors import Transient
from vk_provider.domain.models import Offer
from vk_provider_adapters.plugin import rpc, wire
from vk_provider_adapters.plugin._gen.vkprovider.v1 import provider_pb2 as pb
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig

GOOD = Offer("p", "h100", "us", "H100", 8, 80, 96, 1024, 20.5, available=3, startup_seconds=60)
NAN, INF = math.nan, math.inf
BAD_AMOUNTS = {"nan": NAN, "inf": INF, "-inf": -INF, "negative": -0.5, "absurd": 1e300}
BAD_COUNTS = {"negative": -1, "absurd": 2**31 - 1}
OFFER_AMOUNTS = ("gpu_memory_gib", "vcpus", "memory_gib", "price_per_hour", "startup_seconds")
OFFER_COUNTS = ("gpu_count", "available")


def _offer(**changes: Any) -> pb.Offer:
    message = wire.offer_to_pb(GOOD)
    for name, value in changes.items():
        setattr(message, name, value)
    return message


def _cases(fields: tuple[str, ...], values: dict[str, Any]) -> list[Any]:
    return [pytest.param(f, v, id=f"{f}-{k}") for f in fields for k, v in values.items()]


@pytest.mark.parametrize(
    ("field", "value"), _cases(OFFER_AMOUNTS, BAD_AMOUNTS) + _cases(OFFER_COUNTS, BAD_COUNTS)
)
def test_an_offer_with_a_number_out_of_range_names_the_field(field: str, value: Any) -> None:
    with pytest.raises(wire.WireError) as raised:
        wire.offer_from_pb(_offer(**{field: value}))
    assert raised.value.field == f"offer.{field}"
    with pytest.raises(wire.WireError) as raised:
        wire.offer_from_pb(_offer(**{field: value}), where="offers[3]")
    assert raised.value.field == f"offers[3].{field}"


def test_the_edges_of_every_offer_number_are_accepted() -> None:
    zero = {name: 0 for name in (*OFFER_AMOUNTS, *OFFER_COUNTS)}
    assert wire.offer_from_pb(_offer(**zero)).price_per_hour == 0
    most = {
        "gpu_count": wire.MAX_GPUS,
        "available": wire.MAX_AVAILABLE,
        "gpu_memory_gib": wire.MAX_GIB,
        "memory_gib": wire.MAX_GIB,
        "vcpus": wire.MAX_VCPUS,
        "price_per_hour": wire.MAX_PRICE_PER_HOUR,
        "startup_seconds": wire.MAX_STARTUP_SECONDS,
    }
    decoded = wire.offer_from_pb(_offer(**most))
    assert decoded.price_per_hour == wire.MAX_PRICE_PER_HOUR and decoded.gpu_count == 1024
    assert wire.offer_from_pb(wire.offer_to_pb(GOOD)) == GOOD


def _instance(**changes: Any) -> pb.Instance:
    message = pb.Instance(
        instance_id="i-1",
        state=pb.Instance.RUNNING,
        attempt=1,
        price_per_hour=1.5,
        containers=[pb.ContainerStatus(name="app", state=pb.ContainerStatus.RUNNING)],
        init_containers=[pb.ContainerStatus(name="init", state=pb.ContainerStatus.TERMINATED)],
    )
    for name, value in changes.items():
        setattr(message, name, value)
    return message


@pytest.mark.parametrize(("label", "value"), list(BAD_AMOUNTS.items()))
def test_an_instance_price_out_of_range_names_the_field(label: str, value: float) -> None:
    with pytest.raises(wire.WireError) as raised:
        wire.instance_from_pb(_instance(price_per_hour=value), provider="p")
    assert raised.value.field == "instance.price_per_hour"
    assert label != "nan" or "nan" in str(raised.value)


def _far_future(message: Any, field: str) -> None:
    getattr(message, field).seconds = 2**62  # past year 9999: no datetime holds it


def _bad_nanos(message: Any, field: str) -> None:
    getattr(message, field).nanos = -5


@pytest.mark.parametrize(
    ("break_it", "field"),
    [
        (lambda m: setattr(m, "attempt", -1), "instance.attempt"),
        (
            lambda m: setattr(m.containers[0], "restart_count", -1),
            "instance.containers[0].restart_count",
        ),
        (
            lambda m: setattr(m.init_containers[0], "restart_count", -3),
            "instance.init_containers[0].restart_count",
        ),
        (lambda m: _far_future(m, "started_at"), "instance.started_at"),
        (lambda m: _bad_nanos(m, "finished_at"), "instance.finished_at"),
        (
            lambda m: _far_future(m.containers[0], "started_at"),
            "instance.containers[0].started_at",
        ),
        (
            lambda m: _far_future(m.containers[0].last_termination, "finished_at"),
            "instance.containers[0].last_termination.finished_at",
        ),
    ],
)
def test_other_instance_numbers_out_of_range_name_the_field(
    break_it: Callable[[pb.Instance], None], field: str
) -> None:
    message = _instance()
    break_it(message)
    with pytest.raises(wire.WireError) as raised:
        wire.instance_from_pb(message, provider="p")
    assert raised.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"cpu_core_nanoseconds": -1}, "usage.containers[0].cpu_core_nanoseconds"),
        ({"memory_working_set_bytes": -1}, "usage.containers[0].memory_working_set_bytes"),
    ],
)
def test_negative_usage_names_the_field(changes: dict[str, int], field: str) -> None:
    usage = pb.ContainerUsage(name="c", **changes)
    usage.timestamp.seconds = 1_700_000_000
    with pytest.raises(wire.WireError) as raised:
        wire.usage_from_pb(pb.UsageResponse(containers=[usage]))
    assert raised.value.field == field
    late = pb.ContainerUsage(name="c")
    _far_future(late, "timestamp")
    with pytest.raises(wire.WireError, match=r"usage\.containers\[0\]\.timestamp"):
        wire.usage_from_pb(pb.UsageResponse(containers=[late]))


# --------------------------------------------------------------------------- through a client


def _unary(behaviour: Any, request: Any) -> grpc.RpcMethodHandler[Any, Any]:
    return grpc.unary_unary_rpc_method_handler(
        behaviour,
        request_deserializer=request.FromString,
        response_serializer=lambda m: m.SerializeToString(),
    )


@contextlib.asynccontextmanager
async def _plugin(
    tmp_path: Path, behaviours: dict[str, tuple[Any, Any]], *, name: str
) -> AsyncIterator[GrpcProvider]:
    """A plugin server answering ``behaviours`` (method: handler and request type) on a Unix
    socket, and the agent-side provider that talks to it."""
    server = grpc.aio.server()
    handlers = {method: _unary(*pair) for method, pair in behaviours.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(rpc.SERVICE, handlers),))
    socket = tmp_path / "liar.sock"
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    provider = GrpcProvider(
        GrpcProviderConfig.model_validate(
            {"type": "grpc", "name": name, "address": f"unix://{socket}"}
        )
    )
    try:
        yield provider
    finally:
        await provider.close()
        await server.stop(0)


@pytest.fixture
async def liar(tmp_path: Path) -> AsyncIterator[GrpcProvider]:
    """A plugin that answers a NaN price for its offer and its instance (real gRPC)."""

    async def offers(_request: pb.OffersRequest, _context: Any) -> pb.OffersResponse:
        return pb.OffersResponse(offers=[wire.offer_to_pb(GOOD), _offer(price_per_hour=NAN)])

    async def get(_request: pb.GetRequest, _context: Any) -> pb.Instance:
        return _instance(price_per_hour=NAN)

    async def list_ours(_request: pb.ListOursRequest, _context: Any) -> pb.ListOursResponse:
        return pb.ListOursResponse(instances=[_instance(), _instance(attempt=-2)])

    behaviours = {
        "Offers": (offers, pb.OffersRequest),
        "Get": (get, pb.GetRequest),
        "ListOurs": (list_ours, pb.ListOursRequest),
    }
    async with _plugin(tmp_path, behaviours, name="agent-side") as client:
        yield client


async def test_a_plugin_answering_nonsense_numbers_is_a_provider_error(
    liar: GrpcProvider,
) -> None:
    with pytest.raises(Transient, match=r"offers\[1\]\.price_per_hour") as raised:
        await liar.offers()
    assert raised.value.provider == "agent-side"
    with pytest.raises(Transient, match=r"instance\.price_per_hour"):
        await liar.get("i-1")
    with pytest.raises(Transient, match=r"instance\.attempt"):
        await liar.list_ours()


async def test_a_nan_price_for_a_created_instance_is_refused_with_an_event_on_the_pod(
    tmp_path: Path,
) -> None:
    """Through the production controllers: the create's answer is refused (a provider error
    naming the field, in the pod's ProviderCreateFailed Event), never put in the ledger."""

    async def describe(_request: Any, _context: Any) -> pb.DescribeResponse:
        return pb.DescribeResponse()

    async def offers(_request: Any, _context: Any) -> pb.OffersResponse:
        return pb.OffersResponse(offers=[wire.offer_to_pb(GOOD)])

    async def create(_request: Any, _context: Any) -> pb.Instance:
        return _instance(price_per_hour=NAN)

    async def list_ours(_request: Any, _context: Any) -> pb.ListOursResponse:
        return pb.ListOursResponse()

    behaviours = {
        "Describe": (describe, pb.DescribeRequest),
        "Offers": (offers, pb.OffersRequest),
        "Create": (create, pb.CreateRequest),
        "ListOurs": (list_ours, pb.ListOursRequest),
    }
    async with _plugin(tmp_path, behaviours, name="p") as provider:
        core = Core(provider)
        async with core.running():
            await core.kube.create_pod(pod_manifest("infer", gpus=8))

            def refused() -> list[dict[str, Any]]:
                return [e for e in core.kube.events if e["reason"] == "ProviderCreateFailed"]

            (event, *_) = await core.until(refused, within=60, what="ProviderCreateFailed")
            assert "instance.price_per_hour" in event["message"], event
            assert core.phase("infer") != "Running"
            # Held as "may exist" at the offer's price until a listing shows it absent.
            assert all(math.isfinite(held) for held in core.ledger.holds().values())
            assert core.ledger.total_per_hour() <= GOOD.price_per_hour
