"""A configuration file that cannot be read as bounded UTF-8 YAML is a configuration error.

Not UTF-8, too large, nested too deep, aliases that expand too far or into themselves, a value
the YAML loader cannot build: `check-config FILE` and `run --config FILE` each say what is
wrong, naming the file, and exit 2 (docs/reference.md#exit-codes), never a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from vk_provider.settings import configfile
from vk_provider.settings.configfile import read_yaml
from vk_provider.settings.secrets import ConfigError

# The limits docs/configuration.md states (its first paragraph).
MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64
MAX_VALUES = 100_000
PROVIDER = "providers:\n  - {type: local, name: dev, offers: [{sku: a, price_per_hour: 1}]}\n"


def _nested(depth: int) -> str:
    return "node: {labels: {}}\nx: " + "[" * depth + "]" * depth + "\n"


def _laughs() -> str:
    """Nine aliases a level, nine levels: 9**9 values from 342 bytes."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return PROVIDER + "\n".join(lines) + "\n"


def _alias_chain(length: int) -> str:
    """Each list holds the one before: shallow in the text, ``length`` deep once expanded."""
    lines = ["c0: &c0 [leaf]"]
    lines += [f"c{i}: &c{i} [*c{i - 1}]" for i in range(1, length)]
    return PROVIDER + "\n".join(lines) + "\n"


CASES: dict[str, tuple[Callable[[], bytes], list[str]]] = {
    "latin-1": (
        lambda: "providers:\n  - {type: local, name: d\xe9v}\n".encode("latin-1"),
        ["not UTF-8", "byte 0xe9 at offset 36"],
    ),
    "utf-16": (
        lambda: PROVIDER.encode("utf-16"),
        ["not UTF-8", "byte 0xff at offset 0"],
    ),
    "10000 nested lists": (
        lambda: _nested(10_000).encode(),
        [f"nested deeper than {MAX_DEPTH} levels", "line 2, column"],
    ),
    "too large": (
        lambda: (PROVIDER + "#" * MAX_BYTES + "\n").encode(),
        [f"larger than {MAX_BYTES} bytes"],
    ),
    "billion laughs": (
        lambda: _laughs().encode(),
        [f"more than {MAX_VALUES} values once its aliases are expanded"],
    ),
    "alias chain": (
        lambda: _alias_chain(200).encode(),
        [f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded"],
    ),
    "alias into itself": (
        lambda: (PROVIDER + "x: &x [*x]\n").encode(),
        [f"nested deeper than {MAX_DEPTH} levels once its aliases are expanded"],
    ),
    "impossible date": (
        lambda: (PROVIDER + "node: {name: 2020-13-45}\n").encode(),
        ["not valid YAML", "month must be in 1..12", "line 3"],
    ),
    "5000-digit integer": (
        lambda: (PROVIDER + "workers: " + "1" * 5000 + "\n").encode(),
        ["not valid YAML", "4300 digits", "line 3"],
    ),
}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vk_provider", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=os.environ.copy(),
    )


# `run` reads the file with the same load_config: a few of the cases show it (each run of the
# CLI costs a second or two).
RUNS = [(case, "check-config") for case in CASES] + [
    (case, "run") for case in ("latin-1", "10000 nested lists", "billion laughs")
]


@pytest.mark.parametrize(("case", "command"), RUNS)
def test_a_bad_file_is_a_configuration_error(tmp_path: Path, case: str, command: str) -> None:
    make, expected = CASES[case]
    path = tmp_path / "agent.yaml"
    path.write_bytes(make())
    args = [command, str(path)] if command == "check-config" else ["run", "--config", str(path)]
    result = _cli(*args, "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr + result.stdout
    assert "Error:" not in result.stderr  # neither a traceback nor an exception's name
    message = " ".join(result.stderr.split())  # the console may wrap long lines
    assert f"{path}:" in message
    for part in expected:
        assert part in message, (part, result.stderr)


def test_the_limits_are_the_documented_ones() -> None:
    assert (configfile.MAX_BYTES, configfile.MAX_DEPTH, configfile.MAX_VALUES) == (
        MAX_BYTES,
        MAX_DEPTH,
        MAX_VALUES,
    )


def test_anchors_shared_by_two_providers_load(tmp_path: Path) -> None:
    shared = tmp_path / "shared.yaml"
    shared.write_text(
        "offers: &offers [{sku: a, price_per_hour: 1}]\n"
        "providers:\n"
        "  - {type: local, name: one, offers: *offers}\n"
        "  - {type: local, name: two, offers: *offers}\n"
    )
    data = read_yaml(shared)
    assert isinstance(data, dict)
    assert data["providers"][1]["offers"] == [{"sku": "a", "price_per_hour": 1}]


def test_the_deepest_nesting_allowed_loads(tmp_path: Path) -> None:
    """The top-level mapping is the first of the ``MAX_DEPTH`` levels."""
    deepest = tmp_path / "deep.yaml"
    deepest.write_text("x: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n")
    assert isinstance(read_yaml(deepest), dict)
    deepest.write_text("x: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n")
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_DEPTH} levels"):
        read_yaml(deepest)


def test_too_many_values_without_aliases_stop_while_composing(tmp_path: Path) -> None:
    many = tmp_path / "many.yaml"
    many.write_text("[" + "1, " * MAX_VALUES + "]\n")
    with pytest.raises(ConfigError, match=f"more than {MAX_VALUES} values \\(line 1, column"):
        read_yaml(many)


def test_a_file_of_the_largest_size_loads_and_a_byte_order_mark_is_utf8(tmp_path: Path) -> None:
    full = tmp_path / "full.yaml"
    full.write_bytes(b"a: 1\n#" + b"#" * (MAX_BYTES - 7) + b"\n")
    assert full.stat().st_size == MAX_BYTES
    assert read_yaml(full) == {"a": 1}
    bom = tmp_path / "bom.yaml"
    bom.write_bytes(b"\xef\xbb\xbfa: 1\n")
    assert read_yaml(bom) == {"a": 1}
    with pytest.raises(ConfigError, match="cannot read"):
        read_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: Pod\nx: " + "[" * 100 + "]" * 100 + "\n", "nested deeper than 64 levels"),
        (_laughs(), "more than 100000 values"),
    ],
    ids=["deep", "laughs"],
)
def test_a_pod_manifest_is_bounded_like_a_configuration_file(text: str, says: str) -> None:
    from vk_provider.cli.manifests import ManifestError, pod_from_manifest

    with pytest.raises(ManifestError, match=says):
        pod_from_manifest(text, where="standard input")


def test_a_manifest_file_that_is_not_utf8_names_the_byte(tmp_path: Path) -> None:
    from vk_provider.cli.manifests import ManifestError, read_manifest

    path = tmp_path / "pod.yaml"
    path.write_bytes(b"kind: Pod\nmetadata: {name: \xff}\n")
    with pytest.raises(ManifestError, match=r"pod.yaml: not UTF-8: byte 0xff at offset 27"):
        read_manifest(str(path))


def test_several_documents_each_within_bounds_still_parse() -> None:
    assert configfile.parse_yaml_all("a: 1\n---\n---\nb: [2]\n") == [{"a": 1}, None, {"b": [2]}]


def test_a_kubeconfig_past_the_bounds_says_which_without_its_content() -> None:
    from vk_provider_adapters.kubernetes.kubeconfig import KubeconfigError, load_kubeconfig

    text = "current-context: secret-value-here\nx: " + "[" * 100 + "]" * 100 + "\n"
    with pytest.raises(KubeconfigError, match="nested deeper than 64") as caught:
        load_kubeconfig(text)
    assert "secret-value-here" not in str(caught.value)
