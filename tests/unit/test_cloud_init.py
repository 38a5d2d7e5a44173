"""The cloud-init builder: document shape, quoting, secrets, ports, size.

The strongest checks run the generated ``run.sh`` for real: the files of ``write_files`` are
written to a temporary directory (as cloud-init would, with their permissions) and the script
runs under bash with a fake ``docker`` on PATH that records the exact argv and environment it
was given, so quoting is verified by a shell, not by reading strings.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from providers.cloud_init import (
    ENV_FILE,
    MAX_USER_DATA_BYTES,
    RUN_SCRIPT,
    SHELL_ENV_FILE,
    STATE_DIR,
    UNIT_NAME,
    build_user_data,
    container_name,
    docker_run_argv,
)
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import EnvVar, Port, WorkloadSpec

HOSTILE = (
    "it's",
    'say "hi"',
    "$(touch /tmp/pwned)",
    "`id`",
    "a; rm -rf /",
    "*",
    "--privileged",
    "two\nlines",
    "tab\there",
    "back\\slash",
    "ünïcødé ✓ 🚀",
    "",
    " leading and trailing ",
    "#not-a-comment",
    "key: value",
    "- item",
    "|",
    "%{x}",
    "nel\x85ls\u2028ps\u2029",
    "cr\r",
    "\x1b[31mred",
)


def make_spec(**overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "pod_uid": "0f5e2a8c-1b2d-4e6f-8a9b-0c1d2e3f4a5b",
        "namespace": "ns",
        "pod_name": "trainer",
        "container_name": "main",
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "attempt": 2,
        "gpu_count": 1,
    }
    fields.update(overrides)
    return WorkloadSpec(**fields)


def document(user_data: str) -> dict[str, Any]:
    assert user_data.startswith("#cloud-config\n")
    loaded = yaml.safe_load(user_data)
    assert isinstance(loaded, dict)
    return loaded


def files(user_data: str) -> dict[str, dict[str, Any]]:
    return {entry["path"]: entry for entry in document(user_data)["write_files"]}


def parse_env_file(text: str) -> dict[str, str | None]:
    """Docker's --env-file rules (opts/envfile.go): per line, left-trimmed, '#' comments."""
    parsed: dict[str, str | None] = {}
    for raw in text.split("\n"):  # Go's bufio.ScanLines: only "\n" ends a line
        line = raw.lstrip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert name and not any(c.isspace() for c in name), line
        parsed[name] = value if sep else None
    return parsed


# --- running the script -------------------------------------------------------------------

FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args and args[0] == "run":
    names = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    with open(os.environ["FAKE_DOCKER_OUT"], "w") as out:
        json.dump({{"argv": args, "env": {{n: os.environ.get(n) for n in names}}}}, out)
    sys.exit(int(os.environ.get("FAKE_DOCKER_EXIT", "0")))
sys.exit(0)  # info, pull
"""


def run_on_fake_vm(tmp_path: Path, user_data: str, *, exit_code: int = 0) -> dict[str, Any]:
    """Do what cloud-init and systemd would, with a fake docker; return what docker got."""
    for path, entry in files(user_data).items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(entry["content"])
        target.chmod(int(entry["permissions"], 8))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    out = tmp_path / "docker-run.json"
    runcmd = document(user_data)["runcmd"][0]
    assert runcmd[:2] == ["systemd-run", f"--unit={UNIT_NAME}"]
    script = runcmd[-1]
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_DOCKER_OUT": str(out),
        "FAKE_DOCKER_EXIT": str(exit_code),
    }
    result = subprocess.run(
        ["/bin/bash", script], env=env, capture_output=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    recorded: dict[str, Any] = json.loads(out.read_text())
    return recorded


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")


# --- tests --------------------------------------------------------------------------------


def test_document_shape_and_file_permissions() -> None:
    spec = make_spec(env=(EnvVar("A", "1"),))
    user_data = build_user_data(spec, gpus=True)
    written = files(user_data)
    env_file = written[f"{STATE_DIR}/{ENV_FILE}"]
    assert env_file["permissions"] == "0600"
    assert env_file["owner"] == "root:root"
    assert written[f"{STATE_DIR}/{RUN_SCRIPT}"]["permissions"] == "0700"
    assert f"{STATE_DIR}/{SHELL_ENV_FILE}" not in written  # only when needed
    assert document(user_data)["runcmd"] == [
        [
            "systemd-run",
            f"--unit={UNIT_NAME}",
            "--no-block",
            "--collect",
            "/bin/bash",
            f"{STATE_DIR}/{RUN_SCRIPT}",
        ]
    ]


def test_the_same_spec_gives_the_same_bytes() -> None:
    spec = make_spec(env=(EnvVar("A", "1"), EnvVar("B", "x\ny")), args=HOSTILE)
    assert build_user_data(spec, gpus=True) == build_user_data(spec, gpus=True)


@pytest.mark.parametrize(
    ("command", "args", "tail"),
    [
        ((), (), ["IMG"]),
        ((), ("serve", "--port", "80"), ["IMG", "serve", "--port", "80"]),
        (("python",), (), ["--entrypoint", "python", "IMG"]),
        (("python", "-m", "app"), ("--x",), ["--entrypoint", "python", "IMG", "-m", "app", "--x"]),
    ],
)
def test_command_replaces_entrypoint_and_args_replace_cmd(
    command: tuple[str, ...], args: tuple[str, ...], tail: list[str]
) -> None:
    spec = make_spec(image="IMG", command=command, args=args)
    argv = docker_run_argv(spec, gpus=False, env_file="/e")
    assert argv[:6] == ["docker", "run", "--name", container_name(spec), "--restart", "no"]
    assert argv[-len(tail) :] == tail
    assert "--gpus" not in argv


def test_gpus_env_file_ports_and_workdir() -> None:
    spec = make_spec(
        image="IMG",
        working_dir="/work dir",
        ports=(
            Port(8080),
            Port(8080, "TCP"),  # a duplicate is published once
            Port(53, "UDP"),
            Port(9000, "SCTP", name="s"),
        ),
    )
    argv = docker_run_argv(spec, gpus=True, env_file="/state/container.env")
    joined = " ".join(argv)
    assert "--gpus all" in joined
    assert "--env-file /state/container.env" in joined
    published = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--publish"]
    assert published == ["8080:8080/tcp", "53:53/udp", "9000:9000/sctp"]
    assert argv[argv.index("--workdir") + 1] == "/work dir"


def test_container_name_is_the_request_id_in_dockers_alphabet() -> None:
    assert container_name(make_spec(pod_uid="abc-1", attempt=3)) == "vk-abc-1.3"
    assert container_name(make_spec(pod_uid="a/b c", attempt=0)) == "vk-a-b-c.0"


def test_hostile_strings_reach_docker_unchanged(tmp_path: Path, state_dir: str) -> None:
    spec = make_spec(
        image="registry.example/img:1",
        command=("/bin/sh", "-c", *HOSTILE),
        args=HOSTILE,
        working_dir="/it's here",
        env=tuple(EnvVar(f"V{i}", value) for i, value in enumerate(HOSTILE)),
    )
    user_data = build_user_data(spec, gpus=True, state_dir=state_dir)
    got = run_on_fake_vm(tmp_path, user_data)
    env_file = f"{state_dir}/{ENV_FILE}"
    assert got["argv"] == docker_run_argv(spec, gpus=True, env_file=env_file)[1:]
    # Every value arrives: single-line ones through the env-file, the rest by name.
    from_file = parse_env_file(Path(env_file).read_text())
    received = {**{k: v for k, v in from_file.items() if v is not None}, **got["env"]}
    assert received == {f"V{i}": value for i, value in enumerate(HOSTILE)}


def test_exit_code_is_recorded(tmp_path: Path, state_dir: str) -> None:
    user_data = build_user_data(make_spec(), gpus=False, state_dir=state_dir)
    run_on_fake_vm(tmp_path, user_data, exit_code=42)
    assert Path(state_dir, "exit-code").read_text() == "42\n"
    assert Path(state_dir, "finished-at").read_text().strip().endswith("Z")


def test_secrets_are_on_no_command_line(tmp_path: Path, state_dir: str) -> None:
    secret = 's3cr3t-\'$(value)-"x"'
    multi = "-----BEGIN KEY-----\nabc\n-----END KEY-----"
    spec = make_spec(env=(EnvVar("TOKEN", secret, secret=True), EnvVar("PEM", multi, True)))
    user_data = build_user_data(spec, gpus=True, state_dir=state_dir)
    written = files(user_data)
    script = written[f"{state_dir}/{RUN_SCRIPT}"]["content"]
    for value in (secret, multi, "abc"):
        assert value not in script
        assert value not in json.dumps(document(user_data)["runcmd"])
    # Only in the owner-only files.
    assert written[f"{state_dir}/{ENV_FILE}"]["permissions"] == "0600"
    assert written[f"{state_dir}/{SHELL_ENV_FILE}"]["permissions"] == "0600"
    got = run_on_fake_vm(tmp_path, user_data)
    for value in (secret, multi):
        assert all(value not in arg for arg in got["argv"])  # docker's real argv
    assert "--env" in got["argv"] and "PEM" in got["argv"]
    assert got["env"] == {"PEM": multi}
    assert parse_env_file(Path(state_dir, ENV_FILE).read_text()) == {"TOKEN": secret}
    for name in (ENV_FILE, SHELL_ENV_FILE):
        assert stat.S_IMODE(Path(state_dir, name).stat().st_mode) == 0o600


def test_last_definition_of_a_variable_wins() -> None:
    spec = make_spec(env=(EnvVar("A", "1"), EnvVar("B", "2"), EnvVar("A", "3")))
    content = files(build_user_data(spec, gpus=False))[f"{STATE_DIR}/{ENV_FILE}"]["content"]
    assert parse_env_file(content) == {"B": "2", "A": "3"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"args": ("ok", "nul\0byte")}, "spec.containers[0].args[1]"),
        ({"command": ("a\0",)}, "spec.containers[0].command[0]"),
        ({"image": "img\0"}, "spec.containers[0].image"),
        ({"image": "--privileged"}, "spec.containers[0].image"),
        ({"image": ""}, "spec.containers[0].image"),
        ({"working_dir": "/\ud800"}, "spec.containers[0].workingDir"),
        ({"env": (EnvVar("BAD NAME", "v"),)}, "spec.containers[0].env[0].name"),
        (
            {"env": (EnvVar("OK", "v"), EnvVar("S", "x\0y", True))},
            "spec.containers[0].env[1].value",
        ),
        ({"env": (EnvVar("my.var", "two\nlines", True),)}, "spec.containers[0].env[0].name"),
    ],
)
def test_what_cannot_be_expressed_is_invalid_spec(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(make_spec(**overrides), gpus=True, provider="lambda-x")
    assert raised.value.field == field
    assert raised.value.provider == "lambda-x"
    for var in overrides.get("env", ()):
        assert var.value not in str(raised.value) or var.value == "v"


def test_values_too_long_for_an_env_file_line_are_exported(tmp_path: Path, state_dir: str) -> None:
    long = "z" * 70_000  # Docker's env-file lines end at 64 KiB
    spec = make_spec(env=(EnvVar("LONG", long, True), EnvVar("SHORT", "s")))
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir)
    got = run_on_fake_vm(tmp_path, user_data)
    assert got["env"] == {"LONG": long}
    assert parse_env_file(Path(state_dir, ENV_FILE).read_text()) == {"SHORT": "s"}


def test_a_value_longer_than_linux_allows_is_invalid() -> None:
    spec = make_spec(env=(EnvVar("HUGE", "z" * 200_000, True),))
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(spec, gpus=False)
    assert raised.value.field == "spec.containers[0].env[0].value"


def test_dotted_names_with_single_line_values_are_fine() -> None:
    spec = make_spec(env=(EnvVar("my.var-x", "v"),))
    content = files(build_user_data(spec, gpus=False))[f"{STATE_DIR}/{ENV_FILE}"]["content"]
    assert parse_env_file(content) == {"my.var-x": "v"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            {"env": tuple(EnvVar(f"BIG{i}", "x" * 100_000, True) for i in range(11))},
            "spec.containers[0].env",
        ),
        ({"args": ("y" * (MAX_USER_DATA_BYTES // 2),) * 2}, "spec.containers[0].args"),
    ],
)
def test_size_limit_names_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(make_spec(**overrides), gpus=True)
    assert raised.value.field == field
    assert str(MAX_USER_DATA_BYTES) in str(raised.value)
    assert "xxxxxxxx" not in str(raised.value)


def test_just_under_the_limit_is_accepted() -> None:
    env = tuple(EnvVar(f"BIG{i}", "x" * 99_000) for i in range(10))
    user_data = build_user_data(make_spec(env=env), gpus=True)
    assert len(user_data.encode()) <= MAX_USER_DATA_BYTES


_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"))


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(args=st.lists(_TEXT, max_size=4), value=_TEXT)
def test_any_text_round_trips_through_yaml_and_shell(
    tmp_path: Path, args: list[str], value: str
) -> None:
    state_dir = str(tmp_path / "state")
    spec = make_spec(args=tuple(args), env=(EnvVar("VALUE", value, True),))
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir)
    got = run_on_fake_vm(tmp_path, user_data)
    env_file = f"{state_dir}/{ENV_FILE}"
    assert got["argv"] == docker_run_argv(spec, gpus=False, env_file=env_file)[1:]
    if "VALUE" in got["env"]:
        assert got["env"]["VALUE"] == value
    else:
        assert parse_env_file(Path(env_file).read_text())["VALUE"] == value


@settings(max_examples=150, deadline=None)
@given(args=st.lists(_TEXT, max_size=4), value=_TEXT)
def test_yaml_keeps_every_character(args: list[str], value: str) -> None:
    """What cloud-init's yaml.safe_load reads is exactly what was meant (no shell: fast)."""
    spec = make_spec(args=tuple(args), env=(EnvVar("VALUE", value, True),))
    written = files(build_user_data(spec, gpus=False))
    script = written[f"{STATE_DIR}/{RUN_SCRIPT}"]["content"]
    for arg in args:
        assert shlex.quote(arg) in script
    exported = written.get(f"{STATE_DIR}/{SHELL_ENV_FILE}")
    if exported is not None:
        assert f"export VALUE={shlex.quote(value)}\n" in exported["content"]
    else:
        assert f"\nVALUE={value}\n" in written[f"{STATE_DIR}/{ENV_FILE}"]["content"]
