"""Logs of a remote pod: the query of ``GET .../pods/{name}/log`` and whole lines out of it.

Invariants: pure; every line given out ends with a newline, except a byte-limited read's cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from providers.payload import MalformedResponse, mapping, text
from vk_provider.domain.models import LogOptions


def container_name(pod: object) -> str:
    """The name of the remote pod's (only) container."""
    spec = mapping(mapping(pod, "pod").get("spec"), "pod spec")
    containers = spec.get("containers")
    first = containers[0] if isinstance(containers, list) and containers else None
    name = text(mapping(first, "pod container"), "name")
    if not name:
        raise MalformedResponse("the pod has no named container")
    return name


def log_params(container: str, options: LogOptions) -> dict[str, str]:
    """The query of ``GET .../pods/{name}/log``."""
    params = {"container": container}
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
