"""Cloud-init ``user_data`` that runs one pod's container on a freshly booted GPU VM.

Clouds that rent whole VMs (Lambda Cloud) take a cloud-init document at launch and nothing
else; this module turns a ``WorkloadSpec`` into that document. It is a pure function of its
inputs: no I/O, no clock, no randomness, so the same spec always gives the same bytes.

What the VM does (everything under ``state_dir``, ``/var/lib/vk-provider`` by default)::

    container.env      the pod's environment in ``docker --env-file`` format (mode 0600)
    container-env.sh   values ``--env-file`` cannot carry (line breaks; lines over Docker's
                       64 KiB line limit), exported by the run script (mode 0600; written
                       only when such values exist)
    run.sh             waits for Docker, pulls the image, ``docker run``s it once (mode 0700)
    exit-code          the container's exit code, written atomically when it ends
    finished-at        when it ended (UTC, RFC 3339)

``run.sh`` runs as the transient systemd unit ``vk-provider-workload`` (started by cloud-init's
``runcmd`` without waiting), so cloud-init finishes booting while the container runs, and
``journalctl -u vk-provider-workload`` on the VM shows the container's output.

Invariants:
- No environment value (secret or not) appears on any command line: values live only in the
  0600 files above; ``docker run`` gets ``--env-file`` and, for the values the env-file cannot
  carry, the variable *name* (Docker then reads the value from its own environment).
- Every string from the pod reaches the shell through ``shlex.quote`` and the YAML through
  ``yaml.safe_dump``; cloud-init reads it back with ``yaml.safe_load``, so the round trip is
  exact for any text that can be a command-line argument at all. Text that cannot (NUL, lone
  surrogates) is refused with ``InvalidSpec`` naming the pod field.
- The container runs once (``--restart no``): restarts are the agent's decision.
- The document is at most ``MAX_USER_DATA_BYTES``; larger ones raise ``InvalidSpec`` naming
  the pod field that made it large.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any, Final

import yaml

from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import EnvVar, Port, WorkloadSpec

# Lambda: "The user data string must be plain text and cannot exceed 1MB in size." Read as
# decimal megabytes, the stricter of the two readings.
MAX_USER_DATA_BYTES: Final = 1_000_000
STATE_DIR: Final = "/var/lib/vk-provider"
UNIT_NAME: Final = "vk-provider-workload"
ENV_FILE: Final = "container.env"
SHELL_ENV_FILE: Final = "container-env.sh"
RUN_SCRIPT: Final = "run.sh"
EXIT_CODE_FILE: Final = "exit-code"

_CONTAINER: Final = "spec.containers[0]"
# Kubernetes accepts these environment variable names; Docker's env-file only refuses
# whitespace, which none of them contain.
_ENV_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
# Names a shell can ``export``; only these can carry what the env-file cannot.
_SHELL_NAME: Final = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
# Docker reads the env-file with Go's bufio.Scanner, whose lines end at 64 KiB.
_ENV_FILE_LINE_MAX: Final = 64 * 1024 - 1
# Linux refuses an environment string ("NAME=value" and its NUL) over 128 KiB at exec.
_ENV_STRING_MAX: Final = 128 * 1024 - 1
_DOCKER_NAME_CHARS: Final = re.compile(r"[^a-zA-Z0-9_.-]")
_PROTOCOLS: Final = {"TCP": "tcp", "UDP": "udp", "SCTP": "sctp"}
# How long run.sh waits for the Docker daemon, and how often it tries to pull the image.
_DOCKER_WAIT_TRIES: Final = 60
_DOCKER_WAIT_SECONDS: Final = 5
_PULL_TRIES: Final = 5


def container_name(spec: WorkloadSpec) -> str:
    """The Docker container name on the VM: ``vk-<request id>`` in Docker's alphabet."""
    return "vk-" + _DOCKER_NAME_CHARS.sub("-", spec.request_id)


def build_user_data(
    spec: WorkloadSpec,
    *,
    gpus: bool,
    provider: str = "",
    state_dir: str = STATE_DIR,
) -> str:
    """The ``#cloud-config`` document that runs ``spec`` with Docker on the VM.

    ``gpus`` adds ``--gpus all`` (the NVIDIA runtime; the VM is the pod's alone, so the
    container gets all of its GPUs). ``provider`` names the provider in errors. Raises
    ``InvalidSpec`` for what cannot be expressed, and when the document is too large.
    """
    _check_text(spec.image, f"{_CONTAINER}.image", provider)
    if not spec.image or spec.image.startswith("-"):
        raise InvalidSpec(
            f"image {spec.image[:200]!r} is not an image reference",
            provider=provider,
            field=f"{_CONTAINER}.image",
        )
    for index, arg in enumerate(spec.command):
        _check_text(arg, f"{_CONTAINER}.command[{index}]", provider)
    for index, arg in enumerate(spec.args):
        _check_text(arg, f"{_CONTAINER}.args[{index}]", provider)
    if spec.working_dir is not None:
        _check_text(spec.working_dir, f"{_CONTAINER}.workingDir", provider)
    in_file, exported = _split_env(spec.env, provider)

    files: list[dict[str, str]] = [
        _file(f"{state_dir}/{ENV_FILE}", _env_file(in_file, exported), "0600"),
    ]
    if exported:
        files.append(_file(f"{state_dir}/{SHELL_ENV_FILE}", _env_script(exported), "0600"))
    script = _run_script(spec, gpus=gpus, state_dir=state_dir, exported=bool(exported))
    files.append(_file(f"{state_dir}/{RUN_SCRIPT}", script, "0700"))
    document: dict[str, Any] = {
        "write_files": files,
        "runcmd": [
            [
                "systemd-run",
                f"--unit={UNIT_NAME}",
                "--no-block",
                "--collect",
                "/bin/bash",
                f"{state_dir}/{RUN_SCRIPT}",
            ]
        ],
    }
    user_data = "#cloud-config\n" + yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000
    )
    size = len(user_data.encode("utf-8"))
    if size > MAX_USER_DATA_BYTES:
        field, contributed = _largest_contributor(spec)
        raise InvalidSpec(
            f"the cloud-init user_data that runs this pod would be {size} bytes, more than the "
            f"{MAX_USER_DATA_BYTES} Lambda accepts; {field} alone takes {contributed} bytes",
            provider=provider,
            field=field,
        )
    return user_data


def docker_run_argv(spec: WorkloadSpec, *, gpus: bool, env_file: str) -> list[str]:
    """``docker run`` for ``spec``, as the argument list run.sh executes.

    Kubernetes' ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD; Docker's
    ``--entrypoint`` takes one executable, so the rest of ``command`` goes after the image.
    Setting ``--entrypoint`` also drops the image's CMD, as Kubernetes does.
    """
    argv = ["docker", "run", "--name", container_name(spec), "--restart", "no"]
    if gpus:
        argv += ["--gpus", "all"]
    argv += ["--env-file", env_file]
    for name in _exported_names(spec.env):
        argv += ["--env", name]  # the name only: Docker takes the value from its environment
    for port in _unique_ports(spec.ports):
        argv += ["--publish", f"{port.container_port}:{port.container_port}/{_protocol(port)}"]
    if spec.working_dir:
        argv += ["--workdir", spec.working_dir]
    if spec.command:
        argv += ["--entrypoint", spec.command[0], spec.image, *spec.command[1:]]
    else:
        argv.append(spec.image)
    argv += spec.args
    return argv


# --- environment ------------------------------------------------------------------------


def _split_env(
    env: Iterable[EnvVar], provider: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(for the env-file, to export) variables, validated, the last of a name winning."""
    latest: dict[str, str] = {}
    for index, var in enumerate(env):
        field = f"{_CONTAINER}.env[{index}]"
        if not _ENV_NAME.fullmatch(var.name):
            raise InvalidSpec(
                f"environment variable name {var.name!r} is not valid",
                provider=provider,
                field=f"{field}.name",
            )
        # The value itself never goes into a message: it may come from a Secret.
        _check_text(var.value, f"{field}.value", provider, what=f"the value of {var.name}")
        if len(f"{var.name}={var.value}".encode()) > _ENV_STRING_MAX:
            raise InvalidSpec(
                f"the value of {var.name} is longer than Linux allows for one environment "
                f"variable ({_ENV_STRING_MAX + 1} bytes with its name)",
                provider=provider,
                field=f"{field}.value",
            )
        if _needs_export(var.name, var.value) and not _SHELL_NAME.fullmatch(var.name):
            raise InvalidSpec(
                f"the value of {var.name} spans lines or is very long, which Docker's "
                "env-file cannot carry, and the name is not a shell variable name that "
                "could carry it instead",
                provider=provider,
                field=f"{field}.name",
            )
        latest.pop(var.name, None)  # re-insert so the order is that of the last definition
        latest[var.name] = var.value
    in_file = [(name, value) for name, value in latest.items() if not _needs_export(name, value)]
    exported = [(name, value) for name, value in latest.items() if _needs_export(name, value)]
    return in_file, exported


def _needs_export(name: str, value: str) -> bool:
    """Whether Docker's env-file cannot carry the value verbatim.

    Docker reads it line by line (a line break ends the value; a trailing "\r" is dropped)
    and refuses lines over 64 KiB.
    """
    return "\n" in value or "\r" in value or len(f"{name}={value}".encode()) > _ENV_FILE_LINE_MAX


def _exported_names(env: Iterable[EnvVar]) -> list[str]:
    latest = {var.name: var.value for var in env}
    return [name for name, value in latest.items() if _needs_export(name, value)]


def _env_file(in_file: list[tuple[str, str]], exported: list[tuple[str, str]]) -> str:
    # Docker's env-file format: NAME=VALUE taken verbatim up to the end of the line, no
    # quoting, '#' starts a comment line.
    lines = ["# The pod's environment (docker --env-file). Written by vk-provider."]
    lines += [f"{name}={value}" for name, value in in_file]
    if exported:
        lines.append(f"# {', '.join(n for n, _ in exported)}: exported by {SHELL_ENV_FILE}.")
    return "\n".join(lines) + "\n"


def _env_script(exported: list[tuple[str, str]]) -> str:
    lines = ["# Values docker's env-file cannot carry; sourced by run.sh. Written by vk-provider."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in exported]
    return "\n".join(lines) + "\n"


# --- the run script -----------------------------------------------------------------------


def _run_script(spec: WorkloadSpec, *, gpus: bool, state_dir: str, exported: bool) -> str:
    state = shlex.quote(state_dir)
    argv = docker_run_argv(spec, gpus=gpus, env_file=f"{state_dir}/{ENV_FILE}")
    # The docker binary is resolved before the pod's exported variables are sourced: they
    # may set PATH.
    run = " ".join(['"$docker"', *(shlex.quote(arg) for arg in argv[1:])])
    source = f". {shlex.quote(f'{state_dir}/{SHELL_ENV_FILE}')}\n" if exported else ""
    return f"""#!/bin/bash
# Runs the pod's container once and records its exit code. Written by vk-provider.
set -u
state={state}

now() {{ date -u +%Y-%m-%dT%H:%M:%SZ; }}
finish() {{
    # Atomic: a reader sees no exit code or the whole one.
    printf '%s\\n' "$1" > "$state/{EXIT_CODE_FILE}.tmp"
    mv -f "$state/{EXIT_CODE_FILE}.tmp" "$state/{EXIT_CODE_FILE}"
    now > "$state/finished-at"
    exit 0
}}

# Docker may start after cloud-init's last stage: wait for the daemon.
ready=0
for _ in $(seq 1 {_DOCKER_WAIT_TRIES}); do
    if docker info > /dev/null 2>&1; then ready=1; break; fi
    sleep {_DOCKER_WAIT_SECONDS}
done
if [ "$ready" != 1 ]; then
    echo "vk-provider: the Docker daemon did not become ready" >&2
    finish 125
fi
docker=$(command -v docker)

# Registries fail now and then; docker run pulls once more if every try here failed.
for try in $(seq 1 {_PULL_TRIES}); do
    "$docker" pull {shlex.quote(spec.image)} && break
    [ "$try" = {_PULL_TRIES} ] || sleep $((try * 10))
done

{source}{run}
finish "$?"
"""


# --- helpers ------------------------------------------------------------------------------


def _check_text(value: str, field: str, provider: str, *, what: str | None = None) -> None:
    """Refuse text no command line or file can hold (NUL, unpaired surrogates)."""
    what = what or field
    if "\0" in value:
        raise InvalidSpec(f"{what} contains a NUL character", provider=provider, field=field)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSpec(
            f"{what} is not valid Unicode text", provider=provider, field=field
        ) from None


def _unique_ports(ports: Iterable[Port]) -> list[Port]:
    seen: set[tuple[int, str]] = set()
    unique: list[Port] = []
    for port in ports:
        key = (port.container_port, _protocol(port))
        if key not in seen:
            seen.add(key)
            unique.append(port)
    return unique


def _protocol(port: Port) -> str:
    return _PROTOCOLS.get(port.protocol.upper(), "tcp")


def _file(path: str, content: str, permissions: str) -> dict[str, str]:
    return {"path": path, "owner": "root:root", "permissions": permissions, "content": content}


def _largest_contributor(spec: WorkloadSpec) -> tuple[str, int]:
    sizes = {
        f"{_CONTAINER}.env": sum(len(v.name) + len(v.value.encode()) for v in spec.env),
        f"{_CONTAINER}.command": sum(len(arg.encode()) for arg in spec.command),
        f"{_CONTAINER}.args": sum(len(arg.encode()) for arg in spec.args),
        f"{_CONTAINER}.image": len(spec.image.encode()),
    }
    field = max(sizes, key=lambda name: sizes[name])
    return field, sizes[field]


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks (readable on the VM), when YAML allows."""


# YAML 1.1 reads these as line breaks ("\x85" even becomes "\n") in block and single-quoted
# scalars; only double quotes escape them. A literal block the emitter cannot write falls
# back to double quotes too, never to single quotes.
_YAML_BREAKS: Final = frozenset("\x85\u2028\u2029")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style: str | None = None
    if not _YAML_BREAKS.isdisjoint(value):
        style = '"'
    elif "\n" in value:
        style = "|"
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)
