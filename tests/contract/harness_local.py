"""Contract harness for the local provider: real processes in a temporary state directory."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

from tests.contract.harness import FailureKind
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.models import InstanceState, Offer, WorkloadSpec
from vk_provider_adapters.local.adapter import LocalProvider
from vk_provider_adapters.local.config import LocalProviderConfig
from vk_provider_adapters.local.faults import inject_loss, set_faults


class LocalHarness:
    name = "local"
    # The local "cloud" has one native failure state of its own: an injected loss.
    native_states: Mapping[str, InstanceState] = {"lost": InstanceState.LOST}
    failure_kinds: frozenset[FailureKind] = frozenset({"capacity", "invalid"})

    def __init__(self) -> None:
        self._state_dir: Path | None = None
        self._invalid_next = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        with tempfile.TemporaryDirectory(prefix="vk-contract-") as tmp:
            self._state_dir = Path(tmp)
            config = LocalProviderConfig.model_validate(
                {
                    "type": "local",
                    "name": "local-contract",
                    "enabled": True,
                    "offers": [{"sku": "cpu", "price_per_hour": 0.1, "capacity": 8}],
                }
            )
            provider = LocalProvider(config, state_dir=self._state_dir)
            try:
                yield provider
            finally:
                for instance in await provider.list_ours():
                    await provider.delete(instance.instance_id, grace_seconds=0)

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        command: tuple[str, ...] = (sys.executable, "-c", "import time; time.sleep(60)")
        if self._invalid_next:
            self._invalid_next = False
            command = ()
        return WorkloadSpec(
            pod_uid=pod_uid,
            namespace="ns",
            pod_name="p",
            containers=(ContainerSpec(name="c", image="example/image:1", command=command),),
            attempt=attempt,
        )

    async def offer(self, provider: Provider) -> Offer:
        return (await provider.offers())[0]

    def unknown_instance_id(self) -> str:
        assert self._state_dir is not None
        # ``local-<pod uid>-<attempt>``, as create names them, with no directory behind it.
        instance_id = "local-uid-never-created-0"
        assert not (self._state_dir / instance_id).exists()
        return instance_id

    def add_foreign_instance(self) -> None:
        assert self._state_dir is not None
        # Things in the state directory that are not instances of ours: a directory of
        # another name, and one named like an instance that holds no instance record.
        (self._state_dir / "not-ours").mkdir()
        stray = self._state_dir / "local-stray-uid-0"
        stray.mkdir()
        (stray / "notes.txt").write_text("not an instance\n")

    def set_native_state(self, instance_id: str, native: str) -> None:
        assert self._state_dir is not None and native == "lost"
        inject_loss(self._state_dir, instance_id)

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        assert self._state_dir is not None
        if kind == "capacity":
            set_faults(self._state_dir, fail_creates=1)
        elif kind == "invalid":
            self._invalid_next = True
        else:
            raise AssertionError(kind)


HARNESS = LocalHarness()
