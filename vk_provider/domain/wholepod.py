"""A whole pod's containers, as a provider that runs them all reports them.

A provider whose capabilities say ``multi_container`` runs every container of the pod itself —
init containers in order, sidecars beside the app, restarts per the pod's restart policy with
back-off — and reports each in ``Instance.containers`` / ``Instance.init_containers``. This
module turns that report, with the readiness and startup verdicts of the probes, into the
``PodContainers`` the status writer shows, and says which Events a kubelet would record for
the change (a container started, a container entered back-off).

Readiness, per container: the provider's own verdict when it probes (a remote kubelet);
otherwise, where the agent probes, the agent's verdict — False until the first success, and
only once the startup probe (if any) has passed; where nobody probes, ready while running.

Invariants: pure (``now`` is an input); a container the provider does not report yet is
waiting (PodInitializing while init containers run, else ContainerCreating); restart counts
never go down (the pod's recorded count is kept when a report has less); a container's
``lastState`` is kept while a report of the same restart count has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from vk_provider.domain import explain
from vk_provider.domain.containers import ContainerState as RuntimeState
from vk_provider.domain.containers import ContainerStatus as Reported
from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.podstatus import ContainerView, PodContainers
from vk_provider.domain.podview import (
    ContainerStatus,
    PodView,
    Running,
    SpecContainer,
    Terminated,
    Waiting,
)


@dataclass(frozen=True, slots=True)
class ProbeVerdict:
    """What the agent's probes of one container say now."""

    ready: bool = False  # the readiness probe's last verdict (after its thresholds)
    started: bool = False  # the startup probe has succeeded


Verdicts = Mapping[str, ProbeVerdict]


def readiness(
    spec: SpecContainer,
    *,
    reported: Reported | None,
    verdict: ProbeVerdict | None,
    agent_probes: bool,
) -> tuple[bool | None, bool | None]:
    """(ready, started) of a running container; None means "as running"."""
    if reported is not None and (reported.ready is not None or reported.started is not None):
        return reported.ready, reported.started
    if not agent_probes:
        return None, None
    started = (verdict.started if verdict else False) if spec.startup_probe else None
    if not spec.readiness_probe:
        return (False if started is False else None), started
    ready = verdict.ready if verdict else False
    return ready and started is not False, started


def container_id(instance_id: str, container: str) -> str:
    return f"vk-provider://{instance_id}/{container}"


def _state(reported: Reported, *, now: datetime) -> Running | Waiting | Terminated:
    if reported.state is RuntimeState.RUNNING:
        return Running(reported.started_at or now)
    if reported.state is RuntimeState.TERMINATED:
        code = reported.exit_code if reported.exit_code is not None else 1
        return Terminated(
            exit_code=code,
            reason=reported.reason or ("Completed" if code == 0 else "Error"),
            started_at=reported.started_at,
            finished_at=reported.finished_at or now,
            message=reported.message,
        )
    return Waiting(reported.reason or "ContainerCreating", reported.message)


def _last(reported: Reported, recorded: ContainerStatus | None) -> Terminated | None:
    last = reported.last_termination
    if last is None:
        # A report without it keeps the one recorded for the same run (a runtime such as
        # Docker tells the last exit only while it waits to restart the container).
        same_run = recorded is not None and reported.restart_count in (0, recorded.restart_count)
        return recorded.last_termination if recorded and same_run else None
    code = last.exit_code
    return Terminated(
        exit_code=code,
        reason=last.reason or ("Completed" if code == 0 else "Error"),
        started_at=last.started_at,
        finished_at=last.finished_at,
        message=last.message,
    )


def _view(
    spec: SpecContainer,
    reported: Reported | None,
    recorded: ContainerStatus | None,
    *,
    instance: Instance,
    waiting: Waiting,
    verdict: ProbeVerdict | None,
    agent_probes: bool,
    now: datetime,
) -> ContainerView:
    if reported is None:
        return ContainerView(
            name=spec.name,
            image=spec.image,
            state=waiting,
            container_id=recorded.container_id if recorded else "",
            last_state=recorded.last_termination if recorded else None,
            restart_count=recorded.restart_count if recorded else 0,
            sidecar=spec.sidecar,
        )
    state = _state(reported, now=now)
    ready, started = readiness(spec, reported=reported, verdict=verdict, agent_probes=agent_probes)
    has_run = not isinstance(state, Waiting) or reported.last_termination is not None
    return ContainerView(
        name=spec.name,
        image=spec.image,
        state=state,
        container_id=container_id(instance.instance_id, spec.name) if has_run else "",
        last_state=_last(reported, recorded),
        restart_count=max(reported.restart_count, recorded.restart_count if recorded else 0),
        ready=ready,
        started=started,
        sidecar=spec.sidecar,
    )


def _initializing(pod: PodView, reported: Mapping[str, Reported]) -> bool:
    """Whether a plain init container has yet to complete."""
    for spec in pod.init_containers:
        if spec.sidecar:
            continue
        status = reported.get(spec.name)
        if status is None or status.state is not RuntimeState.TERMINATED or status.exit_code:
            return True
    return False


def whole_pod_view(
    pod: PodView,
    instance: Instance,
    *,
    verdicts: Verdicts,
    agent_probes: bool,
    now: datetime,
) -> PodContainers:
    """The pod's containers as ``instance`` reports them (see the module docstring)."""
    apps = {c.name: c for c in instance.containers}
    inits = {c.name: c for c in instance.init_containers}
    if instance.state is InstanceState.PENDING:
        app_waiting = init_waiting = Waiting("ContainerCreating", instance.message)
    else:
        init_waiting = Waiting("PodInitializing")
        app_waiting = init_waiting if _initializing(pod, inits) else Waiting("ContainerCreating")

    def view(
        spec: SpecContainer,
        reported: Mapping[str, Reported],
        recorded: Mapping[str, ContainerStatus],
        waiting: Waiting,
    ) -> ContainerView:
        return _view(
            spec,
            reported.get(spec.name),
            recorded.get(spec.name),
            instance=instance,
            waiting=waiting,
            verdict=verdicts.get(spec.name),
            agent_probes=agent_probes,
            now=now,
        )

    return PodContainers(
        apps=tuple(view(s, apps, pod.statuses, app_waiting) for s in pod.containers),
        inits=tuple(view(s, inits, pod.init_statuses, init_waiting) for s in pod.init_containers),
    )


def final_phase(containers: PodContainers) -> str:
    """The phase of a pod whose provider says it has ended: Succeeded only if every app
    container completed with exit code 0."""
    done = all(isinstance(c.state, Terminated) and c.state.exit_code == 0 for c in containers.apps)
    return "Succeeded" if done and containers.apps else "Failed"


def lost_view(pod: PodView, lost: Terminated) -> PodContainers:
    """Every container that had not ended, ended by the instance's loss."""

    def ended(spec: SpecContainer, recorded: ContainerStatus | None) -> ContainerView:
        keep = recorded is not None and isinstance(recorded.state, Terminated) and not spec.sidecar
        return ContainerView(
            name=spec.name,
            image=spec.image,
            state=recorded.state if keep and recorded and recorded.state else lost,
            container_id=recorded.container_id if recorded else "",
            last_state=recorded.last_termination if recorded else None,
            restart_count=recorded.restart_count if recorded else 0,
            sidecar=spec.sidecar,
        )

    specs = pod.containers or (SpecContainer(pod.container_name, pod.container_image),)
    return PodContainers(
        apps=tuple(ended(s, pod.statuses.get(s.name)) for s in specs),
        inits=tuple(ended(s, pod.init_statuses.get(s.name)) for s in pod.init_containers),
    )


def container_events(pod: PodView, containers: PodContainers) -> Sequence[explain.Event]:
    """The Events a kubelet records for this change: Started, and BackOff on entering it."""
    events: list[explain.Event] = []
    recorded = {**pod.init_statuses, **pod.statuses}
    for view in (*containers.inits, *containers.apps):
        before = recorded.get(view.name)
        if isinstance(view.state, Running | Terminated):
            # It ran: a kubelet said Started when it did (also for one seen only completed).
            ran_before = before is not None and isinstance(before.state, Running | Terminated)
            restarted = before is not None and before.restart_count != view.restart_count
            if not ran_before or (restarted and isinstance(view.state, Running)):
                events.append(
                    explain.Event(explain.NORMAL, explain.STARTED, f"Started container {view.name}")
                )
        elif (
            isinstance(view.state, Waiting)
            and view.state.reason == "CrashLoopBackOff"
            and (before is None or before.waiting_reason != "CrashLoopBackOff")
        ):
            events.append(
                explain.Event(
                    explain.WARNING,
                    explain.BACK_OFF,
                    f"Back-off restarting failed container {view.name} in pod {pod.name}",
                )
            )
    return events
