"""Helm, for installing and testing the chart in ``deploy/chart/vk-provider`` locally.

``helm.sh/helm/v3/cmd/helm`` at ``HELM.version`` is built from the Go module proxy (its go.mod
needs no replaces) into the version-keyed cache beside the control plane's
(``~/.cache/vk-provider/bin/helm-<version>/helm``), unless ``$VK_PROVIDER_HELM`` names a
binary. It is stamped as Helm's Makefile stamps a release: the version, and the Kubernetes
minor of its client libraries (``helm version``, and ``.Capabilities.KubeVersion`` of
``helm template`` without a cluster, say what they are).

Invariants: the version is exact and probed with ``go list -m`` before any download
(``flip.gobuild``); the cache directory is complete or absent (one rename of a finished
build). Changing the pin changes the cache directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.binaries import Progress, cache_root
from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.gobuild import GoProgram, build_go_program

BINARY_ENV: Final = "VK_PROVIDER_HELM"
# The Kubernetes client libraries helm v3.22.0's go.mod requires (k8s.io/client-go v0.37.0).
_K8S_MAJOR, _K8S_MINOR = "1", "37"
HELM: Final = GoProgram(
    binary="helm",
    module="helm.sh/helm/v3",
    package="helm.sh/helm/v3/cmd/helm",
    version="v3.22.0",
    stamps=(
        ("helm.sh/helm/v3/internal/version.version", "v3.22.0"),
        ("helm.sh/helm/v3/internal/version.gitTreeState", "clean"),
        ("helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor", _K8S_MAJOR),
        ("helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor", _K8S_MINOR),
        ("helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor", _K8S_MAJOR),
        ("helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor", _K8S_MINOR),
    ),
)


def _quiet(_phase: str, _done: int, _total: int) -> None:
    return None


def cache_directory() -> Path:
    return cache_root() / HELM.cache_key


def find_helm() -> Path | None:
    """The helm binary when present (``$VK_PROVIDER_HELM`` or the cache), else None."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not os.access(path, os.X_OK):
            raise ClusterError(f"${BINARY_ENV}={path} is not an executable file")
        return path
    cached = cache_directory() / HELM.binary
    return cached if os.access(cached, os.X_OK) else None


def ensure_helm(*, progress: Progress = _quiet) -> Path:
    """The helm binary, built into the cache first if it is not there."""
    found = find_helm()
    if found is not None:
        return found
    build_go_program(HELM, cache_directory(), progress=progress)
    return cache_directory() / HELM.binary
