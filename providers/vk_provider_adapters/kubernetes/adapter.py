"""The Kubernetes adapter: pods of cluster A run as whole pods in a remote cluster B.

Cluster B is reached through its REST API with ``httpx``, through
``vk_provider_adapters.http.JsonApi`` (the agent's own Kubernetes client, ``vk_provider.kube``, is
for cluster A and is never used here), wrapped by ``remote.RemoteNamespace``. The kubeconfig is
loaded by kubernetes_asyncio's loader (``vk_provider_adapters.kubernetes.kubeconfig``); names and
labels are in ``names``, offers in ``offers``, the manifests in ``manifests`` (containers in
``containers``, requests and limits in ``resources``), the state table in ``states`` (container
statuses in ``statuses``), the error table in ``failures``, the ports' endpoints in
``endpoints``, logs in ``logs``,
exec/attach/port-forward in ``streams`` (the WebSocket channel protocols in ``channels``), usage in
``usage``.

Whole pods. The remote pod has every app container, init container and native sidecar of the
pod, its probes and its restart policy: B's kubelet runs init containers in order, restarts
containers, and runs the probes; this adapter reports each container as B does, readiness
included (``Capabilities``: ``multi_container``, ``init_containers``, ``sidecars``,
``probes="provider"``), and the agent treats the remote pod's end as the pod's end (it never
launches a second attempt of it).

Lifecycle. ``create`` writes the Secret of the workload's secret env values first (without
owner), then the pod, both in ``config.namespace``; then the Secret gets an ownerReference to
the pod's uid so B's garbage collector removes it with the pod. When the pod cannot be created
the Secret is deleted again; ``delete`` also deletes it by name (in case an agent died before
the ownerReference was set). A second create of the same request gets 409 AlreadyExists and
returns the existing pod once its annotations prove it was made for that request.

Ports (``config.expose``, default ``none``: nothing reported). ``flat`` reports each declared
port at B's pod IP; ``node-port`` and ``load-balancer`` make, right after the pod, its Service
(``manifests.build_service``), owned by the pod from the start, so B's garbage collector
removes it with the pod; ``delete`` therefore never deletes it, and a terminating pod keeps
its traffic until it is gone. When that Service cannot be made, the launch fails and leaves
nothing behind: the pod is deleted (its Service, if the write got through after all, goes
with it) and so is the Secret. ``get`` and ``list_ours`` read the endpoints from B's answers
(``endpoints``): one more read (the Service, or the list of ours) and, for NodePorts, the
nodes, only while some pod of ours runs with a declared port. When those reads fail, the
call still answers, with the endpoints last read (a warning says why): the pods' states
matter more, and a read failing now and then must not take their traffic away. Retries
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

Exec, attach and port-forward go through B's API server as ``kubectl`` does: a WebSocket to
``pods/exec`` or ``pods/attach`` (``v5.channel.k8s.io``, which B's API server translates into
the SPDY its kubelet speaks; stdin with its end, tty, resizes and the exit code cross it) and
one WebSocket to ``pods/portforward`` (``v4.channel.k8s.io``) per forwarded connection. The
adapter reads the pod first, so a pod that is not ours or a container it does not have is
``NotFound`` naming them. Attach relays B's attach: B's kubelet decides what it shows (the
remote containers run without ``stdin: true``, as the pod's own did).

Usage comes from B's ``metrics.k8s.io`` (``PodMetrics``: ``usage`` explains why not a node's
``stats/summary``); B needs metrics-server for ``kubectl top`` on A to show remote pods.

Rights needed in B (what ``tests/contract/harness_kubernetes.py`` grants, and no more):
``list`` nodes and pods cluster-wide (offers), and in the namespace ``create/get/list/delete``
pods, ``get`` pods/log, ``create`` pods/exec, pods/attach and pods/portforward (a WebSocket's
GET is authorised as ``create``), ``get`` pods of ``metrics.k8s.io`` and
``create/patch/delete`` secrets (``deploy/remote-cluster-rbac.yaml``); with ``expose:
node-port`` or ``load-balancer`` also ``create/get/list/patch`` services in the namespace (no
``delete``: the garbage collector deletes them).

Invariants:
- The kubeconfig, the token and the client key are never logged nor put into a message; the
  token and secret env values are redacted from every message built from a server answer.
- Only ``domain.errors`` escape the public methods (the constructor raises ``ConfigError``).
- Parsers, manifest builders and the offer planner are pure; the HTTP layer is
  ``vk_provider_adapters.http``.

Known limits: ``delete`` with ``grace_seconds=0`` asks for 1 second, because 0 would remove the
object at once and leave the container to the node's next sync (as ``kubectl`` does);
``tls-server-name`` and proxy settings of a kubeconfig are ignored; offers count requests, not
usage; a remote pod's CPU counter starts at the agent's first sample (``usage``).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Final

import httpx

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    ContainerUsage,
    ExecSession,
    Instance,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    PortEndpoint,
    PortStream,
    ProviderError,
    Redactor,
    WorkloadSpec,
)
from vk_provider_adapters.http import JsonApi
from vk_provider_adapters.kubernetes import endpoints
from vk_provider_adapters.kubernetes.channels import (
    EXEC_PROTOCOL,
    PORT_FORWARD_PROTOCOL,
    attach_url,
    exec_url,
    port_forward_url,
)
from vk_provider_adapters.kubernetes.config import KubernetesProviderConfig
from vk_provider_adapters.kubernetes.failures import Call
from vk_provider_adapters.kubernetes.kubeconfig import (
    build_transport,
    kubeconfig_base_dir,
    load_kubeconfig,
)
from vk_provider_adapters.kubernetes.logs import (
    LineSplitter,
    container_names,
    log_container,
    log_params,
)
from vk_provider_adapters.kubernetes.manifests import build_pod, build_secret, build_service
from vk_provider_adapters.kubernetes.names import (
    LABEL_MANAGED_BY,
    is_pod_name,
    label_value,
    pod_name,
)
from vk_provider_adapters.kubernetes.offers import (
    OfferScope,
    Shape,
    gpus_in_use,
    node_capacities,
    plan_offers,
)
from vk_provider_adapters.kubernetes.remote import RemoteNamespace, classifier
from vk_provider_adapters.kubernetes.states import made_for, parse_instance
from vk_provider_adapters.kubernetes.streams import RemoteCommand, RemotePort, RemoteStreams
from vk_provider_adapters.kubernetes.usage import (
    CpuCounter,
    advance,
    parse_pod_metrics,
    pod_metrics_path,
)
from vk_provider_adapters.payload import MalformedResponse, items, mapping
from vk_provider_adapters.transport import RetryPolicy

log = logging.getLogger(__name__)

# This adapter's limits: backoff from 0.25 s, doubling, up to 2 s (an API server answers fast).
DEFAULT_RETRY: Final = RetryPolicy(backoff_seconds=0.25, max_backoff_seconds=2.0)
CAPABILITIES: Final = Capabilities(
    logs=True,
    follow_logs=True,
    log_timestamps=True,
    previous_logs=True,
    multi_container=True,
    init_containers=True,
    sidecars=True,
    probes="provider",  # B's kubelet probes and reports ready/started per container
    exec=True,
    attach=True,
    port_forward=True,
    usage=True,
)


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
            classify=classifier(Call.READ, provider=config.name),
            redactor=Redactor(access.secrets),
            retry=retry or DEFAULT_RETRY,
            timeout=config.timeout_seconds,
            base_url=access.server,
            auth_headers=access.headers(),
            transport=transport or build_transport(access),
            logger=log,
        )
        self._remote = RemoteNamespace(self._api, namespace=config.namespace, provider=config.name)
        self._streams = RemoteStreams(
            access,
            provider=config.name,
            redactor=self._api.redactor,
            timeout=config.timeout_seconds,
        )
        # CPU counters of the remote containers' runs (``usage``), by pod and container.
        self._cpu: dict[tuple[str, str], CpuCounter] = {}
        # The endpoints last read of each running pod (``_reach``), by pod name.
        self._reached: dict[str, tuple[PortEndpoint, ...]] = {}

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    async def offers(self) -> list[Offer]:
        nodes = await self._remote.get("/api/v1/nodes", what="list nodes", call=Call.READ)
        pods = await self._remote.get(
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
        redact = self._api.redactor.with_secrets(spec.secret_values)
        if secret is not None:
            await self._remote.put_secret(secret, redact)
        try:
            pod = await self._remote.create_pod(name, body, redact)
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
                await self._remote.forget_secret(name, quietly=True)
            raise
        service = await self._expose(spec, pod, redact)
        if secret is not None:
            await self._remote.own_secret(secret, pod, redact)
        (reached,) = await self._reach(
            [(instance, pod)], services={name: service} if service else {}
        )
        return reached

    async def get(self, instance_id: str) -> Instance:
        what = f"get pod {instance_id!r}"
        pod = await self._remote.get(self._remote.pod_path(instance_id), what=what, call=Call.READ)
        with self._api.readable(what):
            instance = parse_instance(pod, provider=self.name)
        if instance is None:
            raise NotFound(f"pod {instance_id!r} in the cluster is not ours", provider=self.name)
        (reached,) = await self._reach([(instance, mapping(pod, what))])
        return reached

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
            await self._remote.send(
                "DELETE",
                self._remote.pod_path(instance_id),
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
        for key in [k for k in self._cpu if k[0] == instance_id]:
            del self._cpu[key]
        self._reached.pop(instance_id, None)
        # Normally B's garbage collector removes the Secret with its pod; this covers an
        # agent that died before the Secret got its ownerReference. Quietly: the pod's
        # deletion is what was asked for, and it succeeded.
        await self._remote.forget_secret(instance_id, quietly=True)

    async def list_ours(self) -> list[Instance]:
        what = "list our pods"
        body = await self._remote.get(
            f"/api/v1/namespaces/{self._namespace}/pods",
            what=what,
            call=Call.READ,
            params={"labelSelector": f"{LABEL_MANAGED_BY}={label_value(self.name)}"},
        )
        found: list[tuple[Instance, Mapping[str, object]]] = []
        with self._api.readable(what):
            for pod in items(body, what):
                try:
                    instance = parse_instance(pod, provider=self.name)
                except MalformedResponse as exc:
                    log.warning("provider %s: skipping an unreadable pod: %s", self.name, exc)
                    continue
                if instance is not None:
                    found.append((instance, pod))
        return await self._reach(found, listed=True)

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        what = f"logs of pod {instance_id!r}"
        path = self._remote.pod_path(instance_id)
        pod = await self._remote.get(path, what=what, call=Call.LOGS)
        with self._api.readable(what):
            if parse_instance(pod, provider=self.name) is None:
                raise NotFound(
                    f"pod {instance_id!r} in the cluster is not ours", provider=self.name
                )
            container = log_container(pod, options.container)
            known = container_names(pod)
        if container is None:
            raise NotFound(
                f"pod {instance_id!r} has no container {options.container!r} "
                f"(it has {', '.join(known)})",
                provider=self.name,
            )
        if options.previous:
            what = f"previous logs of container {container!r} of pod {instance_id!r}"
        response = await self._api.retrying(
            lambda: self._api.send(
                "GET",
                f"{path}/log",
                what=what,
                params=log_params(container, options),
                headers={"Accept": "*/*"},
                classify=self._remote.classify(Call.LOGS),
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

    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> ExecSession:
        name = await self._container(instance_id, container, "exec in")
        what = f"exec in container {name!r} of pod {instance_id!r}"
        url = exec_url(
            self._remote.pod_path(instance_id),
            container=name,
            command=command,
            stdin=True,  # always: the agent closes it when the caller sends none
            tty=tty,
        )
        ws = await self._streams.connect(url, protocol=EXEC_PROTOCOL, what=what)
        return RemoteCommand(ws, what=what, provider=self.name)

    async def attach(
        self, instance_id: str, container: str, *, stdin: bool, tty: bool
    ) -> ExecSession:
        name = await self._container(instance_id, container, "attach to")
        what = f"attach to container {name!r} of pod {instance_id!r}"
        url = attach_url(self._remote.pod_path(instance_id), container=name, stdin=stdin, tty=tty)
        ws = await self._streams.connect(url, protocol=EXEC_PROTOCOL, what=what)
        return RemoteCommand(ws, what=what, provider=self.name)

    async def open_port(self, instance_id: str, port: int) -> PortStream:
        await self._container(instance_id, "", "forward a port of")
        what = f"port-forward to port {port} of pod {instance_id!r}"
        url = port_forward_url(self._remote.pod_path(instance_id), port)
        ws = await self._streams.connect(url, protocol=PORT_FORWARD_PROTOCOL, what=what)
        return RemotePort(ws, port)

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        what = f"metrics of pod {instance_id!r}"
        self._remote.pod_path(instance_id)  # NotFound for a name no pod of ours has
        try:
            body = await self._remote.get(
                pod_metrics_path(self._namespace, instance_id), what=what, call=Call.READ
            )
        except NotFound:
            # No sample yet (metrics-server scrapes every 15 s or so), or no metrics-server in
            # B: no usage, which leaves the pod out rather than reporting zero.
            return []
        with self._api.readable(what):
            sample = parse_pod_metrics(body)
        usages = []
        for container in sample.containers:
            key = (instance_id, container.name)
            counter = advance(
                self._cpu.get(key),
                nanocores=container.nanocores,
                at=sample.timestamp,
                window_seconds=sample.window_seconds,
            )
            self._cpu[key] = counter
            usages.append(
                ContainerUsage(
                    name=container.name,
                    cpu_core_nanoseconds=counter.total,
                    memory_working_set_bytes=container.memory_bytes,
                    timestamp=counter.at,
                )
            )
        return usages

    async def close(self) -> None:
        await self._streams.close()
        await self._api.aclose()

    # --- internals ------------------------------------------------------------------------

    async def _expose(
        self, spec: WorkloadSpec, pod: Mapping[str, object], redact: Redactor
    ) -> Mapping[str, object] | None:
        """The created pod's Service (``expose: node-port`` or ``load-balancer``, some port
        declared), else None. When it cannot be made, the pod and its Secret are deleted
        (nothing of a failed launch is left behind) and the error is raised."""
        name = pod_name(spec)
        with self._api.readable(f"create pod {name}"):
            service = build_service(
                spec,
                pod,
                expose=self._config.expose,
                namespace=self._namespace,
                provider=self.name,
                annotations=self._config.service_annotations,
            )
        if service is None:
            return None
        try:
            return await self._remote.put_service(service)
        except ProviderError as exc:
            log.warning(
                "provider %s: service %s/%s not made (%s); deleting its pod",
                self.name,
                self._namespace,
                name,
                exc,
            )
            try:
                await self.delete(name, grace_seconds=0)
            except ProviderError as cleanup:
                # The agent lists the pod as an instance of no pod of A and deletes it later.
                log.warning("provider %s: pod %s not cleaned up: %s", self.name, name, cleanup)
            raise exc from None

    async def _reach(
        self,
        found: Sequence[tuple[Instance, Mapping[str, object]]],
        *,
        listed: bool = False,
        services: Mapping[str, Mapping[str, object]] | None = None,
    ) -> list[Instance]:
        """The instances of ``found`` (instance, its pod) with their ports' endpoints, read
        from B (``endpoints``) for the pods that run and declare a port; ``listed``: ``found``
        is every pod of ours (the Services are read in one list, not one by one);
        ``services`` are Services just written (not read again).

        A failed read of Services or nodes does not fail the call: the pods' states matter
        more, and a read that fails now and then must not take their traffic away; the
        endpoints last read stand (none, for a pod never read), with a warning."""
        serving = [
            (i, pod) for i, pod in found if endpoints.serving(pod) and endpoints.pod_ports(pod)
        ]
        running = {i.instance_id for i, _ in serving}
        for key in [k for k in self._reached if k not in running]:
            if listed or any(i.instance_id == key for i, _ in found):
                del self._reached[key]  # ended, or gone: nothing of it is reached any more
        if self._config.expose == "none" or not serving:
            return [i for i, _ in found]
        try:
            reached = await self._read_endpoints(serving, listed=listed, services=services)
        except ProviderError as exc:
            log.warning("provider %s: endpoints not read, the last read stand: %s", self.name, exc)
            reached = {i.instance_id: self._reached.get(i.instance_id, ()) for i, _ in serving}
        self._reached.update(reached)
        return [replace(i, endpoints=reached.get(i.instance_id, ())) for i, _ in found]

    async def _read_endpoints(
        self,
        serving: Sequence[tuple[Instance, Mapping[str, object]]],
        *,
        listed: bool,
        services: Mapping[str, Mapping[str, object]] | None,
    ) -> dict[str, tuple[PortEndpoint, ...]]:
        """Each running pod's endpoints by ``config.expose`` (``endpoints``)."""
        if self._config.expose == "flat":
            return {i.instance_id: endpoints.flat(pod) for i, pod in serving}
        if services is None:
            services = await self._services([i.instance_id for i, _ in serving], listed=listed)
        owned = {
            i.instance_id: service
            for i, pod in serving
            if (service := services.get(i.instance_id)) is not None
            and endpoints.owned_by(service, pod)
        }
        node = None
        if any(endpoints.needs_node(s) for s in owned.values()):
            node = await self._node_address()
        return {
            name: endpoints.service_endpoints(owned[name], node=node) if name in owned else ()
            for name in (i.instance_id for i, _ in serving)
        }

    async def _services(
        self, names: Sequence[str], *, listed: bool
    ) -> dict[str, Mapping[str, object]]:
        """Our Services by name: one list (``listed``), else a read per name."""
        if not listed:
            found = {name: await self._remote.service(name) for name in names}
            return {name: s for name, s in found.items() if s is not None}
        what = "list our services"
        body = await self._remote.get(
            f"/api/v1/namespaces/{self._namespace}/services",
            what=what,
            call=Call.READ,
            params={"labelSelector": f"{LABEL_MANAGED_BY}={label_value(self.name)}"},
        )
        with self._api.readable(what):
            return {
                str(mapping(s.get("metadata"), "service metadata").get("name")): s
                for s in items(body, what)
            }

    async def _node_address(self) -> str | None:
        """Where B's NodePorts are reported (``endpoints.node_address``)."""
        what = "list nodes"
        selector = self._config.node_selector
        body = await self._remote.get(
            "/api/v1/nodes",
            what=what,
            call=Call.READ,
            params={"labelSelector": selector} if selector else None,
        )
        with self._api.readable(what):
            return endpoints.node_address(items(body, what), self._config.node_address_types)

    async def _container(self, instance_id: str, wanted: str, doing: str) -> str:
        """The container of our pod ``instance_id`` that ``wanted`` names (the first app
        container when empty); ``NotFound`` naming what is missing."""
        what = f"{doing} pod {instance_id!r}"
        pod = await self._remote.get(self._remote.pod_path(instance_id), what=what, call=Call.READ)
        with self._api.readable(what):
            if parse_instance(pod, provider=self.name) is None:
                raise NotFound(
                    f"pod {instance_id!r} in the cluster is not ours", provider=self.name
                )
            container = log_container(pod, wanted or None)
            known = container_names(pod)
        if container is None:
            raise NotFound(
                f"pod {instance_id!r} has no container {wanted!r} (it has {', '.join(known)})",
                provider=self.name,
            )
        return container

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
