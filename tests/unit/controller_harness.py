"""The agent's controllers wired as in production, on a fake API and in-memory providers.

``Core`` builds the real ``PodWatch``, ``PodController``, ``Reconciler``, ``Launcher``,
``OfferBook`` and budget ledger around a ``FakeKube`` and ``MemoryProvider``s, every clock
taken from the running event loop — so a test marked ``@pytest.mark.looptime`` runs minutes of
agent time in milliseconds, with exact delays. ``async with core.running():`` starts the root
tasks and cancels and awaits them on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from tests.unit.fake_kube import FakeKube
from vk_provider.api.metrics import Metrics
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.pods import PodController
from vk_provider.controllers.podwatch import PodStore, PodWatch
from vk_provider.controllers.preview import PlacementPreview
from vk_provider.controllers.reconcile import Reconciler
from vk_provider.domain.breaker import CircuitBreaker
from vk_provider.domain.budget import BudgetCaps, BudgetLedger
from vk_provider.domain.contract import Provider
from vk_provider.domain.reconcile import TerminationPolicy
from vk_provider.kube.events import EventRecorder
from vk_provider.runtime.agent_breakers import health_of
from vk_provider.settings.agent import IntervalsConfig, PlacementConfig
from vk_provider_adapters.memory.adapter import MemoryProvider
from vk_provider_adapters.memory.config import MemoryProviderConfig

EPOCH = datetime(2026, 12, 1, tzinfo=UTC)
NODE = "vk-test"
T = TypeVar("T")


def loop_now() -> datetime:
    """Wall-clock time that moves with the event loop's (simulated) time."""
    return EPOCH + timedelta(seconds=asyncio.get_running_loop().time())


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def memory_provider(name: str, *offers: dict[str, Any], **settings: Any) -> MemoryProvider:
    config = MemoryProviderConfig.model_validate(
        {"type": "memory", "name": name, "enabled": True, "offers": list(offers), **settings}
    )
    return MemoryProvider(config, clock=loop_time, wall_clock=loop_now)


def gpu_offer(
    sku: str = "a100", *, price: float = 1.5, capacity: int = 4, **extra: Any
) -> dict[str, Any]:
    return {
        "sku": sku,
        "gpu_model": "A100-80GB",
        "gpu_count": 1,
        "gpu_memory_gib": 80,
        "vcpus": 8,
        "memory_gib": 64,
        "price_per_hour": price,
        "capacity": capacity,
        **extra,
    }


def pod_manifest(
    name: str,
    *,
    command: list[str] | None = None,
    policy: str = "Always",
    gpus: int = 1,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "example.com/infer:1",
        "command": command or ["serve"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 10,
            "containers": [container],
            **spec,
        },
    }


class Core:
    def __init__(
        self,
        *providers: Provider,
        budget: BudgetCaps | None = None,
        intervals: dict[str, Any] | None = None,
        placement: dict[str, Any] | None = None,
        guarded: bool = False,
        breaker_health: bool = False,
        kube: FakeKube | None = None,
    ) -> None:
        # ``kube``: the API server of an agent that ran before (a restart of the agent).
        self.kube = kube if kube is not None else FakeKube(now=loop_now)
        self.memory = {p.name: p for p in providers if isinstance(p, MemoryProvider)}
        self.metrics = Metrics()
        # As the agent wires them: every call through a circuit breaker (and its metrics).
        self.guarded = {
            p.name: GuardedProvider(
                p, CircuitBreaker(clock=loop_time), observe=self.metrics.observe_call
            )
            for p in providers
        }
        self.providers: dict[str, Provider] = (
            dict(self.guarded) if guarded else {p.name: p for p in providers}
        )
        self.intervals = IntervalsConfig.model_validate(
            {
                "pod_status_seconds": 1,
                "restart_backoff_seconds": 10,
                "retry_backoff_seconds": 5,
                "orphan_grace_seconds": 20,
                "termination_deadline_seconds": 60,
                **(intervals or {}),
            }
        )
        self.offers = OfferBook(self.providers, ttl_seconds=30, clock=loop_time)
        self.ledger = BudgetLedger(budget or BudgetCaps(), clock=loop_time)
        self.launcher = Launcher(
            self.providers,
            self.ledger,
            settings=PlacementConfig.model_validate(placement or {}),
            # As the agent wires it (runtime.agent_breakers.health_of) when asked, else all healthy.
            health=(lambda: health_of(self.guarded)) if breaker_health else dict,
            clock=loop_time,
        )
        self.store = PodStore()
        # As the agent runs it: Events queued by the syncs, written by senders of their own.
        self.events = EventRecorder(self.kube, node_name=NODE, clock=loop_time)  # type: ignore[arg-type]
        self.pods = PodController(
            self.kube,  # type: ignore[arg-type]  # duck-typed: the same calls, in memory
            node_name=NODE,
            host_ip="10.0.0.1",
            providers=self.providers,
            offers=self.offers,
            recorder=self.events,
            launcher=self.launcher,
            store=self.store,
            intervals=self.intervals,
            workers=4,
            observer=self.metrics,
            queue_observer=self.metrics.work_queue("pods"),
            now=loop_now,
        )
        self.preview = PlacementPreview(
            launcher=self.launcher, offers=self.offers, node_name=NODE, host_ip="10.0.0.1"
        )
        self.watch = PodWatch(
            self.kube,  # type: ignore[arg-type]
            node_name=NODE,
            store=self.store,
            on_change=self.pods.pod_changed,
            on_listed=self.pods.api_answers,
            timeout_seconds=60,
        )
        self.reconciler = Reconciler(
            store=self.store,
            watch=self.watch,
            pods=self.pods,
            providers=self.providers,
            interval=self.intervals.pod_status_seconds,
            grace=self.intervals.orphan_grace_seconds,
            policy=TerminationPolicy(deadline=self.intervals.termination_deadline_seconds),
            clock=loop_time,
        )

    def view(self) -> AgentView:
        """The REST API's and the metrics' view of this agent, as the runtime builds it."""
        view = AgentView(
            providers=self.guarded,
            provider_types={name: "test" for name in self.guarded},
            offers=self.offers,
            ledger=self.ledger,
            placements=self.pods.placements,
            readiness=lambda: Readiness(ready=True, reasons=()),
            overdue=lambda: self.reconciler.overdue,
            instances=self.pods.tracker.all,
            preview=self.preview.preview,
            clock=loop_time,
        )
        self.metrics.attach(view)
        return view

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Core]:
        tasks = [
            asyncio.create_task(self.watch.run(), name="pod-watch"),
            asyncio.create_task(self.reconciler.run(), name="reconcile"),
            asyncio.create_task(self.pods.run_workers(), name="pod-workers"),
            asyncio.create_task(self.events.run(), name="pod-events"),
        ]
        try:
            yield self
        finally:
            self.pods.queue.close()
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for task, result in zip(tasks, results, strict=True):
                if isinstance(result, BaseException) and not isinstance(
                    result, asyncio.CancelledError
                ):
                    raise AssertionError(f"root task {task.get_name()} died") from result

    async def until(
        self,
        predicate: Callable[[], T | Awaitable[T]],
        *,
        within: float = 300.0,
        step: float = 0.5,
        what: str,
    ) -> T:
        """Simulated seconds until ``predicate`` holds (fails the test after ``within``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while True:
            result = predicate()
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            if result:
                return result  # type: ignore[return-value]
            if loop.time() > deadline:
                raise AssertionError(f"not within {within}s of agent time: {what}")
            await asyncio.sleep(step)

    def phase(self, name: str, namespace: str = "ns") -> str | None:
        pod = self.kube.pod(namespace, name)
        return None if pod is None else (pod.get("status") or {}).get("phase")

    def annotation(self, name: str, key: str, namespace: str = "ns") -> str | None:
        pod = self.kube.pod(namespace, name) or {}
        return ((pod.get("metadata") or {}).get("annotations") or {}).get(key)

    def status(self, name: str, namespace: str = "ns") -> dict[str, Any]:
        pod = self.kube.pod(namespace, name) or {}
        return dict(pod.get("status") or {})

    def condition(self, name: str, kind: str, namespace: str = "ns") -> str | None:
        for condition in self.status(name, namespace).get("conditions") or []:
            if condition.get("type") == kind:
                return str(condition.get("status"))
        return None

    def container_status(self, name: str, namespace: str = "ns") -> dict[str, Any]:
        pod = self.kube.pod(namespace, name) or {}
        statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
        return dict(statuses[0])
