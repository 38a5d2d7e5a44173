"""The Lambda Cloud adapter against a stateful respx fake shaped by the published API document.

``tests.contract.harness_lambda.FakeLambda`` validates every request the adapter sends (and
every documented response the fake gives) against ``lambda-cloud-openapi-1.8.3.json`` with
openapi-core, so each test here also checks request shapes. Time is simulated
(``FakeClock``): rate limits and retry waits cost nothing and are asserted exactly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.contract.harness_lambda import (
    API_KEY,
    FAILURES,
    FakeClock,
    FakeLambda,
    OpenAPIRequest,
    error_body,
    lines,
    make_config,
    make_provider,
    openapi,
    spec_path,
)
from tests.unit import canary
from tests.workloads import workload
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.envvar import Port
from vk_provider.domain.errors import (
    AuthFailed,
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
    RateLimited,
    Transient,
)
from vk_provider.domain.models import EnvVar, InstanceState, LogOptions, Offer, WorkloadSpec
from vk_provider.domain.placement import PodShape
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.lambda_cloud.adapter import LAUNCH_VISIBILITY_SECONDS, LambdaCloudProvider
from vk_provider_adapters.lambda_cloud.envelope import classify_failure
from vk_provider_adapters.lambda_cloud.instances import (
    STATES,
    TAG_MANAGED,
    TAG_POD_UID,
    TAG_PROVIDER,
    TAG_REQUEST_ID,
)
from vk_provider_adapters.lambda_cloud.offers import canonical_gpu, gpu_memory_gib, parse_offers
from vk_provider_adapters.lambda_cloud.ratelimit import RateLimiter
from vk_provider_adapters.transport import RetryPolicy, parse_retry_after

UID = "0f5e2a8c-1b2d-4e6f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "lambda-key"
    path.write_text(API_KEY + "\n")
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> FakeLambda:
    return FakeLambda(clock=clock)


@pytest.fixture
async def provider(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> AsyncIterator[LambdaCloudProvider]:
    adapter = make_provider(fake, clock, key_file)
    try:
        yield adapter
    finally:
        await adapter.close()


def make_spec(pod_uid: str = UID, attempt: int = 0, **overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "pod_uid": pod_uid,
        "namespace": "ml",
        "pod_name": "trainer",
        "container_name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "command": ("python", "train.py"),
        "env": (EnvVar("TOKEN", "hunter2", secret=True),),
        "gpu_count": 1,
        "attempt": attempt,
    }
    fields.update(overrides)
    return workload(**fields)


async def a10(provider: LambdaCloudProvider, region: str = "us-west-1") -> Offer:
    return next(o for o in await provider.offers() if o.sku == "gpu_1x_a10" and o.region == region)


def ours(
    pod_uid: str = UID, attempt: int = 0, provider: str = "lambda-test"
) -> list[dict[str, str]]:
    return [
        {"key": TAG_MANAGED, "value": "true"},
        {"key": TAG_PROVIDER, "value": provider},
        {"key": TAG_POD_UID, "value": pod_uid},
        {"key": TAG_REQUEST_ID, "value": f"{pod_uid}.{attempt}"},
    ]


# --- offers -------------------------------------------------------------------------------


async def test_offers_one_per_type_and_region_with_capacity(provider: LambdaCloudProvider) -> None:
    offers = await provider.offers()
    keys = {o.key for o in offers}
    assert keys == {
        "lambda-test/gpu_1x_a10/us-west-1",
        "lambda-test/gpu_1x_a10/us-east-1",
        "lambda-test/gpu_1x_h100_pcie/us-west-3",
        "lambda-test/gpu_8x_h100_sxm5/us-south-1",
        "lambda-test/gpu_8x_a100_80gb_sxm4/us-east-1",
        "lambda-test/gpu_1x_gh200/us-west-1",
        "lambda-test/gpu_1x_a6000/us-south-1",
        "lambda-test/gpu_1x_a6000/europe-central-1",
    }  # gpu_1x_a100_sxm4 has no region with capacity
    assert [o.price_per_hour for o in offers] == sorted(o.price_per_hour for o in offers)
    h100 = next(o for o in offers if o.sku == "gpu_8x_h100_sxm5")
    assert h100 == Offer(
        provider="lambda-test",
        sku="gpu_8x_h100_sxm5",
        region="us-south-1",
        gpu_model="H100-SXM",
        gpu_count=8,
        gpu_memory_gib=80.0,
        vcpus=208,
        memory_gib=1800,
        price_per_hour=23.92,
        spot=False,
        available=1,
        startup_seconds=h100.startup_seconds,
    )
    assert not any(o.spot for o in offers)


@pytest.mark.parametrize(
    ("type_name", "description", "model", "memory"),
    [
        ("gpu_1x_h100_pcie", "H100 (80 GB PCIe)", "H100-PCIE", 80),
        ("gpu_8x_h100_sxm5", "H100 (80 GB SXM5)", "H100-SXM", 80),
        ("gpu_8x_h100_sxm5gdr", "H100 (80 GB SXM5)", "H100-SXM", 80),
        ("gpu_1x_h100_sxm5", "", "H100-SXM", 80),
        ("gpu_1x_a100_sxm4", "A100 (40 GB SXM4)", "A100-40GB", 40),
        ("gpu_1x_a100", "A100 (40 GB PCIe)", "A100-40GB", 40),
        ("gpu_8x_a100_80gb_sxm4", "A100 (80 GB SXM4)", "A100-80GB", 80),
        ("gpu_1x_a100_sxm4_80gb", "", "A100-80GB", 80),
        ("gpu_8x_a100", "", "A100", 0),
        ("gpu_1x_gh200", "GH200 (96 GB)", "GH200", 96),
        ("gpu_1x_a10", "A10 (24 GB PCIe)", "A10", 24),
        ("gpu_1x_a6000", "A6000 (48 GB)", "A6000", 48),
        ("gpu_2x_a6000", "", "A6000", 48),
        ("gpu_1x_rtx6000", "RTX 6000 (24 GB)", "RTX6000", 24),
        ("gpu_8x_v100", "Tesla V100 (16 GB)", "V100", 16),
        ("gpu_8x_b200_sxm6", "B200 (180 GB SXM6)", "B200", 180),
        # Unknown models: normalised, never an error.
        ("gpu_2x_l40s", "L40S (48 GB)", "L40S", 48),
        ("special-offer", "NVIDIA RTX PRO 6000 (96 GB)", "RTXPRO6000", 96),
        ("gpu_1x_mystery", "", "MYSTERY", 0),
        ("", "", None, 0),
    ],
)
def test_gpu_names_and_memory(
    type_name: str, description: str, model: str | None, memory: float
) -> None:
    assert canonical_gpu(type_name, description) == model
    assert gpu_memory_gib(type_name, description) == memory


@given(type_name=st.text(max_size=40), description=st.text(max_size=60))
def test_gpu_parsing_never_crashes(type_name: str, description: str) -> None:
    model = canonical_gpu(type_name, description)
    assert model is None or (model and all(c.isalnum() or c == "-" for c in model))
    memory = gpu_memory_gib(type_name, description)
    assert memory >= 0 and memory != float("inf")


async def test_offers_honour_the_configuration(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = make_provider(
        fake,
        clock,
        key_file,
        instance_types=["gpu_1x_a10", "gpu_1x_a6000", "gpu_8x_h100_sxm5"],
        regions=["us-west-1", "us-south-1"],
        max_price_per_hour=5.0,
    )
    try:
        keys = [o.key for o in await adapter.offers()]
    finally:
        await adapter.close()
    assert keys == ["lambda-test/gpu_1x_a10/us-west-1", "lambda-test/gpu_1x_a6000/us-south-1"]


def _types_payload(fake: FakeLambda) -> dict[str, Any]:
    return {
        name: {
            "instance_type": kind,
            "regions_with_capacity_available": [{"name": r, "description": "x"} for r in regions],
        }
        for name, (kind, regions) in fake.types.items()
    }


def test_a_malformed_instance_type_is_skipped(
    fake: FakeLambda, caplog: pytest.LogCaptureFixture
) -> None:
    data = _types_payload(fake)
    del data["gpu_1x_a10"]["instance_type"]["price_cents_per_hour"]
    offers = parse_offers(data, provider="p")
    assert offers and all(o.sku != "gpu_1x_a10" for o in offers)
    assert "price_cents_per_hour" in caplog.text


async def test_offers_malformed_throughout_are_transient(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    fake.fail("instance-types", 200, {"data": {"gpu_x": {"instance_type": {"name": "gpu_x"}}}})
    with pytest.raises(Transient, match="gpu_description"):
        await provider.offers()
    fake.fail("instance-types", 200, {"data": ["not", "an", "object"]})
    with pytest.raises(Transient, match="data is list, expected an object"):
        await provider.offers()


# --- create -------------------------------------------------------------------------------


async def test_launch_request_matches_the_spec_and_carries_our_tags(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    fw1, fw2 = (fake.add_ruleset(name, "us-west-1") for name in ("web", "office"))
    adapter = make_provider(fake, clock, key_file, firewall_ruleset_ids=[fw1, fw2])
    try:
        offer = await a10(adapter)
        instance = await adapter.create(make_spec(attempt=3), offer)
    finally:
        await adapter.close()
    (body,) = fake.launch_bodies
    assert body["region_name"] == "us-west-1"
    assert body["instance_type_name"] == "gpu_1x_a10"
    assert body["ssh_key_names"] == ["vk-test-key"]
    assert body["name"] == f"vk-{UID}.3"
    assert body["tags"] == ours(attempt=3)
    assert body["firewall_rulesets"] == [{"id": fw1}, {"id": fw2}]
    assert body["user_data"].startswith("#cloud-config\n")
    assert "--gpus all" in body["user_data"]
    assert "hunter2" not in body["user_data"]  # sealed, see test_no_secret_in_any_form...
    assert instance.state is InstanceState.PENDING
    assert instance.instance_id in fake.instances
    assert (instance.pod_uid, instance.attempt) == (UID, 3)
    assert instance.offer_key == offer.key
    assert instance.price_per_hour == pytest.approx(0.75)


async def test_every_request_is_authorised_with_the_bearer_key(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance = await provider.create(make_spec(), await a10(provider))
    await provider.get(instance.instance_id)
    await provider.delete(instance.instance_id, grace_seconds=0)
    assert {r.headers["Authorization"] for r in fake.requests} == {f"Bearer {API_KEY}"}


async def test_launch_and_terminate_bodies_validate_against_the_openapi_document(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance = await provider.create(make_spec(), await a10(provider))
    await provider.delete(instance.instance_id, grace_seconds=0)
    document = openapi()
    assert document is not None
    launches, terminates = fake.calls("launch"), fake.calls("terminate")
    assert len(launches) == 1 and len(terminates) == 1
    assert json.loads(terminates[0].content) == {"instance_ids": [instance.instance_id]}
    for request in [*launches, *terminates, *fake.requests]:
        document.validate_request(OpenAPIRequest(request))
    # The check has teeth: a tag key the API refuses fails it.
    body = json.loads(launches[0].content)
    body["tags"][0]["key"] = "Not-Allowed"
    tampered = httpx.Request(
        "POST", launches[0].url, headers=launches[0].headers, content=json.dumps(body).encode()
    )
    with pytest.raises(Exception, match="does not match"):
        document.validate_request(OpenAPIRequest(tampered))


async def test_create_is_idempotent_by_request_id(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    first = await provider.create(make_spec(), offer)
    second = await provider.create(make_spec(), offer)
    assert second.instance_id == first.instance_id
    assert len(fake.calls("launch")) == 1
    other = await provider.create(make_spec(attempt=1), offer)
    assert other.instance_id != first.instance_id
    assert len(fake.calls("launch")) == 2


async def test_create_finds_an_instance_made_before_a_restart(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    existing = fake.add_instance(name=f"vk-{UID}.0", tags=ours(), status="active")
    adapter = make_provider(fake, clock, key_file)
    try:
        instance = await adapter.create(make_spec(), await a10(adapter))
    finally:
        await adapter.close()
    assert instance.instance_id == existing
    assert instance.state is InstanceState.RUNNING
    assert fake.calls("launch") == []


async def test_create_while_the_list_lags_does_not_launch_twice(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    first = await provider.create(make_spec(), offer)
    hidden = fake.instances.pop(first.instance_id)  # Lambda's list and get do not show it yet
    again = await provider.create(make_spec(), offer)
    assert again.instance_id == first.instance_id
    got = await provider.get(first.instance_id)  # a 404 moments after launch: still PENDING
    assert got.state is InstanceState.PENDING
    assert len(fake.calls("launch")) == 1
    fake.instances[first.instance_id] = hidden
    assert (await provider.get(first.instance_id)).state is InstanceState.PENDING  # booting


async def test_a_launch_unseen_for_long_is_not_found(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    first = await provider.create(make_spec(), await a10(provider))
    del fake.instances[first.instance_id]
    clock.now += LAUNCH_VISIBILITY_SECONDS + 1
    with pytest.raises(NotFound):
        await provider.get(first.instance_id)


async def test_launches_are_twelve_seconds_apart_and_requests_one_second(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    for attempt in range(3):
        await provider.create(make_spec(attempt=attempt), offer)
    launches = [t for endpoint, t in fake.times if endpoint == "launch"]
    assert len(launches) == 3
    assert all(b - a >= 12 for a, b in itertools.pairwise(launches))
    every = [t for _, t in fake.times]
    assert all(b - a >= 1 for a, b in itertools.pairwise(every))


async def test_concurrent_creates_of_one_request_launch_once(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    results = await asyncio.gather(*(provider.create(make_spec(), offer) for _ in range(3)))
    assert len({i.instance_id for i in results}) == 1
    assert len(fake.calls("launch")) == 1


async def test_a_bad_pod_uid_is_invalid_before_any_request(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    before = len(fake.requests)
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(make_spec(pod_uid="has space"), offer)
    assert raised.value.field == "metadata.uid"
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(make_spec(args=("nul\0",)), offer)
    assert raised.value.field == "spec.containers[0].args[0]"
    assert len(fake.requests) == before


async def test_another_providers_offer_is_refused(provider: LambdaCloudProvider) -> None:
    offer = Offer("elsewhere", "gpu_1x_a10", "us-west-1", "A10", 1, 24, 30, 200, 0.75)
    with pytest.raises(CapacityUnavailable):
        await provider.create(make_spec(), offer)


async def test_a_cpu_only_type_gets_no_gpus_flag(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    await provider.create(make_spec(gpu_count=0), offer)
    assert "--gpus" not in fake.launch_bodies[0]["user_data"]


async def test_an_empty_launch_response_is_transient(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    fake.fail("launch", 200, {"data": {"instance_ids": []}})
    with pytest.raises(Transient, match="no instance id"):
        await provider.create(make_spec(), offer)


# --- the firewall ---------------------------------------------------------------------------

CLUSTER = ["203.0.113.0/24", "198.51.100.7/32"]  # the cluster's egress (TEST-NET ranges)
OURS = "vk-provider-lambda-test"  # the ruleset's name: vk-provider-<provider name>


def serving(pod_uid: str = UID, attempt: int = 0) -> WorkloadSpec:
    """A pod declaring TCP 8080 twice (two containers), UDP 5353 and SCTP 9999."""
    return make_spec(
        pod_uid,
        attempt,
        containers=(
            ContainerSpec("web", "img:1", ports=(Port(8080), Port(5353, "UDP"))),
            ContainerSpec("metrics", "img:1", ports=(Port(8080), Port(9999, "SCTP"))),
        ),
    )


def rule(protocol: str, port: int, source: str, what: str) -> dict[str, Any]:
    return {
        "protocol": protocol,
        "port_range": [port, port],
        "source_network": source,
        "description": f"lambda-test: {what}",
    }


def ssh_rules(sources: list[str] = CLUSTER, port: int = 22) -> list[dict[str, Any]]:
    return [rule("tcp", port, source, "SSH of the vk-provider agent") for source in sources]


def port_rules(protocol: str, port: int, sources: list[str] = CLUSTER) -> list[dict[str, Any]]:
    return [rule(protocol, port, s, f"pods' port {port}/{protocol}") for s in sources]


def firewalled(
    fake: FakeLambda, clock: FakeClock, key_file: Path, **firewall: Any
) -> LambdaCloudProvider:
    return make_provider(fake, clock, key_file, firewall={"source_cidrs": CLUSTER, **firewall})


def firewall_calls(fake: FakeLambda) -> list[httpx.Request]:
    endpoints = ("firewall-rulesets", "add-firewall-ruleset", "update-firewall-ruleset")
    return [r for e in endpoints for r in fake.calls(e)]  # type: ignore[arg-type]


async def test_without_firewall_no_firewall_is_read_or_written(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    await provider.create(serving(), await a10(provider))
    assert firewall_calls(fake) == []
    assert not any("/firewall-rules" in str(r.url) for r in fake.requests)
    (body,) = fake.launch_bodies
    assert "firewall_rulesets" not in body


async def test_the_first_launch_in_a_region_makes_our_ruleset_and_names_it_first(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    theirs = fake.add_ruleset("office", "us-west-1")
    adapter = make_provider(
        fake,
        clock,
        key_file,
        firewall={"source_cidrs": CLUSTER},
        firewall_ruleset_ids=[theirs],
    )
    try:
        await adapter.create(serving(), await a10(adapter))
    finally:
        await adapter.close()
    (made,) = fake.calls("add-firewall-ruleset")
    # SSH for the agent first, then each declared TCP and UDP port once; SCTP has no rule.
    assert json.loads(made.content) == {
        "name": OURS,
        "region": "us-west-1",
        "rules": [*ssh_rules(), *port_rules("tcp", 8080), *port_rules("udp", 5353)],
    }
    ours_id = next(i for i, r in fake.rulesets.items() if r["name"] == OURS)
    (body,) = fake.launch_bodies
    assert body["firewall_rulesets"] == [{"id": ours_id}, {"id": theirs}]
    # In that order: the ruleset exists before the VM that names it.
    order = [e for e, _ in fake.times if e in ("add-firewall-ruleset", "launch")]
    assert order == ["add-firewall-ruleset", "launch"]
    assert fake.ruleset(ours_id)["instance_ids"] == list(fake.instances)


async def test_a_ruleset_that_lets_the_ports_in_already_is_not_written(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        await adapter.create(serving(attempt=0), offer)
        await adapter.create(serving(attempt=1), offer)  # the same ports: nothing to add
    finally:
        await adapter.close()
    assert len(fake.calls("firewall-rulesets")) == 2  # read on every create, written once
    assert len(fake.calls("add-firewall-ruleset")) == 1
    assert fake.calls("update-firewall-ruleset") == []
    assert len(fake.launch_bodies) == 2
    assert fake.launch_bodies[0]["firewall_rulesets"] == fake.launch_bodies[1]["firewall_rulesets"]


@pytest.mark.parametrize(
    "wide",
    [
        {"protocol": "all", "port_range": [1, 65535], "source_network": "0.0.0.0/0"},
        {"protocol": "tcp", "port_range": [1, 65535], "source_network": "198.51.0.0/16"},
    ],
)
async def test_wider_rules_of_people_cover_what_a_pod_needs(
    fake: FakeLambda, clock: FakeClock, key_file: Path, wide: dict[str, Any]
) -> None:
    # People's rules in our ruleset: what they let in needs no rule of ours.
    rules = [
        *ssh_rules(),
        {**wide, "description": "people's"},
        *port_rules("tcp", 8080, ["203.0.113.0/24"]),
        {"protocol": "udp", "port_range": [5000, 6000], "source_network": "0.0.0.0/0",
         "description": "people's"},
    ]  # fmt: skip
    fake.add_ruleset(OURS, "us-west-1", rules)
    adapter = firewalled(fake, clock, key_file, source_cidrs=["198.51.100.7"])
    try:
        await adapter.create(serving(), await a10(adapter))
    finally:
        await adapter.close()
    assert fake.calls("add-firewall-ruleset") == []
    assert fake.calls("update-firewall-ruleset") == []


async def test_a_new_port_widens_our_ruleset_keeping_every_rule_it_had(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    peoples = {"protocol": "icmp", "source_network": "0.0.0.0/0", "description": "ping"}
    office = {"protocol": "tcp", "port_range": [22, 22], "source_network": "192.0.2.10",
              "description": "office SSH"}  # fmt: skip
    had = [peoples, office, *ssh_rules(), *port_rules("tcp", 8080)]
    ruleset_id = fake.add_ruleset(OURS, "us-west-1", had)
    adapter = firewalled(fake, clock, key_file)
    try:
        await adapter.create(serving(), await a10(adapter))
    finally:
        await adapter.close()
    (update,) = fake.calls("update-firewall-ruleset")
    assert update.url.path.endswith(f"/firewall-rulesets/{ruleset_id}")
    # Every rule it had, as it had it, then only what was missing: UDP 5353.
    assert json.loads(update.content) == {"rules": [*had, *port_rules("udp", 5353)]}
    assert fake.calls("add-firewall-ruleset") == []
    (body,) = fake.launch_bodies
    assert body["firewall_rulesets"] == [{"id": ruleset_id}]


async def test_rulesets_of_other_names_or_regions_are_not_ours_and_the_oldest_of_ours_is_used(
    fake: FakeLambda, clock: FakeClock, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_ruleset(OURS, "us-east-1")  # ours, another region
    fake.add_ruleset("vk-provider-another-agent", "us-west-1")
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        await adapter.create(serving(attempt=0), offer)
        assert len(fake.calls("add-firewall-ruleset")) == 1  # none of ours in us-west-1
        first = fake.launch_bodies[0]["firewall_rulesets"][0]["id"]
        assert fake.rulesets[first]["region"]["name"] == "us-west-1"
        fake.add_ruleset(OURS, "us-west-1")  # a second of our name, younger
        await adapter.create(serving(attempt=1), offer)
    finally:
        await adapter.close()
    assert fake.launch_bodies[1]["firewall_rulesets"] == [{"id": first}]
    assert f"2 firewall rulesets are named {OURS!r} in us-west-1" in caplog.text


async def test_ssh_is_let_in_from_its_own_sources_on_the_configured_port(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = make_provider(
        fake,
        clock,
        key_file,
        ssh_port=2222,
        firewall={
            "source_cidrs": ["203.0.113.0/24"],
            "ssh_source_cidrs": ["192.0.2.0/28"],
            "ruleset_name": "gpu-pods",
        },
    )
    try:
        await adapter.create(make_spec(), await a10(adapter))  # no ports declared
    finally:
        await adapter.close()
    (made,) = fake.calls("add-firewall-ruleset")
    body = json.loads(made.content)
    assert body["name"] == "gpu-pods"
    assert body["rules"] == ssh_rules(["192.0.2.0/28"], port=2222)


async def test_us_south_1_has_no_firewall_so_launches_name_no_ruleset_and_warn_once(
    fake: FakeLambda, clock: FakeClock, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        south = next(o for o in await adapter.offers() if o.region == "us-south-1")
        await adapter.create(serving(attempt=0), south)
        await adapter.create(serving(attempt=1), south)
        await adapter.create(serving(attempt=2), offer)  # elsewhere it is managed
    finally:
        await adapter.close()
    assert [len(b.get("firewall_rulesets", [])) for b in fake.launch_bodies] == [0, 0, 1]
    assert len(fake.calls("firewall-rulesets")) == 1
    warned = [r for r in caplog.records if "applies no firewall rules in us-south-1" in r.message]
    assert len(warned) == 1 and warned[0].levelno == logging.WARNING


@pytest.mark.parametrize(
    ("endpoint", "status", "body", "expected"),
    [
        ("firewall-rulesets", 401, FAILURES["auth"][1], AuthFailed),
        ("firewall-rulesets", 403,
         error_body("global/account-inactive", "Your account is inactive.", "Verify."),
         AuthFailed),
        ("add-firewall-ruleset", 400,
         error_body("global/quota-exceeded", "Quota exceeded.", "Contact Support."),
         CapacityUnavailable),
        ("add-firewall-ruleset", 400, FAILURES["invalid"][1], InvalidSpec),
        ("add-firewall-ruleset", 409,
         error_body("global/internal-error", "An internal server error occurred.", "Later."),
         Transient),
        ("add-firewall-ruleset", 503, FAILURES["transient"][1], Transient),
        ("update-firewall-ruleset", 404,
         error_body("global/object-does-not-exist",
                    "Firewall ruleset does not exist or you do not have permission to access it.",
                    "Check your firewall ruleset ID and try again."),
         Transient),
        ("update-firewall-ruleset", 400, FAILURES["invalid"][1], InvalidSpec),
        ("firewall-rulesets", 200, {"data": [{"name": OURS, "region": {"name": "us-west-1"}}]},
         Transient),
    ],
)  # fmt: skip
async def test_a_firewall_failure_fails_the_create_before_any_vm_exists(
    fake: FakeLambda,
    clock: FakeClock,
    key_file: Path,
    endpoint: Any,
    status: int,
    body: dict[str, Any],
    expected: type[ProviderError],
) -> None:
    if endpoint == "update-firewall-ruleset":
        fake.add_ruleset(OURS, "us-west-1", ssh_rules())  # so the pod's ports need an update
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        fake.fail(endpoint, status, body, times=None)
        with pytest.raises(ProviderError) as raised:
            await adapter.create(serving(), offer)
        assert type(raised.value) is expected, repr(raised.value)
        assert raised.value.provider == "lambda-test"
        assert fake.calls("launch") == [] and fake.instances == {}  # nothing leaked
        # A ruleset made, maybe, by a request that reached Lambda is never sent again.
        assert len(fake.calls("add-firewall-ruleset")) <= 1
        fake.clear_failures()
        await adapter.create(serving(), offer)  # the agent's next try
    finally:
        await adapter.close()
    assert len(fake.instances) == 1


async def test_a_ruleset_deleted_by_someone_is_made_again_by_the_next_create(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        await adapter.create(serving(attempt=0), offer)
        fake.rulesets.clear()
        await adapter.create(serving(attempt=1), offer)
    finally:
        await adapter.close()
    assert len(fake.calls("add-firewall-ruleset")) == 2
    (again,) = fake.rulesets
    assert fake.launch_bodies[1]["firewall_rulesets"] == [{"id": again}]


async def test_firewall_bodies_validate_against_the_openapi_document(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    adapter = firewalled(fake, clock, key_file)
    try:
        offer = await a10(adapter)
        await adapter.create(serving(attempt=0), offer)
        await adapter.create(
            make_spec(
                attempt=1, containers=(ContainerSpec("dns", "img:1", ports=(Port(53, "UDP"),)),)
            ),
            offer,
        )
    finally:
        await adapter.close()
    document = openapi()
    assert document is not None
    (made,), (update,) = fake.calls("add-firewall-ruleset"), fake.calls("update-firewall-ruleset")
    for request in (made, update, *fake.calls("firewall-rulesets"), *fake.calls("launch")):
        document.validate_request(OpenAPIRequest(request))
    # The check has teeth: a protocol Lambda's NetworkProtocol does not name fails it.
    body = json.loads(update.content)
    body["rules"][0]["protocol"] = "sctp"
    tampered = httpx.Request(
        "PATCH", update.url, headers=update.headers, content=json.dumps(body).encode()
    )
    with pytest.raises(Exception, match="sctp"):
        document.validate_request(OpenAPIRequest(tampered))


@pytest.mark.parametrize(
    ("firewall", "name", "field"),
    [
        ({"source_cidrs": []}, "lambda-test", "firewall.source_cidrs"),
        ({"source_cidrs": ["203.0.113.7/24"]}, "lambda-test", "host bits set"),
        ({"source_cidrs": ["2001:db8::/32"]}, "lambda-test", "is not an IPv4 CIDR"),
        ({"source_cidrs": ["cluster"]}, "lambda-test", "firewall.source_cidrs"),
        ({"source_cidrs": CLUSTER, "ssh_source_cidrs": []}, "lambda-test",
         "firewall.ssh_source_cidrs"),
        ({"source_cidrs": CLUSTER, "ruleset_name": "x" * 65}, "lambda-test",
         "firewall.ruleset_name"),
        ({"source_cidrs": CLUSTER}, "a" * 60, "firewall.ruleset_name"),
        ({"source_cidrs": CLUSTER, "cidrs": CLUSTER}, "lambda-test", "firewall.cidrs"),
    ],
)  # fmt: skip
def test_a_bad_firewall_configuration_names_the_field(
    key_file: Path, firewall: dict[str, Any], name: str, field: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(field)):
        make_config(key_file, name=name, firewall=firewall)


def test_the_firewall_configuration_is_normalised_and_ssh_defaults_to_the_sources(
    key_file: Path,
) -> None:
    config = make_config(key_file, firewall={"source_cidrs": ["203.0.113.7", " 10.0.0.0/8 "]})
    assert config.firewall is not None
    assert config.firewall.source_cidrs == ["203.0.113.7/32", "10.0.0.0/8"]
    assert config.firewall.ssh_sources == config.firewall.source_cidrs
    assert config.firewall.name_for(config.name) == OURS
    assert make_config(key_file).firewall is None  # not managed unless configured


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, FAILURES["capacity"][1], CapacityUnavailable),
        (400, error_body("global/quota-exceeded", "Quota exceeded.", "Ask."), CapacityUnavailable),
        (400, FAILURES["invalid"][1], InvalidSpec),
        (400, error_body("instance-operations/launch/file-system-in-wrong-region", "x"),
         InvalidSpec),
        (401, FAILURES["auth"][1], AuthFailed),
        (403, error_body("global/account-inactive", "Inactive.", "Verify."), AuthFailed),
        (403, error_body("global/invalid-address", "Bad address.", "Fix it."), AuthFailed),
        (404, error_body("global/object-does-not-exist", "No SSH key.", "Check."),
         CapacityUnavailable),
        (400, error_body("global/something-new", "New."), InvalidSpec),
        (503, FAILURES["transient"][1], Transient),
        (500, b"<html>Internal Server Error</html>", Transient),
        (418, b"teapot", Transient),
    ],
)  # fmt: skip
async def test_launch_errors_land_in_their_class(
    fake: FakeLambda,
    provider: LambdaCloudProvider,
    status: int,
    body: dict[str, Any] | bytes,
    expected: type[ProviderError],
) -> None:
    offer = await a10(provider)
    fake.fail("launch", status, body, times=None)
    with pytest.raises(ProviderError) as raised:
        await provider.create(make_spec(), offer)
    assert type(raised.value) is expected, repr(raised.value)
    assert raised.value.provider == "lambda-test"
    assert "Lambda launch: HTTP" in str(raised.value)
    # A launch that may have reached Lambda is never sent twice.
    assert len(fake.calls("launch")) == 1


async def test_a_key_deleted_after_registration_is_capacity_then_registered_again(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    offer = await a10(provider)
    await provider.create(make_spec(), offer)
    fake.ssh_keys.clear()  # someone deletes the agent's key in the console
    with pytest.raises(CapacityUnavailable, match="SSH key 'vk-test-key' does not exist"):
        await provider.create(make_spec(attempt=1), offer)
    await provider.create(make_spec(attempt=1), offer)
    assert len(fake.calls("add-ssh-key")) == 2
    assert "vk-test-key" in fake.ssh_keys


async def test_429_with_retry_after_waits_that_long_then_succeeds(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    fake.fail("list", 429, FAILURES["rate_limit"][1], headers={"Retry-After": "7"})
    assert await provider.list_ours() == []
    times = [t for endpoint, t in fake.times if endpoint == "list"]
    assert len(times) == 2 and times[1] - times[0] >= 7


async def test_429_without_retry_after_backs_off_exponentially(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    fake.fail("list", 429, FAILURES["rate_limit"][1], times=2)
    assert await provider.list_ours() == []
    times = [t for endpoint, t in fake.times if endpoint == "list"]
    assert len(times) == 3
    assert times[1] - times[0] >= 0.5 and times[2] - times[1] >= 1.0  # first_wait 0.5, doubling


@pytest.mark.parametrize(("header", "retry_after"), [({"Retry-After": "3"}, 3.0), ({}, None)])
async def test_429_until_retries_run_out_is_rate_limited(
    fake: FakeLambda,
    provider: LambdaCloudProvider,
    header: dict[str, str],
    retry_after: float | None,
) -> None:
    fake.fail("get", 429, FAILURES["rate_limit"][1], headers=header, times=None)
    with pytest.raises(RateLimited) as raised:
        await provider.get("abc")
    assert raised.value.retry_after == retry_after
    assert len(fake.calls("get")) == 3  # RetryPolicy(attempts=3) in make_provider


async def test_a_long_retry_after_goes_back_to_the_agent_at_once(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    fake.fail("list", 429, FAILURES["rate_limit"][1], headers={"Retry-After": "120"})
    with pytest.raises(RateLimited) as raised:
        await provider.list_ours()
    assert raised.value.retry_after == 120
    assert len(fake.calls("list")) == 1
    # Later calls are held back, but no longer than max_retry_after (10 s here).
    before = clock.now
    await provider.list_ours()
    assert 9 <= clock.now - before <= 11


async def test_5xx_is_retried_then_succeeds(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    fake.fail("list", 502, b"Bad Gateway", times=2)
    assert await provider.list_ours() == []
    assert len(fake.calls("list")) == 3


async def test_5xx_until_retries_run_out_is_transient(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    fake.fail("get", 503, FAILURES["transient"][1], times=None)
    with pytest.raises(Transient, match="provider/internal-unavailable"):
        await provider.get("abc")
    assert len(fake.calls("get")) == 3


class FlakyTransport(httpx.AsyncBaseTransport):
    """Raises the queued errors for the next requests (to ``only`` if given), then passes."""

    def __init__(self, inner: httpx.AsyncBaseTransport, only: str | None = None) -> None:
        self._inner = inner
        self.only = only
        self.errors: list[Exception] = []
        self.raised = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.errors and (self.only is None or request.url.path.endswith(self.only)):
            self.raised += 1
            raise self.errors.pop(0)
        return await self._inner.handle_async_request(request)


def flaky_provider(
    fake: FakeLambda, clock: FakeClock, key_file: Path, transport: FlakyTransport
) -> LambdaCloudProvider:
    return make_provider(
        fake,
        clock,
        key_file,
        transport=transport,
        retry=RetryPolicy(
            attempts=3, backoff_seconds=0.5, max_backoff_seconds=2.0, max_retry_after_seconds=30.0
        ),
    )


async def test_connection_errors_are_retried(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    transport = FlakyTransport(fake.transport)
    transport.errors += [httpx.ConnectError("refused"), httpx.ReadTimeout("slow")]
    adapter = flaky_provider(fake, clock, key_file, transport)
    try:
        assert await adapter.list_ours() == []
    finally:
        await adapter.close()
    assert transport.raised == 2


async def test_a_launch_is_retried_only_when_it_was_never_sent(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    transport = FlakyTransport(fake.transport, only="/instance-operations/launch")
    adapter = flaky_provider(fake, clock, key_file, transport)
    try:
        offer = await a10(adapter)
        transport.errors.append(httpx.ConnectError("refused"))
        await adapter.create(make_spec(), offer)  # never left this machine: retried
        assert transport.raised == 1
        assert len(fake.calls("launch")) == 1
        transport.errors += [httpx.ReadTimeout("no answer"), httpx.ReadTimeout("no answer")]
        with pytest.raises(Transient, match="timed out"):
            await adapter.create(make_spec(attempt=1), offer)  # may have launched: not resent
        assert transport.raised == 2
    finally:
        await adapter.close()


async def test_connection_errors_until_retries_run_out_are_transient(
    fake: FakeLambda, clock: FakeClock, key_file: Path
) -> None:
    transport = FlakyTransport(fake.transport)
    transport.errors += [httpx.ConnectError("down") for _ in range(5)]
    adapter = flaky_provider(fake, clock, key_file, transport)
    try:
        with pytest.raises(Transient, match="ConnectError: down"):
            await adapter.list_ours()
    finally:
        await adapter.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"data": [{"id": "abc", "sta', "not JSON"),
        (b"", "not JSON"),
        (b'{"result": []}', "no 'data' (keys: result)"),
        (b"[1, 2]", "body is list, expected an object"),
        (b'{"data": {"id": "x"}}', "data is dict, expected an array"),
    ],
)
async def test_malformed_responses_are_transient_with_a_clear_message(
    fake: FakeLambda, provider: LambdaCloudProvider, body: bytes, message: str
) -> None:
    fake.fail("list", 200, body)
    with pytest.raises(Transient) as raised:
        await provider.list_ours()
    assert "Lambda list instances: malformed response" in str(raised.value)
    assert message in str(raised.value)


async def test_one_of_our_instances_malformed_is_transient_naming_the_field(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance_id = fake.add_instance(tags=ours())
    del fake.instances[instance_id]["status"]
    fake.fail("list", 200, {"data": list(fake.instances.values())})
    with pytest.raises(Transient, match=r"data\[0\] has no 'status'"):
        await provider.list_ours()


@pytest.mark.parametrize(
    ("status", "body", "headers", "operation", "expected"),
    [
        (429, {}, {"Retry-After": "5"}, "get instance", RateLimited),
        (404, error_body("global/object-does-not-exist", "gone"), {}, "get instance", NotFound),
        (404, error_body("global/object-does-not-exist", "gone"), {}, "terminate", NotFound),
        (404, b"", {}, "get instance", NotFound),
        (404, b"", {}, "launch", CapacityUnavailable),
        (401, b"", {}, "list instances", AuthFailed),
        (403, b"<html>", {}, "list instances", AuthFailed),
        (500, error_body("global/internal-error", "oops"), {}, "list instances", Transient),
        (400, error_body("provider/quota-exhausted", "upstream"), {}, "launch", Transient),
        (400, b"not json", {}, "launch", Transient),
        (422, error_body("global/unknown", "?"), {}, "launch", InvalidSpec),
    ],
)  # fmt: skip
def test_classify_failure(
    status: int,
    body: dict[str, Any] | bytes,
    headers: dict[str, str],
    operation: Any,
    expected: type[ProviderError],
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.Response(status, content=content, headers=headers)
    error = classify_failure(operation, response, provider="p")
    assert type(error) is expected
    assert error.provider == "p"
    if isinstance(error, RateLimited):
        assert error.retry_after == 5


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("5", 5.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("nan", None),
        ("inf", None),
        ("soon", None),
        ("Wed, 01 Jan 2031 00:00:30 GMT", 30.0),
        ("Wed, 01 Jan 2031 00:00:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value: str | None, seconds: float | None) -> None:
    now = datetime(2031, 1, 1, tzinfo=UTC)
    assert parse_retry_after(value, now=now) == seconds


# --- states, get, list, delete, logs ------------------------------------------------------


def test_every_status_of_the_spec_is_mapped() -> None:
    path = spec_path()
    assert path is not None
    document = json.loads(path.read_text())
    assert set(document["components"]["schemas"]["InstanceStatus"]["enum"]) == set(STATES)


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("booting", InstanceState.PENDING),
        ("active", InstanceState.RUNNING),
        ("unhealthy", InstanceState.RUNNING),
        ("terminating", InstanceState.TERMINATING),
        ("terminated", InstanceState.TERMINATED),
        ("preempted", InstanceState.LOST),
    ],
)
async def test_each_status(
    fake: FakeLambda, provider: LambdaCloudProvider, status: str, state: InstanceState
) -> None:
    instance_id = fake.add_instance(tags=ours(), status=status, type_name="gpu_1x_gh200")
    got = await provider.get(instance_id)
    assert got.state is state
    assert got.ip == fake.instances[instance_id]["ip"]
    assert got.price_per_hour == pytest.approx(1.49)
    assert got.offer_key == "lambda-test/gpu_1x_gh200/us-west-1"
    assert (got.pod_uid, got.attempt) == (UID, 0)
    if status == "unhealthy":
        assert "unhealthy" in got.message


async def test_an_unknown_status_waits_instead_of_failing(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance_id = fake.add_instance(tags=ours())
    fake.instances[instance_id]["status"] = "hibernating"
    fake.fail("get", 200, {"data": fake.instances[instance_id]})
    got = await provider.get(instance_id)
    assert got.state is InstanceState.PENDING
    assert "hibernating" in got.message


async def test_get_of_someone_elses_instance_is_not_found(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    foreign = fake.add_instance(tags=ours(provider="another-agent"))
    with pytest.raises(NotFound, match="not one of ours"):
        await provider.get(foreign)
    with pytest.raises(NotFound):
        await provider.get("does-not-exist")
    with pytest.raises(NotFound):
        await provider.get("")


async def test_list_ours_ignores_foreign_instances(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    fake.add_instance()  # no tags
    fake.add_instance(name=f"vk-{UID}.0")  # our name, no tags
    fake.add_instance(tags=ours(provider="another-agent"))
    fake.add_instance(tags=[{"key": TAG_MANAGED, "value": "true"}])
    broken = ours()
    broken[3]["value"] = "other-uid.0"  # request id and pod uid disagree
    fake.add_instance(tags=broken)
    mine = fake.add_instance(tags=ours(attempt=4), status="booting")
    fake.add_instance(tags=ours(attempt=5), status="terminated")  # not live
    odd = {"id": "x", "tags": "not-a-list"}  # foreign and odd-shaped: not our business
    fake.fail("list", 200, {"data": [*fake.instances.values(), odd]})
    listed = await provider.list_ours()
    assert [(i.instance_id, i.attempt, i.state) for i in listed] == [
        (mine, 4, InstanceState.PENDING)
    ]


async def test_delete_terminates_and_missing_is_done(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    instance = await provider.create(make_spec(), await a10(provider))
    await provider.delete(instance.instance_id, grace_seconds=30)
    assert instance.instance_id not in fake.instances
    await provider.delete(instance.instance_id, grace_seconds=0)  # asked moments ago: no call
    assert len(fake.calls("terminate")) == 1
    clock.now += 60
    await provider.delete(instance.instance_id, grace_seconds=0)  # 404 from Lambda: done
    assert len(fake.calls("terminate")) == 2
    await provider.delete("never-existed", grace_seconds=0)
    await provider.delete("", grace_seconds=0)
    with pytest.raises(NotFound):
        await provider.get(instance.instance_id)


async def test_delete_of_a_launch_lambda_does_not_show_yet_is_retried(
    fake: FakeLambda, clock: FakeClock, provider: LambdaCloudProvider
) -> None:
    instance = await provider.create(make_spec(), await a10(provider))
    hidden = fake.instances.pop(instance.instance_id)
    with pytest.raises(Transient, match="yet"):
        await provider.delete(instance.instance_id, grace_seconds=0)
    fake.instances[instance.instance_id] = hidden
    await provider.delete(instance.instance_id, grace_seconds=0)
    assert instance.instance_id not in fake.instances
    with pytest.raises(NotFound):
        await provider.get(instance.instance_id)


async def test_delete_failures_are_errors(fake: FakeLambda, provider: LambdaCloudProvider) -> None:
    fake.fail("terminate", 401, FAILURES["auth"][1])
    with pytest.raises(AuthFailed):
        await provider.delete("abc", grace_seconds=0)


async def test_logs_come_from_the_vm(fake: FakeLambda, provider: LambdaCloudProvider) -> None:
    capabilities = provider.capabilities
    assert (capabilities.logs, capabilities.follow_logs, capabilities.log_timestamps) == (
        True,
        True,
        True,
    )
    instance_id = fake.add_instance(tags=ours(), status="active")
    fake.vms.log_lines[instance_id] = list(lines("one", "two", "three"))
    options = LogOptions(tail_lines=5, follow=True, timestamps=True, limit_bytes=6)
    got = [chunk async for chunk in provider.logs(instance_id, options)]
    assert got == [b"one\n", b"tw"]  # cut at limit_bytes
    assert fake.vms.log_options == [options]  # tail, follow, timestamps: docker logs' own


async def test_lambda_runs_whole_pods_but_cannot_probe_them(provider: LambdaCloudProvider) -> None:
    capabilities = provider.capabilities
    whole = (capabilities.multi_container, capabilities.init_containers, capabilities.sidecars)
    assert whole == (True, True, True)
    assert capabilities.probes == "none"  # the agent cannot reach the containers' ports
    assert not capabilities.previous_logs  # Docker keeps one log across restarts
    assert not (capabilities.exec or capabilities.port_forward or capabilities.usage)
    # So placement offers every pod shape to Lambda (the shape filter passes it).
    shape = PodShape(app_containers=2, init_containers=1, sidecars=1, field="spec.containers[1]")
    assert shape.runs_on(capabilities)


async def test_logs_are_per_container_and_there_is_no_previous_run(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    instance_id = fake.add_instance(tags=ours(), status="active")
    fake.vms.log_lines[instance_id] = list(lines("sidecar says"))
    options = LogOptions(container="proxy")
    assert [chunk async for chunk in provider.logs(instance_id, options)] == [b"sidecar says\n"]
    assert fake.vms.log_options == [options]  # the container goes to docker logs (vmwatch)
    with pytest.raises(NotFound, match="no previous run"):
        async for _ in provider.logs(instance_id, LogOptions(container="proxy", previous=True)):
            pass


async def test_logs_of_a_booting_or_unknown_vm_are_not_found(
    fake: FakeLambda, provider: LambdaCloudProvider
) -> None:
    booting = fake.add_instance(tags=ours(), status="booting")
    for instance_id in (booting, "nope", ""):
        with pytest.raises(NotFound):
            async for _ in provider.logs(instance_id, LogOptions()):
                pass
    assert fake.vms.log_options == []


async def test_has_the_provider_methods_and_its_name(provider: LambdaCloudProvider) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == "lambda-test"


# --- the API key ----------------------------------------------------------------------------


async def test_the_api_key_is_never_logged_or_in_messages(
    fake: FakeLambda, clock: FakeClock, key_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    adapter = make_provider(fake, clock, key_file)
    errors: list[ProviderError] = []
    try:
        offer = await a10(adapter)
        instance = await adapter.create(make_spec(), offer)
        await adapter.get(instance.instance_id)
        await adapter.list_ours()
        await adapter.delete(instance.instance_id, grace_seconds=0)
        # A server that echoes the key back, in every error path.
        echo = error_body("global/invalid-api-key", f"key {API_KEY} is invalid", f"not {API_KEY}")
        for endpoint in ("instance-types", "launch", "list", "get", "terminate"):
            fake.fail(endpoint, 401, echo)
        fake.fail("list", 503, echo, times=None)
        calls = [
            adapter.offers(),
            adapter.create(make_spec(attempt=1), offer),
            adapter.get("abc"),
            adapter.delete("abc", grace_seconds=0),
            adapter.list_ours(),
        ]
        for call in calls:
            try:
                await call
            except ProviderError as exc:
                errors.append(exc)
    finally:
        await adapter.close()
    assert len(errors) == 5
    for error in errors:
        assert API_KEY not in str(error) and API_KEY not in repr(error)
        assert "<redacted>" in str(error)
    assert API_KEY not in caplog.text
    assert API_KEY not in repr(adapter)


def test_a_missing_credential_names_the_reference(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError, match="file:"):
        LambdaCloudProvider(make_config(missing))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        LambdaCloudProvider(make_config(empty))


# --- the rate limiter ---------------------------------------------------------------------


async def test_rate_limiter_spaces_callers_in_order() -> None:
    clock = FakeClock(start=0.0)
    limiter = RateLimiter(2.0, clock=clock, sleep=clock.sleep)
    passed: list[tuple[int, float]] = []

    async def caller(n: int) -> None:
        await limiter.acquire()
        passed.append((n, clock.now))

    await asyncio.gather(*(caller(n) for n in range(4)))
    assert passed == [(0, 0.0), (1, 2.0), (2, 4.0), (3, 6.0)]
    limiter.hold_off(10.0)
    await limiter.acquire()
    assert clock.now == 16.0


@pytest.fixture(autouse=True)
def _no_real_sleep(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Simulated time only: a real sleep of a second or more here is a bug."""
    real = asyncio.sleep

    async def guarded(delay: float, *args: Any, **kwargs: Any) -> Any:
        assert delay < 1, f"real asyncio.sleep({delay}) in a Lambda unit test"
        return await real(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", guarded)
    yield


# --- redaction: canaries through every error path ----------------------------------------


def _canary_failures() -> dict[str, tuple[int, bytes] | Exception]:
    text = canary.echo()
    lambda_error = {
        "error": {"code": "global/invalid-parameters", "message": text, "suggestion": text}
    }
    return {
        "lambda error 400": (400, json.dumps(lambda_error).encode()),
        "lambda error 500": (
            500,
            json.dumps({"error": {"code": "global/internal-error", "message": text}}).encode(),
        ),
        "long 401": (
            401,
            json.dumps(
                {
                    "error": {
                        "code": "global/invalid-api-key",
                        "message": "x" * 285 + " " + canary.KEY,
                    }
                }
            ).encode(),
        ),
        "text 503": (503, text.encode()),
        "malformed": (200, b"<html>" + text.encode()),
        "transport": httpx.ConnectError(f"proxy refused: {text}"),
    }


@pytest.mark.parametrize("failure", list(_canary_failures()))
@pytest.mark.parametrize(
    "operation", ["offers", "create", "create-lookup", "create-firewall", "list", "get", "delete"]
)
async def test_no_canary_leaks_from_any_error_path(
    operation: str,
    failure: str,
    fake: FakeLambda,
    clock: FakeClock,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "canary-key"
    key_file.write_text(canary.KEY + "\n")
    endpoint = {
        "offers": "instance-types",
        "create": "launch",
        "create-lookup": "list",
        "create-firewall": "add-firewall-ruleset",
        "list": "list",
        "get": "get",
        "delete": "terminate",
    }[operation]
    answer = _canary_failures()[failure]
    transport = FlakyTransport(fake.transport, only=None)
    adapter = make_provider(
        fake,
        clock,
        key_file,
        transport=transport,
        retry=RetryPolicy(attempts=2, backoff_seconds=0.5, max_backoff_seconds=2.0),
        **({"firewall": {"source_cidrs": CLUSTER}} if operation == "create-firewall" else {}),
    )
    instance_id = fake.add_instance(tags=ours(attempt=7))
    offer = await a10(adapter)
    secret = (EnvVar("HF_TOKEN", canary.SECRET, secret=True),)
    # A whole pod: the secret is an init container's (every container's are redacted).
    workload = make_spec(
        containers=(ContainerSpec("main", "img:1"),),
        init_containers=(ContainerSpec("fetch", "img:1", env=secret),),
    )
    if isinstance(answer, Exception):
        transport.only = {
            "instance-types": "/instance-types",
            "launch": "/launch",
            "list": "/instances",
            "get": f"/instances/{instance_id}",
            "terminate": "/terminate",
            "add-firewall-ruleset": "/firewall-rulesets",
        }[endpoint]
        transport.errors += [answer] * 5
    else:
        fake.fail(endpoint, answer[0], answer[1], times=None)
    returned: list[object] = []
    error: BaseException | None = None
    try:
        if operation == "offers":
            returned.append(await adapter.offers())
        elif operation.startswith("create"):
            returned.append(await adapter.create(workload, offer))
        elif operation == "list":
            returned.append(await adapter.list_ours())
        elif operation == "get":
            returned.append(await adapter.get(instance_id))
        else:
            returned.append(await adapter.delete(instance_id, grace_seconds=0))
    except ProviderError as exc:
        error = exc
    finally:
        await adapter.close()
    values = (canary.KEY, canary.SECRET) if operation.startswith("create") else (canary.KEY,)
    canary.assert_clean(error=error, records=caplog.records, returned=returned, values=values)
