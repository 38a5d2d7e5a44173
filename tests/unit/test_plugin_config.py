"""The ``grpc`` provider type's configuration and `vk-provider plugin serve`'s arguments: every
error names its field."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.plugin_process import PluginProcess, local_entry
from vk_provider.domain.models import Offer
from vk_provider.runtime.registry import Registry
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.plugin.address import parse_address
from vk_provider_adapters.plugin.client import GrpcProvider
from vk_provider_adapters.plugin.config import GrpcProviderConfig


def _config(provider: dict[str, object]) -> None:
    Registry.default().parse_config({"providers": [{"type": "grpc", "name": "plug", **provider}]})


def test_a_unix_socket_needs_nothing_else() -> None:
    _config({"address": "unix:///run/vk/plugin.sock"})


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ({}, "providers[0].address: Field required"),
        ({"address": "unix://relative.sock"}, "providers[0].address: "),
        ({"address": "http://plugin:80"}, "no other scheme"),
        ({"address": "plugin"}, "give unix:///path.sock or host:port"),
        ({"address": "plugin:99999"}, "the port must be a number 1-65535"),
        ({"address": "10.0.0.5:7443"}, "providers[0].tls: 10.0.0.5 is not a loopback host"),
        ({"address": "127.0.0.1:7443"}, "providers[0].tls: plain TCP"),
        ({"address": "localhost:7443"}, "set allow_insecure_loopback: true"),
        (
            {"address": "10.0.0.5:7443", "allow_insecure_loopback": True},
            "providers[0].tls: 10.0.0.5 is not a loopback host: TLS is required",
        ),
        (
            {"address": "unix:///x.sock", "tls": {"ca_file": "/ca.pem"}},
            "providers[0].tls: a Unix socket address takes no TLS",
        ),
        (
            {"address": "plugin:7443", "tls": {"ca_file": "/ca", "cert_file": "/c"}},
            "providers[0].tls: cert_file: give both cert_file and key_file",
        ),
        ({"address": "unix:///x.sock", "timeout_seconds": 0}, "providers[0].timeout_seconds"),
        ({"address": "unix:///x.sock", "colour": "red"}, "providers[0].colour: unknown key"),
    ],
)
def test_bad_entries_name_the_field(provider: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        _config(provider)
    assert message in str(raised.value)


def test_tls_and_an_insecure_loopback_are_accepted() -> None:
    _config({"address": "plugin.example:7443", "tls": {"ca_file": "/ca.pem"}})
    _config({"address": "[::1]:7443", "allow_insecure_loopback": True})
    assert parse_address("[::1]:7443").target == "[::1]:7443"
    assert parse_address("unix:/run/x.sock").target == "unix:///run/x.sock"
    assert parse_address("127.0.0.1:0", server=True).port == 0


def test_an_unreadable_tls_file_is_named_when_the_adapter_is_built(tmp_path: Path) -> None:
    registry = Registry.default()
    config = registry.parse_config(
        {
            "providers": [
                {
                    "type": "grpc",
                    "name": "plug",
                    "address": "plugin.example:7443",
                    "tls": {"ca_file": str(tmp_path / "missing.pem")},
                }
            ]
        }
    )
    with pytest.raises(ValueError, match=r"tls\.ca_file: cannot read"):
        registry.build(config.providers[0], state_dir=tmp_path)


def _serve(
    tmp_path: Path, entry: object, *extra: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "entry.yaml"
    config.write_text(yaml.safe_dump(entry))
    return subprocess.run(
        [
            *(sys.executable, "-m", "vk_provider", "plugin", "serve", "--type", "local"),
            *("--config", str(config), "--state-dir", str(tmp_path / "state"), *extra),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize(
    ("entry", "extra", "message"),
    [
        (
            {"name": "l", "enabled": True},
            ["--listen", "unix://{tmp}/x.sock"],
            "offers: Field required",
        ),
        (
            {"name": "l", "type": "runpod"},
            ["--listen", "unix://{tmp}/x.sock"],
            "type: the file says",
        ),
        ({"name": "l"}, ["--listen", "0.0.0.0:7443"], "--listen: 0.0.0.0:7443 is reachable"),
        ({"name": "l"}, ["--listen", "nowhere"], "--listen: "),
        ({"name": "l"}, ["--listen", "127.0.0.1:0", "--tls-cert", "/c"], "--tls-cert: give both"),
    ],
)
def test_plugin_serve_refuses_bad_input_with_exit_2_naming_the_field(
    tmp_path: Path, entry: object, extra: list[str], message: str
) -> None:
    done = _serve(tmp_path, entry, *(e.format(tmp=tmp_path) for e in extra))
    assert done.returncode == 2, done.stderr + done.stdout
    assert message in " ".join((done.stderr + done.stdout).split())


@pytest.mark.parametrize(
    ("listen", "extra", "message"),
    [
        ("127.0.0.1:0", [], "--listen: 127.0.0.1:0: plain TCP authenticates no caller"),
        ("localhost:0", ["--tls"], "--client-ca: localhost:0: TLS without a client CA"),
        ("0.0.0.0:7443", ["--tls"], "--client-ca: 0.0.0.0:7443: TLS without a client CA"),
        ("unix://{tmp}/open/p.sock", [], "writable by its group and others (0o777)"),
    ],
)
def test_plugin_serve_refuses_to_serve_without_client_auth_naming_the_flags(
    tmp_path: Path, listen: str, extra: list[str], message: str
) -> None:
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    for name in ("c.pem", "k.pem"):
        (tmp_path / name).write_text("not read: the flags are refused first\n")
    tls = ["--tls-cert", str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    flags = [f for e in extra for f in (tls if e == "--tls" else [e])]
    # A valid entry: only the listening options are wrong. (Before the fix, this served.)
    entry = local_entry("l", tmp_path / "instances", [{"sku": "cpu", "price_per_hour": 0.1}])
    done = _serve(tmp_path, entry, "--listen", listen.format(tmp=tmp_path), *flags, timeout=60)
    said = " ".join((done.stderr + done.stdout).split())
    assert done.returncode == 2, said
    assert message in said
    assert "--insecure" in said, "the way out is named"
    if not listen.startswith("unix"):
        assert "--client-ca" in said and "unix://" in said


def test_plugin_serve_insecure_serves_anyone_and_warns_at_start(tmp_path: Path) -> None:
    offers = [{"sku": "cpu", "price_per_hour": 0.1, "capacity": 1}]
    process = PluginProcess(
        entry=local_entry("l", tmp_path / "instances", offers),
        root=tmp_path / "plugin",
        listen="127.0.0.1:0",
        insecure=True,
    )
    address = process.start()
    try:
        client = GrpcProvider(
            GrpcProviderConfig.model_validate(
                {"type": "grpc", "name": "p", "address": address, "allow_insecure_loopback": True}
            )
        )
        # No credentials at all, and it is served: what --insecure means.
        assert [o.sku for o in asyncio.run(_offers_once(client))] == ["cpu"]
    finally:
        assert process.stop() == 0
    log = process.log_path.read_text()
    kit = " WARNING vk_provider_adapters.plugin.server: "
    (warning,) = [line for line in log.splitlines() if kit in line]
    assert "WITHOUT CLIENT AUTHENTICATION" in warning and address in warning


async def _offers_once(client: GrpcProvider) -> list[Offer]:
    try:
        return await client.offers()
    finally:
        await client.close()
