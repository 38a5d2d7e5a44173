"""Contract harness for the Kubernetes adapter: a REAL second local cluster ("cluster B").

Cluster B is a ``LocalCluster`` started lazily, once per process, by ``remote_cluster()`` and
stopped at interpreter exit (or earlier by ``stop_remote_cluster()``, for a conftest that
wants to end it with the session). It has no nodes: pods are created, read, listed and deleted
for real but never scheduled, which is all the contract suite needs. Offers are therefore
empty there; ``offer()`` builds a CPU-only offer of the adapter's own sku format.

Each ``running()`` gets a fresh namespace and talks to B as a ServiceAccount with only the
rights the adapter needs (the RBAC an operator would grant; see ``_grant``; with ``expose:
node-port``, so each launch also makes its Service, under the services rights), through a bearer
token — so the token path of the kubeconfig parser is exercised, and authorisation failures are
real RBAC refusals. Native states are written through the pods' ``/status`` subresource with
the admin credentials, as a kubelet would. The workload is a whole pod (two app containers,
an init container, a native sidecar, a probe of every kind), so B's own validation checks
every part of the manifest the adapter writes. Failures are real where B can produce them:

- ``capacity``: a ResourceQuota of ``pods: 0`` (B answers 403 "exceeded quota");
- ``invalid``: a container port of 0 (B answers 422 naming the field);
- ``auth``: the RoleBinding is removed (B answers 403 Forbidden);
- ``rate_limit``/``transient``: the network between adapter and B fails (a wrapping transport
  answers 429 as API priority and fairness does, or refuses the connection) until the adapter
  gives up.
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import dataclasses
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from tests.contract.harness import FailureKind
from vk_provider.domain.containers import ContainerSpec, Probe
from vk_provider.domain.contract import Provider
from vk_provider.domain.models import InstanceState, Offer, Port, WorkloadSpec
from vk_provider_adapters.kubernetes.adapter import DEFAULT_RETRY, KubernetesProvider
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig
from vk_provider_adapters.kubernetes.kubeconfig import build_transport, load_kubeconfig
from vk_provider_adapters.kubernetes.offers import FALLBACK_REGION, Shape
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster

SERVICE_ACCOUNT = "vk-agent"
CLUSTER_ROLE = "vk-provider-remote"
HOLD_FINALIZER = "vk-provider.io/contract-hold"

# What the adapter needs in B (deploy/remote-cluster-rbac.yaml): cluster-wide reads for offers,
# and its own pods and secrets in the namespace the operator made for it (it never makes one).
CLUSTER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
]
NAMESPACE_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {
        "apiGroups": [""],
        "resources": ["pods/exec", "pods/attach", "pods/portforward"],
        "verbs": ["create"],
    },
    {"apiGroups": ["metrics.k8s.io"], "resources": ["pods"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "patch", "delete"]},
    # expose: node-port (the harness's): each pod's Service; B's garbage collector deletes it.
    {"apiGroups": [""], "resources": ["services"], "verbs": ["create", "get", "list", "patch"]},
]

_lock = threading.Lock()
_cluster: LocalCluster | None = None
_root: Path | None = None


def remote_cluster() -> LocalCluster:
    """Cluster B, started on first use in this process (stopped at exit)."""
    global _cluster, _root
    with _lock:
        if _cluster is None:
            _root = Path(tempfile.mkdtemp(prefix="vk-remote-"))
            cluster = LocalCluster(f"vkt-remote-{os.getpid()}", root=_root)
            atexit.register(stop_remote_cluster)
            try:
                cluster.up(ensure_binaries())
            except BaseException:
                cluster.down()
                raise
            _cluster = cluster
        return _cluster


def stop_remote_cluster() -> None:
    """Stop cluster B if this process started it; safe to call more than once."""
    global _cluster, _root
    with _lock:
        if _cluster is not None:
            _cluster.down()
            _cluster = None
        if _root is not None:
            shutil.rmtree(_root, ignore_errors=True)
            _root = None


class Admin:
    """Cluster B as its administrator (what a kubelet or an operator would do)."""

    def __init__(self, cluster: LocalCluster) -> None:
        access = load_kubeconfig(cluster.kubeconfig.read_text())
        self.server = access.server
        self.ca_data = cluster.pki.ca.cert.read_bytes()
        self._http = httpx.Client(base_url=access.server, verify=access.ssl_context(), timeout=10)

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        patch: bool = False,
        ok: tuple[int, ...] = (),
    ) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if patch else {}
        response = self._http.request(method, path, json=body, headers=headers)
        if not response.is_success and response.status_code not in ok:
            raise AssertionError(f"{method} {path}: HTTP {response.status_code} {response.text}")
        return dict(response.json()) if response.content else {}

    def wait(self, check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster B: timed out waiting for {what}")
            time.sleep(0.05)


class FaultyNetwork(httpx.AsyncBaseTransport):
    """The network between the adapter and B: passes requests on, or fails them all."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self._inner = inner
        self.failing: Literal["rate_limit", "transient"] | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.failing == "transient":
            raise httpx.ConnectError("connection refused", request=request)
        if self.failing == "rate_limit":
            # What API priority and fairness answers when a priority level is saturated.
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": "Too many requests, please try again later.",
                "reason": "TooManyRequests",
                "details": {"retryAfterSeconds": 1},
                "code": 429,
            }
            return httpx.Response(429, json=body, headers={"Retry-After": "1"})
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _no_wait(_seconds: float) -> None:
    return None


def _container_status(
    state: Mapping[str, Any], *, name: str = "main", ready: bool = False, **fields: Any
) -> dict[str, Any]:
    return {
        "name": name,
        "image": f"example.com/{name}:1",
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": "running" in state,
        "state": dict(state),
        **fields,
    }


_STARTED = "2026-03-13T20:00:01Z"
_FINISHED = "2026-03-13T20:00:09Z"
_RUNNING = {"running": {"startedAt": _STARTED}}
_COMPLETED = {
    "terminated": {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": _STARTED,
        "finishedAt": _FINISHED,
    }
}
_INITIALIZING = {"waiting": {"reason": "PodInitializing"}}
# The remote pod is a whole pod (``KubernetesHarness.spec``): app containers main and
# exporter, init containers setup and the sidecar proxy.
_INITIALIZED = [
    _container_status(_COMPLETED, name="setup", ready=True),
    _container_status(_RUNNING, name="proxy", ready=True),
]
NATIVE_STATUSES: dict[str, dict[str, Any]] = {
    "Pending": {"phase": "Pending"},
    "ContainerCreating": {
        "phase": "Pending",
        "initContainerStatuses": _INITIALIZED,
        "containerStatuses": [
            _container_status({"waiting": {"reason": "ContainerCreating"}}),
            _container_status({"waiting": {"reason": "ContainerCreating"}}, name="exporter"),
        ],
    },
    "Initializing": {
        "phase": "Pending",
        "initContainerStatuses": [
            _container_status(_RUNNING, name="setup"),
            _container_status(_INITIALIZING, name="proxy"),
        ],
        "containerStatuses": [
            _container_status(_INITIALIZING),
            _container_status(_INITIALIZING, name="exporter"),
        ],
    },
    "Running": {
        "phase": "Running",
        "podIP": "10.1.2.3",
        "podIPs": [{"ip": "10.1.2.3"}],
        "startTime": "2026-03-13T20:00:00Z",
        "initContainerStatuses": _INITIALIZED,
        "containerStatuses": [
            _container_status(_RUNNING, ready=True),
            _container_status(_RUNNING, name="exporter", ready=True),
        ],
    },
    "CrashLoopBackOff": {
        "phase": "Running",
        "initContainerStatuses": _INITIALIZED,
        "containerStatuses": [
            _container_status(_RUNNING, ready=True),
            _container_status(
                {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
                name="exporter",
                restartCount=3,
                lastState={"terminated": {"exitCode": 2, "reason": "Error"}},
            ),
        ],
    },
    "Unknown": {"phase": "Unknown"},
    "Succeeded": {
        "phase": "Succeeded",
        "initContainerStatuses": [
            _container_status(_COMPLETED, name="setup", ready=True),
            _container_status(_COMPLETED, name="proxy"),
        ],
        "containerStatuses": [
            _container_status(_COMPLETED),
            _container_status(_COMPLETED, name="exporter"),
        ],
    },
    "Failed": {
        "phase": "Failed",
        "initContainerStatuses": _INITIALIZED,
        "containerStatuses": [
            _container_status(
                {
                    "terminated": {
                        "exitCode": 3,
                        "reason": "Error",
                        "startedAt": _STARTED,
                        "finishedAt": _FINISHED,
                    }
                }
            ),
            _container_status(_COMPLETED, name="exporter"),
        ],
    },
    "InitFailed": {
        "phase": "Failed",
        "initContainerStatuses": [
            _container_status({"terminated": {"exitCode": 2, "reason": "Error"}}, name="setup"),
            _container_status(_INITIALIZING, name="proxy"),
        ],
        "containerStatuses": [
            _container_status(_INITIALIZING),
            _container_status(_INITIALIZING, name="exporter"),
        ],
    },
    "Evicted": {
        "phase": "Failed",
        "reason": "Evicted",
        "message": "The node was low on resource: memory.",
    },
}
# Each native status is written over the previous one by a merge patch: what it does not
# say is cleared, as a kubelet's full status would.
_CLEARED: dict[str, Any] = {
    "reason": None,
    "message": None,
    "initContainerStatuses": None,
    "containerStatuses": None,
}


class KubernetesHarness:
    name = "kubernetes"
    # In order: each is written over the previous one; Terminating (a deletion) comes last.
    native_states: Mapping[str, InstanceState] = {
        "Pending": InstanceState.PENDING,
        "ContainerCreating": InstanceState.PENDING,
        "Initializing": InstanceState.PENDING,
        "Running": InstanceState.RUNNING,
        "CrashLoopBackOff": InstanceState.RUNNING,  # B's kubelet restarts it
        "Unknown": InstanceState.LOST,
        "Succeeded": InstanceState.EXITED,
        "Failed": InstanceState.EXITED,
        "InitFailed": InstanceState.EXITED,
        "Evicted": InstanceState.LOST,
        "Terminating": InstanceState.TERMINATING,
    }
    failure_kinds: frozenset[FailureKind] = frozenset(
        {"capacity", "rate_limit", "transient", "auth", "invalid"}
    )

    def __init__(self) -> None:
        self._admin: Admin | None = None
        self._namespace = ""
        self._network: FaultyNetwork | None = None
        self._invalid_next = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        cluster = await asyncio.to_thread(remote_cluster)
        admin = self._admin = Admin(cluster)
        namespace = self._namespace = f"vkc-{uuid.uuid4().hex[:10]}"
        with tempfile.TemporaryDirectory(prefix="vk-contract-kube-") as tmp:
            try:
                token = await asyncio.to_thread(self._grant, admin, namespace)
                kubeconfig = Path(tmp) / "kubeconfig"
                kubeconfig.write_text(_token_kubeconfig(admin, token))
                kubeconfig.chmod(0o600)
                config = KubernetesProviderConfig.model_validate(
                    {
                        "type": "kubernetes",
                        "name": "kube-contract",
                        "kubeconfig": f"file:{kubeconfig}",
                        "namespace": namespace,
                        "gpu_price_per_hour": 1.0,
                        "cpu_price_per_hour": 0.05,
                        # Every launch makes its Service too, under exactly the rights above.
                        "expose": "node-port",
                    }
                )
                access = load_kubeconfig(kubeconfig.read_text())
                network = self._network = FaultyNetwork(build_transport(access))
                provider = KubernetesProvider(
                    config,
                    transport=network,
                    retry=dataclasses.replace(DEFAULT_RETRY, sleep=_no_wait),
                )
                try:
                    yield provider
                finally:
                    network.failing = None
                    await provider.close()
            finally:
                self._invalid_next = False
                await asyncio.to_thread(self._clean_up, admin, namespace)
                admin.close()
                self._admin = None

    @staticmethod
    def _grant(admin: Admin, namespace: str) -> str:
        """The namespace, a ServiceAccount with the adapter's rights, and its token."""
        admin.call("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        admin.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"metadata": {"name": SERVICE_ACCOUNT}},
        )
        subject = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]
        rbac = "/apis/rbac.authorization.k8s.io/v1"
        admin.call(
            "POST",
            f"{rbac}/clusterroles",
            {"metadata": {"name": CLUSTER_ROLE}, "rules": CLUSTER_RULES},
            ok=(409,),
        )
        admin.call(
            "POST",
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": f"{CLUSTER_ROLE}-{namespace}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": CLUSTER_ROLE,
                },
                "subjects": subject,
            },
        )
        admin.call(
            "POST",
            f"{rbac}/namespaces/{namespace}/roles",
            {"metadata": {"name": "vk-agent"}, "rules": NAMESPACE_RULES},
        )
        admin.call(
            "POST",
            f"{rbac}/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": "vk-agent"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "vk-agent",
                },
                "subjects": subject,
            },
        )
        admin.wait(
            lambda: _allowed(admin, namespace, "create", "pods"), "the RoleBinding to take hold"
        )
        # Pods are admitted only once the namespace's default ServiceAccount exists; an
        # operator's namespace has it long before the agent uses it.
        admin.wait(
            lambda: bool(
                admin.call(
                    "GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default", ok=(404,)
                ).get("metadata")
            ),
            "the namespace's default ServiceAccount",
            timeout=60.0,
        )
        request = admin.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{SERVICE_ACCOUNT}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )
        return str(request["status"]["token"])

    @staticmethod
    def _clean_up(admin: Admin, namespace: str) -> None:
        pods = admin.call("GET", f"/api/v1/namespaces/{namespace}/pods")
        for pod in pods.get("items", []):
            if pod["metadata"].get("finalizers"):
                admin.call(
                    "PATCH",
                    f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                    {"metadata": {"finalizers": None}},
                    patch=True,
                    ok=(404,),
                )
        admin.call(
            "DELETE",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{CLUSTER_ROLE}-{namespace}",
            ok=(404,),
        )
        admin.call("DELETE", f"/api/v1/namespaces/{namespace}", ok=(404,))

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        """A whole pod: two app containers, an init container and a sidecar, with a probe of
        every kind, so B's real validation sees every part of the manifest."""
        ports: tuple[Port, ...] = (Port(8080, "TCP", "http"),)
        if self._invalid_next:
            self._invalid_next = False
            ports = (Port(container_port=0),)  # B refuses it: containerPort is required
        sleep = ("python", "-c", "import time; time.sleep(60)")
        main = ContainerSpec(
            name="main",
            image="example.com/contract:1",
            command=sleep,
            ports=ports,
            cpu=0.25,
            memory_bytes=256 * 2**20,
            startup_probe=Probe(kind="exec", command=("true",), failure_threshold=30),
            readiness_probe=Probe(kind="http", port=8080, path="/ready", period_seconds=2),
        )
        exporter = ContainerSpec(
            name="exporter",
            image="example.com/exporter:1",
            command=sleep,
            readiness_probe=Probe(kind="tcp", port=9100, initial_delay_seconds=1),
            liveness_probe=Probe(kind="grpc", port=9101, grpc_service="health"),
        )
        setup = ContainerSpec(name="setup", image="example.com/setup:1", command=("true",))
        proxy = ContainerSpec(
            name="proxy", image="example.com/proxy:1", command=sleep, restart_policy="Always"
        )
        return WorkloadSpec(
            pod_uid=pod_uid,
            namespace="ns-a",
            pod_name="p",
            cpu=0.25,
            memory_bytes=256 * 2**20,
            attempt=attempt,
            containers=(main, exporter),
            init_containers=(setup, proxy),
        )

    async def offer(self, provider: Provider) -> Offer:
        offers = await provider.offers()  # B has no nodes: nothing to offer, but it answers
        cpu = [o for o in offers if o.gpu_count == 0 and o.available > 0]
        if cpu:
            return cpu[0]
        shape = Shape(gpus=0, vcpus=1.0, memory_gib=2.0)
        return Offer(
            provider=provider.name,
            sku=shape.sku,
            region=FALLBACK_REGION,
            gpu_model=None,
            gpu_count=0,
            gpu_memory_gib=0.0,
            vcpus=shape.vcpus,
            memory_gib=shape.memory_gib,
            price_per_hour=0.05,
        )

    def unknown_instance_id(self) -> str:
        self._require_admin()
        # ``vk-<pod uid>-<attempt>``, as the adapter names its pods; the namespace is new
        # for this ``running()``, so B answers 404 NotFound for it.
        return "vk-uid-never-created-0"

    def add_foreign_instance(self) -> None:
        admin = self._require_admin()
        base = f"/api/v1/namespaces/{self._namespace}/pods"
        container = {"name": "main", "image": "example.com/other:1"}
        # A pod nobody labelled, and one another agent (another provider name) made.
        admin.call(
            "POST", base, {"metadata": {"name": "foreign"}, "spec": {"containers": [container]}}
        )
        labels = {"vk-provider.io/managed-by": "another-agent"}
        annotations = {
            "remote.vk-provider.io/pod-uid": "uid-other",
            "remote.vk-provider.io/attempt": "0",
        }
        admin.call(
            "POST",
            base,
            {
                "metadata": {
                    "name": "vk-uid-other-0",
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {"containers": [container]},
            },
        )

    def set_native_state(self, instance_id: str, native: str) -> None:
        admin = self._require_admin()
        path = f"/api/v1/namespaces/{self._namespace}/pods/{instance_id}"
        if native == "Terminating":
            # An unscheduled pod is removed at once on delete; a finalizer keeps it visible.
            admin.call("PATCH", path, {"metadata": {"finalizers": [HOLD_FINALIZER]}}, patch=True)
            admin.call("DELETE", path, {"gracePeriodSeconds": 30})
            return
        status = _CLEARED | NATIVE_STATUSES[native]
        admin.call("PATCH", f"{path}/status", {"status": status}, patch=True)

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        admin = self._require_admin()
        namespace = self._namespace
        if kind == "invalid":
            self._invalid_next = True
        elif kind == "capacity":
            quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
            admin.call(
                "POST", quotas, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
            )
            # Until the quota controller has counted, B refuses with "status unknown".
            admin.wait(
                lambda: bool(admin.call("GET", f"{quotas}/no-pods").get("status", {}).get("used")),
                "the quota to be counted",
            )
        elif kind == "auth":
            rbac = "/apis/rbac.authorization.k8s.io/v1"
            admin.call("DELETE", f"{rbac}/namespaces/{namespace}/rolebindings/vk-agent")
            admin.wait(
                lambda: not _allowed(admin, namespace, "create", "pods"),
                "the RoleBinding removal to take hold",
            )
        else:
            assert self._network is not None
            self._network.failing = kind

    def _require_admin(self) -> Admin:
        assert self._admin is not None, "only while running()"
        return self._admin


def _allowed(admin: Admin, namespace: str, verb: str, resource: str) -> bool:
    review = admin.call(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                "resourceAttributes": {
                    "namespace": namespace,
                    "verb": verb,
                    "resource": resource,
                },
            },
        },
    )
    return bool(review.get("status", {}).get("allowed"))


def _token_kubeconfig(admin: Admin, token: str) -> str:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "b",
                "cluster": {
                    "server": admin.server,
                    "certificate-authority-data": base64.b64encode(admin.ca_data).decode(),
                },
            }
        ],
        "users": [{"name": "vk-agent", "user": {"token": token}}],
        "contexts": [{"name": "b", "context": {"cluster": "b", "user": "vk-agent"}}],
        "current-context": "b",
    }
    return yaml.safe_dump(document)


HARNESS = KubernetesHarness()
