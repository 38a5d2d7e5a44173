"""The benchmarks' own Kubernetes client: raw HTTP to the local API server, as the admin.

Deliberately not the agent's client (``vk_provider.kube``): the raw-client baseline and the
driver must cost what a minimal client costs, and must not share anything the agent does.
One ``httpx.AsyncClient`` (one TLS context, ``trust_env=False``: no proxy or netrc lookup per
request), pooled connections.

Also here: the API server's ``apiserver_request_total`` counters, read from ``/metrics``,
so a run can say how many calls of each verb it cost.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the API server is and the admin's credentials (from ``LocalCluster``)."""

    server: str
    ca: Path
    cert: Path
    key: Path

    def client(self, *, connections: int = 32) -> httpx.AsyncClient:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        return httpx.AsyncClient(
            base_url=self.server,
            verify=context,
            trust_env=False,
            timeout=httpx.Timeout(60.0),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )

    def args(self) -> list[str]:
        return [
            "--server",
            self.server,
            "--ca",
            str(self.ca),
            "--cert",
            str(self.cert),
            "--key",
            str(self.key),
        ]


async def check(response: httpx.Response) -> JSON:
    if response.status_code >= 400:
        raise RuntimeError(
            f"{response.request.method} {response.request.url.path}: "
            f"HTTP {response.status_code} {response.text[:300]}"
        )
    body: JSON = response.json()
    return body


async def watch_pods(
    client: httpx.AsyncClient, node: str, *, resource_version: str = ""
) -> AsyncIterator[tuple[str, JSON]]:
    """(type, pod) of every watch event of the pods bound to ``node``, for ever."""
    version = resource_version
    while True:
        if not version:
            listed = await check(
                await client.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={node}"})
            )
            version = listed["metadata"]["resourceVersion"]
            for pod in listed.get("items") or []:
                yield "ADDED", pod
        params = {
            "fieldSelector": f"spec.nodeName={node}",
            "watch": "true",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "300",
        }
        async with client.stream("GET", "/api/v1/pods", params=params, timeout=None) as stream:
            async for line in stream.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event["type"], event["object"]
                if kind == "ERROR":
                    version = ""  # expired: list again
                    break
                version = obj["metadata"].get("resourceVersion", version)
                if kind != "BOOKMARK":
                    yield kind, obj


_REQUEST = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


async def request_counts(client: httpx.AsyncClient) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` summed by (verb, resource, subresource)."""
    response = await client.get("/metrics")
    response.raise_for_status()
    counts: dict[tuple[str, str, str], float] = {}
    for line in response.text.splitlines():
        found = _REQUEST.match(line)
        if not found:
            continue
        labels = dict(_LABEL.findall(found["labels"]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        counts[key] = counts.get(key, 0.0) + float(found["value"])
    return counts


def diff(
    after: dict[tuple[str, str, str], float], before: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0) > 0}


def pod_manifest(name: str, node: str, *, command: list[str], labels: dict[str, str]) -> JSON:
    """A one-container pod bound to ``node`` at creation (``spec.nodeName``: no scheduler)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "app", "image": "bench", "command": command}],
        },
    }


def node_manifest(name: str) -> JSON:
    """A Node object for the raw baseline (so the pod GC does not collect its pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"type": "bench-raw"}},
        "spec": {"taints": [{"key": "bench", "value": "raw", "effect": "NoSchedule"}]},
    }
