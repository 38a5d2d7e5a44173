"""The flip without the hand-over (``overflow.handover`` off, its default; or policy
``force``) against the real components, asserting each promise of docs/overflow.md for it.
The hand-over's story (training held until inference moved, on Kueue and on a gated native
gang) is ``test_handover.py``'s; ``test_demo_story.py`` runs the demo's, on Kueue. This one
keeps the signal path honest where nothing holds the training: preemption, the flip's own
timing, an agent restart and a Prometheus outage while open, the descheduler's way home.

A control plane with native gang scheduling; four KWOK nodes x 8 GPUs (the cluster's own,
``gpu.pool=own``); kube-state-metrics and Prometheus with the shipped recording rules; the
real agent (``vk-provider run``) on the virtual node with a ``local`` provider and the
overflow flip on; the real descheduler with the shipped policy, one cycle at a time.

1. Inference (a Deployment of 6 x 1 GPU at a low PriorityClass, PDB maxUnavailable 1) runs
   on the own nodes.
2. A gang of 4 x 8 GPUs at a high PriorityClass arrives: it binds as one, preempting
   inference; the overflow opens within 15 s of the own GPUs filling and every displaced
   replica runs on the virtual node within 30 s of the gang's admission.
3. The agent is killed and restarted, and Prometheus goes away for a while: the overflow
   stays open.
4. Training ends: the overflow closes; the descheduler moves inference home, one pod per
   cycle, with Ready replicas never below the PDB's minimum; no provider instance is left.

Throughout, the overflow taint is sampled: never NoExecute, and exactly two transitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tests.helpers import wait_for
from tests.integration.agent_harness import AgentHarness, AgentProcess, local_providers
from tests.integration.flip_helpers import (
    LOOP,
    PY,
    Watch,
    an_offer,
    create_object,
    flip_agent,
    inference_pods,
    is_ready,
    node_events,
    node_ready,
    sample_flip,
    taint_effect,
    until_effect,
)
from vk_provider.domain.podview import deletion_cost
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flip import workloads as w
from vk_provider_dev.cluster.flip.stack import FlipComponents, start_flip_components

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPLICAS, PDB_MIN = 6, 5


@pytest.fixture(scope="module")
def components(
    gang_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FlipComponents]:
    directory = tmp_path_factory.mktemp("flip")
    with start_flip_components(gang_cluster, directory=directory, own_nodes=4) as parts:
        yield parts


async def test_training_takes_the_gpus_inference_overflows_and_moves_home_slowly(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    api, raw, story_agents = gang_kube, gang_raw, gang_agents
    suffix = uuid.uuid4().hex[:6]
    namespace = f"story-{suffix}"
    inference_class, training_class = f"inference-{suffix}", f"training-{suffix}"
    await client.CoreV1Api(raw).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
    )
    await asyncio.to_thread(
        create_object, components, w.PRIORITY_CLASSES, w.priority_class(inference_class, 100)
    )
    await asyncio.to_thread(
        create_object, components, w.PRIORITY_CLASSES, w.priority_class(training_class, 1000)
    )

    agent = flip_agent(
        story_agents,
        components,
        [an_offer("a100", gpus=1, price=1.2, capacity=8)],
        close_after=5,
        log_level="info",  # the log an operator reads (checked at the end)
    )
    node = agent.node
    await node_ready(api, node, agent)
    watch = Watch()
    sampler = asyncio.create_task(sample_flip(api, node, namespace, watch))
    try:
        # 1. Inference serves from the own nodes.
        deployment = w.gpu_deployment(
            "infer",
            namespace=namespace,
            replicas=REPLICAS,
            gpus=1,
            priority_class_name=inference_class,
            command=[PY, "-c", LOOP],
        )
        await asyncio.to_thread(
            create_object, components, w.deployments_path(namespace), deployment
        )
        pdb = w.pod_disruption_budget("infer", namespace=namespace, app="infer", max_unavailable=1)
        await asyncio.to_thread(create_object, components, w.pdbs_path(namespace), pdb)

        async def serving_at_home() -> bool:
            pods = await inference_pods(api, namespace)
            return len(pods) == REPLICAS and all(
                is_ready(p) and p["spec"].get("nodeName") in components.nodes for p in pods
            )

        await wait_for(serving_at_home, timeout=90, interval=0.5, what="inference at home")
        assert await taint_effect(api, node) == "NoSchedule"

        # 2. Training arrives as one gang at high priority and takes every own GPU.
        group = w.pod_group(
            "train", namespace=namespace, min_count=4, priority_class_name=training_class
        )
        await asyncio.to_thread(create_object, components, w.pod_groups_path(namespace), group)
        for pod in w.gang_pods(
            "train", namespace=namespace, count=4, gpus=8, priority_class_name=training_class
        ):
            await asyncio.to_thread(create_object, components, w.pods_path(namespace), pod)

        async def gang_bound() -> list[dict[str, Any]] | None:
            pods = await api.list_pods(namespace=namespace, label_selector="gang=train")
            bound = [p for p in pods if p["spec"].get("nodeName")]
            return pods if len(pods) == 4 and len(bound) == 4 else None

        training = await wait_for(gang_bound, timeout=120, interval=0.2, what="the gang bound")
        admitted = time.monotonic()
        assert {p["spec"]["nodeName"] for p in training} == set(components.nodes)
        bind_times = [
            next(
                c["lastTransitionTime"]
                for c in p["status"]["conditions"]
                if c["type"] == "PodScheduled" and c["status"] == "True"
            )
            for p in training
        ]
        # All or nothing: the API records each bind to the second; all four within 2 s.
        seconds = sorted(
            int(time.mktime(time.strptime(t, "%Y-%m-%dT%H:%M:%SZ"))) for t in bind_times
        )
        assert seconds[-1] - seconds[0] <= 2, bind_times

        opened = await until_effect(api, node, "PreferNoSchedule", within=30)
        assert opened - admitted <= 15, f"overflow opened {opened - admitted:.1f}s after admission"

        async def overflowed() -> bool:
            pods = await inference_pods(api, namespace)
            return len(pods) == REPLICAS and all(
                p["spec"].get("nodeName") == node and is_ready(p) for p in pods
            )

        await wait_for(overflowed, timeout=45, interval=0.2, what="inference on the virtual node")
        on_virtual = time.monotonic()
        assert on_virtual - admitted <= 30, f"replicas Running {on_virtual - admitted:.1f}s after"
        overflowed_pods = {p["metadata"]["name"] for p in await inference_pods(api, namespace)}

        # 3. Kill the agent and start it again; then take Prometheus away: the flip stays open.
        assert agent.process is not None
        agent.process.send_signal(signal.SIGKILL)
        agent.process.wait(timeout=30)
        agent.start()
        await node_ready(api, node, agent)
        await asyncio.sleep(0)
        reads_before = len(watch.effects)
        await wait_for(
            lambda: _async(len(watch.effects) >= reads_before + 20), timeout=60, what="samples"
        )
        assert await taint_effect(api, node) == "PreferNoSchedule"
        assert await overflowed(), "the replicas stayed where they were through the restart"

        await asyncio.to_thread(components.stop_prometheus)

        async def signal_lost() -> bool:
            found = await api.get_node(node)
            for condition in ((found or {}).get("status") or {}).get("conditions") or []:
                if condition.get("type") == "Overflow":
                    return bool(condition.get("reason") == "SignalUnavailable")
            return False

        await wait_for(signal_lost, timeout=30, interval=0.2, what="the signal reported lost")
        outage_reads = len(watch.effects)
        await wait_for(
            lambda: _async(len(watch.effects) >= outage_reads + 20), timeout=60, what="samples"
        )
        assert await taint_effect(api, node) == "PreferNoSchedule"  # never flips on missing data
        await asyncio.to_thread(components.start_prometheus)
        back = time.time()
        # The outage ends with fresh samples of the training pods (a series that vanished
        # before the restarted Prometheus's first scrape would linger for its lookback delta).
        fresh = (
            f'min(timestamp(kube_pod_container_resource_requests{{namespace="{namespace}",'
            'pod=~"train-.*"}))'
        )

        async def scraped_again() -> bool:
            value = await asyncio.to_thread(components.prometheus.value, fresh)
            return value is not None and value > back

        await wait_for(scraped_again, timeout=60, interval=0.5, what="Prometheus scraping again")

        async def signal_back() -> bool:
            return not await signal_lost()

        await wait_for(signal_back, timeout=30, interval=0.2, what="the signal back")

        # 4. Training ends: the overflow closes, the descheduler brings inference home.
        for pod in training:
            await api.delete_pod_now(namespace, pod["metadata"]["name"], uid=pod["metadata"]["uid"])
        try:
            await until_effect(api, node, "NoSchedule", within=60)
        except BaseException:
            _diagnose(agent, components)
            raise
        watch.sample_ready = True
        cycles: list[int] = []

        async def home() -> bool:
            pods = await inference_pods(api, namespace)
            return len(pods) == REPLICAS and all(
                is_ready(p) and p["spec"].get("nodeName") in components.nodes for p in pods
            )

        deadline = time.monotonic() + 300
        while not await home():
            assert time.monotonic() < deadline, f"not home after {len(cycles)} cycles"
            run = await asyncio.to_thread(components.run_descheduler_once)
            assert run.ok, run.output[-2000:]
            cycles.append(len(run.evictions))
            assert all(e.node == node for e in run.evictions)
        watch.sample_ready = False
        assert max(cycles) == 1, cycles  # one pod per cycle, never more
        assert sum(cycles) == len(overflowed_pods), cycles
        assert watch.ready and min(count for _, count in watch.ready) >= PDB_MIN, watch.ready

        async def no_instances() -> bool:
            listed = [await p.list_ours() for p in local_providers(agent)]
            return not any(listed)

        await wait_for(no_instances, timeout=60, interval=0.5, what="no provider instance left")
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler

    assert all("NoExecute" not in (effect or "") for _, effect in watch.effects)
    assert watch.transitions() == ["NoSchedule", "PreferNoSchedule", "NoSchedule"], (
        watch.transitions()
    )
    reasons = [e.reason for e in await node_events(raw, node)]
    assert reasons.count("OverflowOpened") == 1 and reasons.count("OverflowClosed") == 1
    assert "OverflowSignalUnavailable" in reasons and "OverflowSignalRestored" in reasons

    # The log at INFO (docs/operating.md#read-the-log): a line per decision, each with its
    # pod and instance; none per Prometheus query.
    text = agent.log_text()
    assert "HTTP Request" not in text
    for decision in (
        "placed on",
        "Started container",
        "overflow: overflow opened",
        "overflow: the GPU signal cannot be read",
        "overflow: the GPU signal can be read again",
        "overflow: overflow closed",
        "deleted; its instance terminated",
        "eviction finished: deleted; its instance terminated",  # the descheduler's, moving home
    ):
        assert decision in text, decision
    placed = [line for line in text.splitlines() if "placed on" in line]
    assert len(placed) >= REPLICAS, placed
    assert all(f"pod={namespace}/infer-" in line and "instance=" in line for line in placed)


async def _async(value: bool) -> bool:
    return value


def _diagnose(agent: AgentProcess, components: FlipComponents) -> None:
    """What the agent's flip and Prometheus said, printed for a failing run's report."""
    lines = [ln for ln in agent.log_text().splitlines() if "overflow" in ln.lower()]
    print("\n".join(lines[-40:]))
    for rule in (
        "flip:own_gpu_allocatable:sum",
        "flip:own_gpu_requested:sum",
        "flip:unscheduled_gpu_requested:sum",
    ):
        with contextlib.suppress(Exception):
            print(rule, components.prometheus.value(rule))
    with contextlib.suppress(Exception):
        for sample in components.prometheus.query(
            'kube_pod_container_resource_requests{resource="nvidia_com_gpu"}'
        ):
            print(sample)
    with contextlib.suppress(Exception):
        print("targets up:", components.prometheus.targets_up(), components.prometheus.value("up"))
        print(components.prometheus.log_file.read_text()[-3000:])
    with contextlib.suppress(Exception):
        for pod in components.api.items("/api/v1/pods"):
            meta, spec = pod["metadata"], pod["spec"]
            print(
                meta["namespace"],
                meta["name"],
                spec.get("nodeName"),
                pod["status"].get("phase"),
                meta.get("deletionTimestamp"),
                meta.get("finalizers"),
            )


def _free_home_slots(components: FlipComponents, gpus: int) -> int:
    """How many ``gpus``-GPU pods the own nodes still take (what earlier tests left there)."""
    used: dict[str, float] = dict.fromkeys(components.nodes, 0.0)
    for pod in components.api.items("/api/v1/pods"):
        node = pod["spec"].get("nodeName")
        if node in used and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            for container in pod["spec"]["containers"]:
                limits = (container.get("resources") or {}).get("limits") or {}
                used[node] += float(limits.get(w.GPU_RESOURCE, 0))
    return sum(int((8 - used[node]) // gpus) for node in components.nodes)


async def test_scale_in_removes_rented_replicas_first_the_dearest_first(
    components: FlipComponents,
    gang_agents: AgentHarness,
    gang_kube: KubeClient,
    gang_raw: ApiClient,
) -> None:
    """A real ReplicaSet scale-down with replicas at home (several per own node) and two on
    the virtual node at $1 and $3 an hour. Without the agent's pod-deletion-cost the
    ReplicaSet controller removes a home replica first (it ranks pods "doubled up" on a node
    first, and the home nodes hold more replicas each than the virtual node)."""
    api, raw, story_agents = gang_kube, gang_raw, gang_agents
    namespace = f"scale-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(raw)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    agent = flip_agent(
        story_agents,
        components,
        [
            an_offer("cheap", gpus=2, price=1.0, capacity=1),
            an_offer("dear", gpus=2, price=3.0, capacity=1),
        ],
        close_after=3600,
    )
    node = agent.node
    path = w.deployments_path(namespace)
    try:
        await node_ready(api, node, agent)
        home = await asyncio.to_thread(_free_home_slots, components, 2)
        assert home >= 2 * len(components.nodes), f"only {home} home slots left"
        deployment = w.gpu_deployment(
            "infer", namespace=namespace, replicas=home + 2, gpus=2, command=[PY, "-c", LOOP]
        )
        await asyncio.to_thread(create_object, components, path, deployment)

        async def placed() -> list[dict[str, Any]] | None:
            pods = await inference_pods(api, namespace)
            ready = [p for p in pods if is_ready(p)]
            rented = [p for p in ready if p["spec"].get("nodeName") == node]
            return pods if len(ready) == home + 2 and len(rented) == 2 else None

        pods = await wait_for(placed, timeout=180, interval=0.5, what="home full, two rented")
        rented = {
            p["metadata"]["annotations"]["vk-provider.io/price-per-hour"]: p
            for p in pods
            if p["spec"]["nodeName"] == node
        }
        assert sorted(rented) == ["1.0000", "3.0000"], sorted(rented)
        for price, pod in rented.items():
            cost = pod["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"]
            assert int(cost) == deletion_cost(float(price))
        at_home = {p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] != node}

        async def alive() -> set[str]:
            return {
                p["metadata"]["name"]
                for p in await inference_pods(api, namespace)
                if not p["metadata"].get("deletionTimestamp")
            }

        await asyncio.to_thread(
            components.api.patch, f"{path}/infer", {"spec": {"replicas": home + 1}}
        )

        async def one_fewer() -> set[str] | None:
            names = await alive()
            return names if len(names) == home + 1 else None

        left = await wait_for(one_fewer, timeout=60, interval=0.2, what="one replica removed")
        assert rented["3.0000"]["metadata"]["name"] not in left, "the dearest went first"
        assert at_home <= left, f"a home replica went: {at_home - left}"

        await asyncio.to_thread(components.api.patch, f"{path}/infer", {"spec": {"replicas": home}})

        async def home_only() -> set[str] | None:
            names = await alive()
            return names if len(names) == home else None

        assert await wait_for(home_only, timeout=60, interval=0.2, what="rented gone") == at_home
    finally:
        await asyncio.to_thread(components.api.delete, f"/api/v1/namespaces/{namespace}")

        async def emptied() -> bool:
            return not await inference_pods(api, namespace)

        await wait_for(emptied, timeout=120, what=f"the pods of {namespace} gone")
