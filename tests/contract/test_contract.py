"""One contract, every adapter: the promises of ``providers/contract.py`` checked uniformly.

Harnesses are found by module name (``harness_*.py`` beside this file, each exporting
``HARNESS``), so adding an adapter's harness adds it to every test here.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from tests.contract.harness import ContractHarness, FailureKind
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
from vk_provider.domain.models import InstanceState


def _harnesses() -> list[ContractHarness]:
    found = []
    for module in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if module.name.startswith("harness_"):
            found.append(importlib.import_module(f"tests.contract.{module.name}").HARNESS)
    return found


HARNESSES = _harnesses()


@pytest.fixture(params=HARNESSES, ids=lambda h: h.name)
def harness(request: pytest.FixtureRequest) -> ContractHarness:
    return request.param  # type: ignore[no-any-return]


async def test_has_every_method_of_the_provider_protocol_and_a_name(
    harness: ContractHarness,
) -> None:
    async with harness.running() as provider:
        assert isinstance(provider, Provider)
        assert provider.name


async def test_create_is_idempotent_by_request_id(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        offer = await harness.offer(provider)
        first = await provider.create(harness.spec("uid-idem"), offer)
        second = await provider.create(harness.spec("uid-idem"), offer)
        assert second.instance_id == first.instance_id
        assert first.pod_uid == "uid-idem"
        mine = [i for i in await provider.list_ours() if i.pod_uid == "uid-idem"]
        assert len(mine) == 1
        # A new attempt of the same pod is a new launch.
        third = await provider.create(harness.spec("uid-idem", attempt=1), offer)
        assert third.instance_id != first.instance_id
        assert third.attempt == 1


async def test_get_of_an_unknown_instance_is_not_found(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        with pytest.raises(NotFound):
            await provider.get(harness.unknown_instance_id())


async def test_deleting_a_missing_instance_succeeds(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        unknown = harness.unknown_instance_id()
        await provider.delete(unknown, grace_seconds=0)  # no error: nothing to delete is done
        with pytest.raises(NotFound):  # and the delete did not bring it into being
            await provider.get(unknown)


async def test_deleting_an_instance_twice_succeeds(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        created = await provider.create(harness.spec("uid-del"), await harness.offer(provider))
        await provider.delete(created.instance_id, grace_seconds=0)
        await provider.delete(created.instance_id, grace_seconds=0)


async def test_a_deleted_instance_reads_as_ending_or_not_found(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        created = await provider.create(harness.spec("uid-x"), await harness.offer(provider))
        await provider.delete(created.instance_id, grace_seconds=0)
        try:
            got = await provider.get(created.instance_id)
        except NotFound:
            return  # gone already
        # A provider may still report the instance for a while, but only as ending.
        assert got.state in (InstanceState.TERMINATING, InstanceState.TERMINATED), got.state


async def test_list_returns_only_our_instances(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        harness.add_foreign_instance()
        created = await provider.create(harness.spec("uid-ours"), await harness.offer(provider))
        listed = await provider.list_ours()
        assert [i.instance_id for i in listed] == [created.instance_id]
        assert listed[0].pod_uid == "uid-ours"


async def test_every_documented_state_maps(harness: ContractHarness) -> None:
    async with harness.running() as provider:
        created = await provider.create(harness.spec("uid-states"), await harness.offer(provider))
        assert harness.native_states, f"{harness.name} documents no native states"
        for native, expected in harness.native_states.items():
            harness.set_native_state(created.instance_id, native)
            got = await provider.get(created.instance_id)
            assert got.state is expected, f"{native} -> {got.state}, expected {expected}"


_EXPECTED: dict[FailureKind, type[ProviderError]] = {
    "capacity": CapacityUnavailable,
    "rate_limit": RateLimited,
    "transient": Transient,
    "auth": AuthFailed,
    "invalid": InvalidSpec,
}


@pytest.mark.parametrize("kind", list(_EXPECTED))
async def test_each_create_error_lands_in_its_class(
    harness: ContractHarness, kind: FailureKind
) -> None:
    if kind not in harness.failure_kinds:
        pytest.skip(f"{harness.name} cannot produce {kind} failures")
    async with harness.running() as provider:
        offer = await harness.offer(provider)
        harness.fail_next(kind, operation="create")
        with pytest.raises(ProviderError) as raised:
            await provider.create(harness.spec(f"uid-{kind}"), offer)
        assert isinstance(raised.value, _EXPECTED[kind]), repr(raised.value)
