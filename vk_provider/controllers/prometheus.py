"""The overflow flip's signal: instant queries against Prometheus' HTTP API.

``PrometheusSignal.read()`` runs the configured queries (own GPUs allocatable, requested,
unscheduled demand and the part of it that fits no own node) through ``GET /api/v1/query``,
and ``timestamp()`` of the first two for when their samples were taken (a recording rule's
sample carries the time of its evaluation), and returns a ``Reading``.
Anything that is not a clear number — a connection error, a timeout, a non-2xx answer, a
``status: error`` body, an empty result for allocatable or requested, a NaN — raises
``SignalUnavailable`` with a message that says which query and why, so the flip keeps its
state instead of deciding on missing data.

Invariants: the bearer token is sent only as a header and never appears in a message; a
query returns exactly one number (a vector must hold one sample, a scalar is its value).
"""

from __future__ import annotations

import math
from typing import Any

import httpx

from vk_provider.domain.overflow import OverflowQueries, Reading


class SignalUnavailable(Exception):
    """The signal could not be read; the message says which query and why."""


class PrometheusSignal:
    def __init__(
        self,
        url: str,
        queries: OverflowQueries,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(
            base_url=url,
            headers=headers,
            timeout=timeout,
            verify=ca_file if ca_file else True,
            transport=transport,
        )
        self._queries = queries
        self.url = url

    async def query(self, promql: str, *, required: bool = True) -> float:
        """One instant query's single number; 0 for an empty result when not ``required``."""
        try:
            response = await self._client.get("/api/v1/query", params={"query": promql})
        except httpx.HTTPError as exc:
            raise SignalUnavailable(f"query {promql!r}: {type(exc).__name__}") from exc
        try:
            body: Any = response.json()
        except ValueError:
            body = None
        if response.status_code >= 300 or not isinstance(body, dict):
            why = body.get("error") if isinstance(body, dict) else None
            raise SignalUnavailable(
                f"query {promql!r}: HTTP {response.status_code}" + (f": {why}" if why else "")
            )
        if body.get("status") != "success":
            raise SignalUnavailable(
                f"query {promql!r}: {body.get('errorType')}: {body.get('error')}"
            )
        return _number(promql, body.get("data"), required=required)

    async def read(self) -> Reading:
        q = self._queries
        allocatable = await self.query(q.allocatable)
        requested = await self.query(q.requested)
        sampled_at = min(
            await self.query(f"timestamp({q.allocatable})"),
            await self.query(f"timestamp({q.requested})"),
        )
        return Reading(
            allocatable=allocatable,
            requested=requested,
            unscheduled=await self.query(q.unscheduled, required=False),
            unfit=await self.query(q.unfit, required=False) if q.unfit else 0.0,
            sampled_at=sampled_at,
        )

    async def close(self) -> None:
        await self._client.aclose()


def _number(promql: str, data: object, *, required: bool) -> float:
    if not isinstance(data, dict):
        raise SignalUnavailable(f"query {promql!r}: the answer has no data")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        raw = result[1]
    elif kind == "vector" and isinstance(result, list):
        if not result:
            if required:
                raise SignalUnavailable(f"query {promql!r}: no series (is the rule loaded?)")
            return 0.0
        if len(result) > 1:
            raise SignalUnavailable(f"query {promql!r}: {len(result)} series, expected one")
        sample = result[0].get("value") if isinstance(result[0], dict) else None
        if not isinstance(sample, list) or len(sample) != 2:
            raise SignalUnavailable(f"query {promql!r}: a sample without a value")
        raw = sample[1]
    else:
        raise SignalUnavailable(f"query {promql!r}: result type {kind!r}, expected a vector")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SignalUnavailable(f"query {promql!r}: {raw!r} is not a number") from None
    if math.isnan(value) or math.isinf(value):
        raise SignalUnavailable(f"query {promql!r}: {raw}")
    return value
