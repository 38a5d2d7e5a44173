"""The leader elector: reads and writes the election Lease, and sleeps, around the pure
``domain.leader`` state machine.

``acquire()`` returns once this replica leads (a follower reads the Lease every retry
period); ``keep()`` renews every retry period and *raises* ``LeadershipLost`` the moment the
renew deadline passes without a successful renewal, or a read shows another holder — the
runtime runs it beside the leader-only tasks under one supervisor, so they are all cancelled
at once; ``release()`` clears the holder on a clean stop (client-go's ``ReleaseOnCancel``).

Invariants:
- ``is_leader()`` is a pure function of the monotonic clock and the start of the last
  successful renewal, so it turns false at the deadline even if the loop did not run (a
  process frozen by SIGSTOP wakes up with ``is_leader()`` already false). ``fence()`` raises
  when it is false; the provider guard calls it before every create and delete, so an
  ex-leader launches nothing even if one of its tasks runs before ``keep()`` notices.
- Each API call is bounded by the time left before the deadline, never the client's 30 s.
- Writes carry the ``resourceVersion`` read just before: of two replicas that both find the
  Lease expired, one write wins and the other gets a conflict and keeps following.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import NoReturn

from vk_provider.domain.errors import Transient
from vk_provider.domain.leader import (
    Observation,
    Step,
    Timing,
    decide,
    follow_for,
    next_record,
    observe,
    record_of,
    released,
    spec_of,
    still_leading,
)
from vk_provider.kube.client import JSON, ApiError, ConflictError, KubeClient

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_SECONDS = 5.0


class LeadershipLost(RuntimeError):
    """This replica stopped leading; the agent exits non-zero and restarts as a follower."""


class NotLeading(Transient):
    """A provider write refused because this replica does not (or no longer) lead."""


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        timing: Timing,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_change: Callable[[bool], None] = lambda leading: None,
    ) -> None:
        self._kube = kube
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self._timing = timing
        self._clock = clock
        self._wall = wall_clock
        self._sleep = sleep
        self._on_change = on_change
        self._observation: Observation | None = None
        self._renewed_at: float | None = None  # start of the last successful write of ours

    # ------------------------------------------------------------------ what others ask

    def is_leader(self) -> bool:
        return still_leading(self._renewed_at, now=self._clock(), timing=self._timing)

    def fence(self, operation: str) -> None:
        """Raise ``NotLeading`` unless this replica leads now (called before provider writes)."""
        if not self.is_leader():
            raise NotLeading(f"not the leader: refusing to {operation}")

    @property
    def holder(self) -> str:
        """Who holds the Lease as last read ('' unknown or free)."""
        return self._observation.record.holder if self._observation else ""

    # ------------------------------------------------------------------ the loops

    async def acquire(self) -> None:
        """Return once this replica holds the Lease; read it every retry period until then."""
        log.info(
            "leader election: %s waits for Lease %s/%s", self.identity, self.namespace, self.name
        )
        last_holder = None
        while True:
            try:
                if await self._try(bound=self._timing.renew_deadline):
                    log.info(
                        "leader election: %s leads (Lease %s/%s)",
                        self.identity,
                        self.namespace,
                        self.name,
                    )
                    self._on_change(True)
                    return
            except ApiError as exc:
                log.warning("leader election: cannot read or write the Lease: %s", exc)
            if self.holder != last_holder:
                last_holder = self.holder
                log.info("leader election: following %s", self.holder or "(nobody)")
            await self._sleep(follow_for(self._observation, now=self._clock(), timing=self._timing))

    async def keep(self) -> None:
        """Renew until the renew deadline passes without a renewal; then raise."""
        while True:
            await self._sleep(min(self._timing.retry_period, self._left()))
            if not self.is_leader():
                self._lost(
                    f"no renewal for {self._timing.renew_deadline:g}s (the API did not answer "
                    "in time, or this process was not running)"
                )
            try:
                renewed = await asyncio.wait_for(self._try(bound=self._left()), self._left())
            except (ApiError, TimeoutError) as exc:
                log.warning("leader election: renewal failed (%s); retrying", exc or "timeout")
                continue
            if not renewed and self.holder and self.holder != self.identity:
                self._lost(f"{self.holder} holds the Lease now")

    async def release(self) -> None:
        """On a clean stop: stop leading first (the fence closes), then clear the holder so a
        follower takes over on its next read."""
        if not self.is_leader() or self._observation is None:
            return
        self._renewed_at = None
        self._on_change(False)
        observed = self._observation
        record = released(observed.record, wall_now=self._wall())
        try:
            await self._kube.replace_lease(
                self.name,
                self._body(spec_of(record), observed.resource_version),
                namespace=self.namespace,
                request_timeout=RELEASE_TIMEOUT_SECONDS,
                fenced=False,
            )
            log.info("leader election: released Lease %s/%s", self.namespace, self.name)
        except ApiError as exc:  # it expires by itself: a follower waits one lease duration
            log.warning("leader election: could not release the Lease: %s", exc)

    # ------------------------------------------------------------------ one round

    def _left(self) -> float:
        """Seconds until the renew deadline (a small floor so a call can still be made)."""
        if self._renewed_at is None:
            return 0.0
        deadline = self._renewed_at + self._timing.renew_deadline
        return max(deadline - self._clock(), 0.001)

    def _lost(self, why: str) -> NoReturn:
        self._renewed_at = None
        self._on_change(False)
        log.error("leader election: %s lost the lease: %s", self.identity, why)
        raise LeadershipLost(f"lost the leader Lease {self.namespace}/{self.name}: {why}")

    async def _try(self, *, bound: float) -> bool:
        """Read, decide, write once; whether this replica holds the Lease afterwards."""
        started = self._clock()
        lease = await self._kube.get_lease(
            self.name, namespace=self.namespace, request_timeout=bound
        )
        if lease is None:
            self._observation = None
        else:
            self._observation = observe(
                self._observation,
                record_of(lease.get("spec") or {}),
                str(lease["metadata"]["resourceVersion"]),
                now=self._clock(),
            )
        step = decide(self._observation, identity=self.identity, now=self._clock())
        if step is Step.WAIT:
            return False
        current = self._observation
        record = next_record(
            current.record if current else None,
            step,
            identity=self.identity,
            duration_seconds=int(self._timing.lease_duration),
            wall_now=self._wall(),
        )
        body = self._body(spec_of(record), current.resource_version if current else None)
        try:
            if current is None:
                written = await self._kube.create_lease(
                    body, namespace=self.namespace, request_timeout=bound, fenced=False
                )
            else:
                written = await self._kube.replace_lease(
                    self.name, body, namespace=self.namespace, request_timeout=bound, fenced=False
                )
        except ConflictError:
            return False  # another replica wrote first; read again next period
        self._observation = Observation(
            record=record, resource_version=str(written["metadata"]["resourceVersion"]), at=started
        )
        self._renewed_at = started
        return True

    def _body(self, spec: JSON, resource_version: str | None) -> JSON:
        metadata: JSON = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
