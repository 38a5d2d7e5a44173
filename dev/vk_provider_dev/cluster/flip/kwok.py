"""KWOK as the cluster's own GPU nodes: its configuration, its process, and the nodes it plays.

KWOK (``sigs.k8s.io/kwok``) pretends to be the kubelet of nodes it is told to manage: it
makes them Ready, holds their Leases and moves their pods through the stages it is given
(pending → running → deleted; Job pods to Succeeded unless ``pod_complete`` is off).

Invariants:
- KWOK manages only nodes annotated ``kwok.x-k8s.io/node=fake`` (``MANAGED_ANNOTATION``),
  never every node (``manageAllNodes`` is false): the virtual node of vk-provider, its Lease
  and its pods are invisible to it.
- The configuration carries its stages (the ``kwok`` binary has none built in) and every
  parallelism option (a configuration file gets no defaults; zero is refused), and a pod CIDR
  (``POD_CIDR``) apart from the local cluster's service CIDR 10.0.0.0/24.
- The own GPU nodes (``gpu_node``) carry their status in the create, so allocatable GPUs are
  visible before KWOK's first heartbeat; they are labelled ``gpu.pool=own`` (``OWN_POOL``),
  which the flip's recording rules select on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.adminapi import JSON, AdminApi
from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent, http_ok
from vk_provider_dev.cluster.flip.tools import KwokBinary
from vk_provider_dev.cluster.ports import free_ports

MANAGED_ANNOTATION: Final = ("kwok.x-k8s.io/node", "fake")
POOL_LABEL: Final = "gpu.pool"
OWN_POOL: Final = "own"
GPU_RESOURCE: Final = "nvidia.com/gpu"
POD_CIDR: Final = "10.244.0.0/16"
NODE_PREFIX: Final = "gpu-node"
POD_COMPLETE_STAGE: Final = "pod-complete"
NODES: Final = "/api/v1/nodes"


def kwok_configuration(*, node_port: int) -> dict[str, Any]:
    """The ``KwokConfiguration`` document (module docstring for why each option is set)."""
    key, value = MANAGED_ANNOTATION
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{key}={value}",
            "manageNodesWithLabelSelector": "",
            "manageSingleNode": "",
            "cidr": POD_CIDR,
            "nodeIP": "127.0.0.1",
            "nodePort": node_port,
            "nodeLeaseDurationSeconds": 40,
            "nodeLeaseParallelism": 4,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncStreamWatch": True,
            "enableProfilingHandler": False,
            "enableContentionProfiling": False,
        },
    }


def stage_name(stage_yaml: str) -> str:
    document = yaml.safe_load(stage_yaml)
    return str(document["metadata"]["name"])


def kwok_config(stages: Sequence[str], *, node_port: int, pod_complete: bool = True) -> str:
    """The configuration file: the ``KwokConfiguration`` then each stage document.

    ``pod_complete=False`` drops the stage that makes Job-owned pods Succeed at once (a
    training Job must keep its GPUs until the test ends it).
    """
    kept = [s for s in stages if pod_complete or stage_name(s) != POD_COMPLETE_STAGE]
    head = yaml.safe_dump(kwok_configuration(node_port=node_port), sort_keys=False)
    return "---\n".join([head, *(s if s.endswith("\n") else s + "\n" for s in kept)])


def kwok_command(binary: Path, *, kubeconfig: Path, config: Path, port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--config={config}",
        f"--server-address=127.0.0.1:{port}",
        "--node-ip=127.0.0.1",
    ]


def gpu_node(
    name: str,
    *,
    gpus: int = 8,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    pool: str = OWN_POOL,
    labels: dict[str, str] | None = None,
) -> JSON:
    """A KWOK-managed GPU node with its capacity set in the create (module docstring)."""
    key, value = MANAGED_ANNOTATION
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods), GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value, "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/role": "agent",
                "node-role.kubernetes.io/agent": "",
                "type": "kwok",
                POOL_LABEL: pool,
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "fake",
                "kubeProxyVersion": "fake",
            },
            "phase": "Running",
        },
    }


def gpu_node_names(count: int, *, prefix: str = NODE_PREFIX) -> list[str]:
    return [f"{prefix}-{index}" for index in range(count)]


def create_gpu_nodes(
    api: AdminApi, count: int, *, prefix: str = NODE_PREFIX, gpus: int = 8
) -> list[str]:
    """Create ``prefix-0 .. prefix-(count-1)`` (existing ones are kept); return their names."""
    names = gpu_node_names(count, prefix=prefix)
    for name in names:
        api.create(NODES, gpu_node(name, gpus=gpus), exist_ok=True)
    return names


def delete_gpu_nodes(api: AdminApi, names: Iterable[str]) -> None:
    """Delete the nodes (gone ones are fine); their pods are then garbage-collected."""
    for name in names:
        api.delete(f"{NODES}/{name}")


def node_ready(node: JSON | None) -> bool:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def wait_nodes_ready(api: AdminApi, names: Iterable[str], *, timeout: float = 60.0) -> None:
    """Poll until every named node is Ready; ``ClusterError`` naming the others on timeout."""
    pending = list(names)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [n for n in pending if not node_ready(api.get(f"{NODES}/{n}"))]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {', '.join(pending)}")
        time.sleep(0.25)


@dataclass(slots=True)
class Kwok(RunningComponent):
    """A running KWOK (``start_kwok``); stop it with ``stop()`` or a ``with`` block."""

    child: ChildProcess
    port: int
    config: Path


def start_kwok(
    kwok: KwokBinary,
    *,
    kubeconfig: Path,
    directory: Path,
    pod_complete: bool = True,
    timeout: float = 60.0,
) -> Kwok:
    """Write the configuration into ``directory``, start KWOK, return once it serves /healthz.

    Its log is ``directory/kwok.log``. A KWOK started again against the same nodes treats
    them as read-only until the previous instance's Leases expire (40 s).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    stages = [path.read_text() for path in kwok.stage_files()]
    config = directory / "kwok.yaml"
    config.write_text(kwok_config(stages, node_port=port, pod_complete=pod_complete))
    child = ChildProcess.start(
        "kwok",
        kwok_command(kwok.path, kubeconfig=kubeconfig, config=config, port=port),
        log_file=directory / "kwok.log",
        health=http_ok(f"http://127.0.0.1:{port}/healthz"),
        cwd=directory,
        timeout=timeout,
    )
    return Kwok(child=child, port=port, config=config)
