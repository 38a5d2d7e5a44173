"""Build one Go program at an exact version from the Go module proxy into a cache directory.

A ``GoProgram`` names the program (module, main package, exact version, the ``replace``
directives a consumer must restate); ``build_go_program`` makes a throw-away wrapper module
(``go mod init``, ``go mod edit -replace``, ``go get PKG@VERSION``), compiles the package with
``go build -v`` reporting each compiled package as progress, lets the caller add files next
to the binary, and renames the finished directory into place.

Invariants:
- The version is probed first with ``go list -m MODULE@VERSION`` (never ``@latest``): the
  proxy here is a curated mirror that answers 403 for versions it does not hold, and that
  is reported as such, before any download.
- A target directory is only ever populated by one rename of a complete build, so a half-built
  program is never found; a concurrent build of the same target that wins the race is kept.
- ``go`` never downloads a toolchain (``GOTOOLCHAIN=local``) and builds static binaries
  (``CGO_ENABLED=0``), stripped (``-s -w``), with reproducible paths (``-trimpath``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vk_provider_dev.cluster.binaries import Progress
from vk_provider_dev.cluster.errors import ClusterError

_NETWORK_HINTS = ("dial tcp", "no such host", "connection refused", "i/o timeout", "TLS handshake")


@dataclass(frozen=True, slots=True)
class GoProgram:
    """One program to build: ``package`` of ``module`` at ``version``, saved as ``binary``."""

    binary: str
    module: str
    package: str
    version: str
    # ``replace`` directives as (module, module@version), for replaces in the program's own
    # go.mod that a consumer ignores and that MVS cannot resolve without.
    replaces: tuple[tuple[str, str], ...] = ()
    # ``-X importpath.name=value`` stamps; a stamp naming a missing variable is a no-op in Go,
    # so tests check the program's version output.
    stamps: tuple[tuple[str, str], ...] = ()

    @property
    def cache_key(self) -> str:
        return f"{self.binary}-{self.version}"

    def ldflags(self) -> str:
        return " ".join(["-s", "-w", *(f"-X {name}={value}" for name, value in self.stamps)])


Finish = Callable[[Path], None]
"""Called with the finished build directory before it is renamed into place (extra files)."""


def _nothing_to_add(_directory: Path) -> None:
    return None


def go_environment() -> dict[str, str]:
    env = dict(os.environ)
    # No toolchain downloads: offline that fails, and it would hide "your Go is too old".
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def require_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "building the flip components needs a Go toolchain (1.26 or newer) on PATH"
        )
    return go


def run_go(args: list[str], *, cwd: Path, what: str) -> str:
    """Run ``go ARGS`` and return its output; a failure says what, why and the output's tail."""
    result = subprocess.run(
        [require_go(), *args],
        cwd=cwd,
        env=go_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode == 0:
        return result.stdout
    output = (result.stderr or result.stdout).strip()
    tail = "\n".join(output.splitlines()[-15:])
    if "403 Forbidden" in output or "not available" in output:
        raise ClusterError(f"{what} failed: the Go module proxy does not serve it.\n{tail}")
    if any(hint in output for hint in _NETWORK_HINTS):
        proxy = go_environment().get("GOPROXY") or "(go env GOPROXY)"
        raise ClusterError(
            f"{what} failed: the Go module proxy is unreachable (GOPROXY={proxy}).\n{tail}"
        )
    if "requires go >=" in output or "toolchain not available" in output:
        raise ClusterError(f"{what} failed: the Go toolchain is too old.\n{tail}")
    raise ClusterError(f"{what} failed (go {' '.join(args)}):\n{tail}")


def probe_version(module: str, version: str, *, cwd: Path) -> None:
    """Fail unless the proxy serves exactly ``module@version``."""
    info = json.loads(
        run_go(["list", "-m", "-json", f"{module}@{version}"], cwd=cwd, what=f"{module}@{version}")
    )
    if info.get("Version") != version:
        raise ClusterError(f"the Go module proxy answered {info.get('Version')} for {version}")


def _compile(program: GoProgram, *, cwd: Path, output: Path, progress: Progress) -> None:
    label = f"{program.binary} {program.version}"
    listing = run_go(["list", "-deps", program.package], cwd=cwd, what=f"listing {label}")
    total = len(listing.split())
    command = [
        require_go(),
        "build",
        "-v",
        "-trimpath",
        "-ldflags",
        program.ldflags(),
        "-o",
        str(output),
        program.package,
    ]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=go_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    tail: list[str] = []
    for done, line in enumerate(proc.stdout, start=1):
        tail = [*tail[-14:], line.rstrip()]
        progress(label, min(done, total), total)
    if proc.wait() != 0:
        raise ClusterError(f"go build of {label} failed:\n" + "\n".join(tail))


def build_go_program(
    program: GoProgram,
    target: Path,
    *,
    progress: Progress,
    finish: Finish = _nothing_to_add,
) -> None:
    """Build ``program`` into ``target/<binary>`` (see the module docstring)."""
    require_go()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".build-{program.binary}-", dir=target.parent) as tmp:
        work = Path(tmp) / "module"
        work.mkdir()
        out = Path(tmp) / "out"
        out.mkdir()
        progress(f"probing {program.module}@{program.version}", 0, 0)
        probe_version(program.module, program.version, cwd=work)
        run_go(["mod", "init", f"flipbuild/{program.binary}"], cwd=work, what="go mod init")
        for module, replacement in program.replaces:
            run_go(
                ["mod", "edit", f"-replace={module}={replacement}"],
                cwd=work,
                what=f"replacing {module}",
            )
        progress(f"resolving {program.package}@{program.version}", 0, 0)
        run_go(
            ["get", f"{program.package}@{program.version}"],
            cwd=work,
            what=f"go get {program.package}@{program.version}",
        )
        _compile(program, cwd=work, output=out / program.binary, progress=progress)
        finish(out)
        try:
            out.rename(target)
        except OSError:
            # Another build of the same version finished first: keep it, drop ours.
            if not os.access(target / program.binary, os.X_OK):
                raise


def module_directory(module: str, version: str, *, cwd: Path) -> Path:
    """Where the module's source is in the Go module cache (downloaded if needed)."""
    info = json.loads(
        run_go(
            ["mod", "download", "-json", f"{module}@{version}"],
            cwd=cwd,
            what=f"downloading {module}@{version}",
        )
    )
    directory = info.get("Dir")
    if not directory:
        raise ClusterError(f"go mod download {module}@{version} named no directory")
    return Path(directory)
