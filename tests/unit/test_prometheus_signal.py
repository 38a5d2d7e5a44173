"""Reading the flip's signal from Prometheus' HTTP API (``controllers.prometheus``).

respx answers ``GET /api/v1/query`` with bodies shaped as Prometheus documents them
(https://prometheus.io/docs/prometheus/latest/querying/api/): success envelopes with vector
and scalar results, the error envelope (``status: error``, ``errorType``, ``error``), and
non-JSON failures from a proxy in front of it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from vk_provider.controllers.prometheus import PrometheusSignal, SignalUnavailable
from vk_provider.domain.overflow import OverflowQueries, Reading

URL = "http://prometheus.test:9090"
QUERIES = OverflowQueries("alloc", "req", "unsched", "unfit")
TOKEN = "prom-s3cret-token"


def vector(value: str | None, *labels: dict[str, str]) -> dict[str, Any]:
    series = [{"metric": dict(m), "value": [1764590000.123, value]} for m in labels or [{}]]
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [] if value is None else series},
    }


@pytest.fixture
async def signal() -> AsyncIterator[PrometheusSignal]:
    prom = PrometheusSignal(URL, QUERIES, token=TOKEN, timeout=2)
    yield prom
    await prom.close()


def answer(mock: respx.MockRouter, bodies: dict[str, httpx.Response]) -> respx.Route:
    def reply(request: httpx.Request) -> httpx.Response:
        return bodies[request.url.params["query"]]

    return mock.get(f"{URL}/api/v1/query").mock(side_effect=reply)


@respx.mock
async def test_a_reading_from_instant_queries_with_the_samples_time(
    signal: PrometheusSignal,
) -> None:
    route = answer(
        respx.mock,
        {
            "alloc": httpx.Response(200, json=vector("32")),
            "req": httpx.Response(200, json=vector("30")),
            # When the rule was evaluated: the older of the two decides.
            "timestamp(alloc)": httpx.Response(200, json=vector("1764589990")),
            "timestamp(req)": httpx.Response(200, json=vector("1764589985")),
            "unsched": httpx.Response(200, json=vector(None)),  # no unscheduled demand
            "unfit": httpx.Response(200, json=vector("8")),
        },
    )
    assert await signal.read() == Reading(
        allocatable=32, requested=30, unscheduled=0, unfit=8, sampled_at=1764589985
    )
    assert route.call_count == 6
    assert route.calls[0].request.headers["Authorization"] == f"Bearer {TOKEN}"


@respx.mock
async def test_without_an_unfit_query_nothing_is_unfit() -> None:
    answer(
        respx.mock,
        {
            "alloc": httpx.Response(200, json=vector("8")),
            "req": httpx.Response(200, json=vector("0")),
            "timestamp(alloc)": httpx.Response(200, json=vector("100")),
            "timestamp(req)": httpx.Response(200, json=vector("100")),
            "unsched": httpx.Response(200, json=vector("2")),
        },
    )
    prom = PrometheusSignal(URL, OverflowQueries("alloc", "req", "unsched"), timeout=2)
    try:
        assert (await prom.read()).unfit == 0
    finally:
        await prom.close()


@respx.mock
async def test_a_scalar_result_is_its_value(signal: PrometheusSignal) -> None:
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "8"]}}
    answer(respx.mock, {"alloc": httpx.Response(200, json=scalar)})
    assert await signal.query("alloc") == 8.0


@pytest.mark.parametrize(
    ("response", "says"),
    [
        pytest.param(httpx.Response(200, json=vector(None)), "no series", id="empty"),
        pytest.param(
            httpx.Response(200, json=vector("1", {"a": "1"}, {"a": "2"})),
            "2 series",
            id="two-series",
        ),
        pytest.param(httpx.Response(200, json=vector("NaN")), "NaN", id="nan"),
        pytest.param(httpx.Response(200, json=vector("lots")), "not a number", id="garbage"),
        pytest.param(
            httpx.Response(
                400,
                json={
                    "status": "error",
                    "errorType": "bad_data",
                    "error": 'invalid parameter "query": 1:5: parse error',
                },
            ),
            "HTTP 400: invalid parameter",
            id="bad-query",
        ),
        pytest.param(
            httpx.Response(
                422,
                json={"status": "error", "errorType": "execution", "error": "query timed out"},
            ),
            "HTTP 422: query timed out",
            id="execution",
        ),
        pytest.param(
            httpx.Response(503, text="<html>Service Unavailable</html>"), "HTTP 503", id="proxy"
        ),
        pytest.param(
            httpx.Response(
                200, json={"status": "error", "errorType": "timeout", "error": "too slow"}
            ),
            "timeout: too slow",
            id="error-in-200",
        ),
        pytest.param(
            httpx.Response(200, json={"status": "success", "data": {"resultType": "matrix"}}),
            "expected a vector",
            id="matrix",
        ),
    ],
)
@respx.mock
async def test_anything_but_one_number_is_unavailable_naming_the_query(
    signal: PrometheusSignal, response: httpx.Response, says: str
) -> None:
    answer(respx.mock, {"alloc": response})
    with pytest.raises(SignalUnavailable) as caught:
        await signal.query("alloc")
    assert "query 'alloc'" in str(caught.value) and says in str(caught.value)
    assert TOKEN not in str(caught.value)


@respx.mock
async def test_a_connection_failure_is_unavailable(signal: PrometheusSignal) -> None:
    respx.mock.get(f"{URL}/api/v1/query").mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(SignalUnavailable, match="ConnectError"):
        await signal.read()


@respx.mock
async def test_required_queries_must_have_series_the_unscheduled_one_may_not(
    signal: PrometheusSignal,
) -> None:
    answer(
        respx.mock,
        {
            "alloc": httpx.Response(200, json=vector("32")),
            "req": httpx.Response(200, json=vector(None)),
        },
    )
    with pytest.raises(SignalUnavailable, match="query 'req': no series"):
        await signal.read()
