"""Every call to a provider goes through here: circuit breaking and call metrics in one place.

``GuardedProvider`` wraps an adapter and implements the same ``Provider`` protocol, so the
rest of the agent cannot call an adapter around its breaker. While the breaker is open,
``create``/``get``/``list_ours``/``logs`` fail fast with ``NotSent("circuit open")`` and
``offers`` returns nothing — except for the one probe the breaker allows after its
cool-down, which is the cheap ``offers`` call. ``delete`` is always attempted: stopping a
paid instance matters more than sparing a sick provider a request.

The optional operations (``exec``, ``attach``, ``open_port``, ``usage``,
``restart_container``) go
through the same breaker and metrics when the wrapped adapter has them; when it has not,
they raise ``InvalidSpec`` naming the provider. ``capabilities`` are the adapter's, so
callers check them first, exactly as with the adapter itself. Only the *start* of an exec
session or a port stream is a guarded call; the bytes that follow are the caller's.

Invariants: an adapter exception other than ``ProviderError`` is wrapped into ``Transient``
naming the adapter, so callers only ever see the taxonomy; a failed ``create`` has the spec's
secret env values redacted from its error in every form (a second layer after the
adapter's own), before the breaker, a log line or an Event sees it; every write (create,
delete, container restart) passes the ``fence`` first — leader election's, so a replica that
does not lead never launches or stops an instance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from vk_provider.domain.breaker import BreakerState, CircuitBreaker, counts_as_failure
from vk_provider.domain.containers import ContainerUsage
from vk_provider.domain.contract import (
    ExecSession,
    PortStream,
    Provider,
    SupportsAttach,
    SupportsContainerRestart,
    SupportsExec,
    SupportsPortForward,
    SupportsUsage,
)
from vk_provider.domain.errors import InvalidSpec, NotSent, ProviderError, Transient
from vk_provider.domain.models import Capabilities, Instance, LogOptions, Offer, WorkloadSpec
from vk_provider.domain.redact import Redactor

T = TypeVar("T")
NOTHING_SECRET = Redactor(())
log = logging.getLogger(__name__)

CallObserver = Callable[[str, str, float, BaseException | None], None]
"""(provider, operation, seconds, error or None) — for metrics."""


def _ignore(_p: str, _o: str, _s: float, _e: BaseException | None) -> None:
    return None


class GuardedProvider:
    def __init__(
        self,
        inner: Provider,
        breaker: CircuitBreaker,
        *,
        observe: CallObserver = _ignore,
        fence: Callable[[str], None] = lambda operation: None,
    ) -> None:
        # Raises before any write (create, delete, container restart) when this replica may
        # not write now: leader election's fence (``controllers.leader``).
        self._fence = fence
        self._inner = inner
        self.breaker = breaker
        self._observe = observe
        self._clock = time.monotonic
        self.last_answer: float | None = None  # any call the provider answered (even "no")

    def answered_within(self, seconds: float) -> bool:
        return self.last_answer is not None and self._clock() - self.last_answer <= seconds

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def capabilities(self) -> Capabilities:
        return self._inner.capabilities

    @property
    def inner(self) -> Provider:
        return self._inner

    def _outcome(self, operation: str, started: float, error: BaseException | None) -> None:
        self._observe(self.name, operation, time.monotonic() - started, error)
        if error is None or not counts_as_failure(error):
            self.last_answer = self._clock()
        before = self.breaker.state
        if error is None:
            self.breaker.record_success()
        else:
            self.breaker.record_failure(error)
        after = self.breaker.state
        if after is not before:
            snapshot = self.breaker.snapshot()
            if after is BreakerState.OPEN:
                log.warning(
                    "circuit breaker of provider %s opened (%d failures in a row; last: %s)",
                    self.name,
                    snapshot.consecutive_failures,
                    snapshot.last_error,
                )
            else:
                log.info("circuit breaker of provider %s is %s", self.name, after.value)

    async def _call(
        self,
        operation: str,
        call: Callable[[], Awaitable[T]],
        redact: Redactor = NOTHING_SECRET,
    ) -> T:
        started = time.monotonic()
        try:
            result = await call()
        except ProviderError as exc:
            exc.provider = exc.provider or self.name
            # The second layer: whatever an adapter let through of the pod's own secrets is
            # gone before the error reaches an Event, a log line or the REST API.
            exc.args = tuple(redact(a) if isinstance(a, str) else a for a in exc.args)
            self._outcome(operation, started, exc)
            raise
        except TimeoutError as exc:
            self._outcome(operation, started, exc)
            raise Transient(f"{operation} timed out", provider=self.name) from exc
        except Exception as exc:
            self._outcome(operation, started, exc)
            raise Transient(
                redact(f"adapter {self.name} failed in {operation}: {type(exc).__name__}: {exc}"),
                provider=self.name,
            ) from exc
        self._outcome(operation, started, None)
        return result

    def _refuse_if_open(self, operation: str) -> None:
        if self.breaker.state is not BreakerState.CLOSED:
            raise NotSent(
                f"circuit open: not calling {self.name} for {operation}", provider=self.name
            )

    async def offers(self) -> list[Offer]:
        if not self.breaker.allows_calls() and not self.breaker.allow_probe():
            return []
        return await self._call("offers", self._inner.offers)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        self._fence(f"create an instance on {self.name}")
        self._refuse_if_open("create")
        secrets = Redactor(spec.secret_values)
        return await self._call("create", lambda: self._inner.create(spec, offer), secrets)

    async def get(self, instance_id: str) -> Instance:
        self._refuse_if_open("get")
        return await self._call("get", lambda: self._inner.get(instance_id))

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        self._fence(f"delete instance {instance_id} on {self.name}")
        await self._call(
            "delete", lambda: self._inner.delete(instance_id, grace_seconds=grace_seconds)
        )

    async def list_ours(self) -> list[Instance]:
        self._refuse_if_open("list")
        return await self._call("list", self._inner.list_ours)

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        self._refuse_if_open("logs")
        async for chunk in self._inner.logs(instance_id, options):
            yield chunk

    # --- optional operations ------------------------------------------------------------

    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> ExecSession:
        inner = self._inner
        if not isinstance(inner, SupportsExec):
            raise self._unsupported("exec")
        self._refuse_if_open("exec")
        return await self._call(
            "exec", lambda: inner.exec(instance_id, container, command, tty=tty)
        )

    async def attach(
        self, instance_id: str, container: str, *, stdin: bool, tty: bool
    ) -> ExecSession:
        inner = self._inner
        if not isinstance(inner, SupportsAttach):
            raise self._unsupported("attach")
        self._refuse_if_open("attach")
        return await self._call(
            "attach", lambda: inner.attach(instance_id, container, stdin=stdin, tty=tty)
        )

    async def open_port(self, instance_id: str, port: int) -> PortStream:
        inner = self._inner
        if not isinstance(inner, SupportsPortForward):
            raise self._unsupported("port-forward")
        self._refuse_if_open("port_forward")
        return await self._call("port_forward", lambda: inner.open_port(instance_id, port))

    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        inner = self._inner
        if not isinstance(inner, SupportsUsage):
            raise self._unsupported("usage")
        self._refuse_if_open("usage")
        return await self._call("usage", lambda: inner.usage(instance_id))

    async def restart_container(self, instance_id: str, container: str) -> None:
        inner = self._inner
        if not isinstance(inner, SupportsContainerRestart):
            raise self._unsupported("container restart")
        self._fence(f"restart a container of {instance_id} on {self.name}")
        self._refuse_if_open("restart_container")
        await self._call(
            "restart_container", lambda: inner.restart_container(instance_id, container)
        )

    def _unsupported(self, operation: str) -> InvalidSpec:
        return InvalidSpec(f"provider {self.name} does not support {operation}", provider=self.name)

    async def close(self) -> None:
        await self._inner.close()
