"""Prometheus metrics of the agent, with conventional names and units (docs/metrics.md).

Counters and histograms are updated by the parts that see the events (through the small
``Metrics`` methods: the ``GuardedProvider``'s call observer, the ``ControllerObserver`` of
the controllers, a ``QueueObserver`` per work queue, the ``OverflowObserver``); gauges that
describe the current state (pods, instances, breakers, offers, spend) are computed at scrape
time from the ``AgentView`` by a custom collector, so they can never drift from what the REST
API reports.

Naming follows the Prometheus conventions: one ``vk_provider_`` prefix and no repetition of
it (``vk_provider_request_duration_seconds{provider}``, not ``..._provider_provider_...``),
base units in the name (``_seconds``, ``_dollars``), ``_total`` on counters, ``_info`` for
the constant build labels; the work-queue families mirror client-go's ``workqueue_*``.

Invariants: one ``CollectorRegistry`` per agent (no global registry, so tests and several
agents in one process do not collide); label values are provider names, namespaces, phases,
states, queue names and error classes — never instance ids, pod names of unbounded
cardinality, or secrets.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vk_provider import __version__
from vk_provider.api.view import AgentView
from vk_provider.controllers.overflow import OverflowView
from vk_provider.controllers.workqueue import QueueObserver
from vk_provider.domain.models import InstanceState
from vk_provider.domain.overflow import OverflowState

PREFIX = "vk_provider"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Provider calls: tens of milliseconds (a cached list) to tens of seconds (a VM create).
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# Binding to Running: a local process in a second, a cloud VM in minutes.
POD_START_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)
# Work queues: how long a key waits for a worker, how long one sync takes.
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60)
WORK_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _label(reason: str) -> str:
    """A free-text reason as a label value: ``its pod has ended`` -> ``its_pod_has_ended``."""
    return re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_") or "unknown"


class _QueueMetrics:
    """The ``QueueObserver`` of one named work queue: client-go's workqueue metrics."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._depth = metrics.queue_depth.labels(name)
        self._adds = metrics.queue_adds.labels(name)
        self._latency = metrics.queue_latency.labels(name)
        self._work = metrics.queue_work.labels(name)
        self._retries = metrics.queue_retries.labels(name)

    def added(self) -> None:
        self._adds.inc()

    def depth(self, keys: int) -> None:
        self._depth.set(keys)

    def waited(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def worked(self, seconds: float) -> None:
        self._work.observe(seconds)

    def retried(self) -> None:
        self._retries.inc()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge(
            f"{PREFIX}_build_info",
            "Always 1; the labels say which vk-provider and Python run.",
            ["version", "python_version"],
            registry=self.registry,
        )
        self.build_info.labels(__version__, platform.python_version()).set(1)
        self.provider_requests = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Duration of calls to provider APIs, by provider and operation.",
            ["provider", "operation"],
            registry=self.registry,
            buckets=REQUEST_BUCKETS,
        )
        self.provider_errors = Counter(
            f"{PREFIX}_request_errors",
            "Calls to provider APIs that failed, by provider, operation and error class.",
            ["provider", "operation", "error"],
            registry=self.registry,
        )
        self.placements = Counter(
            f"{PREFIX}_placement_attempts",
            "Placement attempts by result: launched, no_capacity, budget_exceeded, invalid, retry.",
            ["result"],
            registry=self.registry,
        )
        self.launch_failures = Counter(
            f"{PREFIX}_launch_failures",
            "Failed launch attempts on one offer, by provider and error class.",
            ["provider", "error"],
            registry=self.registry,
        )
        self.pod_start = Histogram(
            f"{PREFIX}_pod_start_duration_seconds",
            "From a pod's binding to the virtual node (PodScheduled) to the agent first "
            "reporting it Running, by the provider it runs on; once per pod.",
            ["provider"],
            registry=self.registry,
            buckets=POD_START_BUCKETS,
        )
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one reconciliation (instance poll) cycle.",
            registry=self.registry,
        )
        self.instances_terminated = Counter(
            f"{PREFIX}_instances_terminated",
            "Provider instances reconciliation terminated, by provider and reason (orphan, "
            "duplicate, its_pod_has_ended).",
            ["provider", "reason"],
            registry=self.registry,
        )
        self.overflow_transitions = Counter(
            f"{PREFIX}_overflow_transitions",
            "Transitions of the overflow flip, by the state entered (open, closed).",
            ["to"],
            registry=self.registry,
        )
        self.lease_renewal_failures = Counter(
            f"{PREFIX}_lease_renewal_failures",
            "Node Lease renewals that failed or were skipped because no provider answered.",
            registry=self.registry,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica leads (runs the node), 0 while it follows.",
            registry=self.registry,
        )
        self.leader_transitions = Counter(
            f"{PREFIX}_leader_transitions",
            "Times this replica started or stopped leading.",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            f"{PREFIX}_workqueue_depth",
            "Keys waiting in a work queue for a worker.",
            ["name"],
            registry=self.registry,
        )
        self.queue_adds = Counter(
            f"{PREFIX}_workqueue_adds",
            "Keys added to a work queue (a key already waiting is not added again).",
            ["name"],
            registry=self.registry,
        )
        self.queue_latency = Histogram(
            f"{PREFIX}_workqueue_queue_duration_seconds",
            "How long a key waited in a work queue before a worker took it.",
            ["name"],
            registry=self.registry,
            buckets=QUEUE_BUCKETS,
        )
        self.queue_work = Histogram(
            f"{PREFIX}_workqueue_work_duration_seconds",
            "How long processing one key of a work queue took.",
            ["name"],
            registry=self.registry,
            buckets=WORK_BUCKETS,
        )
        self.queue_retries = Counter(
            f"{PREFIX}_workqueue_retries",
            "Keys requeued after their back-off (rate-limited retries) in a work queue.",
            ["name"],
            registry=self.registry,
        )

    def observe_call(
        self, provider: str, operation: str, seconds: float, error: BaseException | None
    ) -> None:
        """The ``GuardedProvider`` observer: latency of every call, errors by class."""
        self.provider_requests.labels(provider, operation).observe(seconds)
        if error is not None:
            self.provider_errors.labels(provider, operation, type(error).__name__).inc()

    def work_queue(self, name: str) -> QueueObserver:
        """The observer for the work queue called ``name`` (the ``name`` label)."""
        return _QueueMetrics(self, name)

    # --- ControllerObserver -----------------------------------------------------------------

    def placement(self, outcome: str) -> None:
        self.placements.labels(outcome).inc()

    def launch_failed(self, provider: str, error: str) -> None:
        self.launch_failures.labels(provider, error).inc()

    def reconciled(self, seconds: float) -> None:
        self.reconcile_duration.observe(seconds)

    def instance_terminated(self, provider: str, reason: str) -> None:
        self.instances_terminated.labels(provider, _label(reason)).inc()

    def pod_started(self, provider: str, seconds: float) -> None:
        self.pod_start.labels(provider).observe(max(seconds, 0.0))

    # --- OverflowObserver -------------------------------------------------------------------

    def overflow_evaluated(self, view: OverflowView) -> None:
        return None  # the gauges are read from the view at scrape time

    def overflow_transition(self, to: OverflowState) -> None:
        self.overflow_transitions.labels(to.value).inc()

    def attach(self, view: AgentView) -> None:
        self.registry.register(_StateCollector(view))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges computed from the agent's current state at scrape time."""

    def __init__(self, view: AgentView) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        pods = GaugeMetricFamily(
            f"{PREFIX}_pods", "Pods placed on providers, by phase.", labels=["provider", "phase"]
        )
        counts: dict[tuple[str, str], int] = {}
        for pod in self._view.pods():
            counts[(pod.provider, pod.phase)] = counts.get((pod.provider, pod.phase), 0) + 1
        for (provider, phase), count in sorted(counts.items()):
            pods.add_metric([provider, phase], count)
        yield pods

        breaker = GaugeMetricFamily(
            f"{PREFIX}_circuit_breaker_state",
            "Circuit breaker state per provider (1 for the current state).",
            labels=["provider", "state"],
        )
        healthy = GaugeMetricFamily(
            f"{PREFIX}_up",
            "Whether the provider is healthy (1: its breaker is closed and its last offers "
            "query answered) or not (0).",
            labels=["provider"],
        )
        overdue = GaugeMetricFamily(
            f"{PREFIX}_terminations_overdue",
            "Instances asked to terminate past the deadline that the provider still lists.",
            labels=["provider"],
        )
        for status in self._view.providers():
            for state in ("closed", "open", "half-open"):
                breaker.add_metric(
                    [status.name, state], 1.0 if status.breaker_state == state else 0.0
                )
            healthy.add_metric([status.name], 1.0 if status.healthy else 0.0)
            overdue.add_metric([status.name], status.terminations_overdue)
        yield breaker
        yield healthy
        yield overdue

        instances = GaugeMetricFamily(
            f"{PREFIX}_instances",
            "Provider instances the agent knows (the last poll and launches since), by "
            "provider and state.",
            labels=["provider", "state"],
        )
        by_state: dict[tuple[str, str], int] = {
            (name, state.value): 0
            for name in self._view.provider_names()
            for state in InstanceState
        }
        for instance in self._view.instances():
            key = (instance.provider, instance.state.value)
            by_state[key] = by_state.get(key, 0) + 1
        for (provider, state), count in sorted(by_state.items()):
            instances.add_metric([provider, state], count)
        yield instances

        offers = GaugeMetricFamily(
            f"{PREFIX}_offers",
            "Offers known, by provider and GPU model.",
            labels=["provider", "gpu"],
        )
        cheapest = GaugeMetricFamily(
            f"{PREFIX}_offer_cheapest_price_dollars_per_hour",
            "Cheapest offer per GPU model ($/hour for the whole instance).",
            labels=["gpu"],
        )
        offer_counts: dict[tuple[str, str], int] = {}
        best: dict[str, float] = {}
        for offer in self._view.offers():
            gpu = offer.gpu_model or "none"
            offer_counts[(offer.provider, gpu)] = offer_counts.get((offer.provider, gpu), 0) + 1
            best[gpu] = min(best.get(gpu, offer.price_per_hour), offer.price_per_hour)
        for (provider, gpu), count in sorted(offer_counts.items()):
            offers.add_metric([provider, gpu], count)
        for gpu, price in sorted(best.items()):
            cheapest.add_metric([gpu], price)
        yield offers
        yield cheapest

        spend_rate = GaugeMetricFamily(
            f"{PREFIX}_spend_dollars_per_hour",
            "Current cost of running instances ($/hour).",
            labels=["provider", "namespace"],
        )
        spent = CounterMetricFamily(
            f"{PREFIX}_spend_dollars",
            "Accumulated cost since the agent started ($).",
            labels=["provider", "namespace"],
        )
        for row in self._view.spend():
            spend_rate.add_metric([row.provider, row.namespace], row.per_hour)
            spent.add_metric([row.provider, row.namespace], row.accumulated)
        yield spend_rate
        yield spent

        flip = self._view.overflow()
        if flip is None:
            return
        is_open = GaugeMetricFamily(
            f"{PREFIX}_overflow_open",
            "Whether the overflow flip is open (1: the node takes overflow) or closed (0).",
        )
        is_open.add_metric([], 1.0 if flip.state is OverflowState.OPEN else 0.0)
        yield is_open
        signal_up = GaugeMetricFamily(
            f"{PREFIX}_overflow_signal_up",
            "Whether the last reading of the GPU signal from Prometheus worked.",
        )
        signal_up.add_metric([], 1.0 if flip.signal_ok else 0.0)
        yield signal_up
        if flip.reading is not None:
            own = GaugeMetricFamily(
                f"{PREFIX}_overflow_own_gpus",
                "Own GPUs in the last reading: allocatable, requested, free, unscheduled demand.",
                labels=["kind"],
            )
            r = flip.reading
            for kind, value in (
                ("allocatable", r.allocatable),
                ("requested", r.requested),
                ("free", r.free),
                ("unscheduled", r.unscheduled),
            ):
                own.add_metric([kind], value)
            yield own
        if flip.last_evaluation is not None:
            last = GaugeMetricFamily(
                f"{PREFIX}_overflow_last_evaluation_timestamp_seconds",
                "When the overflow flip last evaluated (Unix time).",
            )
            last.add_metric([], flip.last_evaluation.timestamp())
            yield last
