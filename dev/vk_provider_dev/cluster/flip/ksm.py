"""kube-state-metrics outside the cluster: the node and pod series the flip's signal is made of.

Invariants:
- Only nodes and pods are exported (``RESOURCES``); of node labels, exactly ``gpu.pool`` and
  ``type`` (``NODE_LABELS``): KSM exports no labels by default, and
  ``kube_node_labels{label_gpu_pool="own"}`` is how the recording rules find own nodes.
- Both of its servers listen on 127.0.0.1 only, on free ports: metrics on ``port``, its own
  telemetry on ``telemetry_port``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from vk_provider_dev.cluster.flip.child import ChildProcess, RunningComponent, http_ok
from vk_provider_dev.cluster.ports import free_ports

RESOURCES: Final = ("nodes", "pods")
NODE_LABELS: Final = ("gpu.pool", "type")


def ksm_command(binary: Path, *, kubeconfig: Path, port: int, telemetry_port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--telemetry-host=127.0.0.1",
        f"--telemetry-port={telemetry_port}",
        f"--resources={','.join(RESOURCES)}",
        f"--metric-labels-allowlist=nodes=[{','.join(NODE_LABELS)}]",
    ]


@dataclass(slots=True)
class KubeStateMetrics(RunningComponent):
    """A running kube-state-metrics (``start_kube_state_metrics``)."""

    child: ChildProcess
    port: int
    telemetry_port: int

    @property
    def address(self) -> str:
        """``host:port`` of the metrics endpoint, as a Prometheus target."""
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}/metrics"


def start_kube_state_metrics(
    binary: Path, *, kubeconfig: Path, directory: Path, timeout: float = 60.0
) -> KubeStateMetrics:
    """Start KSM and return once its metrics server is healthy and its telemetry is ready.

    Its log is ``directory/kube-state-metrics.log``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    port, telemetry_port = free_ports(2)
    healthz = http_ok(f"http://127.0.0.1:{port}/healthz")
    readyz = http_ok(f"http://127.0.0.1:{telemetry_port}/readyz")
    child = ChildProcess.start(
        "kube-state-metrics",
        ksm_command(binary, kubeconfig=kubeconfig, port=port, telemetry_port=telemetry_port),
        log_file=directory / "kube-state-metrics.log",
        health=lambda: healthz() and readyz(),
        cwd=directory,
        timeout=timeout,
    )
    return KubeStateMetrics(child=child, port=port, telemetry_port=telemetry_port)
