"""Prometheus metrics of the agent, with conventional names and units.

Counters and histograms are updated by the parts that see the events (through the small
``Metrics`` methods); gauges that describe the current state (pods, breakers, offers,
spend) are computed at scrape time from the ``AgentView`` by a custom collector, so they can
never drift from what the REST API reports.

Invariants: one ``CollectorRegistry`` per agent (no global registry, so tests and several
agents in one process do not collide); label values are provider names, namespaces, phases
and error classes — never instance ids, pod names of unbounded cardinality, or secrets.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vk_provider.api.view import AgentView
from vk_provider.controllers.overflow import OverflowView
from vk_provider.domain.overflow import OverflowState

PREFIX = "vk_provider"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.provider_requests = Histogram(
            f"{PREFIX}_provider_request_duration_seconds",
            "Duration of provider API calls.",
            ["provider", "operation"],
            registry=self.registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.provider_errors = Counter(
            f"{PREFIX}_provider_errors",
            "Provider API calls that failed, by error class.",
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
        self.reconcile_duration = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one reconciliation (instance poll) cycle.",
            registry=self.registry,
        )
        self.orphans_terminated = Counter(
            f"{PREFIX}_orphans_terminated",
            "Provider instances terminated because no pod owned them.",
            ["provider"],
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

    def observe_call(
        self, provider: str, operation: str, seconds: float, error: BaseException | None
    ) -> None:
        """The ``GuardedProvider`` observer: latency of every call, errors by class."""
        self.provider_requests.labels(provider, operation).observe(seconds)
        if error is not None:
            self.provider_errors.labels(provider, operation, type(error).__name__).inc()

    # --- ControllerObserver -----------------------------------------------------------------

    def placement(self, outcome: str) -> None:
        self.placements.labels(outcome).inc()

    def launch_failed(self, provider: str, error: str) -> None:
        self.launch_failures.labels(provider, error).inc()

    def reconciled(self, seconds: float) -> None:
        self.reconcile_duration.observe(seconds)

    def instance_terminated(self, provider: str, reason: str) -> None:
        self.orphans_terminated.labels(provider).inc()

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
            f"{PREFIX}_provider_circuit_state",
            "Circuit breaker state per provider (1 for the current state).",
            labels=["provider", "state"],
        )
        healthy = GaugeMetricFamily(
            f"{PREFIX}_provider_up",
            "Whether the provider answers (1) or not (0).",
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
