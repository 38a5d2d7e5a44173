"""The adapter: one simulated GPU machine, kept in memory; enough to show the contract."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    Instance,
    InstanceState,
    LogOptions,
    NotFound,
    Offer,
    WorkloadSpec,
)
from vk_provider_example.config import ExampleSettings


class ExampleProvider:
    """Runs at most one pod at a time on its one (pretend) GPU."""

    def __init__(self, settings: ExampleSettings) -> None:
        self._settings = settings
        self._instances: dict[str, Instance] = {}

    @property
    def name(self) -> str:
        return self._settings.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=False)

    async def offers(self) -> list[Offer]:
        busy = sum(i.state is InstanceState.RUNNING for i in self._instances.values())
        return [
            Offer(
                provider=self.name,
                sku="one-gpu",
                region="memory",
                gpu_model=self._settings.gpu_model,
                gpu_count=1,
                gpu_memory_gib=80,
                vcpus=8,
                memory_gib=64,
                price_per_hour=self._settings.price_per_hour,
                available=1 - busy,
            )
        ]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        instance_id = f"example-{spec.request_id}"  # the idempotency key is in the name
        if instance_id in self._instances:
            return self._instances[instance_id]
        if (await self.offers())[0].available < 1:
            raise CapacityUnavailable("the one GPU is taken", provider=self.name)
        instance = Instance(
            provider=self.name,
            instance_id=instance_id,
            pod_uid=spec.pod_uid,
            attempt=spec.attempt,
            state=InstanceState.RUNNING,
            offer_key=offer.key,
            started_at=datetime.now(UTC),
            ip="127.0.0.1",
            price_per_hour=offer.price_per_hour,
        )
        self._instances[instance_id] = instance
        return instance

    async def get(self, instance_id: str) -> Instance:
        try:
            return self._instances[instance_id]
        except KeyError:
            raise NotFound(f"no instance {instance_id}", provider=self.name) from None

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        self._instances.pop(instance_id, None)  # missing means done

    async def list_ours(self) -> list[Instance]:
        return list(self._instances.values())

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        raise NotFound("this provider keeps no logs", provider=self.name)
        yield b""  # makes this an async generator

    async def close(self) -> None:
        return None
