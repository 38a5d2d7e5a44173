"""docs/operating.md works as written: its ``sh`` blocks, run in order in one shell.

The commands are read from the document, not copied here, so the runbook and this test cannot
drift apart. They run in one ``bash`` (exports, ``cd`` and background jobs carry over from
block to block), as a person follows the page in one terminal, against the session's real
control plane. What the test changes, and says so:

- the fresh-clone step ``./scripts/bootstrap`` is not run (the suite runs inside the
  virtualenv it makes; running it again would reinstall into a shared one); the ``PATH`` line
  after it is run from the repository's root, and the shell starts with a ``PATH`` that lacks
  the virtualenv, so every ``vk-provider`` and ``kubectl`` comes from that line;
- ``VK_PROVIDER_STATE_DIR`` and ``VK_PROVIDER_CLUSTER`` point ``cluster up`` at the session's
  cluster (which it finds running) and ``VK_PROVIDER_K8S_BIN_DIR`` at its binaries; ``HOME``
  is the test's directory;
- the ports 10250 and 8080 become free ones (other agents and demos may hold those).

Beyond every block exiting 0, the test checks from the outside what the page promises: after
the restart the test pod runs on the same instance and nothing was launched twice, and after
the loss the pod is Failed with an ``InstanceLost`` Event.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agent_harness import reap_runners
from vk_provider.kube.client import KubeClient
from vk_provider_dev.cluster.binaries import ensure_binaries
from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.ports import free_ports

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operating.md"
BOOTSTRAP = "./scripts/bootstrap"
DOC_PORTS = ("127.0.0.1:10250", "127.0.0.1:8080")
NODE = "vk-gpu"
POD = "gpu-test"


@dataclass(frozen=True)
class Block:
    section: str
    script: str


def doc_blocks(text: str) -> list[Block]:
    """The ``sh`` blocks of the page, in order, each with the heading it is under."""
    blocks = []
    section = ""
    for match in re.finditer(r"^(#+ [^\n]*)$|^```sh\n(.*?)^```$", text, re.M | re.S):
        if match.group(1):
            section = match.group(1).lstrip("# ").strip()
        else:
            blocks.append(Block(section, match.group(2)))
    return blocks


class Shell:
    """One ``bash`` fed block by block on its stdin, as one terminal."""

    def __init__(self, *, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.transcript = log.open("a")
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            env=env,
            start_new_session=True,  # its jobs (the agent) go with it at the end
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, script: str, *, timeout: float = 240) -> str:
        """Run ``script``; its output. Fails the test if a command in it failed."""
        marker = f"__done_{uuid.uuid4().hex}"
        # ERR fires for a failing simple command, not for conditions (until, while, ||).
        wrapped = (
            "__failed=''\n"
            "trap '__failed=\"$__failed$BASH_COMMAND (exit $?); \"' ERR\n"
            f"{script}\n"
            "trap - ERR\n"
            f'echo "{marker} $__failed"\n'
        )
        assert self.process.stdin is not None
        self.transcript.write(f"\n$ {script}\n")
        self.process.stdin.write(wrapped)
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout
        output: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                pytest.fail(f"no end within {timeout}s of:\n{script}\noutput:\n{''.join(output)}")
            if line is None:
                pytest.fail(f"the shell ended during:\n{script}\noutput:\n{''.join(output)}")
            if marker in line:  # after the last output, which may not end its line
                before, _, failed = line.partition(marker)
                output.append(before)
                failed = failed.strip()
                text = "".join(output)
                assert not failed, f"failed: {failed}\nin:\n{script}\noutput:\n{text}"
                return text
            output.append(line)
            self.transcript.write(line)
            self.transcript.flush()
            if time.monotonic() > deadline:
                pytest.fail(f"no end within {timeout}s of:\n{script}\noutput:\n{''.join(output)}")

    def close(self) -> None:
        with _quiet():
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with _quiet():
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.transcript.close()


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, *_: Any) -> bool:
        return kind is not None and issubclass(kind, ProcessLookupError)


@pytest.fixture
def shell(control_plane: LocalCluster, tmp_path: Path) -> Iterator[Shell]:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "KUBECONFIG")}
    env.update(
        # The binaries the session's cluster runs (found through HOME, which changes here).
        VK_PROVIDER_K8S_BIN_DIR=str(ensure_binaries().kube_apiserver.parent),
        PATH="/usr/local/bin:/usr/bin:/bin",  # no virtualenv: the page's PATH line brings it
        HOME=str(tmp_path),
        VK_PROVIDER_STATE_DIR=str(control_plane.directory.parent.parent),
        VK_PROVIDER_CLUSTER=control_plane.name,
        VK_PROVIDER_URL="",
        VK_PROVIDER_TOKEN="",
    )
    terminal = Shell(cwd=ROOT, env=env, log=tmp_path / "transcript.log")
    try:
        yield terminal
    finally:
        terminal.close()
        reap_runners(tmp_path)  # the local instances the agent left (pods keep running)
        subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "kubectl"),
                "--kubeconfig",
                str(control_plane.kubeconfig),
                "delete",
                f"pod/{POD}",
                f"node/{NODE}",
                "--ignore-not-found",
                "--wait=false",
                "--grace-period=0",
                "--force",
            ],
            capture_output=True,
            check=False,
            timeout=60,
        )


def instance_of(pod: dict[str, Any] | None) -> str:
    assert pod is not None
    return str(pod["metadata"]["annotations"]["vk-provider.io/instance-id"])


async def test_the_runbook_runs_as_written(
    shell: Shell, control_plane: LocalCluster, api: KubeClient, tmp_path: Path
) -> None:
    text = DOC.read_text()
    for port in DOC_PORTS:
        assert port in text, f"the page no longer uses {port}: update this test's ports"
    kubelet, rest = (f"127.0.0.1:{p}" for p in free_ports(2))
    text = text.replace(DOC_PORTS[0], kubelet).replace(DOC_PORTS[1], rest)
    blocks = doc_blocks(text)
    sections = [b.section for b in blocks]
    for needed in (
        "Run the agent against a local control plane",
        "Look at it",
        "Restart the agent",
        "Break a simulated cloud on purpose",
    ):
        assert needed in sections, needed

    first = blocks[0].script.splitlines()
    assert first[0] == BOOTSTRAP and (ROOT / BOOTSTRAP).is_file()  # the fresh-clone step
    shell.run("\n".join(first[1:]))
    assert "/.venv/bin" in shell.run('echo "$PATH"')
    outputs: dict[str, list[str]] = {}
    for block in blocks[1:]:
        if block.section == "Break a simulated cloud on purpose" and "lose" in block.script:
            # Before the loss: the restart kept the pod on its instance, launched nothing new.
            pod = await api.get_pod("default", POD)
            assert pod is not None and pod["status"]["phase"] == "Running"
            assert instance_of(pod) == outputs["Restart the agent"][0].splitlines()[0].strip()
            listed = shell.run(f"vk-provider local instances {tmp_path / 'vk-dev' / 'sim'}")
            assert listed.count(instance_of(pod)) == 1
            assert len(re.findall(r"local-\S+", listed)) == 1, listed
        outputs.setdefault(block.section, []).append(shell.run(block.script))

    ran = {section: "".join(parts) for section, parts in outputs.items()}
    # The agent came up on the session's cluster, with the page's configuration.
    assert "agent.yaml: valid. Node vk-gpu; providers: sim (local)" in ran[sections[1]]
    assert NODE in ran[sections[1]]
    # What the query commands printed.
    look = ran["Look at it"]
    assert "A100-80GB" in look and "H100-SXM" in look and "of 2 offers shown" in look
    assert "pod/gpu-test created" in look
    # The restart: the same instance before and after, and the first reconciliation logged.
    restart = [line.strip() for line in ran["Restart the agent"].splitlines() if line.strip()]
    assert restart[0] == restart[-1], restart
    assert "first reconciliation complete" in ran["Restart the agent"]
    # The loss: Failed, with the InstanceLost Event.
    assert "InstanceLost" in ran["Break a simulated cloud on purpose"]
    pod = await api.get_pod("default", POD)
    assert pod is not None and pod["status"]["phase"] == "Failed"
    assert pod["status"].get("reason") == "InstanceLost"
    # The dry runs of the page answered.
    where = ran["Where would a pod go? (`vk-provider place`)"]
    assert "pod default/trainer-template fits no offer now" in where
    assert "capacity-type" in where and "gpu-count" in where
    assert "pod default/gpu-test would be placed on sim/a100/local" in where
    assert 'vk_provider_up{provider="sim"} 1.0' in ran["Metrics"]
    assert "vk_provider_build_info{" in ran["Metrics"]
