"""The placement dry run (``controllers.preview``) on the production controllers.

Each test builds the agent's controllers (``controller_harness.Core``) on a fake API and
in-memory providers on simulated time, asks the dry run about a pod, then — where it says the
pod fits — creates the pod and checks that the agent chose exactly the offer the dry run
named. The dry run itself must have no effects: no create call, no budget held, no Event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.unit.controller_harness import Core, gpu_offer, memory_provider, pod_manifest
from vk_provider.controllers.preview import PLACEHOLDER_UID, Outcome, Preview, RankedOffer
from vk_provider.domain import explain
from vk_provider.domain.budget import BudgetCaps, BudgetView
from vk_provider.domain.errors import Transient
from vk_provider.domain.models import Offer
from vk_provider.domain.placement import (
    FILTERS,
    CapacityType,
    Penalties,
    PlacementRequest,
    PodShape,
)
from vk_provider.domain.podview import ANN_OFFER

pytestmark = [pytest.mark.looptime, pytest.mark.usefixtures("no_leftover_tasks")]


@pytest.fixture
async def no_leftover_tasks() -> AsyncIterator[None]:
    yield
    current = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    assert not left, f"tasks left running: {[t.get_name() for t in left]}"


def three_clouds() -> Core:
    return Core(
        memory_provider(
            "alpha",
            gpu_offer("a100", price=1.5),
            gpu_offer("h100", price=2.5, gpu_model="H100-SXM", startup_seconds=120),
            gpu_offer("h100x8", price=19.0, gpu_model="H100-SXM", gpu_count=8, vcpus=128),
        ),
        memory_provider("beta", gpu_offer("h100-pcie", price=2.49, gpu_model="H100-PCIE")),
        memory_provider(
            "gamma",
            gpu_offer("l40s", price=0.99, gpu_model="L40S", gpu_memory_gib=48),
            gpu_offer("cpu", price=0.1, gpu_model=None, gpu_count=0, gpu_memory_gib=0),
        ),
    )


def with_annotations(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod["metadata"]["annotations"] = {f"vk-provider.io/{k}": v for k, v in annotations.items()}
    return pod


def creates(core: Core) -> int:
    return sum(p.calls.get("create", 0) for p in core.memory.values())


async def test_the_dry_run_names_the_offer_the_agent_then_chooses() -> None:
    core = three_clouds()
    pod = with_annotations(pod_manifest("infer"), gpu="H100,A100-80GB")
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.PLACED
    assert preview.chosen is not None
    assert preview.chosen.key == "alpha/a100/local"
    # Ranked in the order a launch walks them; what was refused, and why, per offer.
    assert [r.offer.key for r in preview.ranked] == [
        "alpha/a100/local",
        "beta/h100-pcie/local",
        "alpha/h100/local",
        "alpha/h100x8/local",  # 8 GPUs fit a pod that needs one; the price ranks it last
    ]
    assert preview.ranked[2].penalties.startup == pytest.approx(0.02)
    assert preview.ranked[2].score == pytest.approx(2.5 * 1.02)
    refused = {r.offer.key: r.filter for r in preview.refused}
    assert refused == {"gamma/cpu/local": "gpu-count", "gamma/l40s/local": "gpu-model"}
    assert preview.message.startswith("placed on alpha offer a100")
    assert "lowest price after penalties" in preview.why
    assert preview.tries_at_most == 5
    assert creates(core) == 0 and core.ledger.total_per_hour() == 0
    assert core.kube.reasons("infer") == []

    async with core.running():
        await core.kube.create_pod(pod)
        await core.until(lambda: core.phase("infer") == "Running", what="Running")
    assert core.annotation("infer", ANN_OFFER) == preview.chosen.key


async def test_each_refused_offer_names_its_filter_and_why() -> None:
    core = three_clouds()
    pod = with_annotations(pod_manifest("picky", gpus=1), gpu="B200")
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.NO_CAPACITY
    assert preview.chosen is None and preview.ranked == ()
    by_key = {r.offer.key: r for r in preview.refused}
    assert by_key["gamma/cpu/local"].filter == "gpu-count"
    assert by_key["gamma/cpu/local"].reason == ("has 0 GPU(s); the pod needs 1")
    assert by_key["alpha/a100/local"].filter == "gpu-model"
    assert by_key["alpha/a100/local"].reason == (
        "A100-80GB is not one of vk-provider.io/gpu (B200)"
    )
    assert len(preview.refused) == preview.offers_seen == 6
    assert dict(preview.removed)["gpu-model"] == 5
    # In the order of the filters, then cheapest first.
    order = [FILTERS.index(r.filter) for r in preview.refused]
    assert order == sorted(order)
    assert preview.message.startswith("no offer fits 1 GPU (B200): offers removed")
    assert "retrying" not in preview.message


async def test_a_pod_over_its_budget_is_budget_exceeded_without_holding_any() -> None:
    core = Core(
        memory_provider("alpha", gpu_offer("a100", price=1.5)),
        budget=BudgetCaps(per_namespace={"ns": 1.0}),
    )
    pod = pod_manifest("dear")
    pod["metadata"]["namespace"] = "ns"
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.BUDGET_EXCEEDED
    assert preview.refused[0].filter == "budget"
    assert preview.refused[0].reason == (
        "$1.5000/h would exceed a budget cap ($1.0000/h left in the namespace)"
    )
    assert core.ledger.total_per_hour() == 0


async def test_an_open_breaker_and_blocked_offers_are_refused_as_the_launcher_would() -> None:
    alpha = memory_provider("alpha", gpu_offer("a100", price=1.0))
    beta = memory_provider("beta", gpu_offer("a100", price=2.0))
    gamma = memory_provider("gamma", gpu_offer("a100", price=3.0))
    core = Core(alpha, beta, gamma, guarded=True, breaker_health=True)
    await core.offers.refresh()  # alpha answered; then its breaker opens
    breaker = core.guarded["alpha"].breaker
    for _ in range(5):
        breaker.record_failure(Transient("down"))
    core.launcher.avoid("beta/a100/local", 300)  # an instance was lost there lately
    preview = await core.preview.preview(pod_manifest("p"))
    assert preview.chosen is not None and preview.chosen.key == "gamma/a100/local"
    by_key = {r.offer.key: r.filter for r in preview.refused}
    assert by_key == {"alpha/a100/local": "provider-health", "beta/a100/local": "blocked"}


async def test_secrets_are_not_needed_and_no_environment_comes_back() -> None:
    core = three_clouds()
    pod = pod_manifest("secretive")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "token"}}},
        {"name": "PLAIN", "value": "literal-value-4f2a"},
    ]
    pod["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "also-absent"}}]
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.PLACED
    assert "literal-value-4f2a" not in repr(preview)
    assert core.kube.calls.get("get_secret", 0) == 0
    # The manifest itself is left as it was.
    assert pod["spec"]["containers"][0]["env"][1]["value"] == "literal-value-4f2a"


async def test_a_manifest_without_identity_gets_placeholders() -> None:
    core = three_clouds()
    pod = pod_manifest("x")
    pod["metadata"] = {"generateName": "web-"}
    preview = await core.preview.preview(pod)
    assert (preview.namespace, preview.name) == ("default", "web-")
    assert preview.outcome is Outcome.PLACED
    assert PLACEHOLDER_UID not in preview.message


async def test_an_invalid_pod_names_the_field() -> None:
    core = three_clouds()
    pod = pod_manifest("bad")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.INVALID
    assert preview.invalid_field == "spec.containers[0].resources.limits['nvidia.com/gpu']"
    assert "whole number" in preview.message
    assert preview.request is None


async def test_a_shape_no_provider_can_run_is_invalid() -> None:
    core = three_clouds()  # single-container providers only
    pod = pod_manifest("two")
    pod["spec"]["containers"].append({"name": "side", "image": "x"})
    preview = await core.preview.preview(pod)
    assert preview.outcome is Outcome.INVALID
    assert preview.invalid_field == "spec.containers[1]"
    assert "cannot" in preview.message


def test_every_filter_has_its_own_refusal_wording() -> None:
    offer = Offer("p", "s", "r", "A100", 1, 40, 2, 8, 3.0, spot=True, available=0)
    request = PlacementRequest(
        gpu_count=2,
        gpu_models=("H100",),
        min_gpu_memory_gib=80,
        cpu=4,
        memory_gib=16,
        regions=("eu",),
        max_price_per_hour=1.0,
        capacity_type=CapacityType.ON_DEMAND,
        providers=("q",),
        shape=PodShape(app_containers=2, field="spec.containers[1]"),
    )
    budget = BudgetView(global_room=0.5, namespace_room=None)
    texts = {name: explain.refusal(name, request, offer, budget=budget) for name in FILTERS}
    assert all(text != name for name, text in texts.items())
    assert len(set(texts.values())) == len(FILTERS)
    assert texts["capacity-type"] == "spot; vk-provider.io/capacity-type is on-demand (the default)"
    assert texts["price"] == "$3.0000/h is more than vk-provider.io/max-price $1.0000/h"
    assert texts["budget"] == "$3.0000/h would exceed a budget cap ($0.5000/h left in all)"


def test_chosen_is_only_set_when_placed() -> None:
    offer = Offer("p", "s", "r", None, 0, 0, 1, 1, 1.0)
    ranked = (RankedOffer(offer, 1.0, Penalties()),)
    assert Preview("ns", "n", Outcome.PLACED, "", None, ranked=ranked).chosen == offer
    assert Preview("ns", "n", Outcome.NO_CAPACITY, "", None, ranked=ranked).chosen is None
