"""Writes what a provider says about an instance into its pod's status, as a kubelet would.

Two kinds of instance: a single container (the agent restarts it by relaunching, so restart
counts and the last termination come from the pod's own status), and a whole pod (a provider
whose capabilities say ``multi_container`` runs every container and restarts them itself, and
reports each: ``domain.wholepod``). Readiness comes from the probes: the provider's, the
agent's (``Prober``, for providers whose capabilities say ``probes="agent"``), or none (a
``ProbeUnsupported`` Event says so once, and readiness follows running).

Invariants: only writes status and Events (never launches or deletes); a status is written
only when it changes (``PodWriter``); the Events a kubelet would record (Started per
container, BackOff on entering it) are recorded once per change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Protocol

from vk_provider.controllers.podwriter import PodWriter
from vk_provider.domain import explain
from vk_provider.domain.contract import Provider
from vk_provider.domain.endpointslices import reachable_pod_ip
from vk_provider.domain.lifecycle import crash_backoff
from vk_provider.domain.logfields import about
from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.podstatus import PodContainers, container_view, terminated_of
from vk_provider.domain.podview import PodView, Running, Terminated, Waiting
from vk_provider.domain.wholepod import (
    Verdicts,
    container_events,
    final_phase,
    lost_view,
    readiness,
    whole_pod_view,
)

log = logging.getLogger(__name__)


class ProbeVerdicts(Protocol):
    """Where the agent's probe results come from (``controllers.prober.Prober``)."""

    def verdicts(self, pod: PodView, instance: Instance) -> Verdicts:
        """The probes' verdicts for the pod's containers (and make sure they are probed)."""
        ...

    def stopping(self, uid: str) -> None:
        """The agent is stopping the pod: probe as for a terminating pod."""
        ...

    def forget(self, uid: str) -> None:
        """The pod no longer runs: stop probing it."""
        ...


def _has_probes(pod: PodView) -> bool:
    return any(
        c.readiness_probe or c.startup_probe or c.liveness_probe
        for c in (*pod.containers, *pod.init_containers)
    )


class StatusReporter:
    def __init__(
        self,
        writer: PodWriter,
        providers: Mapping[str, Provider],
        *,
        probes: ProbeVerdicts,
        restart_backoff: float,
        now: Callable[[], datetime],
    ) -> None:
        self._write = writer
        self._capabilities = {name: p.capabilities for name, p in providers.items()}
        self._probes = probes
        self._restart_backoff = restart_backoff
        self._now = now
        self._unprobed: set[str] = set()  # pod UIDs told ProbeUnsupported

    def whole(self, instance: Instance) -> bool:
        caps = self._capabilities.get(instance.provider)
        return bool(instance.containers or instance.init_containers) or (
            caps is not None and caps.multi_container
        )

    async def _verdicts(self, pod: PodView, instance: Instance) -> tuple[Verdicts, bool]:
        caps = self._capabilities.get(instance.provider)
        how = caps.probes if caps else "none"
        if how == "agent":
            return self._probes.verdicts(pod, instance), True
        if how == "none" and _has_probes(pod) and pod.uid not in self._unprobed:
            self._unprobed.add(pod.uid)
            await self._write.event(
                pod,
                explain.Event(
                    explain.WARNING,
                    explain.PROBE_UNSUPPORTED,
                    f"provider {instance.provider} cannot probe containers: the pod's probes "
                    "are not run and readiness follows the container running",
                ),
            )
        return {}, False

    async def _show_whole(
        self, pod: PodView, instance: Instance, *, final: bool = False
    ) -> PodContainers:
        verdicts, agent = await self._verdicts(pod, instance)
        containers = whole_pod_view(
            pod, instance, verdicts=verdicts, agent_probes=agent, now=self._now()
        )
        phase = final_phase(containers) if final else None
        for event in container_events(pod, containers):
            if event.reason == explain.STARTED:
                where = about(pod.key, instance.instance_id, instance.provider)
                log.info("%s", event.message, extra=where)
            await self._write.event(pod, event)
        await self._write.status(
            pod,
            containers,
            pod_ip=reachable_pod_ip(pod.declared_ports, instance.endpoints),
            phase=phase,
        )
        return containers

    async def placed(self, pod: PodView, instance: Instance) -> None:
        """The status of a pod just placed on ``instance`` (it goes out with the staged
        placement, in one write): Running at once for an instance that already runs."""
        if instance.state is InstanceState.RUNNING:
            await self.running(pod, instance)
        else:
            await self.pending(pod, instance)

    async def pending(self, pod: PodView, instance: Instance) -> None:
        if self.whole(instance):
            await self._show_whole(pod, instance)
            return
        state = Waiting("ContainerCreating", instance.message)
        await self._write.status(pod, container_view(pod, state, instance_id=instance.instance_id))

    async def running(self, pod: PodView, instance: Instance) -> None:
        if self.whole(instance):
            await self._show_whole(pod, instance)
            return
        recorded = pod.status.running_since
        # Some providers do not say when the container started: keep what we wrote first.
        started = instance.started_at or recorded or self._now()
        view = container_view(pod, Running(started), instance_id=instance.instance_id)
        verdicts, agent = await self._verdicts(pod, instance)
        if pod.containers:
            ready, started_ok = readiness(
                pod.containers[0],
                reported=None,
                verdict=verdicts.get(pod.container_name),
                agent_probes=agent,
            )
            view = replace(view, ready=ready, started=started_ok)
        await self._write.status(
            pod, view, pod_ip=reachable_pod_ip(pod.declared_ports, instance.endpoints)
        )
        if recorded is None:
            started_event = explain.Event(
                explain.NORMAL, explain.STARTED, f"Started container {pod.container_name}"
            )
            where = about(pod.key, instance.instance_id, instance.provider)
            log.info("%s", started_event.message, extra=where)
            await self._write.event(pod, started_event)

    async def complete(self, pod: PodView, instance: Instance) -> None:
        """The instance ended for good: the pod's final status."""
        self._probes.forget(pod.uid)
        if self.whole(instance):
            await self._show_whole(pod, instance, final=True)
            return
        ended = terminated_of(instance, now=self._now())
        view = container_view(pod, ended, instance_id=instance.instance_id)
        await self._write.status(
            pod, view, pod_ip=reachable_pod_ip(pod.declared_ports, instance.endpoints)
        )

    async def back_off(self, pod: PodView, instance: Instance) -> None:
        """A single container exited and restarts once the crash-loop back-off is over."""
        delay = crash_backoff(self._restart_backoff, pod.status.restart_count)
        event = explain.crash_loop(pod.container_name, pod.name, delay)
        if pod.status.waiting_reason != "CrashLoopBackOff":
            await self._write.event(pod, event)
        view = container_view(
            pod,
            Waiting("CrashLoopBackOff", event.message),
            instance_id=instance.instance_id,
            last=terminated_of(instance, now=self._now()),
        )
        await self._write.status(pod, view)

    async def lost(self, pod: PodView, message: str) -> None:
        """The provider lost the instance: Failed (InstanceLost), every container ended."""
        log.warning("failed, instance lost: %s", message, extra=about(pod.key))
        self._probes.forget(pod.uid)
        lost = Terminated(
            exit_code=137,
            reason="InstanceLost",
            started_at=pod.status.running_since,
            finished_at=self._now(),
            message=message,
        )
        await self._write.status(
            pod, lost_view(pod, lost), phase="Failed", reason="InstanceLost", message=message
        )

    def stopping(self, uid: str) -> None:
        self._probes.stopping(uid)

    def forget(self, uid: str) -> None:
        self._probes.forget(uid)
        self._unprobed.discard(uid)
