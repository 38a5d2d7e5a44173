"""The Modal provider, against the in-memory fake of its client and a stub of the SDK surface.

No test needs the ``modal`` package: ``ModalProvider`` runs on ``FakeSandboxClient``, and
``ModalSandboxClient`` (the real client) runs on a stub ``modal`` module put in
``sys.modules`` that records how the SDK is called.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import subprocess
import sys
import types
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.unit import canary
from tests.unit.fake_modal import TUNNEL_DOMAIN, FakeSandboxClient
from tests.workloads import workload
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
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.modal import adapter as adapter_module
from vk_provider_adapters.modal.adapter import CREATE_TIMEOUT_SECONDS, DEFAULT_RETRY, ModalProvider
from vk_provider_adapters.modal.catalogue import modal_gpu_string, offer_sku
from vk_provider_adapters.modal.config import ModalProviderConfig
from vk_provider_adapters.modal.identity import (
    ATTEMPT_TAG,
    MANAGED_BY_TAG,
    POD_UID_TAG,
    PORTS_TAG,
    TERMINATE_TAG,
    sandbox_name,
    sandbox_state,
)
from vk_provider_adapters.modal.ports import OpenedPorts, opened_ports, ports_tag, reached_at
from vk_provider_adapters.modal.sandbox import (
    SCHEDULING_WAIT_SECONDS,
    SandboxInfo,
    SandboxNameTaken,
    SandboxRequest,
    SandboxTunnel,
)
from vk_provider_adapters.transport import RetryPolicy

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-very-secret-value"
# Retries at once: the tests count calls, not seconds.
NO_WAIT = RetryPolicy(attempts=4, backoff_seconds=0.0, max_backoff_seconds=0.0)


def make_config(**overrides: object) -> ModalProviderConfig:
    data: dict[str, object] = {
        "type": "modal",
        "name": "modal-test",
        "token_id": "env:TEST_MODAL_TOKEN_ID",
        "token_secret": "env:TEST_MODAL_TOKEN_SECRET",
        "sandbox_timeout_seconds": 7200,
        "offers": [
            {"gpu": "H100", "price_per_hour": 3.95, "vcpus": 16, "memory_gib": 64},
            {"gpu": "A100-80GB", "count": 2, "price_per_hour": 5.0, "region": "us-east"},
            {"gpu": "L40S", "price_per_hour": 1.95, "region": "eu-west"},
        ],
    }
    data.update(overrides)
    return ModalProviderConfig.model_validate(data)


def make_spec(pod_uid: str = "0f6d7c3e-1b2a-4c5d-9e8f-001122334455", **fields: Any) -> WorkloadSpec:
    values: dict[str, Any] = {
        "pod_uid": pod_uid,
        "namespace": "ns",
        "pod_name": "p",
        "container_name": "c",
        "image": "vllm/vllm-openai:v0.6",
        "command": ("python", "-m", "server"),
        "gpu_count": 1,
    }
    values.update(fields)
    return workload(**values)


@pytest.fixture
def fake() -> FakeSandboxClient:
    return FakeSandboxClient()


@pytest.fixture
def provider(fake: FakeSandboxClient) -> ModalProvider:
    return ModalProvider(make_config(), client=fake, retry=NO_WAIT)


async def offer_of(provider: ModalProvider, sku: str) -> Offer:
    return next(o for o in await provider.offers() if o.sku == sku)


# --- module boundaries -----------------------------------------------------------------------


def test_importing_the_adapter_does_not_import_modal() -> None:
    code = (
        "import sys, vk_provider_adapters.modal.adapter; "
        "assert 'modal' not in sys.modules, 'modal imported'; "
        "assert 'vk_provider_adapters.modal.sdk' not in sys.modules, 'modal_sdk imported'"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_without_the_sdk_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vk_provider_adapters.modal.sdk import ModalSdkMissing

    monkeypatch.setitem(sys.modules, "modal", None)  # `import modal` now raises ImportError
    with pytest.raises(ModalSdkMissing, match=r"pip install") as raised:
        ModalProvider(make_config())
    assert "modal" in str(raised.value)
    assert isinstance(raised.value, ImportError)


def test_has_the_provider_methods_its_name_and_log_capabilities(provider: ModalProvider) -> None:
    assert isinstance(provider, Provider)
    assert provider.name == "modal-test"
    assert provider.capabilities.logs and provider.capabilities.follow_logs


# --- names, GPU strings and offers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "count", "expected"),
    [("H100", 1, "H100"), ("A100-80GB", 2, "A100-80GB:2"), ("L40S", 8, "L40S:8")],
)
def test_gpu_string(gpu: str, count: int, expected: str) -> None:
    assert modal_gpu_string(gpu, count) == expected


def test_sku_spelling() -> None:
    assert offer_sku("A100-80GB", 2) == "a100-80gb-x2"
    assert offer_sku("H100!", 1) == "h100-exact-x1"
    assert offer_sku("H100", 1) != offer_sku("H100!", 1)


def test_sandbox_name_is_the_request_id_within_modal_rules() -> None:
    assert sandbox_name("0f6d7c3e-1b2a-4c5d-9e8f-001122334455.3") == (
        "vk-0f6d7c3e-1b2a-4c5d-9e8f-001122334455.3"
    )
    for awkward in ("uid with spaces.0", "u" * 80 + ".1", "ünïcode.0"):
        name = sandbox_name(awkward)
        assert name == sandbox_name(awkward)  # stable: it is the idempotency key
        assert len(name) <= 64
        assert all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    assert sandbox_name("a" * 80 + ".1") != sandbox_name("a" * 80 + ".2")


async def test_offers_come_from_configuration_with_canonical_names(
    provider: ModalProvider,
) -> None:
    offers = {o.sku: o for o in await provider.offers()}
    assert set(offers) == {"h100-x1", "a100-80gb-x2", "l40s-x1"}
    h100 = offers["h100-x1"]
    assert (h100.gpu_model, h100.gpu_count, h100.gpu_memory_gib) == ("H100-SXM", 1, 80)
    assert (h100.vcpus, h100.memory_gib, h100.region, h100.price_per_hour) == (16, 64, "any", 3.95)
    assert h100.key == "modal-test/h100-x1/any"
    a100 = offers["a100-80gb-x2"]
    assert (a100.gpu_model, a100.gpu_count, a100.gpu_memory_gib) == ("A100-80GB", 2, 80)
    assert a100.available == 32  # max_gpus 64 / 2 per sandbox
    assert offers["l40s-x1"].gpu_memory_gib == 48


async def test_offers_honour_max_price_and_regions(fake: FakeSandboxClient) -> None:
    provider = ModalProvider(make_config(max_price_per_hour=4.0, regions=["eu-west"]), client=fake)
    # A100 x2 costs too much; L40S is in an allowed region; H100 "any" is placed in eu-west.
    assert {o.sku for o in await provider.offers()} == {"h100-x1", "l40s-x1"}
    await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    assert fake.requests[-1].regions == ("eu-west",)


async def test_offers_count_gpus_in_use_against_max_gpus(fake: FakeSandboxClient) -> None:
    provider = ModalProvider(make_config(max_gpus=4), client=fake)
    a100 = await offer_of(provider, "a100-80gb-x2")
    assert a100.available == 2
    await provider.create(make_spec(gpu_count=2), a100)
    assert (await offer_of(provider, "a100-80gb-x2")).available == 1
    assert (await offer_of(provider, "h100-x1")).available == 2


def test_two_offers_with_the_same_key_are_a_configuration_error() -> None:
    offers = [{"gpu": "H100", "price_per_hour": 3}, {"gpu": "H100", "price_per_hour": 4}]
    with pytest.raises(ConfigError, match="two offers"):
        ModalProvider(make_config(offers=offers), client=FakeSandboxClient())


# --- create ----------------------------------------------------------------------------------


async def test_create_sends_gpu_resources_and_an_explicit_timeout(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    spec = make_spec(args=("--port", "8000"), working_dir="/srv", attempt=2, gpu_count=2)
    instance = await provider.create(spec, await offer_of(provider, "a100-80gb-x2"))
    request = fake.requests[-1]
    assert request.gpu == "A100-80GB:2"
    assert request.timeout_seconds == 7200  # the configured one, never the SDK's 300 s
    assert (request.cpu, request.memory_mib) == (8, 32 * 1024)
    assert request.regions == ("us-east",)
    assert request.image == "vllm/vllm-openai:v0.6"
    assert (request.command, request.args, request.workdir) == (
        ("python", "-m", "server"),
        ("--port", "8000"),
        "/srv",
    )
    assert request.name == sandbox_name(spec.request_id)
    assert request.tags[POD_UID_TAG] == spec.pod_uid
    assert request.tags[ATTEMPT_TAG] == "2"
    assert request.tags[MANAGED_BY_TAG] == "modal-test"
    assert instance.pod_uid == spec.pod_uid and instance.attempt == 2
    assert instance.offer_key == "modal-test/a100-80gb-x2/us-east"
    assert instance.price_per_hour == 5.0
    assert instance.state is InstanceState.PENDING  # just accepted


async def test_create_is_idempotent_through_the_taken_name(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    offer = await offer_of(provider, "h100-x1")
    first = await provider.create(make_spec(), offer)
    second = await provider.create(make_spec(), offer)
    assert second.instance_id == first.instance_id
    assert second.state is InstanceState.RUNNING
    assert len(fake.running()) == 1
    assert fake.calls.count("from_name") == 1


async def test_a_create_whose_answer_was_lost_finds_its_sandbox(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    offer = await offer_of(provider, "h100-x1")
    spec = make_spec()
    # The sandbox was made, but the answer never reached us: the retry meets the name.
    made = await provider.create(spec, offer)
    fake.requests.clear()
    again = await provider.create(spec, offer)
    assert again.instance_id == made.instance_id
    assert fake.requests == []


async def test_a_name_held_by_someone_else_is_not_taken_over(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    spec = make_spec()
    fake.add_foreign(name=sandbox_name(spec.request_id))
    with pytest.raises(InvalidSpec, match="did not make"):
        await provider.create(spec, await offer_of(provider, "h100-x1"))


async def test_a_name_freed_between_the_clash_and_the_lookup_is_transient(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.fail("create", SandboxNameTaken("taken"))
    with pytest.raises(Transient, match="retry"):
        await provider.create(make_spec(), await offer_of(provider, "h100-x1"))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"image": ""}, "spec.containers[0].image"),
        ({"command": (), "args": ()}, "spec.containers[0].command"),
        ({"env": (EnvVar("BAD-NAME", "x"),)}, "spec.containers[0].env"),
        ({"working_dir": "relative"}, "spec.containers[0].workingDir"),
        ({"gpu_count": 4}, "spec.containers[0].resources.limits['nvidia.com/gpu']"),
    ],
)
async def test_specs_modal_cannot_run_are_invalid(
    provider: ModalProvider, fake: FakeSandboxClient, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidSpec) as raised:
        await provider.create(make_spec(**fields), await offer_of(provider, "h100-x1"))
    assert raised.value.field == field
    assert raised.value.provider == "modal-test"
    assert fake.requests == []


async def test_an_offer_of_another_provider_is_refused(provider: ModalProvider) -> None:
    offer = Offer("other", "h100-x1", "any", "H100", 1, 80, 8, 32, 1.0)
    with pytest.raises(InvalidSpec):
        await provider.create(make_spec(), offer)


# --- states ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exit_code", "started", "asked", "state", "message"),
    [
        (None, True, False, InstanceState.RUNNING, ""),
        (None, None, False, InstanceState.RUNNING, ""),
        (None, False, False, InstanceState.PENDING, "waiting for Modal to schedule the sandbox"),
        (None, True, True, InstanceState.TERMINATING, "termination requested"),
        (137, True, True, InstanceState.TERMINATED, "terminated on request"),
        (0, True, True, InstanceState.TERMINATED, "terminated on request"),
        (124, True, False, InstanceState.LOST, "sandbox timed out"),
        (137, True, False, InstanceState.LOST, "sandbox terminated by Modal"),
        (0, True, False, InstanceState.EXITED, ""),
        (3, True, False, InstanceState.EXITED, ""),
    ],
)
def test_state_table(
    exit_code: int | None,
    started: bool | None,
    asked: bool,
    state: InstanceState,
    message: str,
) -> None:
    info = SandboxInfo("sb-1", {}, exit_code=exit_code, started=started)
    assert sandbox_state(info, termination_requested=asked) == (state, message)


async def test_states_through_the_adapter(provider: ModalProvider, fake: FakeSandboxClient) -> None:
    fake.auto_start = False
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    sandbox_id = created.instance_id
    assert (await provider.get(sandbox_id)).state is InstanceState.PENDING
    fake.start(sandbox_id)
    assert (await provider.get(sandbox_id)).state is InstanceState.RUNNING
    fake.finish(sandbox_id, 3)
    exited = await provider.get(sandbox_id)
    assert (exited.state, exited.exit_code) == (InstanceState.EXITED, 3)
    assert exited.finished_at is not None
    fake.expire(sandbox_id)
    timed_out = await provider.get(sandbox_id)
    assert (timed_out.state, timed_out.message) == (InstanceState.LOST, "sandbox timed out")
    fake.finish(sandbox_id, 137)
    assert (await provider.get(sandbox_id)).state is InstanceState.LOST


async def test_termination_we_asked_for_is_terminated_also_after_a_restart(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    await provider.delete(created.instance_id, grace_seconds=30)
    got = await provider.get(created.instance_id)
    assert (got.state, got.exit_code) == (InstanceState.TERMINATED, 137)
    assert fake.sandboxes[created.instance_id].tags[TERMINATE_TAG] == "requested"
    restarted = ModalProvider(make_config(), client=fake)
    assert (await restarted.get(created.instance_id)).state is InstanceState.TERMINATED


async def test_a_termination_under_way_is_terminating(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    fake.fail("terminate", Transient("UNAVAILABLE"), times=100)
    with pytest.raises(Transient):
        await provider.delete(created.instance_id, grace_seconds=0)
    assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATING


# --- delete, get, list -----------------------------------------------------------------------


async def test_delete_of_missing_or_finished_or_foreign_sandboxes(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    await provider.delete("sb-does-not-exist", grace_seconds=0)
    foreign = fake.add_foreign()
    await provider.delete(foreign, grace_seconds=0)
    assert fake.sandboxes[foreign].running  # never touched
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    fake.finish(created.instance_id, 0)
    fake.calls.clear()
    await provider.delete(created.instance_id, grace_seconds=0)
    assert "terminate" not in fake.calls
    assert (await provider.get(created.instance_id)).state is InstanceState.TERMINATED


async def test_delete_still_terminates_when_tagging_fails(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    fake.fail("set_tags", InvalidSpec("sandbox is finishing"))
    await provider.delete(created.instance_id, grace_seconds=0)
    assert not fake.sandboxes[created.instance_id].running


async def test_get_of_a_foreign_or_unknown_sandbox_is_not_found(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    with pytest.raises(NotFound):
        await provider.get("sb-nope")
    with pytest.raises(NotFound) as raised:
        await provider.get(fake.add_foreign())
    assert raised.value.provider == "modal-test"


async def test_list_ours_returns_only_our_running_sandboxes(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.add_foreign()
    fake.add_foreign(tags={MANAGED_BY_TAG: "other-agent", POD_UID_TAG: "x"})
    fake.add_foreign(tags={MANAGED_BY_TAG: "modal-test"})  # our marker, but no pod: not ours
    offer = await offer_of(provider, "h100-x1")
    mine = await provider.create(make_spec("uid-a"), offer)
    done = await provider.create(make_spec("uid-b"), offer)
    fake.finish(done.instance_id, 0)
    fake.calls.clear()
    listed = await provider.list_ours()
    assert [(i.instance_id, i.pod_uid) for i in listed] == [(mine.instance_id, "uid-a")]
    assert fake.calls.count("list") == 1


# --- ports: Modal tunnels, reported as endpoints ----------------------------------------------

WEB_PORTS = (Port(8000), Port(9090, name="metrics"), Port(8000, name="again"), Port(5353, "UDP"))


async def test_declared_tcp_ports_are_opened_as_raw_tcp_tunnels_and_udp_is_warned_about(
    provider: ModalProvider, fake: FakeSandboxClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    created = await provider.create(make_spec(ports=WEB_PORTS), await offer_of(provider, "h100-x1"))
    request = fake.requests[-1]
    assert (request.unencrypted_ports, request.encrypted_ports) == ((8000, 9090), ())
    assert request.tags[PORTS_TAG] == "tcp.2"  # how many, and how: read back by every get
    assert [r.getMessage() for r in caplog.records] == [
        f"pod {created.pod_uid}: Modal cannot tunnel port 5353/UDP; not exposed"
    ]
    assert created.endpoints == ()  # nothing is tunnelled before the sandbox starts


async def test_a_sandbox_without_ports_opens_no_tunnel_and_is_never_asked_for_one(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    request = fake.requests[-1]
    assert (request.unencrypted_ports, request.encrypted_ports) == ((), ())
    assert PORTS_TAG not in request.tags
    assert (await provider.get(created.instance_id)).endpoints == ()
    await provider.list_ours()
    assert "tunnels" not in fake.calls


async def test_each_port_is_reported_at_its_raw_tcp_tunnel_once_modal_has_it(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.auto_start = False
    created = await provider.create(make_spec(ports=WEB_PORTS), await offer_of(provider, "h100-x1"))
    pending = await provider.get(created.instance_id)
    assert (pending.state, pending.endpoints) == (InstanceState.PENDING, ())
    assert "tunnels" not in fake.calls  # not asked before the sandbox runs
    fake.start(created.instance_id)
    tunnels = fake.sandboxes[created.instance_id].tunnels
    running = await provider.get(created.instance_id)
    assert running.endpoints == (
        PortEndpoint(8000, "TCP", TUNNEL_DOMAIN, tunnels[8000].unencrypted_port),
        PortEndpoint(9090, "TCP", TUNNEL_DOMAIN, tunnels[9090].unencrypted_port),
    )
    assert all(e.address_type == "FQDN" for e in running.endpoints)  # Modal's host, as given
    assert tunnels[8000].unencrypted_port != tunnels[9090].unencrypted_port
    assert [i.endpoints for i in await provider.list_ours()] == [running.endpoints]


async def test_expose_tls_opens_encrypted_ports_reached_at_their_tls_host_on_443(
    fake: FakeSandboxClient,
) -> None:
    provider = ModalProvider(make_config(expose="tls"), client=fake, retry=NO_WAIT)
    created = await provider.create(make_spec(ports=WEB_PORTS), await offer_of(provider, "h100-x1"))
    request = fake.requests[-1]
    assert (request.encrypted_ports, request.unencrypted_ports) == ((8000, 9090), ())
    assert request.tags[PORTS_TAG] == "tls.2"
    tunnels = fake.sandboxes[created.instance_id].tunnels
    assert (await provider.get(created.instance_id)).endpoints == (
        PortEndpoint(8000, "TCP", tunnels[8000].host, 443),
        PortEndpoint(9090, "TCP", tunnels[9090].host, 443),
    )
    assert tunnels[8000].host.endswith(f".{TUNNEL_DOMAIN}") and not tunnels[8000].unencrypted_host


def test_expose_accepts_tcp_and_tls_only_and_defaults_to_tcp() -> None:
    assert make_config().expose == "tcp"
    with pytest.raises(ValueError, match="expose"):
        make_config(expose="http")


async def test_tunnels_are_asked_for_until_every_port_has_one_then_never_again(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(ports=WEB_PORTS), await offer_of(provider, "h100-x1"))
    sandbox_id = created.instance_id
    fake.hold_tunnels(sandbox_id)
    assert (await provider.get(sandbox_id)).endpoints == ()  # Modal has none yet
    fake.release_tunnels(sandbox_id)
    fake.hold_tunnels(sandbox_id, 9090)
    partial = await provider.list_ours()
    assert [e.container_port for e in partial[0].endpoints] == [8000]  # what exists is listed
    asked = fake.calls.count("tunnels")
    assert asked == 2
    fake.release_tunnels(sandbox_id)
    complete = (await provider.list_ours())[0].endpoints
    assert [e.container_port for e in complete] == [8000, 9090]
    assert fake.calls.count("tunnels") == asked + 1
    for _ in range(3):
        assert (await provider.list_ours())[0].endpoints == complete
        assert (await provider.get(sandbox_id)).endpoints == complete
    assert fake.calls.count("tunnels") == asked + 1  # known for the sandbox's life


async def test_endpoints_are_reported_while_the_sandbox_runs_or_stops_and_not_after(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(
        make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1")
    )
    sandbox_id = created.instance_id
    reached = (await provider.get(sandbox_id)).endpoints
    assert len(reached) == 1
    tags = fake.sandboxes[sandbox_id].tags
    tags[TERMINATE_TAG] = "requested"  # a stop under way: the sandbox still runs
    stopping = await provider.get(sandbox_id)
    assert (stopping.state, stopping.endpoints) == (InstanceState.TERMINATING, reached)
    del tags[TERMINATE_TAG]
    fake.finish(sandbox_id, 0)
    ended = await provider.get(sandbox_id)
    assert (ended.state, ended.endpoints) == (InstanceState.EXITED, ())
    fake.revive(sandbox_id)  # only to show that the ended sandbox's tunnels were forgotten
    fake.calls.clear()
    assert (await provider.get(sandbox_id)).endpoints == reached
    assert fake.calls.count("tunnels") == 1


async def test_an_agent_restarted_with_another_expose_reads_each_sandbox_as_it_was_opened(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(
        make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1")
    )
    restarted = ModalProvider(make_config(expose="tls"), client=fake, retry=NO_WAIT)
    tunnel = fake.sandboxes[created.instance_id].tunnels[8000]
    assert (await restarted.get(created.instance_id)).endpoints == (
        PortEndpoint(8000, "TCP", tunnel.unencrypted_host, tunnel.unencrypted_port),
    )


@pytest.mark.parametrize(
    ("error", "warned"),
    [
        (Transient("modal tunnels: UNAVAILABLE"), True),
        (AuthFailed("modal tunnels: token expired"), True),
        (RuntimeError("grpc said: UNAVAILABLE"), True),  # a client must not, but may
        (NotFound("modal get: sandbox ended"), False),  # ended since it was listed
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
async def test_a_failed_tunnel_question_leaves_the_read_without_endpoints_and_unretried(
    error: Exception,
    warned: bool,
    provider: ModalProvider,
    fake: FakeSandboxClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    created = await provider.create(
        make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1")
    )
    fake.fail("tunnels", error)
    fake.calls.clear()
    with caplog.at_level(logging.WARNING):
        listed = await provider.list_ours()
    assert [(i.state, i.endpoints) for i in listed] == [(InstanceState.RUNNING, ())]
    assert fake.calls.count("tunnels") == 1  # no retry now: the next read asks again
    assert any("cannot read the tunnels" in r.getMessage() for r in caplog.records) is warned
    assert [e.container_port for e in (await provider.get(created.instance_id)).endpoints] == [8000]


async def test_a_tunnel_question_that_keeps_failing_is_warned_about_once(
    provider: ModalProvider, fake: FakeSandboxClient, caplog: pytest.LogCaptureFixture
) -> None:
    await provider.create(make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1"))
    fake.fail("tunnels", Transient("modal tunnels: UNAVAILABLE"), times=3)
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert (await provider.list_ours())[0].endpoints == ()
    failures = [r for r in caplog.records if "cannot read the tunnels" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert len((await provider.list_ours())[0].endpoints) == 1


async def test_reading_logs_does_not_ask_for_tunnels(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(
        make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1")
    )
    fake.write(created.instance_id, b"ready\n")
    assert [c async for c in provider.logs(created.instance_id, LogOptions())] == [b"ready\n"]
    assert "tunnels" not in fake.calls


async def test_tunnel_questions_that_hang_cost_a_read_the_lookup_bound_at_most(
    provider: ModalProvider, fake: FakeSandboxClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    offer = await offer_of(provider, "h100-x1")
    for uid in ("uid-a", "uid-b", "uid-c"):
        await provider.create(make_spec(uid, ports=(Port(8000),)), offer)
    never = asyncio.Event()
    asked: list[str] = []

    async def hanging(sandbox_id: str, *, wait_seconds: int) -> None:
        asked.append(sandbox_id)
        await never.wait()  # Modal never answers

    monkeypatch.setattr(fake, "tunnels", hanging)
    monkeypatch.setattr(adapter_module, "TUNNEL_LOOKUP_SECONDS", 0.05)
    async with asyncio.timeout(5):
        listed = await provider.list_ours()
    assert [(i.state, i.endpoints) for i in listed] == [(InstanceState.RUNNING, ())] * 3
    assert len(asked) == 3  # asked together, not one after the other


def test_only_a_tunnels_own_endpoint_of_the_opened_kind_is_reported() -> None:
    tunnels = {
        9090: SandboxTunnel("b.r5.modal.host", 443, "r5.modal.host", 41002),
        8000: SandboxTunnel("a.r5.modal.host", 443, "r5.modal.host", 41001),
        7000: SandboxTunnel("c.r5.modal.host", 443),  # an encrypted port: no raw TCP endpoint
        6000: SandboxTunnel("", 0, "r5.modal.host", 0),  # incomplete answer
        0: SandboxTunnel("d.r5.modal.host", 443, "r5.modal.host", 41003),  # no such port
    }
    assert reached_at(tunnels, "tcp") == (
        PortEndpoint(8000, "TCP", "r5.modal.host", 41001),
        PortEndpoint(9090, "TCP", "r5.modal.host", 41002),
    )
    assert [(e.container_port, e.port) for e in reached_at(tunnels, "tls")] == [
        (7000, 443),
        (8000, 443),
        (9090, 443),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("tcp.2", OpenedPorts("tcp", 2)),
        ("tls.12", OpenedPorts("tls", 12)),
        (ports_tag("tcp", 3), OpenedPorts("tcp", 3)),
        (None, None),
        ("tcp.0", None),
        ("h2.1", None),
        ("tcp", None),
    ],
)
def test_the_ports_tag_reads_back_as_written(
    value: str | None, expected: OpenedPorts | None
) -> None:
    assert opened_ports(value) == expected


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        NotFound("gone"),
        CapacityUnavailable("quota"),
        InvalidSpec("bad"),
        AuthFailed("token"),
        RateLimited("slow down"),
        Transient("UNAVAILABLE"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_client_errors_keep_their_class_and_get_the_provider_name(
    provider: ModalProvider, fake: FakeSandboxClient, error: ProviderError
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    fake.fail("get", error, times=100)
    with pytest.raises(type(error)) as raised:
        await provider.get(created.instance_id)
    assert raised.value.provider == "modal-test"


async def test_transient_and_rate_limited_calls_are_retried(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.fail("list", Transient("UNAVAILABLE"))
    fake.fail("list", RateLimited("rate limit", retry_after=0.0))
    assert await provider.list_ours() == []
    assert fake.calls.count("list") == 3


async def test_retries_give_up(provider: ModalProvider, fake: FakeSandboxClient) -> None:
    fake.fail("list", Transient("UNAVAILABLE"), times=100)
    with pytest.raises(Transient):
        await provider.list_ours()
    assert fake.calls.count("list") == 4


async def test_other_errors_are_not_retried(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.fail("list", AuthFailed("token"), times=100)
    with pytest.raises(AuthFailed):
        await provider.list_ours()
    assert fake.calls.count("list") == 1


async def test_a_call_that_never_answers_is_transient(fake: FakeSandboxClient) -> None:
    class Hanging(FakeSandboxClient):
        async def list(self, tags: Mapping[str, str]) -> list[SandboxInfo]:
            await asyncio.sleep(3600)
            return []

    provider = ModalProvider(
        make_config(timeout_seconds=0.01),
        client=Hanging(),
        retry=dataclasses.replace(NO_WAIT, attempts=2),
    )
    with pytest.raises(Transient, match="no answer"):
        await provider.list_ours()


async def test_a_stray_exception_from_a_client_still_leaves_as_a_provider_error(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    fake.fail("list", KeyError("surprise"), times=100)
    with pytest.raises(Transient, match="KeyError"):
        await provider.list_ours()


def test_rate_limits_wait_as_long_as_asked() -> None:
    assert DEFAULT_RETRY.wait_seconds(RateLimited("x", retry_after=7.0), 1) == 7.0
    assert 0 <= DEFAULT_RETRY.wait_seconds(Transient("x"), 1) <= 30


# --- secrets ---------------------------------------------------------------------------------


async def test_secret_values_go_apart_and_never_into_messages_or_logs(
    provider: ModalProvider, fake: FakeSandboxClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    spec = make_spec(env=(EnvVar("PLAIN", "visible"), EnvVar("HF_TOKEN", SECRET, secret=True)))
    offer = await offer_of(provider, "h100-x1")
    # Modal echoing the request back in an error must not leak the secret.
    cause = RuntimeError(f"rejected HF_TOKEN={SECRET}")
    error = CapacityUnavailable(f"modal create: quota for env HF_TOKEN={SECRET}")
    error.__cause__ = cause
    fake.fail("create", error)
    with pytest.raises(CapacityUnavailable) as raised:
        await provider.create(spec, offer)
    assert SECRET not in str(raised.value)
    assert "<redacted>" in str(raised.value)
    assert raised.value.__cause__ is None

    await provider.create(spec, offer)
    request = fake.requests[-1]
    assert request.env == {"PLAIN": "visible"}
    assert request.secret_env == {"HF_TOKEN": SECRET}
    assert SECRET not in repr(request)
    assert SECRET not in caplog.text


# --- logs ------------------------------------------------------------------------------------


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in stream]


async def test_logs_history_tail_and_limit(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    fake.write(created.instance_id, b"one\n", b"two\n", b"three")
    logs = provider.logs
    assert await collect(logs(created.instance_id, LogOptions())) == [
        b"one\n",
        b"two\n",
        b"three\n",
    ]
    tail = await collect(logs(created.instance_id, LogOptions(tail_lines=2)))
    assert tail == [b"two\n", b"three\n"]
    assert await collect(logs(created.instance_id, LogOptions(tail_lines=0))) == []
    limited = await collect(logs(created.instance_id, LogOptions(limit_bytes=6)))
    assert limited == [b"one\n", b"tw"]
    with pytest.raises(NotFound):
        await collect(logs("sb-nope", LogOptions()))
    with pytest.raises(NotFound):
        await collect(logs(fake.add_foreign(), LogOptions()))


async def test_follow_with_tail_continues_until_the_sandbox_ends(
    provider: ModalProvider, fake: FakeSandboxClient
) -> None:
    created = await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    sandbox_id = created.instance_id
    fake.write(sandbox_id, b"a\n", b"b\n", b"c\n")
    reader = asyncio.create_task(
        collect(provider.logs(sandbox_id, LogOptions(follow=True, tail_lines=1)))
    )
    await asyncio.sleep(0.01)
    fake.write(sandbox_id, b"d\n")
    await asyncio.sleep(0.01)
    fake.finish(sandbox_id, 0)
    assert await asyncio.wait_for(reader, 5) == [b"c\n", b"d\n"]


async def test_close_closes_the_client(provider: ModalProvider, fake: FakeSandboxClient) -> None:
    await provider.close()
    assert fake.closed


# --- the real client, on a stub of the SDK surface -------------------------------------------


def _exception_module() -> types.ModuleType:
    module = types.ModuleType("modal.exception")
    classes: dict[str, tuple[str, ...]] = {
        "Error": (),
        "AlreadyExistsError": ("Error",),
        "AuthError": ("Error",),
        "PermissionDeniedError": ("Error",),
        "VersionError": ("Error",),
        "NotFoundError": ("Error",),
        "InvalidError": ("Error",),
        "ConflictError": ("InvalidError",),
        "UnimplementedError": ("Error",),
        "ResourceExhaustedError": ("Error",),
        "ServiceError": ("Error",),
        "InternalError": ("Error",),
        "ConnectionError": ("Error",),
        "TimeoutError": ("Error",),
        "SandboxTimeoutError": ("TimeoutError",),
        "RemoteError": ("Error",),
        "ImageBuildError": ("RemoteError",),
        "ClientClosed": ("Error",),
    }
    for name, bases in classes.items():
        parents = tuple(getattr(module, base) for base in bases) or (Exception,)
        setattr(module, name, type(name, parents, {"__module__": "modal.exception"}))
    return module


EXC = _exception_module()


class GRPCError(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = types.SimpleNamespace(name=status)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (EXC.AlreadyExistsError("name in use"), SandboxNameTaken),
        (EXC.NotFoundError("no such sandbox"), NotFound),
        (EXC.AuthError("bad token"), AuthFailed),
        (EXC.PermissionDeniedError("no"), AuthFailed),
        (EXC.VersionError("upgrade"), AuthFailed),
        (EXC.ResourceExhaustedError("GPU quota exceeded"), CapacityUnavailable),
        (EXC.ResourceExhaustedError("Rate limit exceeded"), RateLimited),
        (EXC.InvalidError("Invalid GPU config"), InvalidSpec),
        (EXC.ConflictError("finished"), InvalidSpec),
        (EXC.UnimplementedError("no"), InvalidSpec),
        (EXC.ImageBuildError("pull failed"), InvalidSpec),
        (EXC.ServiceError("UNAVAILABLE"), Transient),
        (EXC.InternalError("oops"), Transient),
        (EXC.ConnectionError("reset"), Transient),
        (EXC.TimeoutError("slow"), Transient),
        (EXC.RemoteError("server"), Transient),
        (EXC.ClientClosed(), Transient),
        (EXC.Error("new kind"), Transient),
        (TimeoutError(), Transient),
        (OSError("network down"), Transient),
        (ValueError("surprise"), Transient),
        (GRPCError("NOT_FOUND"), NotFound),
        (GRPCError("UNAUTHENTICATED"), AuthFailed),
        (GRPCError("RESOURCE_EXHAUSTED"), CapacityUnavailable),
        (GRPCError("INVALID_ARGUMENT"), InvalidSpec),
        (GRPCError("UNAVAILABLE"), Transient),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "",
)
def test_error_mapping_table(error: BaseException, expected: type[Exception]) -> None:
    from vk_provider_adapters.modal.sdk import translate_error

    translated = translate_error(error, "create")
    assert type(translated) is expected
    assert str(translated).startswith("modal create: ")


def test_an_image_that_cannot_be_built_names_the_image_field() -> None:
    from vk_provider_adapters.modal.sdk import translate_error

    translated = translate_error(EXC.ImageBuildError("manifest unknown"), "create")
    assert isinstance(translated, InvalidSpec)
    assert translated.field == "spec.containers[0].image"


class _Aio:
    """A callable with an ``.aio`` form, as the SDK's synchronicity wrappers have."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.aio = function


class _Lines:
    def __init__(self, lines: list[str]) -> None:
        self._lines = lines

    async def __aiter__(self) -> AsyncIterator[str]:
        for line in self._lines:
            yield line


@dataclasses.dataclass(frozen=True)
class StubTunnel:
    """``modal._tunnel.Tunnel``'s fields (SDK 1.6.4)."""

    host: str
    port: int
    unencrypted_host: str
    unencrypted_port: int


class StubSandbox:
    def __init__(self, sdk: StubModal, sandbox_id: str, tags: dict[str, str]) -> None:
        self.object_id = sandbox_id
        self.returncode: int | None = None
        self.tags = tags
        self.stdout = _Lines(["out 1\n", "out 2\n"])
        self.stderr = _Lines(["err\n"])
        # What Sandbox.tunnels() answers; None: Modal has not set them up in time.
        self.tunnel_answer: dict[int, StubTunnel] | BaseException | None = None

        async def get_tags() -> dict[str, str]:
            return dict(self.tags)

        async def set_tags(tags: dict[str, str]) -> None:
            self.tags = dict(tags)

        async def terminate() -> None:
            sdk.calls.append(("terminate", sandbox_id))
            self.returncode = 137

        async def detach() -> None:
            sdk.calls.append(("detach", sandbox_id))

        async def tunnels(timeout: int = 50) -> dict[int, StubTunnel]:
            sdk.calls.append(("tunnels", (sandbox_id, timeout)))
            answer = self.tunnel_answer
            if answer is None:  # sandbox/_common.py tunnels_from_response
                raise EXC.SandboxTimeoutError()
            if isinstance(answer, BaseException):
                raise answer
            return answer

        self.get_tags = _Aio(get_tags)
        self.tunnels = _Aio(tunnels)
        self.set_tags = _Aio(set_tags)
        self.terminate = _Aio(terminate)
        self.detach = _Aio(detach)


class StubImage:
    def __init__(self, ref: str, entrypoint: list[str] | None = None) -> None:
        self.ref = ref
        self.entrypoint_override = entrypoint

    def entrypoint(self, commands: list[str]) -> StubImage:
        return StubImage(self.ref, commands)


class StubModal(types.ModuleType):
    """The parts of the ``modal`` module that ``ModalSandboxClient`` uses."""

    def __init__(self) -> None:
        super().__init__("modal")
        self.calls: list[tuple[str, Any]] = []
        self.sandboxes: dict[str, StubSandbox] = {}
        self.exception = EXC
        self.create_error: BaseException | None = None
        sdk = self

        async def from_credentials(token_id: str, token_secret: str) -> object:
            sdk.calls.append(("credentials", (token_id, token_secret)))
            return types.SimpleNamespace(name="client")

        async def lookup(name: str, *, create_if_missing: bool, client: object) -> object:
            sdk.calls.append(("lookup", (name, create_if_missing)))
            return types.SimpleNamespace(app_id="ap-123", name=name)

        async def create(*argv: str, **options: Any) -> StubSandbox:
            sdk.calls.append(("create", (argv, options)))
            if sdk.create_error is not None:
                raise sdk.create_error
            sandbox = StubSandbox(sdk, f"sb-{len(sdk.sandboxes)}", dict(options["tags"]))
            sdk.sandboxes[sandbox.object_id] = sandbox
            return sandbox

        async def from_id(sandbox_id: str, *, client: object) -> StubSandbox:
            if sandbox_id not in sdk.sandboxes:
                raise EXC.NotFoundError(f"Sandbox {sandbox_id} not found")
            return sdk.sandboxes[sandbox_id]

        async def from_name(app_name: str, name: str, *, client: object) -> StubSandbox:
            raise EXC.NotFoundError(f"no running sandbox {name} in {app_name}")

        async def list_(
            *, app_id: str, tags: dict[str, str], client: object
        ) -> AsyncIterator[StubSandbox]:
            sdk.calls.append(("list", (app_id, tags)))
            for sandbox in list(sdk.sandboxes.values()):
                if sandbox.returncode is None and tags.items() <= sandbox.tags.items():
                    yield sandbox

        self.Client = types.SimpleNamespace(from_credentials=_Aio(from_credentials))
        self.App = types.SimpleNamespace(lookup=_Aio(lookup))
        self.Image = types.SimpleNamespace(from_registry=StubImage)
        self.Secret = types.SimpleNamespace(from_dict=lambda d: ("secret", dict(d)))
        self.Sandbox = types.SimpleNamespace(
            create=_Aio(create), from_id=_Aio(from_id), from_name=_Aio(from_name), list=_Aio(list_)
        )


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Iterator[StubModal]:
    stub = StubModal()
    monkeypatch.setitem(sys.modules, "modal", stub)
    monkeypatch.setenv("TEST_MODAL_TOKEN_ID", "ak-id")
    monkeypatch.setenv("TEST_MODAL_TOKEN_SECRET", "as-secret")
    yield stub


def _request(**fields: Any) -> SandboxRequest:
    values: dict[str, Any] = {
        "name": "vk-uid.0",
        "tags": {MANAGED_BY_TAG: "modal-test", POD_UID_TAG: "uid"},
        "image": "vllm/vllm-openai:v0.6",
        "command": ("python", "-m", "server"),
        "args": ("--port", "8000"),
        "env": {"PLAIN": "visible"},
        "secret_env": {"HF_TOKEN": SECRET},
        "gpu": "A100-80GB:2",
        "cpu": 8.0,
        "memory_mib": 32768,
        "regions": ("us-east",),
        "timeout_seconds": 7200,
        "workdir": "/srv",
    }
    values.update(fields)
    return SandboxRequest(**values)


async def test_the_real_client_is_built_lazily_and_calls_the_sdk_as_documented(
    sdk: StubModal,
) -> None:
    from vk_provider_adapters.modal.sdk import ModalSandboxClient

    provider = ModalProvider(make_config())  # builds the real client: no call made yet
    assert sdk.calls == []
    await provider.close()

    client = ModalSandboxClient(make_config())
    sandbox_id = await client.create_sandbox(_request())
    assert sdk.calls[0] == ("credentials", ("ak-id", "as-secret"))
    assert sdk.calls[1] == ("lookup", ("vk-provider", True))
    argv, options = sdk.calls[2][1]
    assert argv == ("python", "-m", "server", "--port", "8000")
    assert options["timeout"] == 7200
    assert options["gpu"] == "A100-80GB:2"
    assert (options["cpu"], options["memory"], options["region"]) == (8.0, 32768, ["us-east"])
    assert options["name"] == "vk-uid.0" and options["workdir"] == "/srv"
    assert options["env"] == {"PLAIN": "visible"}
    assert options["secrets"] == [("secret", {"HF_TOKEN": SECRET})]
    assert options["image"].ref == "vllm/vllm-openai:v0.6"
    assert options["image"].entrypoint_override == []  # command replaces ENTRYPOINT
    assert options["tags"][POD_UID_TAG] == "uid"
    assert (options["encrypted_ports"], options["unencrypted_ports"]) == ([], [])
    assert ("detach", sandbox_id) in sdk.calls

    info = await client.get(sandbox_id)
    assert (info.sandbox_id, info.exit_code, info.tags[POD_UID_TAG]) == (sandbox_id, None, "uid")
    assert [i.sandbox_id for i in await client.list({MANAGED_BY_TAG: "modal-test"})] == [sandbox_id]
    assert ("list", ("ap-123", {MANAGED_BY_TAG: "modal-test"})) in sdk.calls
    assert await client.from_name("vk-other.0") is None
    await client.set_tags(sandbox_id, {**info.tags, TERMINATE_TAG: "requested"})
    assert (await client.get(sandbox_id)).tags[TERMINATE_TAG] == "requested"
    await client.terminate(sandbox_id)
    assert (await client.get(sandbox_id)).exit_code == 137
    with pytest.raises(NotFound):
        await client.get("sb-missing")
    lines = sorted([line async for line in client.logs(sandbox_id, follow=False)])
    assert lines == [b"err\n", b"out 1\n", b"out 2\n"]
    assert sum(1 for call in sdk.calls if call[0] in ("credentials", "lookup")) == 2  # once


async def test_the_real_client_keeps_the_image_entrypoint_for_args_only(sdk: StubModal) -> None:
    from vk_provider_adapters.modal.sdk import ModalSandboxClient

    client = ModalSandboxClient(make_config())
    await client.create_sandbox(_request(command=(), secret_env={}, env={}))
    argv, options = next(call[1] for call in sdk.calls if call[0] == "create")
    assert argv == ("--port", "8000")
    assert options["image"].entrypoint_override is None
    assert options["secrets"] == [] and options["env"] is None


async def test_the_real_client_opens_the_ports_and_reads_the_tunnels_the_sdk_answers(
    sdk: StubModal,
) -> None:
    from vk_provider_adapters.modal.sdk import ModalSandboxClient

    client = ModalSandboxClient(make_config())
    sandbox_id = await client.create_sandbox(
        _request(unencrypted_ports=(8000, 9090), encrypted_ports=(8443,))
    )
    _, options = next(call[1] for call in sdk.calls if call[0] == "create")
    assert (options["unencrypted_ports"], options["encrypted_ports"]) == ([8000, 9090], [8443])
    sandbox = sdk.sandboxes[sandbox_id]
    assert await client.tunnels(sandbox_id, wait_seconds=2) is None  # not set up in time
    assert ("tunnels", (sandbox_id, 2)) in sdk.calls
    sandbox.tunnel_answer = {
        8000: StubTunnel("w1.r5.modal.host", 443, "r5.modal.host", 41001),
        8443: StubTunnel("w2.r5.modal.host", 443, "", 0),  # an encrypted port
    }
    sdk.calls.clear()
    assert await client.tunnels(sandbox_id, wait_seconds=2) == {
        8000: SandboxTunnel("w1.r5.modal.host", 443, "r5.modal.host", 41001),
        8443: SandboxTunnel("w2.r5.modal.host", 443, "", 0),
    }
    assert ("detach", sandbox_id) in sdk.calls
    sandbox.tunnel_answer = EXC.ServiceError("UNAVAILABLE")
    with pytest.raises(Transient, match="modal tunnels: UNAVAILABLE"):
        await client.tunnels(sandbox_id, wait_seconds=2)
    with pytest.raises(NotFound):
        await client.tunnels("sb-missing", wait_seconds=2)


async def test_endpoints_through_the_real_client_come_from_the_sdks_tunnels(
    sdk: StubModal,
) -> None:
    provider = ModalProvider(make_config(), retry=NO_WAIT)
    try:
        offer = next(o for o in await provider.offers() if o.sku == "h100-x1")
        created = await provider.create(make_spec(ports=(Port(8000),)), offer)
        _, options = next(call[1] for call in sdk.calls if call[0] == "create")
        assert options["unencrypted_ports"] == [8000]
        assert (await provider.get(created.instance_id)).endpoints == ()  # not set up yet
        sdk.sandboxes[created.instance_id].tunnel_answer = {
            8000: StubTunnel("w1.r5.modal.host", 443, "r5.modal.host", 41001)
        }
        reached = (PortEndpoint(8000, "TCP", "r5.modal.host", 41001),)
        assert (await provider.get(created.instance_id)).endpoints == reached
        assert [i.endpoints for i in await provider.list_ours()] == [reached]
    finally:
        await provider.close()


async def test_the_real_client_translates_a_taken_name(sdk: StubModal) -> None:
    from vk_provider_adapters.modal.sdk import ModalSandboxClient

    sdk.create_error = EXC.AlreadyExistsError("Sandbox name vk-uid.0 is already in use")
    with pytest.raises(SandboxNameTaken):
        await ModalSandboxClient(make_config()).create_sandbox(_request())


async def test_the_real_client_reports_missing_credentials_without_values(
    sdk: StubModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vk_provider_adapters.modal.sdk import ModalSandboxClient

    monkeypatch.delenv("TEST_MODAL_TOKEN_SECRET")
    with pytest.raises(AuthFailed, match="TEST_MODAL_TOKEN_SECRET") as raised:
        await ModalSandboxClient(make_config()).get("sb-0")
    assert "ak-id" not in str(raised.value)


# --- GPU shortage: the SDK's wait, then CapacityUnavailable ---------------------------------


async def test_the_create_deadline_outlasts_the_sdks_scheduling_wait(
    provider: ModalProvider, fake: FakeSandboxClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Modal's Sandbox.create waits up to 21 minutes for a GPU before it says "insufficient
    # capacity"; a deadline of ours shorter than that turns a shortage into a retried timeout.
    bounds: list[float | None] = []
    real_timeout = asyncio.timeout

    def recording_timeout(delay: float | None) -> asyncio.Timeout:
        bounds.append(delay)
        return real_timeout(delay)

    monkeypatch.setattr(asyncio, "timeout", recording_timeout)
    await provider.create(make_spec(), await offer_of(provider, "h100-x1"))
    assert bounds and max(b or 0.0 for b in bounds) > SCHEDULING_WAIT_SECONDS >= 21 * 60
    assert CREATE_TIMEOUT_SECONDS > SCHEDULING_WAIT_SECONDS


async def test_a_gpu_shortage_from_the_sdk_is_capacity_unavailable_at_once(
    sdk: StubModal,
) -> None:
    sdk.create_error = EXC.ResourceExhaustedError("Insufficient capacity to create sandbox.")
    provider = ModalProvider(make_config(), retry=NO_WAIT)
    try:
        offer = next(o for o in await provider.offers() if o.sku == "h100-x1")
        with pytest.raises(CapacityUnavailable, match="Insufficient capacity"):
            await provider.create(make_spec(), offer)
    finally:
        await provider.close()
    assert sum(1 for call in sdk.calls if call[0] == "create") == 1  # blocked, not retried


# --- redaction: canaries through every error path ----------------------------------------


def _canary_errors() -> dict[str, Exception]:
    text = canary.echo()
    return {
        "capacity": CapacityUnavailable(f"modal create: {text}"),
        "transient": Transient(f"modal call: {text}"),
        "invalid": InvalidSpec(f"modal call: {text}"),
        "long": Transient("modal call: " + "x" * 285 + " " + canary.KEY),
        "stray": RuntimeError(f"grpc said: {text}"),
    }


@pytest.mark.parametrize("kind", list(_canary_errors()))
@pytest.mark.parametrize(
    "operation", ["offers", "create", "create-existing", "get", "delete", "terminate", "logs"]
)
async def test_no_canary_leaks_from_any_error_path(
    operation: str,
    kind: str,
    fake: FakeSandboxClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TEST_MODAL_TOKEN_SECRET", canary.KEY)
    provider = ModalProvider(
        make_config(), client=fake, retry=dataclasses.replace(NO_WAIT, attempts=2)
    )
    offer = await offer_of(provider, "h100-x1")
    created = await provider.create(make_spec(attempt=4), offer)
    workload = make_spec(env=(EnvVar("HF_TOKEN", canary.SECRET, secret=True),))
    if operation == "create-existing":
        await provider.create(workload, offer)  # the name is taken from now on
    route = {
        "offers": "list",
        "create": "create",
        "create-existing": "from_name",
        "get": "get",
        "delete": "set_tags",
        "terminate": "terminate",
        "logs": "logs",
    }[operation]
    fake.fail(route, _canary_errors()[kind], times=100)
    returned: list[object] = []
    error: BaseException | None = None
    try:
        if operation == "offers":
            returned.append(await provider.offers())
        elif operation.startswith("create"):
            returned.append(await provider.create(workload, offer))
        elif operation == "get":
            returned.append(await provider.get(created.instance_id))
        elif operation in ("delete", "terminate"):
            returned.append(await provider.delete(created.instance_id, grace_seconds=0))
        else:
            returned.append([c async for c in provider.logs(created.instance_id, LogOptions())])
    except ProviderError as exc:
        error = exc
    finally:
        await provider.close()
    values = (canary.KEY, canary.SECRET) if operation.startswith("create") else (canary.KEY,)
    canary.assert_clean(error=error, records=caplog.records, returned=returned, values=values)


@pytest.mark.parametrize("kind", list(_canary_errors()))
async def test_no_canary_leaks_from_a_failed_tunnel_question(
    kind: str,
    fake: FakeSandboxClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("TEST_MODAL_TOKEN_SECRET", canary.KEY)
    provider = ModalProvider(make_config(), client=fake, retry=NO_WAIT)
    created = await provider.create(
        make_spec(ports=(Port(8000),)), await offer_of(provider, "h100-x1")
    )
    fake.fail("tunnels", _canary_errors()[kind], times=100)
    returned = [await provider.get(created.instance_id), await provider.list_ours()]
    canary.assert_clean(error=None, records=caplog.records, returned=returned, values=(canary.KEY,))
