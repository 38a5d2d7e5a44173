"""Find or build the control-plane binaries of the local Kubernetes cluster.

The local cluster runs etcd, kube-apiserver, kube-controller-manager and kube-scheduler of
one pinned version (``PINNED``). Binaries are looked for, in order:

1. the directory named by ``$VK_PROVIDER_K8S_BIN_DIR`` (explicit choice, must hold all four);
2. the version-keyed cache (``$XDG_CACHE_HOME/vk-provider/bin/<key>``);
3. ``$PATH`` (used only when all four are there);
4. otherwise they are built from the Go module proxy into the cache.

Invariants:
- The cache directory of a version is only ever populated atomically: binaries are built into
  a temporary directory and renamed into place, so a half-finished build is never "found".
- Building never needs anything but a Go toolchain and the module proxy. Kubernetes' go.mod
  replaces its staging modules with relative paths that do not apply to a consumer, so the
  wrapper module re-points each of them at the published staging version; etcd needs a
  wrapper module of its own because Kubernetes pins the etcd *library* to a different minor
  than the etcd *server* we run. ``build_kubernetes_program`` builds one more program of
  k8s.io/kubernetes (kube-proxy) with the same wrapper, replaces and version stamps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vk_provider_dev.cluster.errors import ClusterError

COMPONENTS: tuple[str, ...] = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
)
BIN_DIR_ENV = "VK_PROVIDER_K8S_BIN_DIR"
ETCD_SERVER_MODULE = "go.etcd.io/etcd/server/v3"


@dataclass(frozen=True, slots=True)
class ControlPlaneVersions:
    """The pinned versions that make one cache key."""

    kubernetes: str
    staging: str
    etcd: str

    @property
    def cache_key(self) -> str:
        # "-v2": binaries stamped with their version (``version_ldflags``); bump when the
        # build itself changes, so a cache of an older recipe is never taken for this one.
        return f"k8s-{self.kubernetes}-etcd-{self.etcd}-v2"

    def version_ldflags(self) -> str:
        """Stamp the Kubernetes version as ``hack/lib/version.sh`` does.

        Without it ``/version`` says ``v0.0.0-master+$Format:%H$``, which tools that parse the
        server version (Kueue, Helm's ``kubeVersion`` checks) refuse.
        """
        major, minor = self.kubernetes.lstrip("v").split(".")[:2]
        pkg = "k8s.io/component-base/version"
        stamps = {
            "gitVersion": self.kubernetes,
            "gitMajor": major,
            "gitMinor": minor,
            "gitTreeState": "clean",
            "buildDate": "1970-01-01T00:00:00Z",
        }
        return " ".join(f"-X {pkg}.{name}={value}" for name, value in stamps.items())


PINNED = ControlPlaneVersions(kubernetes="v1.37.2", staging="v0.37.2", etcd="v3.6.16")


@dataclass(frozen=True, slots=True)
class Binaries:
    """Absolute paths of the four control-plane programs, and where they came from."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    source: str

    @classmethod
    def in_directory(cls, directory: Path, *, source: str) -> Binaries:
        return cls(
            etcd=directory / "etcd",
            kube_apiserver=directory / "kube-apiserver",
            kube_controller_manager=directory / "kube-controller-manager",
            kube_scheduler=directory / "kube-scheduler",
            source=source,
        )


Progress = Callable[[str, int, int], None]
"""Progress callback: (phase description, done, total); total 0 means unknown."""


def _ignore_progress(_phase: str, _done: int, _total: int) -> None:
    return None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vk-provider" / "bin"


def _complete(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in COMPONENTS)


def find_binaries(versions: ControlPlaneVersions = PINNED) -> Binaries | None:
    """Return binaries that are already present, or None when they must be built."""
    explicit = os.environ.get(BIN_DIR_ENV)
    if explicit:
        directory = Path(explicit).expanduser()
        if not _complete(directory):
            missing = [n for n in COMPONENTS if not os.access(directory / n, os.X_OK)]
            raise ClusterError(
                f"${BIN_DIR_ENV}={directory} lacks executable {', '.join(missing)}; "
                f"put all of {', '.join(COMPONENTS)} there or unset the variable"
            )
        return Binaries.in_directory(directory, source=f"${BIN_DIR_ENV}")
    cached = cache_root() / versions.cache_key
    if _complete(cached):
        return Binaries.in_directory(cached, source=f"cache {cached}")
    found = {name: shutil.which(name) for name in COMPONENTS}
    if all(found.values()):
        paths = {name: Path(p) for name, p in found.items() if p}
        return Binaries(
            etcd=paths["etcd"],
            kube_apiserver=paths["kube-apiserver"],
            kube_controller_manager=paths["kube-controller-manager"],
            kube_scheduler=paths["kube-scheduler"],
            source="PATH",
        )
    return None


def ensure_binaries(
    versions: ControlPlaneVersions = PINNED, *, progress: Progress = _ignore_progress
) -> Binaries:
    """Find the binaries, building them into the version-keyed cache when absent."""
    found = find_binaries(versions)
    if found is not None:
        return found
    target = cache_root() / versions.cache_key
    build_binaries(versions, target, progress=progress)
    return Binaries.in_directory(target, source=f"built into {target}")


# --------------------------------------------------------------------------- building


def _go_environment() -> dict[str, str]:
    env = dict(os.environ)
    # Never let `go` try to download a newer toolchain: that cannot work offline and would
    # hide the real problem ("your Go is too old") behind a network error.
    env["GOTOOLCHAIN"] = "local"
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOFLAGS", "-mod=mod")
    return env


def _require_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise ClusterError(
            "the control-plane binaries are not built yet and no Go toolchain is on PATH: "
            f"install Go (1.26 or newer), or set ${BIN_DIR_ENV} to a directory holding "
            f"{', '.join(COMPONENTS)}"
        )
    return go


_NETWORK_HINTS = ("dial tcp", "no such host", "connection refused", "i/o timeout", "TLS handshake")


def _run_go(args: list[str], *, cwd: Path, what: str) -> str:
    result = subprocess.run(
        [_require_go(), *args],
        cwd=cwd,
        env=_go_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()
        tail = "\n".join(output.splitlines()[-15:])
        if any(hint in output for hint in _NETWORK_HINTS):
            proxy = _go_environment().get("GOPROXY") or "(go env GOPROXY)"
            raise ClusterError(
                f"{what} failed: the Go module proxy is unreachable (GOPROXY={proxy}).\n{tail}"
            )
        if "requires go >=" in output or "toolchain not available" in output:
            raise ClusterError(f"{what} failed: the Go toolchain is too old.\n{tail}")
        raise ClusterError(f"{what} failed (go {' '.join(args)}):\n{tail}")
    return result.stdout


def _staging_modules(go_mod_text: str) -> list[str]:
    """The modules that Kubernetes' go.mod replaces with ./staging/src/... paths."""
    pattern = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/src/", re.MULTILINE)
    return sorted(set(pattern.findall(go_mod_text)))


def _write_wrapper(
    directory: Path, *, module: str, imports: list[str], replaces: list[str]
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"module {module}", "", "go 1.26", ""]
    lines += replaces
    (directory / "go.mod").write_text("\n".join(lines) + "\n")
    body = "\n".join(f'\t_ "{imp}"' for imp in imports)
    (directory / "tools.go").write_text(
        "//go:build tools\n\n// Package tools pins the programs this module builds.\n"
        f"package tools\n\nimport (\n{body}\n)\n"
    )


def _stream_build(
    packages: list[str],
    *,
    cwd: Path,
    output: str,
    total: int,
    label: str,
    progress: Progress,
    ldflags: str = "",
) -> None:
    """Run `go build -v` and report each compiled package as progress.

    ``output`` is a directory when it ends with a path separator, else the program's path.
    """
    command = [_require_go(), "build", "-v", "-trimpath", "-o", output, *packages]
    if ldflags:
        command[3:3] = ["-ldflags", ldflags]
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=_go_environment(),
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


def _count_deps(packages: list[str], *, cwd: Path) -> int:
    listing = _run_go(["list", "-deps", *packages], cwd=cwd, what="listing dependencies")
    return len(listing.split())


def _kubernetes_wrapper(
    versions: ControlPlaneVersions,
    directory: Path,
    *,
    module: str,
    packages: list[str],
    progress: Progress,
) -> None:
    """A wrapper module in ``directory`` that builds ``packages`` of k8s.io/kubernetes at
    ``versions.kubernetes``: each staging module Kubernetes' go.mod replaces with a relative
    path is re-pointed at its published version, then ``go get`` and ``go mod tidy``."""
    directory.mkdir(parents=True, exist_ok=True)
    progress(f"downloading k8s.io/kubernetes@{versions.kubernetes}", 0, 0)
    info = json.loads(
        _run_go(
            ["mod", "download", "-json", f"k8s.io/kubernetes@{versions.kubernetes}"],
            cwd=directory,
            what=f"downloading k8s.io/kubernetes@{versions.kubernetes}",
        )
    )
    staging = _staging_modules(Path(info["GoMod"]).read_text())
    if not staging:
        raise ClusterError(f"k8s.io/kubernetes@{versions.kubernetes} lists no staging modules")
    _write_wrapper(
        directory,
        module=module,
        imports=packages,
        replaces=[f"replace {m} => {m} {versions.staging}" for m in staging],
    )
    progress("resolving Kubernetes modules", 0, 0)
    _run_go(["get", f"k8s.io/kubernetes@{versions.kubernetes}"], cwd=directory, what="go get")
    _run_go(["mod", "tidy"], cwd=directory, what=f"go mod tidy ({module})")


def build_kubernetes_program(
    name: str,
    target: Path,
    versions: ControlPlaneVersions = PINNED,
    *,
    progress: Progress = _ignore_progress,
) -> Path:
    """Build ``k8s.io/kubernetes/cmd/<name>`` at the control plane's pinned version (same
    wrapper and replaces, same version stamps) into the directory ``target``, atomically like
    the control plane; the program's path."""
    _require_go()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vk-build-", dir=target.parent) as tmp:
        work = Path(tmp) / "kubernetes"
        out = Path(tmp) / "bin"
        out.mkdir()
        packages = [f"k8s.io/kubernetes/cmd/{name}"]
        _kubernetes_wrapper(
            versions, work, module=f"vkprovider.local/{name}", packages=packages, progress=progress
        )
        _stream_build(
            packages,
            cwd=work,
            output=str(out / name),
            total=_count_deps(packages, cwd=work),
            label=f"{name} {versions.kubernetes}",
            progress=progress,
            ldflags=versions.version_ldflags(),
        )
        if not os.access(out / name, os.X_OK):
            raise ClusterError(f"build of {name} finished but {out / name} is missing")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target / name


def build_binaries(
    versions: ControlPlaneVersions, target: Path, *, progress: Progress = _ignore_progress
) -> None:
    """Build the four binaries from the Go module proxy and move them to ``target``."""
    _require_go()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vk-build-", dir=target.parent) as tmp:
        work = Path(tmp)
        out = work / "bin"
        out.mkdir()

        k8s = work / "kubernetes"
        packages = [f"k8s.io/kubernetes/cmd/{name}" for name in COMPONENTS[1:]]
        _kubernetes_wrapper(
            versions,
            k8s,
            module="vkprovider.local/controlplane",
            packages=packages,
            progress=progress,
        )
        total = _count_deps(packages, cwd=k8s)
        _stream_build(
            packages,
            cwd=k8s,
            output=f"{out}{os.sep}",
            total=total,
            label=f"Kubernetes {versions.kubernetes}",
            progress=progress,
            ldflags=versions.version_ldflags(),
        )

        etcd = work / "etcd"
        module = ETCD_SERVER_MODULE
        _write_wrapper(etcd, module="vkprovider.local/etcd", imports=[module], replaces=[])
        progress("resolving etcd modules", 0, 0)
        _run_go(["get", f"{module}@{versions.etcd}"], cwd=etcd, what="go get etcd")
        _run_go(["mod", "tidy"], cwd=etcd, what="go mod tidy (etcd)")
        total = _count_deps([module], cwd=etcd)
        # The etcd server module is itself the main package; name the output explicitly.
        _stream_build(
            [module],
            cwd=etcd,
            output=str(out / "etcd"),
            total=total,
            label=f"etcd {versions.etcd}",
            progress=progress,
        )
        if not _complete(out):
            missing = [n for n in COMPONENTS if not (out / n).exists()]
            raise ClusterError(f"build finished but {', '.join(missing)} is missing")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)


def build_go_program(
    module: str,
    version: str,
    package: str,
    target: Path,
    *,
    ldflags: str = "",
    progress: Progress = _ignore_progress,
) -> Path:
    """Build one program (``package`` of ``module@version``) from the module proxy into the
    directory ``target``, atomically like the control plane; the program's path.

    For modules whose go.mod needs no replaces (metrics-server): a wrapper module requires
    ``module@version`` and builds ``package``.
    """
    _require_go()
    name = package.rstrip("/").rsplit("/", 1)[-1]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vk-build-", dir=target.parent) as tmp:
        work = Path(tmp) / "module"
        out = Path(tmp) / "bin"
        out.mkdir()
        _write_wrapper(work, module=f"vkprovider.local/{name}", imports=[package], replaces=[])
        progress(f"resolving {module}@{version}", 0, 0)
        _run_go(["get", f"{module}@{version}"], cwd=work, what=f"go get {module}@{version}")
        _run_go(["mod", "tidy"], cwd=work, what=f"go mod tidy ({name})")
        total = _count_deps([package], cwd=work)
        _stream_build(
            [package],
            cwd=work,
            output=str(out / name),
            total=total,
            label=f"{name} {version}",
            progress=progress,
            ldflags=ldflags,
        )
        if not os.access(out / name, os.X_OK):
            raise ClusterError(f"build of {name} finished but {out / name} is missing")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target / name
