"""The manifests the Kubernetes adapter writes into cluster B: the Pod and its Secret.

The remote pod. ``restartPolicy: Never`` (restarts are the agent's job, as attempts),
``automountServiceAccountToken: false`` and ``enableServiceLinks: false`` (a workload from
cluster A gets no credentials or service addresses of B). Image, command, args, workingDir,
ports and env come from the ``WorkloadSpec``. Resources: requests are the workload's own
(cpu, memory; set explicitly, even to 0, so that limits do not become requests), limits are
the offer's shape (vCPUs, memory, ``nvidia.com/gpu``): the pod is guaranteed what it asked
for and may burst to what was paid for. Scheduling: it tolerates every taint with the key
``virtual-kubelet.io/provider`` (so B may itself be a virtual-kubelet burst cluster) and, when
it uses GPUs, every ``nvidia.com/gpu`` taint (the customary taint of GPU node pools); a
required node affinity keeps it in the offer's region (nodes labelled
``topology.kubernetes.io/region=<region>``, plus unlabelled nodes when the region is the
fallback one).

Secrets. Environment values that came from a Secret (``EnvVar.secret``) never appear in the
remote pod spec: they go into a Secret of the same name in B, referenced by ``secretKeyRef``;
``owner_reference`` makes the pod that Secret's owner once the pod exists.

Invariants: pure; ``build_pod`` raises ``InvalidSpec`` only for what B can never run
(everything else is left to B's validation, whose 422 names the field).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from typing import Final

from providers.kubernetes.names import (
    ANN_ATTEMPT,
    ANN_OFFER,
    ANN_POD_UID,
    ANN_PRICE,
    ANN_SOURCE,
    owner_labels,
    secret_keys,
)
from providers.kubernetes.offers import (
    GPU_RESOURCE,
    GPU_TOLERATIONS,
    REGION_LABEL,
    TOLERATIONS,
    Shape,
)
from providers.payload import MalformedResponse, mapping
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import Offer, WorkloadSpec

JSON = dict[str, object]
_CONTAINER: Final = "spec.containers[0]"


def cpu_quantity(vcpus: float) -> str:
    """vCPUs as millicores (``1500m``), rounded up."""
    return f"{math.ceil(round(vcpus * 1000, 6))}m"


def memory_quantity(gib: float) -> str:
    """GiB as MiB (``1536Mi``), rounded up."""
    return f"{math.ceil(round(gib * 1024, 6))}Mi"


def build_secret(spec: WorkloadSpec, *, name: str, namespace: str, provider: str) -> JSON | None:
    """The Secret holding the workload's secret env values; None when it has none."""
    keys = secret_keys(spec)
    if not keys:
        return None
    data = {
        keys[var.name]: base64.b64encode(var.value.encode()).decode()
        for var in spec.env
        if var.secret
    }
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owner_labels(spec, provider=provider),
        },
        "type": "Opaque",
        "data": data,
    }


def region_affinity(region: str, *, fallback: bool) -> JSON:
    """Nodes labelled with ``region``, and unlabelled ones when it is the fallback region."""
    terms: list[JSON] = [
        {"matchExpressions": [{"key": REGION_LABEL, "operator": "In", "values": [region]}]}
    ]
    if fallback:
        terms.append({"matchExpressions": [{"key": REGION_LABEL, "operator": "DoesNotExist"}]})
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


def build_pod(
    spec: WorkloadSpec,
    shape: Shape,
    *,
    name: str,
    namespace: str,
    provider: str,
    offer: Offer,
    fallback_region: str,
    secret_name: str | None,
) -> JSON:
    """The remote Pod for ``spec`` on ``shape``; raises ``InvalidSpec`` for what B can never
    run (everything else is left to B's validation, whose 422 names the field)."""
    if not spec.image.strip():
        raise InvalidSpec("a pod needs an image", field=f"{_CONTAINER}.image")
    keys = secret_keys(spec)
    env: list[JSON] = []
    for var in spec.env:
        if var.secret:
            if secret_name is None:
                raise ValueError("secret env values need a Secret")  # a bug, not a spec error
            ref = {"name": secret_name, "key": keys[var.name]}
            env.append({"name": var.name, "valueFrom": {"secretKeyRef": ref}})
        else:
            env.append({"name": var.name, "value": var.value})
    container: JSON = {"name": spec.container_name or "main", "image": spec.image}
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    if spec.working_dir:
        container["workingDir"] = spec.working_dir
    if env:
        container["env"] = env
    if spec.ports:
        container["ports"] = [
            {"containerPort": p.container_port, "protocol": p.protocol}
            | ({"name": p.name} if p.name else {})
            for p in spec.ports
        ]
    limits: dict[str, str] = {
        "cpu": cpu_quantity(shape.vcpus),
        "memory": memory_quantity(shape.memory_gib),
    }
    if shape.gpus:
        limits[GPU_RESOURCE] = str(shape.gpus)
    container["resources"] = {
        # Explicit requests, even 0: without them the API server would copy the limits.
        "requests": {"cpu": cpu_quantity(spec.cpu), "memory": str(max(0, spec.memory_bytes))},
        "limits": limits,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owner_labels(spec, provider=provider),
            "annotations": {
                ANN_POD_UID: spec.pod_uid,
                ANN_ATTEMPT: str(spec.attempt),
                ANN_OFFER: offer.key,
                ANN_PRICE: f"{offer.price_per_hour:.6f}",
                ANN_SOURCE: f"{spec.namespace}/{spec.pod_name}",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [dict(t) for t in (GPU_TOLERATIONS if shape.gpus else TOLERATIONS)],
            "affinity": region_affinity(offer.region, fallback=offer.region == fallback_region),
            "containers": [container],
        },
    }


def owner_reference(pod: Mapping[str, object]) -> JSON:
    """The ownerReference that makes B's garbage collector delete a Secret with its pod."""
    metadata = mapping(pod.get("metadata"), "pod metadata")
    name, uid = metadata.get("name"), metadata.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str) or not uid:
        raise MalformedResponse("the created pod has no name or uid")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}
