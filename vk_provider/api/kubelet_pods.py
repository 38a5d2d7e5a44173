"""The kubelet API's ``/pods`` and ``/runningpods/``: what is bound here, and what runs.

``/pods`` is a v1 ``PodList`` of the pods bound to this node, as the API server serves them
(kubelet answers from its pod manager; we from the agent's pod store). ``/runningpods/`` is
what the runtime says runs: kubelet builds minimal pods from its containers (name, namespace,
uid and each container's name and image, ``kubecontainer.Pod.ToAPIPod``); we build them from
the instances the providers list.

Invariants: pure rendering here; the sources are injected (:class:`NodePods`); items carry
no ``kind``/``apiVersion`` (list items do not, as the API server encodes lists); order is
stable (namespace, then name).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunningPod:
    namespace: str
    name: str
    uid: str
    containers: tuple[tuple[str, str], ...]  # (name, image) of each running container


class NodePods(Protocol):
    def bound_pods(self) -> list[JSON]:
        """The pod objects bound to this node (the latest the agent has)."""
        ...

    def running_pods(self) -> list[RunningPod]:
        """The pods whose instances the providers report as running."""
        ...


def pod_list(items: Iterable[JSON]) -> JSON:
    def order(item: JSON) -> tuple[str, str]:
        metadata = item.get("metadata") or {}
        return str(metadata.get("namespace", "")), str(metadata.get("name", ""))

    return {
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": sorted(items, key=order),
    }


def bound_pod_item(pod: JSON) -> JSON:
    return {key: value for key, value in pod.items() if key not in ("kind", "apiVersion")}


def running_pod_item(pod: RunningPod) -> JSON:
    return {
        "metadata": {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "creationTimestamp": None,
        },
        "spec": {
            "containers": [
                {"name": name, "image": image, "resources": {}} for name, image in pod.containers
            ]
        },
        "status": {},
    }


_SOURCE = web.AppKey("kubelet_node_pods", NodePods)


def add_pod_routes(app: web.Application, source: NodePods) -> None:
    app[_SOURCE] = source
    app.router.add_get("/pods", _pods, allow_head=False)
    app.router.add_get("/runningpods/", _running_pods, allow_head=False)
    app.router.add_get("/runningpods", _running_pods, allow_head=False)


def _json(document: JSON) -> web.Response:
    return web.Response(text=json.dumps(document), content_type="application/json")


async def _pods(request: web.Request) -> web.StreamResponse:
    pods = request.app[_SOURCE].bound_pods()
    return _json(pod_list(bound_pod_item(pod) for pod in pods))


async def _running_pods(request: web.Request) -> web.StreamResponse:
    pods = request.app[_SOURCE].running_pods()
    return _json(pod_list(running_pod_item(pod) for pod in pods))
