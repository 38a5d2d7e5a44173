"""The cloud-init builder: document shape, quoting, secrets, ports, size.

The strongest checks run the generated ``run.sh`` for real: the files of ``write_files`` are
written to a temporary directory (as cloud-init would, with their permissions) and the script
runs under bash with a fake ``docker`` on PATH that records the exact argv and environment it
was given, so quoting is verified by a shell, not by reading strings.
"""

from __future__ import annotations

import base64
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

from tests.helpers import wait_until
from tests.unit import canary
from tests.workloads import workload
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import EnvVar, Port, WorkloadSpec
from vk_provider_adapters import sealed_env
from vk_provider_adapters.cloud_init import (
    ENV_FILE,
    MAX_USER_DATA_BYTES,
    RUN_SCRIPT,
    SECRET_ENV_FILE,
    SECRET_SHELL_ENV_FILE,
    SHELL_ENV_FILE,
    STATE_DIR,
    UNIT_NAME,
    HostKey,
    build_user_data,
    container_dir,
)
from vk_provider_adapters.docker_run import (
    container_argv,
    container_name_for,
    pod_containers,
    sandbox_argv,
    sandbox_name_for,
)

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


MAIN = "main"


def cfile(state_dir: str, name: str) -> str:
    """A file of the main container's directory on the VM."""
    return f"{container_dir(state_dir, MAIN)}/{name}"


def make_spec(**overrides: Any) -> WorkloadSpec:
    fields: dict[str, Any] = {
        "pod_uid": "0f5e2a8c-1b2d-4e6f-8a9b-0c1d2e3f4a5b",
        "namespace": "ns",
        "pod_name": "trainer",
        "container_name": MAIN,
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "attempt": 2,
        "gpu_count": 1,
    }
    fields.update(overrides)
    return workload(**fields)


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


def app_argv(
    spec: WorkloadSpec,
    *,
    gpus: bool,
    env_files: list[str],
    exported: tuple[str, ...] = (),
    state_dir: str = STATE_DIR,
) -> list[str]:
    """The ``docker run`` argv run.sh should execute for the spec's one app container."""
    return container_argv(
        pod_containers(spec)[-1],
        request_id=spec.request_id,
        pod_policy=spec.restart_policy,
        gpus=gpus,
        env_files=env_files,
        exported=list(exported),
        state_dir=state_dir,
    )


# --- running the script -------------------------------------------------------------------

PASSPHRASE = "7f" * 32

# The docker CLI as run.sh uses it. ``run`` records its argv (the last run's: the app
# container's), the environment of the names it is given with --env, and the content of each
# --env-file (run.sh deletes the secret one once docker has it); ``inspect`` says every
# container exited with FAKE_DOCKER_EXIT. Whole-pod lifecycles: ``test_pod_boot.py``.
FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args and args[0] == "run":
    names = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    files = [args[i + 1] for i, a in enumerate(args) if a == "--env-file"]
    with open(os.environ["FAKE_DOCKER_OUT"], "w") as out:
        json.dump({{"argv": args, "env": {{n: os.environ.get(n) for n in names}},
                   "env_files": {{f: open(f).read() for f in files}}}}, out)
    # The sandbox (no --network of its own) always starts; the pod's containers may fail.
    code = int(os.environ.get("FAKE_DOCKER_RUN_EXIT", "0")) if "--network" in args else 0
    if code:
        print("docker: Error response from daemon: pull access denied", file=sys.stderr)
    else:
        print("0123abcd")
    sys.exit(code)
if args and args[0] == "wait":
    print(os.environ.get("FAKE_DOCKER_EXIT", "0"))
    sys.exit(0)
if args and args[0] == "info" and "--format" in args:
    runtimes = {{"runc": {{}}}}
    if os.path.exists(os.environ["FAKE_VM"] + "/nvidia-runtime"):
        runtimes["nvidia"] = {{"path": "nvidia-container-runtime"}}
    print(json.dumps(runtimes))
    sys.exit(0)
if args and args[0] == "inspect":
    # Every container has exited with FAKE_DOCKER_EXIT (for run.sh's status_of).
    print("exited " + os.environ.get("FAKE_DOCKER_EXIT", "0"))
    sys.exit(0)
sys.exit(0)  # info, pull, stop
"""

# Every other tool the boot script may call: records its argv, succeeds unless told.
FAKE_TOOL = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_VM/calls"
[ -e "$FAKE_VM/fail-$(basename "$0")" ] && exit 1
case "$(basename "$0")" in
    nvidia-ctk) touch "$FAKE_VM/nvidia-runtime" ;;
    apt-get) case "$*" in *install*) ln -sf "$FAKE_VM/tool" "$FAKE_VM/bin/nvidia-ctk" ;; esac ;;
esac
exit 0
"""


def fake_vm(tmp_path: Path, *, nvidia_runtime: bool = True) -> Path:
    """A directory whose ``bin`` holds fake docker, nvidia-smi, apt-get, systemctl..."""
    vm = tmp_path / "vm"
    bin_dir = vm / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    tool = vm / "tool"
    tool.write_text(FAKE_TOOL)
    tool.chmod(0o755)
    for name in ("nvidia-smi", "apt-get", "systemctl", "curl", "gpg"):
        if not (bin_dir / name).is_symlink():
            (bin_dir / name).symlink_to(tool)
    if nvidia_runtime:
        (vm / "nvidia-runtime").touch()
    return vm


def write_files(user_data: str) -> None:
    """What cloud-init's write_files does."""
    for path, entry in files(user_data).items():
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(entry["content"])
        target.chmod(int(entry["permissions"], 8))


def deliver_key(state_dir: str, passphrase: str = PASSPHRASE) -> None:
    """What the agent does over SSH once the VM waits for it."""
    keys = Path(state_dir, "keys")
    keys.mkdir(mode=0o700, exist_ok=True)
    Path(keys, "env.pass").write_text(passphrase + "\n")


def boot(
    tmp_path: Path, user_data: str, vm: Path, *, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start run.sh as systemd would (the caller waits for it)."""
    runcmd = document(user_data)["runcmd"][0]
    assert runcmd[:2] == ["systemd-run", f"--unit={UNIT_NAME}"]
    environment = {
        "PATH": f"{vm / 'bin'}:{os.environ['PATH']}",
        "FAKE_DOCKER_OUT": str(tmp_path / "docker-run.json"),
        "FAKE_VM": str(vm),
        "VK_DOCKER_DAEMON_JSON": str(vm / "daemon.json"),
        **(env or {}),
    }
    return subprocess.Popen(
        ["/bin/bash", runcmd[-1]],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def run_on_fake_vm(
    tmp_path: Path,
    user_data: str,
    *,
    exit_code: int = 0,
    nvidia_runtime: bool = True,
    env: dict[str, str] | None = None,
    deliver: bool = True,
) -> dict[str, Any]:
    """Do what cloud-init, systemd and the agent would, with a fake docker; return what docker
    got (its argv, the --env values and the --env-file contents)."""
    write_files(user_data)
    state_dir = str(Path(document(user_data)["runcmd"][0][-1]).parent)
    if deliver and any(p.endswith(".sealed") for p in files(user_data)):
        deliver_key(state_dir)
    vm = fake_vm(tmp_path, nvidia_runtime=nvidia_runtime)
    (tmp_path / "docker-run.json").unlink(missing_ok=True)
    process = boot(tmp_path, user_data, vm, env={"FAKE_DOCKER_EXIT": str(exit_code), **(env or {})})
    try:
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    assert process.returncode == 0, stderr.decode()
    out = tmp_path / "docker-run.json"
    if not out.exists():
        return {"phase": Path(state_dir, "phase").read_text()}
    recorded: dict[str, Any] = json.loads(out.read_text())
    recorded["phase"] = Path(state_dir, "phase").read_text()
    return recorded


def received_env(got: dict[str, Any]) -> dict[str, str]:
    """Every variable docker was given, from its env-files and by name."""
    received: dict[str, str] = {}
    for content in got["env_files"].values():
        received.update({k: v for k, v in parse_env_file(content).items() if v is not None})
    received.update({k: v for k, v in got["env"].items() if v is not None})
    return received


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")


# --- tests --------------------------------------------------------------------------------


def test_document_shape_and_file_permissions() -> None:
    spec = make_spec(env=(EnvVar("A", "1"),))
    user_data = build_user_data(spec, gpus=True)
    written = files(user_data)
    env_file = written[cfile(STATE_DIR, ENV_FILE)]
    assert env_file["permissions"] == "0600"
    assert env_file["owner"] == "root:root"
    assert written[f"{STATE_DIR}/{RUN_SCRIPT}"]["permissions"] == "0700"
    assert cfile(STATE_DIR, SHELL_ENV_FILE) not in written  # only when needed
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
    argv = app_argv(spec, gpus=False, env_files=["/e"])
    name = container_name_for(spec.request_id, MAIN)
    assert argv[:6] == ["docker", "run", "--name", name, "--restart", "always"]
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
    argv = app_argv(spec, gpus=True, env_files=["/state/container.env"])
    joined = " ".join(argv)
    assert "--gpus all" in joined
    assert "--env-file /state/container.env" in joined
    assert argv[argv.index("--workdir") + 1] == "/work dir"
    # The sandbox owns the network namespace, so it publishes the ports; the container joins.
    assert "--publish" not in argv
    assert argv[argv.index("--network") + 1] == f"container:{sandbox_name_for(spec.request_id)}"
    sandbox = sandbox_argv(name="s", request_id="r", ports=spec.main.ports, image="pause")
    published = [sandbox[i + 1] for i, arg in enumerate(sandbox) if arg == "--publish"]
    assert published == ["8080:8080/tcp", "53:53/udp", "9000:9000/sctp"]


def test_container_names_are_the_request_id_and_the_container_in_dockers_alphabet() -> None:
    assert sandbox_name_for(make_spec(pod_uid="abc-1", attempt=3).request_id) == "vk-abc-1.3"
    assert sandbox_name_for(make_spec(pod_uid="a/b c", attempt=0).request_id) == "vk-a-b-c.0"
    assert container_name_for("abc-1.3", "web") == "vk-abc-1.3.web"


@pytest.mark.parametrize("secret", [False, True])
def test_hostile_strings_reach_docker_unchanged(
    tmp_path: Path, state_dir: str, secret: bool
) -> None:
    spec = make_spec(
        image="registry.example/img:1",
        command=("/bin/sh", "-c", *HOSTILE),
        args=HOSTILE,
        working_dir="/it's here",
        env=tuple(EnvVar(f"V{i}", value, secret) for i, value in enumerate(HOSTILE)),
    )
    user_data = build_user_data(spec, gpus=True, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    got = run_on_fake_vm(tmp_path, user_data)
    env_files = [cfile(state_dir, ENV_FILE)]
    if secret:
        env_files.append(cfile(state_dir, SECRET_ENV_FILE))
    exported = tuple(name for name in got["env"])
    expected = app_argv(
        spec, gpus=True, env_files=env_files, exported=exported, state_dir=state_dir
    )
    assert got["argv"] == expected[1:]
    # Every value arrives: single-line ones through an env-file, the rest by name.
    assert received_env(got) == {f"V{i}": value for i, value in enumerate(HOSTILE)}
    assert got["phase"].startswith("running ") or got["phase"].startswith("exited ")


def test_exit_code_is_recorded(tmp_path: Path, state_dir: str) -> None:
    user_data = build_user_data(make_spec(), gpus=False, state_dir=state_dir)
    run_on_fake_vm(tmp_path, user_data, exit_code=42)
    assert Path(state_dir, "exit-code").read_text() == "42\n"
    assert Path(state_dir, "finished-at").read_text().strip().endswith("Z")


def test_secrets_are_sealed_and_on_no_command_line(tmp_path: Path, state_dir: str) -> None:
    secret = 's3cr3t-\'$(value)-"x"'
    multi = "-----BEGIN KEY-----\nabc-line-of-the-key\n-----END KEY-----"
    spec = make_spec(
        env=(
            EnvVar("TOKEN", secret, secret=True),
            EnvVar("PEM", multi, True),
            EnvVar("PLAIN", "visible"),
        )
    )
    user_data = build_user_data(spec, gpus=True, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    # No form of a secret value anywhere in the document, nor the passphrase.
    for value in (secret, multi, PASSPHRASE):
        assert not canary.leaks(user_data, [value]), value
        assert base64.b64encode(value.encode()).decode() not in user_data
    written = files(user_data)
    for name in (SECRET_ENV_FILE, SECRET_SHELL_ENV_FILE):
        entry = written[cfile(state_dir, name) + ".sealed"]
        assert entry["permissions"] == "0600"
        assert sealed_env.unseal(base64.b64decode(entry["content"]), PASSPHRASE)
    assert parse_env_file(written[cfile(state_dir, ENV_FILE)]["content"]) == {"PLAIN": "visible"}
    got = run_on_fake_vm(tmp_path, user_data)
    for value in (secret, multi):
        assert all(value not in arg for arg in got["argv"])  # docker's real argv
    assert "--env" in got["argv"] and "PEM" in got["argv"]
    assert got["env"] == {"PEM": multi}
    assert parse_env_file(got["env_files"][cfile(state_dir, SECRET_ENV_FILE)]) == {"TOKEN": secret}
    # Once docker has them, the opened files and the passphrase are gone from the VM.
    for name in (SECRET_ENV_FILE, SECRET_SHELL_ENV_FILE):
        assert not Path(container_dir(state_dir, MAIN), name).exists(), name
    assert not Path(state_dir, "keys/env.pass").exists()
    assert stat.S_IMODE(Path(container_dir(state_dir, MAIN), ENV_FILE).stat().st_mode) == 0o600


def test_secrets_need_a_passphrase() -> None:
    with pytest.raises(ValueError, match="passphrase"):
        build_user_data(make_spec(env=(EnvVar("T", "x", True),)), gpus=False)


def test_a_secret_overridden_by_a_plain_value_is_plain_and_vice_versa() -> None:
    spec = make_spec(
        env=(EnvVar("A", "s1", True), EnvVar("A", "p1"), EnvVar("B", "p2"), EnvVar("B", "s2", True))
    )
    user_data = build_user_data(spec, gpus=False, secret_passphrase=PASSPHRASE)
    written = files(user_data)
    assert parse_env_file(written[cfile(STATE_DIR, ENV_FILE)]["content"]) == {"A": "p1"}
    sealed = written[cfile(STATE_DIR, SECRET_ENV_FILE) + ".sealed"]["content"]
    opened = sealed_env.unseal(base64.b64decode(sealed), PASSPHRASE).decode()
    assert parse_env_file(opened) == {"B": "s2"}
    assert "s1" not in user_data and "s2" not in user_data


def test_last_definition_of_a_variable_wins() -> None:
    spec = make_spec(env=(EnvVar("A", "1"), EnvVar("B", "2"), EnvVar("A", "3")))
    content = files(build_user_data(spec, gpus=False))[cfile(STATE_DIR, ENV_FILE)]["content"]
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
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    got = run_on_fake_vm(tmp_path, user_data)
    assert got["env"] == {"LONG": long}
    assert parse_env_file(Path(container_dir(state_dir, MAIN), ENV_FILE).read_text()) == {
        "SHORT": "s"
    }


def test_a_value_longer_than_linux_allows_is_invalid() -> None:
    spec = make_spec(env=(EnvVar("HUGE", "z" * 200_000, True),))
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(spec, gpus=False)
    assert raised.value.field == "spec.containers[0].env[0].value"


def test_dotted_names_with_single_line_values_are_fine() -> None:
    spec = make_spec(env=(EnvVar("my.var-x", "v"),))
    content = files(build_user_data(spec, gpus=False))[cfile(STATE_DIR, ENV_FILE)]["content"]
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
        build_user_data(make_spec(**overrides), gpus=True, secret_passphrase=PASSPHRASE)
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
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    got = run_on_fake_vm(tmp_path, user_data)
    env_files = [cfile(state_dir, ENV_FILE)]
    if "VALUE" not in got["env"]:
        env_files.append(cfile(state_dir, SECRET_ENV_FILE))
    expected = app_argv(
        spec, gpus=False, env_files=env_files, exported=tuple(got["env"]), state_dir=state_dir
    )
    assert got["argv"] == expected[1:]
    assert received_env(got)["VALUE"] == value


@settings(max_examples=150, deadline=None)
@given(args=st.lists(_TEXT, max_size=4), value=_TEXT)
def test_yaml_keeps_every_character(args: list[str], value: str) -> None:
    """What cloud-init's yaml.safe_load reads is exactly what was meant (no shell: fast)."""
    spec = make_spec(args=tuple(args), env=(EnvVar("VALUE", value),))
    written = files(build_user_data(spec, gpus=False))
    script = written[f"{STATE_DIR}/{RUN_SCRIPT}"]["content"]
    for arg in args:
        assert shlex.quote(arg) in script
    exported = written.get(cfile(STATE_DIR, SHELL_ENV_FILE))
    if exported is not None:
        assert f"export VALUE={shlex.quote(value)}\n" in exported["content"]
    else:
        assert f"\nVALUE={value}\n" in written[cfile(STATE_DIR, ENV_FILE)]["content"]


# --- the boot script's phases -------------------------------------------------------------


def phase_of(state_dir: str) -> str:
    path = Path(state_dir, "phase")
    return path.read_text() if path.exists() else ""


def test_host_key_and_people_keys_go_to_cloud_init() -> None:
    key = HostKey(
        private_openssh="-----BEGIN OPENSSH PRIVATE KEY-----\nx\n", public="ssh-ed25519 A"
    )
    user_data = build_user_data(
        make_spec(), gpus=False, host_key=key, authorized_keys=["ssh-ed25519 B ops@laptop"]
    )
    loaded = document(user_data)
    assert loaded["ssh_keys"] == {
        "ed25519_private": key.private_openssh,
        "ed25519_public": "ssh-ed25519 A",
    }
    assert loaded["ssh_authorized_keys"] == ["ssh-ed25519 B ops@laptop"]
    assert "x\n" not in repr(key)


def test_the_container_is_detached_kept_and_waited_for(tmp_path: Path, state_dir: str) -> None:
    spec = make_spec()
    got = run_on_fake_vm(tmp_path, build_user_data(spec, gpus=True, state_dir=state_dir))
    assert "--rm" not in got["argv"]
    assert got["argv"][got["argv"].index("--restart") + 1] == "always"  # Docker restarts it
    assert "--detach" in got["argv"]
    assert got["phase"] == "exited the pod's app containers exited (exit code 0)\n"
    calls = (tmp_path / "vm" / "calls").read_text()
    assert "nvidia-smi -L" in calls
    assert "apt-get" not in calls  # the runtime is there: nothing installed


def test_a_missing_nvidia_runtime_is_installed_and_configured(
    tmp_path: Path, state_dir: str
) -> None:
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "daemon.json").write_text('{"exec-opts": ["native.cgroupdriver=systemd"], "x": 1}')
    got = run_on_fake_vm(
        tmp_path, build_user_data(make_spec(), gpus=True, state_dir=state_dir), nvidia_runtime=False
    )
    calls = (vm / "calls").read_text().splitlines()
    installs = [c for c in calls if c.startswith("apt-get") and "install" in c]
    assert installs and "nvidia-container-toolkit" in installs[0]
    configure = f"nvidia-ctk runtime configure --runtime=docker --config={vm / 'daemon.json'}"
    assert configure in calls
    assert calls.index(configure) < calls.index("systemctl restart docker")
    assert json.loads((vm / "daemon.json").read_text()) == {
        "exec-opts": ["native.cgroupdriver=cgroupfs"],
        "x": 1,
    }
    assert "--gpus" in got["argv"]


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("nvidia-smi", "no NVIDIA GPU is usable"),
        ("apt-get", "the NVIDIA container toolkit could not be installed"),
    ],
)
def test_a_vm_that_cannot_run_gpu_containers_says_so(
    tmp_path: Path, state_dir: str, broken: str, message: str
) -> None:
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / f"fail-{broken}").touch()
    got = run_on_fake_vm(
        tmp_path, build_user_data(make_spec(), gpus=True, state_dir=state_dir), nvidia_runtime=False
    )
    assert got["phase"].startswith(f"failed-host {message}"), got["phase"]
    assert "argv" not in got  # docker run never ran


def test_cpu_pods_skip_the_gpu_checks(tmp_path: Path, state_dir: str) -> None:
    vm = tmp_path / "vm"
    vm.mkdir()
    (vm / "fail-nvidia-smi").touch()
    got = run_on_fake_vm(tmp_path, build_user_data(make_spec(), gpus=False, state_dir=state_dir))
    assert got["phase"].startswith("exited ")


def test_a_failed_docker_run_records_its_code_and_error(tmp_path: Path, state_dir: str) -> None:
    user_data = build_user_data(make_spec(), gpus=False, state_dir=state_dir)
    got = run_on_fake_vm(tmp_path, user_data, env={"FAKE_DOCKER_RUN_EXIT": "125"})
    assert got["phase"] == f"failed-start docker run of {MAIN} exited with 125\n"
    assert Path(state_dir, "exit-code").read_text() == "125\n"
    error = Path(container_dir(state_dir, MAIN), "start-error").read_text()
    assert "pull access denied" in error


def test_the_boot_waits_for_the_key_then_opens_the_secrets(tmp_path: Path, state_dir: str) -> None:
    spec = make_spec(env=(EnvVar("TOKEN", "s3cr3t", True),))
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    write_files(user_data)
    process = boot(tmp_path, user_data, fake_vm(tmp_path))
    try:
        wait_until(
            lambda: phase_of(state_dir).startswith("waiting-key "), what="the key to be awaited"
        )
        assert process.poll() is None
        deliver_key(state_dir)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()
    got = json.loads((tmp_path / "docker-run.json").read_text())
    assert received_env(got) == {"TOKEN": "s3cr3t"}


def test_a_wrong_key_is_a_host_failure(tmp_path: Path, state_dir: str) -> None:
    spec = make_spec(env=(EnvVar("TOKEN", "s3cr3t", True),))
    user_data = build_user_data(spec, gpus=False, state_dir=state_dir, secret_passphrase=PASSPHRASE)
    write_files(user_data)
    deliver_key(state_dir, "00" * 32)  # the agent's key changed since the launch
    got = run_on_fake_vm(tmp_path, user_data, deliver=False)
    assert got["phase"].startswith("failed-host the secret environment could not be opened")
    assert "argv" not in got
