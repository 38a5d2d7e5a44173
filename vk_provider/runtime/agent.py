"""The agent process: builds every part from the configuration and supervises its tasks.

All long-lived tasks start here and nowhere else: offer refresh, node Lease and status loops,
the pod watch, the instance poller, the pod workers and the kubelet API server. If any of
them ends or dies, the agent logs which one and why and stops with a non-zero exit (a
half-working node agent is worse than a restarted one). SIGTERM/SIGINT stop everything
within bounded time and exit 0.

Invariants: providers are constructed before anything touches the cluster, so a bad
provider configuration fails fast; the node is registered before pods are watched.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vk_provider.api.kubelet import (
    KubeletApiServer,
    build_server_ssl_context,
    ensure_serving_certificate,
)
from vk_provider.api.kubelet_auth import (
    PodLogSource,
    SubjectAccessReviewAuthorizer,
    TokenReviewAuthenticator,
)
from vk_provider.api.metrics import Metrics
from vk_provider.api.rest import RestAuth, RestServer, StaticTokenAuth, TokenReviewAuth, build_app
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.launch import Launcher, LaunchSettings
from vk_provider.controllers.node import NodeController, default_address
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.pods import PodController, PodTimings
from vk_provider.domain.breaker import CircuitBreaker
from vk_provider.domain.budget import BudgetCaps, BudgetLedger
from vk_provider.domain.contract import Provider
from vk_provider.domain.placement import PlacementPolicy, ProviderHealth
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.runtime.registry import Registry
from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.paths import state_root

log = logging.getLogger(__name__)

IN_CLUSTER_CA = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
SHUTDOWN_SECONDS = 10.0


class AgentFailed(RuntimeError):
    """A root task of the agent died; the message says which and why."""


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
    pods: PodController
    kubelet_api: KubeletApiServer
    metrics: Metrics
    view: AgentView
    rest_api: RestServer

    @classmethod
    async def create(
        cls,
        config: AgentConfig,
        kube: KubeClient,
        *,
        registry: Registry,
        state_dir: Path | None = None,
    ) -> Agent:
        state = state_dir or state_root() / "agent" / config.node.name
        metrics = Metrics()
        guarded = guard(registry.build_all(config, state_dir=state), config, metrics)
        providers: dict[str, Provider] = dict(guarded)
        intervals = config.intervals
        offers = OfferBook(providers, ttl_seconds=intervals.offers_ttl_seconds)
        api_cfg = config.kubelet_api
        address = config.node.address or (
            api_cfg.host if api_cfg.host not in ("0.0.0.0", "::", "") else default_address()  # noqa: S104
        )
        if api_cfg.tls_cert_file and api_cfg.tls_key_file:
            cert, key = api_cfg.tls_cert_file, api_cfg.tls_key_file
        else:
            cert, key = ensure_serving_certificate(
                state / "kubelet-tls", node_name=config.node.name, ip_addresses=(address,)
            )
        in_cluster_ca = IN_CLUSTER_CA if IN_CLUSTER_CA.exists() else None  # noqa: ASYNC240 - once
        client_ca = api_cfg.client_ca_file or in_cluster_ca
        token_reviews = TokenReviewAuthenticator(kube)
        kubelet_api = KubeletApiServer(
            node_name=config.node.name,
            host=api_cfg.host,
            port=api_cfg.port,
            ssl_context=build_server_ssl_context(cert, key, client_ca),
            authenticator=token_reviews,
            authorizer=SubjectAccessReviewAuthorizer(kube),
            logs=PodLogSource(kube, providers, node_name=config.node.name),
        )
        recorder = EventRecorder(kube, node_name=config.node.name)
        budget = config.budget
        ledger = BudgetLedger(
            BudgetCaps(
                global_per_hour=budget.global_per_hour,
                per_namespace=budget.namespaces,
                default_namespace_per_hour=budget.default_namespace_per_hour,
            )
        )
        placement = config.placement
        launcher = Launcher(
            providers,
            ledger,
            settings=LaunchSettings(
                max_candidates=placement.max_candidates,
                capacity_block_seconds=placement.capacity_block_seconds,
                auth_block_seconds=placement.auth_block_seconds,
                policy=PlacementPolicy(
                    low_availability_penalty=placement.low_availability_penalty,
                    startup_penalty_per_minute=placement.startup_penalty_per_minute,
                    failure_penalty=placement.failure_penalty,
                ),
            ),
            health=lambda: health_of(guarded),
            priorities={p.name: p.priority for p in config.providers},
        )
        pods = PodController(
            kube,
            node_name=config.node.name,
            host_ip=address,
            providers=providers,
            offers=offers,
            recorder=recorder,
            launcher=launcher,
            timings=PodTimings(
                status_poll_seconds=intervals.pod_status_seconds,
                restart_backoff_seconds=intervals.restart_backoff_seconds,
                retry_backoff_seconds=intervals.retry_backoff_seconds,
                retry_backoff_max_seconds=intervals.retry_backoff_max_seconds,
                instance_lost_cooldown_seconds=intervals.instance_lost_cooldown_seconds,
            ),
            workers=config.workers,
            observer=metrics,
        )
        node = NodeController(
            kube,
            config.node,
            offers,
            address=address,
            kubelet_port=api_cfg.port,
            lease_seconds=intervals.lease_seconds,
            lease_duration_seconds=intervals.lease_duration_seconds,
            status_seconds=intervals.node_status_seconds,
            on_lease_failure=metrics.lease_renewal_failures.inc,
            responsive=lambda within: {
                name for name, p in guarded.items() if p.answered_within(within)
            },
            held=pods.held_resources,
        )

        def readiness() -> Readiness:
            reasons = []
            if not node.registered.is_set():
                reasons.append("the node is not registered yet")
            if not pods.watch_live.is_set():
                reasons.append("the pod watch is not live")
            return Readiness(ready=not reasons, reasons=tuple(reasons))

        view = AgentView(
            providers=guarded,
            provider_types={p.name: p.type for p in config.providers},
            offers=offers,
            ledger=ledger,
            placements=pods.placements,
            readiness=readiness,
        )
        metrics.attach(view)
        rest_cfg = config.rest
        auth: RestAuth = (
            StaticTokenAuth(rest_cfg.static_token.resolve())
            if rest_cfg.static_token
            else TokenReviewAuth(token_reviews)
        )
        rest_api = RestServer(
            app=build_app(
                view=view, metrics=metrics, auth=auth, open_metrics=rest_cfg.open_metrics
            ),
            host=rest_cfg.host,
            port=rest_cfg.port,
        )
        return cls(
            config, kube, providers, offers, node, pods, kubelet_api, metrics, view, rest_api
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (clean exit) or a root task dies (``AgentFailed``)."""
        # REST first: /healthz answers and /readyz says 503 while the node registers.
        await self.rest_api.start()
        log.info("REST API on %s:%d", self.config.rest.host, self.rest_api.port)
        try:
            await self.kubelet_api.start()
            # The node advertises the port actually bound (0 in tests means "any free port").
            self.node.kubelet_port = self.kubelet_api.port
            await self.offers.refresh()
            await self.node.register()
            log.info(
                "node %s registered; kubelet API on port %d", self.node.name, self.kubelet_api.port
            )
            await supervise(
                {
                    "node-lease": self.node.run_lease_loop,
                    "node-status": self.node.run_status_loop,
                    "pod-watch": self.pods.watch_loop,
                    "reconcile": lambda: self.pods.reconcile_loop(
                        interval=self.config.intervals.pod_status_seconds,
                        grace=self.config.intervals.orphan_grace_seconds,
                    ),
                    "pod-workers": self.pods.run_workers,
                },
                stop,
                before_cancel=self.pods.queue.close,
            )
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kubelet_api.stop(), SHUTDOWN_SECONDS)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.rest_api.stop(), SHUTDOWN_SECONDS)
            for provider in self.providers.values():
                with contextlib.suppress(Exception):
                    await provider.close()


async def supervise(
    roots: Mapping[str, Callable[[], Coroutine[Any, Any, None]]],
    stop: asyncio.Event,
    *,
    before_cancel: Callable[[], None] = lambda: None,
    shutdown_seconds: float = SHUTDOWN_SECONDS,
) -> None:
    """Run named root tasks until ``stop`` is set; if one ends first, raise ``AgentFailed``.

    Either way every task is cancelled and awaited (bounded by ``shutdown_seconds``) before
    this returns, so nothing is left running behind the caller's back.
    """
    tasks = {asyncio.create_task(start(), name=name): name for name, start in roots.items()}
    stopper = asyncio.create_task(stop.wait(), name="stop-signal")
    try:
        waited: list[asyncio.Task[Any]] = [*tasks, stopper]
        done, _ = await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if stopper not in done:
            task = next(t for t in tasks if t in done)
            exc = task.exception()
            raise AgentFailed(
                f"root task {tasks[task]!r} "
                + (f"died: {type(exc).__name__}: {exc}" if exc else "ended unexpectedly")
            ) from exc
    finally:
        stopper.cancel()
        before_cancel()
        for task in tasks:
            task.cancel()
        _, pending = await asyncio.wait([*tasks, stopper], timeout=shutdown_seconds)
        for stuck in pending:
            log.error("task %s did not stop within %.0fs", stuck.get_name(), shutdown_seconds)


async def run_agent(
    config: AgentConfig, *, registry: Registry, kubeconfig: Path | None, state_dir: Path | None
) -> None:
    """Entry point of `vk-provider run`: SIGTERM/SIGINT stop cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    kube = await KubeClient.connect(kubeconfig)
    try:
        agent = await Agent.create(config, kube, registry=registry, state_dir=state_dir)
        await agent.run(stop)
    finally:
        await kube.close()
