"""The Kubernetes adapter: pods of cluster A run as pods in a remote cluster B.

Cluster B is reached through its REST API with ``httpx``, through ``providers.http.JsonApi``
(the agent's own Kubernetes client, ``vk_provider.kube``, is for cluster A and is never used
here). The kubeconfig is loaded by kubernetes_asyncio's loader (``providers.kubernetes
.kubeconfig``); names and labels are in ``names``, offers in ``offers``, the manifests in
``manifests``, the state table in ``states``, the error table in ``failures``, logs in
``logs``.

Lifecycle. ``create`` writes the Secret of the workload's secret env values first (without
owner), then the pod, both in ``config.namespace``; then the Secret gets an ownerReference to
the pod's uid so B's garbage collector removes it with the pod. When the pod cannot be created
the Secret is deleted again; ``delete`` also deletes it by name (in case an agent died before
the ownerReference was set). A second create of the same request gets 409 AlreadyExists and
returns the existing pod once its annotations prove it was made for that request. Retries
live at the transport (``DEFAULT_RETRY``): each request is retried on ``Transient`` and short
``RateLimited``; every write is idempotent by name, so a POST whose answer was lost is answered
by 409 on the retry.

The namespace is the operator's. The adapter never creates it: creating a namespace needs a
cluster-wide right, and the rights *inside* a namespace that does not exist yet could only come
from a cluster-wide binding (pods and secrets of every namespace of B). So the operator creates
``config.namespace`` and binds the role below in it; a create into a missing namespace fails
with ``CapacityUnavailable`` naming the namespace and what to do (``failures.missing_namespace``):
the launcher blocks the offer and moves on, and the provider's circuit breaker stays closed, so
reads of the pods that do run go on.

Rights needed in B (what ``tests/contract/harness_kubernetes.py`` grants, and no more):
``list`` nodes and pods cluster-wide (offers), and in the namespace ``create/get/list/delete``
pods, ``get`` pods/log and ``create/patch/delete`` secrets
(``deploy/remote-cluster-rbac.yaml``).

Invariants:
- The kubeconfig, the token and the client key are never logged nor put into a message; the
  token and secret env values are redacted from every message built from a server answer.
- Only ``domain.errors`` escape the public methods (the constructor raises ``ConfigError``).
- Parsers, manifest builders and the offer planner are pure; the HTTP layer is
  ``providers.http``.

Known limits: ``delete`` with ``grace_seconds=0`` asks for 1 second, because 0 would remove the
object at once and leave the container to the node's next sync (as ``kubectl`` does);
``tls-server-name`` and proxy settings of a kubeconfig are ignored; offers assume one container
per pod and count requests, not usage.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping
from typing import Final

import httpx

from providers.http import Classify, ErrorAnswer, JsonApi
from providers.kubernetes.config import KubernetesProviderConfig
from providers.kubernetes.containers import JSON
from providers.kubernetes.failures import (
    ApiFailure,
    Call,
    api_failure,
    classify_failure,
    missing_namespace,
)
from providers.kubernetes.kubeconfig import build_transport, kubeconfig_base_dir, load_kubeconfig
from providers.kubernetes.logs import LineSplitter, container_name, log_params
from providers.kubernetes.manifests import build_pod, build_secret, owner_reference
from providers.kubernetes.names import LABEL_MANAGED_BY, is_pod_name, label_value, pod_name
from providers.kubernetes.offers import (
    OfferScope,
    Shape,
    gpus_in_use,
    node_capacities,
    plan_offers,
)
from providers.kubernetes.states import made_for, parse_instance
from providers.payload import MalformedResponse, items, mapping
from providers.transport import RetryPolicy
from vk_provider.domain.errors import (
    CapacityUnavailable,
    InvalidSpec,
    NotFound,
    ProviderError,
)
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    LogOptions,
    Offer,
    WorkloadSpec,
)
from vk_provider.domain.redact import Redactor

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "vk-provider"
# This adapter's limits: backoff from 0.25 s, doubling, up to 2 s (an API server answers fast).
DEFAULT_RETRY: Final = RetryPolicy(backoff_seconds=0.25, max_backoff_seconds=2.0)


class KubernetesProvider:
    """``domain.contract.Provider`` on a remote Kubernetes cluster (module docstring)."""

    def __init__(
        self,
        config: KubernetesProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """``transport`` is the test seam: when given it also carries the TLS settings (see
        ``build_transport``); credentials travel in headers either way. Raises
        ``ConfigError`` when the kubeconfig cannot be read or used."""
        self._config = config
        self._scope = OfferScope.from_config(config)
        self._namespace = config.namespace
        access = load_kubeconfig(
            config.kubeconfig.resolve(),
            base_dir=kubeconfig_base_dir(config),
            allow_insecure_loopback=config.allow_insecure_loopback,
        )
        self._api = JsonApi(
            provider=config.name,
            label="Kubernetes",
            classify=self._classify(Call.READ),
            redactor=Redactor(access.secrets),
            retry=retry or DEFAULT_RETRY,
            timeout=config.timeout_seconds,
            base_url=access.server,
            auth_headers=access.headers(),
            transport=transport or build_transport(access),
            logger=log,
        )

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=True)

    async def offers(self) -> list[Offer]:
        nodes = await self._get("/api/v1/nodes", what="list nodes", call=Call.READ)
        pods = await self._get(
            "/api/v1/pods",
            what="list pods",
            call=Call.READ,
            params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"},
        )
        with self._api.readable("offers"):
            capacities = node_capacities(nodes, pods, self._scope)
            used = gpus_in_use(pods, namespace=self._namespace, provider=self.name)
        return plan_offers(capacities, self._scope, gpus_used=used)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        shape = Shape.parse(offer.sku)
        if shape is None or offer.provider != self.name:
            raise CapacityUnavailable(
                f"offer {offer.key} is not an offer of this cluster", provider=self.name
            )
        self._check_fits(spec, shape, offer)
        name = pod_name(spec)
        secret = build_secret(spec, name=name, namespace=self._namespace, provider=self.name)
        try:
            body = build_pod(
                spec,
                shape,
                name=name,
                namespace=self._namespace,
                provider=self.name,
                offer=offer,
                fallback_region=self._scope.fallback_region,
                secret_name=name if secret is not None else None,
            )
        except InvalidSpec as exc:
            raise InvalidSpec(str(exc), provider=self.name, field=exc.field) from None
        redact = self._api.redactor.with_secrets(var.value for var in spec.env if var.secret)
        if secret is not None:
            await self._put_secret(secret, redact)
        try:
            pod = await self._create_pod(spec, body, redact)
            with self._api.readable(f"create pod {name}"):
                instance = parse_instance(pod, provider=self.name)
            if instance is None or not made_for(instance, spec):
                raise CapacityUnavailable(
                    f"pod {self._namespace}/{name} in the cluster was not made for "
                    f"{spec.request_id}",
                    provider=self.name,
                )
        except ProviderError:
            if secret is not None:
                await self._forget_secret(name, quietly=True)
            raise
        if secret is not None:
            await self._own_secret(secret, pod, redact)
        return instance

    async def get(self, instance_id: str) -> Instance:
        what = f"get pod {instance_id!r}"
        pod = await self._get(self._pod_path(instance_id), what=what, call=Call.READ)
        with self._api.readable(what):
            instance = parse_instance(pod, provider=self.name)
        if instance is None:
            raise NotFound(f"pod {instance_id!r} in the cluster is not ours", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        if not is_pod_name(instance_id):
            return  # no pod of ours can have that name: nothing to delete
        # 0 would remove the object at once and leave the container to the kubelet's next
        # sync; 1 lets B's kubelet stop it (as `kubectl delete --grace-period=0` does).
        grace = max(1, math.ceil(max(0.0, grace_seconds)))
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": grace,
            "propagationPolicy": "Background",
        }
        with contextlib.suppress(NotFound):
            await self._send(
                "DELETE",
                self._pod_path(instance_id),
                what=f"delete pod {instance_id}",
                call=Call.WRITE,
                json_body=options,
            )
            log.info(
                "provider %s: deleting pod %s/%s (grace %ds)",
                self.name,
                self._namespace,
                instance_id,
                grace,
            )
        # Normally B's garbage collector removes the Secret with its pod; this covers an
        # agent that died before the Secret got its ownerReference. Quietly: the pod's
        # deletion is what was asked for, and it succeeded.
        await self._forget_secret(instance_id, quietly=True)

    async def list_ours(self) -> list[Instance]:
        what = "list our pods"
        body = await self._get(
            f"/api/v1/namespaces/{self._namespace}/pods",
            what=what,
            call=Call.READ,
            params={"labelSelector": f"{LABEL_MANAGED_BY}={label_value(self.name)}"},
        )
        found: list[Instance] = []
        with self._api.readable(what):
            for pod in items(body, what):
                try:
                    instance = parse_instance(pod, provider=self.name)
                except MalformedResponse as exc:
                    log.warning("provider %s: skipping an unreadable pod: %s", self.name, exc)
                    continue
                if instance is not None:
                    found.append(instance)
        return found

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        what = f"logs of pod {instance_id!r}"
        pod = await self._get(self._pod_path(instance_id), what=what, call=Call.LOGS)
        with self._api.readable(what):
            if parse_instance(pod, provider=self.name) is None:
                raise NotFound(
                    f"pod {instance_id!r} in the cluster is not ours", provider=self.name
                )
            container = container_name(pod)
        response = await self._api.retrying(
            lambda: self._api.send(
                "GET",
                f"{self._pod_path(instance_id)}/log",
                what=what,
                params=log_params(container, options),
                headers={"Accept": "*/*"},
                classify=self._classify(Call.LOGS),
                stream=True,
                follow=options.follow,
            )
        )
        splitter = LineSplitter()
        try:
            with self._api.reading(what):
                async for data in response.aiter_bytes():
                    for line in splitter.feed(data):
                        yield line
            rest = splitter.flush(terminate=options.limit_bytes is None)
            if rest:
                yield rest
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._api.aclose()

    # --- internals ------------------------------------------------------------------------

    def _check_fits(self, spec: WorkloadSpec, shape: Shape, offer: Offer) -> None:
        too_small = (
            spec.gpu_count > shape.gpus
            or spec.cpu > shape.vcpus + 1e-9
            or spec.memory_bytes > shape.memory_gib * 2**30
        )
        if too_small:
            raise CapacityUnavailable(
                f"offer {offer.key} is smaller than the workload of {spec.request_id}",
                provider=self.name,
            )

    def _pod_path(self, name: str) -> str:
        if not is_pod_name(name):
            raise NotFound(f"no pod of ours is called {name!r}", provider=self.name)
        return f"/api/v1/namespaces/{self._namespace}/pods/{name}"

    def _secret_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self._namespace}/secrets/{name}"

    async def _create_pod(self, spec: WorkloadSpec, body: JSON, redact: Redactor) -> JSON:
        """POST the pod; an existing pod of that name is returned (the caller checks it was
        made for this request)."""
        name = str(pod_name(spec))
        what = f"create pod {self._namespace}/{name}"
        response = await self._create_object("pods", body, what=what, redact=redact)
        if response.status_code == 409:
            existing = await self._get(self._pod_path(name), what=what, call=Call.READ)
            log.info("provider %s: pod %s exists already; reusing it", self.name, name)
            if not isinstance(existing, dict):
                raise self._api.malformed(what, "the pod is not a JSON object")
            return existing
        created = self._api.decode(response, what)
        if not isinstance(created, dict):
            raise self._api.malformed(what, "the pod is not a JSON object")
        log.info(
            "provider %s: created pod %s/%s for %s",
            self.name,
            self._namespace,
            name,
            spec.request_id,
        )
        return created

    async def _put_secret(self, secret: JSON, redact: Redactor) -> None:
        """Create the Secret, or bring an existing one (an earlier try) up to date."""
        name = str(mapping(secret.get("metadata"), "secret")["name"])
        what = f"create secret {self._namespace}/{name}"
        response = await self._create_object("secrets", secret, what=what, redact=redact)
        if response.status_code == 409:
            await self._send(
                "PATCH",
                self._secret_path(name),
                what=f"update secret {self._namespace}/{name}",
                call=Call.WRITE,
                json_body={"data": secret["data"]},
                merge_patch=True,
                redact=redact,
            )

    async def _own_secret(self, secret: JSON, pod: JSON, redact: Redactor) -> None:
        """Make the pod the Secret's owner, so B deletes the Secret with the pod."""
        name = str(mapping(secret.get("metadata"), "secret")["name"])
        what = f"set the owner of secret {self._namespace}/{name}"
        with self._api.readable(what):
            owner = owner_reference(pod)
        patch = {"metadata": {"ownerReferences": [owner]}}
        try:
            await self._send(
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

    async def _forget_secret(self, name: str, *, quietly: bool = False) -> None:
        """Delete the Secret of pod ``name`` if there is one; ``quietly`` logs a failure
        instead of raising it (cleanup after another error, which matters more)."""
        try:
            await self._send(
                "DELETE",
                self._secret_path(name),
                what=f"delete secret {self._namespace}/{name}",
                call=Call.WRITE,
            )
        except NotFound:
            return
        except ProviderError as exc:
            if not quietly:
                raise
            log.warning("provider %s: secret %s not cleaned up: %s", self.name, name, exc)

    async def _create_object(
        self, collection: str, body: JSON, *, what: str, redact: Redactor
    ) -> httpx.Response:
        """POST into the namespace; 409 is returned, not raised. A missing namespace is the
        operator's to create (``missing_namespace``): this adapter never creates one."""
        response = await self._send(
            "POST",
            f"/api/v1/namespaces/{self._namespace}/{collection}",
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
            raise missing_namespace(self._namespace, provider=self.name, what=what)
        raise self._classify(Call.WRITE)(answer)

    def _classify(self, call: Call) -> Classify:
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
            return classify_failure(redacted, provider=self.name, what=answer.what, call=call)

        return classify

    async def _get(
        self, path: str, *, what: str, call: Call, params: Mapping[str, str] | None = None
    ) -> object:
        """The JSON of a GET (retried), its failures classified as ``call``'s."""
        return await self._api.json(
            "GET", path, what=what, params=params, classify=self._classify(call)
        )

    async def _send(
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
        return await self._api.request(
            method,
            path,
            what=what,
            params=query,
            json_body=json_body,
            content_type="application/merge-patch+json" if merge_patch else "application/json",
            accept=accept,
            classify=self._classify(call),
            redact=redact,
        )
