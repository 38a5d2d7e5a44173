"""What the local provider starts: each container's checked argv and environment, the pod's
plan on disk (``layout.py``), and the pod runner's command.

Invariants: a command or environment a process cannot take (empty argv, NUL bytes, ``=`` in a
name) is ``InvalidSpec`` naming the container's pod field; a program inherits only ``PATH``,
``HOME`` and ``LANG`` from the agent, everything else comes from the pod spec; a container's
environment file is owner-only (it may hold secrets).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from vk_provider.sdk import ContainerSpec, EnvVar, InvalidSpec, WorkloadSpec
from vk_provider_adapters.local.layout import (
    CONTAINER_ENV,
    CONTAINER_ORDER,
    CONTAINER_SPEC,
    CONTAINERS_DIR,
    POD_PLAN,
    container_dir,
)
from vk_provider_adapters.local.records import write_json

# Variables the program inherits from the agent; everything else comes from the pod spec.
_BASE_ENV = ("PATH", "HOME", "LANG")
# The ``providers`` package's directory: the runner's working directory. Its parent is put
# on the runner's path, so the runner runs this very code, installed or not.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class LocalContainer:
    """One container as the pod runner runs it: a local program."""

    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str | None = None
    ports: tuple[int, ...] = ()
    init: bool = False
    sidecar: bool = False


def process_environment(env: tuple[EnvVar, ...]) -> dict[str, str]:
    """A program's environment: the agent's base variables, then the container's."""
    result = {name: os.environ[name] for name in _BASE_ENV if name in os.environ}
    result.update({var.name: var.value for var in env})
    return result


def check_runnable(argv: list[str], env: dict[str, str], *, provider: str, field: str) -> None:
    """``InvalidSpec`` when a process cannot be started with ``argv`` and ``env``."""
    if not argv:
        raise InvalidSpec(
            "the local provider runs the container's command as a local process and "
            "ignores the image, so the container needs a command (or args)",
            provider=provider,
            field=f"{field}.command",
        )
    if any("\0" in arg for arg in argv):
        raise InvalidSpec(
            "command and args must not contain NUL characters",
            provider=provider,
            field=f"{field}.command",
        )
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise InvalidSpec(
                f"environment variable {name!r} cannot be set on a process",
                provider=provider,
                field=f"{field}.env",
            )


def _local(
    container: ContainerSpec, field: str, *, provider: str, init: bool = False
) -> LocalContainer:
    argv = [*container.command, *container.args]
    env = process_environment(container.env)
    check_runnable(argv, env, provider=provider, field=field)
    workdir = container.working_dir
    if workdir and not Path(workdir).is_dir():
        # Programs run in place on this machine: a directory nobody made is a spec error
        # (as the runtime's CreateContainerError), not a silent run somewhere else.
        raise InvalidSpec(
            f"workingDir {workdir!r} is not a directory on this machine (the local provider "
            "runs the command in place and creates no directories)",
            provider=provider,
            field=f"{field}.workingDir",
        )
    return LocalContainer(
        name=container.name,
        argv=tuple(argv),
        env=env,
        cwd=workdir or None,
        ports=tuple(p.container_port for p in container.ports),
        init=init,
        sidecar=init and container.sidecar,
    )


def local_containers(
    spec: WorkloadSpec, *, provider: str
) -> tuple[list[LocalContainer], list[LocalContainer]]:
    """(init containers, app containers) of ``spec``, each checked runnable."""
    return (
        [
            _local(c, f"spec.initContainers[{i}]", provider=provider, init=True)
            for i, c in enumerate(spec.init_containers)
        ],
        [
            _local(c, f"spec.containers[{i}]", provider=provider)
            for i, c in enumerate(spec.containers)
        ],
    )


def write_pod(
    directory: Path,
    *,
    pod_name: str,
    restart_policy: str,
    backoff_seconds: float,
    inits: list[LocalContainer],
    apps: list[LocalContainer],
) -> None:
    """The plan the pod runner follows, and each container's spec and environment.

    Written into a new instance directory before its ``instance.json``, so nobody reads these
    files yet: they are written in place, not renamed into place (on this kind of disk every
    file-system operation costs about half a millisecond, and a create makes a dozen).
    """
    (directory / CONTAINERS_DIR).mkdir()
    for container in (*inits, *apps):
        where = container_dir(directory, container.name)
        where.mkdir()
        # A program without its own working directory runs in its container's directory.
        cwd = container.cwd or str(where)
        write_json(
            where / CONTAINER_SPEC,
            {
                "argv": list(container.argv),
                "cwd": cwd,
                "ports": list(container.ports),
                "init": container.init,
                "sidecar": container.sidecar,
            },
            atomic=False,
        )
        # May hold secrets: owner-only.
        write_json(where / CONTAINER_ENV, container.env, mode=0o600, atomic=False)
    order = [c.name for c in (*inits, *apps)]
    write_json(directory / CONTAINERS_DIR / CONTAINER_ORDER, order, atomic=False)
    write_json(
        directory / POD_PLAN,
        {
            "pod": pod_name,
            "restart_policy": restart_policy,
            "backoff_seconds": backoff_seconds,
            "init": [c.name for c in inits],
            "apps": [c.name for c in apps],
        },
        atomic=False,
    )


def runner_command(directory: Path, *, startup_seconds: float) -> list[str]:
    """The pod runner (``vk_provider_adapters.local.runner``) for the instance in ``directory``.

    Started with ``-S``: the runner imports only the standard library and its own package,
    so the interpreter skips the site packages and their ``.pth`` hooks (about a quarter of
    its start-up, per pod); the directory holding ``providers`` is put on the path instead.
    """
    source = str(PACKAGE_ROOT.parent)
    bootstrap = (
        f"import sys; sys.path.insert(0, {source!r}); "
        "from vk_provider_adapters.local.runner import main; sys.exit(main())"
    )
    return [
        sys.executable,
        "-S",
        "-c",
        bootstrap,
        "--instance",
        str(directory),
        "--start-delay",
        str(startup_seconds),
    ]
