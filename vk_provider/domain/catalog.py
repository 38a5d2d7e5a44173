"""Offers as a GPU catalogue: what ``vk-provider offers`` shows, the way GPU shoppers compare.

Tools people already compare GPU prices with (SkyPilot's ``sky gpus list``, dstack's offer
table) group by GPU model, price per GPU so that a 1x and an 8x instance compare, and put an
instance type's on-demand and spot prices side by side. ``catalog()`` does that with our
offers: one row per instance type in a region (an offer key: the spot and the on-demand offer
of one ``provider/sku/region`` share a row), grouped by GPU model, rows and groups cheapest
per GPU first, at most ``limit`` rows per group with the counts of what was left out.

Ordering: a row's price is its per-GPU on-demand price, or its spot price when it has no
on-demand one, or the spot price first when ``spot_first`` (``--spot``); ties go to fewer
GPUs, then provider, sku and region, so the order is total and stable. Groups follow their
cheapest row; CPU-only offers (no GPU model) come last, priced per instance.

Invariants: pure; every input offer is in exactly one row (the cheapest offer wins when two
have the same key and capacity type).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vk_provider.domain.models import Offer


@dataclass(frozen=True, slots=True)
class CatalogRow:
    """One instance type in one region of one provider, on-demand and spot side by side."""

    on_demand: Offer | None
    spot: Offer | None

    @property
    def offer(self) -> Offer:
        """The offer that describes the instance (both share provider, sku, region, specs)."""
        found = self.on_demand or self.spot
        assert found is not None
        return found

    @property
    def key(self) -> str:
        return self.offer.key

    @property
    def gpu_model(self) -> str | None:
        return self.offer.gpu_model

    @property
    def gpu_count(self) -> int:
        return self.offer.gpu_count

    def per_gpu(self, offer: Offer | None) -> float | None:
        """``offer``'s price per GPU per hour (the whole price when it has no GPU)."""
        if offer is None:
            return None
        return offer.price_per_hour / offer.gpu_count if offer.gpu_count else offer.price_per_hour

    def sort_price(self, *, spot_first: bool) -> float:
        first, second = (self.spot, self.on_demand) if spot_first else (self.on_demand, self.spot)
        price = self.per_gpu(first or second)
        assert price is not None
        return price


@dataclass(frozen=True, slots=True)
class CatalogGroup:
    gpu_model: str | None  # None: CPU-only offers
    rows: tuple[CatalogRow, ...]  # the rows shown, cheapest per GPU first
    total: int  # rows of this model before the limit

    @property
    def cheapest(self) -> CatalogRow:
        return self.rows[0]


@dataclass(frozen=True, slots=True)
class Catalog:
    groups: tuple[CatalogGroup, ...]
    total: int  # rows in all, before the limit
    limit: int | None  # rows shown per GPU model at most (None: all)

    @property
    def shown(self) -> int:
        return sum(len(g.rows) for g in self.groups)


def catalog(
    offers: Iterable[Offer], *, limit: int | None = None, spot_first: bool = False
) -> Catalog:
    """Group ``offers`` into a catalogue (see the module docstring); ``limit`` >= 1 or None."""
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1 (None shows every row)")
    cheapest: dict[tuple[str, bool], Offer] = {}
    for offer in offers:
        slot = (offer.key, offer.spot)
        kept = cheapest.get(slot)
        if kept is None or offer.price_per_hour < kept.price_per_hour:
            cheapest[slot] = offer
    keys = sorted({key for key, _ in cheapest})
    rows = [
        CatalogRow(on_demand=cheapest.get((k, False)), spot=cheapest.get((k, True))) for k in keys
    ]

    def row_order(row: CatalogRow) -> tuple[float, int, str, str, str]:
        o = row.offer
        return (row.sort_price(spot_first=spot_first), o.gpu_count, o.provider, o.sku, o.region)

    by_model: dict[str | None, list[CatalogRow]] = {}
    for row in sorted(rows, key=row_order):
        by_model.setdefault(row.gpu_model, []).append(row)
    groups = [
        CatalogGroup(model, tuple(found[:limit] if limit else found), len(found))
        for model, found in by_model.items()
    ]
    # GPU models by their cheapest row (then by name); CPU-only last.
    groups.sort(
        key=lambda g: (
            g.gpu_model is None,
            row_order(g.cheapest)[0],
            (g.gpu_model or "").upper(),
        )
    )
    return Catalog(tuple(groups), total=len(rows), limit=limit)
