"""The node's capacity and placement's room against a simulated provider, in any order.

A hypothesis state machine drives binds, creates (answered, refused, or with the answer
lost), terminations, other tenants taking and freeing room, the offer cache's ask and answer
(separately: things happen in between), and agent restarts. After every step:

- the node's allocatable (``node_capacity`` of the last answer plus ``Room.reflected``)
  equals what the provider can give us now — its free room plus what our instances hold —
  whenever nothing outside the agent changed since that answer was asked for (lost create
  answers included); otherwise it is off by what other tenants took or freed since;
- a create the agent starts never finds the provider full unless another tenant took room
  since the answer (no stampede: creates under way count against their offer).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vk_provider.domain.models import Offer
from vk_provider.domain.node import NodeCaps, node_capacity
from vk_provider.domain.room import Room
from vk_provider.domain.workload import Held

CAPS = NodeCaps(max_gpus=10_000, max_cpu=10_000, max_memory_gib=10_000, max_pods=10_000)
KEY = "cloud/a100/eu"
ONE = Held(gpus=1.0, cpu=4.0, memory_gib=16.0)


def offer(available: int) -> Offer:
    return Offer("cloud", "a100", "eu", "A100", 1, 80, 4, 16, 1.2, available=available)


@dataclass
class Pod:
    uid: str
    state: str  # "pending", "creating", "placed"
    request: str = ""
    takes_seen: int = 0  # other tenants' takes before the ask of the answer it was placed on


class Capacity(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.total = 6  # slots of the provider
        self.others = 0  # slots other tenants use
        self.ours = 0  # slots our instances use
        self.room = Room()
        self.pods: dict[str, Pod] = {}
        self.made = 0
        self.cache: int | None = None  # the free room of the last answer
        self.asked: int | None = None  # what the provider said when asked (answer on its way)
        # Since the ask of the answer in the cache: what other tenants took and freed, and
        # whether a create's answer was lost.
        self.took = self.freed = 0
        self.took_pending = self.freed_pending = 0
        self.lost = self.lost_pending = False
        self.stampede = False
        self.takes = 0  # every slot another tenant ever took
        self.takes_at_ask = self.takes_at_cache = 0

    # ------------------------------------------------------------ the world

    def free(self) -> int:
        return self.total - self.others - self.ours

    def placed(self) -> dict[str, Held]:
        return {p.uid: ONE for p in self.pods.values() if p.state == "placed"}

    def _by(self, state: str) -> list[Pod]:
        return [p for p in self.pods.values() if p.state == state]

    @rule()
    def bind(self) -> None:
        self.made += 1
        uid = f"pod-{self.made}"
        self.pods[uid] = Pod(uid, "pending")

    @precondition(lambda self: self.cache is not None)
    @rule(data=st.data())
    def start_create(self, data: st.DataObject) -> None:
        pending = self._by("pending")
        if not pending:
            return
        pod = data.draw(st.sampled_from(pending))
        assert self.cache is not None
        if self.cache - self.room.taken().get(KEY, 0) <= 0:
            return  # placement sees no room: the pod waits
        self.made += 1
        pod.request, pod.state = f"{pod.uid}.{self.made}", "creating"
        pod.takes_seen = self.takes_at_cache
        self.room.claim(pod.request, uid=pod.uid, offer_key=KEY)

    @rule(data=st.data(), outcome=st.sampled_from(["made", "refused", "lost"]))
    def create_answers(self, data: st.DataObject, outcome: str) -> None:
        creating = self._by("creating")
        if not creating:
            return
        pod = data.draw(st.sampled_from(creating))
        if self.free() <= 0:
            # The provider is full: only another tenant since the answer the pod was placed on
            # was asked for can explain it.
            self.stampede |= self.takes == pod.takes_seen
            self.room.settled(pod.request, made=False)
            pod.state = "pending"
            return
        if outcome == "refused":  # e.g. a 4xx for this pod: nothing made
            self.room.settled(pod.request, made=False)
            pod.state = "pending"
        elif outcome == "lost":  # no answer: nothing was made, but the agent cannot know
            self.room.settled(pod.request, made=True)
            self.lost = self.lost_pending = True
            pod.state = "pending"
        else:
            self.ours += 1
            self.room.settled(pod.request, made=True)
            pod.state = "placed"

    @rule(data=st.data())
    def terminate(self, data: st.DataObject) -> None:
        placed = self._by("placed")
        if not placed:
            return
        pod = data.draw(st.sampled_from(placed))
        self.ours -= 1
        del self.pods[pod.uid]

    @rule()
    def another_tenant_takes(self) -> None:
        if self.free() > 0:
            self.others += 1
            self.takes += 1
            self.took += 1
            self.took_pending += 1

    @rule()
    def another_tenant_frees(self) -> None:
        if self.others > 0:
            self.others -= 1
            self.freed += 1
            self.freed_pending += 1

    @precondition(lambda self: self.asked is None)
    @rule()
    def ask(self) -> None:
        self.room.asking(self.placed())
        self.asked = self.free()  # the provider's answer describes this moment
        self.takes_at_ask = self.takes
        self.took_pending = self.freed_pending = 0
        self.lost_pending = False

    @precondition(lambda self: self.asked is not None)
    @rule()
    def answer(self) -> None:
        self.room.answered()
        self.cache, self.asked = self.asked, None
        self.takes_at_cache = self.takes_at_ask
        self.took, self.freed, self.lost = self.took_pending, self.freed_pending, self.lost_pending

    @precondition(lambda self: self.asked is None)
    @rule()
    def restart(self) -> None:
        """A new agent: no memory of its creates; it lists the pods, then asks and waits for
        the answer before its first status (an unanswered create's pod was never placed)."""
        self.room = Room()
        for pod in self._by("creating"):
            pod.state = "pending"  # the old process's create died with it: nothing made
        self.ask()
        self.answer()

    # ------------------------------------------------------------ what must hold

    @invariant()
    def allocatable_is_what_the_provider_can_give_us(self) -> None:
        if self.cache is None:
            return
        held = self.room.reflected(self.placed())
        allocatable = node_capacity(
            [offer(self.cache)], CAPS, (held.gpus, held.cpu, held.memory_gib)
        )
        truth = self.free() + self.ours
        if not (self.took or self.freed):
            assert allocatable.gpus == truth
        # Never more than is there, except what other tenants took since the answer.
        assert allocatable.gpus <= truth + self.took
        # The scheduler's free room (allocatable minus every bound pod's request) never
        # exceeds the provider's, except what other tenants took since the answer.
        assert allocatable.gpus - len(self.pods) <= self.free() + self.took

    @invariant()
    def no_create_finds_the_provider_full_unless_someone_else_took_it(self) -> None:
        assert not self.stampede


Capacity.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_node_capacity_and_placement_room_stay_true_in_any_order = Capacity.TestCase
