"""The VM's boot script (``run.sh``): prepare the host, open the secret environment, run the
whole pod — init containers in order, sidecars, app containers — and say where it is.

``vk_provider_adapters.cloud_init`` writes this script into the VM with the pod's files and starts
it as the systemd unit ``vk-provider-workload``. What it does, in order:

1. **Docker.** Waits for the daemon (installing ``docker.io`` if the image has no Docker).
2. **GPUs** (only when the pod asked for them). ``nvidia-smi`` must work: no driver means the
   VM cannot run the pod at all. When Docker has no ``nvidia`` runtime, the NVIDIA container
   toolkit is installed (from the image's repositories, else from NVIDIA's, as its install
   guide says) and configured with ``nvidia-ctk runtime configure --runtime=docker``, Docker's
   cgroup driver set to ``cgroupfs`` first (NVIDIA/nvidia-container-toolkit#48: under systemd's
   driver a ``systemctl daemon-reload`` takes the GPUs away from running containers; dstack
   and SkyPilot do the same), then Docker restarted — as dstack and SkyPilot do on VMs.
3. **Secrets.** When the pod has secret env values, their sealed files
   (``vk_provider_adapters.sealed_env``, one or two per container) wait for the passphrase the agent
   delivers over SSH into the root-only ``keys/env.pass``; they are opened next to the plain
   env files (mode 0600), and each container's are deleted once its ``docker run`` has handed
   them to Docker (all of them, whatever happens, when the script ends); the passphrase too.
4. **The pod** (``vk_provider_adapters.docker_run``: names, restart policies, network, volumes).
   Every image is pulled (a few tries each), the emptyDir volumes' directories made, the sandbox
   started (the pod's network namespace and ports). Then, in order, each init container: a plain one
   is started and waited for until Docker will not restart it any more (under restartPolicy Never a
   failure is final: the pod ends with its exit code, no app container starts; otherwise Docker
   retries it with back-off until it succeeds); a sidecar is started and kept. Then every app
   container. Containers are *not* removed when they end, so ``docker inspect`` keeps their state,
   exit code and restart count for the agent.
5. **The end.** When no app container runs or will be restarted by Docker, the sidecars are
   stopped (the last started first) and the pod's exit code (the first app container's that
   failed, else 0) goes to ``exit-code``, the time to ``finished-at``.

The script's progress is one line in ``phase``, replaced atomically: ``<phase> <message>``,
with phase one of ``setup``, ``waiting-key``, ``pulling``, ``starting`` (the sandbox),
``initializing`` (init containers and sidecars), ``running``, ``exited`` (the pod ended; a
failed init container ends it too), ``failed-host`` (the VM cannot run containers: no usable
GPU, no Docker, no toolkit, no key) or ``failed-start`` (``docker run`` of a container
failed; its exit code is in ``exit-code`` and its own error output in
``containers/<name>/start-error``). ``pod.list`` (written by cloud-init) names the containers
in order with their kind; the agent reads all of it over SSH
(``vk_provider_adapters.lambda_cloud.remote``).

Invariants: no environment value is on any command line (the env files and ``--env NAME``
carry them; a container's exported values are sourced in a subshell of its own ``docker
run``); every string from the pod is ``shlex.quote``\\d; restarts are Docker's, per container,
as the pod's restartPolicy says; the script ends with exit status 0 whatever happened (what
happened is in ``phase``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from vk_provider_adapters.docker_run import Kind
from vk_provider_adapters.sealed_env import OPEN_COMMAND

PHASE_FILE: Final = "phase"
START_ERROR_FILE: Final = "start-error"
EXIT_CODE_FILE: Final = "exit-code"
KEY_DIR: Final = "keys"
PASSPHRASE_FILE: Final = "keys/env.pass"  # noqa: S105 - a file name
SEALED_SUFFIX: Final = ".sealed"
DAEMON_JSON: Final = "/etc/docker/daemon.json"
# The first line of every sealed file's plaintext (a comment to Docker and to the shell): an
# opened file without it was opened with the wrong passphrase (CTR has no padding to fail on).
SEALED_HEADER: Final = "# vk-provider sealed environment"

# How long run.sh waits for the Docker daemon, how often it tries to pull the image, and how
# long it waits for the agent to deliver the secret environment's passphrase.
DOCKER_WAIT_TRIES: Final = 60
DOCKER_WAIT_SECONDS: Final = 5
PULL_TRIES: Final = 5
KEY_WAIT_SECONDS: Final = 3600
# How often run.sh looks at the containers it waits for; how long a stop waits for SIGTERM.
POLL_SECONDS: Final = 2
STOP_SECONDS: Final = 10
CONTAINERS_DIR: Final = "containers"
SANDBOX_ERROR_FILE: Final = "sandbox-error"
POD_LIST_FILE: Final = "pod.list"
INSPECT_FORMAT: Final = "{{.State.Status}} {{.State.ExitCode}}"


@dataclass(frozen=True, slots=True)
class ContainerRun:
    """One container of the pod as run.sh starts it (``vk_provider_adapters.docker_run``)."""

    kind: Kind
    name: str  # the pod's name for it (its state directory is containers/<name>)
    docker_name: str
    docker_run: Sequence[str]  # the argv, "docker" first
    sources: Sequence[str] = ()  # shell files exporting what its env-files cannot carry
    sealed: Sequence[str] = ()  # its secret files to open (<path>.sealed becomes <path>)


def run_script(
    *,
    state_dir: str,
    images: Sequence[str],
    sandbox: str,
    sandbox_run: Sequence[str],
    containers: Sequence[ContainerRun],
    volume_dirs: Sequence[str] = (),
    gpus: bool,
) -> str:
    """``run.sh`` for a whole pod: ``images`` to pull (the sandbox's first), the sandbox's
    name and ``docker run`` argv, the containers in run order (init containers, sidecars among
    them, then the app containers), the host directories of the pod's emptyDir volumes."""
    state = shlex.quote(state_dir)
    sealed = [path for c in containers for path in c.sealed]
    opened = " ".join(shlex.quote(path) for path in sealed)
    apps = [c for c in containers if c.kind == "app"]
    functions = "".join(_run_function(index, c) for index, c in enumerate(containers))
    steps = "".join(_step(index, c, first_app=c is apps[0]) for index, c in enumerate(containers))
    pulls = "".join(f"pull {shlex.quote(image)}\n" for image in dict.fromkeys(images))
    volumes = "".join(f"make_volume {shlex.quote(path)}\n" for path in volume_dirs)
    app_names = " ".join(shlex.quote(c.docker_name) for c in apps)
    return f"""#!/bin/bash
# Prepares the VM, runs the pod's containers, records how the pod ended. Written by vk-provider.
set -u
state={state}
daemon_json=${{VK_DOCKER_DAEMON_JSON:-{DAEMON_JSON}}}
poll=${{VK_POD_POLL_SECONDS:-{POLL_SECONDS}}}
export DEBIAN_FRONTEND=noninteractive
{_cleanup_trap(opened) if sealed else ""}
now() {{ date -u +%Y-%m-%dT%H:%M:%SZ; }}
# One line, replaced atomically, that the agent reads over SSH: "<phase> <message>".
phase() {{
    printf '%s %s\\n' "$1" "$2" > "$state/{PHASE_FILE}.tmp"
    mv -f "$state/{PHASE_FILE}.tmp" "$state/{PHASE_FILE}"
}}
# This VM cannot run the pod: the agent reports the instance lost.
host_failed() {{ echo "vk-provider: $1" >&2; phase failed-host "$1"; exit 0; }}
# The pod's containers that run (the sandbox, sidecars, apps), stopped when the pod ends:
# the last started first, so the sidecars outlive the apps and the sandbox everything.
started=
stop_started() {{
    order=
    for name in $started; do order="$name $order"; done
    for name in $order; do "$docker" stop --time {STOP_SECONDS} "$name" > /dev/null 2>&1; done
}}
# The pod ended: $1 its exit code, $2 the phase, $3 why.
pod_ended() {{
    stop_started
    printf '%s\\n' "$1" > "$state/{EXIT_CODE_FILE}"
    now > "$state/finished-at"
    phase "$2" "$3"
    exit 0
}}
# docker run of $2 failed with $1: its exit code is the pod's.
start_failed() {{
    cat "$state/{CONTAINERS_DIR}/$2/{START_ERROR_FILE}" >&2 2> /dev/null
    pod_ended "$1" failed-start "docker run of $2 exited with $1"
}}
apt_install() {{
    apt-get -o DPkg::Lock::Timeout=300 update -q > /dev/null &&
        apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends "$@"
}}
wait_for_docker() {{
    for _ in $(seq 1 {DOCKER_WAIT_TRIES}); do
        if docker info > /dev/null 2>&1; then return 0; fi
        sleep {DOCKER_WAIT_SECONDS}
    done
    return 1
}}
has_nvidia_runtime() {{
    docker info --format '{{{{json .Runtimes}}}}' 2> /dev/null | grep -q nvidia
}}
install_nvidia_toolkit() {{
    if ! command -v nvidia-ctk > /dev/null 2>&1; then
        apt_install nvidia-container-toolkit || {{
            # Not in the image's repositories: NVIDIA's own, as its install guide says.
            keyring=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
            repo=https://nvidia.github.io/libnvidia-container
            curl -fsSL "$repo/gpgkey" | gpg --batch --yes --dearmor -o "$keyring" &&
                curl -fsSL "$repo/stable/deb/nvidia-container-toolkit.list" |
                sed "s#deb https://#deb [signed-by=$keyring] https://#g" \\
                    > /etc/apt/sources.list.d/nvidia-container-toolkit.list &&
                apt_install nvidia-container-toolkit
        }} || return 1
    fi
    # NVIDIA/nvidia-container-toolkit#48: with systemd's cgroup driver a daemon-reload takes
    # the GPUs away from running containers.
    python3 - "$daemon_json" << 'PY' || return 1
import json, os, sys
path = sys.argv[1]
try:
    with open(path) as f:
        config = json.load(f)
except FileNotFoundError:
    config = {{}}
opts = [o for o in config.get("exec-opts", []) if not o.startswith("native.cgroupdriver=")]
config["exec-opts"] = opts + ["native.cgroupdriver=cgroupfs"]
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(config, f, indent=2)
os.replace(path + ".tmp", path)
PY
    nvidia-ctk runtime configure --runtime=docker --config="$daemon_json" || return 1
    systemctl restart docker || return 1
    wait_for_docker && has_nvidia_runtime
}}
open_sealed() {{ {OPEN_COMMAND}; }}
# Registries fail now and then; docker run pulls once more if every try here failed.
pull() {{
    for try in $(seq 1 {PULL_TRIES}); do
        "$docker" pull "$1" > /dev/null && return 0
        [ "$try" = {PULL_TRIES} ] || sleep $((try * 10))
    done
}}
# An emptyDir volume: a host directory any container user may write, as kubelet's.
make_volume() {{ mkdir -p "$1" && chmod 0777 "$1"; }}
# "<status> <exit code>" of a container; nothing when docker cannot say.
status_of() {{
    "$docker" inspect --type container --format '{INSPECT_FORMAT}' "$1" 2> /dev/null
}}
# Waits until container $1 has ended for good (Docker will not restart it); prints its code.
wait_ended() {{
    while :; do
        case "$(status_of "$1")" in
        "exited "* | "dead "*) status_of "$1" | cut -d ' ' -f 2; return 0 ;;
        esac
        sleep "$poll"
    done
}}
# Whether any app container runs or will be restarted by Docker.
apps_alive() {{
    for name in {app_names}; do
        case "$(status_of "$name")" in
        "exited "* | "dead "*) ;;
        *) return 0 ;;
        esac
    done
    return 1
}}
{functions}
phase setup "waiting for the Docker daemon"
if ! command -v docker > /dev/null 2>&1; then
    phase setup "installing Docker"
    apt_install docker.io || host_failed "Docker is not installed and could not be installed"
fi
wait_for_docker || host_failed "the Docker daemon did not become ready"
{_gpu_block() if gpus else ""}{_secrets_block(opened) if sealed else ""}docker=$(command -v docker)

phase pulling "pulling the pod's images"
{pulls}{volumes}
phase starting "starting the pod sandbox"
{_run_line(sandbox_run)} > /dev/null 2> "$state/{SANDBOX_ERROR_FILE}" || {{
    code=$?
    cat "$state/{SANDBOX_ERROR_FILE}" >&2
    pod_ended "$code" failed-start "docker run of the pod sandbox exited with $code"
}}
started={shlex.quote(sandbox)}
{steps}
while apps_alive; do sleep "$poll"; done
# Every app container has ended: the pod has. Sidecars stop after them, the last first.
code=0
for name in {app_names}; do
    ended=$(status_of "$name" | cut -d ' ' -f 2)
    if [ "$code" = 0 ] && [ -n "$ended" ]; then code=$ended; fi
done
pod_ended "$code" exited "the pod's app containers exited (exit code $code)"
"""


def _cleanup_trap(opened: str) -> str:
    quoted = opened.replace("'", "'\\''")
    return f"trap 'rm -f {quoted}' EXIT  # opened secrets never outlive the script"


def _run_line(argv: Sequence[str]) -> str:
    return " ".join(['"$docker"', *(shlex.quote(arg) for arg in argv[1:])])


def _run_function(index: int, container: ContainerRun) -> str:
    """``run_<index>``: the container's docker run, with its own exported values (in a
    subshell: two containers may export one name with different values); its opened secret
    files are deleted once Docker has them."""
    sources = "".join(f"        . {shlex.quote(path)}\n" for path in container.sources)
    error = f'"$state/{CONTAINERS_DIR}/"{shlex.quote(container.name)}"/{START_ERROR_FILE}"'
    cleanup = " ".join(shlex.quote(path) for path in container.sealed)
    return f"""run_{index}() {{
    mkdir -p "$state/{CONTAINERS_DIR}/"{shlex.quote(container.name)}
    (
{sources}        exec {_run_line(container.docker_run)}
    ) > /dev/null 2> {error}
    code=$?
    {f"rm -f {cleanup}  # Docker holds the secret values now" if cleanup else ":"}
    return "$code"
}}
"""


def _step(index: int, container: ContainerRun, *, first_app: bool) -> str:
    name = shlex.quote(container.name)
    docker_name = shlex.quote(container.docker_name)
    if container.kind == "init":
        running = shlex.quote(f"running init container {container.name}")
        failed = shlex.quote(f"init container {container.name} failed with")
        return f"""phase initializing {running}
run_{index} || start_failed "$?" {name}
code=$(wait_ended {docker_name})
[ "$code" = 0 ] || pod_ended "${{code:-1}}" exited {failed}" ${{code:-an unknown code}}"
"""
    lead = 'phase running "starting the app containers"\n' if first_app else ""
    if container.kind == "sidecar":
        lead = f"phase initializing {shlex.quote(f'starting sidecar {container.name}')}\n"
    return f"""{lead}run_{index} || start_failed "$?" {name}
started="$started "{docker_name}
"""


def _gpu_block() -> str:
    return """
if ! nvidia-smi -L > /dev/null 2>&1; then
    host_failed "no NVIDIA GPU is usable on this VM (nvidia-smi fails: no driver?)"
fi
if ! has_nvidia_runtime; then
    phase setup "installing the NVIDIA container toolkit"
    install_nvidia_toolkit ||
        host_failed "the NVIDIA container toolkit could not be installed and configured"
fi
"""


def _secrets_block(opened: str) -> str:
    return f"""
phase waiting-key "waiting for the agent to deliver the secret environment's key over SSH"
waited=0
until [ -s "$state/{PASSPHRASE_FILE}" ]; do
    if [ "$waited" -ge {KEY_WAIT_SECONDS} ]; then
        host_failed "the agent delivered no key for the secret environment in {KEY_WAIT_SECONDS} s"
    fi
    sleep 1
    waited=$((waited + 1))
done
(
    umask 077
    for out in {opened}; do
        base64 -d "$out{SEALED_SUFFIX}" > "$out.bin" &&
            open_sealed "$state/{PASSPHRASE_FILE}" "$out.bin" "$out" &&
            [ "$(head -n 1 "$out")" = {shlex.quote(SEALED_HEADER)} ] || exit 1
        rm -f "$out.bin"
    done
) || host_failed "the secret environment could not be opened with the key the agent sent"
rm -f "$state/{PASSPHRASE_FILE}"
"""
