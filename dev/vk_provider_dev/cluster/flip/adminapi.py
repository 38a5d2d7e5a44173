"""A small synchronous admin client for a ``LocalCluster``: set-up and tear-down of test objects.

The flip's helpers create and delete a few objects (KWOK's nodes) and read a few back; they
run from test fixtures and the demo, outside any event loop, so this is plain ``httpx`` with
the cluster's admin client certificate, as ``LocalCluster.create_object`` does. The agent's
own Kubernetes client (``vk_provider.kube``) is not used here on purpose: it is asynchronous
and shaped for the agent.

Invariants: paths are API paths (``/api/v1/nodes``); a missing object reads as None and
deletes as "already gone"; any other non-2xx status raises ``ClusterError`` with the body.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self

import httpx
import yaml

from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.errors import ClusterError

JSON = dict[str, Any]


def server_of(kubeconfig_text: str) -> str:
    """The API server URL of a kubeconfig's current context."""
    document = yaml.safe_load(kubeconfig_text)
    current = document["current-context"]
    context = next(c["context"] for c in document["contexts"] if c["name"] == current)
    cluster = next(c["cluster"] for c in document["clusters"] if c["name"] == context["cluster"])
    return str(cluster["server"])


class AdminApi:
    """Admin access to one local cluster's API server (module docstring)."""

    def __init__(self, cluster: LocalCluster, *, timeout: float = 10.0) -> None:
        context = ssl.create_default_context(cafile=str(cluster.pki.ca.cert))
        context.load_cert_chain(str(cluster.pki.admin.cert), str(cluster.pki.admin.key))
        self.server = server_of(cluster.kubeconfig.read_text())
        self._client = httpx.Client(base_url=self.server, verify=context, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

    @staticmethod
    def _fail(action: str, path: str, response: httpx.Response) -> ClusterError:
        return ClusterError(
            f"{action} {path} failed: HTTP {response.status_code} {response.text[:400]}"
        )

    def get(self, path: str) -> JSON | None:
        response = self._client.get(path)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise self._fail("GET", path, response)
        body: JSON = response.json()
        return body

    def items(self, path: str, **params: str) -> list[JSON]:
        """The ``items`` of a list (``labelSelector=...``, ``fieldSelector=...`` as params)."""
        response = self._client.get(path, params=params)
        if response.status_code != 200:
            raise self._fail("LIST", path, response)
        items: list[JSON] = response.json().get("items") or []
        return items

    def create(self, path: str, body: Mapping[str, Any], *, exist_ok: bool = False) -> JSON:
        """POST ``body`` to the collection ``path``; with ``exist_ok`` a 409 returns the
        existing object."""
        response = self._client.post(path, json=dict(body))
        if response.status_code == 409 and exist_ok:
            name = body["metadata"]["name"]
            existing = self.get(f"{path}/{name}")
            if existing is not None:
                return existing
        if response.status_code not in (200, 201):
            raise self._fail("POST", path, response)
        created: JSON = response.json()
        return created

    def patch(self, path: str, patch: Mapping[str, Any]) -> JSON:
        """A JSON merge patch (RFC 7386: lists are replaced whole, ``None`` removes a key)."""
        response = self._client.patch(
            path,
            content=json.dumps(dict(patch)),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if response.status_code != 200:
            raise self._fail("PATCH", path, response)
        patched: JSON = response.json()
        return patched

    def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str) -> JSON:
        """Server-side apply of ``body`` at ``path`` (the object's own URL), taking over
        fields another manager set (``force``): objects too large for client-side apply's
        last-applied annotation (CRDs) go in whole."""
        response = self._client.patch(
            path,
            params={"fieldManager": field_manager, "force": "true"},
            content=json.dumps(dict(body)),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        if response.status_code not in (200, 201):
            raise self._fail("APPLY", path, response)
        applied: JSON = response.json()
        return applied

    def wait(self, path: str, done: Callable[[JSON], bool], *, timeout: float, what: str) -> JSON:
        """The object at ``path`` once ``done`` holds for it; ClusterError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.get(path)
            if found is not None and done(found):
                return found
            if time.monotonic() > deadline:
                raise ClusterError(f"not within {timeout:.0f}s: {what}")
            time.sleep(0.2)

    def delete(self, path: str, *, grace_seconds: int | None = None) -> bool:
        """DELETE ``path``; False when it was already gone."""
        params = {} if grace_seconds is None else {"gracePeriodSeconds": str(grace_seconds)}
        response = self._client.delete(path, params=params)
        if response.status_code == 404:
            return False
        if response.status_code not in (200, 202):
            raise self._fail("DELETE", path, response)
        return True
