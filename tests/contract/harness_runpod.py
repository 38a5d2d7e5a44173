"""Contract harness for RunPod: the adapter against ``FakeRunPod``, a stateful fake on respx.

``FakeRunPod`` answers the three APIs the adapter uses, shaped by the published documents in
``tests/fixtures/provider-apis``:

- GraphQL ``gpuTypes`` from a small catalogue, reading the aliased ``lowestPrice`` fields out of
  the query the way the server does, and ``myself { pods { id runtime } }`` (a pod's ``runtime``
  is stored with it and answered by GraphQL only, as v1's Pod has no such field);
- REST v1 pods kept in a dict: ``POST /pods`` → 201 Pod (every body validated against the v1
  ``PodCreateInput`` schema when the document is available), ``GET /pods`` with its ``name``,
  ``desiredStatus`` and ``id`` filters, ``GET /pods/{id}`` → 200 / 404, ``DELETE`` → 204 / 404;
- REST v2 logs as Server-Sent Events.

Failures are injected per operation with RunPod's real error shapes (``fail``), including a
create whose pod is made but whose answer is lost (``lose_create_answers``).
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import httpx
import respx
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.contract.harness import FailureKind
from tests.fixtures import PROVIDER_APIS
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.models import InstanceState, Offer, WorkloadSpec
from vk_provider_adapters.runpod.adapter import RunPodProvider
from vk_provider_adapters.runpod.config import RunPodProviderConfig
from vk_provider_adapters.transport import RetryPolicy

REST_URL = "https://rest.runpod.test/v1"
GRAPHQL_URL = "https://api.runpod.test/graphql"
LOGS_URL = "https://api.runpod.test/v2"
API_KEY = "rpa_TESTKEY0123456789abcdefSECRET"

SPEC_DIR = PROVIDER_APIS
V1_SPEC = SPEC_DIR / "runpod-rest-v1-openapi.json"
V2_SPEC = SPEC_DIR / "runpod-rest-v2-openapi.json"

CAPACITY_MESSAGE = (
    "There are no longer any instances available with the requested specifications. "
    "Please refresh and try again."
)

JSON = dict[str, Any]
Operation = Literal["graphql", "create", "list", "get", "delete", "logs"]


@cache
def v1_document() -> JSON:
    """The RunPod REST v1 OpenAPI document (kept in tests/fixtures: never missing)."""
    return dict(json.loads(V1_SPEC.read_text()))


def v1_validator(component: str) -> Draft202012Validator:
    """A validator for one v1 component schema, ``$ref``s resolved within the document.

    (The v1 document repeats an operationId, so OpenAPI loaders refuse it; its schemas are
    plain JSON Schema, which ``jsonschema`` reads as they are.)
    """
    document = v1_document()
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource("urn:runpod:rest-v1", resource)
    schema = {"$ref": f"urn:runpod:rest-v1#/components/schemas/{component}"}
    return Draft202012Validator(schema, registry=registry)


def graphql_error(message: str, code: str = "INTERNAL_SERVER_ERROR") -> httpx.Response:
    """A GraphQL failure as RunPod sends it: HTTP 200 with ``errors``."""
    body = {"errors": [{"message": message, "extensions": {"code": code}}], "data": None}
    return httpx.Response(200, json=body)


def problem(status: int, detail: str, headers: Mapping[str, str] | None = None) -> httpx.Response:
    """An error as problem+json (the v2 ``ErrorResponse`` shape)."""
    title = {401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 422: "Unprocessable"}
    body = {"title": title.get(status, "Error"), "status": status, "detail": detail}
    return httpx.Response(
        status,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/problem+json", **(headers or {})},
    )


def v1_error(status: int, message: str) -> httpx.Response:
    """An error as REST v1 sends it: ``{"error": ..., "status": ...}``."""
    return httpx.Response(status, json={"error": message, "status": status})


@dataclass
class FakeGpu:
    """One GPU type of the fake catalogue; prices per GPU per hour."""

    id: str
    display_name: str
    memory_gb: int
    max_count: int
    secure_price: float
    community_price: float
    secure_spot: float | None
    community_spot: float | None
    stock: str | None = "High"  # stockStatus everywhere unless overridden
    region_stock: dict[str, str | None] = field(default_factory=dict)

    def stock_in(self, region: str | None, count: int) -> str | None:
        if count > self.max_count:
            return None
        if region is not None and region in self.region_stock:
            return self.region_stock[region]
        return self.stock

    def graphql(self) -> JSON:
        return {
            "id": self.id,
            "displayName": self.display_name,
            "memoryInGb": self.memory_gb,
            "maxGpuCount": self.max_count,
            "securePrice": self.secure_price,
            "communityPrice": self.community_price,
            "secureSpotPrice": self.secure_spot,
            "communitySpotPrice": self.community_spot,
        }


def default_catalogue() -> list[FakeGpu]:
    return [
        FakeGpu("NVIDIA H100 80GB HBM3", "H100 SXM", 80, 8, 2.99, 2.69, 1.75, None),
        FakeGpu("NVIDIA L40S", "L40S", 48, 4, 0.86, 0.79, 0.53, 0.47, stock="Medium"),
        FakeGpu("NVIDIA GeForce RTX 4090", "RTX 4090", 24, 2, 0.69, 0.34, None, 0.2, stock=None),
    ]


_LOWEST = re.compile(
    r"(?P<alias>\w+): lowestPrice\(input: \{gpuCount: (?P<count>\d+), "
    r"secureCloud: (?P<secure>true|false)(?:, dataCenterId: \"(?P<region>[^\"]+)\")?\}\)"
)


def _v1(pod: JSON) -> JSON:
    """A stored pod as REST v1 answers it: v1's Pod has no ``runtime`` (GraphQL's has)."""
    return {key: value for key, value in pod.items() if key != "runtime"}


@dataclass
class _Failure:
    response: httpx.Response | Exception
    remaining: int | None  # None: until cleared


class FakeRunPod:
    """RunPod's GraphQL, REST v1 pods and v2 logs, in memory, behind respx routes."""

    def __init__(self, catalogue: list[FakeGpu] | None = None) -> None:
        self.catalogue = catalogue if catalogue is not None else default_catalogue()
        self.pods: dict[str, JSON] = {}
        self.logs: dict[str, list[tuple[str, str]]] = {}
        self.create_bodies: list[JSON] = []
        self.queries: list[str] = []
        self.lose_create_answers = 0
        self._failures: dict[str, _Failure] = {}
        self._ids = itertools.count(1)
        self._create_validator = v1_validator("PodCreateInput")
        self.router = respx.Router(assert_all_called=False)
        pod_path = r"/pods/(?P<pod_id>[^/?]+)"
        rest = re.escape(REST_URL)
        self.routes = {
            "graphql": self.router.post(GRAPHQL_URL).mock(side_effect=self._graphql),
            "create": self.router.post(f"{REST_URL}/pods").mock(side_effect=self._create),
            "list": self.router.get(url__regex=rf"^{rest}/pods(\?.*)?$").mock(
                side_effect=self._list
            ),
            "get": self.router.get(url__regex=rf"^{rest}{pod_path}$").mock(side_effect=self._get),
            "delete": self.router.delete(url__regex=rf"^{rest}{pod_path}$").mock(
                side_effect=self._delete
            ),
            "logs": self.router.get(
                url__regex=rf"^{re.escape(LOGS_URL)}{pod_path}/logs(\?.*)?$"
            ).mock(side_effect=self._logs),
        }

    def transport(self) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.router.async_handler)

    def calls(self, operation: Operation) -> int:
        return int(self.routes[operation].call_count)

    # --- knobs ----------------------------------------------------------------------------

    def fail(
        self, operation: Operation, response: httpx.Response | Exception, *, times: int | None
    ) -> None:
        """Answer the next ``times`` calls of ``operation`` (every call if None) so."""
        self._failures[operation] = _Failure(response, times)

    def clear_failures(self) -> None:
        self._failures.clear()

    def add_pod(
        self, *, name: str, env: JSON | None = None, pod_id: str | None = None, **fields: Any
    ) -> JSON:
        """A pod in the account, as if created elsewhere (or by an earlier agent)."""
        pod_id = pod_id or f"fk{next(self._ids):012d}"
        pod: JSON = {
            "id": pod_id,
            "name": name,
            "image": "runpod/pytorch:2.1.0-py3.10-cuda11.8.0-devel-ubuntu22.04",
            "desiredStatus": "RUNNING",
            "env": env if env is not None else {},
            "costPerHr": 0.74,
            "adjustedCostPerHr": 0.74,
            "interruptible": False,
            "gpu": {"id": "NVIDIA L40S", "count": 1, "displayName": "L40S"},
            "machineId": "s194cr8pls2z",
            "consumerUserId": "user_2PyTJrLzeuwfZilRZ7JhCQDuSqo",
            "containerDiskInGb": 20,
            "volumeInGb": 0,
            "memoryInGb": 62,
            "vcpuCount": 16,
            "ports": [],
            "portMappings": {},
            "publicIp": "",
            "lastStartedAt": "2026-03-13T20:00:00.000Z",
            "lastStatusChange": "Rented by User: Fri Mar 13 2026 20:00:00 GMT+0000",
            "locked": False,
            "dockerEntrypoint": [],
            "dockerStartCmd": [],
            **fields,
        }
        self.pods[pod_id] = pod
        return pod

    def set_fields(self, pod_id: str, **fields: Any) -> None:
        self.pods[pod_id].update(fields)

    # --- handlers -------------------------------------------------------------------------

    def _injected(self, operation: Operation) -> httpx.Response | None:
        failure = self._failures.get(operation)
        if failure is None:
            return None
        if failure.remaining is not None:
            failure.remaining -= 1
            if failure.remaining <= 0:
                del self._failures[operation]
        if isinstance(failure.response, Exception):
            raise failure.response
        return failure.response

    def _graphql(self, request: httpx.Request) -> httpx.Response:
        if (injected := self._injected("graphql")) is not None:
            return injected
        query = str(json.loads(request.content)["query"])
        self.queries.append(query)
        if "myself" in query:
            # GraphQL's Pod.runtime: null until the container is up (v1 has no such field).
            pods = [
                {"id": p["id"], "desiredStatus": p["desiredStatus"], "runtime": p.get("runtime")}
                for p in self.pods.values()
            ]
            return httpx.Response(200, json={"data": {"myself": {"pods": pods}}})
        aliases = list(_LOWEST.finditer(query))
        gpu_types = []
        for gpu in self.catalogue:
            entry = gpu.graphql()
            for match in aliases:
                count = int(match["count"])
                secure = match["secure"] == "true"
                stock = gpu.stock_in(match["region"], count)
                spot = gpu.secure_spot if secure else gpu.community_spot
                entry[match["alias"]] = {
                    "uninterruptablePrice": gpu.secure_price if secure else gpu.community_price,
                    "minimumBidPrice": spot if stock is not None else None,
                    "stockStatus": stock,
                    "minVcpu": 8 * count,
                    "minMemory": 62 * count,
                }
            gpu_types.append(entry)
        return httpx.Response(200, json={"data": {"gpuTypes": gpu_types}})

    def _create(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.create_bodies.append(body)
        if self._create_validator is not None:
            errors = [e.message for e in self._create_validator.iter_errors(body)]
            assert not errors, f"POST /pods body violates PodCreateInput: {errors}"
        if (injected := self._injected("create")) is not None:
            return injected
        gpu = next((g for g in self.catalogue if g.id in body["gpuTypeIds"]), None)
        count = int(body.get("gpuCount", 1))
        regions = body.get("dataCenterIds") or [None]
        if gpu is None or all(gpu.stock_in(r, count) is None for r in regions):
            return v1_error(500, f"create pod: {CAPACITY_MESSAGE}")
        secure = body.get("cloudType", "SECURE") == "SECURE"
        spot = bool(body.get("interruptible"))
        per_gpu = (
            (gpu.secure_spot if secure else gpu.community_spot)
            if spot
            else (gpu.secure_price if secure else gpu.community_price)
        )
        pod = self.add_pod(
            name=body["name"],
            env=dict(body.get("env", {})),
            image=body["imageName"],
            interruptible=spot,
            costPerHr=round((per_gpu or 0) * count, 4),
            adjustedCostPerHr=round((per_gpu or 0) * count, 4),
            gpu={"id": gpu.id, "count": count, "displayName": gpu.display_name},
            ports=list(body.get("ports", [])),
            dockerEntrypoint=list(body.get("dockerEntrypoint", [])),
            dockerStartCmd=list(body.get("dockerStartCmd", [])),
            containerDiskInGb=body.get("containerDiskInGb", 50),
        )
        if self.lose_create_answers > 0:
            self.lose_create_answers -= 1
            return v1_error(502, "bad gateway")
        return httpx.Response(201, json=_v1(pod))

    def _list(self, request: httpx.Request) -> httpx.Response:
        if (injected := self._injected("list")) is not None:
            return injected
        params = request.url.params
        pods = [
            pod
            for pod in self.pods.values()
            if all(
                key not in params or str(pod.get(key)) == params[key]
                for key in ("name", "desiredStatus", "id")
            )
        ]
        return httpx.Response(200, json=[_v1(pod) for pod in pods])

    def _get(self, request: httpx.Request, pod_id: str) -> httpx.Response:
        if (injected := self._injected("get")) is not None:
            return injected
        pod = self.pods.get(pod_id)
        if pod is None:
            return v1_error(404, "pod not found")
        return httpx.Response(200, json=_v1(pod))

    def _delete(self, request: httpx.Request, pod_id: str) -> httpx.Response:
        if (injected := self._injected("delete")) is not None:
            return injected
        if self.pods.pop(pod_id, None) is None:
            return v1_error(404, "pod not found")
        return httpx.Response(204)

    def _logs(self, request: httpx.Request, pod_id: str) -> httpx.Response:
        if (injected := self._injected("logs")) is not None:
            return injected
        if pod_id not in self.pods:
            return problem(404, "pod not found")
        tail = int(request.url.params.get("tail", "100"))
        lines = self.logs.get(pod_id, [])
        selected = lines[-tail:] if tail > 0 else []
        events = "".join(
            f"id: {ts}\ndata: {json.dumps({'ts': ts, 'source': 'container', 'line': line})}\n\n"
            for ts, line in selected
        )
        return httpx.Response(
            200, content=events.encode(), headers={"Content-Type": "text/event-stream"}
        )


async def _no_sleep(_seconds: float) -> None:
    return None


FAST_RETRIES = RetryPolicy(attempts=3, sleep=_no_sleep)


def make_config(key_file: Path, **overrides: Any) -> RunPodProviderConfig:
    data: JSON = {
        "type": "runpod",
        "name": "runpod-contract",
        "api_key": f"file:{key_file}",
        "rest_url": REST_URL,
        "graphql_url": GRAPHQL_URL,
        "logs_url": LOGS_URL,
        **overrides,
    }
    return RunPodProviderConfig.model_validate(data)


# Each native spelling sets these fields of the stored pod (the others are reset first).
_NATIVE: dict[str, tuple[JSON, InstanceState]] = {
    "RUNNING, runtime null": ({"desiredStatus": "RUNNING", "runtime": None}, InstanceState.PENDING),
    "RUNNING, runtime up": (
        {"desiredStatus": "RUNNING", "runtime": {"uptimeInSeconds": 12}},
        InstanceState.RUNNING,
    ),
    "RUNNING, initialising (no publicIp, no portMappings)": (
        {"desiredStatus": "RUNNING"},
        InstanceState.PENDING,
    ),
    "RUNNING, publicIp assigned, runtime not up yet": (
        {"desiredStatus": "RUNNING", "publicIp": "100.65.0.119", "portMappings": {"8000": 10341}},
        InstanceState.PENDING,
    ),
    "RUNNING, only HTTP ports and no public IP, runtime up": (
        {"desiredStatus": "RUNNING", "ports": ["8000/http"], "runtime": {"uptimeInSeconds": 40}},
        InstanceState.RUNNING,
    ),
    "EXITED": ({"desiredStatus": "EXITED"}, InstanceState.EXITED),
    "EXITED, interruptible": (
        {"desiredStatus": "EXITED", "interruptible": True},
        InstanceState.LOST,
    ),
    "TERMINATED (not by us)": ({"desiredStatus": "TERMINATED"}, InstanceState.LOST),
    "v2 PROVISIONING": (
        {"desiredStatus": "RUNNING", "status": "PROVISIONING"},
        InstanceState.PENDING,
    ),
    "v2 STARTING": ({"desiredStatus": "RUNNING", "status": "STARTING"}, InstanceState.PENDING),
    "v2 RUNNING": ({"desiredStatus": "RUNNING", "status": "RUNNING"}, InstanceState.RUNNING),
    "v2 EXITED": ({"desiredStatus": "EXITED", "status": "EXITED"}, InstanceState.EXITED),
    "v2 ERROR": ({"desiredStatus": "RUNNING", "status": "ERROR"}, InstanceState.LOST),
    "v2 TERMINATED": ({"desiredStatus": "TERMINATED", "status": "TERMINATED"}, InstanceState.LOST),
}
_RESET: JSON = {"publicIp": "", "portMappings": {}, "ports": [], "interruptible": False}
_DROPPED = ("runtime", "status")


class RunPodHarness:
    name = "runpod"
    native_states: Mapping[str, InstanceState] = {k: v[1] for k, v in _NATIVE.items()}
    failure_kinds: frozenset[FailureKind] = frozenset(
        {"capacity", "rate_limit", "transient", "auth", "invalid"}
    )

    def __init__(self) -> None:
        self.fake = FakeRunPod()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        self.fake = FakeRunPod()
        with tempfile.TemporaryDirectory(prefix="vk-runpod-") as tmp:
            key_file = Path(tmp) / "api-key"
            key_file.write_text(API_KEY + "\n")
            provider = RunPodProvider(
                make_config(key_file), transport=self.fake.transport(), retry=FAST_RETRIES
            )
            try:
                yield provider
            finally:
                await provider.close()

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        return WorkloadSpec(
            pod_uid=pod_uid,
            namespace="ns",
            pod_name="p",
            containers=(
                ContainerSpec(
                    name="c", image="ghcr.io/example/trainer:1", command=("python", "train.py")
                ),
            ),
            gpu_count=1,
            attempt=attempt,
        )

    async def offer(self, provider: Provider) -> Offer:
        return next(
            o
            for o in await provider.offers()
            if not o.spot and o.available > 0 and o.gpu_count == 1
        )

    def unknown_instance_id(self) -> str:
        # The v1 document's example Pod id; FakeRunPod makes only "fk…" ids. GET of it is the
        # documented 404 "Pod not found."; the fake's DELETE answers 404 too (the document
        # lists only 400 "Invalid Pod ID." there, which the adapter also takes as gone; see
        # tests/unit/test_runpod.py::test_400_on_a_pod_id_is_not_found).
        pod_id = "xedezhzb9la3ye"
        assert pod_id not in self.fake.pods
        return pod_id

    def add_foreign_instance(self) -> None:
        self.fake.add_pod(name="my jupyter notebook")
        # Named like ours, but its environment does not say so.
        self.fake.add_pod(name="vk-lookalike.0", env={"JUPYTER_PASSWORD": "x"})

    def set_native_state(self, instance_id: str, native: str) -> None:
        fields, _ = _NATIVE[native]
        pod = self.fake.pods[instance_id]
        for key in _DROPPED:
            pod.pop(key, None)
        pod.update(_RESET)
        pod.update(fields)

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        responses: dict[FailureKind, tuple[httpx.Response, int | None]] = {
            "capacity": (v1_error(500, f"create pod: {CAPACITY_MESSAGE}"), 1),
            "rate_limit": (problem(429, "rate limit exceeded", {"Retry-After": "1"}), None),
            "transient": (v1_error(503, "service unavailable"), None),
            "auth": (problem(401, "invalid bearer token"), 1),
            "invalid": (problem(422, "imageName: must not be empty"), 1),
        }
        response, times = responses[kind]
        self.fake.fail(operation, response, times=times)


HARNESS = RunPodHarness()
