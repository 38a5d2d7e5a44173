"""Provider types are registered, built-ins and third-party alike; the config follows them.

The third-party adapter is ``tests/plugins/example-provider``, installed by the test command
as its own distribution: the agent knows it only through its entry point.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vk_provider.runtime.registry import BUILT_IN, ENTRY_POINT_GROUP, Registry
from vk_provider.settings.secrets import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "plugins" / "example-provider"
DOC = ROOT / "docs" / "adding-a-provider.md"


def test_built_ins_and_the_installed_plugin_are_registered() -> None:
    types = Registry.default().types
    assert {t.name for t in BUILT_IN} <= set(types)
    example = types["example"]  # from the entry point, not from any list in the agent
    assert example.settings.__module__ == "vk_provider_example.config"
    assert not any(t.name == "example" for t in BUILT_IN)


def test_the_agent_does_not_mention_the_plugin() -> None:
    sources = [*(ROOT / "vk_provider").rglob("*.py"), *(ROOT / "providers").rglob("*.py")]
    assert not [p for p in sources if "vk_provider_example" in p.read_text()]


def test_a_config_with_the_third_party_type_validates_and_builds(tmp_path: Path) -> None:
    registry = Registry.default()
    config = registry.parse_config(
        {"providers": [{"type": "example", "name": "mine", "price_per_hour": 0.5}]}
    )
    (entry,) = config.providers
    assert type(entry).__name__ == "ExampleSettings"
    provider = registry.build(entry, state_dir=tmp_path)
    assert provider.name == "mine"


def test_its_settings_errors_name_the_field() -> None:
    with pytest.raises(ConfigError) as raised:
        Registry.default().parse_config(
            {"providers": [{"type": "example", "name": "mine", "price_per_hour": -1, "x": 1}]}
        )
    lines = str(raised.value).splitlines()
    assert any(line.startswith("providers[0].price_per_hour:") for line in lines), lines
    assert "providers[0].x: unknown key" in lines


def test_check_config_accepts_it(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("providers:\n  - {type: example, name: mine}\n")
    done = subprocess.run(
        [sys.executable, "-m", "vk_provider", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "mine (example)" in done.stdout


def test_an_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        Registry.default().parse_config({"providers": [{"type": "acme", "name": "a"}]})
    message = str(raised.value)
    assert message.startswith("providers[0].type: unknown provider type 'acme'")
    assert "example" in message and "runpod" in message


def test_a_type_name_is_registered_once() -> None:
    registry = Registry(BUILT_IN)
    with pytest.raises(ConfigError, match=r"'runpod' .* already registered"):
        registry.add(BUILT_IN[2], origin="entry point acme:PROVIDER_TYPE")


def test_the_entry_point_group_is_the_documented_one() -> None:
    assert ENTRY_POINT_GROUP == "vk_provider.providers"
    assert f'"{ENTRY_POINT_GROUP}"' in (PLUGIN / "pyproject.toml").read_text()


@pytest.mark.parametrize(
    "name",
    [
        "pyproject.toml",
        "vk_provider_example/config.py",
        "vk_provider_example/adapter.py",
        "vk_provider_example/plugin.py",
    ],
)
def test_the_walkthrough_shows_the_real_files(name: str) -> None:
    shown = re.search(
        rf"`{re.escape(name)}`:\n\n```\w+\n(.*?)```", DOC.read_text(), flags=re.DOTALL
    )
    assert shown is not None, f"{name} is not shown in {DOC.name}"
    assert shown.group(1) == (PLUGIN / name).read_text()


def test_check_config_names_what_a_remote_cluster_must_have(tmp_path: Path) -> None:
    """The Kubernetes adapter never creates its remote namespace: check-config says so."""
    kubeconfig = tmp_path / "b.kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: b\n"
        "clusters: [{name: b, cluster: {server: 'https://cluster-b.test'}}]\n"
        "users: [{name: me, user: {token: t0ken}}]\n"
        "contexts: [{name: b, context: {cluster: b, user: me}}]\n"
    )
    path = tmp_path / "agent.yaml"
    entry = {"type": "kubernetes", "name": "burst", "kubeconfig": f"file:{kubeconfig}"}
    path.write_text(yaml.safe_dump({"providers": [{**entry, "namespace": "gpu-jobs"}]}))
    done = subprocess.run(
        [sys.executable, "-m", "vk_provider", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "note: providers[0] (burst): namespace 'gpu-jobs' must exist" in done.stdout
    assert "t0ken" not in done.stdout + done.stderr
