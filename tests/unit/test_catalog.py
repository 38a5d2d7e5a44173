"""The GPU catalogue (``domain/catalog.py``): rows per instance type, grouped by GPU model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vk_provider.domain.catalog import catalog
from vk_provider.domain.models import Offer


def offer(
    provider: str,
    sku: str,
    gpu: str | None,
    count: int,
    price: float,
    *,
    spot: bool = False,
    region: str = "r1",
) -> Offer:
    return Offer(
        provider=provider,
        sku=sku,
        region=region,
        gpu_model=gpu,
        gpu_count=count,
        gpu_memory_gib=80 if gpu else 0,
        vcpus=16 * max(count, 1),
        memory_gib=128 * max(count, 1),
        price_per_hour=price,
        spot=spot,
    )


H100X1 = offer("lambda", "1x-h100", "H100-SXM", 1, 3.29)
H100X8 = offer("lambda", "8x-h100", "H100-SXM", 8, 23.92)  # 2.99 per GPU: cheaper per GPU
H100X8_SPOT = offer("lambda", "8x-h100", "H100-SXM", 8, 12.0, spot=True)
H100_RUNPOD = offer("runpod", "h100", "H100-SXM", 1, 2.69, region="US-TX-3")
A100_SPOT = offer("runpod", "a100", "A100-80GB", 1, 0.89, spot=True)
L40S = offer("modal", "l40s", "L40S", 1, 1.95)
CPU = offer("runpod", "cpu", None, 0, 0.12)
ALL = [H100X1, H100X8, H100X8_SPOT, H100_RUNPOD, A100_SPOT, L40S, CPU]


def test_rows_merge_spot_and_on_demand_and_sort_per_gpu() -> None:
    found = catalog(ALL)
    assert [g.gpu_model for g in found.groups] == ["A100-80GB", "L40S", "H100-SXM", None]
    h100 = found.groups[2]
    assert [r.key for r in h100.rows] == [
        "runpod/h100/US-TX-3",  # 2.69 per GPU
        "lambda/8x-h100/r1",  # 2.99 per GPU, with its spot price beside it
        "lambda/1x-h100/r1",  # 3.29
    ]
    eight = h100.rows[1]
    assert eight.on_demand == H100X8 and eight.spot == H100X8_SPOT
    assert eight.per_gpu(eight.on_demand) == pytest.approx(2.99)
    assert eight.per_gpu(eight.spot) == pytest.approx(1.5)
    assert found.groups[0].rows[0].on_demand is None  # spot only
    assert found.groups[-1].rows[0].per_gpu(CPU) == 0.12  # CPU-only: the instance price
    assert (found.total, found.shown, found.limit) == (6, 6, None)


def test_spot_first_sorts_by_the_spot_price() -> None:
    found = catalog(ALL, spot_first=True)
    h100 = next(g for g in found.groups if g.gpu_model == "H100-SXM")
    assert h100.rows[0].key == "lambda/8x-h100/r1"  # 1.50 per GPU spot


def test_a_limit_keeps_the_cheapest_rows_of_each_model_and_counts_the_rest() -> None:
    found = catalog(ALL, limit=1)
    h100 = next(g for g in found.groups if g.gpu_model == "H100-SXM")
    assert [r.key for r in h100.rows] == ["runpod/h100/US-TX-3"] and h100.total == 3
    assert (found.total, found.shown, found.limit) == (6, 4, 1)
    with pytest.raises(ValueError, match="at least 1"):
        catalog(ALL, limit=0)


def test_the_cheapest_offer_of_a_key_and_kind_wins() -> None:
    dearer = offer("runpod", "h100", "H100-SXM", 1, 3.5, region="US-TX-3")
    found = catalog([dearer, H100_RUNPOD])
    assert found.groups[0].rows[0].on_demand == H100_RUNPOD


@given(st.randoms(use_true_random=False), st.integers(1, 4) | st.none())
def test_the_order_does_not_depend_on_the_input_order(
    rnd: random.Random, limit: int | None
) -> None:
    shuffled = list(ALL)
    rnd.shuffle(shuffled)
    assert catalog(shuffled, limit=limit) == catalog(ALL, limit=limit)
