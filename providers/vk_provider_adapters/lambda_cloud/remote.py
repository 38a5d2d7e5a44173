"""What the agent runs on a VM over SSH, and how it reads the answers: pure text in and out.

- ``probe_command`` — one round trip per poll: the boot script's ``phase``, ``exit-code`` and
  sandbox error files (``vk_provider_adapters.boot_script``), the ports the sandbox publishes
  on the VM right now (``docker container inspect`` of ``vk-<request id>`` for exactly
  ``PORTS_FORMAT``: Docker's ``NetworkSettings.Ports``, empty unless the sandbox runs), then
  for every container ``pod.list`` names (in run order, with its kind) ``docker inspect`` of
  ``vk-<request id>.<name>`` and its ``docker run`` error file. While the VM waits for it,
  the same command stores the secret environment's passphrase that the adapter sends on its
  standard input (and ignores it otherwise). ``parse_probe`` reads its output into a ``VmReport``.
- ``logs_command`` — ``docker logs`` of one container of the pod (the first app container
  when none is named) with what ``LogOptions`` asks (tail, since, timestamps, follow), stdout
  and stderr merged; exit status ``NO_CONTAINER`` when there is no such container.

``docker inspect`` is asked for exactly ``INSPECT_FORMAT``: the container's ``.State``
(Docker's ``ContainerState``: Status, Running, Paused, Restarting, OOMKilled, Dead, Pid,
ExitCode, Error, StartedAt, FinishedAt) and its ``RestartCount`` — never its config, which
holds the environment's values. Both commands run as root: through ``sudo -n`` unless the SSH
user is root (on Lambda's images the ``ubuntu`` user has password-less sudo). File contents
travel base64-encoded, so nothing a container or a registry prints can break the framing.

Invariants: every value is ``shlex.quote``\\d into the command; no secret is ever on a command
line (the passphrase goes on standard input); parsing raises only ``MalformedProbe``, which
says what was wrong and names the field (``containers[app].State.ExitCode``).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, cast

from vk_provider.sdk import LogOptions
from vk_provider_adapters.boot_script import (
    CONTAINERS_DIR,
    EXIT_CODE_FILE,
    PASSPHRASE_FILE,
    PHASE_FILE,
    POD_LIST_FILE,
    SANDBOX_ERROR_FILE,
    START_ERROR_FILE,
)
from vk_provider_adapters.docker_run import Kind

NO_CONTAINER: Final = 44
_FILE_TAIL_BYTES: Final = 4096
_INSPECT_TAIL_BYTES: Final = 16384
# About 80 bytes per binding, two bindings (IPv4 and IPv6) per port: room for 400 ports.
_PORTS_TAIL_BYTES: Final = 65536
_END: Final = "end"

# The container's state and restart count, and nothing of its config (the env's values).
INSPECT_FORMAT: Final = '{"State":{{json .State}},"RestartCount":{{json .RestartCount}}}'
# The sandbox's published ports as Docker's API documents them (``PortMap``: "<port>/<proto>"
# to a list of ``PortBinding`` {HostIp, HostPort}, or null when exposed but not published).
# Asked with ``docker container inspect`` so that ``docker inspect`` stays the containers'.
PORTS_FORMAT: Final = "{{json .NetworkSettings.Ports}}"

_PROBE_SCRIPT: Final = f"""set -u
state=$1
sandbox=$2
key=$(head -c 256)
if [ -n "$key" ] && [ -r "$state/{PHASE_FILE}" ]; then
    case "$(head -n 1 "$state/{PHASE_FILE}")" in
    waiting-key*)
        if [ ! -s "$state/{PASSPHRASE_FILE}" ]; then (
            umask 077
            mkdir -p "$(dirname "$state/{PASSPHRASE_FILE}")" &&
                printf '%s\\n' "$key" > "$state/{PASSPHRASE_FILE}.tmp" &&
                mv -f "$state/{PASSPHRASE_FILE}.tmp" "$state/{PASSPHRASE_FILE}"
        ); fi ;;
    esac
fi
b64() {{ tail -c "$1" | base64 | tr -d '\\n'; }}
text() {{
    if [ -r "$1" ]; then b64 {_FILE_TAIL_BYTES} < "$1"; else printf -- -; fi
}}
printf 'phase %s\\n' "$(text "$state/{PHASE_FILE}")"
printf 'exit-code %s\\n' "$(text "$state/{EXIT_CODE_FILE}")"
printf 'sandbox-error %s\\n' "$(text "$state/{SANDBOX_ERROR_FILE}")"
ports=$(docker container inspect --format '{PORTS_FORMAT}' "$sandbox" 2> /dev/null |
    b64 {_PORTS_TAIL_BYTES})
printf 'sandbox-ports %s\\n' "${{ports:--}}"
if [ -r "$state/{POD_LIST_FILE}" ]; then
    while read -r kind name; do
        [ -n "$name" ] || continue
        out=$(docker inspect --type container --format '{INSPECT_FORMAT}' "$sandbox.$name" 2>&1)
        rc=$?
        out=$(printf '%s' "$out" | b64 {_INSPECT_TAIL_BYTES})
        error=$(text "$state/{CONTAINERS_DIR}/$name/{START_ERROR_FILE}")
        printf 'container %s %s %s %s %s\\n' "$kind" "$name" "$rc" "${{out:--}}" "$error"
    done < "$state/{POD_LIST_FILE}"
fi
printf '{_END}\\n'
"""

_LOGS_SCRIPT: Final = f"""state=$1
sandbox=$2
container=$3
shift 3
if [ -z "$container" ]; then
    container=$(awk '$1 == "app" {{ print $2; exit }}' "$state/{POD_LIST_FILE}" 2> /dev/null)
fi
name=$sandbox.$container
docker inspect --type container "$name" > /dev/null 2>&1 || {{
    echo "vk-provider: no container $name on this VM yet" >&2
    exit {NO_CONTAINER}
}}
exec docker logs "$@" "$name" 2>&1
"""

_KINDS: Final = frozenset({"init", "sidecar", "app"})
# Docker's ContainerState.Status values (its API's enum).
STATUSES: Final = frozenset(
    {"created", "running", "paused", "restarting", "removing", "exited", "dead"}
)


class MalformedProbe(ValueError):
    """The probe's output is not what ``probe_command`` prints (sudo refused, a broken shell,
    a ``docker inspect`` answer without the fields Docker's API documents)."""


@dataclass(frozen=True, slots=True)
class ContainerState:
    """``docker inspect``'s ``.State`` of one container, and its ``RestartCount``."""

    status: str  # created, running, paused, restarting, removing, exited, dead
    exit_code: int
    error: str = ""
    oom_killed: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None
    restart_count: int = 0


@dataclass(frozen=True, slots=True)
class ContainerReport:
    """One container of the pod as the probe found it."""

    kind: Kind
    name: str  # the pod's name for it
    state: ContainerState | None = None  # None: no such container (yet)
    start_error: str = ""  # its docker run's error output, when it failed
    docker_error: str = ""  # docker inspect failed for another reason (daemon down)


@dataclass(frozen=True, slots=True)
class PublishedPort:
    """One port the sandbox publishes on the VM's IPv4 addresses, as Docker reports it."""

    container_port: int
    protocol: str  # Docker's: tcp, udp, sctp
    host_port: int


@dataclass(frozen=True, slots=True)
class VmReport:
    """What one probe found on the VM."""

    phase: str = ""  # the boot script's phase; "" before it wrote one
    phase_message: str = ""
    exit_code: str = ""  # the pod's, once it ended ("" before)
    start_error: str = ""  # the sandbox's docker run error output, when it failed
    containers: tuple[ContainerReport, ...] = ()
    published: tuple[PublishedPort, ...] = ()  # none while the sandbox does not run

    @property
    def docker_error(self) -> str:
        """Docker did not answer for some container (the daemon is down or restarting)."""
        return next((c.docker_error for c in self.containers if c.docker_error), "")

    @property
    def created(self) -> bool:
        """Some container of the pod exists."""
        return any(c.state is not None for c in self.containers)


def _sudo(user: str) -> list[str]:
    return [] if user == "root" else ["sudo", "-n"]


def probe_command(*, user: str, state_dir: str, sandbox: str) -> str:
    """The command line of one probe (its standard input: the passphrase, or nothing)."""
    argv = [*_sudo(user), "sh", "-c", _PROBE_SCRIPT, "vk-probe", state_dir, sandbox]
    return shlex.join(argv)


def logs_command(
    *, user: str, state_dir: str, sandbox: str, container: str | None, options: LogOptions
) -> str:
    """``docker logs`` of one container of the pod (``None``: the first app container), as
    ``options`` ask (``limit_bytes`` is the caller's)."""
    flags: list[str] = []
    if options.tail_lines is not None:
        flags += ["--tail", str(max(options.tail_lines, 0))]
    if options.since_seconds is not None:
        flags += ["--since", f"{max(options.since_seconds, 0)}s"]
    if options.timestamps:
        flags.append("--timestamps")
    if options.follow:
        flags.append("--follow")
    script = [_LOGS_SCRIPT, "vk-logs", state_dir, sandbox, container or ""]
    return shlex.join([*_sudo(user), "sh", "-c", *script, *flags])


def _decode(value: str, what: str) -> str:
    if value == "-":
        return ""
    try:
        return base64.b64decode(value, validate=True).decode("utf-8", errors="replace")
    except (binascii.Error, ValueError):
        raise MalformedProbe(f"{what} is not base64") from None


def parse_probe(output: str) -> VmReport:
    """The ``VmReport`` of one probe's standard output."""
    fields: dict[str, str] = {}
    containers: list[ContainerReport] = []
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        if key == "container":
            containers.append(_parse_container(value))
        else:
            fields[key] = value
    if _END not in fields or "phase" not in fields:
        raise MalformedProbe(f"the probe printed {len(output)} characters without its fields")
    phase_line = _decode(fields["phase"], "phase").strip()
    phase, _, phase_message = phase_line.partition(" ")
    return VmReport(
        phase=phase,
        phase_message=phase_message,
        exit_code=_decode(fields.get("exit-code", "-"), "exit-code").strip(),
        start_error=_decode(fields.get("sandbox-error", "-"), "sandbox-error").strip(),
        containers=tuple(containers),
        published=parse_ports(_decode(fields.get("sandbox-ports", "-"), "sandbox-ports")),
    )


_PORT_KEY: Final = re.compile(r"(?P<port>\d{1,5})/(?P<protocol>tcp|udp|sctp)")
_PORTS_WHERE: Final = "sandbox.NetworkSettings.Ports"
# Docker's HostIp of a port published on every IPv4 address (the public one among them); older
# Dockers leave it empty. Read from Docker's answer, never bound here.
_EVERY_IPV4: Final = frozenset({"0.0.0.0", ""})  # noqa: S104


def parse_ports(text: str) -> tuple[PublishedPort, ...]:
    """``docker container inspect --format PORTS_FORMAT`` of the sandbox: each port bound on
    every IPv4 address of the VM (``HostIp`` ``0.0.0.0``, or empty as older Dockers print
    it), in port order. Nothing (no sandbox), ``null`` and ``{}`` (it does not run) are none;
    a port exposed but not published (``null``) or bound to one address only is left out."""
    text = text.strip()
    if not text:
        return ()
    try:
        answer = json.loads(text)
    except ValueError:
        raise MalformedProbe(f"{_PORTS_WHERE}: docker printed no JSON: {text[:200]!r}") from None
    if answer is None:
        return ()
    if not isinstance(answer, dict):
        raise MalformedProbe(f"{_PORTS_WHERE} is not an object")
    found: list[PublishedPort] = []
    for key, bindings in answer.items():
        match = _PORT_KEY.fullmatch(str(key))
        if match is None or not 1 <= int(match.group("port")) <= 65535:
            raise MalformedProbe(f"{_PORTS_WHERE} key {str(key)[:40]!r} is not <port>/<proto>")
        if bindings is None:
            continue
        if not isinstance(bindings, list):
            raise MalformedProbe(f"{_PORTS_WHERE}[{key}] is not a list of bindings")
        for binding in bindings:
            host_port = _host_port(binding, where=f"{_PORTS_WHERE}[{key}]")
            if host_port is not None:
                port = int(match.group("port"))
                found.append(PublishedPort(port, match.group("protocol"), host_port))
                break
    return tuple(sorted(found, key=lambda p: (p.container_port, p.protocol)))


def _host_port(binding: object, *, where: str) -> int | None:
    """The ``HostPort`` of a ``PortBinding`` on every IPv4 address; None for another one."""
    if not isinstance(binding, dict):
        raise MalformedProbe(f"{where} holds a binding that is not an object")
    host_ip, host_port = binding.get("HostIp", ""), binding.get("HostPort")
    if not isinstance(host_ip, str):
        raise MalformedProbe(f"{where}.HostIp is not a string")
    if not isinstance(host_port, str) or not (host_port.isdigit() or host_port == ""):
        raise MalformedProbe(f"{where}.HostPort is not a port number")
    if host_ip not in _EVERY_IPV4 or not host_port or not 1 <= int(host_port) <= 65535:
        return None  # IPv6 only, one address (not the public one), or no port yet
    return int(host_port)


def _parse_container(line: str) -> ContainerReport:
    parts = line.split(" ")
    if len(parts) != 5 or parts[0] not in _KINDS or not parts[2].isdigit():
        raise MalformedProbe(f"a container line of the probe is not well formed: {line[:80]!r}")
    kind, name, rc, inspected, error = parts
    text = _decode(inspected, f"containers[{name}].inspect").strip()
    start_error = _decode(error, f"containers[{name}].start-error").strip()
    if rc == "0":
        state = parse_state(text, where=f"containers[{name}]")
        return ContainerReport(cast(Kind, kind), name, state, start_error)
    if "no such" in text.lower():
        return ContainerReport(cast(Kind, kind), name, None, start_error)
    docker_error = text[-500:] or f"docker inspect exited with {rc}"
    return ContainerReport(cast(Kind, kind), name, None, start_error, docker_error)


def parse_state(text: str, *, where: str = "container") -> ContainerState:
    """``docker inspect --format INSPECT_FORMAT`` as a ``ContainerState``; an answer without
    what Docker's API documents raises ``MalformedProbe`` naming the field."""
    try:
        answer = json.loads(text)
    except ValueError:
        raise MalformedProbe(f"{where}: docker inspect printed no JSON: {text[:200]!r}") from None
    if not isinstance(answer, dict):
        raise MalformedProbe(f"{where}: docker inspect printed no object")
    state = answer.get("State")
    if not isinstance(state, dict):
        raise MalformedProbe(f"{where}.State is missing or not an object")
    status = state.get("Status")
    if not isinstance(status, str) or status not in STATUSES:
        raise MalformedProbe(f"{where}.State.Status {str(status)[:40]!r} is not a Docker status")
    code = state.get("ExitCode")
    if not isinstance(code, int) or isinstance(code, bool):
        raise MalformedProbe(f"{where}.State.ExitCode is not an integer")
    restarts = answer.get("RestartCount", 0)
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
        raise MalformedProbe(f"{where}.RestartCount is not a count")
    error = state.get("Error", "")
    if not isinstance(error, str):
        raise MalformedProbe(f"{where}.State.Error is not a string")
    times: dict[str, datetime | None] = {}
    for key in ("StartedAt", "FinishedAt"):
        value = state.get(key, "")
        if not isinstance(value, str):
            raise MalformedProbe(f"{where}.State.{key} is not a string")
        times[key] = parse_docker_time(value)
        if value and times[key] is None and not value.startswith("0001-01-01"):
            raise MalformedProbe(f"{where}.State.{key} {value[:40]!r} is not an RFC 3339 time")
    return ContainerState(
        status=status,
        exit_code=code,
        error=error,
        oom_killed=state.get("OOMKilled") is True,
        started_at=times["StartedAt"],
        finished_at=times["FinishedAt"],
        restart_count=restarts,
    )


_DOCKER_TIME: Final = re.compile(
    r"(?P<base>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<fraction>\d+))?(?P<zone>Z|[+-]\d\d:\d\d)"
)


def parse_docker_time(value: object) -> datetime | None:
    """Docker's RFC 3339 times (nanoseconds allowed); None for its zero time or anything odd."""
    if not isinstance(value, str):
        return None
    match = _DOCKER_TIME.fullmatch(value.strip())
    if match is None:
        return None
    fraction = (match.group("fraction") or "0")[:6].ljust(6, "0")
    zone = "+00:00" if match.group("zone") == "Z" else match.group("zone")
    try:
        when = datetime.fromisoformat(f"{match.group('base')}.{fraction}{zone}").astimezone(UTC)
    except ValueError:
        return None
    return None if when.year <= 1 else when
