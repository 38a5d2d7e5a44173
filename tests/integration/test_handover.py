"""Make before break: the hand-over against the real components (docs/overflow.md#the-hand-over).

A control plane with native gang scheduling; four KWOK nodes x 8 GPUs of the cluster's own;
kube-state-metrics and Prometheus with the shipped rules; the real agent with the flip and the
hand-over on, and a ``local`` provider whose instances take 20 s to start (as a rented GPU
does, only shorter); the real descheduler for the way home; Kueue for its variant.

Inference: 6 x 1 GPU at a low priority with a PodDisruptionBudget ``maxUnavailable: 1``.
Training: 4 x 8 GPUs at a high priority — every own GPU — held by the hand-over (the
``vk-provider.io/handover`` scheduling gate on a PodGroup's pods, or the Kueue
AdmissionCheck of that name on its ClusterQueue). Sampled every 0.25 s throughout: Ready
inference replicas never fall below 5, the training binds only once the inference it
displaces is Ready on the virtual node, every displacement is an eviction (no preemption),
the overflow taint is never NoExecute; the agent is SIGKILLed mid-hand-over and the
hand-over completes with no duplicate instance. When training ends, inference goes home and
nothing is left: no provider instance, no claim on an own node.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration import shipped_role
from tests.integration.agent_harness import AgentHarness, AgentProcess, local_providers
from tests.integration.audit import calls_of, grants_of, unused
from tests.integration.flip_helpers import (
    LOOP,
    PY,
    an_offer,
    create_object,
    inference_pods,
    is_ready,
    node_ready,
    taint_effect,
    until_effect,
)
from vk_provider.domain.handoverstep import HANDOVER
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.components import AUDITED_NAMESPACE
from vk_provider_dev.cluster.flip import workloads as w
from vk_provider_dev.cluster.flip.stack import FlipComponents, start_flip_components

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPLICAS, PDB_MIN = 6, 5
STARTUP_SECONDS = 20

# The agents run as ServiceAccounts of this namespace, whose requests alone are audited.
AGENTS = f"system:serviceaccount:{AUDITED_NAMESPACE}:"


@pytest.fixture(scope="module")
def components(
    gang_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlipComponents]:
    directory = tmp_path_factory.mktemp("handover")
    with start_flip_components(gang_cluster, directory=directory, own_nodes=4) as parts:
        yield parts


@dataclass
class Samples:
    """What the sampler saw, every 0.25 s: Ready inference, where, the taint, the gang."""

    ready: list[int] = field(default_factory=list)
    effects: set[str | None] = field(default_factory=set)
    # Ready inference on the virtual node when a training pod was first seen bound.
    ready_away_at_bind: int | None = None


async def _sample(api: KubeClient, node: str, namespace: str, gang: str, samples: Samples) -> None:
    while True:
        with contextlib.suppress(Exception):
            pods = await inference_pods(api, namespace)
            ready = [p for p in pods if is_ready(p)]
            samples.ready.append(len(ready))
            samples.effects.add(await taint_effect(api, node))
            if samples.ready_away_at_bind is None:
                training = await api.list_pods(namespace=namespace, label_selector=gang)
                if any(p["spec"].get("nodeName") for p in training):
                    samples.ready_away_at_bind = sum(
                        1 for p in ready if p["spec"].get("nodeName") == node
                    )
        await asyncio.sleep(0.25)


def _agent(
    agents: AgentHarness,
    components: FlipComponents,
    *,
    offers: list[dict[str, Any]] | None = None,
    startup: float = STARTUP_SECONDS,
    move_home: bool = False,
    policy: str = "wait",
    kueue_retry_seconds: int = 30,
    budget: dict[str, Any] | None = None,
) -> AgentProcess:
    """The agent with the flip, the hand-over and (``move_home``) the way home on."""
    chosen = offers or [an_offer("a100", gpus=1, price=1.2, capacity=8)]
    for offer in chosen:
        offer["startup_seconds"] = startup
    return agents.start(
        providers=[{"name": "cloud", "offers": chosen}],
        budget=budget,
        overflow={
            "enabled": True,
            "prometheus": {"url": components.prometheus.url, "timeout_seconds": 2},
            "interval_seconds": 1,
            "open_after_seconds": 3,
            "close_after_seconds": 5,
            "handover": {
                "enabled": True,
                "interval_seconds": 1,
                "policy": policy,
                "kueue_retry_seconds": kueue_retry_seconds,
            },
            "move_home": {"enabled": move_home, "interval_seconds": 1},
        },
    )


async def _inference_at_home(
    api: KubeClient, components: FlipComponents, raw: ApiClient, suffix: str
) -> tuple[str, str]:
    """A namespace with inference serving at home; its name and the training class."""
    namespace = f"ho-{suffix}"
    inference_class, training_class = f"inference-{suffix}", f"training-{suffix}"
    await client.CoreV1Api(raw).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
    )
    for name, value in ((inference_class, 100), (training_class, 1000)):
        await asyncio.to_thread(
            create_object, components, w.PRIORITY_CLASSES, w.priority_class(name, value)
        )
    deployment = w.gpu_deployment(
        "infer",
        namespace=namespace,
        replicas=REPLICAS,
        gpus=1,
        priority_class_name=inference_class,
        command=[PY, "-c", LOOP],
    )
    await asyncio.to_thread(create_object, components, w.deployments_path(namespace), deployment)
    pdb = w.pod_disruption_budget("infer", namespace=namespace, app="infer", max_unavailable=1)
    await asyncio.to_thread(create_object, components, w.pdbs_path(namespace), pdb)

    async def serving_at_home() -> bool:
        pods = await inference_pods(api, namespace)
        return len(pods) == REPLICAS and all(
            is_ready(p) and p["spec"].get("nodeName") in components.nodes for p in pods
        )

    await wait_for(serving_at_home, timeout=120, interval=0.5, what="inference at home")
    return namespace, training_class


async def _events(raw: ApiClient, namespace: str, reason: str) -> list[Any]:
    events = await client.CoreV1Api(raw).list_namespaced_event(namespace)
    return [e for e in events.items if e.reason == reason]


async def _kill_and_restart_after_evictions(
    raw: ApiClient, api: KubeClient, namespace: str, agent: AgentProcess, evictions: int
) -> None:
    """SIGKILL the agent once ``evictions`` hand-over evictions happened; start it again."""

    async def evicted() -> bool:
        return len(await _events(raw, namespace, "HandoverEviction")) >= evictions

    await wait_for(evicted, timeout=240, interval=0.25, what=f"{evictions} evictions")
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(timeout=30)
    agent.start()
    await node_ready(api, agent.node, agent)


async def _sampled_bind(samples: Samples) -> int:
    """What the sampler saw when it first found a training pod bound (it samples beside the
    waits, so it may see the bind a moment after them)."""

    async def seen() -> tuple[int] | None:  # a tuple: 0 Ready is an answer, not falsy
        at_bind = samples.ready_away_at_bind
        return None if at_bind is None else (at_bind,)

    found = await wait_for(seen, timeout=30, interval=0.1, what="the sampler seeing the bind")
    return found[0]


async def _bound_together(api: KubeClient, namespace: str, selector: str, count: int) -> None:
    async def bound() -> list[dict[str, Any]] | None:
        pods = await api.list_pods(namespace=namespace, label_selector=selector)
        placed = [p for p in pods if p["spec"].get("nodeName")]
        return pods if len(pods) == count and len(placed) == count else None

    training = await wait_for(bound, timeout=420, interval=0.25, what="the training bound")
    stamps = sorted(
        time.mktime(time.strptime(c["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ"))
        for p in training
        for c in p["status"]["conditions"]
        if c["type"] == "PodScheduled" and c["status"] == "True"
    )
    assert len(stamps) == count and stamps[-1] - stamps[0] <= 2, stamps


async def _home_again_and_nothing_left(
    api: KubeClient,
    components: FlipComponents,
    agent: AgentProcess,
    namespace: str,
    *,
    descheduler: bool,
) -> list[int]:
    """Training gone: the overflow closes, inference goes home (moved by the descheduler,
    or by the agent's way home); no instance, no claim left. The Ready counts seen on the
    way home."""
    await until_effect(api, agent.node, "NoSchedule", within=90)
    seen: list[int] = []

    async def home() -> bool:
        pods = await inference_pods(api, namespace)
        seen.append(sum(1 for p in pods if is_ready(p)))
        return len(pods) == REPLICAS and all(
            is_ready(p) and p["spec"].get("nodeName") in components.nodes for p in pods
        )

    deadline = time.monotonic() + 300
    while not await home():
        assert time.monotonic() < deadline, "inference not home"
        if descheduler:
            run = await asyncio.to_thread(components.run_descheduler_once)
            assert run.ok, run.output[-2000:]
        for _ in range(8):
            seen.append(sum(1 for p in await inference_pods(api, namespace) if is_ready(p)))
            await asyncio.sleep(0.25)

    async def no_instances() -> bool:
        return not any([await p.list_ours() for p in local_providers(agent)])

    await wait_for(no_instances, timeout=90, interval=0.5, what="no provider instance left")
    for name in components.nodes:
        found = await api.get_node(name) or {}
        assert HANDOVER not in (found["metadata"].get("labels") or {}), name
        assert all(t["key"] != HANDOVER for t in found["spec"].get("taints") or []), name
    return seen


async def _cleanup(components: FlipComponents, api: KubeClient, namespace: str) -> None:
    await asyncio.to_thread(components.api.delete, f"/api/v1/namespaces/{namespace}")

    async def emptied() -> bool:
        return not await api.list_pods(namespace=namespace)

    await wait_for(emptied, timeout=120, what=f"the pods of {namespace} gone")


async def _kueue_gone(components: FlipComponents, objects: list[tuple[str, Any]]) -> None:
    """Delete the cluster-scoped Kueue objects of ``w.kueue_queue`` (the LocalQueue went with
    its namespace), newest first, and stop Kueue (its webhooks with it)."""
    for path, body in reversed(objects[:-1]):
        with contextlib.suppress(Exception):
            await asyncio.to_thread(components.api.delete, f"{path}/{body['metadata']['name']}")
    await asyncio.to_thread(components.stop_kueue)


async def _gated_gang(components: FlipComponents, namespace: str, training_class: str) -> None:
    group = w.pod_group(
        "train", namespace=namespace, min_count=4, priority_class_name=training_class
    )
    await asyncio.to_thread(create_object, components, w.pod_groups_path(namespace), group)
    for pod in w.gang_pods(
        "train",
        namespace=namespace,
        count=4,
        gpus=8,
        priority_class_name=training_class,
        gates=(HANDOVER,),
    ):
        await asyncio.to_thread(create_object, components, w.pods_path(namespace), pod)


async def test_a_gated_gang_binds_only_after_inference_moved_and_serving_never_dips(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    api, raw = gang_kube, gang_raw
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(gang_agents, components)
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    samples = Samples()
    sampler = asyncio.create_task(_sample(api, agent.node, namespace, "gang=train", samples))
    try:
        await _gated_gang(components, namespace, training_class)
        await _kill_and_restart_after_evictions(raw, api, namespace, agent, evictions=2)
        await _bound_together(api, namespace, "gang=train", 4)

        assert await _sampled_bind(samples) == REPLICAS
        assert min(samples.ready) >= PDB_MIN, min(samples.ready)
        assert not await _events(raw, namespace, "Preempted"), "a pod was preempted"
        assert len(await _events(raw, namespace, "HandoverEviction")) == REPLICAS
        instances = [i for p in local_providers(agent) for i in await p.list_ours()]
        assert len(instances) == REPLICAS, instances  # one each: none duplicated by the restart

        for pod in await api.list_pods(namespace=namespace, label_selector="gang=train"):
            await api.delete_pod_now(namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
        back = await _home_again_and_nothing_left(
            api, components, agent, namespace, descheduler=True
        )
        assert min(back) >= PDB_MIN, back
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await _cleanup(components, api, namespace)
    assert all("NoExecute" not in (e or "") for e in samples.effects), samples.effects


async def test_a_kueue_workload_is_admitted_only_after_inference_moved_and_serving_never_dips(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    api, raw = gang_kube, gang_raw
    await asyncio.to_thread(components.start_kueue)
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(gang_agents, components, move_home=True)
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    objects = w.kueue_queue(
        suffix, namespace=namespace, gpus=32, admission_check=f"handover-{suffix}"
    )
    for path, body in objects:
        await asyncio.to_thread(create_object, components, path, body)
    samples = Samples()
    sampler = asyncio.create_task(_sample(api, agent.node, namespace, "gang=train", samples))
    try:
        jobs = w.jobs_path(namespace)
        job = w.kueue_training_job(
            "train", namespace=namespace, count=4, gpus=8, priority_class_name=training_class
        )
        await asyncio.to_thread(create_object, components, jobs, job)
        await _bound_together(api, namespace, "gang=train", 4)

        assert await _sampled_bind(samples) == REPLICAS
        assert min(samples.ready) >= PDB_MIN, min(samples.ready)
        assert not await _events(raw, namespace, "Preempted"), "a pod was preempted"
        assert len(await _events(raw, namespace, "HandoverEviction")) == REPLICAS
        workloads = components.api.items(f"{w.KUEUE_API}/namespaces/{namespace}/workloads")
        (check,) = workloads[0]["status"]["admissionChecks"]
        assert check["state"] == "Ready", check
        assert await _events(raw, namespace, "HandoverReleased")

        await asyncio.to_thread(components.api.delete, f"{jobs}/train")
        for pod in await api.list_pods(namespace=namespace, label_selector="gang=train"):
            await api.delete_pod_now(namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
        back = await _home_again_and_nothing_left(
            api, components, agent, namespace, descheduler=False
        )
        assert min(back) >= PDB_MIN, back
        assert len(await _events(raw, namespace, "MovedHome")) == REPLICAS
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await _cleanup(components, api, namespace)
        await _kueue_gone(components, objects)
    assert all("NoExecute" not in (e or "") for e in samples.effects), samples.effects


async def test_home_again_the_dearest_rented_replica_leaves_first(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """Three replicas rented at $1.10, $2.99 and $1.80 an hour (own GPUs taken by a filler);
    the filler goes, the overflow closes, and the agent's way home moves the $2.99 one
    first, the others once the PDB allows."""
    api, raw = gang_kube, gang_raw
    suffix = uuid.uuid4().hex[:6]
    namespace = f"home-{suffix}"
    await client.CoreV1Api(raw).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
    )
    offers = [
        an_offer("cheap", gpus=1, price=1.1, capacity=1),
        an_offer("dear", gpus=1, price=2.99, capacity=1),
        an_offer("mid", gpus=1, price=1.8, capacity=1),
    ]
    agent = _agent(gang_agents, components, offers=offers, startup=0, move_home=True)
    try:
        await node_ready(api, agent.node, agent)
        filler = w.gpu_deployment("filler", namespace=namespace, replicas=4, gpus=8)
        await asyncio.to_thread(create_object, components, w.deployments_path(namespace), filler)

        async def full() -> bool:
            pods = await api.list_pods(namespace=namespace, label_selector="app=filler")
            return sum(1 for p in pods if is_ready(p)) == 4

        await wait_for(full, timeout=120, interval=0.5, what="own GPUs taken by the filler")
        deployment = w.gpu_deployment(
            "infer", namespace=namespace, replicas=3, gpus=1, command=[PY, "-c", LOOP]
        )
        await asyncio.to_thread(
            create_object, components, w.deployments_path(namespace), deployment
        )
        pdb = w.pod_disruption_budget("infer", namespace=namespace, app="infer")
        await asyncio.to_thread(create_object, components, w.pdbs_path(namespace), pdb)

        async def rented() -> dict[str, str] | None:
            pods = [p for p in await inference_pods(api, namespace) if is_ready(p)]
            prices = {
                p["metadata"]["annotations"].get("vk-provider.io/price-per-hour", ""): p[
                    "metadata"
                ]["name"]
                for p in pods
                if p["spec"].get("nodeName") == agent.node
            }
            return prices if len(prices) == 3 else None

        by_price = await wait_for(rented, timeout=180, interval=0.5, what="three rented")
        assert sorted(by_price) == ["1.1000", "1.8000", "2.9900"], by_price
        await asyncio.to_thread(
            components.api.delete, f"/apis/apps/v1/namespaces/{namespace}/deployments/filler"
        )
        names = set(by_price.values())

        async def all_left() -> bool:
            pods = await inference_pods(api, namespace)
            return not names & {
                p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp")
            }

        await wait_for(all_left, timeout=240, interval=0.5, what="the rented replicas gone")
        # The order the API server admitted the evictions in (its audit log, microseconds):
        # the dearest strictly first; the PDB (maxUnavailable 1) refuses the next until its
        # replacement is Ready at home, whatever order the others then go in.
        evicted = sorted(
            (
                c
                for c in calls_of(components.cluster.audit_log, prefix=AGENTS)
                if c.resource == "pods/eviction" and c.namespace == namespace and c.code == 201
            ),
            key=lambda c: c.received,
        )
        assert [c.name for c in evicted][:1] == [by_price["2.9900"]], evicted
        assert {c.name for c in evicted} == names, evicted
        moved = await _events(raw, namespace, "MovedHome")
        assert len(moved) == 3, [e.message for e in moved]
    finally:
        await _cleanup(components, api, namespace)


async def test_wait_holds_the_training_while_no_provider_can_take_the_displaced(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """No provider capacity: the training stays gated with a HandoverHeld Event saying what
    is missing, inference untouched, no node claimed; capacity appears (the provider
    restarted with room) and the hand-over completes."""
    api, raw = gang_kube, gang_raw
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(
        gang_agents,
        components,
        offers=[an_offer("a100", gpus=1, price=1.2, capacity=0)],
        startup=2,
    )
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    before = {p["metadata"]["name"] for p in await inference_pods(api, namespace)}
    try:
        await _gated_gang(components, namespace, training_class)

        async def held() -> list[Any]:
            return await _events(raw, namespace, "HandoverHeld")

        (first, *_) = await wait_for(held, timeout=60, interval=0.5, what="HandoverHeld")
        assert "need 6 GPUs elsewhere" in first.message, first.message
        assert "virtual node can take 0" in first.message, first.message
        await _held_untouched(api, components, namespace, before, ticks=10)

        await _restart_with_capacity(agent, api, 8)
        await _bound_together(api, namespace, "gang=train", 4)
        assert len(await _events(raw, namespace, "HandoverEviction")) == REPLICAS
        assert not await _events(raw, namespace, "Preempted")
    finally:
        await _cleanup(components, api, namespace)


async def test_wait_holds_the_training_while_the_budget_cap_cannot_pay_the_displaced(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """Room on the provider but not in the budget (6 replacements at $1.20/h = $7.20/h, the
    cap $5/h): the training stays gated with a HandoverHeld Event giving both sums, inference
    untouched, no node claimed, nothing launched; the cap raised, the hand-over completes."""
    api, raw = gang_kube, gang_raw
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(gang_agents, components, startup=2, budget={"global_per_hour": 5.0})
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    before = {p["metadata"]["name"] for p in await inference_pods(api, namespace)}
    try:
        await _gated_gang(components, namespace, training_class)

        async def held() -> list[Any]:
            return await _events(raw, namespace, "HandoverHeld")

        (first, *_) = await wait_for(held, timeout=60, interval=0.5, what="HandoverHeld")
        assert "cost at least $7.20/h" in first.message, first.message
        assert "global budget cap leaves $5.00/h" in first.message, first.message
        await _held_untouched(api, components, namespace, before, ticks=5)
        assert not await _events(raw, namespace, "HandoverEviction")

        await _restart_with(agent, api, lambda c: c["budget"].update(global_per_hour=10.0))
        await _bound_together(api, namespace, "gang=train", 4)
        assert len(await _events(raw, namespace, "HandoverEviction")) == REPLICAS
        assert not await _events(raw, namespace, "Preempted")
    finally:
        await _cleanup(components, api, namespace)


async def test_force_releases_the_training_as_without_a_hand_over(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """Policy force with no provider capacity: the gate is removed at once (a HandoverForced
    Warning says why) and the scheduler preempts inference, as it would without."""
    api, raw = gang_kube, gang_raw
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(
        gang_agents,
        components,
        offers=[an_offer("a100", gpus=1, price=1.2, capacity=0)],
        startup=2,
        policy="force",
    )
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    try:
        await _gated_gang(components, namespace, training_class)
        await _bound_together(api, namespace, "gang=train", 4)
        forced_events = await _events(raw, namespace, "HandoverForced")
        assert forced_events, "no HandoverForced Event"
        forced = forced_events[0]
        assert forced.type == "Warning"
        assert "need 6 GPUs elsewhere" in forced.message, forced.message
        assert not await _events(raw, namespace, "HandoverEviction")
    finally:
        await _cleanup(components, api, namespace)


async def _held_untouched(
    api: KubeClient, components: FlipComponents, namespace: str, before: set[str], *, ticks: int
) -> None:
    """For ``ticks`` of the hand-over's 1-s evaluations nothing moves: the same inference pods,
    all Ready, the gang still gated, no own node claimed."""
    for _ in range(ticks):
        # Nothing must happen: each pass spans one of the hand-over's evaluations.
        await asyncio.sleep(1)
        pods = await inference_pods(api, namespace)
        assert {p["metadata"]["name"] for p in pods} == before
        assert all(is_ready(p) for p in pods)
        gang = await api.list_pods(namespace=namespace, label_selector="gang=train")
        assert all(p["spec"].get("schedulingGates") for p in gang)
        for name in components.nodes:
            node = await api.get_node(name) or {}
            assert all(t["key"] != HANDOVER for t in node["spec"].get("taints") or [])


async def _restart_with_capacity(agent: AgentProcess, api: KubeClient, capacity: int) -> None:
    """Capacity appears: the agent's provider restarted with room for ``capacity``."""

    def room(config: dict[str, Any]) -> None:
        config["providers"][0]["offers"][0]["capacity"] = capacity

    await _restart_with(agent, api, room)


async def _restart_with(
    agent: AgentProcess, api: KubeClient, change: Callable[[dict[str, Any]], object]
) -> None:
    """The agent restarted with its configuration changed by ``change``."""
    config = yaml.safe_load(agent.config_path.read_text())
    change(config)
    agent.config_path.write_text(yaml.safe_dump(config))
    assert agent.process is not None
    agent.process.terminate()
    agent.process.wait(timeout=60)
    agent.start()
    await node_ready(api, agent.node, agent)


async def test_kueue_retries_the_check_while_no_provider_can_take_the_displaced(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """Kueue and no provider capacity: the check goes to Retry (Kueue releases the quota,
    requeues, resets the check to Pending: its retryCount grows), the Job stays suspended,
    inference untouched; capacity appears and the hand-over completes."""
    api, raw = gang_kube, gang_raw
    await asyncio.to_thread(components.start_kueue)
    suffix = uuid.uuid4().hex[:6]
    agent = _agent(
        gang_agents,
        components,
        offers=[an_offer("a100", gpus=1, price=1.2, capacity=0)],
        startup=2,
        kueue_retry_seconds=2,
    )
    await node_ready(api, agent.node, agent)
    namespace, training_class = await _inference_at_home(api, components, raw, suffix)
    before = {p["metadata"]["name"] for p in await inference_pods(api, namespace)}
    objects = w.kueue_queue(
        suffix, namespace=namespace, gpus=32, admission_check=f"handover-{suffix}"
    )
    for path, body in objects:
        await asyncio.to_thread(create_object, components, path, body)
    jobs = w.jobs_path(namespace)
    try:
        job = w.kueue_training_job(
            "train", namespace=namespace, count=4, gpus=8, priority_class_name=training_class
        )
        await asyncio.to_thread(create_object, components, jobs, job)
        workloads = f"{w.KUEUE_API}/namespaces/{namespace}/workloads"

        def retried() -> dict[str, Any] | None:
            for workload in components.api.items(workloads):
                for check in (workload.get("status") or {}).get("admissionChecks") or []:
                    if (check.get("retryCount") or 0) >= 1:
                        return dict(check)
            return None

        check = await wait_for(
            lambda: asyncio.to_thread(retried), timeout=120, interval=0.5, what="a retried check"
        )
        assert check["name"] == f"handover-{suffix}", check
        (held, *_) = await _events(raw, namespace, "HandoverHeld")
        assert held.involved_object.kind == "Workload", held.involved_object
        assert "virtual node can take 0" in held.message, held.message
        pods = await inference_pods(api, namespace)
        assert {p["metadata"]["name"] for p in pods} == before
        assert all(is_ready(p) for p in pods)
        suspended = await asyncio.to_thread(components.api.get, f"{jobs}/train")
        assert (suspended or {})["spec"]["suspend"] is True

        await _restart_with_capacity(agent, api, 8)
        await _bound_together(api, namespace, "gang=train", 4)
        assert len(await _events(raw, namespace, "HandoverEviction")) == REPLICAS
        assert not await _events(raw, namespace, "Preempted")
    finally:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(components.api.delete, f"{jobs}/train")
        await _cleanup(components, api, namespace)
        await _kueue_gone(components, objects)


def test_the_handover_role_is_exactly_what_the_hand_overs_above_called(
    gang_cluster: LocalCluster,
) -> None:
    """deploy/rbac-handover.yaml derived from the calls, like deploy/rbac.yaml: in the audit
    log of this module's control plane (this test runs last: pytest keeps file order), the
    agents above — every one with the shipped role and the hand-over's — had no call refused by
    RBAC,
    and every grant of the hand-over's role was used by one of them. Run alone, it fails:
    there are no calls to compare."""
    calls = calls_of(gang_cluster.audit_log, prefix=AGENTS)
    assert calls, f"no agent call in {gang_cluster.audit_log}: run the whole module"
    # Refused by RBAC; Events written into a test's namespace while it is deleted get a 403
    # from admission (NamespaceLifecycle), not from the role.
    refused = sorted({(c.group, c.resource, c.verb, c.namespace) for c in calls if c.forbidden})
    assert not refused, refused
    role = [d for d in shipped_role.shipped_documents(handover=True) if d["kind"] == "ClusterRole"]
    handover = [d for d in role if d["metadata"]["name"] == "vk-provider-handover"]
    assert handover, "deploy/rbac-handover.yaml has no ClusterRole vk-provider-handover"
    assert unused(grants_of(handover), calls) == set(), "granted, never called"
