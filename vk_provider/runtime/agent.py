"""The agent process: wires every part from the configuration and supervises its tasks.

All long-lived tasks start here and nowhere else, under one supervisor
(``runtime.supervisor``): the REST API on every replica; on the elected leader only
(``controllers.leader``), the kubelet API, the node Lease and status loops, the pod watch,
reconciliation, the pod workers, the overflow flip and its hand-over, beside the election's
renewals. If any of them ends or dies — the renewals included, when the renew deadline
passes — the agent logs which one and why and stops with a non-zero exit (a replica that lost
the lead restarts as a follower). SIGTERM/SIGINT stop everything within bounded time,
release the election Lease and exit 0.

Three subsystems are wired beside this module: the providers' circuit breakers
(``agent_breakers``), the kubelet API with the node's address and certificate
(``agent_kubelet``) and the overflow flip (``agent_overflow``).

Invariants: wiring only — settings objects are passed to the parts that use them, never
copied field by field; providers are built (by the registry) before anything touches the
cluster, so a bad provider configuration fails fast; the node is registered before pods are
watched; nothing writes to the node, pods or providers before this replica leads, and
provider writes are fenced by the election's deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vk_provider.api.authn import SubjectAccessReviewAuthorizer, TokenReviewAuthenticator
from vk_provider.api.kubelet import KubeletApiServer
from vk_provider.api.metrics import Metrics
from vk_provider.api.podlogs import AttemptHistory
from vk_provider.api.rest import build_app
from vk_provider.api.rest_auth import RestAuth, StaticTokenAuth, TokenReviewAuth
from vk_provider.api.rest_server import RestServer
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.endpointslices import EndpointSliceController
from vk_provider.controllers.handover import HandoverController
from vk_provider.controllers.homecoming import HomecomingController
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.leader import LeaderElector
from vk_provider.controllers.node import NodeController
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowController
from vk_provider.controllers.pods import PodController
from vk_provider.controllers.podwatch import PodStore, PodWatch
from vk_provider.controllers.preview import PlacementPreview
from vk_provider.controllers.reconcile import Reconciler
from vk_provider.controllers.rehearsal import Rehearsal
from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.contract import Provider
from vk_provider.domain.podview import PodKey
from vk_provider.domain.reconcile import TerminationPolicy
from vk_provider.domain.tokenbucket import TokenBucket
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.kube.nodeidentity import NodeIdentity
from vk_provider.kube.servingcert import ServingCertificate
from vk_provider.runtime.agent_breakers import guard, health_of
from vk_provider.runtime.agent_kubelet import kubelet_api_server, node_address, serving_certificate
from vk_provider.runtime.agent_overflow import (
    flip_taint,
    handover_controller,
    homecoming_controller,
    overflow_controller,
)
from vk_provider.runtime.preflight import checked_providers, close_all, start_providers
from vk_provider.runtime.registry import Registry
from vk_provider.runtime.replica import lock_state_dir, replica_identity
from vk_provider.runtime.supervisor import SHUTDOWN_SECONDS, Root, supervise
from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.paths import state_root

log = logging.getLogger(__name__)


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
    handover: HandoverController | None = None
    homecoming: HomecomingController | None = None
    slices: EndpointSliceController | None = None  # endpoint_slices.enabled
    # identity: node — the certificate behind ``kube``, renewed by a root task of its own.
    identity: NodeIdentity | None = None
    elector: LeaderElector | None = None
    pod_events: EventRecorder | None = None  # its senders run beside the pod workers
    # kubelet_api.serving.source cluster: the serving certificate, renewed by a root task.
    serving: ServingCertificate | None = None

    @classmethod
    async def create(
        cls,
        config: AgentConfig,
        kube: KubeClient,
        *,
        providers: Mapping[str, Provider],
        state_dir: Path,
        node_admin: KubeClient | None = None,
    ) -> Agent:
        """Wire the parts around ``providers`` (built by ``preflight.build_providers``).

        ``kube`` makes every call a kubelet makes; ``node_admin`` (default ``kube``) writes
        the node object's metadata and spec, which a node identity may not (identity: node).
        """
        state = state_dir
        intervals = config.intervals
        metrics = Metrics()

        def leading_changed(leading: bool) -> None:
            metrics.leader.set(1 if leading else 0)
            metrics.leader_transitions.inc()

        admin = node_admin or kube
        # The election's Lease lives in the agent's namespace: written with the ServiceAccount
        # (a node identity may only touch its own node Lease in kube-node-lease).
        elector = leader_elector(config, admin, state_dir=state, on_change=leading_changed)
        if elector is not None:
            for client in {id(kube): kube, id(admin): admin}.values():
                client.may_write = elector.is_leader  # node, pod, Event and node Lease writes
        guarded = guard(
            providers, config, metrics, fence=elector.fence if elector else lambda op: None
        )
        calls: dict[str, Provider] = dict(guarded)  # every call through its breaker
        offers = OfferBook(calls, ttl_seconds=intervals.offers_ttl_seconds)
        address = node_address(config)
        ledger = BudgetLedger(config.budget.caps)
        launcher = Launcher(
            calls,
            ledger,
            settings=config.placement,
            health=lambda: health_of(guarded),
            priorities={p.name: p.priority for p in config.providers},
        )
        store = PodStore()
        # The pods' Events at a kubelet's rate (events.qps / burst). The flip's few Events
        # (written inline by their controllers, never queued) do not wait behind them.
        pod_events = EventRecorder(
            kube,
            node_name=config.node.name,
            limit=TokenBucket(config.events.qps, config.events.burst),
        )
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
            label_pods=not config.identity.node,
        )
        token_reviews = TokenReviewAuthenticator(kube)
        authorizer = SubjectAccessReviewAuthorizer(kube)
        history = AttemptHistory()
        kubelet_api = kubelet_api_server(
            config,
            kube,
            address=address,
            state_dir=state,
            providers=calls,
            store=store,
            tracker=pods.tracker,
            history=history,
            authenticator=token_reviews,
            authorizer=authorizer,
        )

        def pod_changed(key: PodKey) -> None:
            # The kubelet API remembers which instances a pod named (kubectl logs --previous).
            history.observe(store.view(key))
            pods.pod_changed(key)

        watch = PodWatch(
            kube,
            node_name=config.node.name,
            store=store,
            on_change=pod_changed,
            on_listed=pods.api_answers,
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
        # Traffic follows the pods: written with the ServiceAccount (a node may not).
        slices = (
            EndpointSliceController(
                node_admin or kube,
                store,
                pods.tracker,
                node=config.node.name,
                resync_seconds=config.endpoint_slices.resync_seconds,
                events=pod_events,
            )
            if config.endpoint_slices.enabled
            else None
        )
        node = NodeController(
            kube,
            config.node,
            offers,
            intervals=intervals,
            address=address,
            kubelet_port=config.kubelet_api.port,
            on_lease_failure=metrics.lease_renewal_failures.inc,
            responsive=lambda within: {
                name for name, p in guarded.items() if p.answered_within(within)
            },
            held=pods.reflected_resources,
            flip_taint=flip_taint(config),
            node_admin=node_admin,
        )
        flip_events = EventRecorder(kube, node_name=config.node.name)
        preview = PlacementPreview(
            launcher=launcher, offers=offers, node_name=config.node.name, host_ip=address
        )
        handover = handover_controller(
            config,
            kube,
            events=flip_events,
            node_admin=node_admin,
            rehearsal=Rehearsal(preview, ledger),
        )
        homecoming = homecoming_controller(config, kube, events=flip_events, node_admin=node_admin)
        overflow = overflow_controller(
            config,
            kube,
            node_admin=node_admin,
            events=flip_events,
            pods=pods,
            observer=metrics,
            handover=handover,
        )

        def not_leading() -> str | None:
            if elector is None or elector.is_leader():
                return None
            return f"not the leader ({elector.holder or 'nobody'} leads)"

        def readiness() -> Readiness:
            reasons = []
            if (follower := not_leading()) is not None:
                reasons.append(follower)
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
            not_leading=not_leading,
            overdue=lambda: reconciler.overdue,
            overflow=overflow.view if overflow is not None else None,
            instances=pods.tracker.all,
            preview=preview.preview,
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
            handover=handover,
            homecoming=homecoming,
            slices=slices,
            elector=elector,
            pod_events=pod_events,
            # Requested with the ServiceAccount (its role may approve it, a node's may not).
            serving=serving_certificate(
                config, node_admin or kube, kubelet_api, address=address, state_dir=state
            ),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (clean exit) or a root task dies (``AgentFailed``).

        Every replica serves the REST API (``/healthz`` live, ``/readyz`` and ``/v1`` say
        "not the leader" on a follower); only the elected one runs the node.
        """
        try:
            # REST first: /healthz answers and /readyz says 503 while the node registers.
            await self.rest_api.start()
            log.info("REST API on %s:%d", self.config.rest.host, self.rest_api.port)
            roots: dict[str, Root] = {"rest-api": self.rest_api.serve, "leader": self._lead}
            if self.identity is not None:
                # Every replica keeps its node certificate fresh, leader or not.
                roots["node-certificate"] = self.identity.renew_forever
            await supervise(roots, stop)
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

    async def _lead(self) -> None:
        """Wait to be elected, then run the node beside the renewals until stopped.

        The renewals (``keep``) and the node's work are roots of one supervisor: when the
        renew deadline passes, ``keep`` raises and every leader task is cancelled at once; the
        agent then exits non-zero and its pod restarts as a follower. On a clean stop the
        leader tasks stop first and the Lease is released after, so the follower takes over
        on its next read.
        """
        elector = self.elector
        roots: dict[str, Root] = {"node": self._run_node}
        if elector is not None:
            await elector.acquire()
            roots["leader-election"] = elector.keep
        try:
            await supervise(roots, asyncio.Event())  # ends by cancellation or a failure
        finally:
            if elector is not None:
                await elector.release()  # a no-op unless this replica still leads

    async def _run_node(self) -> None:
        """The leader's work: register the node, then its loops, pods and flip."""
        # With a cluster-signed certificate still pending, handshakes fail until it is
        # signed (serving-certificate below); the node and its pods do not wait for it.
        await self.kubelet_api.start()
        # The node advertises the port actually bound (0 in tests means "any free port").
        self.node.kubelet_port = self.kubelet_api.port
        # The pods first, then the offers: the first status counts what adopted pods hold.
        await self.watch.prime()
        await self.offers.refresh()
        await self.node.register()
        log.info(
            "node %s registered; kubelet API on port %d", self.node.name, self.kubelet_api.port
        )
        roots = {
            "kubelet-api": self.kubelet_api.serve,
            **({"serving-certificate": self.serving.run} if self.serving else {}),
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
        if self.handover is not None:
            roots["handover"] = self.handover.run
        if self.homecoming is not None:
            roots["way-home"] = self.homecoming.run
        if self.slices is not None:
            roots["endpoint-slices"] = self.slices.run
        await supervise(roots, asyncio.Event(), before_cancel=self.pods.queue.close)


def leader_elector(
    config: AgentConfig,
    kube: KubeClient,
    *,
    state_dir: Path,
    on_change: Callable[[bool], None],
) -> LeaderElector | None:
    """The elector of this replica; None when leader election is off."""
    election = config.leader_election
    if not election.enabled:
        return None
    return LeaderElector(
        kube,
        name=election.name_for(config.node.name),
        namespace=election.resolved_namespace(),
        identity=replica_identity(election, state_dir),
        timing=election.timing,
        on_change=on_change,
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
    lock_state_dir(state)  # one live agent per state directory, until this process exits
    providers = await checked_providers(config, registry, state_dir=state)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await start_providers(providers)
        kube = await KubeClient.connect(kubeconfig)
    except BaseException:
        await close_all(providers)
        raise
    identity: NodeIdentity | None = None
    try:
        if config.identity.node:
            identity = await node_identity(config, kube, state_dir=state)
        agent = await Agent.create(
            config,
            identity.client if identity else kube,
            providers=providers,
            state_dir=state,
            node_admin=kube,
        )
        agent.identity = identity
        await agent.run(stop)
    finally:
        if identity is not None:
            await identity.close()
        await kube.close()


async def node_identity(
    config: AgentConfig, bootstrap: KubeClient, *, state_dir: Path
) -> NodeIdentity:
    """identity: node — the node's client certificate, requested with ``bootstrap``."""
    settings = config.identity
    log.info("identity: node; requesting a client certificate for system:node:%s", config.node.name)
    return await NodeIdentity.obtain(
        bootstrap,
        node_name=config.node.name,
        directory=state_dir / "node-identity",
        expiration_seconds=settings.certificate_seconds,
        renew_fraction=settings.renew_fraction,
        approval_seconds=settings.approval_timeout_seconds,
    )
