"""The placement annotations (docs/reference.md#written-by-the-user), read from a pod, each
error naming its field.

``vk-provider.io/gpu`` and ``min-gpu-memory`` say what GPU a pod wants; ``max-price``,
``regions``, ``providers`` and ``capacity-type`` narrow where it may run.

Invariants: pure; a malformed list item or a non-finite number is ``InvalidPodSpec`` naming
``metadata.annotations['<name>']``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Final

from vk_provider.domain.placement import CapacityType
from vk_provider.domain.podspec import InvalidPodSpec, quantity_field
from vk_provider.domain.podview import (
    ANN_CAPACITY_TYPE,
    ANN_GPU,
    ANN_MAX_PRICE,
    ANN_MIN_GPU_MEMORY,
)
from vk_provider.domain.quantity import GIB

_GPU_MODEL: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def gpu_models(annotations: Mapping[str, str]) -> tuple[str, ...]:
    raw = annotations.get(ANN_GPU)
    if raw is None:
        return ()
    field = f"metadata.annotations['{ANN_GPU}']"
    models: list[str] = []
    for part in raw.split(","):
        model = part.strip()
        if not model:
            continue
        if not _GPU_MODEL.fullmatch(model):
            raise InvalidPodSpec(
                field,
                f"{model!r} is not a GPU model name (letters, digits, '.', '_', '-'; "
                "comma-separated, e.g. H100,A100-80GB)",
            )
        if model not in models:
            models.append(model)
    return tuple(models)


def min_gpu_memory_gib(annotations: Mapping[str, str]) -> float:
    raw = annotations.get(ANN_MIN_GPU_MEMORY)
    if raw is None:
        return 0.0
    field = f"metadata.annotations['{ANN_MIN_GPU_MEMORY}']"
    return float(quantity_field(raw.strip(), field) / GIB)


def _annotation_field(name: str) -> str:
    return f"metadata.annotations['{name}']"


def max_price(annotations: Mapping[str, str]) -> float | None:
    raw = annotations.get(ANN_MAX_PRICE)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidPodSpec(
            _annotation_field(ANN_MAX_PRICE), "must be a number of $/hour"
        ) from None
    if not math.isfinite(value) or value < 0:
        raise InvalidPodSpec(_annotation_field(ANN_MAX_PRICE), "must be a finite number >= 0")
    return value


def capacity_type(annotations: Mapping[str, str]) -> CapacityType:
    raw = annotations.get(ANN_CAPACITY_TYPE, CapacityType.ON_DEMAND.value)
    try:
        return CapacityType(raw.strip())
    except ValueError:
        raise InvalidPodSpec(
            _annotation_field(ANN_CAPACITY_TYPE), "must be one of on-demand, spot, any"
        ) from None


_LIST_ITEM: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def names(annotations: Mapping[str, str], name: str, what: str) -> tuple[str, ...]:
    """A comma-separated list annotation; every item must be a plain name."""
    raw = annotations.get(name, "")
    items: list[str] = []
    for part in raw.split(","):
        item = part.strip()
        if not item:
            continue
        if not _LIST_ITEM.fullmatch(item):
            raise InvalidPodSpec(
                _annotation_field(name),
                f"{item!r} is not a {what} (comma-separated names, e.g. a,b)",
            )
        if item not in items:
            items.append(item)
    return tuple(items)
