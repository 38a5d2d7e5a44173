"""The agent process: wires every part from the configuration and supervises its tasks.

All long-lived tasks start here and nowhere else, under one supervisor
(``runtime.supervisor``): the REST and kubelet API servers, the node Lease and status loops,
the pod watch, reconciliation and the pod workers. If any of them ends or dies, the agent logs
which one and why and stops with a non-zero exit. SIGTERM/SIGINT stop everything within
bounded time and exit 0.

Invariants: wiring only — settings objects are passed to the parts that use them, never
copied field by field; providers are built (by the registry) before anything touches the
cluster, so a bad provider configuration fails fast; the node is registered before pods are
watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vk_provider.api.authn import SubjectAccessReviewAuthorizer, TokenReviewAuthenticator
from vk_provider.api.kubelet import KubeletApiServer, KubeletSources
from vk_provider.api.kubelet_agent import AgentPods, AgentStreams
from vk_provider.api.metrics import Metrics
from vk_provider.api.nodestats import UsageCollector
from vk_provider.api.podlogs import AttemptHistory, PodLogSource
from vk_provider.api.rest import RestServer, build_app
from vk_provider.api.rest_auth import RestAuth, StaticTokenAuth, TokenReviewAuth
from vk_provider.api.tls import build_server_ssl_context, ensure_serving_certificate
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.node import NodeController, default_address
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowController
from vk_provider.controllers.pods import PodController
from vk_provider.controllers.podwatch import PodStore, PodWatch
from vk_provider.controllers.preview import PlacementPreview
from vk_provider.controllers.prometheus import PrometheusSignal
from vk_provider.controllers.reconcile import Reconciler
from vk_provider.domain.breaker import CircuitBreaker
from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.contract import Provider
from vk_provider.domain.placement import ProviderHealth
from vk_provider.domain.podview import PodKey
from vk_provider.domain.reconcile import TerminationPolicy
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.runtime.preflight import checked_providers, close_all
from vk_provider.runtime.registry import Registry
from vk_provider.runtime.supervisor import SHUTDOWN_SECONDS, supervise
from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.paths import state_root

log = logging.getLogger(__name__)

IN_CLUSTER_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")


def guard(
    providers: Mapping[str, Provider], config: AgentConfig, metrics: Metrics
) -> dict[str, GuardedProvider]:
    settings = config.placement
    return {
        name: GuardedProvider(
            provider,
            CircuitBreaker(
                threshold=settings.breaker_threshold,
                cooldown_seconds=settings.breaker_cooldown_seconds,
            ),
            observe=metrics.observe_call,
        )
        for name, provider in providers.items()
    }


def health_of(providers: Mapping[str, GuardedProvider]) -> dict[str, ProviderHealth]:
    return {
        name: ProviderHealth(
            callable=provider.breaker.allows_calls(),
            recent_failures=provider.breaker.recent_failures(),
        )
        for name, provider in providers.items()
    }


@dataclass
class Agent:
    """Every part of a running agent, wired; ``run()`` supervises them."""

    config: AgentConfig
    kube: KubeClient
    providers: dict[str, Provider]
    offers: OfferBook
    node: NodeController
    watch: PodWatch
    pods: PodController
    reconciler: Reconciler
    kubelet_api: KubeletApiServer
    metrics: Metrics
    view: AgentView
    rest_api: RestServer
    overflow: OverflowController | None = None
    pod_events: EventRecorder | None = None  # its senders run beside the pod workers

    @classmethod
    async def create(
        cls,
        config: AgentConfig,
        kube: KubeClient,
        *,
        providers: Mapping[str, Provider],
        state_dir: Path,
    ) -> Agent:
        """Wire the parts around ``providers`` (built by ``preflight.build_providers``)."""
        state = state_dir
        intervals = config.intervals
        metrics = Metrics()
        guarded = guard(providers, config, metrics)
        calls: dict[str, Provider] = dict(guarded)  # every call through its breaker
        offers = OfferBook(calls, ttl_seconds=intervals.offers_ttl_seconds)
        api_cfg = config.kubelet_api
        address = config.node.address or (
            api_cfg.host if api_cfg.host not in ("0.0.0.0", "::", "") else default_address()  # noqa: S104
        )
        if is_loopback(address):
            log.warning(
                "node %s advertises the loopback address %s: the API server refuses to proxy "
                "nodes/%s/proxy to it, and only a metrics-server on this machine could scrape "
                "it; set node.address to an address the API server and metrics-server reach",
                config.node.name,
                address,
                config.node.name,
            )
        if api_cfg.tls_cert_file and api_cfg.tls_key_file:
            cert, key = api_cfg.tls_cert_file, api_cfg.tls_key_file
        else:
            cert, key = ensure_serving_certificate(
                state / "kubelet-tls", node_name=config.node.name, ip_addresses=(address,)
            )
        ledger = BudgetLedger(config.budget.caps)
        launcher = Launcher(
            calls,
            ledger,
            settings=config.placement,
            health=lambda: health_of(guarded),
            priorities={p.name: p.priority for p in config.providers},
        )
        store = PodStore()
        pod_events = EventRecorder(kube, node_name=config.node.name)
        pods = PodController(
            kube,
            node_name=config.node.name,
            host_ip=address,
            providers=calls,
            offers=offers,
            recorder=pod_events,
            launcher=launcher,
            store=store,
            intervals=intervals,
            workers=config.workers,
            observer=metrics,
            queue_observer=metrics.work_queue("pods"),
        )
        in_cluster_ca = IN_CLUSTER_CA if IN_CLUSTER_CA.exists() else None  # noqa: ASYNC240 - once
        token_reviews = TokenReviewAuthenticator(kube)
        authorizer = SubjectAccessReviewAuthorizer(kube)
        history = AttemptHistory()
        kubelet_api = KubeletApiServer(
            node_name=config.node.name,
            host=api_cfg.host,
            port=api_cfg.port,
            ssl_context=build_server_ssl_context(
                cert, key, api_cfg.client_ca_file or in_cluster_ca
            ),
            authenticator=token_reviews,
            authorizer=authorizer,
            logs=PodLogSource(
                kube,
                calls,
                node_name=config.node.name,
                history=history,
                instances=pods.tracker.for_pod,
            ),
            sources=KubeletSources(
                pods=AgentPods(store, pods.tracker),
                stats=UsageCollector(
                    node_name=config.node.name,
                    store=store,
                    tracker=pods.tracker,
                    providers=calls,
                ),
                streams=AgentStreams(store, calls, node_name=config.node.name),
            ),
        )

        def pod_changed(key: PodKey) -> None:
            # The kubelet API remembers which instances a pod named (kubectl logs --previous).
            history.observe(store.get(key))
            pods.pod_changed(key)

        watch = PodWatch(
            kube,
            node_name=config.node.name,
            store=store,
            on_change=pod_changed,
            timeout_seconds=intervals.pod_watch_timeout_seconds,
        )
        reconciler = Reconciler(
            store=store,
            watch=watch,
            pods=pods,
            providers=calls,
            interval=intervals.pod_status_seconds,
            grace=intervals.orphan_grace_seconds,
            policy=TerminationPolicy(deadline=intervals.termination_deadline_seconds),
            observer=metrics,
        )
        node = NodeController(
            kube,
            config.node,
            offers,
            intervals=intervals,
            address=address,
            kubelet_port=api_cfg.port,
            on_lease_failure=metrics.lease_renewal_failures.inc,
            responsive=lambda within: {
                name for name, p in guarded.items() if p.answered_within(within)
            },
            held=pods.held_resources,
            flip_taint=flip_taint(config),
        )
        overflow = overflow_controller(
            config,
            kube,
            events=EventRecorder(kube, node_name=config.node.name),
            pods=pods,
            observer=metrics,
        )

        def readiness() -> Readiness:
            reasons = []
            if not node.registered.is_set():
                reasons.append("the node is not registered yet")
            if not watch.live.is_set():
                reasons.append("the pod watch is not live")
            return Readiness(ready=not reasons, reasons=tuple(reasons))

        view = AgentView(
            providers=guarded,
            provider_types={p.name: p.type for p in config.providers},
            offers=offers,
            ledger=ledger,
            placements=pods.placements,
            readiness=readiness,
            overdue=lambda: reconciler.overdue,
            overflow=overflow.view if overflow is not None else None,
            instances=pods.tracker.all,
            preview=PlacementPreview(
                launcher=launcher, offers=offers, node_name=config.node.name, host_ip=address
            ).preview,
        )
        metrics.attach(view)
        rest_cfg = config.rest
        auth: RestAuth = (
            StaticTokenAuth(rest_cfg.static_token.resolve())
            if rest_cfg.static_token
            else TokenReviewAuth(token_reviews, authorizer)
        )
        rest_api = RestServer(
            app=build_app(
                view=view, metrics=metrics, auth=auth, open_metrics=rest_cfg.open_metrics
            ),
            host=rest_cfg.host,
            port=rest_cfg.port,
        )
        return cls(
            config,
            kube,
            calls,
            offers,
            node,
            watch,
            pods,
            reconciler,
            kubelet_api,
            metrics,
            view,
            rest_api,
            overflow,
            pod_events,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (clean exit) or a root task dies (``AgentFailed``)."""
        try:
            # REST first: /healthz answers and /readyz says 503 while the node registers.
            await self.rest_api.start()
            log.info("REST API on %s:%d", self.config.rest.host, self.rest_api.port)
            await self.kubelet_api.start()
            # The node advertises the port actually bound (0 in tests means "any free port").
            self.node.kubelet_port = self.kubelet_api.port
            await self.offers.refresh()
            await self.node.register()
            log.info(
                "node %s registered; kubelet API on port %d", self.node.name, self.kubelet_api.port
            )
            roots = {
                "rest-api": self.rest_api.serve,
                "kubelet-api": self.kubelet_api.serve,
                "node-lease": self.node.run_lease_loop,
                "node-status": self.node.run_status_loop,
                "pod-watch": self.watch.run,
                "reconcile": self.reconciler.run,
                "pod-workers": self.pods.run_workers,
            }
            if self.pod_events is not None:
                roots["pod-events"] = self.pod_events.run
            if self.overflow is not None:
                roots["overflow"] = self.overflow.run
            await supervise(
                roots,
                stop,
                before_cancel=self.pods.queue.close,
            )
        finally:
            # Idempotent: the servers' roots stop them too; this covers a failed start.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kubelet_api.stop(), SHUTDOWN_SECONDS)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.rest_api.stop(), SHUTDOWN_SECONDS)
            if self.overflow is not None:
                with contextlib.suppress(Exception):
                    await self.overflow.close()
            for provider in self.providers.values():
                with contextlib.suppress(Exception):
                    await provider.close()


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def flip_taint(config: AgentConfig) -> dict[str, str] | None:
    """The overflow taint as a closed flip sets it; None when the flip is off."""
    flip = config.overflow
    if not flip.enabled:
        return None
    return {"key": flip.taint_key, "value": flip.taint_value, "effect": "NoSchedule"}


def overflow_controller(
    config: AgentConfig,
    kube: KubeClient,
    *,
    events: EventRecorder,
    pods: PodController,
    observer: Metrics,
) -> OverflowController | None:
    flip = config.overflow
    if not flip.enabled:
        return None
    prometheus = flip.prometheus
    signal_source = PrometheusSignal(
        prometheus.url,
        flip.queries.to_queries(),
        token=prometheus.bearer_token.resolve() if prometheus.bearer_token else None,
        ca_file=prometheus.ca_file,
        timeout=prometheus.timeout_seconds,
    )
    return OverflowController(
        kube,
        node_name=config.node.name,
        signal=signal_source,
        policy=flip.policy(),
        taint_key=flip.taint_key,
        taint_value=flip.taint_value,
        interval=flip.interval_seconds,
        events=events,
        gpu_requests=pods.gpu_requests,
        observer=observer,
    )


def default_state_dir(config: AgentConfig) -> Path:
    return state_root() / "agent" / config.node.name


async def run_agent(
    config: AgentConfig, *, registry: Registry, kubeconfig: Path | None, state_dir: Path | None
) -> None:
    """Entry point of `vk-provider run`: SIGTERM/SIGINT stop cleanly.

    Raises ``ConfigError`` (exit 2) for everything `check-config` reports, before the
    cluster is contacted.
    """
    state = state_dir or default_state_dir(config)
    providers = await checked_providers(config, registry, state_dir=state)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        kube = await KubeClient.connect(kubeconfig)
    except BaseException:
        await close_all(providers)
        raise
    try:
        agent = await Agent.create(config, kube, providers=providers, state_dir=state)
        await agent.run(stop)
    finally:
        await kube.close()
