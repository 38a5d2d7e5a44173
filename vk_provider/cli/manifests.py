"""The pod `vk-provider place` asks about: from a manifest file, or from the cluster.

A manifest may be YAML or JSON with one or several documents, and hold a Pod or a workload
with a pod template — Deployment, ReplicaSet, StatefulSet, DaemonSet, Job,
ReplicationController, or a CronJob's job template: what gets placed is the pod its
controller would create, with the template's labels and annotations. An existing pod is read
through the Kubernetes API with the caller's own kubeconfig (so with the caller's own rights),
never through the agent.

Invariants: errors are ``ManifestError`` with one line naming the file or the object; a
manifest must hold exactly one pod to place (a file of several says which it found).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from vk_provider.kube.client import ApiError, KubeClient
from vk_provider.settings.configfile import parse_yaml_all, read_text
from vk_provider.settings.secrets import ConfigError

JSON = dict[str, Any]
_TEMPLATED = {
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "ReplicationController",
}


class ManifestError(ValueError):
    """The manifest or the pod cannot be read; the message says which and why."""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def pod_of(document: Mapping[str, Any]) -> JSON | None:
    """The pod ``document`` is or would create (its template), or None if it is neither."""
    kind = document.get("kind")
    metadata = _mapping(document.get("metadata"))
    if kind == "Pod":
        return dict(document)
    spec = _mapping(document.get("spec"))
    if kind == "CronJob":
        spec = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
    elif kind not in _TEMPLATED:
        return None
    template = _mapping(spec.get("template"))
    if not template:
        return None
    template_meta = _mapping(template.get("metadata"))
    pod_meta: JSON = {
        "name": f"{metadata.get('name') or 'workload'}-template",
        "labels": dict(_mapping(template_meta.get("labels"))),
        "annotations": dict(_mapping(template_meta.get("annotations"))),
    }
    if metadata.get("namespace"):
        pod_meta["namespace"] = metadata["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": template.get("spec")}


def _documents(text: str, where: str) -> list[Any]:
    try:
        # JSON is YAML too; a manifest is bounded like a configuration file.
        found = [d for d in parse_yaml_all(text, name=where) if d is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{where} is not YAML or JSON ({exc})") from None
    items: list[Any] = []
    for document in found:
        if isinstance(document, Mapping) and document.get("kind") == "List":
            items.extend(document.get("items") or [])
        else:
            items.append(document)
    return items


def pod_from_manifest(text: str, *, where: str, namespace: str | None = None) -> JSON:
    """The one pod in a manifest's text; ``namespace`` (``-n``) overrides the manifest's."""
    pods = [p for d in _documents(text, where) if isinstance(d, Mapping) if (p := pod_of(d))]
    if not pods:
        raise ManifestError(f"{where} holds no Pod and no workload with a pod template")
    if len(pods) > 1:
        names = ", ".join(str(_mapping(p.get("metadata")).get("name")) for p in pods)
        raise ManifestError(f"{where} holds {len(pods)} pods to place ({names}); give one")
    pod = pods[0]
    if namespace:
        pod["metadata"] = {**_mapping(pod.get("metadata")), "namespace": namespace}
    return pod


def read_manifest(path: str, *, namespace: str | None = None) -> JSON:
    """The pod of the manifest file ``path`` (``-`` reads standard input)."""
    if path == "-":
        return pod_from_manifest(sys.stdin.read(), where="standard input", namespace=namespace)
    try:
        text = read_text(Path(path))
    except ConfigError as exc:
        raise ManifestError(str(exc)) from None
    return pod_from_manifest(text, where=path, namespace=namespace)


def default_kubeconfig(environ: Mapping[str, str] | None = None) -> Path | None:
    """As kubectl finds it: the first existing file of ``$KUBECONFIG``, else
    ``~/.kube/config``; None when there is neither (in-cluster configuration then)."""
    env = os.environ if environ is None else environ
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry and Path(entry).expanduser().is_file():
            return Path(entry).expanduser()
    home = Path(env.get("HOME") or Path.home()) / ".kube" / "config"
    return home if home.is_file() else None


def parse_reference(reference: str, *, namespace: str | None = None) -> tuple[str, str]:
    """``ns/name`` (or ``name`` with ``-n ns``, default ``default``) -> (namespace, name)."""
    head, sep, tail = reference.partition("/")
    if sep:
        if not head or not tail or "/" in tail:
            raise ManifestError(f"{reference!r} is not NAMESPACE/NAME")
        return head, tail
    if not reference:
        raise ManifestError("a pod name is required")
    return namespace or "default", reference


def fetch_pod(namespace: str, name: str, *, kubeconfig: Path | None) -> JSON:
    """The pod as the API serves it, read with the caller's kubeconfig."""

    async def read() -> JSON | None:
        kube = await KubeClient.connect(kubeconfig)
        try:
            return await kube.get_pod(namespace, name)
        finally:
            await kube.close()

    try:
        pod = asyncio.run(read())
    except ApiError as exc:
        raise ManifestError(f"cannot read pod {namespace}/{name}: {exc}") from None
    except Exception as exc:  # the kubeconfig, the connection: one line for the operator
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ManifestError(f"cannot read pod {namespace}/{name}: {reason}") from None
    if pod is None:
        raise ManifestError(f"pod {namespace}/{name} does not exist")
    return pod
