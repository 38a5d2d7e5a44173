"""Debian's ``nft`` (nftables' command line) for kube-proxy's nftables mode, never installed.

kube-proxy programs its rules by running ``nft`` (1.0.1 or newer). ``ensure_nft()`` returns it
from the version-keyed cache beside the other programs: ``debian.ensure_extracted`` of
``nftables`` (``cache_root()/nftables-<Debian version>/usr/sbin/nft``) and of each library
package it needs, directly or through another library, that is not installed here (on Debian
12 with iptables: ``libnftables1`` and ``libnftnl11``), each into a directory of its own keyed by
its version. ``Nft.environment()`` is what a process that runs it needs: ``PATH`` with nft's
directory first and ``LD_LIBRARY_PATH`` naming the extracted libraries.

Invariants:
- Everything ``debian.ensure_extracted`` promises (``apt-get download`` + ``dpkg -x``, a cache
  directory is complete or absent, package lists refreshed only when apt needs them); nothing
  is installed and no rule of this machine is read or changed: the check runs ``nft --version``.
- A set of extractions whose ``nft`` does not resolve every shared library, or does not run,
  is refused with the reason (``PackageUnavailable``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.binaries import Progress
from vk_provider_dev.cluster.flip import debian

PACKAGE: Final = "nftables"
NFT: Final = "usr/sbin/nft"


@dataclass(frozen=True, slots=True)
class Nft:
    """The extracted nft, its Debian version and the directories of its extracted libraries."""

    path: Path
    version: str
    library_path: str

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with nft first on PATH and its
        libraries on LD_LIBRARY_PATH."""
        env = dict(os.environ if base is None else base)
        env["PATH"] = os.pathsep.join(
            part for part in (str(self.path.parent), env.get("PATH", "/usr/bin:/bin")) if part
        )
        libraries = [self.library_path, env.get("LD_LIBRARY_PATH", "")]
        joined = os.pathsep.join(part for part in libraries if part)
        if joined:
            env["LD_LIBRARY_PATH"] = joined
        return env


def _ignore_progress(_phase: str, _done: int, _total: int) -> None:
    return None


def _installed(package: str) -> bool:
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return status.stdout.startswith("ii")


_NOT_DEPENDS: Final = ("recommends", "suggests", "conflicts", "breaks", "replaces", "enhances")


def dependency_tree(package: str) -> dict[str, list[str]]:
    """Each package of ``package``'s dependency closure -> the packages it depends on (first
    alternative only), from one ``apt-cache depends --recurse`` (apt here keeps no binary
    cache, so every apt-cache call reads all package lists: one call, not one per package)."""
    result = subprocess.run(
        ["apt-cache", "depends", "--recurse", *(f"--no-{kind}" for kind in _NOT_DEPENDS), package],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise debian.PackageUnavailable(
            f"apt-cache depends {package} failed: {result.stderr.strip()[-300:]}"
        )
    tree: dict[str, list[str]] = {}
    current: list[str] = []
    alternative = False  # the line before was "|Depends:": this one is a second choice
    for line in result.stdout.splitlines():
        if not line.startswith(" "):
            current = tree.setdefault(line.strip(), [])
            alternative = False
            continue
        kind, _, name = line.strip().partition(":")
        name = name.strip()
        first = not alternative
        alternative = kind.startswith("|")
        if first and kind.lstrip("|") in ("Depends", "PreDepends") and not name.startswith("<"):
            current.append(name.split(":")[0])
    return tree


def missing_libraries(package: str = PACKAGE) -> list[str]:
    """The library packages ``package`` needs, directly or not, that are not installed here."""
    tree = dependency_tree(package)
    missing: list[str] = []
    todo = list(tree.get(package, ()))
    while todo:
        name = todo.pop(0)
        if name in missing or not name.startswith("lib") or _installed(name):
            continue  # an installed package's own dependencies are installed too
        missing.append(name)
        todo += tree.get(name, ())
    return missing


def _library_dirs(root: Path) -> list[str]:
    return sorted({str(p.parent) for p in root.rglob("*.so*") if p.is_file()})


def _check(nft: Nft) -> None:
    env = nft.environment()
    linked = subprocess.run(
        ["ldd", str(nft.path)], capture_output=True, text=True, env=env, check=False
    )
    unresolved = [line.split()[0] for line in linked.stdout.splitlines() if "not found" in line]
    if unresolved:
        raise debian.PackageUnavailable(
            f"the extracted nft needs {', '.join(unresolved)}: apt-get install {PACKAGE} instead"
        )
    ran = subprocess.run(
        [str(nft.path), "--version"], capture_output=True, text=True, env=env, check=False
    )
    if ran.returncode != 0:
        raise debian.PackageUnavailable(f"{nft.path} --version failed: {ran.stderr.strip()}")


def ensure_nft(*, progress: Progress = _ignore_progress) -> Nft:
    """The cached nft and its libraries, extracted first if needed (module docstring)."""
    progress(f"Debian package {PACKAGE}", 0, 0)
    main = debian.ensure_extracted(PACKAGE)
    directories: list[str] = []
    for name in missing_libraries():
        progress(f"Debian package {name}", 0, 0)
        directories += _library_dirs(debian.ensure_extracted(name).root)
    nft = Nft(path=main.path(NFT), version=main.version, library_path=os.pathsep.join(directories))
    _check(nft)
    return nft
