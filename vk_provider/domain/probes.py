"""A container's probes read from the pod, with kubelet's defaults and validation.

``probes(container, path)`` returns the startup, readiness and liveness ``Probe`` of one
container: exec, httpGet, tcpSocket or grpc, a named port resolved against the container's
ports, and the timing fields with the defaults the API server applies (period 10 s, timeout
1 s, success 1, failure 3).

Invariants: pure; a malformed probe is ``InvalidPodSpec`` naming its field; a readiness probe
may have any success threshold, a startup or liveness probe only 1 (as the API validates).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from vk_provider.domain.containers import Probe
from vk_provider.domain.envvar import Port
from vk_provider.domain.podspec import (
    InvalidPodSpec,
    list_field,
    mapping_field,
    string_field,
    strings_field,
)

_KINDS = ("exec", "httpGet", "tcpSocket", "grpc")
_DEFAULTS = {
    "initialDelaySeconds": 0,
    "periodSeconds": 10,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 3,
}
_MINIMUM = {
    "initialDelaySeconds": 0,
    "periodSeconds": 1,
    "timeoutSeconds": 1,
    "successThreshold": 1,
    "failureThreshold": 1,
}


def _number(probe: Mapping[str, Any], key: str, field: str) -> int:
    value = probe.get(key, _DEFAULTS[key])
    if isinstance(value, bool) or not isinstance(value, int) or value < _MINIMUM[key]:
        raise InvalidPodSpec(f"{field}.{key}", f"must be an integer >= {_MINIMUM[key]}")
    return value


def _port(raw: object, field: str, ports: tuple[Port, ...]) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        number = raw
    elif isinstance(raw, str) and raw.isdigit():
        number = int(raw)
    elif isinstance(raw, str):
        named = next((p.container_port for p in ports if p.name == raw), None)
        if named is None:
            raise InvalidPodSpec(field, f"names port {raw!r}, which the container does not have")
        number = named
    else:
        raise InvalidPodSpec(field, "must be a port number or the name of a container port")
    if not 0 < number < 65536:
        raise InvalidPodSpec(field, "must be a port number 1-65535")
    return number


def _probe(
    raw: Mapping[str, Any], field: str, ports: tuple[Port, ...], *, readiness: bool
) -> Probe:
    kinds = [k for k in _KINDS if raw.get(k) is not None]
    if len(kinds) != 1:
        raise InvalidPodSpec(field, "must set exactly one of exec, httpGet, tcpSocket, grpc")
    timing = {key: _number(raw, key, field) for key in _DEFAULTS}
    if not readiness and timing["successThreshold"] != 1:
        raise InvalidPodSpec(f"{field}.successThreshold", "must be 1 for this probe")
    probe = _action(raw, kinds[0], field, ports)
    return replace(
        probe,
        initial_delay_seconds=timing["initialDelaySeconds"],
        period_seconds=timing["periodSeconds"],
        timeout_seconds=timing["timeoutSeconds"],
        success_threshold=timing["successThreshold"],
        failure_threshold=timing["failureThreshold"],
    )


def _action(raw: Mapping[str, Any], kind: str, field: str, ports: tuple[Port, ...]) -> Probe:
    """What the probe does (exec, http, tcp, grpc), with kubelet's default timing."""
    body = mapping_field(raw, kind, f"{field}.{kind}")
    where = f"{field}.{kind}"
    if kind == "exec":
        command = strings_field(body, "command", f"{where}.command")
        if not command:
            raise InvalidPodSpec(f"{where}.command", "must name a command")
        return Probe(kind="exec", command=command)
    port = _port(body.get("port"), f"{where}.port", ports)
    if kind == "tcpSocket":
        host = string_field(body, "host", f"{where}.host")
        return Probe(kind="tcp", port=port, host=host)
    if kind == "grpc":
        service = string_field(body, "service", f"{where}.service")
        return Probe(kind="grpc", port=port, grpc_service=service)
    scheme = string_field(body, "scheme", f"{where}.scheme", default="HTTP").upper()
    if scheme not in ("HTTP", "HTTPS"):
        raise InvalidPodSpec(f"{where}.scheme", "must be HTTP or HTTPS")
    headers = []
    for index, raw_header in enumerate(list_field(body, "httpHeaders", f"{where}.httpHeaders")):
        header_field = f"{where}.httpHeaders[{index}]"
        header = mapping_field({"h": raw_header}, "h", header_field)
        headers.append(
            (
                string_field(header, "name", f"{header_field}.name"),
                string_field(header, "value", f"{header_field}.value"),
            )
        )
    return Probe(
        kind="http",
        port=port,
        host=string_field(body, "host", f"{where}.host"),
        path=string_field(body, "path", f"{where}.path", default="/") or "/",
        scheme="HTTPS" if scheme == "HTTPS" else "HTTP",
        headers=tuple(headers),
    )


def probes(
    container: Mapping[str, Any], path: str, ports: tuple[Port, ...]
) -> tuple[Probe | None, Probe | None, Probe | None]:
    """The container's (startup, readiness, liveness) probes; None where it has none."""
    found: list[Probe | None] = []
    for key in ("startupProbe", "readinessProbe", "livenessProbe"):
        raw = container.get(key)
        if raw is None:
            found.append(None)
            continue
        field = f"{path}.{key}"
        body = mapping_field(container, key, field)
        found.append(_probe(body, field, ports, readiness=key == "readinessProbe"))
    return found[0], found[1], found[2]
