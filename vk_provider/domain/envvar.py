"""An environment variable and a port of a container: the smallest parts of a workload."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class EnvVar:
    """One environment variable; ``secret`` marks values that came from a Secret."""

    name: str
    value: str = field(repr=False)
    secret: bool = False

    def __repr__(self) -> str:
        shown = "<redacted>" if self.secret else repr(self.value)
        return f"EnvVar(name={self.name!r}, value={shown}, secret={self.secret})"


@dataclass(frozen=True, slots=True)
class Port:
    container_port: int
    protocol: str = "TCP"
    name: str | None = None
