"""The ``grpc`` provider type's configuration and `vk-provider plugin serve`'s arguments: every
error names its field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vk_provider.runtime.registry import Registry
from vk_provider.settings.secrets import ConfigError
from vk_provider_adapters.plugin.address import parse_address


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


def _serve(tmp_path: Path, entry: object, *extra: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "entry.yaml"
    config.write_text(yaml.safe_dump(entry))
    return subprocess.run(
        [
            *(sys.executable, "-m", "vk_provider", "plugin", "serve", "--type", "local"),
            *("--config", str(config), "--state-dir", str(tmp_path / "state"), *extra),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("entry", "extra", "message"),
    [
        (
            {"name": "l", "enabled": True},
            ["--listen", "unix:///tmp/x.sock"],
            "offers: Field required",
        ),
        (
            {"name": "l", "type": "runpod"},
            ["--listen", "unix:///tmp/x.sock"],
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
    done = _serve(tmp_path, entry, *extra)
    assert done.returncode == 2, done.stderr + done.stdout
    assert message in " ".join((done.stderr + done.stdout).split())
