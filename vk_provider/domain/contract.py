"""The provider contract: the one interface an adapter implements.

Assumptions the agent makes of every provider, and an adapter must uphold:

- **Idempotent create.** ``create(spec, offer)`` with a ``spec.request_id`` that already made
  an instance returns that instance instead of making a second one (look it up by the tag or
  name that carries the pod UID and attempt, or use the provider's own idempotency key).
- **Eventually consistent reads.** ``get`` and ``list_ours`` may lag a create or a delete; the
  agent re-reads rather than trusting one answer.
- **Delete is a request.** ``delete(instance_id, grace_seconds=...)`` starts termination and
  returns; the instance then reports ``TERMINATING`` and finally ``TERMINATED`` or
  ``NotFound``. Deleting something that does not exist succeeds.
- **Ours only.** ``list_ours`` returns only instances this agent made (recognised by tag or
  name prefix), never the account's other machines.
- **Errors are data.** Every failure is raised as one of ``domain.errors``; nothing else
  escapes an adapter.

Adapters never see Kubernetes objects, queues or API clients: they receive the domain models
of ``vk_provider.domain.models`` and return them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from vk_provider.domain.containers import ContainerUsage
from vk_provider.domain.models import Capabilities, Instance, LogOptions, Offer, WorkloadSpec


@runtime_checkable
class Provider(Protocol):
    """A GPU cloud (or the local machine) that can run one container per instance."""

    @property
    def name(self) -> str:
        """The configured provider name (unique within one agent)."""
        ...

    @property
    def capabilities(self) -> Capabilities:
        """Optional features; read once at start-up."""
        ...

    async def offers(self) -> list[Offer]:
        """What can be launched now, with prices per hour for the whole instance."""
        ...

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        """Launch ``spec`` on ``offer``; idempotent by ``spec.request_id``."""
        ...

    async def get(self, instance_id: str) -> Instance:
        """The instance's current state; raises ``NotFound`` when it does not exist."""
        ...

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        """Start terminating; give the container ``grace_seconds`` after SIGTERM."""
        ...

    async def list_ours(self) -> list[Instance]:
        """Every live instance this agent made (one call, not one per instance)."""
        ...

    def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        """The container's output, line by line (each chunk ends with a newline)."""
        ...

    async def close(self) -> None:
        """Release connections and background resources."""
        ...


# --------------------------------------------------------------------------- optional operations
# A provider offers these when its ``Capabilities`` say so (``exec``, ``port_forward``,
# ``usage``, ``multi_container`` with agent-run probes; ``SupportsAttach`` with ``exec``);
# callers check the capability first.


class ExecSession(Protocol):
    """A command running in a container, with its standard streams (kubectl exec)."""

    async def write_stdin(self, data: bytes) -> None: ...

    async def close_stdin(self) -> None: ...

    def output(self) -> AsyncIterator[tuple[int, bytes]]:
        """``(1, chunk)`` for stdout, ``(2, chunk)`` for stderr, until the command ends."""
        ...

    async def resize(self, width: int, height: int) -> None:
        """The terminal's new size (only with a tty)."""
        ...

    async def wait(self) -> int:
        """The command's exit code (128 + N when killed by signal N)."""
        ...

    async def close(self) -> None:
        """Stop the command if it still runs and release everything."""
        ...


@runtime_checkable
class SupportsExec(Protocol):
    async def exec(
        self, instance_id: str, container: str, command: list[str], *, tty: bool
    ) -> ExecSession:
        """Start ``command`` in ``container``; raises ``NotFound`` or ``InvalidSpec``."""
        ...


@runtime_checkable
class SupportsAttach(Protocol):
    async def attach(
        self, instance_id: str, container: str, *, stdin: bool, tty: bool
    ) -> ExecSession:
        """The running ``container``'s own console (kubectl attach); a provider without this
        is attached to by following its log (``follow_logs``)."""
        ...


class PortStream(Protocol):
    """A byte stream to a port of an instance."""

    async def read(self, size: int) -> bytes:
        """Up to ``size`` bytes; ``b""`` once the other side closed."""
        ...

    async def write(self, data: bytes) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SupportsPortForward(Protocol):
    async def open_port(self, instance_id: str, port: int) -> PortStream:
        """A TCP connection to ``port`` of the instance (kubectl port-forward)."""
        ...


@runtime_checkable
class SupportsUsage(Protocol):
    async def usage(self, instance_id: str) -> list[ContainerUsage]:
        """CPU and memory of each running container of the instance now."""
        ...


@runtime_checkable
class SupportsContainerRestart(Protocol):
    async def restart_container(self, instance_id: str, container: str) -> None:
        """Kill ``container`` so the runtime restarts it per the pod's restart policy (a failed
        liveness probe); its restart count grows as a kubelet's would."""
        ...
