"""The RunPod adapter against respx: payloads shaped by the published RunPod documents.

Stateful scenarios use ``FakeRunPod`` (tests/contract/harness_runpod.py), which validates every
``POST /pods`` body against the v1 ``PodCreateInput`` schema; exact payloads use plain routes.
Retries never sleep: the ``RetryPolicy`` records the waits it would have made.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.contract.harness_runpod import (
    API_KEY,
    CAPACITY_MESSAGE,
    GRAPHQL_URL,
    REST_URL,
    V2_SPEC,
    FakeGpu,
    FakeRunPod,
    graphql_error,
    make_config,
    problem,
    v1_document,
    v1_error,
    v1_validator,
)
from tests.unit import canary
from tests.workloads import workload as make_workload
from vk_provider.domain.contract import Provider
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
    EnvVar,
    InstanceState,
    LogOptions,
    Offer,
    Port,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider_adapters.runpod.adapter import RunPodProvider
from vk_provider_adapters.runpod.failures import Operation, classify_failure, error_detail
from vk_provider_adapters.runpod.gpus import CREATE_GPU_TYPE_IDS, canonical_gpu_name
from vk_provider_adapters.runpod.logs import SseDecoder
from vk_provider_adapters.runpod.offers import (
    OfferScope,
    Sku,
    offers_query,
    parse_offers,
    refused_gpu_types,
    stock_to_available,
)
from vk_provider_adapters.runpod.pods import (
    ENV_POD_UID,
    ENV_REQUEST_ID,
    Lifecycle,
    build_create_body,
    instance_state,
    lifecycle_of,
    owner_of,
)
from vk_provider_adapters.transport import RetryPolicy, parse_retry_after

NOW = datetime(2026, 3, 13, 20, 0, tzinfo=UTC)


class Sleeps:
    """A ``RetryPolicy.sleep`` that records instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "runpod-key"
    path.write_text(API_KEY + "\n")
    return path


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def fake() -> FakeRunPod:
    return FakeRunPod()


@pytest.fixture
async def provider(
    fake: FakeRunPod, key_file: Path, sleeps: Sleeps
) -> AsyncIterator[RunPodProvider]:
    adapter = RunPodProvider(
        make_config(key_file, name="rp"),
        transport=fake.transport(),
        retry=RetryPolicy(sleep=sleeps),
        log_idle_seconds=0.05,
        clock=lambda: NOW,
    )
    yield adapter
    await adapter.close()


def spec(pod_uid: str = "0b7c6d5e-1111-4a2b-9c3d-123456789abc", **fields: Any) -> WorkloadSpec:
    values: dict[str, Any] = {
        "pod_uid": pod_uid,
        "namespace": "ml",
        "pod_name": "trainer",
        "container_name": "main",
        "image": "ghcr.io/example/trainer:1",
        "command": ("python", "-m", "train"),
        "args": ("--epochs", "3"),
        "gpu_count": 1,
        **fields,
    }
    return make_workload(**values)


def offer(sku: str = "secure:on-demand:1x:NVIDIA L40S", region: str = "any") -> Offer:
    return Offer(
        provider="rp",
        sku=sku,
        region=region,
        gpu_model="L40S",
        gpu_count=parsed.gpu_count if (parsed := Sku.parse(sku)) else 1,
        gpu_memory_gib=48,
        vcpus=8,
        memory_gib=62,
        price_per_hour=0.86,
    )


# --- GPU names and skus -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runpod", "canonical"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIE"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("NVIDIA  A30", "A30"),  # RunPod's id really has two spaces
        ("NVIDIA RTX 4000 SFF Ada Generation", "RTX4000-ADA-SFF"),
        ("Tesla V100-SXM2-32GB", "V100-32GB-SXM2"),
        ("AMD Instinct MI300X OAM", "MI300X"),
        # Unknown: normalised, never an error.
        ("NVIDIA GH200 480GB", "GH200-480GB"),
        ("NVIDIA GeForce RTX 6090 Ti", "RTX6090-TI"),
        ("Some Future Chip!", "SOME-FUTURE-CHIP"),
        ("NVIDIA", "UNKNOWN"),
        ("", "UNKNOWN"),
    ],
)
def test_gpu_names_are_canonical(runpod: str, canonical: str) -> None:
    assert canonical_gpu_name(runpod) == canonical


def test_every_gpu_type_runpod_documents_has_a_known_name() -> None:
    document = v1_document()
    ids = document["components"]["schemas"]["PodCreateInput"]["properties"]["gpuTypeIds"]
    for gpu_id in ids["items"]["enum"]:
        name = canonical_gpu_name(gpu_id)
        assert name != "UNKNOWN" and "NVIDIA" not in name, gpu_id


@given(st.text(max_size=40))
def test_gpu_name_mapping_never_crashes(name: str) -> None:
    assert canonical_gpu_name(name)


@given(
    gpu=st.text(min_size=1, max_size=40).filter(str.strip),
    count=st.integers(1, 999),
    cloud=st.sampled_from(["SECURE", "COMMUNITY"]),
    spot=st.booleans(),
)
def test_sku_round_trips(gpu: str, count: int, cloud: str, spot: bool) -> None:
    from vk_provider_adapters.runpod.offers import CloudType

    sku = Sku(gpu, count, CloudType(cloud), spot)
    assert Sku.parse(sku.encode()) == sku


@pytest.mark.parametrize(
    "text", ["", "L40S", "secure:on-demand:1:NVIDIA L40S", "moon:spot:1x:X", "secure:spot:0x:X"]
)
def test_foreign_skus_do_not_parse(text: str) -> None:
    assert Sku.parse(text) is None


# --- offers -------------------------------------------------------------------------------


def _scope(**fields: Any) -> OfferScope:
    from vk_provider_adapters.runpod.offers import CloudType

    values: dict[str, Any] = {
        "provider": "rp",
        "clouds": (CloudType.SECURE,),
        "regions": (),
        "gpu_types": frozenset(),
        "max_price_per_hour": None,
        **fields,
    }
    return OfferScope(**values)


def _lowest(price: float | None, bid: float | None, stock: str | None) -> dict[str, Any]:
    return {
        "uninterruptablePrice": price,
        "minimumBidPrice": bid,
        "stockStatus": stock,
        "minVcpu": 16,
        "minMemory": 125,
    }


GPU_TYPES = {
    "gpuTypes": [
        {
            "id": "NVIDIA H100 80GB HBM3",
            "displayName": "H100 SXM",
            "memoryInGb": 80,
            "maxGpuCount": 2,
            "securePrice": 2.99,
            "communityPrice": 2.69,
            "secureSpotPrice": 1.75,
            "communitySpotPrice": None,
            "lp_secure_1_0": _lowest(2.99, 1.75, "High"),
            "lp_secure_2_0": _lowest(2.99, 1.80, "Low"),
            "lp_secure_4_0": _lowest(2.99, None, None),
        },
        {
            "id": "NVIDIA L40S",
            "displayName": "L40S",
            "memoryInGb": 48,
            "maxGpuCount": 1,
            "securePrice": 0.86,
            "communityPrice": 0.79,
            "secureSpotPrice": None,
            "communitySpotPrice": 0.47,
            "lp_secure_1_0": _lowest(0.86, None, None),  # sold out: null stockStatus
        },
        {"id": "Mystery Accelerator 9000", "memoryInGb": 16, "maxGpuCount": 1, "securePrice": 0.1},
        {"displayName": "no id: skipped"},
        "not even an object",
    ]
}


def test_offers_are_priced_per_instance_with_spot_variants() -> None:
    offers = {(o.sku, o.region): o for o in parse_offers(GPU_TYPES, _scope())}
    h100x2 = offers[("secure:on-demand:2x:NVIDIA H100 80GB HBM3", "any")]
    assert h100x2.gpu_model == "H100-SXM"
    assert h100x2.gpu_count == 2 and h100x2.gpu_memory_gib == 80
    assert h100x2.price_per_hour == pytest.approx(5.98)  # 2.99 per GPU x 2
    assert h100x2.available == 1 and not h100x2.spot  # Low
    assert (h100x2.vcpus, h100x2.memory_gib) == (16, 125)
    spot = offers[("secure:spot:2x:NVIDIA H100 80GB HBM3", "any")]
    assert spot.spot and spot.price_per_hour == pytest.approx(3.6)
    assert offers[("secure:on-demand:1x:NVIDIA H100 80GB HBM3", "any")].available == 8  # High
    # maxGpuCount 2: no 4x offer even though RunPod answered the alias.
    assert not any(sku.startswith("secure:on-demand:4x") for sku, _ in offers)


def test_null_stock_status_means_none_available() -> None:
    offers = {o.sku: o for o in parse_offers(GPU_TYPES, _scope())}
    l40s = offers["secure:on-demand:1x:NVIDIA L40S"]
    assert l40s.available == 0 and l40s.price_per_hour == pytest.approx(0.86)
    assert "secure:spot:1x:NVIDIA L40S" not in offers  # no secure spot price quoted


def test_unknown_gpu_types_are_offered_under_a_normalised_name() -> None:
    # Create accepts it (as a newer v1 document may list): offered under a stable name.
    accepted = CREATE_GPU_TYPE_IDS | {"Mystery Accelerator 9000"}
    offers = {o.sku: o for o in parse_offers(GPU_TYPES, _scope(create_gpu_ids=accepted))}
    mystery = offers["secure:on-demand:1x:Mystery Accelerator 9000"]
    assert mystery.gpu_model == "MYSTERY-ACCELERATOR-9000"
    assert mystery.available == 0  # no lowestPrice answer: no stock known
    assert (mystery.vcpus, mystery.memory_gib) == (2, 8)  # RunPod's per-GPU minimums


def test_offers_honour_gpu_types_and_max_price() -> None:
    only_h100 = parse_offers(
        GPU_TYPES, _scope(gpu_types=frozenset({"NVIDIA H100 80GB HBM3"}), max_price_per_hour=3.0)
    )
    assert {(o.sku, o.price_per_hour) for o in only_h100} == {
        ("secure:on-demand:1x:NVIDIA H100 80GB HBM3", 2.99),
        ("secure:spot:1x:NVIDIA H100 80GB HBM3", 1.75),
    }


@pytest.mark.parametrize(
    ("stock", "available"),
    [("High", 8), ("Medium", 4), ("Low", 1), (None, 0), ("None", 0), ("", 0), ("Plenty", 1)],
)
def test_stock_status_maps_to_available(stock: str | None, available: int) -> None:
    assert stock_to_available(stock) == available


def test_the_query_asks_each_count_cloud_and_region_once() -> None:
    from vk_provider_adapters.runpod.offers import CloudType

    query = offers_query(
        _scope(clouds=(CloudType.SECURE, CloudType.COMMUNITY), regions=("EU-RO-1", "US-TX-3"))
    )
    assert query.count("lowestPrice(") == 4 * 2 * 2
    assert (
        "lp_community_8_1: lowestPrice(input: "
        '{gpuCount: 8, secureCloud: false, dataCenterId: "US-TX-3"})'
    ) in query


async def test_offers_per_cloud_and_region_from_the_fake(fake: FakeRunPod, key_file: Path) -> None:
    fake.catalogue[1].region_stock = {"US-TX-3": None}
    adapter = RunPodProvider(
        make_config(key_file, name="rp", cloud_type="ALL", regions=["EU-RO-1", "US-TX-3"]),
        transport=fake.transport(),
    )
    try:
        offers = await adapter.offers()
    finally:
        await adapter.close()
    l40s = {(o.sku, o.region): o.available for o in offers if o.sku.endswith("NVIDIA L40S")}
    assert l40s[("secure:on-demand:1x:NVIDIA L40S", "EU-RO-1")] == 4
    assert l40s[("secure:on-demand:1x:NVIDIA L40S", "US-TX-3")] == 0
    assert l40s[("community:spot:4x:NVIDIA L40S", "EU-RO-1")] == 4
    assert {o.region for o in offers} == {"EU-RO-1", "US-TX-3"}
    assert fake.calls("graphql") == 1


async def test_offers_send_the_key_as_a_bearer_token(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    await provider.offers()
    request = fake.routes["graphql"].calls.last.request
    assert request.headers["Authorization"] == f"Bearer {API_KEY}"
    assert "gpuTypes" in json.loads(request.content)["query"]


# --- GraphQL errors (HTTP 200) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "code", "expected"),
    [
        (CAPACITY_MESSAGE, "INTERNAL_SERVER_ERROR", CapacityUnavailable),
        ("Unauthorized request, please check your API key.", "UNAUTHENTICATED", AuthFailed),
        ('Cannot query field "bogus" on type "GpuType".', "GRAPHQL_VALIDATION_FAILED", InvalidSpec),
        ("Too many requests, rate limit exceeded", "RATE_LIMITED", RateLimited),
        ("Something went wrong. Please try again later.", "INTERNAL_SERVER_ERROR", Transient),
    ],
)
async def test_graphql_errors_with_http_200_are_classified(
    provider: RunPodProvider,
    fake: FakeRunPod,
    message: str,
    code: str,
    expected: type[ProviderError],
) -> None:
    fake.fail("graphql", graphql_error(message, code), times=None)
    with pytest.raises(ProviderError) as raised:
        await provider.offers()
    assert type(raised.value) is expected
    assert message[:20] in str(raised.value)
    # Only what may pass with time is retried.
    assert fake.calls("graphql") == (4 if expected in (Transient, RateLimited) else 1)


async def test_a_transient_graphql_error_then_success(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.fail("graphql", graphql_error("upstream hiccup"), times=1)
    assert await provider.offers()
    assert fake.calls("graphql") == 2


# --- create -------------------------------------------------------------------------------


def test_every_create_body_is_a_valid_pod_create_input() -> None:
    validator = v1_validator("PodCreateInput")
    document = v1_document()
    assert document is not None
    documented = set(document["components"]["schemas"]["PodCreateInput"]["properties"])
    rich = spec(
        env=(EnvVar("MODE", "train"), EnvVar("HF_TOKEN", "hf_s3cret", secret=True)),
        ports=(Port(8000), Port(9090, name="metrics"), Port(5353, protocol="UDP"), Port(8000)),
        cpu=24,
        memory_bytes=200 * 2**30,
    )
    cases = [
        (spec(), Sku.parse("secure:on-demand:1x:NVIDIA L40S"), "any"),
        (rich, Sku.parse("community:spot:4x:NVIDIA H100 80GB HBM3"), "EU-RO-1"),
        (spec(command=(), args=()), Sku.parse("secure:on-demand:8x:NVIDIA A100-SXM4-80GB"), "any"),
    ]
    for (workload, sku, region), expose in itertools.product(cases, ("tcp", "http")):
        assert sku is not None
        body = build_create_body(
            workload, sku, region=region, container_disk_gb=20, offer_key="rp/x/any", expose=expose
        )
        assert not [e.message for e in validator.iter_errors(body)]
        assert set(body) <= documented, set(body) - documented


def test_the_create_body_carries_the_pod() -> None:
    sku = Sku.parse("community:spot:4x:NVIDIA H100 80GB HBM3")
    assert sku is not None
    workload = spec(
        env=(EnvVar("MODE", "train"), EnvVar("HF_TOKEN", "hf_s3cret", secret=True)),
        ports=(Port(8000), Port(5353, protocol="UDP")),
        cpu=24,
        memory_bytes=200 * 2**30,
        attempt=2,
    )
    body = build_create_body(
        workload, sku, region="EU-RO-1", container_disk_gb=40, offer_key="rp/k/EU-RO-1"
    )
    assert body["name"] == "vk-0b7c6d5e-1111-4a2b-9c3d-123456789abc.2"
    assert body["imageName"] == "ghcr.io/example/trainer:1"
    assert body["dockerEntrypoint"] == ["python", "-m", "train"]
    assert body["dockerStartCmd"] == ["--epochs", "3"]
    assert body["env"] == {
        "MODE": "train",
        "HF_TOKEN": "hf_s3cret",
        ENV_POD_UID: workload.pod_uid,
        ENV_REQUEST_ID: workload.request_id,
        "VK_OFFER_KEY": "rp/k/EU-RO-1",
    }
    assert body["ports"] == ["8000/tcp"]  # UDP cannot be exposed on RunPod
    assert body["supportPublicIp"] is True  # TCP ports are reached on the public IP
    assert (body["gpuTypeIds"], body["gpuCount"]) == (["NVIDIA H100 80GB HBM3"], 4)
    assert (body["cloudType"], body["interruptible"]) == ("COMMUNITY", True)
    assert body["dataCenterIds"] == ["EU-RO-1"]
    assert body["containerDiskInGb"] == 40
    assert (body["minVCPUPerGPU"], body["minRAMPerGPU"]) == (6, 50)


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        (spec(image=" "), "spec.containers[0].image"),
        (spec(pod_uid="bad uid/../x"), "metadata.uid"),
        (spec(pod_uid="u" * 200), "metadata.uid"),
    ],
)
async def test_unlaunchable_specs_are_invalid(
    provider: RunPodProvider, fake: FakeRunPod, workload: WorkloadSpec, field: str
) -> None:
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(workload, offer())
    assert raised.value.field == field and raised.value.provider == "rp"
    assert fake.calls("create") == 0


async def test_create_returns_a_pending_instance(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(attempt=1), offer())
    assert created.provider == "rp" and created.instance_id in fake.pods
    assert (created.pod_uid, created.attempt) == (spec().pod_uid, 1)
    assert created.state is InstanceState.PENDING
    assert created.price_per_hour == pytest.approx(0.86)
    assert created.offer_key == offer().key
    assert created.started_at == datetime(2026, 3, 13, 20, 0, tzinfo=UTC)


async def test_create_is_idempotent_by_request_id(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    first = await provider.create(spec(), offer())
    second = await provider.create(spec(), offer())
    assert second.instance_id == first.instance_id
    assert fake.calls("create") == 1 and len(fake.pods) == 1
    lookup = fake.routes["list"].calls.last.request
    assert lookup.url.params["name"] == f"vk-{spec().request_id}"


async def test_create_finds_the_pod_an_earlier_agent_made(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    workload = spec()
    earlier = fake.add_pod(
        name=f"vk-{workload.request_id}",
        env={ENV_POD_UID: workload.pod_uid, ENV_REQUEST_ID: workload.request_id},
        runtime={"uptimeInSeconds": 30},
    )
    found = await provider.create(workload, offer())
    assert found.instance_id == earlier["id"] and found.state is InstanceState.RUNNING
    assert fake.calls("create") == 0


async def test_a_create_whose_answer_was_lost_is_not_repeated(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.lose_create_answers = 1  # RunPod made the pod, then the gateway answered 502
    created = await provider.create(spec(), offer())
    assert fake.calls("create") == 1 and list(fake.pods) == [created.instance_id]


async def test_a_create_that_timed_out_is_not_repeated(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    real_create = fake.routes["create"].side_effect
    assert callable(real_create)

    def create_then_time_out(request: httpx.Request) -> httpx.Response:
        real_create(request)
        raise httpx.ReadTimeout("read timed out", request=request)

    fake.routes["create"].side_effect = create_then_time_out
    created = await provider.create(spec(), offer())
    assert list(fake.pods) == [created.instance_id] and fake.calls("create") == 1


async def test_a_sold_out_gpu_is_capacity_unavailable_without_retries(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    # RunPod v1 reports "no capacity" as 500 with GraphQL's text; the text decides.
    with pytest.raises(CapacityUnavailable, match="no longer any instances"):
        await provider.create(spec(), offer("secure:on-demand:1x:NVIDIA GeForce RTX 4090"))
    assert fake.calls("create") == 1


async def test_400_on_create_means_try_the_next_candidate(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.fail("create", problem(400, "gpu type not available in data center"), times=1)
    with pytest.raises(CapacityUnavailable, match="HTTP 400"):
        await provider.create(spec(), offer())
    assert fake.calls("create") == 1


async def test_an_offer_from_elsewhere_is_refused(provider: RunPodProvider) -> None:
    foreign = Offer("lambda", "gpu_1x_h100", "us-east-1", "H100", 1, 80, 26, 200, 2.49)
    with pytest.raises(CapacityUnavailable):
        await provider.create(spec(), foreign)
    with pytest.raises(CapacityUnavailable):
        await provider.create(spec(), offer("not-a-runpod-sku"))


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (problem(401, "invalid bearer token"), AuthFailed),
        (problem(403, "forbidden"), AuthFailed),
        (problem(402, "insufficient balance"), AuthFailed),
        (v1_error(400, "Insufficient balance to rent this pod"), AuthFailed),
        (problem(422, "$: additional properties 'bogus' not allowed"), InvalidSpec),
    ],
)
async def test_refusals_are_classified_and_not_retried(
    provider: RunPodProvider,
    fake: FakeRunPod,
    response: httpx.Response,
    expected: type[ProviderError],
) -> None:
    fake.fail("create", response, times=None)
    with pytest.raises(expected) as raised:
        await provider.create(spec(), offer())
    assert f"HTTP {response.status_code}" in str(raised.value)
    assert fake.calls("create") == 1


# --- retries ------------------------------------------------------------------------------


async def test_429_with_retry_after_is_honoured_then_rate_limited(
    provider: RunPodProvider, fake: FakeRunPod, sleeps: Sleeps
) -> None:
    fake.fail("get", problem(429, "rate limit exceeded", {"Retry-After": "3"}), times=None)
    with pytest.raises(RateLimited) as raised:
        await provider.get("any-pod")
    assert raised.value.retry_after == 3
    assert sleeps.waits == [3, 3, 3] and fake.calls("get") == 4


async def test_429_with_an_http_date(
    provider: RunPodProvider, fake: FakeRunPod, sleeps: Sleeps
) -> None:
    fake.fail(
        "list",
        problem(429, "slow down", {"Retry-After": "Fri, 13 Mar 2026 20:00:02 GMT"}),
        times=1,
    )
    assert await provider.list_ours() == []
    assert sleeps.waits == [2.0]


async def test_429_without_retry_after_backs_off_exponentially(
    provider: RunPodProvider, fake: FakeRunPod, sleeps: Sleeps
) -> None:
    fake.fail("list", problem(429, "rate limit exceeded"), times=None)
    with pytest.raises(RateLimited) as raised:
        await provider.list_ours()
    assert raised.value.retry_after is None
    assert sleeps.waits == [0.5, 1.0, 2.0]


async def test_a_long_retry_after_is_left_to_the_caller(
    provider: RunPodProvider, fake: FakeRunPod, sleeps: Sleeps
) -> None:
    fake.fail("create", problem(429, "hour window", {"Retry-After": "600"}), times=None)
    with pytest.raises(RateLimited) as raised:
        await provider.create(spec(), offer())
    assert raised.value.retry_after == 600
    assert sleeps.waits == [] and fake.calls("create") == 1


async def test_5xx_is_retried_then_transient(
    provider: RunPodProvider, fake: FakeRunPod, sleeps: Sleeps
) -> None:
    fake.fail("list", v1_error(503, "service unavailable"), times=None)
    with pytest.raises(Transient, match="HTTP 503"):
        await provider.list_ours()
    assert fake.calls("list") == 4 and sleeps.waits == [0.5, 1.0, 2.0]


async def test_5xx_then_success(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())
    fake.fail("get", v1_error(502, "bad gateway"), times=2)
    assert (await provider.get(created.instance_id)).instance_id == created.instance_id


@pytest.mark.parametrize(
    "error",
    [httpx.ConnectError("connection refused"), httpx.ReadTimeout("read timed out")],
)
async def test_connection_failures_are_transient(
    provider: RunPodProvider, fake: FakeRunPod, error: Exception
) -> None:
    fake.fail("graphql", error, times=None)
    with pytest.raises(Transient):
        await provider.offers()
    assert fake.calls("graphql") == 4


def test_retry_policy_caps_backoff() -> None:
    policy = RetryPolicy(backoff_seconds=1, max_backoff_seconds=4)
    assert [policy.wait_seconds(None, n) for n in range(1, 6)] == [1, 2, 4, 4, 4]
    assert policy.wait_seconds(RateLimited("x", retry_after=2.5), 1) == 2.5
    assert not policy.should_retry(RateLimited("x", retry_after=6))
    assert not policy.should_retry(CapacityUnavailable("x"))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("12", 12.0),
        ("0", 0.0),
        ("1.5", 1.5),
        ("Fri, 13 Mar 2026 20:00:30 GMT", 30.0),
        ("Fri, 13 Mar 2026 19:00:00 GMT", 0.0),  # in the past: retry now
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
    ],
)
def test_retry_after_parsing(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=NOW) == seconds


# --- malformed answers --------------------------------------------------------------------


async def test_truncated_json_is_transient_and_says_so(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.fail("get", httpx.Response(200, content=b'{"id": "abc", "desiredSt'), times=None)
    with pytest.raises(Transient, match="malformed JSON"):
        await provider.get("abc")


async def test_a_pod_of_ours_without_a_status_is_transient(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    del fake.pods[created.instance_id]["desiredStatus"]
    with pytest.raises(Transient, match="'desiredStatus'"):
        await provider.get(created.instance_id)
    with pytest.raises(Transient, match="'desiredStatus'"):
        await provider.list_ours()


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"data": {}}, "gpuTypes"),
        ({"data": {"gpuTypes": {"id": "x"}}}, "gpuTypes"),
        (["not", "an", "object"], "not a JSON object"),
        ({"errors": "boom"}, "'errors' is not a list"),
    ],
)
async def test_malformed_graphql_answers_are_transient(
    provider: RunPodProvider, fake: FakeRunPod, body: object, needle: str
) -> None:
    fake.fail("graphql", httpx.Response(200, json=body), times=None)
    with pytest.raises(Transient, match=needle):
        await provider.offers()


async def test_a_list_that_is_not_an_array_is_transient(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.fail("list", httpx.Response(200, json={"pods": []}), times=None)
    with pytest.raises(Transient, match="not a JSON array"):
        await provider.list_ours()


async def test_a_created_pod_without_an_id_is_transient(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    workload = spec()
    body = {
        "name": f"vk-{workload.request_id}",
        "desiredStatus": "RUNNING",
        "env": {ENV_POD_UID: workload.pod_uid, ENV_REQUEST_ID: workload.request_id},
    }
    fake.fail("create", httpx.Response(201, json=body), times=None)
    with pytest.raises(Transient, match="'id'"):
        await provider.create(workload, offer())


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ('{"title":"Not Found","status":404,"detail":"pod not found"}', "Not Found: pod not found"),
        ('{"error":"create pod: no","status":500}', "create pod: no"),
        ('{"errors":[{"message":"a"},{"message":"b"}]}', "a: b"),
        ("upstream connect error\n", "upstream connect error"),
        ("", "(empty)"),
        ("x" * 500, "x" * 297 + "..."),
    ],
)
def test_error_detail(body: str, detail: str) -> None:
    assert error_detail(body) == detail


# --- states -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "lifecycle"),
    [
        ({"desiredStatus": "RUNNING", "runtime": None}, Lifecycle.STARTING),
        ({"desiredStatus": "RUNNING", "runtime": {"uptimeInSeconds": 3}}, Lifecycle.RUNNING),
        ({"desiredStatus": "RUNNING", "publicIp": "", "portMappings": {}}, Lifecycle.STARTING),
        # v1 fields are no proof that the container runs: only GraphQL's runtime is.
        ({"desiredStatus": "RUNNING", "publicIp": "100.65.0.119"}, Lifecycle.STARTING),
        ({"desiredStatus": "RUNNING", "portMappings": {"22": 10341}}, Lifecycle.STARTING),
        ({"desiredStatus": "EXITED"}, Lifecycle.EXITED),
        ({"desiredStatus": "TERMINATED"}, Lifecycle.TERMINATED),
        ({"desiredStatus": "RUNNING", "status": "PROVISIONING"}, Lifecycle.PROVISIONING),
        ({"status": "ERROR"}, Lifecycle.ERROR),
    ],
)
def test_lifecycle_of_a_payload(pod: dict[str, Any], lifecycle: Lifecycle) -> None:
    assert lifecycle_of(pod) is lifecycle


S = InstanceState


@pytest.mark.parametrize(
    ("lifecycle", "deleting", "interruptible", "state"),
    [
        (Lifecycle.PROVISIONING, False, False, S.PENDING),
        (Lifecycle.STARTING, False, False, S.PENDING),
        (Lifecycle.RUNNING, False, False, S.RUNNING),
        (Lifecycle.RUNNING, True, False, S.TERMINATING),
        (Lifecycle.EXITED, False, False, S.EXITED),
        (Lifecycle.EXITED, False, True, S.LOST),  # preempted spot pod
        (Lifecycle.EXITED, True, True, S.TERMINATING),
        (Lifecycle.ERROR, False, False, S.LOST),
        (Lifecycle.TERMINATED, False, False, S.LOST),
        (Lifecycle.TERMINATED, True, False, S.TERMINATED),
    ],
)
def test_state_table(
    lifecycle: Lifecycle, deleting: bool, interruptible: bool, state: InstanceState
) -> None:
    got, message = instance_state(lifecycle, deleting=deleting, interruptible=interruptible)
    assert got is state
    assert message or state is S.RUNNING


@pytest.mark.parametrize("desired", [None, "PAUSED", 3])
def test_an_unknown_desired_status_is_malformed(desired: object) -> None:
    from vk_provider_adapters.payload import MalformedResponse

    with pytest.raises(MalformedResponse, match="desiredStatus"):
        lifecycle_of({"desiredStatus": desired})


def test_ownership_needs_our_name_and_agreeing_env() -> None:
    env = {ENV_POD_UID: "u-1", ENV_REQUEST_ID: "u-1.3"}
    assert owner_of({"name": "vk-u-1.3", "env": env}) is not None
    assert owner_of({"name": "vk-u-1.3"}) is not None  # payload without env: the name decides
    assert owner_of({"name": "vk-u-1.3", "env": {}}) is None
    assert owner_of({"name": "vk-u-1.4", "env": env}) is None
    assert owner_of({"name": "my pod", "env": env}) is None
    assert owner_of({"name": None}) is None
    # Another agent's pod in the same account: same naming, another provider name.
    theirs = {**env, "VK_OFFER_KEY": "runpod-staging/secure:on-demand:1x:H100/any"}
    assert owner_of({"name": "vk-u-1.3", "env": theirs}, provider="runpod") is None
    assert owner_of({"name": "vk-u-1.3", "env": theirs}, provider="runpod-staging") is not None


# --- get, list, delete --------------------------------------------------------------------


async def test_list_ours_ignores_foreign_and_terminated_pods(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    fake.add_pod(name="my jupyter notebook")
    fake.add_pod(name="vk-lookalike.0", env={"JUPYTER_PASSWORD": "x"})
    fake.add_pod(name="vk-broken.0", desiredStatus=None, env={})  # foreign and unreadable
    ours = await provider.create(spec(), offer())
    gone = await provider.create(spec(attempt=1), offer())
    await provider.delete(gone.instance_id, grace_seconds=30)
    fake.add_pod(
        name=f"vk-{spec().pod_uid}.1",
        env={ENV_POD_UID: spec().pod_uid, ENV_REQUEST_ID: f"{spec().pod_uid}.1"},
        desiredStatus="TERMINATED",
        pod_id=gone.instance_id,
    )
    listed = await provider.list_ours()
    assert [i.instance_id for i in listed] == [ours.instance_id]
    assert fake.calls("list") == 3  # two create lookups and one list: one call each


async def test_get_of_a_foreign_pod_is_not_found(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    foreign = fake.add_pod(name="my jupyter notebook")
    with pytest.raises(NotFound, match="not one of ours"):
        await provider.get(foreign["id"])


async def test_delete_then_get(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())
    await provider.delete(created.instance_id, grace_seconds=30)
    assert fake.routes["delete"].calls.last.response.status_code == 204
    with pytest.raises(NotFound):
        await provider.get(created.instance_id)
    await provider.delete(created.instance_id, grace_seconds=30)  # 404: already done
    await provider.delete("", grace_seconds=0)


async def test_a_pod_being_deleted_reports_terminating_then_terminated(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    fake.fail("delete", httpx.Response(204), times=1)  # accepted; the pod lingers
    await provider.delete(created.instance_id, grace_seconds=0)
    assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATING
    fake.set_fields(created.instance_id, desiredStatus="TERMINATED")
    assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATED


async def test_a_pod_id_is_one_path_segment(provider: RunPodProvider, fake: FakeRunPod) -> None:
    with pytest.raises(NotFound):
        await provider.get("../billing/pods")
    assert fake.routes["get"].calls.last.request.url.raw_path.endswith(b"..%2Fbilling%2Fpods")


async def test_400_on_a_pod_id_is_not_found(provider: RunPodProvider, fake: FakeRunPod) -> None:
    fake.fail("delete", v1_error(400, "Invalid Pod ID."), times=1)
    await provider.delete("%%%", grace_seconds=0)
    fake.fail("get", v1_error(400, "Invalid ID supplied."), times=1)
    with pytest.raises(NotFound):
        await provider.get("%%%")


async def test_get_reports_what_runpod_says(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())
    fake.set_fields(
        created.instance_id,
        publicIp="100.65.0.119",
        portMappings={"8000": 10341},
        costPerHr="0.74",  # the v1 document's example spells the price as a string
        lastStartedAt="2026-03-13T20:01:02.144Z",
        runtime={"uptimeInSeconds": 62},  # GraphQL's: the container is up
    )
    got = await provider.get(created.instance_id)
    assert got.state is InstanceState.RUNNING and got.ip == "100.65.0.119"
    assert got.price_per_hour == pytest.approx(0.74)
    assert got.started_at == datetime(2026, 3, 13, 20, 1, 2, 144000, tzinfo=UTC)


async def test_a_running_pod_with_only_http_ports_and_no_public_ip_reads_running(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    # v1 shows no public IP and no port mapping; GraphQL's runtime says the container is up.
    fake.set_fields(
        created.instance_id,
        publicIp="",
        portMappings={},
        ports=["8000/http"],
        runtime={"uptimeInSeconds": 40},
    )
    assert (await provider.get(created.instance_id)).state is InstanceState.RUNNING
    assert [i.state for i in await provider.list_ours()] == [InstanceState.RUNNING]
    assert any("runtime" in query for query in fake.queries)


async def test_each_port_is_reported_where_the_cluster_reaches_it(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    """A /tcp port on the public IP at the port RunPod mapped it to (only once mapped), an
    /http port through the HTTPS proxy; the payload is a v1 Pod as the spec shapes it."""
    created = await provider.create(spec(ports=(Port(8000), Port(9090))), offer())
    fields = {
        "publicIp": "100.65.0.119",
        "portMappings": {"8000": 10341},
        "ports": ["8000/tcp", "9090/tcp", "8888/http"],
        "runtime": {"uptimeInSeconds": 40},
    }
    assert not [e.message for e in v1_validator("Pod").iter_errors({"id": "x", **fields})]
    fake.set_fields(created.instance_id, **fields)
    got = await provider.get(created.instance_id)
    assert got.endpoints == (
        PortEndpoint(8000, "TCP", "100.65.0.119", 10341),  # 9090 is not mapped yet
        PortEndpoint(8888, "TCP", f"{created.instance_id}-8888.proxy.runpod.net", 443),
    )
    assert got.endpoints[1].address_type == "FQDN"
    fake.set_fields(created.instance_id, publicIp="", portMappings={"8000": 0})
    assert [e.port for e in (await provider.get(created.instance_id)).endpoints] == [443]


async def test_a_pod_with_a_public_ip_whose_container_is_not_up_is_pending(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    fake.set_fields(
        created.instance_id, publicIp="100.65.0.119", portMappings={"8000": 10341}, runtime=None
    )
    assert (await provider.get(created.instance_id)).state is InstanceState.PENDING
    assert [i.state for i in await provider.list_ours()] == [InstanceState.PENDING]


async def test_the_runtime_is_asked_once_per_list_and_not_for_settled_pods(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    first = await provider.create(spec(), offer())
    await provider.create(spec(attempt=1), offer())
    before = len(fake.queries)
    await provider.list_ours()
    assert len(fake.queries) == before + 1  # one GraphQL question for every pod
    fake.set_fields(first.instance_id, desiredStatus="EXITED")
    for pod_id in list(fake.pods):
        fake.set_fields(pod_id, desiredStatus="EXITED")
    before = len(fake.queries)
    await provider.list_ours()
    assert len(fake.queries) == before  # no RUNNING pod: nothing to ask


def test_create_gpu_type_ids_are_those_of_the_v1_document() -> None:
    schema = v1_document()["components"]["schemas"]["PodCreateInput"]
    assert set(schema["properties"]["gpuTypeIds"]["items"]["enum"]) == CREATE_GPU_TYPE_IDS


def test_gpu_types_create_would_refuse_are_not_offered() -> None:
    offers = parse_offers(GPU_TYPES, _scope())
    assert not any("Mystery Accelerator 9000" in o.sku for o in offers)
    assert refused_gpu_types(GPU_TYPES, _scope()) == ["Mystery Accelerator 9000"]
    narrowed = _scope(gpu_types=frozenset({"NVIDIA L40S"}))
    assert refused_gpu_types(GPU_TYPES, narrowed) == []


async def test_refused_gpu_types_are_dropped_with_one_warning(
    fake: FakeRunPod, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.catalogue.append(FakeGpu("NVIDIA Future GPU 9", "Future 9", 96, 8, 4.0, 3.5, None, None))
    adapter = RunPodProvider(make_config(key_file), transport=fake.transport())
    try:
        with caplog.at_level(logging.WARNING):
            first = await adapter.offers()
            second = await adapter.offers()
    finally:
        await adapter.close()
    for offers in (first, second):
        assert offers and not any("NVIDIA Future GPU 9" in o.sku for o in offers)
    warnings = [r for r in caplog.records if "NVIDIA Future GPU 9" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_fake_pods_are_valid_v1_pods(fake: FakeRunPod) -> None:
    validator = v1_validator("Pod")
    pod = fake.add_pod(name="vk-u.0", env={ENV_POD_UID: "u", ENV_REQUEST_ID: "u.0"})
    assert not [e.message for e in validator.iter_errors(pod)]


# --- classification -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "operation", "detail", "expected"),
    [
        (400, Operation.CREATE, "rule violation", CapacityUnavailable),
        (400, Operation.POD, "Invalid ID supplied.", NotFound),
        (400, Operation.READ, "bad filter", Transient),
        (401, Operation.READ, "missing bearer token", AuthFailed),
        (402, Operation.CREATE, "insufficient balance", AuthFailed),
        (403, Operation.CREATE, "forbidden", AuthFailed),
        (404, Operation.POD, "pod not found", NotFound),
        (409, Operation.POD, "conflict", Transient),
        (422, Operation.CREATE, "bad", InvalidSpec),
        (429, Operation.READ, "slow down", RateLimited),
        (500, Operation.CREATE, CAPACITY_MESSAGE, CapacityUnavailable),
        (500, Operation.READ, "boom", Transient),
        (503, Operation.READ, "unavailable", Transient),
        (None, Operation.READ, "You are not authorized", AuthFailed),
        (None, Operation.READ, "weird", Transient),
    ],
)
def test_classification_table(
    status: int | None, operation: Operation, detail: str, expected: type[ProviderError]
) -> None:
    error = classify_failure(
        provider="rp", operation=operation, what="x", status=status, detail=detail
    )
    assert type(error) is expected and error.provider == "rp" and detail in str(error)


# --- logs ---------------------------------------------------------------------------------


def _v2_log_example() -> str:
    try:
        document = json.loads(Path(V2_SPEC).read_text())
    except FileNotFoundError:
        return (
            "id: 2026-06-01T12:02:03Z/000000000001\n"
            'data: {"ts":"2026-06-01T12:02:03Z","source":"container","line":"Model loaded."}\n'
        )
    stream = document["paths"]["/v2/pods/{id}/logs"]["get"]["responses"]["200"]["content"]
    return str(stream["text/event-stream"]["examples"]["logLine"]["value"])


async def _collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


async def test_logs_read_the_documented_event_stream(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    fake.fail(
        "logs",
        httpx.Response(
            200, content=_v2_log_example().encode(), headers={"Content-Type": "text/event-stream"}
        ),
        times=1,
    )
    out = await _collect(provider.logs(created.instance_id, LogOptions(timestamps=True)))
    assert out == b"2026-06-01T12:02:03Z Model loaded.\n"


async def test_logs_tail_and_limit(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())
    fake.logs[created.instance_id] = [(f"2026-03-13T20:00:0{i}Z", f"line {i}") for i in range(5)]
    out = await _collect(provider.logs(created.instance_id, LogOptions(tail_lines=2)))
    assert out == b"line 3\nline 4\n"
    params = fake.routes["logs"].calls.last.request.url.params
    assert (params["source"], params["tail"]) == ("container", "2")
    out = await _collect(provider.logs(created.instance_id, LogOptions(limit_bytes=10)))
    assert out == b"line 0\nlin"
    assert fake.routes["logs"].calls.last.request.url.params["tail"] == "5000"


async def test_logs_since(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())
    await _collect(provider.logs(created.instance_id, LogOptions(since_seconds=90)))
    assert fake.routes["logs"].calls.last.request.url.params["since"] == "2026-03-13T19:58:30Z"


async def test_logs_of_an_unknown_pod_are_not_found(provider: RunPodProvider) -> None:
    with pytest.raises(NotFound):
        await _collect(provider.logs("nope", LogOptions()))


def _endless_stream(first: bytes) -> AsyncIterator[bytes]:
    async def chunks() -> AsyncIterator[bytes]:
        yield first
        await asyncio.sleep(3600)  # the live stream: nothing more for now

    return chunks()


async def test_logs_without_follow_end_when_the_backfill_goes_quiet(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    event = b'data: {"ts":"t1","source":"container","line":"ready"}\n\n'
    fake.fail("logs", httpx.Response(200, content=_endless_stream(event)), times=1)
    out = await asyncio.wait_for(
        _collect(provider.logs(created.instance_id, LogOptions())), timeout=5
    )
    assert out == b"ready\n"


async def test_logs_follow_until_the_stream_ends(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    fake.logs[created.instance_id] = [("t1", "a"), ("t2", "b")]
    out = await _collect(provider.logs(created.instance_id, LogOptions(follow=True)))
    assert out == b"a\nb\n"


async def test_followed_logs_have_no_read_timeout(
    provider: RunPodProvider, fake: FakeRunPod
) -> None:
    created = await provider.create(spec(), offer())
    await _collect(provider.logs(created.instance_id, LogOptions(follow=True)))
    timeout = fake.routes["logs"].calls.last.request.extensions["timeout"]
    assert timeout["read"] is None and timeout["connect"] == 30


async def test_a_broken_log_stream_is_transient(provider: RunPodProvider, fake: FakeRunPod) -> None:
    created = await provider.create(spec(), offer())

    async def breaking() -> AsyncIterator[bytes]:
        yield b'data: {"ts":"t1","source":"container","line":"first"}\n\n'
        raise httpx.ReadError("connection reset")

    fake.fail("logs", httpx.Response(200, content=breaking()), times=1)
    seen: list[bytes] = []
    with pytest.raises(Transient, match="stream broke"):
        async for chunk in provider.logs(created.instance_id, LogOptions(follow=True)):
            seen.append(chunk)
    assert seen == [b"first\n"]


def test_sse_decoding() -> None:
    decoder = SseDecoder()
    lines = [
        ": keep-alive",
        "id: t1",
        'data: {"ts":"t1","source":"container","line":"one"}',
        "",
        'data: {"ts":"t2","source":"system","line":"host event"}',
        "",
        "data: not json",
        "data: second part",
        "",
    ]
    events = [e for e in (decoder.feed(line) for line in lines) if e is not None]
    assert [(e.ts, e.line) for e in events] == [("t1", "one"), ("", "not json\nsecond part")]
    assert decoder.flush() is None


# --- credentials --------------------------------------------------------------------------


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


async def test_the_api_key_and_secret_values_never_leak(
    provider: RunPodProvider, fake: FakeRunPod, debug_logs: pytest.LogCaptureFixture
) -> None:
    secret = "hf_very_secret_value"
    workload = spec(env=(EnvVar("HF_TOKEN", secret, secret=True),))
    errors: list[ProviderError] = []
    # RunPod echoing the key and the body back in its error messages.
    fake.fail("graphql", graphql_error(f"Unauthorized: api key {API_KEY} is invalid"), times=1)
    with pytest.raises(ProviderError) as raised:
        await provider.offers()
    errors.append(raised.value)
    fake.fail("create", problem(422, f"env.HF_TOKEN={secret} with key {API_KEY}"), times=1)
    with pytest.raises(ProviderError) as raised:
        await provider.create(workload, offer())
    errors.append(raised.value)
    fake.fail("list", httpx.ConnectError(f"cannot reach {API_KEY}"), times=None)
    with pytest.raises(ProviderError) as raised:
        await provider.list_ours()
    errors.append(raised.value)
    assert [type(e) for e in errors] == [AuthFailed, InvalidSpec, Transient]
    for error in errors:
        assert API_KEY not in str(error) and secret not in str(error)
        assert "<redacted>" in str(error)
    fake.clear_failures()
    await provider.create(workload, offer())
    assert debug_logs.records  # the retries and the create were logged...
    assert API_KEY not in debug_logs.text and secret not in debug_logs.text  # ...without secrets
    assert API_KEY not in repr(provider)


async def test_an_unset_key_fails_at_construction(tmp_path: Path) -> None:
    from vk_provider.settings.secrets import ConfigError

    with pytest.raises(ConfigError, match="cannot read file"):
        RunPodProvider(make_config(tmp_path / "missing"))


async def test_has_the_provider_methods_its_name_and_log_capabilities(
    provider: RunPodProvider,
) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == "rp"
    assert provider.capabilities.follow_logs and provider.capabilities.log_timestamps


def test_fake_catalogue_type() -> None:
    assert isinstance(FakeRunPod().catalogue[0], FakeGpu)
    assert REST_URL and GRAPHQL_URL


# --- redaction: canaries through every error path ----------------------------------------

_RUNPOD_OPERATIONS = ("offers", "create", "create-lookup", "list", "get", "delete", "logs")


def _canary_answers() -> dict[str, Any]:
    text = canary.echo()
    return {
        "json 500": httpx.Response(500, json={"error": text, "message": text}),
        # Past the 300 characters a message keeps: cut first, a secret would half survive.
        "long 500": httpx.Response(500, json={"error": "x" * 285 + " " + canary.KEY}),
        "json 400": httpx.Response(400, json={"title": text, "detail": text}),
        "text 422": httpx.Response(422, text=text),
        "graphql errors": httpx.Response(200, json={"errors": [{"message": text}]}),
        "malformed": httpx.Response(200, content=b"<html>" + text.encode()),
        "transport": httpx.ConnectError(f"proxy refused: {text}"),
    }


@pytest.mark.parametrize("answer", list(_canary_answers()))
@pytest.mark.parametrize("operation", _RUNPOD_OPERATIONS)
async def test_no_canary_leaks_from_any_error_path(
    operation: str, answer: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "canary-key"
    key_file.write_text(canary.KEY + "\n")
    fake = FakeRunPod()
    adapter = RunPodProvider(
        make_config(key_file, name="rp"),
        transport=fake.transport(),
        retry=RetryPolicy(attempts=2, sleep=Sleeps()),
        log_idle_seconds=0.05,
        clock=lambda: NOW,
    )
    workload = spec(
        env=(EnvVar("PLAIN", "visible"), EnvVar("HF_TOKEN", canary.SECRET, secret=True))
    )
    created = await adapter.create(spec(attempt=9), offer())
    route = {
        "offers": "graphql",
        "create": "create",
        "create-lookup": "list",
        "list": "list",
        "get": "get",
        "delete": "delete",
        "logs": "logs",
    }[operation]
    fake.fail(route, _canary_answers()[answer], times=None)
    returned: list[object] = []
    error: BaseException | None = None
    try:
        if operation == "offers":
            returned.append(await adapter.offers())
        elif operation.startswith("create"):
            returned.append(await adapter.create(workload, offer()))
        elif operation == "list":
            returned.append(await adapter.list_ours())
        elif operation == "get":
            returned.append(await adapter.get(created.instance_id))
        elif operation == "delete":
            returned.append(await adapter.delete(created.instance_id, grace_seconds=0))
        else:
            returned.append([c async for c in adapter.logs(created.instance_id, LogOptions())])
    except ProviderError as exc:
        error = exc
    finally:
        await adapter.close()
    # A spec's secret env values are known to the adapter while it creates that spec.
    values = (canary.KEY, canary.SECRET) if operation.startswith("create") else (canary.KEY,)
    canary.assert_clean(error=error, records=caplog.records, returned=returned, values=values)
