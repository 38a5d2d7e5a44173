"""Configuration: every documented example is valid; each kind of mistake names its field."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
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
    assert types == {"runpod", "lambda", "modal", "kubernetes", "local", "grpc"}


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
            {"providers": [RUNPOD], "kubelet_api": {"serving": {"source": "acme"}}},
            "kubelet_api.serving.source",
            "'self-signed' or 'cluster'",
        ),
        (
            {
                "providers": [RUNPOD],
                "kubelet_api": {"serving": {"source": "cluster"}, "tls_cert_file": "/c.pem"},
            },
            "kubelet_api",
            "exclude each other",
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
        (
            {"providers": [RUNPOD], "identity": {"mode": "root"}},
            "identity.mode",
            "'serviceAccount' or 'node'",
        ),
        (
            {"providers": [RUNPOD], "identity": {"certificate_seconds": 60}},
            "identity.certificate_seconds",
            "600",
        ),
        (
            {"providers": [RUNPOD], "identity": {"renew_fraction": 1}},
            "identity.renew_fraction",
            "0.9",
        ),
        (
            {"providers": [RUNPOD], "leader_election": {"renew_deadline_seconds": 15}},
            "leader_election.renew_deadline_seconds",
            "less than lease_duration_seconds (15)",
        ),
        (
            {"providers": [RUNPOD], "leader_election": {"retry_period_seconds": 10}},
            "leader_election.retry_period_seconds",
            "less than renew_deadline_seconds (10)",
        ),
        (
            {"providers": [RUNPOD], "leader_election": {"namespace": "Kube_System"}},
            "leader_election.namespace",
            "DNS label",
        ),
        (
            {"providers": [RUNPOD], "node": {"name": "n" * 240}},
            "leader_election.lease_name",
            "longer than 253",
        ),
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
        env={**os.environ, "KEY": "rp-key-value"},
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


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vk_provider", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "KEY"} | (env or {}),
    )


def test_check_config_runs_the_checks_run_does_before_the_cluster(tmp_path: Path) -> None:
    """A missing credential, a local provider not enabled, unreadable TLS files: run would
    stop on each before it talks to a cluster, so check-config reports each, naming it."""
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "providers": [
                    RUNPOD,
                    {"type": "local", "name": "dev", "offers": [{"sku": "a", "price_per_hour": 1}]},
                ],
                "kubelet_api": {"tls_cert_file": "/nope/cert.pem", "tls_key_file": "/nope/k"},
                "rest": {"static_token": "env:VK_NO_SUCH_TOKEN"},
            }
        )
    )
    checked = _cli("check-config", str(config), "--state-dir", str(tmp_path / "state"))
    assert checked.returncode == 2, checked.stdout
    lines = checked.stderr.splitlines()
    expected = [
        "providers[0] (rp, type runpod): credential env:KEY: environment variable is not set",
        "providers[1] (dev, type local):",
        "kubelet_api.tls_cert_file: cannot read /nope/cert.pem",
        "rest.static_token: credential env:VK_NO_SUCH_TOKEN: environment variable is not set",
    ]
    for start in expected:
        assert any(line.startswith(start) for line in lines), (start, lines)
    assert "enabled: true" in checked.stderr
    # `run` refuses with the same lines, exit 2, and never reaches for a cluster.
    ran = _cli(
        "run",
        "--config",
        str(config),
        "--kubeconfig",
        str(tmp_path / "no-such-kubeconfig"),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert ran.returncode == 2, ran.stderr
    for start in expected:
        assert any(line.startswith(start) for line in ran.stderr.splitlines()), start
    assert "kubeconfig" not in ran.stderr


@pytest.mark.parametrize(
    ("provider", "field"),
    [
        ({**RUNPOD, "name": "RunPod"}, "providers[0].name"),
        ({**RUNPOD, "name": "run_pod"}, "providers[0].name"),
        ({**RUNPOD, "name": "-rp"}, "providers[0].name"),
        ({**RUNPOD, "max_price_per_hour": float("inf")}, "providers[0].max_price_per_hour"),
        ({**RUNPOD, "max_price_per_hour": float("nan")}, "providers[0].max_price_per_hour"),
    ],
)
def test_names_are_dns_labels_and_numbers_finite(provider: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(_base(**provider))
    assert any(line.startswith(f"{field}:") for line in str(raised.value).splitlines())


def test_an_infinite_budget_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"budget\.global_per_hour"):
        parse_config({"providers": [RUNPOD], "budget": {"global_per_hour": float("inf")}})


@pytest.mark.parametrize(
    ("url", "allowed", "fine"),
    [
        ("https://rest.runpod.io/v1", False, True),
        ("http://rest.runpod.io/v1", False, False),
        ("http://rest.runpod.io/v1", True, False),  # loopback only, whatever the flag says
        ("http://127.0.0.1:8080/v1", False, False),  # loopback, but the config must say so
        ("http://127.0.0.1:8080/v1", True, True),
        ("http://[::1]:8080/v1", True, True),
        ("http://localhost:8080/v1", True, True),
        ("ftp://rest.runpod.io", True, False),
        ("rest.runpod.io/v1", False, False),
    ],
)
def test_credentials_travel_only_over_https(url: str, allowed: bool, fine: bool) -> None:
    provider = {**RUNPOD, "rest_url": url, "allow_insecure_loopback": allowed}
    if fine:
        parse_config(_base(**provider))
        return
    with pytest.raises(ConfigError) as raised:
        parse_config(_base(**provider))
    assert str(raised.value).startswith("providers[0].rest_url: "), str(raised.value)


# --------------------------------------------------------------------------- the JSON Schema


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return REGISTRY.config_schema()


def test_the_schema_accepts_every_documented_example(schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    validator.check_schema(schema)
    for block in _yaml_blocks():
        errors = [e.message for e in validator.iter_errors(block)]
        assert not errors, (list(block), errors)


def test_the_schema_has_every_installed_provider_type_told_apart_by_type(
    schema: dict[str, Any],
) -> None:
    items = schema["properties"]["providers"]["items"]
    assert items["discriminator"]["propertyName"] == "type"
    assert set(items["discriminator"]["mapping"]) == set(REGISTRY.types)
    runpod = schema["$defs"]["RunPodProviderConfig"]
    assert runpod["properties"]["type"]["const"] == "runpod"
    assert runpod["additionalProperties"] is False
    # A credential is a reference string, as it is written in YAML.
    assert schema["$defs"]["SecretRef"]["type"] == "string"


@pytest.mark.parametrize(
    "config",
    [
        {"providers": [{**RUNPOD, "extra": 1}]},
        {"providers": [{**RUNPOD, "api_key": "a-literal-key"}]},
        {"providers": [{"type": "nope", "name": "x"}]},
        {"providers": []},
        {"providers": [RUNPOD], "nodes": {}},
        {"providers": [RUNPOD], "intervals": {"lease_seconds": "soon"}},
    ],
)
def test_the_schema_refuses_what_parse_config_refuses(
    schema: dict[str, Any], config: dict[str, Any]
) -> None:
    with pytest.raises(ConfigError):
        parse_config(config)
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(config))


def test_config_schema_prints_it_and_check_config_points_to_it(tmp_path: Path) -> None:
    printed = _cli("config", "schema")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["title"] == "vk-provider agent configuration"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_base(**{**RUNPOD, "extra": 1})))
    refused = _cli("check-config", str(bad))
    assert refused.returncode == 2
    assert "providers[0].extra: unknown key" in refused.stderr
    assert "vk-provider config schema" in refused.stderr


def test_leader_election_defaults_fit_a_two_replica_deployment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    election = parse_config({"providers": [RUNPOD]}).leader_election
    assert election.enabled
    assert election.timing.lease_duration == 15 and election.timing.renew_deadline == 10
    assert election.timing.retry_period == 2
    assert election.name_for("vk-gpu") == "vk-provider-leader-vk-gpu"
    monkeypatch.setenv("POD_NAMESPACE", "vk-provider")
    assert election.resolved_namespace() == "vk-provider"


@pytest.mark.parametrize(
    ("kubelet_api", "source"),
    [
        ({}, "cluster"),
        ({"serving": {"source": "self-signed"}}, "self-signed"),
        ({"tls_cert_file": "/c.pem", "tls_key_file": "/k.pem"}, "files"),
    ],
)
def test_the_serving_certificate_is_cluster_signed_unless_configured_otherwise(
    kubelet_api: dict[str, Any], source: str
) -> None:
    config = parse_config({"providers": [RUNPOD], "kubelet_api": kubelet_api})
    assert config.kubelet_api.serving_source == source
