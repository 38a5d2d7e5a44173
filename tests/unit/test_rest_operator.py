"""The operator's routes of the REST API: ``/v1/gpus``, ``POST /v1/placements``, the budget
in ``/v1/spend`` — through ``httpx.AsyncClient`` over the world of ``test_rest_api``.

The world's three providers sit in the three breaker states (``alpha`` closed, ``beta``
half-open, ``gamma`` open); the dry run is the agent's own (``controllers.preview`` over a
``Launcher`` wired as the runtime wires it).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.unit.test_rest_api import (
    AUTH,
    PLANTED_CREDENTIAL,
    SECRET_TOKEN,
    FakeKube,
    World,
    assert_error,
    build_world,
    client_for,
    review_auth,
)
from vk_provider.api.operator_schemas import GpuCatalogOut, GpuGroupOut, GpuRowOut
from vk_provider.domain.budget import BudgetCaps


def pod(*, gpus: int = 1, **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llama",
            "namespace": "web",
            "annotations": {f"vk-provider.io/{k}": v for k, v in annotations.items()},
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:latest",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {},
                    "env": [
                        {"name": "HF_TOKEN", "value": PLANTED_CREDENTIAL},
                        {
                            "name": "API_KEY",
                            "valueFrom": {"secretKeyRef": {"name": "keys", "key": "api"}},
                        },
                    ],
                }
            ]
        },
    }


@pytest.fixture
async def world() -> World:
    return await build_world()


@pytest.fixture
async def client(world: World) -> Any:
    async with client_for(world.app()) as http:
        yield http


# --------------------------------------------------------------------------- /v1/gpus


async def test_gpus_groups_by_model_cheapest_per_gpu_first(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/gpus", headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["total"], body["shown"], body["limit"]) == (4, 4, None)
    assert [g["gpu_model"] for g in body["gpus"]] == ["A100-80GB", "H100-PCIE", "H100-SXM", None]
    eight = body["gpus"][2]["rows"][0]
    assert eight["gpu_count"] == 8
    assert eight["price_per_hour"] == 19.92
    assert eight["price_per_gpu_hour"] == pytest.approx(2.49)
    assert eight["spot_price_per_hour"] is None
    spot = body["gpus"][0]["rows"][0]
    assert (spot["price_per_hour"], spot["spot_price_per_gpu_hour"]) == (None, 1.39)
    assert spot["spot_available"] == 4 and spot["available"] is None


async def test_gpus_filters_and_limits_like_offers(client: httpx.AsyncClient) -> None:
    h100 = (await client.get("/v1/gpus", params={"gpu": "H100"}, headers=AUTH)).json()
    assert [g["gpu_model"] for g in h100["gpus"]] == ["H100-PCIE", "H100-SXM"]
    spot = (await client.get("/v1/gpus", params={"capacity_type": "spot"}, headers=AUTH)).json()
    assert [g["gpu_model"] for g in spot["gpus"]] == ["A100-80GB"]
    one = (await client.get("/v1/gpus", params={"limit": 1}, headers=AUTH)).json()
    assert one["limit"] == 1 and one["shown"] == 4
    refused = await client.get("/v1/gpus", params={"limit": -1}, headers=AUTH)
    assert_error(refused, 422, "invalid_request")


# --------------------------------------------------------------------------- /v1/placements


async def test_a_placeable_pod_gets_the_ranked_candidates_and_the_refusals(
    world: World, client: httpx.AsyncClient
) -> None:
    response = await client.post("/v1/placements", json=pod(gpu="H100"), headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["pod"] == {"namespace": "web", "name": "llama"}
    assert body["outcome"] == "placed"
    assert body["chosen"]["key"] == "alpha/h100-sxm-8x/us-east"
    assert [c["offer"]["key"] for c in body["candidates"]] == ["alpha/h100-sxm-8x/us-east"]
    first = body["candidates"][0]
    assert first["rank"] == 1
    assert first["penalties"] == {"low_availability": 0.05, "startup": 0.01, "recent_failures": 0}
    assert first["score"] == pytest.approx(19.92 * 1.06)
    refused = {r["offer"]["key"]: (r["filter"], r["reason"]) for r in body["refused"]}
    assert refused == {
        "beta/cpu-4/us-east": ("gpu-count", "has 0 GPU(s); the pod needs 1"),
        "alpha/a100-80gb/us-west": (
            "gpu-model",
            "A100-80GB is not one of vk-provider.io/gpu (H100)",
        ),
        # beta's breaker is half-open: its one probe is not spent on a dry run's placement.
        "beta/gpu_1x_h100_pcie/us-east": (
            "provider-health",
            "beta's circuit breaker holds calls back (it kept failing); it is probed again later",
        ),
    }
    assert dict((f["filter"], f["removed"]) for f in body["filters"])["gpu-model"] == 1
    assert body["request"]["gpu_models"] == ["H100"]
    assert body["request"]["capacity_type"] == "on-demand"
    assert body["message"].startswith("placed on alpha offer h100-sxm-8x (8x H100-SXM)")
    assert body["invalid_field"] is None
    # Nothing was launched or reserved.
    assert world.ledger.total_per_hour() == pytest.approx(19.92 + 1.39 + 2.49)


async def test_a_pod_nothing_fits_says_which_filter_refused_each_offer(
    client: httpx.AsyncClient,
) -> None:
    body = (
        await client.post("/v1/placements", json=pod(gpus=8, **{"max-price": "5"}), headers=AUTH)
    ).json()
    assert body["outcome"] == "no_capacity"
    assert body["chosen"] is None and body["candidates"] == []
    by_key = {r["offer"]["key"]: r["filter"] for r in body["refused"]}
    assert by_key["alpha/h100-sxm-8x/us-east"] == "price"
    assert by_key["beta/gpu_1x_h100_pcie/us-east"] == "gpu-count"
    assert len(body["refused"]) == body["offers_considered"] == 4
    assert body["message"].startswith("no offer fits 8 GPU: offers removed")


async def test_a_pod_over_budget_is_budget_exceeded() -> None:
    world = await build_world(BudgetCaps(per_namespace={"web": 4.0}))
    async with client_for(world.app()) as http:
        body = (await http.post("/v1/placements", json=pod(gpu="H100-SXM"), headers=AUTH)).json()
    assert body["outcome"] == "budget_exceeded"
    budget = next(r for r in body["refused"] if r["filter"] == "budget")
    assert budget["reason"] == (
        "$19.9200/h would exceed a budget cap ($0.1200/h left in the namespace)"
    )


async def test_an_invalid_pod_is_answered_with_the_field(client: httpx.AsyncClient) -> None:
    bad = pod()
    bad["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1.5"}}
    body = (await client.post("/v1/placements", json=bad, headers=AUTH)).json()
    assert body["outcome"] == "invalid"
    assert body["invalid_field"] == "spec.containers[0].resources.limits['nvidia.com/gpu']"
    assert body["request"] is None


async def test_the_body_must_be_a_pod(client: httpx.AsyncClient) -> None:
    deployment = {"kind": "Deployment", "spec": {"template": {}}}
    error = assert_error(
        await client.post("/v1/placements", json=deployment, headers=AUTH), 422, "invalid_request"
    )
    assert "kind must be Pod" in error["message"]
    assert_error(
        await client.post("/v1/placements", json=["not", "an", "object"], headers=AUTH),
        422,
        "invalid_request",
    )
    assert_error(await client.post("/v1/placements", headers=AUTH), 422, "invalid_request")


async def test_no_environment_value_or_secret_comes_back(
    world: World, client: httpx.AsyncClient
) -> None:
    response = await client.post("/v1/placements", json=pod(gpu="H100"), headers=AUTH)
    assert response.status_code == 200
    assert PLANTED_CREDENTIAL not in response.text
    assert "HF_TOKEN" not in response.text and "secretKeyRef" not in response.text
    assert SECRET_TOKEN not in response.text


async def test_placements_are_authorised_as_create_placements(world: World) -> None:
    kube = FakeKube()
    async with client_for(world.app(auth=review_auth(kube, world))) as http:
        anonymous = await http.post("/v1/placements", json=pod())
        refused = await http.post(
            "/v1/placements", json=pod(), headers={"Authorization": "Bearer nobody-token"}
        )
        allowed = await http.post(
            "/v1/placements", json=pod(), headers={"Authorization": "Bearer viewer-token"}
        )
    assert_error(anonymous, 401, "unauthorized")
    assert_error(refused, 403, "forbidden")
    assert "may not create placements.vk-provider.io" in refused.json()["error"]["message"]
    assert allowed.status_code == 200
    attributes = kube.access_reviews[-1]["resourceAttributes"]
    assert (attributes["group"], attributes["resource"], attributes["verb"]) == (
        "vk-provider.io",
        "placements",
        "create",
    )


async def test_the_openapi_document_describes_the_new_routes(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    post = document["paths"]["/v1/placements"]["post"]
    assert post["security"] == [{"HTTPBearer": []}]
    assert post["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PlacementOut"
    }
    assert "Nothing is launched" in post["description"]
    gpus = document["paths"]["/v1/gpus"]["get"]
    assert {p["name"] for p in gpus["parameters"]} == {
        "gpu",
        "region",
        "provider",
        "capacity_type",
        "limit",
    }
    schemas = document["components"]["schemas"]
    assert "spot_price_per_gpu_hour" in schemas["GpuRowOut"]["properties"]
    assert "budget" in schemas["SpendReport"]["properties"]


# --------------------------------------------------------------------------- /v1/spend


async def test_spend_says_each_cap_what_is_held_and_what_is_left() -> None:
    caps = BudgetCaps(global_per_hour=30.0, per_namespace={"web": 5.0, "idle": 1.0})
    world = await build_world(caps)
    async with client_for(world.app()) as http:
        spend = (await http.get("/v1/spend", headers=AUTH)).json()
    budget = spend["budget"]
    assert budget["global_cap"] == {
        "cap_per_hour": 30.0,
        "used_per_hour": pytest.approx(23.80),
        "room_per_hour": pytest.approx(6.20),
    }
    assert budget["default_namespace_per_hour"] is None
    assert budget["namespaces"] == [
        {"namespace": "idle", "cap_per_hour": 1.0, "used_per_hour": 0.0, "room_per_hour": 1.0},
        {"namespace": "ml", "cap_per_hour": None, "used_per_hour": 19.92, "room_per_hour": None},
        {
            "namespace": "web",
            "cap_per_hour": 5.0,
            "used_per_hour": pytest.approx(3.88),
            "room_per_hour": pytest.approx(1.12),
        },
    ]
    # The fields that were there before are unchanged.
    assert set(spend) == {"total", "providers", "namespaces", "entries", "budget"}


def test_the_documented_offers_json_has_exactly_the_fields_of_the_api() -> None:
    """docs/operating.md documents `vk-provider offers -o json`: its example has every field."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operating.md").read_text()
    block = re.search(r"```jsonc\n(.*?)```", text, re.S)
    assert block is not None
    example = json.loads(re.sub(r"//[^\n]*", "", block.group(1)))
    assert set(example) == set(GpuCatalogOut.model_fields)
    group = example["gpus"][0]
    assert set(group) == set(GpuGroupOut.model_fields)
    assert set(group["rows"][0]) == set(GpuRowOut.model_fields)
    GpuCatalogOut.model_validate(example)
