"""The manifests the Kubernetes adapter writes into cluster B: the Pod, its Secret, its Service.

The remote pod is the whole pod: every app container and init container of the workload, in
order, native sidecars keeping ``restartPolicy: Always`` (``containers``), each with its own
command, args, workingDir, ports, env and probes. Its ``restartPolicy`` is the pod's own: B's
kubelet restarts containers, runs init containers and sidecars and runs the probes, so this
adapter never asks the agent for a second attempt. ``automountServiceAccountToken: false``
and ``enableServiceLinks: false``: a workload from cluster A gets no credentials or service
addresses of B. Resources (``resources``): one container gets the workload's requests and the
offer's shape as limits; several containers each request their own and share the shape's
limits. Scheduling: it tolerates every taint with the key ``virtual-kubelet.io/provider`` (so
B may itself be a virtual-kubelet burst cluster) and, when it uses GPUs, every
``nvidia.com/gpu`` taint (the customary taint of GPU node pools); a required node affinity
keeps it in the offer's region (nodes labelled ``topology.kubernetes.io/region=<region>``,
plus unlabelled nodes when the region is the fallback one).

Secrets. Environment values that came from a Secret (``EnvVar.secret``), of any container,
never appear in the remote pod spec: they go into one Secret per launch, of the pod's name, in
B, under a key per (container, variable) (``names.secret_keys``), referenced by
``secretKeyRef``; ``owner_reference`` makes the pod that Secret's owner once the pod exists.

Services (``expose: node-port`` or ``load-balancer``). ``build_service`` is the pod's own
Service, made once the pod exists and owned by it from the start (``owner_reference``), so B's
garbage collector removes it with the pod whatever happened to the agent. It selects exactly
that pod (``names.instance_selector``: the pod carries ``vk-provider.io/instance=<its
name>``), has one port per declared (containerPort, protocol) of the app containers and native
sidecars (``service_ports``) at ``port = targetPort = containerPort``, and
``externalTrafficPolicy: Cluster``, because the address reported is any Ready node's, which
need not be the pod's.

Invariants: pure; ``build_pod`` raises ``InvalidSpec`` only for what B can never run
(everything else is left to B's validation, whose 422 names the field).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Final

from vk_provider.sdk import ContainerSpec, Offer, Port, WorkloadSpec
from vk_provider_adapters.kubernetes.containers import (
    JSON,
    container_json,
)
from vk_provider_adapters.kubernetes.names import (
    ANN_ATTEMPT,
    ANN_OFFER,
    ANN_POD_UID,
    ANN_PRICE,
    ANN_SOURCE,
    LABEL_INSTANCE,
    instance_selector,
    owner_labels,
    secret_keys,
)
from vk_provider_adapters.kubernetes.offers import GPU_TOLERATIONS, REGION_LABEL, TOLERATIONS, Shape
from vk_provider_adapters.kubernetes.resources import container_resources
from vk_provider_adapters.payload import MalformedResponse, mapping


def build_secret(spec: WorkloadSpec, *, name: str, namespace: str, provider: str) -> JSON | None:
    """The Secret holding the workload's secret env values; None when it has none."""
    keys = secret_keys(spec)
    if not keys:
        return None
    data = {
        keys[(container.name, var.name)]: base64.b64encode(var.value.encode()).decode()
        for container in spec.every_container
        for var in container.env
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
    apps, inits = spec.containers, spec.init_containers
    keys = secret_keys(spec)
    init_resources, app_resources = container_resources(spec, shape, apps=apps, inits=inits)

    def built(kind: str, containers: Sequence[ContainerSpec], resources: list[JSON]) -> list[JSON]:
        return [
            container_json(
                container,
                path=f"spec.{kind}[{index}]",
                keys=keys,
                secret_name=secret_name,
                resources=resources[index],
            )
            for index, container in enumerate(containers)
        ]

    body: JSON = {
        "restartPolicy": spec.restart_policy,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "tolerations": [dict(t) for t in (GPU_TOLERATIONS if shape.gpus else TOLERATIONS)],
        "affinity": region_affinity(offer.region, fallback=offer.region == fallback_region),
    }
    if inits:
        body["initContainers"] = built("initContainers", inits, init_resources)
    body["containers"] = built("containers", apps, app_resources)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": owner_labels(spec, provider=provider) | {LABEL_INSTANCE: name},
            "annotations": {
                ANN_POD_UID: spec.pod_uid,
                ANN_ATTEMPT: str(spec.attempt),
                ANN_OFFER: offer.key,
                ANN_PRICE: f"{offer.price_per_hour:.6f}",
                ANN_SOURCE: f"{spec.namespace}/{spec.pod_name}",
            },
        },
        "spec": body,
    }


def owner_reference(pod: Mapping[str, object]) -> JSON:
    """The ownerReference that makes B's garbage collector delete a Secret or a Service with
    its pod."""
    metadata = mapping(pod.get("metadata"), "pod metadata")
    name, uid = metadata.get("name"), metadata.get("uid")
    if not isinstance(name, str) or not isinstance(uid, str) or not uid:
        raise MalformedResponse("the created pod has no name or uid")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid, "controller": True}


SERVICE_TYPES: Final = {"node-port": "NodePort", "load-balancer": "LoadBalancer"}


def declared_ports(spec: WorkloadSpec) -> list[Port]:
    """The ports the app containers and native sidecars declare, each (containerPort,
    protocol) once (plain init containers serve nothing once the pod runs)."""
    found: dict[tuple[int, str], Port] = {}
    for container in (*(c for c in spec.init_containers if c.sidecar), *spec.containers):
        for port in container.ports:
            found.setdefault((port.container_port, port.protocol), port)
    return list(found.values())


def service_ports(spec: WorkloadSpec) -> list[JSON]:
    """A Service port per declared port, named as declared, else ``<protocol>-<port>`` (a
    Service of several ports must name each, uniquely); ``port = targetPort = containerPort``."""
    ports = declared_ports(spec)
    used = {p.name for p in ports if p.name}
    built: list[JSON] = []
    for port in ports:
        name = port.name
        if not name:
            base = name = f"{port.protocol.lower()}-{port.container_port}"
            suffix = 0
            while name in used:  # a declared name that happens to read like ours
                suffix += 1
                name = f"{base}-{suffix}"
            used.add(name)
        built.append(
            {
                "name": name,
                "protocol": port.protocol,
                "port": port.container_port,
                "targetPort": port.container_port,
            }
        )
    return built


def build_service(
    spec: WorkloadSpec,
    pod: Mapping[str, object],
    *,
    expose: str,
    namespace: str,
    provider: str,
    annotations: Mapping[str, str],
) -> JSON | None:
    """The Service of our created ``pod`` (module docstring); None when nothing is to be
    exposed (``expose`` is not a Service mode, or no port is declared). Raises
    ``MalformedResponse`` for a pod answer without a name or uid."""
    service_type = SERVICE_TYPES.get(expose)
    ports = service_ports(spec)
    if service_type is None or not ports:
        return None
    owner = owner_reference(pod)
    name = str(owner["name"])
    metadata: JSON = {
        "name": name,
        "namespace": namespace,
        "labels": owner_labels(spec, provider=provider) | {LABEL_INSTANCE: name},
        "ownerReferences": [owner],
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": service_type,
            "selector": instance_selector(name, provider=provider),
            "ports": ports,
            "externalTrafficPolicy": "Cluster",
        },
    }
