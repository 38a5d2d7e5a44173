"""The VM's boot script (``run.sh``): prepare the host, open the secret environment, run the
container once, and say at every step where it is.

``providers.cloud_init`` writes this script into the VM with the pod's files and starts it as
the systemd unit ``vk-provider-workload``. What it does, in order:

1. **Docker.** Waits for the daemon (installing ``docker.io`` if the image has no Docker).
2. **GPUs** (only when the pod asked for them). ``nvidia-smi`` must work: no driver means the
   VM cannot run the pod at all. When Docker has no ``nvidia`` runtime, the NVIDIA container
   toolkit is installed (from the image's repositories, else from NVIDIA's, as its install
   guide says) and configured with ``nvidia-ctk runtime configure --runtime=docker``, Docker's
   cgroup driver set to ``cgroupfs`` first (NVIDIA/nvidia-container-toolkit#48: under systemd's
   driver a ``systemctl daemon-reload`` takes the GPUs away from running containers; dstack
   and SkyPilot do the same), then Docker restarted — as dstack and SkyPilot do on VMs.
3. **Secrets.** When the pod has secret env values, their sealed files
   (``providers.sealed_env``) wait for the passphrase the agent delivers over SSH into the
   root-only ``keys/env.pass``; they are opened next to the plain env files (mode 0600) and
   deleted once ``docker run`` has handed them to Docker; the passphrase file too.
4. **The container.** The image is pulled (a few tries), then ``docker run --detach`` creates
   and starts it, named for the request id and *not* removed when it ends, so ``docker
   inspect`` keeps its state and exit code for the agent; ``docker wait`` then records the exit
   code in ``exit-code`` and the time in ``finished-at`` (for people on the VM).

The script's progress is one line in ``phase``, replaced atomically: ``<phase> <message>``,
with phase one of ``setup``, ``waiting-key``, ``pulling``, ``starting``, ``running``,
``exited``, ``failed-host`` (the VM cannot run the container: no usable GPU, no Docker, no
toolkit, no key) or ``failed-start`` (``docker run`` failed; its exit code is in ``exit-code``
and its own error output in ``start-error``). The agent reads these over SSH
(``providers.lambda_cloud.remote``) when ``docker inspect`` has no container to show.

Invariants: no environment value is on any command line (the env files and ``--env NAME``
carry them); every string from the pod is ``shlex.quote``\\d; the container runs once
(``--restart no``), restarts being the agent's decision; the script ends with exit status 0
whatever happened (what happened is in ``phase``).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

from providers.sealed_env import OPEN_COMMAND

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


def run_script(
    *,
    state_dir: str,
    image: str,
    container: str,
    docker_run: Sequence[str],
    gpus: bool,
    sources: Sequence[str] = (),
    sealed: Sequence[str] = (),
) -> str:
    """``run.sh``. ``docker_run`` is the ``docker run`` argv (``docker`` first); ``sources``
    the shell files that export values the env-files cannot carry (sourced after the docker
    binary is found: they may set PATH); ``sealed`` the names of the secret files to open
    (``<name>.sealed`` becomes ``<name>``)."""
    state = shlex.quote(state_dir)
    run = " ".join(['"$docker"', *(shlex.quote(arg) for arg in docker_run[1:])])
    name = shlex.quote(container)
    source = "".join(f". {shlex.quote(path)}\n" for path in sources)
    opened = " ".join(shlex.quote(f"{state_dir}/{n}") for n in sealed)
    return f"""#!/bin/bash
# Prepares the VM, runs the pod's container once, records how it ended. Written by vk-provider.
set -u
state={state}
daemon_json=${{VK_DOCKER_DAEMON_JSON:-{DAEMON_JSON}}}
export DEBIAN_FRONTEND=noninteractive

now() {{ date -u +%Y-%m-%dT%H:%M:%SZ; }}
# One line, replaced atomically, that the agent reads over SSH: "<phase> <message>".
phase() {{
    printf '%s %s\\n' "$1" "$2" > "$state/{PHASE_FILE}.tmp"
    mv -f "$state/{PHASE_FILE}.tmp" "$state/{PHASE_FILE}"
}}
# This VM cannot run the container: the agent reports the instance lost.
host_failed() {{ echo "vk-provider: $1" >&2; phase failed-host "$1"; exit 0; }}
# docker run failed: its exit code is the container's.
start_failed() {{
    printf '%s\\n' "$1" > "$state/{EXIT_CODE_FILE}"
    now > "$state/finished-at"
    phase failed-start "docker run exited with $1"
    exit 0
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

phase setup "waiting for the Docker daemon"
if ! command -v docker > /dev/null 2>&1; then
    phase setup "installing Docker"
    apt_install docker.io || host_failed "Docker is not installed and could not be installed"
fi
wait_for_docker || host_failed "the Docker daemon did not become ready"
{_gpu_block() if gpus else ""}{_secrets_block(opened) if sealed else ""}docker=$(command -v docker)

phase pulling {shlex.quote(f"pulling image {image}")}
# Registries fail now and then; docker run pulls once more if every try here failed.
for try in $(seq 1 {PULL_TRIES}); do
    "$docker" pull {shlex.quote(image)} && break
    [ "$try" = {PULL_TRIES} ] || sleep $((try * 10))
done

{source}phase starting "starting the container"
{run} > /dev/null 2> "$state/{START_ERROR_FILE}"
code=$?
{f"rm -f {opened}" if sealed else ":"}  # Docker holds the secret values now
if [ "$code" != 0 ]; then
    cat "$state/{START_ERROR_FILE}" >&2
    start_failed "$code"
fi
phase running "the container runs"
code=$("$docker" wait {name}) || code=
printf '%s\\n' "${{code:-unknown}}" > "$state/{EXIT_CODE_FILE}"
now > "$state/finished-at"
phase exited "the container exited with ${{code:-an unknown code}}"
exit 0
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
