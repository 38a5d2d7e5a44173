"""Wiring the overflow flip (docs/overflow.md): its controller and the taint the node starts
with.

``overflow_controller`` builds the ``controllers.overflow.OverflowController`` over a
``PrometheusSignal`` from ``overflow:`` in the configuration; ``handover_controller`` the
``controllers.handover.HandoverController`` when ``overflow.handover.enabled`` and
``homecoming_controller`` the way home when ``overflow.move_home.enabled``;
``flip_taint`` is the taint a closed flip sets, which the node controller adds to a node that
has none of its key (a node new to the flip starts closed) and otherwise leaves to the flip.

Invariants: wiring only; with ``overflow.enabled`` false there is neither a controller nor a
taint (both are None); the flip reads the GPUs the node's pods request from the pod
controller, and writes the node with ``node_admin`` when there is one (identity: node).
"""

from __future__ import annotations

from vk_provider.api.metrics import Metrics
from vk_provider.controllers.handover import HandoverController
from vk_provider.controllers.homecoming import HomecomingController
from vk_provider.controllers.overflow import OverflowController
from vk_provider.controllers.pods import PodController
from vk_provider.controllers.prometheus import PrometheusSignal
from vk_provider.controllers.rehearsal import Rehearsal
from vk_provider.kube.client import KubeClient
from vk_provider.kube.events import EventRecorder
from vk_provider.settings.agent import AgentConfig


def flip_taint(config: AgentConfig) -> dict[str, str] | None:
    """The overflow taint as a closed flip sets it; None when the flip is off."""
    flip = config.overflow
    if not flip.enabled:
        return None
    return {"key": flip.taint_key, "value": flip.taint_value, "effect": "NoSchedule"}


def handover_controller(
    config: AgentConfig,
    kube: KubeClient,
    *,
    events: EventRecorder,
    node_admin: KubeClient | None = None,
    rehearsal: Rehearsal | None = None,
) -> HandoverController | None:
    """The hand-over, when the flip and ``overflow.handover`` are both on. It writes other
    nodes, pods and Workloads, so it uses ``node_admin`` when there is one (identity: node)."""
    flip = config.overflow
    if not (flip.enabled and flip.handover.enabled):
        return None
    return HandoverController(
        node_admin or kube,
        node_name=config.node.name,
        config=flip.handover,
        overflow_taint_key=flip.taint_key,
        events=events,
        rehearse=rehearsal.shortfall if rehearsal is not None else None,
    )


def homecoming_controller(
    config: AgentConfig,
    kube: KubeClient,
    *,
    events: EventRecorder,
    node_admin: KubeClient | None = None,
) -> HomecomingController | None:
    """The way home, when the flip and ``overflow.move_home`` are both on."""
    flip = config.overflow
    if not (flip.enabled and flip.move_home.enabled):
        return None
    return HomecomingController(
        node_admin or kube,
        node_name=config.node.name,
        config=flip.move_home,
        overflow_taint_key=flip.taint_key,
        events=events,
    )


def overflow_controller(
    config: AgentConfig,
    kube: KubeClient,
    *,
    events: EventRecorder,
    pods: PodController,
    observer: Metrics,
    node_admin: KubeClient | None = None,
    handover: HandoverController | None = None,
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
        node_admin=node_admin,
        handover=handover,
    )
