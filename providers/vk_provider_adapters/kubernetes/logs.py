"""Logs of a remote pod: which container, the query of ``GET .../pods/{name}/log``, and whole
lines out of it.

The container is the one asked for (``LogOptions.container``: any app or init container of the
remote pod, sidecars included) or, when none is named, the first app container; ``previous``
asks B for the run before the current one (``kubectl logs --previous``).

Invariants: pure; every line given out ends with a newline, except a byte-limited read's cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from vk_provider.sdk import LogOptions
from vk_provider_adapters.payload import MalformedResponse, mapping, text


def container_names(pod: object) -> tuple[str, ...]:
    """The remote pod's app containers, then its init containers."""
    spec = mapping(mapping(pod, "pod").get("spec"), "pod spec")
    names: list[str] = []
    for key in ("containers", "initContainers"):
        found = spec.get(key)
        for index, container in enumerate(found if isinstance(found, list) else []):
            name = text(mapping(container, f"spec.{key}[{index}]"), "name")
            if name:
                names.append(name)
    return tuple(names)


def log_container(pod: object, wanted: str | None) -> str | None:
    """The container to read: ``wanted`` when the pod has it (None when not), else the first
    app container; raises ``MalformedResponse`` for a pod without a named container."""
    spec = mapping(mapping(pod, "pod").get("spec"), "pod spec")
    containers = spec.get("containers")
    first = containers[0] if isinstance(containers, list) and containers else None
    if not text(mapping(first, "pod container"), "name"):
        raise MalformedResponse("the pod has no named container")
    names = container_names(pod)
    if wanted is None:
        return names[0]
    return wanted if wanted in names else None


def log_params(container: str, options: LogOptions) -> dict[str, str]:
    """The query of ``GET .../pods/{name}/log``."""
    params = {"container": container}
    if options.previous:
        params["previous"] = "true"
    if options.follow:
        params["follow"] = "true"
    if options.timestamps:
        params["timestamps"] = "true"
    if options.tail_lines is not None:
        params["tailLines"] = str(max(0, options.tail_lines))
    if options.since_seconds is not None:
        params["sinceSeconds"] = str(max(1, options.since_seconds))
    if options.limit_bytes is not None:
        params["limitBytes"] = str(max(1, options.limit_bytes))
    return params


@dataclass(slots=True)
class LineSplitter:
    """Bytes in, whole lines out (each ending with a newline)."""

    _pending: bytes = b""

    def feed(self, data: bytes) -> list[bytes]:
        data = self._pending + data
        lines = data.split(b"\n")
        self._pending = lines.pop()
        return [line + b"\n" for line in lines]

    def flush(self, *, terminate: bool = True) -> bytes:
        rest, self._pending = self._pending, b""
        return rest + b"\n" if rest and terminate else rest
