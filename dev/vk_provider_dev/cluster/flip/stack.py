"""Everything around the flip at once, next to a running ``LocalCluster``.

``start_flip_components(cluster, directory=...)`` starts KWOK and creates the own GPU nodes,
then kube-state-metrics, then Prometheus scraping it with the flip's recording rules, and
returns a ``FlipComponents`` handle that also runs the descheduler (one cycle, or as a daemon
it then owns). ``stop()`` (or leaving its ``with`` block) stops every process it started, in
reverse order, and removes the nodes it created.

Invariants:
- A failure half-way through start stops what was already started: nothing is left running.
- Each component writes its own log under ``directory`` (``kwok/``, ``ksm/``, ``prometheus/``,
  ``descheduler/``); the names are in each component's module.
- Prometheus only reports rules it loaded: ``flip:own_gpus_full`` appears once KSM has been
  scraped and the rule group evaluated (two intervals).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from vk_provider_dev.cluster.cluster import LocalCluster
from vk_provider_dev.cluster.flip import kwok as kwok_mod
from vk_provider_dev.cluster.flip.adminapi import AdminApi
from vk_provider_dev.cluster.flip.deployfiles import descheduler_policy_file, flip_rules
from vk_provider_dev.cluster.flip.descheduler import (
    Descheduler,
    DeschedulerRun,
    run_descheduler_once,
    start_descheduler,
)
from vk_provider_dev.cluster.flip.ksm import KubeStateMetrics, start_kube_state_metrics
from vk_provider_dev.cluster.flip.kueue import Kueue, start_kueue
from vk_provider_dev.cluster.flip.kwok import Kwok, start_kwok
from vk_provider_dev.cluster.flip.prometheus import DEFAULT_INTERVAL, Prometheus, start_prometheus
from vk_provider_dev.cluster.flip.tools import FlipTools, ensure_flip_tools


@dataclass(slots=True)
class FlipComponents:
    """The running components (``start_flip_components``); see the module docstring."""

    cluster: LocalCluster
    tools: FlipTools
    directory: Path
    api: AdminApi
    kwok: Kwok
    ksm: KubeStateMetrics
    prometheus: Prometheus
    nodes: list[str]
    descheduler: Descheduler | None = None
    kueue: Kueue | None = None
    _interval: str = DEFAULT_INTERVAL
    _cycles: int = field(default=0, init=False, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    def add_gpu_nodes(self, count: int, *, prefix: str, gpus: int = 8) -> list[str]:
        """More own nodes (``prefix-0..``), Ready on return; removed by ``stop`` too."""
        names = kwok_mod.create_gpu_nodes(self.api, count, prefix=prefix, gpus=gpus)
        self.nodes.extend(n for n in names if n not in self.nodes)
        kwok_mod.wait_nodes_ready(self.api, names)
        return names

    def run_descheduler_once(
        self, *, policy: Path | None = None, timeout: float = 120.0
    ) -> DeschedulerRun:
        """One descheduling cycle with ``policy`` (default: deploy/descheduler/policy.yaml)."""
        self._cycles += 1
        return run_descheduler_once(
            self.tools.descheduler,
            kubeconfig=self.kubeconfig,
            policy=policy or descheduler_policy_file(),
            directory=self.directory / "descheduler" / f"cycle-{self._cycles}",
            timeout=timeout,
        )

    def start_descheduler(
        self, *, interval: str = "10s", policy: Path | None = None
    ) -> Descheduler:
        """The descheduler as a daemon (one at a time); stopped by ``stop_descheduler``/``stop``."""
        self.stop_descheduler()
        self.descheduler = start_descheduler(
            self.tools.descheduler,
            kubeconfig=self.kubeconfig,
            policy=policy or descheduler_policy_file(),
            directory=self.directory / "descheduler" / "daemon",
            interval=interval,
        )
        return self.descheduler

    def start_kueue(self) -> Kueue:
        """Kueue with its CRDs and webhooks (one at a time); stopped by ``stop``."""
        if self.kueue is not None and self.kueue.running:
            return self.kueue
        self.kueue = start_kueue(
            self.cluster, self.tools.kueue, directory=self.directory / "kueue", api=self.api
        )
        return self.kueue

    def stop_kueue(self) -> None:
        if self.kueue is not None:
            self.kueue.stop()

    def stop_prometheus(self) -> None:
        """An outage of the signal: Prometheus stops (``start_prometheus`` brings it back)."""
        self.prometheus.stop()

    def start_prometheus(self) -> Prometheus:
        """Prometheus again, on the same address and storage (after ``stop_prometheus``)."""
        if self.prometheus.running:
            return self.prometheus
        self.prometheus = start_prometheus(
            self.tools.prometheus.prometheus,
            targets=[self.ksm.address],
            directory=self.directory / "prometheus",
            rule_files=[flip_rules()],
            interval=self._interval,
            port=self.prometheus.port,
        )
        return self.prometheus

    def stop_descheduler(self) -> None:
        daemon, self.descheduler = self.descheduler, None
        if daemon is not None:
            daemon.stop()

    def stop(self, *, delete_nodes: bool = True) -> None:
        """Stop everything started here, newest first; remove the own nodes (idempotent)."""
        self.stop_kueue()
        self.stop_descheduler()
        self.prometheus.stop()
        self.ksm.stop()
        try:
            if delete_nodes and self.cluster.status().apiserver_ready:
                kwok_mod.delete_gpu_nodes(self.api, self.nodes)
        finally:
            self.kwok.stop()
            self.api.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()


def start_flip_components(
    cluster: LocalCluster,
    *,
    directory: Path,
    own_nodes: int = 4,
    gpus_per_node: int = 8,
    pod_complete: bool = False,
    rule_files: Sequence[Path] | None = None,
    interval: str = DEFAULT_INTERVAL,
    tools: FlipTools | None = None,
) -> FlipComponents:
    """Start KWOK with ``own_nodes`` GPU nodes (Ready on return), KSM and Prometheus.

    ``pod_complete`` keeps KWOK's stage that makes Job pods Succeed at once (off: a training
    Job holds its GPUs until the test ends it). ``rule_files`` default to the flip's rules.
    ``tools`` default to ``ensure_flip_tools()`` (which builds what is missing: minutes).
    """
    tools = tools or ensure_flip_tools()
    kubeconfig = cluster.kubeconfig
    with contextlib.ExitStack() as undo:
        api = AdminApi(cluster)
        undo.callback(api.close)
        kwok = start_kwok(
            tools.kwok,
            kubeconfig=kubeconfig,
            directory=directory / "kwok",
            pod_complete=pod_complete,
        )
        undo.callback(kwok.stop)
        nodes = kwok_mod.create_gpu_nodes(api, own_nodes, gpus=gpus_per_node)
        undo.callback(kwok_mod.delete_gpu_nodes, api, nodes)
        kwok_mod.wait_nodes_ready(api, nodes)
        ksm = start_kube_state_metrics(
            tools.kube_state_metrics, kubeconfig=kubeconfig, directory=directory / "ksm"
        )
        undo.callback(ksm.stop)
        prometheus = start_prometheus(
            tools.prometheus.prometheus,
            targets=[ksm.address],
            directory=directory / "prometheus",
            rule_files=list(rule_files) if rule_files is not None else [flip_rules()],
            interval=interval,
        )
        undo.pop_all()
    return FlipComponents(
        cluster=cluster,
        tools=tools,
        directory=directory,
        api=api,
        kwok=kwok,
        ksm=ksm,
        prometheus=prometheus,
        nodes=nodes,
        _interval=interval,
    )
