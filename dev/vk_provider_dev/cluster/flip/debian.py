"""Programs from Debian packages, extracted into a version-keyed cache, never installed.

``ensure_extracted(package)`` returns the extracted root of ``package`` at the version apt
would install, from ``cache_root()/<package>-<version>/`` (``:`` in a version becomes ``_``),
filling it on first use: ``apt-get download`` of the package (and, when asked, of its ``lib*``
dependencies that are not installed here), ``dpkg -x`` of each into a temporary directory, an
optional check of the result, then one rename into the cache. Nothing is installed, no
maintainer script runs, no service starts.

Invariants:
- A cache directory exists only when complete: it carries a marker file written last, before
  the single rename; a concurrent fill that wins the race is kept.
- Package lists are refreshed (``apt-get update``, as root only) when apt knows no candidate,
  or when the download fails because the lists name a version the mirror no longer has.
- Offline (apt has no candidate and cannot update), the newest cached extraction is used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.binaries import cache_root
from vk_provider_dev.cluster.errors import ClusterError

MARKER: Final = ".complete"


class PackageUnavailable(ClusterError):
    """A Debian package could not be obtained; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ExtractedPackage:
    """The root a package was extracted into, and where its extracted libraries are."""

    package: str
    version: str
    root: Path
    library_path: str  # for LD_LIBRARY_PATH ("" when no library was extracted)

    def path(self, relative: str) -> Path:
        return self.root / relative


Check = Callable[[Path, str], None]
"""Called with (extracted root, its LD_LIBRARY_PATH) before the rename; raises to refuse it."""


def _accept(_root: Path, _library_path: str) -> None:
    return None


def _run(argv: Sequence[str], *, cwd: Path | None = None) -> str:
    result = subprocess.run(
        list(argv), cwd=cwd, capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        raise PackageUnavailable(
            f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[-500:]}"
        )
    return result.stdout


def _refresh_lists() -> bool:
    """``apt-get update`` if we may (root); whether it ran."""
    if os.geteuid() != 0:
        return False
    _run(["apt-get", "update", "-q"])
    return True


def candidate_version(package: str) -> str:
    """The version apt would install, after ``apt-get update`` if there are no lists yet."""
    for attempt in range(2):
        policy = _run(["apt-cache", "policy", package])
        for line in policy.splitlines():
            key, _, value = line.strip().partition(":")
            if key == "Candidate" and value.strip() and value.strip() != "(none)":
                return value.strip()
        if attempt == 0 and not _refresh_lists():
            break
    raise PackageUnavailable(f"apt knows no {package}: run apt-get update (as root)")


def cache_directory(package: str, version: str) -> Path:
    return cache_root() / f"{package}-{version.replace(':', '_')}"


def _missing_library_packages(deb: Path) -> list[str]:
    """The ``lib*`` packages ``deb`` depends on that are not installed here."""
    depends = _run(["dpkg-deb", "-f", str(deb), "Depends"])
    missing = []
    for clause in depends.split(","):
        name = clause.split("|")[0].split("(")[0].strip().split(":")[0]
        if not name.startswith("lib"):
            continue
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${db:Status-Abbrev}", name],
            capture_output=True,
            text=True,
            check=False,
        )
        if not status.stdout.startswith("ii"):
            missing.append(name)
    return missing


def _library_dirs(root: Path) -> list[str]:
    """The directories under ``root`` that hold shared libraries, relative to ``root``."""
    return sorted({str(p.parent.relative_to(root)) for p in root.rglob("*.so*") if p.is_file()})


def _library_path(root: Path, relative: str) -> str:
    return ":".join(str(root / part) for part in relative.split(":") if part)


def _fill(target: Path, package: str, version: str, *, libraries: bool, check: Check) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        downloads = work / "debs"
        downloads.mkdir()
        _run(["apt-get", "download", "-q", f"{package}={version}"], cwd=downloads)
        (deb,) = downloads.glob("*.deb")
        if libraries:
            for name in _missing_library_packages(deb):
                _run(["apt-get", "download", "-q", name], cwd=downloads)
        root = work / "root"
        for archive in sorted(downloads.glob("*.deb")):
            _run(["dpkg", "-x", str(archive), str(root)])
        relative = ":".join(_library_dirs(root)) if libraries else ""
        check(root, _library_path(root, relative))
        (root / MARKER).write_text(relative + "\n")
        shutil.rmtree(downloads)
        try:
            root.rename(target)
        except OSError:  # another process filled it meanwhile
            if not (target / MARKER).exists():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cached_versions(package: str) -> list[str]:
    found = sorted(cache_root().glob(f"{package}-[0-9]*/{MARKER}"))  # versions start with a digit
    return [m.parent.name.removeprefix(f"{package}-") for m in found]


def ensure_extracted(
    package: str, *, libraries: bool = False, check: Check = _accept
) -> ExtractedPackage:
    """The cached extraction of ``package``, filled first if needed (module docstring).

    ``libraries``: also extract the ``lib*`` dependencies not installed here and report their
    directories as ``library_path``. ``check`` vets a fresh extraction before it is cached.
    """
    if shutil.which("apt-get") is None:
        raise PackageUnavailable(f"no apt-get here: {package} cannot be fetched from Debian")
    try:
        version = candidate_version(package)
    except PackageUnavailable:
        cached = _cached_versions(package)
        if not cached:
            raise
        version = cached[-1]  # offline: what we have (already ':'-escaped, as on disk)
    target = cache_directory(package, version)
    if not (target / MARKER).exists():
        try:
            _fill(target, package, version, libraries=libraries, check=check)
        except PackageUnavailable:
            # Old package lists name a version the mirror no longer has: refresh, try again.
            if not _refresh_lists():
                raise
            version = candidate_version(package)
            target = cache_directory(package, version)
            if not (target / MARKER).exists():
                _fill(target, package, version, libraries=libraries, check=check)
    relative = (target / MARKER).read_text().strip()
    return ExtractedPackage(
        package=package,
        version=version,
        root=target,
        library_path=_library_path(target, relative),
    )
