"""Offers pre-indexed for placement: every filter of ``place()`` answered as a bit mask.

``OfferIndex`` is built once per set of offers (the offer book builds one per refresh) and
then answers, for any request, "which offers pass this filter" as a Python ``int`` whose bit
``i`` stands for ``offers[i]``. Threshold filters (GPU count, GPU memory, vCPUs, memory,
price, budget) are a binary search into the distinct values, sorted once, and a mask built
for each; equality filters (provider, region, key, GPU model, spot, sold out) are a dict of
masks. So a decision costs a handful of integer ANDs and popcounts plus ranking the offers
that pass, not a pass over every offer — and counting what each filter removed (the
explanation) is the popcount of the difference.

Invariants: pure (no I/O, no clock); immutable after construction except for memo tables
keyed by arguments (the masks of one GPU-model name, the static penalties of one policy),
which never change what an answer is; a mask never has a bit at or above ``len(offers)``;
every mask answers exactly what the filter of the same name (``placement.FILTERS``) decides
for each offer (the property tests compare ``place()`` with a brute force over plain offers).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from vk_provider.domain.models import Offer

if TYPE_CHECKING:
    from vk_provider.domain.placement import PlacementPolicy


def _at_least(values: list[float]) -> tuple[list[float], list[int]]:
    """Distinct values, ascending, and for each the mask of offers whose value is >= it."""
    distinct = sorted(set(values))
    masks = [0] * (len(distinct) + 1)  # one past the end: nothing is >= a larger value
    position = {v: i for i, v in enumerate(distinct)}
    for bit, value in enumerate(values):
        masks[position[value]] |= 1 << bit
    for i in range(len(distinct) - 1, -1, -1):
        masks[i] |= masks[i + 1]
    return distinct, masks


def _at_most(values: list[float]) -> tuple[list[float], list[int]]:
    """Distinct values, ascending, and ``masks[j]``: offers whose value is among the first
    ``j`` distinct values (so ``masks[bisect_right(distinct, x)]`` is "value <= x")."""
    distinct = sorted(set(values))
    masks = [0] * (len(distinct) + 1)
    position = {v: i for i, v in enumerate(distinct)}
    for bit, value in enumerate(values):
        masks[position[value] + 1] |= 1 << bit
    for j in range(1, len(masks)):
        masks[j] |= masks[j - 1]
    return distinct, masks


def _by(values: Iterable[object]) -> dict[object, int]:
    masks: dict[object, int] = {}
    for bit, value in enumerate(values):
        masks[value] = masks.get(value, 0) | (1 << bit)
    return masks


def bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, ascending (offers in their given order)."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class OfferIndex:
    """``offers`` and the masks ``place()`` filters them with; see the module docstring."""

    def __init__(self, offers: Iterable[Offer]) -> None:
        self.offers: tuple[Offer, ...] = tuple(offers)
        o = self.offers
        self.all = (1 << len(o)) - 1
        self.providers: dict[str, int] = _by(x.provider for x in o)  # type: ignore[assignment]
        self.regions: dict[str, int] = _by(x.region for x in o)  # type: ignore[assignment]
        self.keys: dict[str, int] = _by(x.key for x in o)  # type: ignore[assignment]
        self._models: dict[str | None, int] = _by(x.gpu_model for x in o)  # type: ignore[assignment]
        spot = _by(x.spot for x in o)
        self.spot, self.on_demand = spot.get(True, 0), spot.get(False, 0)
        self.in_stock = _by(x.available > 0 for x in o).get(True, 0)
        self.no_gpu = _by(x.gpu_count == 0 for x in o).get(True, 0)
        self._gpus = _at_least([float(x.gpu_count) for x in o])
        self._gpu_memory = _at_least([x.gpu_memory_gib for x in o])
        self._vcpus = _at_least([x.vcpus for x in o])
        self._memory = _at_least([x.memory_gib for x in o])
        self._prices = _at_most([x.price_per_hour for x in o])
        self._wanted: dict[str, int] = {}  # GPU-model name -> mask (memo)
        self._static: dict[PlacementPolicy, tuple[float, ...]] = {}  # policy -> penalties

    def __len__(self) -> int:
        return len(self.offers)

    def __iter__(self) -> Iterator[Offer]:
        return iter(self.offers)

    @staticmethod
    def _threshold(table: tuple[list[float], list[int]], minimum: float) -> int:
        distinct, masks = table
        return masks[bisect_left(distinct, minimum)]

    def gpu_count_at_least(self, count: int) -> int:
        return self._threshold(self._gpus, float(count))

    def gpu_memory_at_least(self, gib: float) -> int:
        return self._threshold(self._gpu_memory, gib)

    def vcpus_at_least(self, vcpus: float) -> int:
        return self._threshold(self._vcpus, vcpus)

    def memory_at_least(self, gib: float) -> int:
        return self._threshold(self._memory, gib)

    def price_at_most(self, limit: float) -> int:
        distinct, masks = self._prices
        return masks[bisect_right(distinct, limit)]

    def gpu_models(self, wanted: Iterable[str], matches: Callable[[str, str | None], bool]) -> int:
        """Offers whose GPU model ``matches`` any of ``wanted`` (memoised per name)."""
        mask = 0
        for name in wanted:
            found = self._wanted.get(name)
            if found is None:
                found = 0
                for model, models_mask in self._models.items():
                    if matches(name, model):
                        found |= models_mask
                self._wanted[name] = found
            mask |= found
        return mask

    def union(self, table: Mapping[str, int], names: Iterable[str]) -> int:
        mask = 0
        for name in names:
            mask |= table.get(name, 0)
        return mask

    def static_penalties(
        self, policy: PlacementPolicy, penalty: Callable[[Offer], float]
    ) -> tuple[float, ...]:
        """``penalty`` of every offer (what does not depend on provider health), per policy."""
        found = self._static.get(policy)
        if found is None:
            found = self._static[policy] = tuple(penalty(x) for x in self.offers)
        return found
