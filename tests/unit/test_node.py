"""What the virtual node says about itself: capacity from offers, labels, taints, status."""

from __future__ import annotations

from datetime import UTC, datetime

from vk_provider.domain.models import Offer
from vk_provider.domain.node import (
    NodeResources,
    merged_taints,
    node_capacity,
    node_labels,
    node_status,
)
from vk_provider.domain.podview import micro_time
from vk_provider.settings.agent import NodeConfig, Taint


def _offer(
    provider: str, gpus: int, available: int, *, model: str = "H100", region: str = "r"
) -> Offer:
    return Offer(
        provider=provider,
        sku=f"{gpus}x",
        region=region,
        gpu_model=model,
        gpu_count=gpus,
        gpu_memory_gib=80,
        vcpus=8 * gpus,
        memory_gib=64 * gpus,
        price_per_hour=gpus * 2.0,
        available=available,
    )


def test_shapes_of_one_pool_count_once_and_pools_add_up() -> None:
    pool = [_offer("rp", 1, 4), _offer("rp", 2, 2), _offer("rp", 4, 1)]
    other = [_offer("rp", 1, 3, model="A100-80GB"), _offer("lambda", 8, 1)]
    capacity = node_capacity(pool + other, NodeConfig().caps)
    assert capacity.gpus == 4 + 3 + 8
    assert capacity.cpu == 32 + 24 + 64


def test_capacity_is_capped_and_never_negative() -> None:
    config = NodeConfig(max_gpus=5, max_cpu=10, max_memory_gib=20, max_pods=7)
    assert node_capacity([_offer("rp", 8, 3)], config.caps) == NodeResources(5, 10, 20, 7)
    assert node_capacity([_offer("rp", 1, -3)], NodeConfig().caps).gpus == 0
    assert node_capacity([], NodeConfig().caps).gpus == 0


def test_standard_labels_win_over_configured_ones() -> None:
    labels = node_labels("vk-x", {"type": "mine", "team": "a"})
    assert labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/hostname"] == "vk-x"
    assert labels["team"] == "a"


def test_our_taints_are_kept_and_others_are_not_removed() -> None:
    config = NodeConfig(taints=[Taint(key="virtual-kubelet.io/provider", value="vk-provider")])
    current = [
        {"key": "virtual-kubelet.io/provider", "value": "old", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
    ]
    merged = merged_taints(current, config.taint_objects())
    assert {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"} in merged
    ours = [t for t in merged if t["key"] == "virtual-kubelet.io/provider"]
    assert ours == [
        {"key": "virtual-kubelet.io/provider", "value": "vk-provider", "effect": "NoSchedule"}
    ]


def test_transition_times_are_kept_while_a_condition_holds() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1 = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    args = {
        "resources": NodeResources(1, 1, 1, 1),
        "address": "10.0.0.5",
        "kubelet_port": 10250,
        "node_name": "vk",
        "reason": "KubeletReady",
        "message": "ok",
    }
    first = node_status(ready=True, now=t0, **args)  # type: ignore[arg-type]
    second = node_status(ready=True, now=t1, previous={"status": first}, **args)  # type: ignore[arg-type]
    ready = next(c for c in second["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert ready["lastHeartbeatTime"] == "2026-01-01T00:05:00Z"
    flipped = node_status(ready=False, now=t1, previous={"status": first}, **args)  # type: ignore[arg-type]
    assert next(c for c in flipped["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == (
        "2026-01-01T00:05:00Z"
    )
    assert second["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}


def test_micro_time_has_six_fractional_digits() -> None:
    assert micro_time(datetime(2026, 1, 1, 1, 2, 3, tzinfo=UTC)) == "2026-01-01T01:02:03.000000Z"


def test_what_the_node_s_pods_hold_adds_to_the_free_part() -> None:
    # 2 free A100s at the provider, 3 already held by the node's pods: the scheduler
    # subtracts the 3 itself, so the node must say 5.
    capacity = node_capacity([_offer("rp", 1, 2)], NodeConfig().caps, held=(3, 24, 192))
    assert capacity.gpus == 5
    assert capacity.cpu == 16 + 24
    assert capacity.memory_gib == 128 + 192
