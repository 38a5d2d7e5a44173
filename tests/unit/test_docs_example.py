"""The example adapter of docs/adding-a-provider.md (an installed package) keeps the contract."""

from __future__ import annotations

import pytest
from vk_provider_example.adapter import ExampleProvider
from vk_provider_example.config import ExampleSettings

from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import CapacityUnavailable, NotFound
from vk_provider.domain.models import InstanceState, WorkloadSpec


@pytest.fixture
def provider() -> ExampleProvider:
    return ExampleProvider(ExampleSettings(type="example", name="example"))


def _spec(uid: str, attempt: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid,
        namespace="ns",
        pod_name="p",
        containers=(ContainerSpec(name="c", image="i"),),
        attempt=attempt,
    )


async def test_example_is_a_provider_and_keeps_the_contract(provider: ExampleProvider) -> None:
    assert isinstance(provider, Provider)
    (offer,) = await provider.offers()
    first = await provider.create(_spec("uid-1"), offer)
    again = await provider.create(_spec("uid-1"), offer)
    assert again == first  # idempotent by request id
    assert first.state is InstanceState.RUNNING
    with pytest.raises(CapacityUnavailable):
        await provider.create(_spec("uid-2"), offer)
    assert [i.pod_uid for i in await provider.list_ours()] == ["uid-1"]
    await provider.delete(first.instance_id, grace_seconds=0)
    await provider.delete(first.instance_id, grace_seconds=0)  # missing means done
    with pytest.raises(NotFound):
        await provider.get(first.instance_id)
