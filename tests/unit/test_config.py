"""Configuration: every documented example is valid; each kind of mistake names its field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from vk_provider.runtime.registry import Registry
from vk_provider.settings.agent import AgentConfig
from vk_provider.settings.secrets import ConfigError, SecretRef

# Validation goes through the provider registry, as `check-config` and `run` do.
REGISTRY = Registry.default()
parse_config = REGISTRY.parse_config
load_config = REGISTRY.load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _yaml_blocks() -> list[dict[str, Any]]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOCS.read_text(), re.S)]


@pytest.mark.parametrize("block", _yaml_blocks(), ids=lambda b: str(list(b)))
def test_every_documented_example_is_valid(block: dict[str, Any]) -> None:
    assert isinstance(parse_config(block), AgentConfig)


def test_the_example_has_every_provider_type() -> None:
    types = {p["type"] for block in _yaml_blocks() for p in block.get("providers", [])}
    assert types == {"runpod", "lambda", "modal", "kubernetes", "local"}


def _base(**provider: Any) -> dict[str, Any]:
    return {"providers": [provider]}


RUNPOD = {"type": "runpod", "name": "rp", "api_key": "env:KEY"}
LAMBDA = {"type": "lambda", "name": "la", "api_key": "env:KEY", "ssh_key_name": "k"}
MODAL = {
    "type": "modal",
    "name": "mo",
    "token_id": "env:A",
    "token_secret": "env:B",
    "offers": [{"gpu": "H100", "price_per_hour": 4}],
}
KUBE = {"type": "kubernetes", "name": "k8s", "kubeconfig": "file:/etc/kc"}


@pytest.mark.parametrize(
    ("config", "field", "why"),
    [
        ({"providers": []}, "providers", "at least one provider"),
        (_base(**RUNPOD, extra=1), "providers[0].extra", "unknown key"),
        (_base(**{**RUNPOD, "api_key": "sk-live-123"}), "providers[0].api_key", "reference"),
        (_base(**{**RUNPOD, "cloud_type": "CHEAP"}), "providers[0].cloud_type", "SECURE"),
        (
            _base(**{k: v for k, v in LAMBDA.items() if k != "ssh_key_name"}),
            "providers[0].ssh_key_name",
            "Field required",
        ),
        (_base(**{**LAMBDA, "max_price_per_hour": -1}), "providers[0].max_price_per_hour", "0"),
        (
            _base(**{**MODAL, "offers": [{"gpu": "H100"}]}),
            "providers[0].offers[0].price_per_hour",
            "Field required",
        ),
        (
            _base(**{**MODAL, "sandbox_timeout_seconds": 5}),
            "providers[0].sandbox_timeout_seconds",
            "60",
        ),
        (_base(**{**KUBE, "kubeconfig": "/etc/kc"}), "providers[0].kubeconfig", "reference"),
        (
            _base(type="local", name="l", offers=[{"sku": "a"}]),
            "providers[0].offers[0].price_per_hour",
            "Field required",
        ),
        (
            _base(type="local", name="l", offers=[{"sku": "a", "price_per_hour": 1}] * 2),
            "providers[0].offers",
            "appears twice",
        ),
        ({"providers": [RUNPOD, RUNPOD]}, "providers", "more than once"),
        ({"providers": [RUNPOD], "node": {"name": "Not_A_Node"}}, "node.name", "DNS"),
        (
            {"providers": [RUNPOD], "kubelet_api": {"listen": "nowhere"}},
            "kubelet_api.listen",
            "host:port",
        ),
        (
            {"providers": [RUNPOD], "budget": {"namespaces": {"a": -1}}},
            "budget.namespaces",
            "zero or more",
        ),
        (
            {"providers": [{"type": "vast", "name": "v"}]},
            "providers[0].type",
            "unknown provider type 'vast'",
        ),
        ({"providers": [{"name": "v"}]}, "providers[0].type", "is required"),
    ],
)
def test_each_mistake_names_its_field(config: dict[str, Any], field: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(config)
    message = str(raised.value)
    assert any(line.startswith(f"{field}:") and why in line for line in message.splitlines()), (
        message
    )


def test_secret_refs_resolve_without_showing_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VK_TEST_KEY", "s3cret-value")
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert SecretRef.model_validate("env:VK_TEST_KEY").resolve() == "s3cret-value"
    assert SecretRef.model_validate(f"file:{key_file}").resolve() == "from-file"
    assert "s3cret" not in repr(parse_config(_base(**{**RUNPOD, "api_key": "env:VK_TEST_KEY"})))
    with pytest.raises(ConfigError, match="env:VK_MISSING: environment variable is not set"):
        SecretRef.model_validate("env:VK_MISSING").resolve()


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_base(**RUNPOD)))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_base(**{**RUNPOD, "api_key": "literal"})))
    ok = subprocess.run(
        [sys.executable, "-m", "vk_provider", "check-config", str(good)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    assert "valid" in ok.stdout
    refused = subprocess.run(
        [sys.executable, "-m", "vk_provider", "check-config", str(bad)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2
    assert "providers[0].api_key" in refused.stderr
    assert "literal" not in refused.stderr
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
