"""An in-memory provider: instances are records in a dict, driven by an injected clock.

For tests of the controllers (on simulated time) and for benchmarks that measure the agent
rather than a cloud. A test steers it directly: ``exit`` ends an instance's container with an
exit code, ``lose`` makes the provider lose it, ``fail_next`` makes the next call of one
operation raise a given error, and ``terminate_seconds`` makes termination take time (the
instance reports TERMINATING until then), and ``lost_deletes`` makes a termination stall
(TERMINATING for ever, until it is asked for again), as a cloud that lost a delete does.

With ``whole_pods`` it runs whole pods: every container is reported (plain init containers
completed, sidecars and app containers running once the instance runs), ``set_container``
puts one container in any state (a restart, a back-off, an init container still running),
and ``exit`` ends the pod with every app container exited.

Invariants:
- Idempotent create by ``spec.request_id``; ``capacity`` per offer counts live instances,
  kept per sku as instances come and go, so ``create`` and ``offers`` cost the same however
  many instances exist (only instances due to finish terminating are looked at).
- ``delete`` of an unknown id succeeds; a terminated instance is gone from ``list_ours`` and
  ``get`` raises ``NotFound``, as a cloud forgets what it terminated.
- Only ``domain.errors`` escape.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    ContainerState,
    ContainerStatus,
    Instance,
    InstanceState,
    LogOptions,
    NotFound,
    Offer,
    ProviderError,
    Termination,
    WorkloadSpec,
)
from vk_provider_adapters.memory.config import MemoryProviderConfig
from vk_provider_adapters.simulated import simulated_offer

_LIVE = (InstanceState.PENDING, InstanceState.RUNNING, InstanceState.TERMINATING)


class MemoryProviderDisabled(RuntimeError):
    """The configuration did not opt in to pretend-running pods."""


@dataclass(slots=True)
class _Record:
    instance: Instance
    sku: str
    created: float
    startup: float
    terminate_at: float | None = None
    spec: WorkloadSpec | None = None


class MemoryProvider:
    """``domain.contract.Provider`` keeping its instances in memory."""

    def __init__(
        self,
        config: MemoryProviderConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if not config.enabled:
            raise MemoryProviderDisabled(
                f"provider {config.name!r} (type memory) only pretends to run pods; "
                "set enabled: true to allow it"
            )
        self._config = config
        self._clock = clock
        self._wall = wall_clock
        self._records: dict[str, _Record] = {}
        self._live: dict[str, set[str]] = {}  # sku -> ids of instances that hold capacity
        self._failures: dict[str, list[ProviderError]] = {}
        self.terminate_seconds = 0.0
        self.lost_deletes = 0  # the next N deletes are accepted and then never carried out
        self.calls: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        whole = self._config.whole_pods
        return Capabilities(
            logs=False,
            multi_container=whole,
            init_containers=whole,
            sidecars=whole,
            probes=self._config.probes,
        )

    # --- steering (tests) ---------------------------------------------------------------

    def fail_next(self, operation: str, error: ProviderError, *, times: int = 1) -> None:
        """The next ``times`` calls of ``operation`` (create, get, delete, list, offers) fail."""
        self._failures.setdefault(operation, []).extend([error] * times)

    def exit(self, instance_id: str, code: int) -> None:
        """The instance's container (a whole pod: every app container) ends with ``code``."""
        record = self._records[instance_id]
        now = self._wall()
        ended = tuple(
            replace(
                c,
                state=ContainerState.TERMINATED,
                exit_code=code,
                finished_at=now,
                reason="Completed" if code == 0 else "Error",
            )
            for c in record.instance.containers
        )
        record.instance = replace(
            record.instance,
            state=InstanceState.EXITED,
            exit_code=code,
            finished_at=now,
            containers=ended,
        )
        self._live.get(record.sku, set()).discard(instance_id)

    def set_container(
        self, instance_id: str, status: ContainerStatus, *, init: bool = False
    ) -> None:
        """A whole pod's container (by name) now reports ``status``."""
        record = self._records[instance_id]
        current = record.instance.init_containers if init else record.instance.containers
        if status.name not in {c.name for c in current}:
            raise KeyError(f"instance {instance_id} has no container {status.name!r}")
        updated = tuple(status if c.name == status.name else c for c in current)
        if init:
            record.instance = replace(record.instance, init_containers=updated)
        else:
            record.instance = replace(record.instance, containers=updated)

    def lose(self, instance_id: str, message: str = "lost by the provider") -> None:
        record = self._records[instance_id]
        record.instance = replace(record.instance, state=InstanceState.LOST, message=message)
        self._live.get(record.sku, set()).discard(instance_id)

    def instances(self) -> list[Instance]:
        """Every instance the provider still knows, in any state (for assertions)."""
        return [self._refresh(r) for r in self._records.values()]

    # --- the contract -------------------------------------------------------------------

    def _call(self, operation: str) -> None:
        self.calls[operation] = self.calls.get(operation, 0) + 1
        queued = self._failures.get(operation)
        if queued:
            raise queued.pop(0)

    def _refresh(self, record: _Record) -> Instance:
        now = self._clock()
        instance = record.instance
        if instance.state is InstanceState.PENDING and now >= record.created + record.startup:
            instance = replace(instance, state=InstanceState.RUNNING, started_at=self._wall())
            instance = self._started_containers(instance, record.spec)
        if instance.state is InstanceState.TERMINATING and (
            record.terminate_at is not None and now >= record.terminate_at
        ):
            instance = replace(instance, state=InstanceState.TERMINATED)
        record.instance = instance
        if instance.state not in _LIVE:
            self._live.get(record.sku, set()).discard(instance.instance_id)
        return instance

    def _started_containers(self, instance: Instance, spec: WorkloadSpec | None) -> Instance:
        """A whole pod that starts: init containers completed, the rest running."""
        if spec is None or not self._config.whole_pods:
            return instance
        now = self._wall()
        inits = tuple(
            ContainerStatus(c.name, ContainerState.RUNNING, started_at=now)
            if c.sidecar
            else ContainerStatus(
                c.name,
                ContainerState.TERMINATED,
                reason="Completed",
                exit_code=0,
                started_at=now,
                finished_at=now,
            )
            for c in spec.init_containers
        )
        apps = tuple(
            ContainerStatus(c.name, ContainerState.RUNNING, started_at=now) for c in spec.containers
        )
        return replace(instance, containers=apps, init_containers=inits)

    def _active(self, sku: str) -> int:
        live = self._live.get(sku, set())
        for instance_id in [i for i in live if self._records[i].terminate_at is not None]:
            self._refresh(self._records[instance_id])  # may have finished terminating
        return len(live)

    async def offers(self) -> list[Offer]:
        self._call("offers")
        return [
            simulated_offer(self.name, offer, active=self._active(offer.sku))
            for offer in self._config.offers
        ]

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        self._call("create")
        instance_id = f"mem-{spec.request_id}"
        existing = self._records.get(instance_id)
        if existing is not None:
            return self._refresh(existing)
        configured = next((o for o in self._config.offers if o.sku == offer.sku), None)
        if configured is None or offer.provider != self.name:
            raise CapacityUnavailable(f"no offer {offer.key} here", provider=self.name)
        if self._active(configured.sku) >= configured.capacity:
            raise CapacityUnavailable(f"offer {offer.key} is at capacity", provider=self.name)
        started = configured.startup_seconds <= 0
        instance = Instance(
            provider=self.name,
            instance_id=instance_id,
            pod_uid=spec.pod_uid,
            attempt=spec.attempt,
            state=InstanceState.RUNNING if started else InstanceState.PENDING,
            offer_key=offer.key,
            started_at=self._wall() if started else None,
            ip="127.0.0.1",
            price_per_hour=configured.price_per_hour,
        )
        if started:
            instance = self._started_containers(instance, spec)
        self._records[instance_id] = _Record(
            instance, configured.sku, self._clock(), configured.startup_seconds, spec=spec
        )
        self._live.setdefault(configured.sku, set()).add(instance_id)
        return instance

    async def get(self, instance_id: str) -> Instance:
        self._call("get")
        record = self._records.get(instance_id)
        if record is None or self._refresh(record).state is InstanceState.TERMINATED:
            self._forget(instance_id)
            raise NotFound(f"no instance {instance_id!r}", provider=self.name)
        return record.instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        self._call("delete")
        record = self._records.get(instance_id)
        if record is None:
            return
        state = self._refresh(record).state
        stalled = state is InstanceState.TERMINATING and record.terminate_at is None
        if self.lost_deletes > 0 and state in _LIVE:
            # A cloud that says "terminating" and then forgets to: only a new request helps.
            self.lost_deletes -= 1
            record.terminate_at = None
            record.instance = replace(record.instance, state=InstanceState.TERMINATING)
            return
        if state in (InstanceState.PENDING, InstanceState.RUNNING) or stalled:
            if self.terminate_seconds > 0:
                record.terminate_at = self._clock() + self.terminate_seconds
                record.instance = replace(record.instance, state=InstanceState.TERMINATING)
                return
        elif state is InstanceState.TERMINATING:
            return  # under way
        self._forget(instance_id)

    async def list_ours(self) -> list[Instance]:
        self._call("list")
        listed = []
        for instance_id, record in list(self._records.items()):
            instance = self._refresh(record)
            if instance.state is InstanceState.TERMINATED:
                self._forget(instance_id)
                continue
            listed.append(instance)
        return listed

    def _forget(self, instance_id: str) -> None:
        record = self._records.pop(instance_id, None)
        if record is not None:
            self._live.get(record.sku, set()).discard(instance_id)

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        self._call("logs")
        if instance_id not in self._records:
            raise NotFound(f"no instance {instance_id!r}", provider=self.name)
        return
        yield b""  # pragma: no cover - makes this an async generator

    async def restart_container(self, instance_id: str, container: str) -> None:
        """A whole pod's container is killed and started again at once (no back-off here)."""
        self._call("restart_container")
        record = self._records.get(instance_id)
        if record is None:
            raise NotFound(f"no instance {instance_id!r}", provider=self.name)
        current = next((c for c in record.instance.containers if c.name == container), None)
        if current is None:
            raise NotFound(
                f"instance {instance_id} has no container {container!r}", provider=self.name
            )
        now = self._wall()
        killed = Termination(
            exit_code=137, reason="Error", started_at=current.started_at, finished_at=now
        )
        self.set_container(
            instance_id,
            ContainerStatus(
                container,
                ContainerState.RUNNING,
                started_at=now,
                restart_count=current.restart_count + 1,
                last_termination=killed,
            ),
        )

    async def close(self) -> None:
        return None
