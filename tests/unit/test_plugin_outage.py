"""A plugin process that dies: the client's calls fail as ``Transient`` (what the breaker and
the pods treat as a provider outage) and succeed again once the plugin is back, with the
instances it had. Real processes: `vk-provider plugin serve` of the local adapter, SIGKILLed."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.integration.agent_harness import reap_runners
from tests.plugin_process import PluginProcess, local_entry, tls_material
from vk_provider.domain.containers import ContainerSpec
from vk_provider.domain.errors import ProviderError, Transient
from vk_provider.domain.models import InstanceState, LogOptions, WorkloadSpec
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig

OFFERS = [{"sku": "cpu", "price_per_hour": 0.1, "capacity": 4}]


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[PluginProcess]:
    process = PluginProcess(
        entry=local_entry("local-x", tmp_path / "instances", OFFERS),
        root=tmp_path / "plugin",
        listen=f"unix://{tmp_path / 'plugin.sock'}",
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()
        reap_runners(tmp_path)


def _client(plugin: PluginProcess) -> GrpcProvider:
    return GrpcProvider(
        GrpcProviderConfig.model_validate(
            {
                "type": "grpc",
                "name": "out-of-process",
                "address": plugin.address,
                "timeout_seconds": 5,
            }
        )
    )


async def test_a_killed_plugin_fails_calls_as_transient_and_recovers_on_restart(
    plugin: PluginProcess,
) -> None:
    client = _client(plugin)
    try:
        await client.start()
        assert client.capabilities.multi_container and not client.capabilities.exec
        spec = WorkloadSpec(
            pod_uid="uid-kill",
            namespace="ns",
            pod_name="p",
            containers=(
                ContainerSpec(
                    name="c",
                    image="example/image:1",
                    command=(
                        sys.executable,
                        "-c",
                        "print('hello', flush=True); import time; time.sleep(120)",
                    ),
                ),
            ),
        )
        (offer,) = await client.offers()
        # The agent knows the provider by its configured name; the plugin by its own.
        assert offer.provider == "out-of-process" and client.plugin_name == "local-x"
        created = await client.create(spec, offer)
        assert created.provider == "out-of-process"
        assert created.offer_key == offer.key == "out-of-process/cpu/local"

        async def running() -> bool:
            return (await client.get(created.instance_id)).state is InstanceState.RUNNING

        await wait_for(running, timeout=60, what="instance running")

        plugin.kill()
        for call in (client.offers(), client.get(created.instance_id), client.list_ours()):
            with pytest.raises(Transient, match="plugin at unix://"):
                await call
        with pytest.raises(Transient):
            async for _ in client.logs(created.instance_id, LogOptions()):
                pass

        plugin.start()  # the same socket, the same state directory

        async def answers() -> bool:
            try:
                return (await client.get(created.instance_id)).state is InstanceState.RUNNING
            except ProviderError:
                return False

        # The channel reconnects by itself; the container outlived the plugin.
        await wait_for(answers, timeout=60, what="the client to reach the restarted plugin")
        lines = [c async for c in client.logs(created.instance_id, LogOptions())]
        assert lines == [b"hello\n"]
        assert [i.instance_id for i in await client.list_ours()] == [created.instance_id]
        await client.delete(created.instance_id, grace_seconds=0)
    finally:
        await client.close()


async def test_tls_refuses_a_client_without_the_certificate_or_trusting_another_ca(
    tmp_path: Path,
) -> None:
    tls = tls_material(tmp_path / "tls")
    process = PluginProcess(
        entry=local_entry("local-tls", tmp_path / "instances", OFFERS),
        root=tmp_path / "plugin",
        listen="127.0.0.1:0",
        tls=tls,
        require_client_cert=True,
    )
    process.start()
    try:

        def client(tls_settings: dict[str, str]) -> GrpcProvider:
            return GrpcProvider(
                GrpcProviderConfig.model_validate(
                    {"type": "grpc", "name": "t", "address": process.address}
                    | {"tls": tls_settings, "timeout_seconds": 5}
                )
            )

        good = {"ca_file": str(tls.ca), "cert_file": str(tls.client.cert)}
        good["key_file"] = str(tls.client.key)
        for refused in ({"ca_file": str(tls.ca)}, {**good, "ca_file": str(tls.other_ca)}):
            caller = client(refused)
            try:
                with pytest.raises(Transient, match="UNAVAILABLE"):
                    await caller.offers()
            finally:
                await caller.close()
        caller = client(good)
        try:
            assert [o.sku for o in await caller.offers()] == ["cpu"]
        finally:
            await caller.close()
        assert process.stop() == 0, "SIGTERM stops `plugin serve` cleanly"
    finally:
        process.stop()
