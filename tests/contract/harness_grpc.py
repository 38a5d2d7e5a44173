"""Contract harness for the ``grpc`` provider type: the local adapter served over gRPC by a real
child process (`vk-provider plugin serve`) on a Unix socket, called through ``GrpcProvider``.

Every knob of the local harness (faults, a lost instance, a foreign directory) works as it
does in process: the plugin's local adapter reads the same state directory on every call.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

from tests.contract.harness import FailureKind
from tests.contract.harness_local import LocalHarness
from tests.plugin_process import PluginProcess, TLSMaterial, local_entry, tls_material
from vk_provider.domain.contract import Provider
from vk_provider_adapters.local.faults import set_faults
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig

OFFERS = [{"sku": "cpu", "price_per_hour": 0.1, "capacity": 8}]


_CREATE_ERRORS = {
    "capacity": "capacity",
    "rate_limit": "rate_limited",
    "transient": "transient",
    "auth": "auth",
}


class GrpcLocalHarness(LocalHarness):
    name = "grpc-unix"
    # The local adapter's injected create errors give every class, so each crosses the wire.
    failure_kinds: frozenset[FailureKind] = frozenset(
        {"capacity", "rate_limit", "transient", "auth", "invalid"}
    )

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        assert self._state_dir is not None
        if kind == "invalid":
            super().fail_next(kind, operation=operation)
            return
        set_faults(self._state_dir, fail_creates=1, create_error=_CREATE_ERRORS[kind])

    def _plugin(self, root: Path, state: Path) -> tuple[PluginProcess, dict[str, Any]]:
        plugin = PluginProcess(
            entry=local_entry("local-contract", state, OFFERS),
            root=root / "plugin",
            listen=f"unix://{root / 'plugin.sock'}",
        )
        return plugin, {}

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Provider]:
        with tempfile.TemporaryDirectory(prefix="vk-contract-grpc-") as tmp:
            root = Path(tmp)
            self._state_dir = root / "instances"
            plugin, client_settings = self._plugin(root, self._state_dir)
            address = plugin.start()
            provider = GrpcProvider(
                GrpcProviderConfig.model_validate(
                    {"type": "grpc", "name": "grpc-contract", "address": address} | client_settings
                )
            )
            try:
                await provider.start()
                yield provider
            finally:
                try:
                    for instance in await provider.list_ours():
                        await provider.delete(instance.instance_id, grace_seconds=0)
                finally:
                    await provider.close()
                    plugin.stop()


class GrpcTLSHarness(GrpcLocalHarness):
    """The same over TCP on 127.0.0.1 with TLS and a client certificate the server requires."""

    name = "grpc-tcp-tls"

    def _plugin(self, root: Path, state: Path) -> tuple[PluginProcess, dict[str, Any]]:
        tls: TLSMaterial = tls_material(root / "tls")
        plugin = PluginProcess(
            entry=local_entry("local-contract", state, OFFERS),
            root=root / "plugin",
            listen="127.0.0.1:0",
            tls=tls,
            require_client_cert=True,
        )
        client = {
            "tls": {
                "ca_file": str(tls.ca),
                "cert_file": str(tls.client.cert),
                "key_file": str(tls.client.key),
            }
        }
        return plugin, client


HARNESS = GrpcLocalHarness()
