"""The minimal adapter in docs/adding-a-provider.md is real code that honours the contract."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import CapacityUnavailable, NotFound
from vk_provider.domain.models import InstanceState, WorkloadSpec

DOC = Path(__file__).resolve().parents[2] / "docs" / "adding-a-provider.md"


@pytest.fixture
def provider() -> Any:
    (code,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace["InMemoryProvider"]()


def _spec(uid: str, attempt: int = 0) -> WorkloadSpec:
    return WorkloadSpec(
        pod_uid=uid, namespace="ns", pod_name="p", container_name="c", image="i", attempt=attempt
    )


async def test_example_is_a_provider_and_keeps_the_contract(provider: Any) -> None:
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
