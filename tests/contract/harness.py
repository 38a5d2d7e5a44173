"""What each adapter provides so the shared contract suite can run against it.

An adapter's harness (``tests/contract/harness_<provider>.py``, exporting ``HARNESS``) wires
the adapter to a stateful fake of that provider's backend — respx routes shaped by the
provider's published API document, a fake of our own SDK interface, or real processes — and
exposes a few knobs the suite turns. The suite (``test_contract.py``) then checks the same
promises of every adapter: idempotent create, get of an unknown instance is ``NotFound``,
delete of a missing instance succeeds, list returns only ours, every documented state maps,
each error lands in the right class.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from vk_provider.domain.contract import Provider
from vk_provider.domain.models import InstanceState, Offer, WorkloadSpec

FailureKind = Literal["capacity", "rate_limit", "transient", "auth", "invalid"]


class ContractHarness(Protocol):
    name: str

    # Every state the provider documents, in its own spelling, and what it must map to.
    native_states: Mapping[str, InstanceState]
    # The failures this provider can produce at all (a local process cannot fail auth).
    failure_kinds: frozenset[FailureKind]

    def running(self) -> AbstractAsyncContextManager[Provider]:
        """An adapter wired to a fresh fake backend; cleaned up on exit."""
        ...

    def spec(self, pod_uid: str, attempt: int = 0) -> WorkloadSpec:
        """A workload this adapter can launch (image, command, GPU as its offers allow)."""
        ...

    async def offer(self, provider: Provider) -> Offer:
        """An offer the adapter will accept for ``spec``."""
        ...

    def unknown_instance_id(self) -> str:
        """An instance id of the form this adapter gives its instances that was never created:
        the backend has no record of it, so the adapter must ask and be told "no such thing"
        (not refuse the id as malformed before asking). Use inside ``running()``."""
        ...

    def add_foreign_instance(self) -> None:
        """Put an instance in the account that this agent did not make."""
        ...

    def set_native_state(self, instance_id: str, native: str) -> None:
        """Make the backend report ``native`` (a key of ``native_states``) for the instance."""
        ...

    def fail_next(self, kind: FailureKind, *, operation: Literal["create", "get"]) -> None:
        """Make the next such call fail with the provider's real error shape for ``kind``.

        "The call" is what the adapter's caller sees: if the adapter retries (429, 5xx), the
        backend keeps failing until the adapter gives up.
        """
        ...
