"""The agent's prober: startup, readiness and liveness probes of pods whose provider lets the
agent reach their containers (``Capabilities.probes == "agent"``, the local provider).

As kubelet's prober: per container run, the startup probe (if any) runs first, every period
after its initial delay, until it succeeds (the container is started) or fails
``failure_threshold`` times (the container is restarted); then the readiness and liveness
probes run side by side. Readiness makes the container ready or not (``domain.probing``);
liveness failing ``failure_threshold`` times in a row restarts the container through the
provider's ``SupportsContainerRestart`` (a ``Killing`` Event), and the provider's restart
policy and back-off decide what follows. Every failed probe is a Warning ``Unhealthy`` Event
(the recorder aggregates repeats), as a kubelet records.

The pod controller's status writer asks ``verdicts(pod, instance)`` each time it writes a
whole pod's status: that starts probing a container run it has not seen (a new start time
or restart count), stops probing containers that no longer run, and returns the current
verdicts. A verdict that changes calls ``on_change(pod key)`` so the status is rewritten.

While the agent stops a pod (``stopping``), as a kubelet for a terminating pod: liveness and
startup probes stop, readiness goes on until the container is gone, and no failure is a
Warning (the container fails because it is being stopped).

Invariants: one set of probe tasks per container run, cancelled when the run ends, the pod
is forgotten, or the prober closes; a probe's outcome never raises out of a task.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from vk_provider.controllers.probeactions import (
    Outcome,
    exec_probe,
    grpc_probe,
    http_probe,
    tcp_probe,
)
from vk_provider.domain import explain
from vk_provider.domain.containers import ContainerState, ContainerStatus, Probe
from vk_provider.domain.contract import Provider, SupportsContainerRestart
from vk_provider.domain.errors import ProviderError
from vk_provider.domain.logfields import about
from vk_provider.domain.models import Instance
from vk_provider.domain.podspec import InvalidPodSpec, ports
from vk_provider.domain.podview import PodKey, PodView
from vk_provider.domain.probes import probes
from vk_provider.domain.probing import ProbeCounter
from vk_provider.domain.wholepod import ProbeVerdict, Verdicts

log = logging.getLogger(__name__)

EventSink = Callable[[PodView, explain.Event], Awaitable[None]]
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class ContainerProbes:
    startup: Probe | None
    readiness: Probe | None
    liveness: Probe | None

    @property
    def any(self) -> bool:
        return any((self.startup, self.readiness, self.liveness))


def pod_probes(pod: PodView) -> dict[str, ContainerProbes]:
    """Each container's probes, read from the pod as translation read them."""
    spec: Mapping[str, Any] = pod.raw.get("spec") or {}
    found: dict[str, ContainerProbes] = {}
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or []):
            path = f"spec.{key}[{index}]"
            try:
                startup, readiness, liveness = probes(container, path, ports(container, path=path))
            except InvalidPodSpec:
                continue  # translation refused such a pod; nothing to probe
            entry = ContainerProbes(startup, readiness, liveness)
            if entry.any:
                found[str(container.get("name"))] = entry
    return found


@dataclass(slots=True)
class _Run:
    """Probing one run of one container."""

    identity: tuple[object, ...]
    verdict: ProbeVerdict
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()


class Prober:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        on_change: Callable[[PodKey], None],
        events: EventSink,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self._providers = dict(providers)
        self._on_change = on_change
        self._events = events
        # As a kubelet's prober: certificates are not verified and no connection is kept
        # alive between probes (each probe is a fresh connection, closed after it).
        self._client = client or httpx.AsyncClient(
            verify=False,  # noqa: S501 - kubelet does not verify probes
            follow_redirects=False,
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"Connection": "close"},
        )
        self._runs: dict[str, dict[str, _Run]] = {}  # pod uid -> container -> run
        self._stopping: set[str] = set()  # pod uids whose containers the agent is stopping

    # --- what the status writer asks ----------------------------------------------------

    def verdicts(self, pod: PodView, instance: Instance) -> Verdicts:
        wanted = pod_probes(pod)
        runs = self._runs.setdefault(pod.uid, {})
        reported = {c.name: c for c in (*instance.init_containers, *instance.containers)}
        for name, container_probes in wanted.items():
            status = reported.get(name)
            run = runs.get(name)
            if status is None or status.state is not ContainerState.RUNNING:
                if run is not None:
                    run.cancel()
                    del runs[name]
                continue
            identity = (status.started_at, status.restart_count)
            if run is not None and run.identity == identity:
                continue
            if run is not None:
                run.cancel()
            runs[name] = self._start(pod, instance, status, container_probes, identity)
        return {name: run.verdict for name, run in runs.items()}

    def stopping(self, uid: str) -> None:
        """The agent is stopping the pod's containers (deletion, eviction, a move home): as a
        kubelet does for a terminating pod, liveness and startup probes stop (no restart of
        a container on its way out); readiness goes on until the container is gone, so the
        pod's endpoints stop serving as it does, and its failures are no Warning: the
        container fails because it is being stopped."""
        self._stopping.add(uid)

    def forget(self, uid: str) -> None:
        self._stopping.discard(uid)
        for run in self._runs.pop(uid, {}).values():
            run.cancel()

    async def close(self) -> None:
        tasks = [t for runs in self._runs.values() for r in runs.values() for t in r.tasks]
        for uid in list(self._runs):
            self.forget(uid)
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._client.aclose()

    # --- probing ------------------------------------------------------------------------

    def _start(
        self,
        pod: PodView,
        instance: Instance,
        status: ContainerStatus,
        container_probes: ContainerProbes,
        identity: tuple[object, ...],
    ) -> _Run:
        run = _Run(
            identity=identity,
            verdict=ProbeVerdict(
                ready=container_probes.readiness is None,
                started=container_probes.startup is None,
            ),
        )
        task = asyncio.create_task(
            self._probe_run(pod, instance, status.name, container_probes, run),
            name=f"probe {pod.namespace}/{pod.name}/{status.name}",
        )
        run.tasks.append(task)
        return run

    def _set(
        self, pod: PodView, run: _Run, *, ready: bool | None = None, started: bool | None = None
    ) -> None:
        verdict = ProbeVerdict(
            ready=run.verdict.ready if ready is None else ready,
            started=run.verdict.started if started is None else started,
        )
        if verdict != run.verdict:
            run.verdict = verdict
            self._on_change(pod.key)

    async def _outcome(self, probe: Probe, instance: Instance, container: str) -> Outcome:
        host = probe.host or instance.ip or "127.0.0.1"
        try:
            if probe.kind == "http":
                return await http_probe(probe, host, self._client)
            if probe.kind == "tcp":
                return await tcp_probe(probe, host)
            if probe.kind == "grpc":
                return await grpc_probe(probe, host)
            provider = self._providers[instance.provider]
            return await exec_probe(probe, provider, instance.instance_id, container)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a probe failing in an unforeseen way is a failed probe
            return Outcome(False, f"{type(exc).__name__}: {exc}")

    async def _unhealthy(self, pod: PodView, kind: str, container: str, message: str) -> None:
        if pod.uid in self._stopping:
            log.debug(
                "%s probe of %s/%s/%s failed while stopping: %s", kind, *pod.key, container, message
            )
            return
        text = f"{kind} probe failed: {message}" if message else f"{kind} probe failed"
        event = explain.Event(explain.WARNING, UNHEALTHY, f"[{container}] {text}")
        await self._events(pod, event)

    async def _restart(self, pod: PodView, instance: Instance, container: str, why: str) -> None:
        provider = self._providers.get(instance.provider)
        event = explain.Event(
            explain.NORMAL,
            explain.KILLING,
            f"Container {container} failed {why} probe, will be restarted",
        )
        await self._events(pod, event)
        if not isinstance(provider, SupportsContainerRestart):
            log.warning(
                "provider %s cannot restart container %s",
                instance.provider,
                container,
                extra=about(pod.key, instance.instance_id, instance.provider),
            )
            return
        try:
            await provider.restart_container(instance.instance_id, container)
        except ProviderError as exc:
            log.warning(
                "restarting %s of %s/%s failed: %s",
                container,
                *pod.key,
                exc,
                extra=about(pod.key, instance.instance_id, instance.provider),
            )

    async def _probe_run(
        self,
        pod: PodView,
        instance: Instance,
        container: str,
        container_probes: ContainerProbes,
        run: _Run,
    ) -> None:
        startup = container_probes.startup
        if startup is not None and not await self._startup(pod, instance, container, startup):
            return
        self._set(pod, run, started=True)
        loops = []
        if container_probes.readiness is not None:
            loops.append(self._readiness(pod, instance, container, container_probes.readiness, run))
        if container_probes.liveness is not None:
            loops.append(self._liveness(pod, instance, container, container_probes.liveness, run))
        await asyncio.gather(*loops)

    async def _startup(
        self, pod: PodView, instance: Instance, container: str, probe: Probe
    ) -> bool:
        counter = ProbeCounter.startup(probe)
        await asyncio.sleep(probe.initial_delay_seconds)
        while True:
            if pod.uid in self._stopping:
                return False  # on its way out: it will not be started, nor restarted
            outcome = await self._outcome(probe, instance, container)
            counter.observe(outcome.ok)
            if counter.verdict is True:
                return True
            await self._unhealthy(pod, "Startup", container, outcome.message)
            if counter.verdict is False:
                await self._restart(pod, instance, container, "startup")
                return False
            await asyncio.sleep(probe.period_seconds)

    async def _readiness(
        self, pod: PodView, instance: Instance, container: str, probe: Probe, run: _Run
    ) -> None:
        counter = ProbeCounter.readiness(probe)
        await asyncio.sleep(probe.initial_delay_seconds)
        while True:
            outcome = await self._outcome(probe, instance, container)
            if counter.observe(outcome.ok):
                self._set(pod, run, ready=bool(counter.verdict))
            if not outcome.ok:
                await self._unhealthy(pod, "Readiness", container, outcome.message)
            await asyncio.sleep(probe.period_seconds)

    async def _liveness(
        self, pod: PodView, instance: Instance, container: str, probe: Probe, run: _Run
    ) -> None:
        counter = ProbeCounter.liveness(probe)
        await asyncio.sleep(probe.initial_delay_seconds)
        while True:
            if pod.uid in self._stopping:
                return  # a terminating container is not restarted
            outcome = await self._outcome(probe, instance, container)
            counter.observe(outcome.ok)
            if not outcome.ok:
                await self._unhealthy(pod, "Liveness", container, outcome.message)
            if counter.verdict is False:
                self._set(pod, run, ready=False)
                await self._restart(pod, instance, container, "liveness")
                return
            await asyncio.sleep(probe.period_seconds)
