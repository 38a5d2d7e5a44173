"""The per-pod lifecycle: what to do next with one pod, as an explicit transition table.

``decide(pod, sighting, now=..., hold_until=...)`` looks at one pod (parsed
once, ``PodView``) and what its provider last said about the instance it names
(``Sighting``), and returns the one next ``Step``. The pod controller only executes steps.

The decision has two inputs that make the table's key:

- the pod's **context**: alive (``LIVE``), being deleted within its grace period
  (``DELETING``), being deleted past grace + slack (``OVERDUE``), or ended (``ENDED``:
  phase Succeeded/Failed);
- the instance's **condition**: the pod names none (``NOT_PLACED``), the provider does not know
  it (``MISSING``), the provider could not be asked (``UNREACHABLE``), or the instance's state
  — with ``EXITED`` refined by the restart policy, the exit code and the crash-loop back-off
  into ``EXITED_FINAL`` (the policy says the pod is done), ``EXITED_WAIT`` (it will restart,
  back-off not over) and ``EXITED_DUE`` (restart now). An instance that reports its
  containers (a whole pod, ``Capabilities.multi_container``) has a provider that restarts
  them itself: its ``EXITED`` is always ``EXITED_FINAL``.

``TABLE`` maps every (context, condition) pair to a step, one comment per edge, and is tested
edge by edge (``tests/unit/test_lifecycle.py``). One rule sits on top of the table: a step
that would call the launcher (``PLACE``, ``RELAUNCH``) while the pod's work-queue back-off
holds it becomes ``WAIT`` — the back-off itself lives in the work queue, not here.

Invariants: pure (no I/O; ``now`` is an input); total (every pair has an edge); a deleting
pod never waits on a launch back-off; an ended pod is never relaunched.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from vk_provider.domain.models import Instance, InstanceState
from vk_provider.domain.podview import PodView

MAX_CRASH_BACKOFF_SECONDS = 300.0


class Context(enum.Enum):
    LIVE = "live"
    DELETING = "deleting"
    OVERDUE = "overdue"  # deletionTimestamp + slack has passed
    ENDED = "ended"


class Condition(enum.Enum):
    NOT_PLACED = "not-placed"
    MISSING = "missing"
    UNREACHABLE = "unreachable"
    PENDING = "pending"
    RUNNING = "running"
    EXITED_FINAL = "exited-final"
    EXITED_WAIT = "exited-wait"
    EXITED_DUE = "exited-due"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    LOST = "lost"


class Step(enum.Enum):
    PLACE = "place"  # run the launcher (which adopts a listed instance before it creates)
    WAIT = "wait"  # held by the work queue's back-off: nothing until its timer
    RETRY = "retry"  # the provider could not be asked: try again with back-off
    SHOW_PENDING = "show-pending"  # write ContainerCreating; poll
    SHOW_RUNNING = "show-running"  # write Running; poll slowly
    FAIL_LOST = "fail-lost"  # the provider lost or ended it: Failed (InstanceLost), avoid offer
    COMPLETE = "complete"  # the container ended for good: Succeeded/Failed by exit code
    BACK_OFF = "back-off"  # CrashLoopBackOff until the restart is due
    RELAUNCH = "relaunch"  # the next attempt, through the launcher
    TERMINATE = "terminate"  # deleting: ask the provider to stop it (Killing); poll
    AWAIT_TERMINATION = "await-termination"  # deleting: termination under way; poll
    FINISH_DELETION = "finish-deletion"  # release what is left, delete the pod (grace 0)
    RELEASE = "release"  # ended: make sure nothing runs, give the budget back
    NOTHING = "nothing"  # ended and nothing runs


C, K, S = Context, Condition, Step
TABLE: dict[tuple[Context, Condition], Step] = {
    # --- a live pod ------------------------------------------------------------------------
    (C.LIVE, K.NOT_PLACED): S.PLACE,  # first launch (or adopt what a crash left behind)
    (C.LIVE, K.MISSING): S.FAIL_LOST,  # the provider no longer knows the instance
    (C.LIVE, K.UNREACHABLE): S.RETRY,  # no verdict on the pod: ask again later
    (C.LIVE, K.PENDING): S.SHOW_PENDING,  # provisioning, pulling, booting
    (C.LIVE, K.RUNNING): S.SHOW_RUNNING,  # the container runs
    (C.LIVE, K.EXITED_FINAL): S.COMPLETE,  # Never, or OnFailure with exit 0: the pod is done
    (C.LIVE, K.EXITED_WAIT): S.BACK_OFF,  # will restart; the crash-loop back-off is not over
    (C.LIVE, K.EXITED_DUE): S.RELAUNCH,  # will restart, now: the next attempt
    (C.LIVE, K.TERMINATING): S.FAIL_LOST,  # we never asked: the provider is ending it
    (C.LIVE, K.TERMINATED): S.FAIL_LOST,  # we never asked: the provider ended it
    (C.LIVE, K.LOST): S.FAIL_LOST,  # lost, preempted or failed by the provider
    # --- deleted, within its grace period ----------------------------------------------------
    (C.DELETING, K.NOT_PLACED): S.FINISH_DELETION,  # nothing was launched
    (C.DELETING, K.MISSING): S.FINISH_DELETION,  # nothing runs any more
    (C.DELETING, K.UNREACHABLE): S.TERMINATE,  # stop it anyway: a paid instance matters more
    (C.DELETING, K.PENDING): S.TERMINATE,  # stop it with the remaining grace
    (C.DELETING, K.RUNNING): S.TERMINATE,  # stop it with the remaining grace
    (C.DELETING, K.EXITED_FINAL): S.FINISH_DELETION,  # ended: release the leftover
    (C.DELETING, K.EXITED_WAIT): S.FINISH_DELETION,  # ended: no restart for a deleted pod
    (C.DELETING, K.EXITED_DUE): S.FINISH_DELETION,  # ended: no restart for a deleted pod
    (C.DELETING, K.TERMINATING): S.AWAIT_TERMINATION,  # asked already: wait for it
    (C.DELETING, K.TERMINATED): S.FINISH_DELETION,  # gone: delete the pod
    (C.DELETING, K.LOST): S.FINISH_DELETION,  # gone: delete the pod
    # --- deleted, past grace + slack: the pod goes now; reconciliation finishes the rest ----
    (C.OVERDUE, K.NOT_PLACED): S.FINISH_DELETION,
    (C.OVERDUE, K.MISSING): S.FINISH_DELETION,
    (C.OVERDUE, K.UNREACHABLE): S.FINISH_DELETION,  # the instance keeps the pod UID: reaped
    (C.OVERDUE, K.PENDING): S.FINISH_DELETION,  # one more stop request, then the pod goes
    (C.OVERDUE, K.RUNNING): S.FINISH_DELETION,  # one more stop request, then the pod goes
    (C.OVERDUE, K.EXITED_FINAL): S.FINISH_DELETION,
    (C.OVERDUE, K.EXITED_WAIT): S.FINISH_DELETION,
    (C.OVERDUE, K.EXITED_DUE): S.FINISH_DELETION,
    (C.OVERDUE, K.TERMINATING): S.FINISH_DELETION,  # slow terminate: reconciliation retries
    (C.OVERDUE, K.TERMINATED): S.FINISH_DELETION,
    (C.OVERDUE, K.LOST): S.FINISH_DELETION,
    # --- ended (Succeeded / Failed) -----------------------------------------------------------
    (C.ENDED, K.NOT_PLACED): S.NOTHING,  # never ran (e.g. InvalidSpec with Never)
    (C.ENDED, K.MISSING): S.NOTHING,  # released already
    (C.ENDED, K.UNREACHABLE): S.RELEASE,  # ask to stop anyway; reconciliation retries
    (C.ENDED, K.PENDING): S.RELEASE,  # ended but still running (e.g. failed as lost): stop it
    (C.ENDED, K.RUNNING): S.RELEASE,  # ended but still running: stop it
    (C.ENDED, K.EXITED_FINAL): S.RELEASE,  # release the finished instance (logs stay)
    (C.ENDED, K.EXITED_WAIT): S.RELEASE,  # an ended pod never restarts
    (C.ENDED, K.EXITED_DUE): S.RELEASE,  # an ended pod never restarts
    (C.ENDED, K.TERMINATING): S.NOTHING,  # under way; reconciliation retries if it stalls
    (C.ENDED, K.TERMINATED): S.NOTHING,  # gone
    (C.ENDED, K.LOST): S.RELEASE,  # may still exist at the provider: delete it
}

_LAUNCHING = frozenset({S.PLACE, S.RELAUNCH})

_STATE_CONDITION = {
    InstanceState.PENDING: K.PENDING,
    InstanceState.RUNNING: K.RUNNING,
    InstanceState.TERMINATING: K.TERMINATING,
    InstanceState.TERMINATED: K.TERMINATED,
    InstanceState.LOST: K.LOST,
}


class Seen(enum.Enum):
    """What the provider said when asked for the instance the pod names."""

    NOT_PLACED = "not-placed"  # the pod names no instance (or a provider not configured)
    FOUND = "found"
    MISSING = "missing"  # NotFound
    UNREACHABLE = "unreachable"  # the call failed (breaker open, 5xx, timeout)


@dataclass(frozen=True, slots=True)
class Sighting:
    seen: Seen
    instance: Instance | None = None

    @classmethod
    def of(cls, instance: Instance) -> Sighting:
        return cls(Seen.FOUND, instance)


NOT_PLACED = Sighting(Seen.NOT_PLACED)
MISSING = Sighting(Seen.MISSING)
UNREACHABLE = Sighting(Seen.UNREACHABLE)


@dataclass(frozen=True, slots=True)
class Decision:
    step: Step
    context: Context
    condition: Condition
    wait_seconds: float = 0.0  # BACK_OFF: until the restart is due; WAIT: until the hold ends
    grace_seconds: float = 0.0  # TERMINATE: what is left of the pod's grace period
    attempt: int = 0  # RELAUNCH: the next attempt number


def crash_backoff(base: float, restart_count: int) -> float:
    """kubelet's crash-loop back-off: ``base`` doubled per restart, at most five minutes."""
    return float(min(base * (2 ** max(restart_count, 0)), MAX_CRASH_BACKOFF_SECONDS))


def start_poll_delay(first: float, interval: float, polls: int) -> float:
    """When to look at a launched, still pending instance again: ``first`` after the launch,
    doubled per poll that found it pending, never later than the status poll ``interval``.
    A local instance runs within a fraction of a second; a cloud VM that boots for minutes
    costs a handful of extra reads in its first seconds."""
    return float(min(first * (2 ** max(polls, 0)), max(interval, first)))


def context_of(pod: PodView, *, now: datetime, deletion_slack: float) -> Context:
    if pod.deletion_deadline is not None:
        slack = timedelta(seconds=deletion_slack)
        return C.OVERDUE if now > pod.deletion_deadline + slack else C.DELETING
    return C.ENDED if pod.terminal else C.LIVE


def _restart_due(
    pod: PodView, instance: Instance, *, now: datetime, restart_backoff: float
) -> float:
    """Seconds until an exited container may restart (0 or less: now)."""
    delay = crash_backoff(restart_backoff, pod.status.restart_count)
    finished = instance.finished_at or now
    return delay - (now - finished).total_seconds()


def condition_of(
    pod: PodView, sighting: Sighting, *, now: datetime, restart_backoff: float
) -> tuple[Condition, float]:
    """The instance's condition, and for ``EXITED_WAIT`` the seconds until the restart."""
    if sighting.seen is Seen.NOT_PLACED:
        return K.NOT_PLACED, 0.0
    if sighting.seen is Seen.MISSING:
        return K.MISSING, 0.0
    instance = sighting.instance
    if sighting.seen is Seen.UNREACHABLE or instance is None:
        return K.UNREACHABLE, 0.0
    if instance.state is not InstanceState.EXITED:
        return _STATE_CONDITION[instance.state], 0.0
    if instance.containers:
        # A whole pod: its provider restarts containers per the policy itself, so an instance
        # that has exited is a pod that has ended.
        return K.EXITED_FINAL, 0.0
    code = instance.exit_code if instance.exit_code is not None else 1
    if pod.restart_policy == "Never" or (pod.restart_policy == "OnFailure" and code == 0):
        return K.EXITED_FINAL, 0.0
    wait = _restart_due(pod, instance, now=now, restart_backoff=restart_backoff)
    return (K.EXITED_WAIT, wait) if wait > 0 else (K.EXITED_DUE, 0.0)


def next_attempt(pod: PodView, instance: Instance | None) -> int:
    """The attempt number of a relaunch: new even if a status write was lost."""
    previous = instance.attempt if instance is not None else 0
    return max(pod.status.restart_count, previous) + 1


def decide(
    pod: PodView,
    sighting: Sighting,
    *,
    now: datetime,
    hold_until: datetime | None = None,
    restart_backoff: float = 10.0,
    deletion_slack: float = 5.0,
) -> Decision:
    """The next step for ``pod``; see the module docstring and ``TABLE``.

    ``restart_backoff`` is the first crash-loop back-off (doubled per restart, at most five
    minutes); ``deletion_slack`` how far past its grace period a deleted pod may stay.
    """
    context = context_of(pod, now=now, deletion_slack=deletion_slack)
    condition, wait = condition_of(pod, sighting, now=now, restart_backoff=restart_backoff)
    step = TABLE[(context, condition)]
    if step in _LAUNCHING and hold_until is not None and now < hold_until:
        return Decision(S.WAIT, context, condition, (hold_until - now).total_seconds())
    if step is S.BACK_OFF:
        return Decision(step, context, condition, wait_seconds=wait)
    if step is S.RELAUNCH:
        return Decision(step, context, condition, attempt=next_attempt(pod, sighting.instance))
    if step is S.TERMINATE:
        deadline = pod.deletion_deadline
        grace = max((deadline - now).total_seconds(), 0.0) if deadline else 0.0
        return Decision(step, context, condition, grace_seconds=grace)
    return Decision(step, context, condition)
