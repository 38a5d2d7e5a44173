"""What the providers say runs: one ``list_ours`` call per provider per poll, not one per pod.

The tracker keeps the latest list of each provider's instances and, after each poll, calls
``on_change`` with the pod UID of every instance whose state changed (or that appeared or
vanished), so the pod controller re-syncs exactly those pods.

Each listing is also handed to ``on_listed`` with the mark ``on_listing`` gave before the
call: the budget ledger counts what the provider lists (``domain.budget``).

Invariants: a provider whose list call fails keeps its previous snapshot (a failed poll is
not evidence that instances vanished), is marked stale until a poll succeeds, and is not
handed to ``on_listed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence

from vk_provider.domain.contract import Provider
from vk_provider.domain.errors import ProviderError
from vk_provider.domain.models import Instance

log = logging.getLogger(__name__)


def _signature(instance: Instance) -> tuple[object, ...]:
    """What, when it changes, makes the pod's status worth rewriting (a whole pod's
    containers included: a restart, an init container completing; its endpoints, which
    decide its podIP)."""
    return (
        instance.state,
        instance.exit_code,
        instance.containers,
        instance.init_containers,
        instance.endpoints,
    )


class InstanceTracker:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        on_change: Callable[[str], None],
        on_poll: Callable[[float], None] = lambda _seconds: None,
        on_listing: Callable[[], int] = lambda: 0,
        on_listed: Callable[[str, Sequence[Instance], int], None] = lambda _p, _i, _m: None,
        timeout_seconds: float = 20.0,
    ) -> None:
        self._providers = dict(providers)
        self._on_change = on_change
        self._on_poll = on_poll
        self._on_listing = on_listing
        self._on_listed = on_listed
        self._timeout = timeout_seconds
        self._snapshots: dict[str, dict[str, Instance]] = {name: {} for name in providers}
        self._fresh: dict[str, bool] = {name: False for name in providers}
        self.polled = asyncio.Event()  # set once every provider was asked at least once

    def get(self, provider: str, instance_id: str) -> Instance | None:
        return self._snapshots.get(provider, {}).get(instance_id)

    def fresh(self, provider: str) -> bool:
        return self._fresh.get(provider, False)

    def all(self) -> list[Instance]:
        return [i for snapshot in self._snapshots.values() for i in snapshot.values()]

    def listed(self, provider: str) -> tuple[Instance, ...]:
        return tuple(self._snapshots.get(provider, {}).values())

    def for_pod(self, pod_uid: str) -> list[Instance]:
        return [i for i in self.all() if i.pod_uid == pod_uid]

    def remember(self, instance: Instance) -> None:
        """Record what a create/get just returned, so the next poll compares against it."""
        self._snapshots.setdefault(instance.provider, {})[instance.instance_id] = instance

    def forget(self, provider: str, instance_id: str) -> None:
        """The instance was released: until a poll lists it again, it is not known."""
        self._snapshots.get(provider, {}).pop(instance_id, None)

    async def _poll_one(self, name: str) -> None:
        mark = self._on_listing()
        try:
            listed = await asyncio.wait_for(self._providers[name].list_ours(), self._timeout)
        except (ProviderError, TimeoutError) as exc:
            self._fresh[name] = False
            log.warning("provider %s: listing instances failed: %s", name, exc)
            return
        before = self._snapshots.get(name, {})
        after = {i.instance_id: i for i in listed}
        self._snapshots[name] = after
        self._fresh[name] = True
        self._on_listed(name, listed, mark)
        changed = {
            i.pod_uid
            for key, i in after.items()
            if key not in before or _signature(before[key]) != _signature(i)
        }
        changed |= {i.pod_uid for key, i in before.items() if key not in after}
        for uid in changed:
            self._on_change(uid)

    async def poll(self) -> None:
        started = time.monotonic()
        await asyncio.gather(*(self._poll_one(name) for name in self._providers))
        self.polled.set()
        self._on_poll(time.monotonic() - started)
