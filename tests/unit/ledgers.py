"""Putting spend into a ``BudgetLedger`` for tests, the two ways the agent does.

``bill`` is a create of this run: reserved under the caps (it must fit), then answered.
``listed`` is what a provider's listing shows (every instance it bills, reserved or not:
a previous run's, an adopted one), which counts whatever the caps say and replaces
whatever the ledger held for that provider.
"""

from __future__ import annotations

from collections.abc import Iterable

from vk_provider.domain.budget import BudgetLedger
from vk_provider.domain.models import Instance, InstanceState


def bill(
    ledger: BudgetLedger,
    *,
    provider: str,
    pod_uid: str,
    namespace: str,
    price: float,
    attempt: int = 0,
    offer_key: str = "",
) -> None:
    request = f"{pod_uid}.{attempt}"
    assert ledger.reserve(
        request,
        pod_uid=pod_uid,
        namespace=namespace,
        provider=provider,
        offer_key=offer_key or f"{provider}/sku/region",
        price=price,
    ), f"{request} does not fit the caps"
    ledger.created(provider, request)


def instance(provider: str, pod_uid: str, price: float, *, attempt: int = 0) -> Instance:
    return Instance(
        provider=provider,
        instance_id=f"{provider}-{pod_uid}-{attempt}",
        pod_uid=pod_uid,
        attempt=attempt,
        state=InstanceState.RUNNING,
        offer_key=f"{provider}/sku/region",
        price_per_hour=price,
    )


def listed(
    ledger: BudgetLedger,
    provider: str,
    instances: Iterable[Instance],
    namespaces: dict[str, str] | None = None,
) -> None:
    """``provider`` lists exactly ``instances`` (pod UID → namespace from ``namespaces``)."""
    mark = ledger.listing()
    ledger.listed(provider, list(instances), mark, namespace_of=(namespaces or {}).get)
