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
