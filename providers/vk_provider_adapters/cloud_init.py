"""Cloud-init ``user_data`` that runs one pod — every container of it — on a fresh GPU VM.

Clouds that rent whole VMs (Lambda Cloud) take a cloud-init document at launch and nothing
else; this module turns a ``WorkloadSpec`` into that document. It is a pure function of its
inputs: no I/O, no clock, no randomness, so the same inputs always give the same bytes.

What the VM gets (everything under ``state_dir``, ``/var/lib/vk-provider`` by default)::

    pod.list                           the pod's containers in run order, "<kind> <name>" per
                                       line (kind: init, sidecar, app); the agent reads it
    containers/<name>/container.env    the container's plain environment, ``docker
                                       --env-file`` format (0600)
    containers/<name>/container-env.sh plain values ``--env-file`` cannot carry (line breaks;
                                       lines over Docker's 64 KiB limit), sourced for its
                                       ``docker run`` only (0600; only if needed)
    containers/<name>/secret.env.sealed, secret-env.sh.sealed
                                       its *secret* values, the same two ways, sealed to a
                                       passphrase the agent delivers over SSH
                                       (``vk_provider_adapters.sealed_env``; base64; 0600)
    run.sh                             the boot script (``vk_provider_adapters.boot_script``; 0700)

and, through cloud-init's own modules, the SSH host key the agent expects (``ssh_keys``: the
agent then verifies the VM from its first connection on) and any extra public keys of people
(``ssh_authorized_keys``). ``run.sh`` runs as the transient systemd unit
``vk-provider-workload`` (started by ``runcmd`` without waiting), so cloud-init finishes
booting while the VM prepares and the pod runs. The containers, their names, network, volumes
and restart policies are ``vk_provider_adapters.docker_run``'s.

Invariants:
- No secret env value (``EnvVar.secret``) of any container is in the document in any readable
  form: each is only in a sealed file. No env value at all is on a command line: values live
  in 0600 files; ``docker run`` gets ``--env-file`` and, for values an env-file cannot carry,
  the *name* (Docker reads the value from its own environment).
- Every string from the pod reaches the shell through ``shlex.quote`` and the YAML through
  ``yaml.safe_dump``; cloud-init reads it back with ``yaml.safe_load``, so the round trip is
  exact for any text that can be a command-line argument at all. Text that cannot (NUL, lone
  surrogates) is refused with ``InvalidSpec`` naming the pod field, as is a container name
  that is not a DNS label.
- Containers are kept when they end (``docker inspect`` shows their state, exit code and
  restart count); restarts are Docker's, per container, as the pod's restartPolicy says.
- The document is at most ``MAX_USER_DATA_BYTES``; larger ones raise ``InvalidSpec`` naming
  the pod field that made it large.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from vk_provider.sdk import EnvVar, InvalidSpec, WorkloadSpec
from vk_provider_adapters.boot_script import (
    CONTAINERS_DIR,
    POD_LIST_FILE,
    SEALED_HEADER,
    SEALED_SUFFIX,
    ContainerRun,
    run_script,
)
from vk_provider_adapters.docker_run import (
    PAUSE_IMAGE,
    PodContainer,
    all_ports,
    container_argv,
    container_name_for,
    pod_containers,
    sandbox_argv,
    sandbox_name_for,
    volume_dirs,
)
from vk_provider_adapters.sealed_env import seal

# Lambda: "The user data string must be plain text and cannot exceed 1MB in size." Read as
# decimal megabytes, the stricter of the two readings.
MAX_USER_DATA_BYTES: Final = 1_000_000
STATE_DIR: Final = "/var/lib/vk-provider"
UNIT_NAME: Final = "vk-provider-workload"
ENV_FILE: Final = "container.env"
SHELL_ENV_FILE: Final = "container-env.sh"
SECRET_ENV_FILE: Final = "secret.env"  # noqa: S105 - a file name
SECRET_SHELL_ENV_FILE: Final = "secret-env.sh"  # noqa: S105 - a file name
RUN_SCRIPT: Final = "run.sh"

# Kubernetes' container names: RFC 1123 labels (they name files and containers on the VM).
_CONTAINER_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# Kubernetes accepts these environment variable names; Docker's env-file only refuses
# whitespace, which none of them contain.
_ENV_NAME: Final = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
# Names a shell can ``export``; only these can carry what the env-file cannot.
_SHELL_NAME: Final = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
# Docker reads the env-file with Go's bufio.Scanner, whose lines end at 64 KiB.
_ENV_FILE_LINE_MAX: Final = 64 * 1024 - 1
# Linux refuses an environment string ("NAME=value" and its NUL) over 128 KiB at exec.
_ENV_STRING_MAX: Final = 128 * 1024 - 1


@dataclass(frozen=True, slots=True)
class HostKey:
    """The VM's SSH host key, given to it by cloud-init (``ssh_keys``), so that the agent
    knows the key before it first connects. ``public`` is ``ssh-ed25519 AAAA...``."""

    private_openssh: str = field(repr=False)
    public: str


def build_user_data(
    spec: WorkloadSpec,
    *,
    gpus: bool,
    provider: str = "",
    state_dir: str = STATE_DIR,
    secret_passphrase: str | None = None,
    host_key: HostKey | None = None,
    authorized_keys: Sequence[str] = (),
    pause_image: str = PAUSE_IMAGE,
) -> str:
    """The ``#cloud-config`` document that runs the whole pod ``spec`` with Docker on the VM.

    ``gpus`` adds ``--gpus all`` to the containers that ask for GPUs (and the NVIDIA checks;
    the VM is the pod's alone). ``provider`` names the provider in errors.
    ``secret_passphrase`` seals the secret env values (required when there are any).
    ``host_key`` and ``authorized_keys`` go to cloud-init's ``ssh_keys`` and
    ``ssh_authorized_keys``; ``pause_image`` runs the pod's sandbox. Raises ``InvalidSpec``
    for what cannot be expressed, and when the document is too large.
    """
    containers = pod_containers(spec)
    files: list[dict[str, str]] = []
    runs: list[ContainerRun] = []
    for container in containers:
        found = _container_files(
            container,
            spec=spec,
            gpus=gpus,
            provider=provider,
            state_dir=state_dir,
            secret_passphrase=secret_passphrase,
        )
        files += found.files
        runs.append(found.run)
    listing = "".join(f"{c.kind} {c.spec.name}\n" for c in containers)
    files.append(_file(f"{state_dir}/{POD_LIST_FILE}", listing, "0644"))
    sandbox = sandbox_name_for(spec.request_id)
    script = run_script(
        state_dir=state_dir,
        images=[pause_image, *(c.spec.image for c in containers)],
        sandbox=sandbox,
        sandbox_run=sandbox_argv(
            name=sandbox, request_id=spec.request_id, ports=all_ports(containers), image=pause_image
        ),
        containers=runs,
        volume_dirs=volume_dirs(containers, state_dir=state_dir),
        gpus=gpus,
    )
    files.append(_file(f"{state_dir}/{RUN_SCRIPT}", script, "0700"))
    document: dict[str, Any] = {"write_files": files}
    if host_key is not None:
        document["ssh_keys"] = {
            "ed25519_private": host_key.private_openssh,
            "ed25519_public": host_key.public,
        }
    if authorized_keys:
        document["ssh_authorized_keys"] = list(authorized_keys)
    document["runcmd"] = [
        [
            "systemd-run",
            f"--unit={UNIT_NAME}",
            "--no-block",
            "--collect",
            "/bin/bash",
            f"{state_dir}/{RUN_SCRIPT}",
        ]
    ]
    user_data = "#cloud-config\n" + yaml.dump(
        document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1_000_000
    )
    size = len(user_data.encode("utf-8"))
    if size > MAX_USER_DATA_BYTES:
        where, contributed = _largest_contributor(containers)
        raise InvalidSpec(
            f"the cloud-init user_data that runs this pod would be {size} bytes, more than the "
            f"{MAX_USER_DATA_BYTES} Lambda accepts; {where} alone takes {contributed} bytes",
            provider=provider,
            field=where,
        )
    return user_data


def container_dir(state_dir: str, name: str) -> str:
    """A container's own directory on the VM: its env files and its ``docker run`` error."""
    return f"{state_dir}/{CONTAINERS_DIR}/{name}"


@dataclass(frozen=True, slots=True)
class _ContainerFiles:
    files: list[dict[str, str]]
    run: ContainerRun


def _check_container(container: PodContainer, provider: str) -> None:
    spec, where = container.spec, container.field
    if not _CONTAINER_NAME.fullmatch(spec.name):
        raise InvalidSpec(
            f"container name {spec.name[:80]!r} is not a DNS label",
            provider=provider,
            field=f"{where}.name",
        )
    _check_text(spec.image, f"{where}.image", provider)
    if not spec.image or spec.image.startswith("-"):
        raise InvalidSpec(
            f"image {spec.image[:200]!r} is not an image reference",
            provider=provider,
            field=f"{where}.image",
        )
    for index, arg in enumerate(spec.command):
        _check_text(arg, f"{where}.command[{index}]", provider)
    for index, arg in enumerate(spec.args):
        _check_text(arg, f"{where}.args[{index}]", provider)
    if spec.working_dir is not None:
        _check_text(spec.working_dir, f"{where}.workingDir", provider)


def _container_files(
    container: PodContainer,
    *,
    spec: WorkloadSpec,
    gpus: bool,
    provider: str,
    state_dir: str,
    secret_passphrase: str | None,
) -> _ContainerFiles:
    """One container's env files (plain, and secret ones sealed) and how run.sh starts it."""
    _check_container(container, provider)
    plan = _plan_env(container.spec.env, provider, container.field)
    if plan.has_secrets and not secret_passphrase:
        raise ValueError("secret env values need a passphrase to be sealed with")
    directory = container_dir(state_dir, container.spec.name)

    def path(name: str) -> str:
        return f"{directory}/{name}"

    files = [_file(path(ENV_FILE), _env_file(plan.plain_file, plan.plain_exported), "0600")]
    env_files = [path(ENV_FILE)]
    sources: list[str] = []
    if plan.plain_exported:
        files.append(_file(path(SHELL_ENV_FILE), _env_script(plan.plain_exported), "0600"))
        sources.append(path(SHELL_ENV_FILE))
    sealed: list[str] = []
    secret_contents = [
        (SECRET_ENV_FILE, plan.secret_file, _env_file(plan.secret_file, [])),
        (SECRET_SHELL_ENV_FILE, plan.secret_exported, _env_script(plan.secret_exported)),
    ]
    for name, variables, content in secret_contents:
        if variables and secret_passphrase:
            blob = seal(f"{SEALED_HEADER}\n{content}".encode(), secret_passphrase)
            files.append(_file(path(name + SEALED_SUFFIX), _base64_lines(blob), "0600"))
            sealed.append(path(name))
    if plan.secret_file:
        env_files.append(path(SECRET_ENV_FILE))
    if plan.secret_exported:
        sources.append(path(SECRET_SHELL_ENV_FILE))
    argv = container_argv(
        container,
        request_id=spec.request_id,
        pod_policy=spec.restart_policy,
        gpus=gpus,
        env_files=env_files,
        exported=_exported_names(container.spec.env),
        state_dir=state_dir,
        provider=provider,
    )
    run = ContainerRun(
        kind=container.kind,
        name=container.spec.name,
        docker_name=container_name_for(spec.request_id, container.spec.name),
        docker_run=argv,
        sources=sources,
        sealed=sealed,
    )
    return _ContainerFiles(files, run)


# --- environment ------------------------------------------------------------------------

Pairs = list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class _EnvPlan:
    """Where each variable goes: plain or secret (by its last definition), env-file or
    exported (by what the env-file can carry)."""

    plain_file: Pairs
    plain_exported: Pairs
    secret_file: Pairs
    secret_exported: Pairs

    @property
    def has_secrets(self) -> bool:
        return bool(self.secret_file or self.secret_exported)


def _plan_env(env: Iterable[EnvVar], provider: str, container: str) -> _EnvPlan:
    """The variables, validated, the last of a name winning (its order and its secrecy)."""
    latest: dict[str, EnvVar] = {}
    for index, var in enumerate(env):
        where = f"{container}.env[{index}]"
        if not _ENV_NAME.fullmatch(var.name):
            raise InvalidSpec(
                f"environment variable name {var.name!r} is not valid",
                provider=provider,
                field=f"{where}.name",
            )
        # The value itself never goes into a message: it may come from a Secret.
        _check_text(var.value, f"{where}.value", provider, what=f"the value of {var.name}")
        if len(f"{var.name}={var.value}".encode()) > _ENV_STRING_MAX:
            raise InvalidSpec(
                f"the value of {var.name} is longer than Linux allows for one environment "
                f"variable ({_ENV_STRING_MAX + 1} bytes with its name)",
                provider=provider,
                field=f"{where}.value",
            )
        if _needs_export(var.name, var.value) and not _SHELL_NAME.fullmatch(var.name):
            raise InvalidSpec(
                f"the value of {var.name} spans lines or is very long, which Docker's "
                "env-file cannot carry, and the name is not a shell variable name that "
                "could carry it instead",
                provider=provider,
                field=f"{where}.name",
            )
        latest.pop(var.name, None)  # re-insert so the order is that of the last definition
        latest[var.name] = var

    def pick(*, secret: bool, exported: bool) -> Pairs:
        return [
            (name, var.value)
            for name, var in latest.items()
            if var.secret == secret and _needs_export(name, var.value) == exported
        ]

    return _EnvPlan(
        plain_file=pick(secret=False, exported=False),
        plain_exported=pick(secret=False, exported=True),
        secret_file=pick(secret=True, exported=False),
        secret_exported=pick(secret=True, exported=True),
    )


def _needs_export(name: str, value: str) -> bool:
    """Whether Docker's env-file cannot carry the value verbatim.

    Docker reads it line by line (a line break ends the value; a trailing "\r" is dropped)
    and refuses lines over 64 KiB.
    """
    return "\n" in value or "\r" in value or len(f"{name}={value}".encode()) > _ENV_FILE_LINE_MAX


def _exported_names(env: Iterable[EnvVar]) -> list[str]:
    latest = {var.name: var.value for var in env}
    return [name for name, value in latest.items() if _needs_export(name, value)]


def _env_file(in_file: Pairs, exported: Pairs) -> str:
    # Docker's env-file format: NAME=VALUE taken verbatim up to the end of the line, no
    # quoting, '#' starts a comment line.
    lines = ["# The pod's environment (docker --env-file). Written by vk-provider."]
    lines += [f"{name}={value}" for name, value in in_file]
    if exported:
        lines.append(f"# {', '.join(n for n, _ in exported)}: exported by {SHELL_ENV_FILE}.")
    return "\n".join(lines) + "\n"


def _env_script(exported: Pairs) -> str:
    lines = ["# Values docker's env-file cannot carry; sourced by run.sh. Written by vk-provider."]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in exported]
    return "\n".join(lines) + "\n"


def _base64_lines(blob: bytes) -> str:
    """``base64`` as ``base64 -d`` reads it (76-character lines, as MIME writes them)."""
    return base64.encodebytes(blob).decode("ascii")


# --- helpers ------------------------------------------------------------------------------


def _check_text(value: str, where: str, provider: str, *, what: str | None = None) -> None:
    """Refuse text no command line or file can hold (NUL, unpaired surrogates)."""
    what = what or where
    if "\0" in value:
        raise InvalidSpec(f"{what} contains a NUL character", provider=provider, field=where)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSpec(
            f"{what} is not valid Unicode text", provider=provider, field=where
        ) from None


def _file(path: str, content: str, permissions: str) -> dict[str, str]:
    return {"path": path, "owner": "root:root", "permissions": permissions, "content": content}


def _largest_contributor(containers: Sequence[PodContainer]) -> tuple[str, int]:
    sizes: dict[str, int] = {}
    for container in containers:
        spec, where = container.spec, container.field
        sizes[f"{where}.env"] = sum(len(v.name) + len(v.value.encode()) for v in spec.env)
        sizes[f"{where}.command"] = sum(len(arg.encode()) for arg in spec.command)
        sizes[f"{where}.args"] = sum(len(arg.encode()) for arg in spec.args)
        sizes[f"{where}.image"] = len(spec.image.encode())
    largest = max(sizes, key=lambda name: sizes[name])
    return largest, sizes[largest]


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
