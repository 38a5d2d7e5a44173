"""The pinned programs around the overflow flip: find them in the cache or fetch them.

- kwok and its stage YAMLs: ``sigs.k8s.io/kwok/cmd/kwok@v0.8.0`` → ``kwok-v0.8.0/``
- descheduler: ``sigs.k8s.io/descheduler/cmd/descheduler@v0.36.0`` → ``descheduler-v0.36.0/``
- kube-state-metrics: ``k8s.io/kube-state-metrics/v2@v2.20.0`` → ``kube-state-metrics-v2.20.0/``
- kueue and its CRDs and webhook manifests: ``sigs.k8s.io/kueue/cmd/kueue@v0.19.2`` →
  ``kueue-v0.19.2/`` (``crds/*.yaml``, ``webhooks.yaml`` copied from the module's source)
- prometheus and promtool: Debian's ``prometheus`` package at apt's candidate version →
  ``prometheus-<Debian version>/usr/bin/``

All under ``cache_root()`` (``~/.cache/vk-provider/bin``), beside the control plane's.

Invariants:
- Versions are exact; the Go ones are probed with ``go list -m`` before a build, never
  resolved through ``@latest``. Changing a pin changes its cache directory.
- A cache directory is complete or absent (``gobuild``, ``debian``): KWOK's directory also
  holds the stage files it needs at run time (``stages/*.yaml``, copied from the module's
  source in the Go module cache at build time), so a later clean of the module cache does
  not break a cached KWOK.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.binaries import Progress, cache_root
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip import debian
from vk_provider_dev.cluster.flip.gobuild import GoProgram, build_go_program, module_directory
from vk_provider_dev.cluster.flip.kueue import KueueFiles

KWOK: Final = GoProgram(
    binary="kwok",
    module="sigs.k8s.io/kwok",
    package="sigs.k8s.io/kwok/cmd/kwok",
    version="v0.8.0",
    stamps=(("sigs.k8s.io/kwok/pkg/consts.Version", "v0.8.0"),),
)
DESCHEDULER: Final = GoProgram(
    binary="descheduler",
    module="sigs.k8s.io/descheduler",
    package="sigs.k8s.io/descheduler/cmd/descheduler",
    version="v0.36.0",
    # The descheduler's go.mod replaces kube-openapi; a consumer ignores that, and MVS then
    # asks the proxy for kube-openapi v0.31.0, which it refuses. Restate the replace.
    replaces=(("k8s.io/kube-openapi", "k8s.io/kube-openapi@v0.0.0-20260512234627-ef417d054102"),),
    stamps=(("sigs.k8s.io/descheduler/pkg/version.version", "v0.36.0"),),
)
KUBE_STATE_METRICS: Final = GoProgram(
    binary="kube-state-metrics",
    module="k8s.io/kube-state-metrics/v2",
    package="k8s.io/kube-state-metrics/v2",
    version="v2.20.0",
    stamps=(("github.com/prometheus/common/version.Version", "v2.20.0"),),
)
KUEUE: Final = GoProgram(
    binary="kueue",
    module="sigs.k8s.io/kueue",
    package="sigs.k8s.io/kueue/cmd/kueue",
    version="v0.19.2",
    stamps=(("sigs.k8s.io/kueue/pkg/version.GitVersion", "v0.19.2"),),
)
KUEUE_CRDS: Final = "config/components/crd/bases"
KUEUE_WEBHOOKS: Final = "config/components/webhook/manifests.yaml"
GO_PROGRAMS: Final = (KWOK, DESCHEDULER, KUBE_STATE_METRICS, KUEUE)
PROMETHEUS_PACKAGE: Final = "prometheus"

# KWOK has no built-in stages: these upstream files (relative to the module root) are what
# the fast node and pod life cycle of its default deployment is made of.
KWOK_STAGE_SOURCES: Final = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_STAGES_DIR: Final = "stages"


@dataclass(frozen=True, slots=True)
class KwokBinary:
    """The kwok program and the directory of stage files copied beside it."""

    path: Path
    stages: Path

    def stage_files(self) -> list[Path]:
        return [self.stages / Path(source).name for source in KWOK_STAGE_SOURCES]


@dataclass(frozen=True, slots=True)
class PrometheusBinaries:
    """Debian's prometheus and promtool, extracted (``version`` is Debian's)."""

    prometheus: Path
    promtool: Path
    version: str


@dataclass(frozen=True, slots=True)
class FlipTools:
    """Every program the flip's components need, by absolute path."""

    kwok: KwokBinary
    descheduler: Path
    kube_state_metrics: Path
    prometheus: PrometheusBinaries
    kueue: KueueFiles

    def describe(self) -> list[tuple[str, Path]]:
        """(name, path) of each program, for `vk-provider cluster binaries --flip`."""
        return [
            ("kwok", self.kwok.path),
            ("kwok stages", self.kwok.stages),
            ("descheduler", self.descheduler),
            ("kube-state-metrics", self.kube_state_metrics),
            ("kueue", self.kueue.binary),
            ("kueue manifests", self.kueue.crds.parent),
            ("prometheus", self.prometheus.prometheus),
            ("promtool", self.prometheus.promtool),
        ]


def _ignore_progress(_phase: str, _done: int, _total: int) -> None:
    return None


def program_directory(program: GoProgram) -> Path:
    return cache_root() / program.cache_key


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _kwok_in(directory: Path) -> KwokBinary:
    return KwokBinary(path=directory / KWOK.binary, stages=directory / KWOK_STAGES_DIR)


def _kwok_complete(kwok: KwokBinary) -> bool:
    return _executable(kwok.path) and all(p.is_file() for p in kwok.stage_files())


def _copy_kwok_stages(out: Path) -> None:
    source = module_directory(KWOK.module, KWOK.version, cwd=out)
    stages = out / KWOK_STAGES_DIR
    stages.mkdir()
    for relative in KWOK_STAGE_SOURCES:
        origin = source / relative
        if not origin.is_file():
            raise ClusterError(f"{KWOK.module}@{KWOK.version} has no {relative}")
        # Module-cache files are read-only; the copy need not be.
        shutil.copyfile(origin, stages / origin.name)


def _ensure_single_binary(program: GoProgram, *, progress: Progress) -> Path:
    """The cached binary of a program that needs nothing beside it, built first when absent."""
    directory = program_directory(program)
    binary = directory / program.binary
    if not _executable(binary):
        build_go_program(program, directory, progress=progress)
    return binary


def ensure_kwok(*, progress: Progress = _ignore_progress) -> KwokBinary:
    directory = program_directory(KWOK)
    kwok = _kwok_in(directory)
    if not _kwok_complete(kwok):
        if directory.exists():  # a cache of an older recipe without stages: rebuild it
            shutil.rmtree(directory)
        build_go_program(KWOK, directory, progress=progress, finish=_copy_kwok_stages)
    return kwok


def _kueue_in(directory: Path) -> KueueFiles:
    return KueueFiles(
        binary=directory / KUEUE.binary,
        crds=directory / "crds",
        webhooks=directory / "webhooks.yaml",
    )


def _kueue_complete(kueue: KueueFiles) -> bool:
    return (
        _executable(kueue.binary)
        and kueue.webhooks.is_file()
        and any(kueue.crds.glob("kueue.x-k8s.io_*.yaml"))
    )


def _copy_kueue_manifests(out: Path) -> None:
    source = module_directory(KUEUE.module, KUEUE.version, cwd=out)
    crds = out / "crds"
    crds.mkdir()
    found = sorted((source / KUEUE_CRDS).glob("kueue.x-k8s.io_*.yaml"))
    if not found:
        raise ClusterError(f"{KUEUE.module}@{KUEUE.version} has no CRDs in {KUEUE_CRDS}")
    for origin in found:
        shutil.copyfile(origin, crds / origin.name)
    webhooks = source / KUEUE_WEBHOOKS
    if not webhooks.is_file():
        raise ClusterError(f"{KUEUE.module}@{KUEUE.version} has no {KUEUE_WEBHOOKS}")
    shutil.copyfile(webhooks, out / "webhooks.yaml")


def ensure_kueue(*, progress: Progress = _ignore_progress) -> KueueFiles:
    directory = program_directory(KUEUE)
    kueue = _kueue_in(directory)
    if not _kueue_complete(kueue):
        if directory.exists():
            shutil.rmtree(directory)
        build_go_program(KUEUE, directory, progress=progress, finish=_copy_kueue_manifests)
    return kueue


def ensure_descheduler(*, progress: Progress = _ignore_progress) -> Path:
    return _ensure_single_binary(DESCHEDULER, progress=progress)


def ensure_kube_state_metrics(*, progress: Progress = _ignore_progress) -> Path:
    return _ensure_single_binary(KUBE_STATE_METRICS, progress=progress)


def _check_prometheus(root: Path, _library_path: str) -> None:
    for name in ("prometheus", "promtool"):
        if not _executable(root / "usr" / "bin" / name):
            raise debian.PackageUnavailable(f"Debian's {PROMETHEUS_PACKAGE} has no usr/bin/{name}")


def ensure_prometheus(*, progress: Progress = _ignore_progress) -> PrometheusBinaries:
    """Debian's prometheus and promtool (``apt-get download`` + ``dpkg -x``, cached)."""
    progress(f"Debian package {PROMETHEUS_PACKAGE}", 0, 0)
    extracted = debian.ensure_extracted(PROMETHEUS_PACKAGE, check=_check_prometheus)
    return PrometheusBinaries(
        prometheus=extracted.path("usr/bin/prometheus"),
        promtool=extracted.path("usr/bin/promtool"),
        version=extracted.version,
    )


def find_flip_tools() -> FlipTools | None:
    """The cached programs when all are there, else None (nothing is fetched)."""
    kwok = _kwok_in(program_directory(KWOK))
    others = [program_directory(p) / p.binary for p in (DESCHEDULER, KUBE_STATE_METRICS)]
    kueue = _kueue_in(program_directory(KUEUE))
    if not (_kwok_complete(kwok) and _kueue_complete(kueue)) or not all(
        _executable(p) for p in others
    ):
        return None
    cached = sorted(cache_root().glob(f"{PROMETHEUS_PACKAGE}-[0-9]*/{debian.MARKER}"))
    if not cached:
        return None
    root = cached[-1].parent
    return FlipTools(
        kwok=kwok,
        descheduler=others[0],
        kube_state_metrics=others[1],
        prometheus=PrometheusBinaries(
            prometheus=root / "usr" / "bin" / "prometheus",
            promtool=root / "usr" / "bin" / "promtool",
            version=root.name.removeprefix(f"{PROMETHEUS_PACKAGE}-"),
        ),
        kueue=kueue,
    )


def ensure_flip_tools(*, progress: Progress = _ignore_progress) -> FlipTools:
    """Every flip program, fetching or building what is not cached yet (Prometheus first: it
    takes seconds, the Go builds minutes)."""
    prometheus = ensure_prometheus(progress=progress)
    kwok = ensure_kwok(progress=progress)
    return FlipTools(
        kwok=kwok,
        descheduler=ensure_descheduler(progress=progress),
        kube_state_metrics=ensure_kube_state_metrics(progress=progress),
        prometheus=prometheus,
        kueue=ensure_kueue(progress=progress),
    )
