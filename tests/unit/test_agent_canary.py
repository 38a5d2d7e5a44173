"""No secret reaches an Event, a log line, the REST API or the metrics, through the agent.

The adapters' own canary tests drive every error path of each adapter and check what the
adapter raises and logs. These drive errors through the whole agent — pod controller,
placer, guarded provider, REST view, metrics — and look at everything the agent writes:

- with the RunPod adapter on its fake API (``tests/contract/harness_runpod.py``), whose every
  create fails with an answer that echoes the API key and the pod's secret env value in every
  form a server may use;
- with a deliberately careless adapter that puts the pod's secret env value, in every form,
  into its own error: the agent's second layer (``GuardedProvider`` redacting the spec's
  secrets) must remove it.
"""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import httpx
import pytest

from tests.contract.harness_runpod import FakeRunPod, make_config
from tests.unit import canary
from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider.api.rest import build_app
from vk_provider.api.rest_auth import StaticTokenAuth
from vk_provider.domain.errors import CapacityUnavailable
from vk_provider.domain.models import Instance, Offer, WorkloadSpec
from vk_provider_adapters.memory.adapter import MemoryProvider
from vk_provider_adapters.runpod.adapter import RunPodProvider
from vk_provider_adapters.transport import RetryPolicy

pytestmark = pytest.mark.looptime

TOKEN = "rest-token-for-the-canary-test"


def pod_with_secret() -> dict[str, object]:
    manifest = pod_manifest("leaky-env")
    container = manifest["spec"]["containers"][0]  # type: ignore[index]
    container["env"] = [
        {"name": "PLAIN", "value": "visible"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ]
    return manifest


def store_secret(core: Core) -> None:
    encoded = base64.b64encode(canary.SECRET.encode()).decode()
    core.kube.secrets[("ns", "hf")] = {"metadata": {"name": "hf"}, "data": {"token": encoded}}


async def everything_the_agent_wrote(core: Core, caplog: pytest.LogCaptureFixture) -> list[str]:
    app = build_app(view=core.view(), metrics=core.metrics, auth=StaticTokenAuth(TOKEN))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rest.test") as http:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        rest = [
            (await http.get(path, headers=headers)).text
            for path in ("/v1/providers", "/v1/pods", "/v1/offers", "/v1/spend")
        ]
        rest.append((await http.get("/metrics")).text)
    events = [e["message"] for e in core.kube.events]
    pods = [repr(core.kube.pod("ns", "leaky-env"))]
    logs = [r.getMessage() for r in caplog.records]
    return events + pods + rest + logs


async def test_runpod_errors_through_the_agent_leak_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    key_file = tmp_path / "runpod-key"
    key_file.write_text(canary.KEY + "\n")
    fake = FakeRunPod()
    echo = canary.echo()
    fake.fail("create", httpx.Response(500, json={"error": echo, "message": echo}), times=None)
    adapter = RunPodProvider(
        make_config(key_file, name="rp"),
        transport=fake.transport(),
        retry=RetryPolicy(attempts=2, backoff_seconds=0, max_backoff_seconds=0),
    )
    core = Core(adapter, guarded=True)
    store_secret(core)
    async with core.running():
        await core.kube.create_pod(pod_with_secret())
        await core.until(lambda: "ProviderCreateFailed" in core.kube.reasons(), what="refusal")
        written = await everything_the_agent_wrote(core, caplog)
    await adapter.close()
    assert any("rp refused offer" in text for text in written)  # the errors were written
    leaked = [(text[:100], canary.leaks(text)) for text in written if canary.leaks(text)]
    assert not leaked, leaked


class CarelessProvider(MemoryProvider):
    """An adapter that forgot to redact: its create error carries the spec's secrets."""

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        secrets = list(spec.secret_values)
        raise CapacityUnavailable(
            "sold out; request was " + canary.echo(secrets), provider=self.name
        )


async def leaked_through_a_careless_adapter(
    manifest: dict[str, object], caplog: pytest.LogCaptureFixture, **settings: object
) -> list[tuple[str, list[str]]]:
    """Run ``manifest`` through the careless adapter; what the agent wrote that still
    carries the pod's secret (after checking that the refusal was written, redacted)."""
    caplog.set_level(logging.DEBUG)
    base = memory_provider("careless", gpu_offer(), **settings)
    careless = CarelessProvider(base._config, clock=base._clock, wall_clock=base._wall)
    core = Core(careless, guarded=True)
    store_secret(core)
    async with core.running():
        await core.kube.create_pod(manifest)
        await core.until(lambda: "NoCapacity" in core.kube.reasons(), what="NoCapacity")
        written = await everything_the_agent_wrote(core, caplog)
    assert any("<redacted>" in text for text in written)  # the message was written, redacted
    return [
        (text[:100], canary.leaks(text, (canary.SECRET,)))
        for text in written
        if canary.leaks(text, (canary.SECRET,))
    ]


async def test_the_agent_redacts_a_pods_secrets_an_adapter_let_through(
    caplog: pytest.LogCaptureFixture,
) -> None:
    leaked = await leaked_through_a_careless_adapter(pod_with_secret(), caplog)
    assert not leaked, leaked


def pod_with_a_secret_in_every_kind_of_container() -> dict[str, object]:
    """A whole pod whose only secret env values are in an init container, a native sidecar
    and the second app container (the first app container has none)."""
    manifest = pod_manifest("leaky-env")
    spec = manifest["spec"]
    secret = {"valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}

    def container(name: str, **more: object) -> dict[str, object]:
        return {"name": name, "image": "img:1", "env": [{"name": "HF_TOKEN", **secret}], **more}

    spec["initContainers"] = [  # type: ignore[index]
        container("fetch", command=["fetch"]),
        container("proxy", command=["proxy"], restartPolicy="Always"),
    ]
    spec["containers"].append(container("exporter", command=["export"]))  # type: ignore[index]
    return manifest


async def test_the_agent_redacts_the_secrets_of_init_sidecar_and_every_app_container(
    caplog: pytest.LogCaptureFixture,
) -> None:
    manifest = pod_with_a_secret_in_every_kind_of_container()
    leaked = await leaked_through_a_careless_adapter(manifest, caplog, whole_pods=True)
    assert not leaked, leaked
