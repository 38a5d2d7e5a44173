"""What the agent runs on a VM over SSH, and how it reads the answers: pure text in and out.

- ``probe_command`` — one round trip per poll: the boot script's ``phase`` and ``start-error``
  files (``providers.boot_script``) and ``docker inspect`` of the container named for the
  request id; while the VM waits for it, the same command stores the secret environment's
  passphrase that the adapter sends on its standard input (and ignores it otherwise).
  ``parse_probe`` reads its output into a ``VmReport``.
- ``logs_command`` — ``docker logs`` with what ``LogOptions`` asks (tail, since, timestamps,
  follow), stdout and stderr merged; exit status ``NO_CONTAINER`` when there is no container.

Both run as root: through ``sudo -n`` unless the SSH user is root (on Lambda's images the
``ubuntu`` user has password-less sudo). File contents travel base64-encoded, so nothing a
container or a registry prints can break the framing.

Invariants: every value is ``shlex.quote``\\d into the command; no secret is ever on a command
line (the passphrase goes on standard input); parsing never raises on odd text except
``MalformedProbe``, which says what was wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from providers.boot_script import PASSPHRASE_FILE, PHASE_FILE, START_ERROR_FILE
from vk_provider.domain.models import LogOptions

NO_CONTAINER: Final = 44
_FILE_TAIL_BYTES: Final = 4096
_INSPECT_TAIL_BYTES: Final = 16384
_END: Final = "end"

_PROBE_SCRIPT: Final = f"""set -u
state=$1
name=$2
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
field() {{
    if [ -r "$2" ]; then
        printf '%s %s\\n' "$1" "$(tail -c {_FILE_TAIL_BYTES} "$2" | base64 | tr -d '\\n')"
    else
        printf '%s -\\n' "$1"
    fi
}}
field phase "$state/{PHASE_FILE}"
field start-error "$state/{START_ERROR_FILE}"
out=$(docker inspect --type container --format '{{{{json .State}}}}' "$name" 2>&1)
rc=$?
out=$(printf '%s' "$out" | tail -c {_INSPECT_TAIL_BYTES} | base64 | tr -d '\\n')
printf 'inspect %s %s\\n' "$rc" "$out"
printf '{_END}\\n'
"""

_LOGS_SCRIPT: Final = f"""name=$1
shift
docker inspect --type container "$name" > /dev/null 2>&1 || {{
    echo "vk-provider: no container $name on this VM yet" >&2
    exit {NO_CONTAINER}
}}
exec docker logs "$@" "$name" 2>&1
"""


class MalformedProbe(ValueError):
    """The probe's output is not what ``probe_command`` prints (sudo refused, a broken shell)."""


@dataclass(frozen=True, slots=True)
class ContainerState:
    """``docker inspect``'s ``.State`` of the pod's container."""

    status: str  # created, running, paused, restarting, removing, exited, dead
    exit_code: int
    error: str = ""
    oom_killed: bool = False
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class VmReport:
    """What one probe found on the VM."""

    phase: str = ""  # the boot script's phase; "" before it wrote one
    phase_message: str = ""
    start_error: str = ""  # docker run's own error output, when it failed
    container: ContainerState | None = None  # None: no such container (yet)
    docker_error: str = ""  # docker inspect failed for another reason (daemon down, no docker)


def _sudo(user: str) -> list[str]:
    return [] if user == "root" else ["sudo", "-n"]


def probe_command(*, user: str, state_dir: str, container: str) -> str:
    """The command line of one probe (its standard input: the passphrase, or nothing)."""
    argv = [*_sudo(user), "sh", "-c", _PROBE_SCRIPT, "vk-probe", state_dir, container]
    return shlex.join(argv)


def logs_command(*, user: str, container: str, options: LogOptions) -> str:
    """``docker logs`` of the container, as ``options`` ask (``limit_bytes`` is the caller's)."""
    flags: list[str] = []
    if options.tail_lines is not None:
        flags += ["--tail", str(max(options.tail_lines, 0))]
    if options.since_seconds is not None:
        flags += ["--since", f"{max(options.since_seconds, 0)}s"]
    if options.timestamps:
        flags.append("--timestamps")
    if options.follow:
        flags.append("--follow")
    argv = [*_sudo(user), "sh", "-c", _LOGS_SCRIPT, "vk-logs", container, *flags]
    return shlex.join(argv)


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
    for line in output.splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value
    if _END not in fields or "phase" not in fields or "inspect" not in fields:
        raise MalformedProbe(f"the probe printed {len(output)} characters without its fields")
    phase_line = _decode(fields["phase"], "phase").strip()
    phase, _, phase_message = phase_line.partition(" ")
    rc_text, _, inspected = fields["inspect"].partition(" ")
    if not rc_text.isdigit():
        raise MalformedProbe(f"docker inspect's status {rc_text[:20]!r} is not a number")
    text = _decode(inspected, "inspect").strip()
    container: ContainerState | None = None
    docker_error = ""
    if rc_text == "0":
        container = parse_state(text)
    elif "no such" not in text.lower():
        docker_error = text[-500:] or f"docker inspect exited with {rc_text}"
    return VmReport(
        phase=phase,
        phase_message=phase_message,
        start_error=_decode(fields.get("start-error", "-"), "start-error").strip(),
        container=container,
        docker_error=docker_error,
    )


def parse_state(text: str) -> ContainerState:
    """``docker inspect --format '{{json .State}}'`` as a ``ContainerState``."""
    try:
        state = json.loads(text)
    except ValueError:
        raise MalformedProbe(f"docker inspect printed no JSON: {text[:200]!r}") from None
    if not isinstance(state, dict) or not isinstance(state.get("Status"), str):
        raise MalformedProbe("docker inspect's State has no Status")
    code = state.get("ExitCode")
    error = state.get("Error")
    return ContainerState(
        status=state["Status"],
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
        error=error if isinstance(error, str) else "",
        oom_killed=state.get("OOMKilled") is True,
        started_at=parse_docker_time(state.get("StartedAt")),
        finished_at=parse_docker_time(state.get("FinishedAt")),
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
