"""Contract harness for Lambda Cloud: the adapter against a stateful respx fake of the API.

``FakeLambda`` keeps instances, SSH keys and firewall rulesets in dicts and answers the
endpoints the adapter uses (instance types, launch, list, get, terminate, list and add SSH
keys, list, create and update firewall rulesets) with payloads shaped by the published
document (``lambda-cloud-openapi-1.8.3.json``). Every request the adapter sends, and every
documented response the fake gives, is validated against that document with openapi-core:
a request the real API would refuse fails the test where it is sent. ``fail`` injects the
API's real error shapes (and malformed bodies) for the next calls of one endpoint.

``FakeClock`` is simulated time for the adapter's rate limiter and retries: ``sleep``
advances the clock instead of waiting, so a 12 s launch spacing costs nothing.

``FakeVms`` is the adapter's SSH seam (``vk_provider_adapters.lambda_cloud.ssh.VmShell``) in memory:
what each VM's probe reports (by default: the container runs) and what its logs hold. The real SSH
path runs against a real OpenSSH server in ``tests/unit/test_lambda_ssh.py``.

The unit tests of the adapter (``tests/unit/test_lambda_cloud.py``) use the same fake.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import respx
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from openapi_core.testing import MockResponse
from werkzeug.datastructures import Headers, ImmutableMultiDict

from tests.contract.harness import FailureKind
from tests.fixtures import PROVIDER_APIS
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import NotFound
from vk_provider.domain.models import InstanceState, LogOptions, Offer, WorkloadSpec
from vk_provider_adapters.lambda_cloud.adapter import LambdaCloudProvider
from vk_provider_adapters.lambda_cloud.config import LambdaProviderConfig
from vk_provider_adapters.lambda_cloud.remote import ContainerReport, ContainerState, VmReport
from vk_provider_adapters.lambda_cloud.ssh import VmTarget
from vk_provider_adapters.transport import RetryPolicy

BASE_URL = "https://cloud.lambda.ai/api/v1"
API_KEY = "secret_vkprovider-test-key_0123456789abcdef"
SSH_KEY = "vk-test-key"
SPEC_NAME = "lambda-cloud-openapi-1.8.3.json"

Endpoint = Literal[
    "instance-types",
    "launch",
    "list",
    "get",
    "terminate",
    "ssh-keys",
    "add-ssh-key",
    "firewall-rulesets",
    "add-firewall-ruleset",
    "update-firewall-ruleset",
]


def spec_path() -> Path:
    """The published Lambda document, kept in tests/fixtures."""
    return PROVIDER_APIS / SPEC_NAME


@functools.cache
def openapi() -> OpenAPI | None:
    """The loaded document (once per process: loading takes about half a second)."""
    return OpenAPI.from_file_path(str(spec_path()))


class OpenAPIRequest:
    """An ``httpx.Request`` as openapi-core's ``Request`` protocol."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request
        self.parameters = RequestParameters(
            query=ImmutableMultiDict(list(request.url.params.multi_items())),
            header=Headers(list(request.headers.items())),
            cookie=ImmutableMultiDict(),
        )

    @property
    def host_url(self) -> str:
        return f"{self._request.url.scheme}://{self._request.url.netloc.decode()}"

    @property
    def path(self) -> str:
        return self._request.url.path

    @property
    def method(self) -> str:
        return self._request.method.lower()

    @property
    def body(self) -> bytes | None:
        return self._request.content or None

    @property
    def content_type(self) -> str:
        return str(self._request.headers.get("content-type", "application/json")).lower()


class FakeClock:
    """Simulated monotonic time: ``sleep`` advances it (and yields to other tasks)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


REGIONS: Mapping[str, str] = {
    "us-west-1": "California, USA",
    "us-east-1": "Virginia, USA",
    "us-south-1": "Texas, USA",
    "us-west-3": "Utah, USA",
    "europe-central-1": "Germany",
}


def instance_type(
    name: str,
    description: str,
    gpu_description: str,
    cents: int,
    *,
    vcpus: int,
    memory_gib: int,
    storage_gib: int,
    gpus: int,
) -> dict[str, Any]:
    """An ``InstanceType`` as the API returns it."""
    return {
        "name": name,
        "description": description,
        "gpu_description": gpu_description,
        "price_cents_per_hour": cents,
        "specs": {
            "vcpus": vcpus,
            "memory_gib": memory_gib,
            "storage_gib": storage_gib,
            "gpus": gpus,
        },
    }


def default_instance_types() -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Lambda's catalogue as the fake sells it: type → (InstanceType, regions with capacity)."""
    types = [
        (
            instance_type(
                "gpu_1x_a10", "1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75,
                vcpus=30, memory_gib=200, storage_gib=1400, gpus=1,
            ),
            ["us-west-1", "us-east-1"],
        ),
        (
            instance_type(
                "gpu_1x_h100_pcie", "1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 249,
                vcpus=26, memory_gib=200, storage_gib=1024, gpus=1,
            ),
            ["us-west-3"],
        ),
        (
            instance_type(
                "gpu_8x_h100_sxm5", "8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 2392,
                vcpus=208, memory_gib=1800, storage_gib=24780, gpus=8,
            ),
            ["us-south-1"],
        ),
        (
            instance_type(
                "gpu_1x_a100_sxm4", "1x A100 (40 GB SXM4)", "A100 (40 GB SXM4)", 129,
                vcpus=30, memory_gib=200, storage_gib=512, gpus=1,
            ),
            [],
        ),
        (
            instance_type(
                "gpu_8x_a100_80gb_sxm4", "8x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 1432,
                vcpus=240, memory_gib=1800, storage_gib=19500, gpus=8,
            ),
            ["us-east-1"],
        ),
        (
            instance_type(
                "gpu_1x_gh200", "1x GH200 (96 GB)", "GH200 (96 GB)", 149,
                vcpus=64, memory_gib=432, storage_gib=4096, gpus=1,
            ),
            ["us-west-1"],
        ),
        (
            instance_type(
                "gpu_1x_a6000", "1x A6000 (48 GB)", "A6000 (48 GB)", 80,
                vcpus=14, memory_gib=46, storage_gib=512, gpus=1,
            ),
            ["us-south-1", "europe-central-1"],
        ),
    ]  # fmt: skip
    return {kind["name"]: (kind, regions) for kind, regions in types}


def error_body(code: str, message: str, suggestion: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if suggestion is not None:
        error["suggestion"] = suggestion
    return {"error": error}


# The API's own error responses, by the harness's failure kinds.
FAILURES: Mapping[FailureKind, tuple[int, dict[str, Any], dict[str, str]]] = {
    "capacity": (
        400,
        error_body(
            "instance-operations/launch/insufficient-capacity",
            "Not enough capacity to fulfill launch request.",
        ),
        {},
    ),
    "rate_limit": (
        429,
        error_body("global/rate-limited", "Too many requests.", "Slow down."),
        {"Retry-After": "2"},
    ),
    "transient": (
        503,
        error_body("provider/internal-unavailable", "Provider unavailable", "Try again shortly"),
        {},
    ),
    "auth": (
        401,
        error_body(
            "global/invalid-api-key",
            "API key was invalid, expired, or deleted.",
            "Check your API key or create a new one, then try again.",
        ),
        {},
    ),
    "invalid": (
        400,
        error_body("global/invalid-parameters", "Invalid request data.", "Check the request."),
        {},
    ),
}


@dataclass
class Injected:
    """A canned answer for the next ``times`` calls of one endpoint (None: every call)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    times: int | None = 1


RUNNING = VmReport(
    phase="running",
    containers=(ContainerReport("app", "c", ContainerState("running", 0)),),
)


class FakeVms:
    """The VMs as the adapter's ``VmShell`` sees them (see the module docstring)."""

    def __init__(self) -> None:
        self.reports: dict[str, VmReport | Exception] = {}  # by instance id
        self.default: VmReport | Exception = RUNNING
        self.log_lines: dict[str, list[bytes]] = {}
        self.probes: list[tuple[VmTarget, str | None]] = []
        self.log_options: list[LogOptions] = []
        self.forgotten: list[str] = []
        self.closed = False

    def report(self, instance_id: str, report: VmReport | Exception) -> None:
        self.reports[instance_id] = report

    async def probe(self, target: VmTarget, *, passphrase: str | None) -> VmReport:
        self.probes.append((target, passphrase))
        answer = self.reports.get(target.instance_id, self.default)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def logs(self, target: VmTarget, options: LogOptions) -> AsyncIterator[bytes]:
        self.log_options.append(options)
        lines = self.log_lines.get(target.instance_id)
        if lines is None:
            raise NotFound(f"no container on {target.instance_id}")
        for line in lines:
            yield line

    async def forget(self, instance_id: str) -> None:
        self.forgotten.append(instance_id)

    async def close(self) -> None:
        self.closed = True


class FakeLambda:
    """A stateful fake of the parts of Lambda Cloud API 1.8.3 the adapter uses."""

    def __init__(self, *, validate: bool = True, clock: Callable[[], float] | None = None) -> None:
        self.types = default_instance_types()
        self.instances: dict[str, dict[str, Any]] = {}
        # By name; the agent's key is added by the adapter itself (POST /ssh-keys).
        self.ssh_keys: dict[str, dict[str, str]] = {}
        # By id: FirewallRuleset without instance_ids (computed from the instances).
        self.rulesets: dict[str, dict[str, Any]] = {}
        self.vms = FakeVms()
        self.requests: list[httpx.Request] = []
        # (endpoint, time on ``clock``) of every request, to check the adapter's spacing.
        self.times: list[tuple[Endpoint, float]] = []
        self._clock = clock
        self.launch_bodies: list[dict[str, Any]] = []
        self._injected: dict[Endpoint, list[Injected]] = {}
        self._validate = validate
        self._next_ip = 2
        self.router = respx.Router(assert_all_called=False)
        routes: list[tuple[str, str, Endpoint, Callable[..., httpx.Response]]] = [
            ("GET", "/instance-types", "instance-types", self._instance_types),
            ("POST", "/instance-operations/launch", "launch", self._launch),
            ("POST", "/instance-operations/terminate", "terminate", self._terminate),
            ("GET", "/instances", "list", self._list),
            ("GET", "/instances/(?P<instance_id>[^/]+)", "get", self._get),
            ("GET", "/ssh-keys", "ssh-keys", self._list_keys),
            ("POST", "/ssh-keys", "add-ssh-key", self._add_key),
            ("GET", "/firewall-rulesets", "firewall-rulesets", self._list_rulesets),
            ("POST", "/firewall-rulesets", "add-firewall-ruleset", self._add_ruleset),
            (
                "PATCH",
                "/firewall-rulesets/(?P<ruleset_id>[^/]+)",
                "update-firewall-ruleset",
                self._update_ruleset,
            ),
        ]
        for method, path, endpoint, handler in routes:
            pattern = "^" + BASE_URL.replace(".", r"\.") + path + "$"
            self.router.route(method=method, url__regex=pattern).mock(
                side_effect=self._handler(endpoint, handler)
            )
        self.transport = httpx.MockTransport(self.router.async_handler)

    # --- knobs ----------------------------------------------------------------------------

    def fail(
        self,
        endpoint: Endpoint,
        status: int,
        body: dict[str, Any] | bytes,
        *,
        headers: Mapping[str, str] | None = None,
        times: int | None = 1,
    ) -> None:
        """Answer the next ``times`` calls of ``endpoint`` (every call if None) with this."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._injected.setdefault(endpoint, []).append(
            Injected(status, raw, dict(headers or {}), times)
        )

    def clear_failures(self) -> None:
        self._injected.clear()

    def add_instance(
        self,
        *,
        name: str = "someone else's",
        tags: list[dict[str, str]] | None = None,
        status: str = "active",
        type_name: str = "gpu_1x_a10",
        region: str = "us-west-1",
    ) -> str:
        """Put an instance in the account directly (not through the adapter)."""
        instance_id = uuid.uuid4().hex
        self.instances[instance_id] = self._instance(
            instance_id,
            name=name,
            tags=tags or [],
            status=status,
            kind=self.types[type_name][0],
            region=region,
            firewall_rulesets=[],
        )
        return instance_id

    def calls(self, endpoint: Endpoint) -> list[httpx.Request]:
        return [r for r in self.requests if _endpoint(r) == endpoint]

    def add_ssh_key(self, name: str, public_key: str) -> None:
        self.ssh_keys[name] = {"id": uuid.uuid4().hex, "name": name, "public_key": public_key}

    def add_ruleset(self, name: str, region: str, rules: Sequence[Mapping[str, Any]] = ()) -> str:
        """Put a firewall ruleset in the account directly (not through the adapter)."""
        ruleset_id = uuid.uuid4().hex
        self.rulesets[ruleset_id] = {
            "id": ruleset_id,
            "name": name,
            "region": {"name": region, "description": REGIONS[region]},
            "rules": [dict(rule) for rule in rules],
            # Made one minute after the other, in order (FirewallRuleset.created: date-time).
            "created": f"2026-12-01T10:{len(self.rulesets):02d}:00Z",
        }
        return ruleset_id

    def ruleset(self, ruleset_id: str) -> dict[str, Any]:
        """A ruleset as the API answers it (``FirewallRuleset``, its instances included)."""
        instance_ids = [
            instance_id
            for instance_id, instance in self.instances.items()
            if {"id": ruleset_id} in instance["firewall_rulesets"]
        ]
        return {**self.rulesets[ruleset_id], "instance_ids": instance_ids}

    # --- handlers -------------------------------------------------------------------------

    def _handler(
        self, endpoint: Endpoint, handler: Callable[..., httpx.Response]
    ) -> Callable[..., httpx.Response]:
        def handle(request: httpx.Request, **params: str) -> httpx.Response:
            self.requests.append(request)
            if self._clock is not None:
                self.times.append((endpoint, self._clock()))
            document = openapi() if self._validate else None
            if document is not None:
                # Raises (and so fails the test) if the real API would refuse the request.
                document.validate_request(OpenAPIRequest(request))
            queue = self._injected.get(endpoint, [])
            if queue:
                injected = queue[0]
                if injected.times is not None:
                    injected.times -= 1
                    if injected.times <= 0:
                        queue.pop(0)
                return httpx.Response(
                    injected.status,
                    content=injected.body,
                    headers={"Content-Type": "application/json", **injected.headers},
                )
            response = handler(request, **params)
            if document is not None and response.status_code in (200, 400, 401, 403, 404):
                document.validate_response(
                    OpenAPIRequest(request),
                    MockResponse(response.content, status_code=response.status_code),
                )
            return response

        return handle

    def _instance_types(self, request: httpx.Request) -> httpx.Response:
        data = {
            name: {
                "instance_type": kind,
                "regions_with_capacity_available": [
                    {"name": region, "description": REGIONS[region]} for region in regions
                ],
            }
            for name, (kind, regions) in self.types.items()
        }
        return httpx.Response(200, json={"data": data})

    def _launch(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.launch_bodies.append(body)
        if body["ssh_key_names"][0] not in self.ssh_keys:
            return httpx.Response(
                404,
                json=error_body(
                    "global/object-does-not-exist",
                    f"SSH key {body['ssh_key_names'][0]!r} does not exist.",
                    "Check the name of the SSH key.",
                ),
            )
        for entry in body.get("firewall_rulesets", []):
            ruleset = self.rulesets.get(entry["id"])
            if ruleset is None or ruleset["region"]["name"] != body["region_name"]:
                return httpx.Response(
                    404,
                    json=error_body(
                        "global/object-does-not-exist",
                        f"Firewall ruleset {entry['id']!r} does not exist in this region.",
                        "Check the firewall ruleset ID and its region.",
                    ),
                )
        known = self.types.get(body["instance_type_name"])
        if known is None or body["region_name"] not in known[1]:
            return httpx.Response(400, json=FAILURES["capacity"][1])
        instance_id = uuid.uuid4().hex
        self.instances[instance_id] = self._instance(
            instance_id,
            name=body.get("name", ""),
            tags=body.get("tags", []),
            status="booting",
            kind=known[0],
            region=body["region_name"],
            firewall_rulesets=body.get("firewall_rulesets", []),
        )
        return httpx.Response(200, json={"data": {"instance_ids": [instance_id]}})

    def _terminate(self, request: httpx.Request) -> httpx.Response:
        ids = json.loads(request.content)["instance_ids"]
        missing = [i for i in ids if i not in self.instances]
        if missing:
            return httpx.Response(
                404,
                json=error_body(
                    "global/object-does-not-exist", "Specified instance does not exist."
                ),
            )
        terminated = []
        for instance_id in ids:
            # Gone at once: a later get is a 404, as it soon is on Lambda.
            instance = self.instances.pop(instance_id)
            terminated.append({**instance, "status": "terminating"})
        return httpx.Response(200, json={"data": {"terminated_instances": terminated}})

    def _list(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": list(self.instances.values())})

    def _list_keys(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": list(self.ssh_keys.values())})

    def _add_key(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["name"] in self.ssh_keys:
            return httpx.Response(
                400,
                json=error_body(
                    "global/invalid-parameters",
                    "An SSH key with this name already exists.",
                    "Choose another name.",
                ),
            )
        if "public_key" not in body:  # Lambda generates a pair; the adapter never asks it to
            raise AssertionError("the adapter asked Lambda to generate its private key")
        self.add_ssh_key(body["name"], body["public_key"])
        return httpx.Response(200, json={"data": self.ssh_keys[body["name"]]})

    def _list_rulesets(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": [self.ruleset(i) for i in self.rulesets]})

    def _add_ruleset(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        ruleset_id = self.add_ruleset(body["name"], body["region"], body["rules"])
        return httpx.Response(200, json={"data": self.ruleset(ruleset_id)})

    def _update_ruleset(self, request: httpx.Request, ruleset_id: str) -> httpx.Response:
        ruleset = self.rulesets.get(urllib.parse.unquote(ruleset_id))
        if ruleset is None:
            return httpx.Response(
                404,
                json=error_body(
                    "global/object-does-not-exist",
                    "Firewall ruleset does not exist or you do not have permission to access it.",
                    "Check your firewall ruleset ID and try again.",
                ),
            )
        body = json.loads(request.content)
        for key in ("name", "rules"):
            if key in body:
                ruleset[key] = body[key]
        return httpx.Response(200, json={"data": self.ruleset(ruleset["id"])})

    def _get(self, request: httpx.Request, instance_id: str) -> httpx.Response:
        instance = self.instances.get(urllib.parse.unquote(instance_id))
        if instance is None:
            return httpx.Response(
                404,
                json=error_body(
                    "global/object-does-not-exist", "Specified instance does not exist."
                ),
            )
        return httpx.Response(200, json={"data": instance})

    def _instance(
        self,
        instance_id: str,
        *,
        name: str,
        tags: list[dict[str, str]],
        status: str,
        kind: dict[str, Any],
        region: str,
        firewall_rulesets: list[dict[str, str]],
    ) -> dict[str, Any]:
        ip = f"198.51.100.{self._next_ip}"
        self._next_ip += 1
        available = {"available": True}
        return {
            "id": instance_id,
            "name": name,
            "ip": ip,
            "private_ip": f"10.0.2.{self._next_ip}",
            "status": status,
            "ssh_key_names": [SSH_KEY],
            "file_system_names": [],
            "region": {"name": region, "description": REGIONS[region]},
            "instance_type": kind,
            "hostname": ip.replace(".", "-"),
            "jupyter_token": uuid.uuid4().hex,
            "jupyter_url": f"https://jupyter-{instance_id}.lambdaspaces.com/",
            "actions": {
                action: available
                for action in ("migrate", "rebuild", "restart", "cold_reboot", "terminate")
            },
            "tags": tags,
            "firewall_rulesets": firewall_rulesets,
        }


def _endpoint(request: httpx.Request) -> Endpoint | None:
    path = request.url.path.removeprefix("/api/v1")
    if path == "/instance-types":
        return "instance-types"
    if path == "/instance-operations/launch":
        return "launch"
    if path == "/instance-operations/terminate":
        return "terminate"
    if path == "/instances":
        return "list"
    if path.startswith("/instances/"):
        return "get"
    if path == "/ssh-keys":
        return "ssh-keys" if request.method == "GET" else "add-ssh-key"
    if path == "/firewall-rulesets":
        return "firewall-rulesets" if request.method == "GET" else "add-firewall-ruleset"
    if path.startswith("/firewall-rulesets/") and request.method == "PATCH":
        return "update-firewall-ruleset"
    return None


def make_config(key_file: Path, **overrides: Any) -> LambdaProviderConfig:
    data: dict[str, Any] = {
        "type": "lambda",
        "name": "lambda-test",
        "api_key": f"file:{key_file}",
        "ssh_key_name": SSH_KEY,
        "base_url": BASE_URL,
    }
    data.update(overrides)
    return LambdaProviderConfig.model_validate(data)


def make_provider(
    fake: FakeLambda,
    clock: FakeClock,
    key_file: Path,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    retry: RetryPolicy | None = None,
    **overrides: Any,
) -> LambdaCloudProvider:
    """The adapter on ``fake`` and its ``FakeVms``; its SSH key is generated beside
    ``key_file`` (the API key's file)."""
    return LambdaCloudProvider(
        make_config(key_file, **overrides),
        transport=transport or fake.transport,
        clock=clock,
        sleep=clock.sleep,
        retry=retry
        or RetryPolicy(
            attempts=3, backoff_seconds=0.5, max_backoff_seconds=2.0, max_retry_after_seconds=10.0
        ),
        state_dir=key_file.parent / "state",
        vm_shell=fake.vms,
    )


def lines(*texts: str) -> Sequence[bytes]:
    return [f"{text}\n".encode() for text in texts]


class LambdaHarness:
    name = "lambda"
    native_states: Mapping[str, InstanceState] = {
        "booting": InstanceState.PENDING,
        "active": InstanceState.RUNNING,
        "unhealthy": InstanceState.RUNNING,
        "terminating": InstanceState.TERMINATING,
        "terminated": InstanceState.TERMINATED,
        "preempted": InstanceState.LOST,
    }
    failure_kinds: frozenset[FailureKind] = frozenset(
        {"capacity", "rate_limit", "transient", "auth", "invalid"}
    )

    def __init__(self) -> None:
        self._fake: FakeLambda | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        with tempfile.TemporaryDirectory(prefix="vk-contract-lambda-") as tmp:
            key_file = Path(tmp) / "api-key"
            key_file.write_text(API_KEY + "\n")
            clock = FakeClock()
            self._fake = FakeLambda(clock=clock)
            provider = make_provider(self._fake, clock, key_file)
            try:
                yield provider
            finally:
                await provider.close()
                self._fake = None

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        return WorkloadSpec(
            pod_uid=pod_uid,
            namespace="ns",
            pod_name="p",
            containers=(
                ContainerSpec(
                    name="c", image="nvidia/cuda:12.4.1-base-ubuntu22.04", command=("nvidia-smi",)
                ),
            ),
            gpu_count=1,
            attempt=attempt,
        )

    async def offer(self, provider: Provider) -> Offer:
        return next(o for o in await provider.offers() if o.sku == "gpu_1x_a10")

    def unknown_instance_id(self) -> str:
        # The document's example instance id (32 hex digits, the form the fake's uuid4 ids
        # take too); get and terminate of it answer 404 global/object-does-not-exist.
        instance_id = "0920582c7ff041399e34823a0be62549"
        assert instance_id not in self._require().instances
        return instance_id

    def add_foreign_instance(self) -> None:
        fake = self._require()
        fake.add_instance()
        # Looks like ours by name and carries our tag keys, but another agent made it.
        fake.add_instance(
            name="vk-uid-ours.0",
            tags=[
                {"key": "vk-provider:managed", "value": "true"},
                {"key": "vk-provider:provider", "value": "another-agent"},
                {"key": "vk-provider:pod-uid", "value": "uid-ours"},
                {"key": "vk-provider:request-id", "value": "uid-ours.0"},
            ],
        )

    def set_native_state(self, instance_id: str, native: str) -> None:
        self._require().instances[instance_id]["status"] = native

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        status, body, headers = FAILURES[kind]
        # 429 and 5xx keep failing until the adapter gives up; the others fail once.
        times = None if kind in ("rate_limit", "transient") else 1
        self._require().fail(
            "launch" if operation == "create" else "get",
            status,
            body,
            headers=headers,
            times=times,
        )

    def _require(self) -> FakeLambda:
        assert self._fake is not None, "use the harness inside running()"
        return self._fake


HARNESS = LambdaHarness()
