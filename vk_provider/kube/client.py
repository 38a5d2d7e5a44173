"""The one place that talks to the Kubernetes API (kubernetes_asyncio is imported nowhere else).

Objects cross this boundary as plain JSON dicts, exactly as the API serves them (camelCase),
so the decision code above it stays pure and testable without a client.

Invariants:
- Every call has a client-side timeout; a watch also has a server-side timeout, so a stuck
  connection cannot hang a controller.
- API errors are translated once, here: 404 → ``None`` / ``NotFoundError``, 409 →
  ``ConflictError``, 410 → ``GoneError``; anything else stays an ``ApiError``.
- Writes to the node, pods, Events and the node Lease pass ``may_write`` first (leader
  election: a replica that does not lead writes none of them).
- Pod status is written through the ``/status`` subresource with a JSON merge patch (lists are
  replaced whole, so a container state never keeps a stale ``waiting`` next to ``running``).
- No per-request work beyond the request: one TLS context and connection pool for the
  client's life, and the environment's proxy settings resolved once, at connect, as
  client-go does — not a ``~/.netrc`` read and a proxy lookup (each a hop to a thread) per
  request, which is what aiohttp's ``trust_env`` costs.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

JSON = dict[str, Any]
_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_TIMEOUT = 30.0
LEASE_NAMESPACE = "kube-node-lease"


class ApiError(RuntimeError):
    """The API server refused or failed a call."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ForbiddenError(ApiError):
    """RBAC (or the Node authorizer) refused the call."""


class NotFoundError(ApiError):
    pass


class ConflictError(ApiError):
    pass


class GoneError(ApiError):
    """The resource version is too old (watch expired): re-list."""


def _translate(exc: ApiException) -> ApiError:
    return _error(int(exc.status or 0), exc.reason or "", exc.body)


def _error(status: int, reason: str, body: str | bytes | None) -> ApiError:
    message = reason
    if body:
        try:
            message = json.loads(body).get("message", message)
        except (ValueError, AttributeError):
            message = str(body)[:500]
    kind: type[ApiError] = {
        403: ForbiddenError,
        404: NotFoundError,
        409: ConflictError,
        410: GoneError,
    }.get(status, ApiError)
    return kind(status, message)


async def _json(call: Awaitable[Any]) -> JSON:
    """Await an API call made with ``_preload_content=False`` and return its JSON body."""
    try:
        response = await call
    except ApiException as exc:
        raise _translate(exc) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        # Connection refused, reset, timed out (an API server restarting): one error type.
        raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
    try:
        if response.status >= 400:
            # Unparsed responses do not raise: the status must be checked here.
            raise _error(response.status, str(response.reason or ""), await response.read())
        body: JSON = await response.json(content_type=None)
    finally:
        response.release()
    return body


async def _watch_events(call: Awaitable[Any]) -> AsyncIterator[tuple[str, JSON]]:
    """The (type, object) events of a watch request made with ``_preload_content=False``,
    until the server ends it; an ``ERROR`` event raises (``GoneError`` for 410)."""
    try:
        response = await call
    except ApiException as exc:
        raise _translate(exc) from exc
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
    if response.status >= 400:
        body = await response.read()
        response.release()
        raise _error(response.status, str(response.reason or ""), body)
    try:
        async for line in response.content:
            if not line.strip():
                continue
            event = json.loads(line)
            kind = str(event.get("type", ""))
            obj = event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(int(obj.get("code", 0)), str(obj.get("message", "")))
            yield kind, obj
    except ApiError as exc:
        raise (GoneError(exc.status, str(exc)) if exc.status == 410 else exc) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(0, f"watch broken: {type(exc).__name__}: {exc}") from exc
    finally:
        response.release()


def _resolve_environment_once(api: ApiClient) -> None:
    """Use the proxy the environment names for the API server (if any) for every request,
    and stop aiohttp from looking the environment and ``~/.netrc`` up again per request."""
    rest: Any = api.rest_client
    configuration: Any = api.configuration
    if not rest.proxy:
        host = urllib.parse.urlsplit(str(configuration.host)).hostname or ""
        proxies = urllib.request.getproxies()
        proxy = proxies.get("https") or proxies.get("all")
        if proxy and host and not urllib.request.proxy_bypass(host):
            rest.proxy = proxy
    session: aiohttp.ClientSession = rest.pool_manager
    # aiohttp has no setter; the session is ours alone and has made no request yet.
    session._trust_env = False


class KubeClient:
    """Typed, dict-in dict-out access to the few API calls the agent makes."""

    def __init__(self, api: ApiClient) -> None:
        self._bind(api)
        # Whether this replica may write the node, its pods, Events and the node Lease now
        # (leader election sets it; the election's own Lease writes pass ``fenced=False``).
        self.may_write: Callable[[], bool] = lambda: True

    def _bind(self, api: ApiClient) -> None:
        self._api = api
        _resolve_environment_once(api)
        # Typed as Any on purpose: we send and receive raw JSON (dict bodies, forced content
        # types, unparsed responses), which the generated signatures do not describe.
        self.core: Any = client.CoreV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.authentication: Any = client.AuthenticationV1Api(api)
        self.authorization: Any = client.AuthorizationV1Api(api)
        self.certificates: Any = client.CertificatesV1Api(api)

    def with_client_certificate(self, cert_file: Path, key_file: Path) -> ApiClient:
        """A new API connection to the same server (same CA) that authenticates with this
        client certificate only: none of this client's tokens or other credentials."""
        current = self._api.configuration
        fresh = client.Configuration()
        fresh.host = current.host
        fresh.ssl_ca_cert = current.ssl_ca_cert
        fresh.verify_ssl = current.verify_ssl
        fresh.tls_server_name = getattr(current, "tls_server_name", None)
        fresh.cert_file = str(cert_file)
        fresh.key_file = str(key_file)
        return ApiClient(configuration=fresh)

    def rebind(self, api: ApiClient) -> ApiClient:
        """Send new calls through ``api`` (a renewed certificate); the previous connection is
        returned for the caller to close once calls already under way on it have ended."""
        previous = self._api
        self._bind(api)
        return previous

    def _fence(self, what: str) -> None:
        if not self.may_write():
            raise ApiError(0, f"not the leader: refusing to {what}")

    @classmethod
    async def connect(cls, kubeconfig: Path | None = None) -> KubeClient:
        """Client from a kubeconfig file, or in-cluster configuration when none is given."""
        if kubeconfig is not None:
            api = await config.new_client_from_config(config_file=str(kubeconfig))
            return cls(api)
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except ConfigException as exc:
            raise ApiError(0, f"no kubeconfig given and not running in a cluster: {exc}") from exc
        return cls(ApiClient())

    async def close(self) -> None:
        await self._api.close()

    @property
    def server(self) -> str:
        return str(self._api.configuration.host)

    # ------------------------------------------------------------------ pods

    async def get_pod(self, namespace: str, name: str) -> JSON | None:
        try:
            return await _json(
                self.core.read_namespaced_pod(
                    name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except NotFoundError:
            return None

    async def list_pods(self, *, namespace: str, label_selector: str = "") -> list[JSON]:
        """The pods of ``namespace`` matching ``label_selector`` (every one when empty)."""
        body = await _json(
            self.core.list_namespaced_pod(
                namespace,
                label_selector=label_selector,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )
        return list(body.get("items") or [])

    async def list_node_pods(self, node_name: str) -> tuple[list[JSON], str]:
        """All pods bound to ``node_name`` and the list's resourceVersion."""
        body = await _json(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node_name}",
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    async def watch_node_pods(
        self, node_name: str, resource_version: str, *, timeout_seconds: int = 60
    ) -> AsyncIterator[tuple[str, JSON]]:
        """Watch events (type, pod) from ``resource_version`` until the server ends the watch.

        Raises ``GoneError`` when the version is too old; the caller re-lists.
        """
        call = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node_name}",
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            watch=True,
            timeout_seconds=timeout_seconds,
            _preload_content=False,
            # Client-side bound a little above the server's, so a dead connection ends too.
            _request_timeout=timeout_seconds + 15,
        )
        async for event in _watch_events(call):
            yield event

    async def list_objects(
        self, path: str, *, query: Mapping[str, str] | None = None
    ) -> tuple[list[JSON], str]:
        """The items of the collection at ``path`` and the list's resourceVersion (for the
        objects no typed call covers: Services, EndpointSlices)."""
        body = await self.request("GET", path, query=query)
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return list(body.get("items") or []), version

    async def watch_objects(
        self,
        path: str,
        resource_version: str,
        *,
        query: Mapping[str, str] | None = None,
        timeout_seconds: int = 60,
    ) -> AsyncIterator[tuple[str, JSON]]:
        """Watch events (type, object) of the collection at ``path`` from
        ``resource_version``, as ``watch_node_pods``; ``GoneError`` when it is too old."""
        params = [
            *(query or {}).items(),
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_seconds)),
        ]
        call = self._api.call_api(
            path,
            "GET",
            query_params=params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
            _preload_content=False,
            _request_timeout=timeout_seconds + 15,
        )
        async for event in _watch_events(call):
            yield event

    async def patch_pod_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        metadata: Mapping[str, Any] | None = None,
    ) -> JSON:
        """Merge-patch the pod's status; ``metadata`` (annotations, labels, a ``uid``
        precondition) goes in the same request: the status subresource keeps a pod's spec
        but takes its labels and annotations, so placing a pod is one write."""
        self._fence(f"write the status of pod {namespace}/{name}")
        body: dict[str, Any] = {"status": status}
        if metadata:
            body["metadata"] = dict(metadata)
        return await _json(
            self.core.patch_namespaced_pod_status(
                name,
                namespace,
                body,
                _content_type=_MERGE,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )

    async def delete_pod_now(self, namespace: str, name: str, *, uid: str) -> None:
        """Delete with grace 0, only if the pod is still the one with ``uid``.

        A missing pod or a different pod by the same name (409 precondition) means done.
        """
        self._fence(f"delete pod {namespace}/{name}")
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            await _json(
                self.core.delete_namespaced_pod(
                    name,
                    namespace,
                    body=options,
                    _preload_content=False,
                    _request_timeout=_TIMEOUT,
                )
            )
        except (NotFoundError, ConflictError):
            return

    # ------------------------------------------------------------------ objects a pod references

    async def get_secret(self, namespace: str, name: str) -> JSON | None:
        try:
            return await _json(
                self.core.read_namespaced_secret(
                    name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except NotFoundError:
            return None

    async def get_config_map(self, namespace: str, name: str) -> JSON | None:
        try:
            return await _json(
                self.core.read_namespaced_config_map(
                    name, namespace, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except NotFoundError:
            return None

    # ------------------------------------------------------------------ events

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> JSON:
        self._fence("create an Event")
        return await _json(
            self.core.create_namespaced_event(
                namespace, dict(event), _preload_content=False, _request_timeout=_TIMEOUT
            )
        )

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        self._fence("update an Event")
        return await _json(
            self.core.patch_namespaced_event(
                name,
                namespace,
                dict(patch),
                _content_type=_MERGE,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )

    # ------------------------------------------------------------------ node and lease

    async def get_node(self, name: str) -> JSON | None:
        try:
            return await _json(
                self.core.read_node(name, _preload_content=False, _request_timeout=_TIMEOUT)
            )
        except NotFoundError:
            return None

    async def create_node(self, node: Mapping[str, Any]) -> JSON:
        self._fence("register the node")
        return await _json(
            self.core.create_node(dict(node), _preload_content=False, _request_timeout=_TIMEOUT)
        )

    async def delete_node(self, name: str) -> None:
        """Delete the Node (gone already is fine)."""
        self._fence(f"delete node {name}")
        try:
            await _json(
                self.core.delete_node(name, _preload_content=False, _request_timeout=_TIMEOUT)
            )
        except NotFoundError:
            return

    async def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON:
        self._fence(f"patch node {name}")
        return await _json(
            self.core.patch_node(
                name,
                dict(patch),
                _content_type=_MERGE,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )

    async def patch_node_status(self, name: str, status: Mapping[str, Any]) -> JSON:
        """A strategic merge: conditions merge by type, so the node controller's and the
        overflow flip's conditions never overwrite each other."""
        self._fence(f"write the status of node {name}")
        return await _json(
            self.core.patch_node_status(
                name,
                {"status": dict(status)},
                _content_type=_STRATEGIC,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )

    async def get_lease(
        self, name: str, *, namespace: str = LEASE_NAMESPACE, request_timeout: float = _TIMEOUT
    ) -> JSON | None:
        """The Lease, or None; ``request_timeout`` bounds the call (a renew deadline)."""
        try:
            return await _json(
                self.coordination.read_namespaced_lease(
                    name, namespace, _preload_content=False, _request_timeout=request_timeout
                )
            )
        except NotFoundError:
            return None

    async def create_lease(
        self,
        lease: Mapping[str, Any],
        *,
        namespace: str = LEASE_NAMESPACE,
        request_timeout: float = _TIMEOUT,
        fenced: bool = True,
    ) -> JSON:
        """Create; one that exists already yields ``ConflictError``."""
        if fenced:
            self._fence(f"create Lease {namespace}/{lease['metadata']['name']}")
        return await _json(
            self.coordination.create_namespaced_lease(
                namespace, dict(lease), _preload_content=False, _request_timeout=request_timeout
            )
        )

    async def replace_lease(
        self,
        name: str,
        lease: Mapping[str, Any],
        *,
        namespace: str = LEASE_NAMESPACE,
        request_timeout: float = _TIMEOUT,
        fenced: bool = True,
    ) -> JSON:
        """PUT with the lease's resourceVersion: a concurrent writer yields ``ConflictError``."""
        if fenced:
            self._fence(f"renew Lease {namespace}/{name}")
        return await _json(
            self.coordination.replace_namespaced_lease(
                name,
                namespace,
                dict(lease),
                _preload_content=False,
                _request_timeout=request_timeout,
            )
        )

    # ------------------------------------------------------------------ certificates

    async def create_csr(self, csr: Mapping[str, Any]) -> JSON:
        return await _json(
            self.certificates.create_certificate_signing_request(
                dict(csr), _preload_content=False, _request_timeout=_TIMEOUT
            )
        )

    async def approve_csr(self, name: str, *, reason: str, message: str) -> JSON:
        """Add the Approved condition to CertificateSigningRequest ``name`` (its /approval
        subresource; needs ``approve`` on its signer)."""
        current = await self.get_csr(name)
        if current is None:
            raise NotFoundError(404, f"CertificateSigningRequest {name} not found")
        status = dict(current.get("status") or {})
        status["conditions"] = [
            *(status.get("conditions") or []),
            {"type": "Approved", "status": "True", "reason": reason, "message": message},
        ]
        return await _json(
            self.certificates.replace_certificate_signing_request_approval(
                name,
                {**current, "status": status},
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )

    async def get_csr(self, name: str) -> JSON | None:
        try:
            return await _json(
                self.certificates.read_certificate_signing_request(
                    name, _preload_content=False, _request_timeout=_TIMEOUT
                )
            )
        except NotFoundError:
            return None

    # ------------------------------------------------------------------ authn / authz

    async def token_review(self, token: str) -> JSON:
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        return await _json(
            self.authentication.create_token_review(
                review, _preload_content=False, _request_timeout=_TIMEOUT
            )
        )

    async def subject_access_review(self, spec: Mapping[str, Any]) -> JSON:
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": dict(spec),
        }
        return await _json(
            self.authorization.create_subject_access_review(
                review, _preload_content=False, _request_timeout=_TIMEOUT
            )
        )

    async def evict_pod(self, namespace: str, name: str) -> str:
        """Evict through the Eviction API (PodDisruptionBudgets honoured): "evicted", "gone"
        (no such pod), or "refused" (its budget allows no disruption now: HTTP 429)."""
        eviction = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/eviction"
        try:
            await self.request("POST", path, body=eviction)
        except NotFoundError:
            return "gone"
        except ApiError as exc:
            if exc.status == 429:
                return "refused"
            raise
        return "evicted"

    # ------------------------------------------------------------------ any path

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        query: Mapping[str, str] | None = None,
        merge: bool = False,
    ) -> JSON:
        """``method`` on an API ``path`` (``/api/v1/...``, ``/apis/group/version/...``) with a
        JSON ``body`` (a JSON merge patch when ``merge``); the JSON answer. For the objects
        no typed call above covers (evictions, Kueue Workloads, PodGroups). Writes are
        fenced like the others: a replica that does not lead makes none."""
        if method != "GET":
            self._fence(f"{method} {path}")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = _MERGE if merge else "application/json"
        return await _json(
            self._api.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params=headers,
                body=dict(body) if body is not None else None,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=_TIMEOUT,
            )
        )
