"""Usage of the virtual node and its pods, from the providers that can measure it.

``UsageCollector.summary()`` asks every provider whose capabilities include ``usage`` for the
containers of each instance the tracker lists as running (concurrently, each call bounded),
and builds the :class:`Summary` that ``/stats/summary`` and ``/metrics/resource`` render.

What a kubelet measures from cgroups we derive from samples:

- ``usageNanoCores`` is the rate between this sample and the previous one of the same
  container run (none on the first sample, as cAdvisor has none either);
- a container's cumulative CPU never goes down within one run (a provider's figure may dip
  when short-lived children are reaped: the previous value is kept);
- the node's CPU counter is the CPU time its pods used since the agent started (each
  container's growth is added, and nothing is taken away when a pod ends), so it is a true
  counter; the node's working set is the sum of its pods' now.

Invariants: pods on providers without usage are left out, never reported as zero; a provider
whose call fails is left out of this summary and marks it ``scrape_error``; state is kept only
for container runs still seen (plus the node's total).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from vk_provider.api.kubelet_stats import ContainerStats, PodStats, Summary, Usage
from vk_provider.controllers.instances import InstanceTracker
from vk_provider.controllers.podwatch import PodStore
from vk_provider.domain.containers import ContainerUsage
from vk_provider.domain.contract import Provider, SupportsUsage
from vk_provider.domain.errors import ProviderError
from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.podview import parse_time

log = logging.getLogger(__name__)

_LIVE = frozenset({InstanceState.RUNNING, InstanceState.TERMINATING})
USAGE_TIMEOUT_SECONDS = 5.0

RunKey = tuple[str, str, datetime | None]  # pod uid, container name, run start


@dataclass(frozen=True, slots=True)
class _Sample:
    cpu: int
    at: datetime


def container_starts(instance: Instance) -> dict[str, datetime | None]:
    """When each container's current run started, as the provider reports it."""
    statuses = (*instance.init_containers, *instance.containers)
    return {status.name: status.started_at for status in statuses}


class UsageCollector:
    """``StatsSource`` of the agent."""

    def __init__(
        self,
        *,
        node_name: str,
        store: PodStore,
        tracker: InstanceTracker,
        providers: Mapping[str, Provider],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timeout_seconds: float = USAGE_TIMEOUT_SECONDS,
    ) -> None:
        self._node = node_name
        self._store = store
        self._tracker = tracker
        self._providers = dict(providers)
        self._clock = clock
        self._timeout = timeout_seconds
        self._started = clock()
        self._previous: dict[RunKey, _Sample] = {}
        self._node_cpu = 0
        self._lock = asyncio.Lock()

    def _measurable(self) -> list[tuple[SupportsUsage, Instance, Mapping[str, Any]]]:
        targets: list[tuple[SupportsUsage, Instance, Mapping[str, Any]]] = []
        for instance in self._tracker.all():
            provider = self._providers.get(instance.provider)
            if provider is None or not provider.capabilities.usage:
                continue
            if instance.state not in _LIVE or not isinstance(provider, SupportsUsage):
                continue
            key = self._store.key_of(instance.pod_uid)
            pod = self._store.get(key) if key is not None else None
            if pod is not None:
                targets.append((provider, instance, pod))
        return targets

    async def _measure(self, provider: SupportsUsage, instance: Instance) -> list[ContainerUsage]:
        async with asyncio.timeout(self._timeout):
            return await provider.usage(instance.instance_id)

    async def summary(self) -> Summary:
        targets = self._measurable()
        answers = await asyncio.gather(
            *(self._measure(provider, instance) for provider, instance, _ in targets),
            return_exceptions=True,
        )
        # One summary at a time: the rates and the node counter compare against the last one.
        async with self._lock:
            return self._summarise(targets, answers)

    def _summarise(
        self,
        targets: list[tuple[SupportsUsage, Instance, Mapping[str, Any]]],
        answers: list[list[ContainerUsage] | BaseException],
    ) -> Summary:
        any_measurable = any(p.capabilities.usage for p in self._providers.values())
        failed = False
        seen: dict[RunKey, _Sample] = {}
        pods = []
        working_set = 0
        for (_, instance, pod), answer in zip(targets, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, ProviderError | TimeoutError):
                    log.warning("usage of %s failed: %r", instance.instance_id, answer)
                failed = True
                continue
            starts = container_starts(instance)
            containers = []
            for measured in answer:
                start = starts.get(measured.name, instance.started_at)
                key = (instance.pod_uid, measured.name, start)
                usage = self._advance(key, measured, seen)
                working_set += usage.memory_working_set_bytes
                containers.append(ContainerStats(measured.name, start, usage))
            if containers:
                metadata = pod.get("metadata") or {}
                pods.append(
                    PodStats(
                        namespace=str(metadata.get("namespace", "")),
                        name=str(metadata.get("name", "")),
                        uid=instance.pod_uid,
                        start_time=parse_time((pod.get("status") or {}).get("startTime")),
                        containers=tuple(containers),
                    )
                )
        if failed:
            # Runs we could not measure this time keep their last sample for the next one.
            seen = {**{k: v for k, v in self._previous.items() if k not in seen}, **seen}
        self._previous = seen
        now = self._clock()
        node_usage = Usage(now, self._node_cpu, working_set) if any_measurable else None
        return Summary(
            node_name=self._node,
            node_start_time=self._started,
            node_usage=node_usage,
            pods=tuple(pods),
            scrape_error=failed,
        )

    def _advance(self, key: RunKey, measured: ContainerUsage, seen: dict[RunKey, _Sample]) -> Usage:
        previous = self._previous.get(key)
        cpu = measured.cpu_core_nanoseconds
        rate = None
        if previous is not None:
            cpu = max(cpu, previous.cpu)
            elapsed = (measured.timestamp - previous.at).total_seconds()
            if elapsed > 0:
                rate = int((cpu - previous.cpu) / elapsed)
        self._node_cpu += cpu - (previous.cpu if previous is not None else 0)
        seen[key] = _Sample(cpu, measured.timestamp)
        return Usage(measured.timestamp, cpu, measured.memory_working_set_bytes, rate)
