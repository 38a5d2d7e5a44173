"""The budget caps against the production controllers under faults, on simulated time.

Hypothesis draws a schedule for pods in two namespaces: creates, deletions, create answers
lost after the provider made the instance (or before it made it), deletes the provider
accepts but keeps the instance TERMINATING a while, and restarts of the agent (a new
``Core`` on the same API server and provider). A sampler looks at the *provider side*
every half second of loop time: the $/h of every instance it still has (starting, running,
exited or terminating) must never pass a cap, globally and per namespace. When the schedule
is over and the provider is listed, the ledger must hold exactly what the provider bills.

Before the ledger counted instances (it counted pods, released a hold on a lost answer and
when a pod was deleted, and adoption skipped the caps), this failed: the provider ran
$3-$6/h under a $2/h namespace cap after a lost answer was adopted, and a deleted pod's
TERMINATING instance freed its room at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import looptime
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider.domain.budget import BudgetCaps
from vk_provider.domain.errors import Transient
from vk_provider.domain.models import Instance, InstanceState, Offer, WorkloadSpec
from vk_provider_adapters.memory.adapter import MemoryProvider

CAPS = BudgetCaps(global_per_hour=4.0, per_namespace={"ml": 3.0}, default_namespace_per_hour=2.0)
PRICE = 1.0
INTERVALS = {"orphan_grace_seconds": 5}
NAMESPACES = ("ml", "web")


class LossyProvider(MemoryProvider):
    """A memory provider whose next create answers can be lost: after it made the instance
    (``made``) or before (``unmade``: the request never reached it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[bool] = []  # True: made, then the answer is lost

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        if self.losses:
            made = self.losses.pop(0)
            if made:
                await super().create(spec, offer)
            raise Transient("timed out waiting for the answer", provider=self.name)
        return await super().create(spec, offer)


@dataclass(frozen=True)
class Action:
    at: float  # seconds after the previous action
    kind: str
    pod: int
    namespace: str


ACTIONS = st.lists(
    st.builds(
        Action,
        at=st.sampled_from((0.0, 0.5, 2.0, 7.0)),
        kind=st.sampled_from(
            (
                *("create",) * 4,
                *("delete",) * 2,
                *("lose-made",) * 2,
                "lose-unmade",
                "slow-deletes",
                "restart",
            )
        ),
        pod=st.integers(0, 7),
        namespace=st.sampled_from(NAMESPACES),
    ),
    min_size=8,
    max_size=30,
)


def lossy_provider() -> LossyProvider:
    base = memory_provider("mem", gpu_offer(price=PRICE, capacity=100))
    return LossyProvider(base._config, clock=base._clock, wall_clock=base._wall)


async def scenario(actions: list[Action]) -> list[str]:
    provider = lossy_provider()
    core = Core(provider, budget=CAPS, intervals=INTERVALS)
    namespace_of: dict[str, str] = {}  # pod UID -> namespace
    violations: list[str] = []

    def billed() -> dict[str, float]:
        totals = dict.fromkeys(("", *NAMESPACES), 0.0)
        for instance in provider.instances():
            if instance.state is not InstanceState.TERMINATED:
                ns = namespace_of.get(instance.pod_uid, "")
                totals[ns] += instance.price_per_hour
        return totals

    def check(when: str) -> None:
        totals = billed()
        everything = sum(totals.values())
        assert CAPS.global_per_hour is not None
        if everything > CAPS.global_per_hour + 1e-9:
            violations.append(f"{when}: ${everything}/h alive > global cap")
        for ns in NAMESPACES:
            cap = CAPS.namespace_cap(ns)
            if cap is not None and totals[ns] > cap + 1e-9:
                violations.append(f"{when}: ${totals[ns]}/h alive in {ns} > its cap {cap}")

    async def sample(stop: asyncio.Event) -> None:
        while not stop.is_set():
            check(f"t={asyncio.get_running_loop().time():.1f}")
            await asyncio.sleep(0.5)

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample(stop))
    names: dict[int, str] = {}
    running = core.running()
    await running.__aenter__()
    try:
        for action in actions:
            await asyncio.sleep(action.at)
            if action.kind == "restart":  # a new agent on the same API server and provider
                await running.__aexit__(None, None, None)
                core = Core(provider, budget=CAPS, kube=core.kube, intervals=INTERVALS)
                running = core.running()
                await running.__aenter__()
            else:
                await act(core, provider, action, names, namespace_of)
        await asyncio.sleep(60)  # the deletions finish, the listings settle
        await core.pods.tracker.poll()
        held = core.ledger.total_per_hour()
        alive = sum(billed().values())
        if abs(held - alive) > 1e-9:
            violations.append(f"at rest the ledger holds ${held}/h, the provider bills ${alive}")
    finally:
        await running.__aexit__(None, None, None)
        stop.set()
        await sampler
    return violations


async def act(
    core: Core,
    provider: LossyProvider,
    action: Action,
    names: dict[int, str],
    namespace_of: dict[str, str],
) -> None:
    name = f"p{action.pod}"
    if action.kind in ("create", "lose-made", "lose-unmade"):
        if action.kind != "create":
            provider.losses.append(action.kind == "lose-made")
        if action.pod in names:
            return
        created = await core.kube.create_pod(pod_manifest(name), namespace=action.namespace)
        namespace_of[created["metadata"]["uid"]] = action.namespace
        names[action.pod] = action.namespace
    elif action.kind == "delete" and action.pod in names:
        await core.kube.request_deletion(names.pop(action.pod), name, grace=5)
    elif action.kind == "slow-deletes":
        provider.terminate_seconds = 10.0  # accepted, but the instance lingers TERMINATING


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(ACTIONS)
@example(  # a lost answer adopted, then deletions the provider is slow to finish
    [Action(0, "create", i, "web") for i in range(4)]
    + [
        Action(0, "lose-made", 4, "web"),
        Action(0.5, "create", 5, "web"),
        Action(2, "delete", 0, "web"),
        Action(0, "slow-deletes", 0, "web"),
        Action(0.5, "create", 6, "web"),
        Action(2, "delete", 1, "web"),
        Action(0.5, "create", 7, "web"),
    ]
)
def test_no_schedule_of_faults_lets_the_provider_bill_past_a_cap(actions: list[Action]) -> None:
    loop = looptime.new_event_loop(start=0)
    try:
        violations = loop.run_until_complete(scenario(actions))
    finally:
        loop.close()
    assert not violations, violations[:3]
