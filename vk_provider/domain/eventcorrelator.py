"""What to do with an Event before it is written: client-go's ``EventCorrelator``, pure.

Three rules, in client-go's order and with its defaults (``k8s.io/client-go/tools/record``):

1. **Spam filter** — per involved object, a token bucket of ``burst`` (25) Events refilled at
   ``qps`` (one per five minutes): an object that keeps producing Events past that has the
   excess dropped, so a crash-looping pod cannot flood the API server.
2. **Aggregation** — Events of one object with the same type and reason but different
   messages: from the ``max_similar``-th (10th) distinct message seen within ``window`` (ten
   minutes) on, they become one Event "(combined from similar events): <message>".
3. **Deduplication** — the same (object, type, reason, message) again within ``window``
   bumps the existing Event's ``count`` (a PATCH) instead of creating another.

``EventCorrelator.correlate`` returns a ``Verdict``: ``DROP``, ``CREATE`` (with the message to
write) or ``BUMP`` (the name of the Event to patch and its new count); the recorder performs
it and reports back ``created`` / ``failed``. Memory is bounded: at most ``max_keys`` keys are
remembered (the oldest half is forgotten when full), and ``forget(uid)`` drops an object's.

Invariants: no I/O; time comes in as an argument (monotonic seconds); a dropped Event costs
no API call; the spam filter counts every Event, deduplicated ones included, as client-go's.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from vk_provider.domain.tokenbucket import TokenBucket

COMBINED = "(combined from similar events): "


class Action(enum.Enum):
    DROP = "drop"
    CREATE = "create"
    BUMP = "bump"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    message: str = ""
    key: tuple[str, str, str, str] = ("", "", "", "")  # what ``created`` is told about
    name: str = ""  # BUMP: the Event to patch
    count: int = 0  # BUMP: its new count


@dataclass(slots=True)
class _Seen:
    name: str
    count: int
    at: float


@dataclass(slots=True)
class EventCorrelator:
    burst: int = 25
    qps: float = 1.0 / 300.0
    max_similar: int = 10
    window: float = 600.0
    max_keys: int = 4096
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _similar: dict[tuple[str, str, str], tuple[float, set[str]]] = field(default_factory=dict)
    _seen: dict[tuple[str, str, str, str], _Seen] = field(default_factory=dict)

    def correlate(self, uid: str, kind: str, reason: str, message: str, now: float) -> Verdict:
        if not self._allowed(uid, now):
            return Verdict(Action.DROP)
        message = self._aggregate(uid, kind, reason, message, now)
        # A combined Event is one Event, whatever its latest message says.
        dedup = message if not message.startswith(COMBINED) else COMBINED
        key = (uid, kind, reason, dedup)
        seen = self._seen.get(key)
        if seen is not None and now - seen.at < self.window and seen.name:
            return Verdict(Action.BUMP, message, key, seen.name, seen.count + 1)
        return Verdict(Action.CREATE, message, key)

    def created(self, verdict: Verdict, name: str, now: float) -> None:
        """The Event of ``verdict`` was written as ``name`` (CREATE) or patched (BUMP)."""
        count = verdict.count if verdict.action is Action.BUMP else 1
        self._trim(self._seen)
        self._seen[verdict.key] = _Seen(name, count, now)

    def failed(self, verdict: Verdict) -> None:
        """Writing it failed (the Event may be gone): create afresh next time."""
        self._seen.pop(verdict.key, None)

    def forget(self, uid: str) -> None:
        self._buckets.pop(uid, None)
        for key in [k for k in self._similar if k[0] == uid]:
            del self._similar[key]
        for seen in [k for k in self._seen if k[0] == uid]:
            del self._seen[seen]

    def _allowed(self, uid: str, now: float) -> bool:
        bucket = self._buckets.get(uid)
        if bucket is None:
            self._trim(self._buckets)
            bucket = self._buckets[uid] = TokenBucket(self.qps, self.burst)
        return bucket.try_take(now)

    def _aggregate(self, uid: str, kind: str, reason: str, message: str, now: float) -> str:
        key = (uid, kind, reason)
        since, messages = self._similar.get(key, (now, set()))
        if now - since >= self.window:
            since, messages = now, set()
        messages.add(message)
        self._trim(self._similar)
        self._similar[key] = (since, messages)
        return COMBINED + message if len(messages) >= self.max_similar else message

    def _trim(self, table: dict[Any, Any]) -> None:
        if len(table) >= self.max_keys:
            for key in list(table)[: len(table) // 2]:  # the oldest half (insertion order)
                del table[key]
