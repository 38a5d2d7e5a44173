"""What the local provider starts: the checked argv and environment, and the runner's command.

Invariants: pure; a command or environment a process cannot take (empty argv, NUL bytes, ``=``
in a name) is ``InvalidSpec`` naming the pod field; the program inherits only ``PATH``,
``HOME`` and ``LANG`` from the agent, everything else comes from the pod spec.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from providers.local.records import ENV_FILE, EXIT_FILE, LOG_FILE, STARTED_FILE
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import WorkloadSpec

# Variables the program inherits from the agent; everything else comes from the pod spec.
_BASE_ENV = ("PATH", "HOME", "LANG")
# The directory that holds the ``providers`` package: the runner starts there so that
# ``python -m providers.local.runner`` runs this very code, installed or not.
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
_COMMAND_FIELD = "spec.containers[0].command"


def process_environment(spec: WorkloadSpec) -> dict[str, str]:
    """The program's environment: the agent's base variables, then the pod's."""
    env = {name: os.environ[name] for name in _BASE_ENV if name in os.environ}
    env.update({var.name: var.value for var in spec.env})
    return env


def check_runnable(argv: list[str], env: dict[str, str], *, provider: str) -> None:
    """``InvalidSpec`` when a process cannot be started with ``argv`` and ``env``."""
    if not argv:
        raise InvalidSpec(
            "the local provider runs the container's command as a local process and "
            "ignores the image, so the container needs a command (or args)",
            provider=provider,
            field=_COMMAND_FIELD,
        )
    if any("\0" in arg for arg in argv):
        raise InvalidSpec(
            "command and args must not contain NUL characters",
            provider=provider,
            field=_COMMAND_FIELD,
        )
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise InvalidSpec(
                f"environment variable {name!r} cannot be set on a process",
                provider=provider,
                field="spec.containers[0].env",
            )


def runner_command(
    directory: Path, *, workdir: Path | None, startup_seconds: float, argv: list[str]
) -> list[str]:
    """``python -m providers.local.runner`` for the instance in ``directory``; the program runs
    in ``workdir`` when it is a directory, else in the instance's own."""
    cwd = workdir if workdir is not None and workdir.is_dir() else directory
    return [
        sys.executable,
        "-m",
        "providers.local.runner",
        "--log",
        str(directory / LOG_FILE),
        "--exit-file",
        str(directory / EXIT_FILE),
        "--started-file",
        str(directory / STARTED_FILE),
        "--env-file",
        str(directory / ENV_FILE),
        "--cwd",
        str(cwd),
        "--start-delay",
        str(startup_seconds),
        "--",
        *argv,
    ]
