"""What the virtual Node object should say: pure functions of configuration, offers and time.

``node_capacity`` turns the providers' offers and what the node's pods hold into capacity;
``node_status`` is the Node's status; ``build_node`` the object to register; ``merged_taints``
keeps other parties' taints next to ours. ``vk_provider.controllers.node`` applies them.

Invariants: capacity never goes negative and never exceeds the caps; a condition's
``lastTransitionTime`` changes only when its status does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from vk_provider import __version__
from vk_provider.domain.models import Offer
from vk_provider.domain.podview import JSON, rfc3339


@dataclass(frozen=True, slots=True)
class NodeResources:
    gpus: int
    cpu: int
    memory_gib: int
    pods: int

    def as_quantities(self) -> dict[str, str]:
        return {
            "nvidia.com/gpu": str(self.gpus),
            "cpu": str(self.cpu),
            "memory": f"{self.memory_gib}Gi",
            "pods": str(self.pods),
        }


@dataclass(frozen=True, slots=True)
class NodeCaps:
    """Upper bounds on what the node advertises (configured)."""

    max_gpus: int
    max_cpu: int
    max_memory_gib: int
    max_pods: int


def node_capacity(
    offers: Iterable[Offer],
    caps: NodeCaps,
    held: tuple[float, float, float] = (0.0, 0.0, 0.0),
) -> NodeResources:
    """What the providers can give us: their free room plus what our pods held, within caps.

    Offers describe *free* capacity as of when the providers were asked (adapters subtract
    the instances already running, ours included), while the scheduler subtracts the
    requests of the pods on the node: so the node's capacity is the free part plus ``held``,
    what the providers' answer counts as our pods' (GPUs, vCPUs, GiB; ``domain.room``). A
    pod placed after that answer is not in ``held`` (the answer still shows its room free),
    so it is counted once, by the scheduler, never twice.

    Offers of one provider, region and GPU model usually draw on one pool (1x, 2x, 4x and 8x
    shapes of the same machines), so a pool counts once, by its largest offer; distinct
    pools add up. Never negative, never above the caps.
    """
    pools: dict[tuple[str, str, str | None], tuple[float, float, float]] = {}
    for offer in offers:
        available = max(offer.available, 0)
        size = (
            max(offer.gpu_count, 0) * available,
            max(offer.vcpus, 0) * available,
            max(offer.memory_gib, 0) * available,
        )
        key = (offer.provider, offer.region, offer.gpu_model)
        best = pools.get(key, (0.0, 0.0, 0.0))
        pools[key] = (max(best[0], size[0]), max(best[1], size[1]), max(best[2], size[2]))
    gpus = sum(p[0] for p in pools.values()) + max(held[0], 0)
    cpu = sum(p[1] for p in pools.values()) + max(held[1], 0)
    memory = sum(p[2] for p in pools.values()) + max(held[2], 0)
    return NodeResources(
        gpus=min(int(gpus), caps.max_gpus),
        cpu=min(int(cpu), caps.max_cpu),
        memory_gib=min(int(memory), caps.max_memory_gib),
        pods=caps.max_pods,
    )


def node_labels(name: str, extra: Mapping[str, str]) -> dict[str, str]:
    """The configured labels, then the standard ones of a virtual node (which win)."""
    return {
        **extra,
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "vk-provider",
    }


def node_status(
    *,
    resources: NodeResources,
    ready: bool,
    reason: str,
    message: str,
    address: str,
    kubelet_port: int,
    node_name: str,
    now: datetime,
    previous: JSON | None = None,
) -> JSON:
    """The Node's status; transition times are kept when a condition's status is unchanged."""
    prior = {
        c.get("type"): c for c in ((previous or {}).get("status") or {}).get("conditions") or []
    }

    def condition(kind: str, status: str, why: str, text: str) -> dict[str, str]:
        old = prior.get(kind)
        transition = (
            old["lastTransitionTime"]
            if old and old.get("status") == status and old.get("lastTransitionTime")
            else rfc3339(now)
        )
        return {
            "type": kind,
            "status": status,
            "reason": why,
            "message": text,
            "lastHeartbeatTime": rfc3339(now),
            "lastTransitionTime": transition,
        }

    quantities = resources.as_quantities()
    return {
        "capacity": quantities,
        "allocatable": quantities,
        "conditions": [
            condition("Ready", "True" if ready else "False", reason, message),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": address},
            {"type": "Hostname", "address": node_name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
        "nodeInfo": {
            "architecture": "amd64",
            "operatingSystem": "linux",
            "kubeletVersion": f"v1.37.2-vk-provider-{__version__}",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "vk-provider://" + __version__,
            "kernelVersion": "",
            "osImage": "vk-provider virtual node",
            "machineID": "",
            "systemUUID": "",
            "bootID": "",
        },
    }


def build_node(name: str, labels: Mapping[str, str], taints: list[JSON]) -> JSON:
    """The Node object to register (status is written separately through /status)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels(name, labels)},
        "spec": {"taints": list(taints)},
    }


# The labels GPU feature discovery puts on GPU nodes, and ours per offered model, so that
# node affinities on GPU models work against the virtual node
# (docs/overflow.md#pods-with-nowhere-to-go).
# The virtual node's taint (every virtual kubelet's key), the overflow flip's by default too;
# spelled here only.
VIRTUAL_NODE_TAINT_KEY = "virtual-kubelet.io/provider"
VIRTUAL_NODE_TAINT_VALUE = "vk-provider"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_MODEL_LABEL_PREFIX = "gpu.vk-provider.io/"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _label_safe(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-_.")[:63]


def gpu_labels(offers: Iterable[Offer]) -> dict[str, str]:
    """``gpu.vk-provider.io/<model>=true`` for every GPU model offered, GFD's
    ``nvidia.com/gpu.present=true`` when any is, and ``nvidia.com/gpu.product`` only when the
    node offers exactly one model (a node offering several cannot say one product)."""
    models = sorted(
        {_label_safe(o.gpu_model) for o in offers if o.gpu_model and o.gpu_count > 0} - {""}
    )
    labels = {GPU_MODEL_LABEL_PREFIX + model: "true" for model in models}
    if models:
        labels[GPU_PRESENT_LABEL] = "true"
    if len(models) == 1:
        labels[GPU_PRODUCT_LABEL] = models[0]
    return labels


def gpu_label_patch(current: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str | None]:
    """The metadata.labels merge patch that makes the GPU labels ``wanted`` (others untouched);
    empty when nothing changes."""
    ours = {
        k
        for k in current
        if k.startswith(GPU_MODEL_LABEL_PREFIX) or k in (GPU_PRESENT_LABEL, GPU_PRODUCT_LABEL)
    }
    patch: dict[str, str | None] = {k: None for k in ours - set(wanted)}
    patch.update({k: v for k, v in wanted.items() if current.get(k) != v})
    return patch


def merged_taints(current: list[JSON], ours: list[JSON]) -> list[JSON]:
    """Ours (from config) plus whatever others put there, without duplicates by key+effect."""
    owned = {(t["key"], t["effect"]) for t in ours}
    others = [t for t in current if (t.get("key"), t.get("effect")) not in owned]
    return ours + others
