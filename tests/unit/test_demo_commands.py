"""The commands `vk-provider demo` prints work as printed, in a shell without the virtualenv.

``demo.shell_command`` renders each one with the absolute path of the program in this
interpreter's bin directory (the virtualenv's), so a person pasting it into a fresh terminal
does not get "command not found".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vk_provider_dev.cluster.demo import shell_command

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    ("program", "args", "expect"),
    [
        ("vk-provider", "--help", "virtual Kubernetes node"),
        ("vk-provider", "offers --help", "cheapest per GPU first"),
        ("kubectl", "version --client", "Client Version"),
    ],
)
def test_a_printed_command_runs_in_a_shell_without_the_virtualenv(
    program: str, args: str, expect: str
) -> None:
    line = shell_command(program, args)
    assert line == f"{BIN / program} {args}"
    bare = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    bare["PATH"] = "/usr/bin:/bin"  # no .venv/bin: as a new terminal has it
    done = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, env=bare, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert expect in done.stdout


def test_a_program_outside_the_virtualenv_is_printed_by_its_name() -> None:
    assert shell_command("curl", "http://127.0.0.1:8080/metrics") == (
        "curl http://127.0.0.1:8080/metrics"
    )


def test_a_path_with_spaces_is_quoted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    venv = tmp_path / "my venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "vk-provider").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    assert shell_command("vk-provider", "pods") == f"'{venv}/vk-provider' pods"
