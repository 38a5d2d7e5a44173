"""The descheduler moving pods back from the virtual node: its policy, one cycle, or a daemon.

``descheduler_policy`` writes the policy (pure; ``deploy/descheduler/policy.yaml`` is its
default, with comments, and a test keeps the two equal); ``run_descheduler_once`` runs one
cycle (``--descheduling-interval 0``) and returns its output with the evictions it made
(``parse_evictions``); ``start_descheduler`` runs it as a daemon at an interval.

Invariants:
- Only ``RemovePodsViolatingNodeTaints`` runs, on the overflow taint only: a pod is evicted
  from a node whose overflow taint it does not tolerate, and only when it fits another Ready
  node (``nodeFit``), through the Eviction API (so PDBs hold).
- At most ``max_per_node`` evictions per node and ``max_total`` per cycle: counters reset
  every cycle, so the pace is that many per interval.
- One cycle serves no port (``--secure-port=0``); the daemon's secure port (metrics) is a
  free 127.0.0.1 port with self-signed certificates in the caller's directory.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from vk_provider_dev.cluster.errors import ClusterError
from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent
from vk_provider_dev.cluster.ports import free_ports

OVERFLOW_TAINT: Final = "virtual-kubelet.io/provider=vk-provider"
PLUGIN: Final = "RemovePodsViolatingNodeTaints"
PROFILE: Final = "flip-back"
# klog's structured line for an eviction, e.g.
#   I1201 ... evictions.go:...] "Evicted pod" pod="ns/name" reason="" strategy="X" node="vk-gpu"
_EVICTED: Final = re.compile(r'"Evicted pod"(?P<fields>.*)$', re.MULTILINE)
_FIELD: Final = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
# The last line of every cycle: "Number of evictions/requests" totalEvicted=1 evictionRequests=0
_CYCLE_END: Final = re.compile(r'"Number of evictions/requests" totalEvicted=(\d+)')
_SERVING: Final = "Serving securely on"


@dataclass(frozen=True, slots=True)
class Eviction:
    """One pod the descheduler evicted: ``pod`` is ``namespace/name``."""

    pod: str
    node: str
    strategy: str


@dataclass(frozen=True, slots=True)
class DeschedulerRun:
    """The outcome of one cycle (``run_descheduler_once``)."""

    returncode: int
    output: str
    evictions: tuple[Eviction, ...]

    @property
    def ok(self) -> bool:
        """The program exited 0 after a complete cycle (it also exits 0 when it skips one)."""
        return self.returncode == 0 and bool(parse_cycles(self.output))


def descheduler_policy(
    *,
    taints: Sequence[str] = (OVERFLOW_TAINT,),
    max_per_node: int = 1,
    max_total: int | None = 1,
    node_fit: bool = True,
    disabled_protections: Sequence[str] = ("PodsWithLocalStorage",),
) -> dict[str, Any]:
    """The policy document (module docstring); ``taints`` are ``key`` or ``key=value``."""
    policy: dict[str, Any] = {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": max_per_node,
    }
    if max_total is not None:
        policy["maxNoOfPodsToEvictTotal"] = max_total
    evictor: dict[str, Any] = {"nodeFit": node_fit}
    if disabled_protections:
        evictor["podProtections"] = {"defaultDisabled": list(disabled_protections)}
    policy["profiles"] = [
        {
            "name": PROFILE,
            "pluginConfig": [
                {"name": "DefaultEvictor", "args": evictor},
                {"name": PLUGIN, "args": {"includedTaints": list(taints)}},
            ],
            "plugins": {"deschedule": {"enabled": [PLUGIN]}},
        }
    ]
    return policy


def descheduler_policy_yaml(**options: Any) -> str:
    return yaml.safe_dump(descheduler_policy(**options), sort_keys=False)


def descheduler_command(
    binary: Path,
    *,
    kubeconfig: Path,
    policy: Path,
    interval: str,
    port: int,
    cert_dir: Path,
    verbosity: int = 2,
) -> list[str]:
    """``interval`` ``0`` runs one cycle and exits; ``2m`` etc. runs a daemon. ``port`` 0
    serves no HTTPS (no metrics)."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--policy-config-file={policy}",
        f"--descheduling-interval={interval}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--v={verbosity}",
    ]


def parse_evictions(output: str) -> tuple[Eviction, ...]:
    """Every ``"Evicted pod"`` line of a descheduler log, in order."""
    found = []
    for match in _EVICTED.finditer(output):
        fields = dict(_FIELD.findall(match.group("fields")))
        found.append(
            Eviction(
                pod=fields.get("pod", ""),
                node=fields.get("node", ""),
                strategy=fields.get("strategy", ""),
            )
        )
    return tuple(found)


def parse_cycles(output: str) -> tuple[int, ...]:
    """The number of pods evicted by each finished cycle of a descheduler log, in order."""
    return tuple(int(n) for n in _CYCLE_END.findall(output))


def run_descheduler_once(
    binary: Path,
    *,
    kubeconfig: Path,
    policy: Path,
    directory: Path,
    timeout: float = 120.0,
    verbosity: int = 2,
) -> DeschedulerRun:
    """Run one descheduling cycle and return what it said and did.

    The output is also appended to ``directory/descheduler-once.log``. A cycle that does not
    end within ``timeout`` is killed and raises ``ClusterError``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    argv = descheduler_command(
        binary,
        kubeconfig=kubeconfig,
        policy=policy,
        interval="0",
        port=0,  # one cycle serves nothing: no port to choose, none to collide
        cert_dir=directory / "certs",
        verbosity=verbosity,
    )
    try:
        result = subprocess.run(
            argv,
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"a descheduler cycle did not end within {timeout:.0f}s") from exc
    with (directory / "descheduler-once.log").open("a") as log:
        log.write(result.stdout)
    return DeschedulerRun(
        returncode=result.returncode,
        output=result.stdout,
        evictions=parse_evictions(result.stdout),
    )


@dataclass(slots=True)
class Descheduler(RunningComponent):
    """A descheduler running cycles at an interval (``start_descheduler``)."""

    child: ChildProcess
    port: int
    interval: str

    def output(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def evictions(self) -> tuple[Eviction, ...]:
        """Every eviction logged so far."""
        return parse_evictions(self.output())

    def cycles(self) -> tuple[int, ...]:
        """Evictions per finished cycle so far (``len`` is the number of cycles)."""
        return parse_cycles(self.output())


def _serving(log_file: Path) -> bool:
    try:
        return _SERVING in log_file.read_text(errors="replace")
    except FileNotFoundError:
        return False


def start_descheduler(
    binary: Path,
    *,
    kubeconfig: Path,
    policy: Path,
    directory: Path,
    interval: str = "10s",
    timeout: float = 60.0,
    verbosity: int = 2,
) -> Descheduler:
    """Start the descheduler as a daemon (a cycle every ``interval``, the first at once); log
    ``directory/descheduler.log``. Returns once it serves its secure port."""
    if interval in ("0", "0s"):
        raise ClusterError("interval 0 is one cycle: use run_descheduler_once")
    directory.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    log_file = directory / "descheduler.log"
    child = ChildProcess.start(
        "descheduler",
        descheduler_command(
            binary,
            kubeconfig=kubeconfig,
            policy=policy,
            interval=interval,
            port=port,
            cert_dir=directory / "certs",
            verbosity=verbosity,
        ),
        log_file=log_file,
        health=lambda: _serving(log_file),
        cwd=directory,
        timeout=timeout,
    )
    return Descheduler(child=child, port=port, interval=interval)
