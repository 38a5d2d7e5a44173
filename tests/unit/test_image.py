"""The image's recipe agrees with the package: Dockerfile, requirements.lock and pyproject.toml.

No container engine runs here, so the image is never built in the tests; what can be checked
without one is checked: the base image is pinned by digest, every runtime dependency of
pyproject.toml is in the lock file at a version its specifier allows, every locked package is
hashed and needed (reached from pyproject.toml through the lock's ``# via`` lines), and the
Dockerfile installs exactly that lock file with ``--require-hashes``, as a non-root user.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "requirements.lock"
PROJECT = "vk-provider"


@dataclass
class Pin:
    name: str
    version: str
    hashes: list[str] = field(default_factory=list)
    via: set[str] = field(default_factory=set)


def _parse_lock(text: str) -> dict[str, Pin]:
    """``name==version [; marker] \\`` + ``--hash=`` lines + ``# via`` lines, as uv writes them."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    in_via = False
    for raw in text.splitlines():
        line = raw.strip()
        head = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", raw)
        if head:
            current = Pin(canonicalize_name(head.group(1)), head.group(2))
            pins[current.name] = current
            in_via = False
        elif current is not None and line.startswith("--hash=sha256:"):
            current.hashes.append(line.removeprefix("--hash=sha256:").rstrip(" \\"))
        elif current is not None and line.startswith("# via"):
            rest = line.removeprefix("# via").strip()
            in_via = not rest
            if rest:
                current.via.add(_via_name(rest))
        elif current is not None and in_via and line.startswith("#"):
            current.via.add(_via_name(line.lstrip("# ")))
    return pins


def _via_name(text: str) -> str:
    return canonicalize_name(text.split(" (", 1)[0].split()[0])


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


@pytest.fixture(scope="module")
def pins() -> dict[str, Pin]:
    return _parse_lock(LOCK.read_text())


def test_every_runtime_dependency_is_pinned_within_its_specifier(pins: dict[str, Pin]) -> None:
    for requirement in _runtime_requirements():
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement.name} is missing from requirements.lock"
        assert requirement.specifier.contains(pin.version, prereleases=True), (
            f"requirements.lock pins {pin.name}=={pin.version}, pyproject.toml wants "
            f"{requirement}: run scripts/lock"
        )
        assert PROJECT in pin.via, f"{pin.name} is not marked as wanted by pyproject.toml"


def test_every_pin_is_hashed_and_needed(pins: dict[str, Pin]) -> None:
    assert len(pins) > len(_runtime_requirements())  # transitive dependencies are locked too
    direct = {canonicalize_name(r.name) for r in _runtime_requirements()}
    for pin in pins.values():
        assert pin.hashes, f"{pin.name} has no --hash in requirements.lock"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in pin.hashes), pin.name
        assert pin.via, f"{pin.name} says nothing needs it"
        for parent in pin.via - {PROJECT}:
            assert parent in pins, f"{pin.name} is needed by {parent}, which is not locked"
        if PROJECT in pin.via:
            assert pin.name in direct, f"{pin.name} is wanted by pyproject.toml, which lacks it"
    # Every pin is reachable from pyproject.toml: nothing stale is left in the lock.
    reached = set(direct)
    while True:
        more = {p.name for p in pins.values() if p.via & reached} - reached
        if not more:
            break
        reached |= more
    assert set(pins) == reached, f"not needed by anything: {sorted(set(pins) - reached)}"


def test_the_dockerfile_pins_its_base_and_installs_the_lock_with_hashes() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^ARG BASE=(\S+)$", text, re.MULTILINE)
    assert base is not None, "the Dockerfile names its base image once, as ARG BASE"
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64}", base.group(1))
    froms = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert froms and all(f == "${BASE}" for f in froms), froms
    installs = [line for line in text.splitlines() if "pip install" in line]
    locked = [line for line in installs if "-r requirements.lock" in line]
    assert len(locked) == 1 and "--require-hashes" in locked[0]
    # The package itself adds nothing unhashed: no dependencies, the base image's setuptools.
    rest = [line for line in installs if line not in locked]
    assert rest and all("--no-deps" in line and "--no-build-isolation" in line for line in rest)
    assert "COPY requirements.lock" in text


def test_the_image_runs_as_a_non_root_user_with_a_state_volume() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":", 1)[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so runAsNonRoot can verify it
    assert "VK_PROVIDER_STATE_DIR=/var/lib/vk-provider" in text
    assert 'VOLUME ["/var/lib/vk-provider"]' in text


def test_the_lock_parser_sees_what_it_must() -> None:
    """A lock missing a hash or a dependency is caught: the checks above can fail."""
    sample = (
        "fastapi==0.115.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
        "    # via vk-provider (pyproject.toml)\n"
        "starlette==0.40.0 ; python_version >= '3.8'\n    # via\n    #   fastapi\n    #   other\n"
    )
    parsed = _parse_lock(sample)
    assert parsed["fastapi"].hashes == ["a" * 64]
    assert parsed["fastapi"].via == {PROJECT}
    assert parsed["starlette"].hashes == []
    assert parsed["starlette"].via == {"fastapi", "other"}
