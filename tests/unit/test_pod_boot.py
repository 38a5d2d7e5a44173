"""The boot script runs a whole pod: run for real under bash against a fake ``docker``.

``run.sh`` is built by ``vk_provider_adapters.cloud_init`` for a pod with init containers, a native
sidecar and two app containers, written to a temporary directory as cloud-init would, and run
with a fake ``docker`` on PATH. The fake records every invocation and plays each container's
life from a script file the test writes (``lifecycle.json``: the exit codes of its successive
runs; a container with no run left keeps running until it is stopped), applying the
``--restart`` policy it was given as Docker would: restart after an exit under ``always``, and
under ``on-failure`` when the code is not 0, counting ``RestartCount``. Every ``inspect`` is a
step of time: a running container whose script has an exit pending exits at the next look.

So the order of init containers, their failure under each restartPolicy, sidecars before
apps, the shared network and volumes, the sealed secrets of every container and the end of
the pod are all checked on what the script actually did, not on its text.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_until
from tests.unit import canary
from tests.workloads import workload
from vk_provider.domain.containers import ContainerSpec, VolumeMount
from vk_provider.domain.errors import InvalidSpec
from vk_provider.domain.models import EnvVar, Port, WorkloadSpec
from vk_provider_adapters import sealed_env
from vk_provider_adapters.cloud_init import build_user_data, container_dir
from vk_provider_adapters.docker_run import container_name_for, sandbox_name_for

UID = "0f5e2a8c-1b2d-4e6f-8a9b-0c1d2e3f4a5b"
REQUEST = f"{UID}.0"
PASSPHRASE = "5e" * 32

FAKE_DOCKER = """#!{python}
import json, os, sys
vm = os.environ["FAKE_VM"]
args = sys.argv[1:]
def at(*parts):
    return os.path.join(vm, *parts)
def load(name):
    try:
        return json.load(open(at("docker", name + ".json")))
    except FileNotFoundError:
        return None
def save(name, state):
    os.makedirs(at("docker"), exist_ok=True)
    json.dump(state, open(at("docker", name + ".json"), "w"))
def record(entry):
    with open(at("calls.jsonl"), "a") as calls:
        calls.write(json.dumps(entry) + "\\n")
command = args[0] if args else ""
if command == "run":
    name = args[args.index("--name") + 1]
    names = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    files = [args[i + 1] for i, a in enumerate(args) if a == "--env-file"]
    record({{"cmd": "run", "name": name, "argv": args,
             "env": {{n: os.environ.get(n) for n in names}},
             "env_files": {{f: open(f).read() for f in files}}}})
    if os.path.exists(at("fail-run-" + name)):
        print("docker: Error response from daemon: pull access denied", file=sys.stderr)
        sys.exit(125)
    short = name.rsplit(".", 1)[-1] if "--network" in args else "sandbox"
    runs = json.load(open(at("lifecycle.json"))).get(short, [])
    policy = args[args.index("--restart") + 1]
    save(name, {{"status": "running", "code": 0, "restarts": 0, "run": 0, "runs": runs,
                "policy": policy}})
    print("0123abcd")
elif command == "inspect":
    name = args[-1]
    state = load(name)
    record({{"cmd": "inspect", "name": name}})
    if state is None:
        print("Error: No such object: " + name, file=sys.stderr)
        sys.exit(1)
    if state["status"] == "running" and state["run"] < len(state["runs"]):
        code = state["runs"][state["run"]]
        state["run"] += 1
        again = state["policy"] == "always" or (state["policy"] == "on-failure" and code != 0)
        if again:
            state["restarts"] += 1  # Docker restarts it (its back-off is not played)
        else:
            state["status"], state["code"] = "exited", code
        save(name, state)
    print(state["status"], state["code"])
elif command == "stop":
    name = args[-1]
    record({{"cmd": "stop", "name": name}})
    state = load(name)
    if state is not None and state["status"] == "running":
        state["status"], state["code"] = "exited", 143
        save(name, state)
elif command == "pull":
    record({{"cmd": "pull", "image": args[-1]}})
elif command == "info" and "--format" in args:
    print(json.dumps({{"runc": {{}}, "nvidia": {{"path": "nvidia-container-runtime"}}}}))
"""


def make_pod(**overrides: Any) -> WorkloadSpec:
    shared = (VolumeMount("models", "/models"),)
    fields: dict[str, Any] = {
        "pod_uid": UID,
        "namespace": "ml",
        "pod_name": "serve",
        "container_name": "model",
        "image": "registry.example/model:1",
        "restart_policy": "Never",
        "init_containers": (
            ContainerSpec(
                "fetch",
                "registry.example/fetch:1",
                env=(EnvVar("HF_TOKEN", canary.SECRET, secret=True),),
                volume_mounts=shared,
            ),
            ContainerSpec("migrate", "registry.example/migrate:1"),
            ContainerSpec(
                "proxy",
                "registry.example/proxy:1",
                restart_policy="Always",
                ports=(Port(8443),),
            ),
        ),
        "containers": (
            ContainerSpec(
                "model",
                "registry.example/model:1",
                env=(EnvVar("API_KEY", "k-" + canary.SECRET, secret=True), EnvVar("MODE", "x")),
                ports=(Port(8000),),
                volume_mounts=(VolumeMount("models", "/models", read_only=True),),
                gpu_count=1,
            ),
            ContainerSpec(
                "exporter",
                "registry.example/exporter:1",
                volume_mounts=(VolumeMount("models", "/data", sub_path="metrics"),),
            ),
        ),
    }
    fields.update(overrides)
    return workload(**fields)


def documents(user_data: str) -> dict[str, Any]:
    assert user_data.startswith("#cloud-config\n")
    loaded: dict[str, Any] = yaml.safe_load(user_data)
    return loaded


def prepare(
    tmp_path: Path, pod: WorkloadSpec, lifecycle: dict[str, list[int]], *, gpus: bool = False
) -> tuple[Path, Path, dict[str, str]]:
    """Write the pod's files as cloud-init would, the key as the agent would, and the fake
    docker; (state dir, fake VM dir, run.sh's environment)."""
    state = tmp_path / "state"
    user_data = build_user_data(pod, gpus=gpus, state_dir=str(state), secret_passphrase=PASSPHRASE)
    for entry in documents(user_data)["write_files"]:
        target = Path(entry["path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(entry["content"])
        target.chmod(int(entry["permissions"], 8))
    keys = state / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    (keys / "env.pass").write_text(PASSPHRASE + "\n")  # what the agent delivers over SSH
    vm = tmp_path / "vm"
    (vm / "bin").mkdir(parents=True, exist_ok=True)
    docker = vm / "bin" / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    smi = vm / "bin" / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA A10 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    (vm / "lifecycle.json").write_text(json.dumps(lifecycle))
    env = {
        "PATH": f"{vm / 'bin'}:{os.environ['PATH']}",
        "FAKE_VM": str(vm),
        "VK_POD_POLL_SECONDS": "0.01",
    }
    return state, vm, env


def start(state: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["/bin/bash", str(state / "run.sh")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def calls_of(vm: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (vm / "calls.jsonl").read_text().splitlines()]


def boot(
    tmp_path: Path, pod: WorkloadSpec, lifecycle: dict[str, list[int]], *, gpus: bool = False
) -> tuple[str, list[dict[str, Any]]]:
    """Run run.sh to its end with the fake docker; (its last phase, docker's calls)."""
    state, vm, env = prepare(tmp_path, pod, lifecycle, gpus=gpus)
    process = start(state, env)
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        stop(process)
    assert process.returncode == 0, stderr.decode()
    return (state / "phase").read_text().strip(), calls_of(vm)


def name(container: str) -> str:
    return container_name_for(REQUEST, container)


def runs(calls: list[dict[str, Any]]) -> list[str]:
    return [c["name"] for c in calls if c["cmd"] == "run"]


def first(calls: list[dict[str, Any]], cmd: str, who: str) -> int:
    return next(i for i, c in enumerate(calls) if c["cmd"] == cmd and c.get("name") == who)


def last(calls: list[dict[str, Any]], cmd: str, who: str) -> int:
    return max(i for i, c in enumerate(calls) if c["cmd"] == cmd and c.get("name") == who)


def docker_state(tmp_path: Path, container: str) -> dict[str, Any]:
    path = tmp_path / "vm" / "docker" / f"{name(container)}.json"
    state: dict[str, Any] = json.loads(path.read_text())
    return state


# --- order --------------------------------------------------------------------------------


def test_init_containers_run_in_order_to_completion_then_sidecars_then_apps(
    tmp_path: Path,
) -> None:
    lifecycle = {"fetch": [0], "migrate": [0], "model": [0], "exporter": [0]}
    phase, calls = boot(tmp_path, make_pod(), lifecycle)
    sandbox = sandbox_name_for(REQUEST)
    assert runs(calls) == [
        sandbox,
        name("fetch"),
        name("migrate"),
        name("proxy"),
        name("model"),
        name("exporter"),
    ]
    # Each init container had ended (Docker said exited 0) before the next one started.
    assert last(calls, "inspect", name("fetch")) < first(calls, "run", name("migrate"))
    assert last(calls, "inspect", name("migrate")) < first(calls, "run", name("proxy"))
    # The sidecar runs beside the apps and is stopped only after every app ended.
    assert first(calls, "run", name("proxy")) < first(calls, "run", name("model"))
    assert "stop" not in [c["cmd"] for c in calls[: first(calls, "run", name("exporter"))]]
    stops = [c["name"] for c in calls if c["cmd"] == "stop"]
    # The last started first, the sandbox last (the ended apps' stops are no-ops).
    assert stops == [name("exporter"), name("model"), name("proxy"), sandbox]
    assert first(calls, "stop", name("proxy")) > last(calls, "inspect", name("model"))
    assert phase == "exited the pod's app containers exited (exit code 0)"
    assert (tmp_path / "state" / "exit-code").read_text() == "0\n"


def test_a_failing_init_container_under_never_stops_the_pod(tmp_path: Path) -> None:
    phase, calls = boot(tmp_path, make_pod(), {"fetch": [0], "migrate": [3]})
    assert runs(calls) == [sandbox_name_for(REQUEST), name("fetch"), name("migrate")]
    assert phase == "exited init container migrate failed with 3"
    assert (tmp_path / "state" / "exit-code").read_text() == "3\n"
    assert docker_state(tmp_path, "migrate")["policy"] == "no"


def test_a_failing_init_container_under_on_failure_is_retried_until_it_succeeds(
    tmp_path: Path,
) -> None:
    lifecycle = {"fetch": [1, 1, 0], "migrate": [0], "model": [0], "exporter": [0]}
    phase, calls = boot(tmp_path, make_pod(restart_policy="OnFailure"), lifecycle)
    fetch = docker_state(tmp_path, "fetch")
    assert (fetch["policy"], fetch["restarts"], fetch["status"]) == ("on-failure", 2, "exited")
    assert runs(calls).count(name("fetch")) == 1  # one container, restarted by Docker
    assert first(calls, "run", name("migrate")) > last(calls, "inspect", name("fetch"))
    assert phase == "exited the pod's app containers exited (exit code 0)"


def test_under_always_init_containers_retry_and_apps_keep_restarting(tmp_path: Path) -> None:
    pod = make_pod(restart_policy="Always", containers=make_pod().containers[1:])
    lifecycle = {"fetch": [1, 1, 0], "migrate": [0], "exporter": [0, 2, 0]}
    state, vm, env = prepare(tmp_path, pod, lifecycle)
    process = start(state, env)
    try:
        exporter = vm / "docker" / f"{name('exporter')}.json"

        def restarted_three_times() -> bool:
            return exporter.exists() and json.loads(exporter.read_text())["restarts"] >= 3

        # Docker restarts an Always container whatever its code (0 too): the pod runs on.
        wait_until(restarted_three_times, timeout=60, what="Docker to restart the app")
        assert json.loads(exporter.read_text())["policy"] == "always"
        fetch = docker_state(tmp_path, "fetch")
        assert (fetch["policy"], fetch["restarts"]) == ("on-failure", 2)
        assert process.poll() is None
        assert (state / "phase").read_text().startswith("running ")
    finally:
        stop(process)


def test_an_app_that_fails_under_never_ends_the_pod_with_its_code(tmp_path: Path) -> None:
    lifecycle = {"fetch": [0], "migrate": [0], "model": [0], "exporter": [7]}
    phase, _ = boot(tmp_path, make_pod(), lifecycle)
    assert phase == "exited the pod's app containers exited (exit code 7)"
    assert docker_state(tmp_path, "model")["policy"] == "no"
    assert docker_state(tmp_path, "proxy")["policy"] == "always"  # a sidecar, whatever the pod


def test_a_container_that_cannot_be_created_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "vm").mkdir()
    (tmp_path / "vm" / f"fail-run-{name('model')}").touch()
    phase, calls = boot(tmp_path, make_pod(), {"fetch": [0], "migrate": [0]})
    assert phase == "failed-start docker run of model exited with 125"
    error = Path(container_dir(str(tmp_path / "state"), "model"), "start-error").read_text()
    assert "pull access denied" in error
    assert name("exporter") not in runs(calls)
    stops = [c["name"] for c in calls if c["cmd"] == "stop"]
    assert stops == [name("proxy"), sandbox_name_for(REQUEST)]  # what started, last first


# --- what the containers share, and what they get -----------------------------------------


def _flag(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def _argv(calls: list[dict[str, Any]], who: str) -> list[str]:
    argv: list[str] = calls[first(calls, "run", who)]["argv"]
    return argv


def test_the_containers_share_the_sandboxs_network_and_the_pods_volumes(tmp_path: Path) -> None:
    lifecycle = {"fetch": [0], "migrate": [0], "model": [0], "exporter": [0]}
    _, calls = boot(tmp_path, make_pod(), lifecycle, gpus=True)
    sandbox = _argv(calls, sandbox_name_for(REQUEST))
    assert _flag(sandbox, "--publish") == [
        "8443:8443/tcp",
        "8000:8000/tcp",
    ]  # every container's ports
    assert sandbox[-1] == "registry.k8s.io/pause:3.10"
    volume = tmp_path / "state" / "volumes" / "models"
    for container in ("fetch", "migrate", "proxy", "model", "exporter"):
        argv = _argv(calls, name(container))
        assert argv[argv.index("--network") + 1] == f"container:{sandbox_name_for(REQUEST)}"
        assert "--publish" not in argv
        assert argv[argv.index("--label") + 1] == f"vk-provider.pod={REQUEST}"
    mounts = {c: _flag(_argv(calls, name(c)), "--mount") for c in ("fetch", "model", "exporter")}
    assert mounts == {
        "fetch": [f"type=bind,source={volume},target=/models"],
        "model": [f"type=bind,source={volume},target=/models,readonly"],
        "exporter": [f"type=bind,source={volume}/metrics,target=/data"],
    }
    assert (volume / "metrics").is_dir()
    assert oct(volume.stat().st_mode & 0o777) == "0o777"  # any container user may write
    assert "--gpus" in _argv(calls, name("model"))  # the one that asked for a GPU
    assert "--gpus" not in _argv(calls, name("exporter"))


def test_every_containers_secrets_are_sealed_opened_for_it_alone_and_deleted(
    tmp_path: Path,
) -> None:
    pod = make_pod()
    user_data = build_user_data(pod, gpus=False, state_dir="/s", secret_passphrase=PASSPHRASE)
    for secret in (canary.SECRET, "k-" + canary.SECRET, PASSPHRASE):
        assert not canary.leaks(user_data, [secret])
        assert base64.b64encode(secret.encode()).decode() not in user_data
    written = {e["path"]: e for e in documents(user_data)["write_files"]}
    for container, value in (("fetch", canary.SECRET), ("model", "k-" + canary.SECRET)):
        # Multi-line values go in the sealed shell file (an env-file cannot carry them).
        sealed = written[f"/s/containers/{container}/secret-env.sh.sealed"]
        assert sealed["permissions"] == "0600"
        opened = sealed_env.unseal(base64.b64decode(sealed["content"]), PASSPHRASE).decode()
        assert shlex.quote(value) in opened
    assert not [p for p in written if p.startswith("/s/containers/exporter/secret")]
    lifecycle = {"fetch": [0], "migrate": [0], "model": [0], "exporter": [0]}
    _, calls = boot(tmp_path, pod, lifecycle)
    got = {c["name"]: c for c in calls if c["cmd"] == "run"}
    assert got[name("fetch")]["env"] == {"HF_TOKEN": canary.SECRET}
    assert got[name("model")]["env"] == {"API_KEY": "k-" + canary.SECRET}
    assert got[name("migrate")]["env"] == {}  # each container gets its own values only
    assert "MODE=x" in "".join(got[name("model")]["env_files"].values())
    for call in got.values():
        assert not canary.leaks(" ".join(call["argv"]), [canary.SECRET])
    state = tmp_path / "state"
    assert not list(state.glob("containers/*/secret.env"))  # opened files gone
    assert not (state / "keys" / "env.pass").exists()


def test_pod_list_names_the_containers_in_run_order() -> None:
    user_data = build_user_data(make_pod(), gpus=False, state_dir="/s", secret_passphrase="p")
    written = {e["path"]: e["content"] for e in documents(user_data)["write_files"]}
    assert written["/s/pod.list"] == (
        "init fetch\ninit migrate\nsidecar proxy\napp model\napp exporter\n"
    )


@pytest.mark.parametrize(
    ("mount", "field"),
    [
        (VolumeMount("models", "/a,b"), "spec.containers[1].volumeMounts[0].mountPath"),
        (VolumeMount("models", '/a"b'), "spec.containers[1].volumeMounts[0].mountPath"),
        (VolumeMount("models", "/m", sub_path="x=y"), "spec.containers[1].volumeMounts[0].subPath"),
    ],
)
def test_a_mount_docker_cannot_carry_is_invalid_naming_the_field(
    mount: VolumeMount, field: str
) -> None:
    pod = make_pod()
    apps = (pod.containers[0], ContainerSpec("exporter", "img", volume_mounts=(mount,)))
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(make_pod(containers=apps), gpus=False, secret_passphrase="p")
    assert raised.value.field == field


def test_a_container_name_that_is_not_a_dns_label_is_invalid() -> None:
    inits = (ContainerSpec("Bad_Name", "img"),)
    with pytest.raises(InvalidSpec) as raised:
        build_user_data(make_pod(init_containers=inits), gpus=False, secret_passphrase="p")
    assert raised.value.field == "spec.initContainers[0].name"
