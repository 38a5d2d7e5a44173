"""Cluster B's REST API as the Kubernetes adapter uses it: one namespace's pods, Secrets and
Services.

Every request goes through ``vk_provider_adapters.http.JsonApi`` (retries on ``Transient`` and short
``RateLimited``, redaction, decoding) and every failure is classified once, by
``failures.classify_failure``, as the failure of a read, a write or a logs call. Writes name
the adapter as their field manager.

The writes of a launch: ``put_secret`` (create, or bring an earlier try's Secret up to date),
``create_pod`` (an existing pod of that name is returned; the caller checks it was made for
the request), ``own_secret`` (the pod becomes the Secret's owner, so B's garbage collector
deletes the Secret with the pod), ``forget_secret``, and with ``expose: node-port`` or
``load-balancer`` ``put_service`` (create, owned by the pod from the start, or bring an
earlier try's Service up to date: its owner, selector, ports and type), and the reads
``service`` (one by name) and ``get`` (their list). Services are never deleted here: B's
garbage collector removes each with its pod, after the pod has stopped serving, so a
terminating pod keeps its traffic until it is gone. A write into a namespace that does not
exist is ``failures.missing_namespace``: this adapter never creates a namespace.

Invariants: only ``domain.errors`` escape; every write is idempotent by name, so a POST whose
answer was lost is answered by 409 on the retry; secret values are redacted from every
message (``redact``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final

import httpx

from vk_provider.sdk import NotFound, ProviderError, Redactor, Transient
from vk_provider_adapters.http import Classify, ErrorAnswer, JsonApi
from vk_provider_adapters.kubernetes.failures import (
    ApiFailure,
    Call,
    api_failure,
    classify_failure,
    missing_namespace,
)
from vk_provider_adapters.kubernetes.manifests import owner_reference
from vk_provider_adapters.kubernetes.names import is_pod_name
from vk_provider_adapters.payload import mapping

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "vk-provider"
JSON = dict[str, object]


def classifier(call: Call, *, provider: str) -> Classify:
    """How ``JsonApi`` turns a failed answer of ``call`` into a ``domain.errors`` value."""

    def classify(answer: ErrorAnswer) -> ProviderError:
        failure = api_failure(answer)
        redacted = ApiFailure(
            failure.status,
            reason=failure.reason,
            message=answer.redact(failure.message),
            kind=failure.kind,
            fields=failure.fields,
            retry_after=failure.retry_after,
        )
        return classify_failure(redacted, provider=provider, what=answer.what, call=call)

    return classify


class RemoteNamespace:
    """The pods and Secrets of one namespace of B, through ``api`` (module docstring)."""

    def __init__(self, api: JsonApi, *, namespace: str, provider: str) -> None:
        self.api = api
        self.namespace = namespace
        self._provider = provider

    def pod_path(self, name: str) -> str:
        if not is_pod_name(name):
            raise NotFound(f"no pod of ours is called {name!r}", provider=self._provider)
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    def _secret_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets/{name}"

    def _service_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{name}"

    def classify(self, call: Call) -> Classify:
        return classifier(call, provider=self._provider)

    async def get(
        self, path: str, *, what: str, call: Call, params: Mapping[str, str] | None = None
    ) -> object:
        """The JSON of a GET (retried), its failures classified as ``call``'s."""
        return await self.api.json(
            "GET", path, what=what, params=params, classify=self.classify(call)
        )

    async def send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        call: Call,
        params: Mapping[str, str] | None = None,
        json_body: Mapping[str, object] | None = None,
        merge_patch: bool = False,
        accept: frozenset[int] = frozenset(),
        redact: Redactor | None = None,
    ) -> httpx.Response:
        """One request, retried by the ``RetryPolicy``; statuses in ``accept`` are returned,
        other failures raised classified. Writes name this adapter as their field manager."""
        query = dict(params or {})
        if method in ("POST", "PATCH", "PUT"):
            query["fieldManager"] = FIELD_MANAGER
        return await self.api.request(
            method,
            path,
            what=what,
            params=query,
            json_body=json_body,
            content_type="application/merge-patch+json" if merge_patch else "application/json",
            accept=accept,
            classify=self.classify(call),
            redact=redact,
        )

    async def create_pod(self, name: str, body: JSON, redact: Redactor) -> JSON:
        """POST the pod; an existing pod of that name is returned (the caller checks it was
        made for this request)."""
        what = f"create pod {self.namespace}/{name}"
        response = await self._create_object("pods", body, what=what, redact=redact)
        if response.status_code == 409:
            existing = await self.get(self.pod_path(name), what=what, call=Call.READ)
            log.info("provider %s: pod %s exists already; reusing it", self._provider, name)
            if not isinstance(existing, dict):
                raise self.api.malformed(what, "the pod is not a JSON object")
            return existing
        created = self.api.decode(response, what)
        if not isinstance(created, dict):
            raise self.api.malformed(what, "the pod is not a JSON object")
        log.info("provider %s: created pod %s/%s", self._provider, self.namespace, name)
        return created

    async def put_secret(self, secret: JSON, redact: Redactor) -> None:
        """Create the Secret, or bring an existing one (an earlier try) up to date."""
        name = str(mapping(secret.get("metadata"), "secret")["name"])
        what = f"create secret {self.namespace}/{name}"
        response = await self._create_object("secrets", secret, what=what, redact=redact)
        if response.status_code == 409:
            await self.send(
                "PATCH",
                self._secret_path(name),
                what=f"update secret {self.namespace}/{name}",
                call=Call.WRITE,
                json_body={"data": secret["data"]},
                merge_patch=True,
                redact=redact,
            )

    async def own_secret(self, secret: JSON, pod: JSON, redact: Redactor) -> None:
        """Make the pod the Secret's owner, so B deletes the Secret with the pod."""
        name = str(mapping(secret.get("metadata"), "secret")["name"])
        what = f"set the owner of secret {self.namespace}/{name}"
        with self.api.readable(what):
            owner = owner_reference(pod)
        patch = {"metadata": {"ownerReferences": [owner]}}
        try:
            await self.send(
                "PATCH",
                self._secret_path(name),
                what=what,
                call=Call.WRITE,
                json_body=patch,
                merge_patch=True,
                redact=redact,
            )
        except NotFound:
            # Gone meanwhile (a concurrent delete): make it again, owned from the start.
            owned = {
                **secret,
                "metadata": {**mapping(secret["metadata"], "secret"), **patch["metadata"]},
            }
            await self._create_object("secrets", owned, what=what, redact=redact)

    async def put_service(self, service: JSON) -> JSON:
        """Create the pod's Service, or bring an existing one of that name (an earlier try
        of this launch, or a Service an earlier pod of this name left for B's garbage
        collector) up to date: owned by this pod, with this selector, ports and type. A merge
        patch replaces ``ports`` and ``ownerReferences`` whole, as lists are; the selector's
        other keys are read first and removed."""
        metadata = mapping(service.get("metadata"), "service")
        name = str(metadata["name"])
        what = f"create service {self.namespace}/{name}"
        response = await self._create_object(
            "services", service, what=what, redact=self.api.redactor
        )
        if response.status_code != 409:
            log.info("provider %s: created service %s/%s", self._provider, self.namespace, name)
            return self._service_of(response, what)
        what = f"update service {self.namespace}/{name}"
        existing = await self.service(name)
        if existing is None:
            raise Transient(
                f"Kubernetes {what}: it was deleted meanwhile (by B's garbage collector)",
                provider=self._provider,
            )
        spec = mapping(service.get("spec"), "service spec")
        with self.api.readable(what):
            had = mapping(mapping(existing.get("spec"), "spec").get("selector"), "selector")
        # A merge patch merges maps: null removes the keys that are not ours, or the Service
        # could select nothing.
        selector = {key: None for key in had} | dict(mapping(spec.get("selector"), "selector"))
        patch = {
            "metadata": {k: v for k, v in metadata.items() if k not in ("name", "namespace")},
            "spec": {**spec, "selector": selector},
        }
        response = await self.send(
            "PATCH",
            self._service_path(name),
            what=what,
            call=Call.WRITE,
            json_body=patch,
            merge_patch=True,
        )
        return self._service_of(response, what)

    def _service_of(self, response: httpx.Response, what: str) -> JSON:
        body = self.api.decode(response, what)
        if not isinstance(body, dict):
            raise self.api.malformed(what, "the service is not a JSON object")
        return body

    async def service(self, name: str) -> JSON | None:
        """Our pod ``name``'s Service; None when it has none."""
        what = f"get service {self.namespace}/{name}"
        try:
            body = await self.get(self._service_path(name), what=what, call=Call.READ)
        except NotFound:
            return None
        if not isinstance(body, dict):
            raise self.api.malformed(what, "the service is not a JSON object")
        return body

    async def forget_secret(self, name: str, *, quietly: bool = False) -> None:
        """Delete the Secret of pod ``name`` if there is one; ``quietly`` logs a failure
        instead of raising it (cleanup after another error, which matters more)."""
        try:
            await self.send(
                "DELETE",
                self._secret_path(name),
                what=f"delete secret {self.namespace}/{name}",
                call=Call.WRITE,
            )
        except NotFound:
            return
        except ProviderError as exc:
            if not quietly:
                raise
            log.warning("provider %s: secret %s not cleaned up: %s", self._provider, name, exc)

    async def _create_object(
        self, collection: str, body: JSON, *, what: str, redact: Redactor
    ) -> httpx.Response:
        """POST into the namespace; 409 is returned, not raised. A missing namespace is the
        operator's to create (``missing_namespace``): this adapter never creates one."""
        response = await self.send(
            "POST",
            f"/api/v1/namespaces/{self.namespace}/{collection}",
            what=what,
            call=Call.WRITE,
            json_body=body,
            accept=frozenset({404, 409}),
            redact=redact,
        )
        if response.status_code != 404:
            return response
        answer = ErrorAnswer(what, 404, response.content, response.headers, redact)
        if api_failure(answer).kind == "namespaces":
            raise missing_namespace(self.namespace, provider=self._provider, what=what)
        raise self.classify(Call.WRITE)(answer)
