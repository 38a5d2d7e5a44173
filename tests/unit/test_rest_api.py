"""The REST API, through ``httpx.AsyncClient`` over ASGI, against a real ``AgentView``.

The view is built from the real parts — ``GuardedProvider`` + ``CircuitBreaker`` around small
fake adapters, an ``OfferBook`` refreshed once, a ``BudgetLedger`` with committed pods — on one
fake clock, so every number the API reports is known exactly. The three providers sit in the
three breaker states: ``alpha`` closed, ``beta`` half-open, ``gamma`` open.

``build_world`` and the constants here are shared with ``test_rest_schema`` and
``test_cli_rest``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from tests.unit.ledgers import bill, listed
from vk_provider.api.authn import (
    RequestAttributes,
    SubjectAccessReviewAuthorizer,
    TokenReviewAuthenticator,
    UserInfo,
)
from vk_provider.api.metrics import CONTENT_TYPE, Metrics
from vk_provider.api.rest import build_app
from vk_provider.api.rest_auth import StaticTokenAuth, TokenReviewAuth
from vk_provider.api.rest_server import RestServer
from vk_provider.api.view import AgentView, Readiness
from vk_provider.controllers.guarded import GuardedProvider
from vk_provider.controllers.launch import Launcher
from vk_provider.controllers.offers import OfferBook
from vk_provider.controllers.overflow import OverflowView
from vk_provider.controllers.preview import PlacementPreview
from vk_provider.domain.breaker import BreakerState, CircuitBreaker
from vk_provider.domain.budget import BudgetCaps, BudgetLedger
from vk_provider.domain.errors import InvalidSpec, NotFound, Transient
from vk_provider.domain.handoverstep import HandoverView
from vk_provider.domain.models import (
    Capabilities,
    Instance,
    InstanceState,
    LogOptions,
    Offer,
    PortEndpoint,
    WorkloadSpec,
)
from vk_provider.domain.overflow import OverflowState, Reading
from vk_provider.domain.podview import PodPlacement
from vk_provider.kube.client import KubeClient
from vk_provider.runtime.agent_breakers import health_of
from vk_provider.settings.agent import PlacementConfig

SECRET_TOKEN = "static-dev-token-7c1e9a44"
PLANTED_CREDENTIAL = "rpa_PLANTED_CREDENTIAL_d41d8cd98f00"
AUTH = {"Authorization": f"Bearer {SECRET_TOKEN}"}
T0 = 10_000.0
SINCE = datetime(2025, 1, 31, 9, 0, tzinfo=UTC)
THRESHOLD = 3
COOLDOWN = 30.0

V1_ROUTES = (
    "/v1/providers",
    "/v1/providers/alpha",
    "/v1/offers",
    "/v1/gpus",
    "/v1/pods",
    "/v1/spend",
    "/v1/overflow",
)


# --------------------------------------------------------------------------- fakes


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def _no_logs() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


class FakeCloud:
    """A provider adapter answering offers from a list. Like a real adapter it holds its
    resolved credential, which must never reach an API response."""

    def __init__(
        self, name: str, offers: list[Offer], *, offers_error: Exception | None = None
    ) -> None:
        self._name = name
        self._offers = offers
        self.offers_error = offers_error
        self.config = {"api_key": PLANTED_CREDENTIAL, "base_url": "https://api.example"}

    @property
    def name(self) -> str:
        return self._name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=False)

    async def offers(self) -> list[Offer]:
        if self.offers_error is not None:
            raise self.offers_error
        return list(self._offers)

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        raise InvalidSpec("the fake cloud launches nothing", provider=self._name)

    async def get(self, instance_id: str) -> Instance:
        raise NotFound(instance_id, provider=self._name)

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        return None

    async def list_ours(self) -> list[Instance]:
        return []

    def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        return _no_logs()

    async def close(self) -> None:
        return None


def make_offer(
    provider: str,
    sku: str,
    region: str,
    gpu: str | None,
    count: int,
    price: float,
    *,
    spot: bool = False,
    available: int = 2,
    vcpus: float = 16,
    memory: float = 128,
    gpu_memory: float = 80,
    startup: float = 60,
) -> Offer:
    return Offer(
        provider=provider,
        sku=sku,
        region=region,
        gpu_model=gpu,
        gpu_count=count,
        gpu_memory_gib=gpu_memory if gpu else 0,
        vcpus=vcpus,
        memory_gib=memory,
        price_per_hour=price,
        spot=spot,
        available=available,
        startup_seconds=startup,
    )


H100X8 = make_offer(
    "alpha", "h100-sxm-8x", "us-east", "H100-SXM", 8, 19.92, available=1, vcpus=128, memory=1024
)
A100 = make_offer("alpha", "a100-80gb", "us-west", "A100-80GB", 1, 1.39, spot=True, available=4)
H100_PCIE = make_offer("beta", "gpu_1x_h100_pcie", "us-east", "H100-PCIE", 1, 2.49)
CPU4 = make_offer("beta", "cpu-4", "us-east", None, 0, 0.12, vcpus=4, memory=16, available=9)

PODS = [
    PodPlacement(
        "ml", "trainer-0", "uid-1", "alpha", "i-alpha-1", H100X8.key, 19.92, "Running", SINCE
    ),
    PodPlacement("web", "infer-0", "uid-2", "alpha", "i-alpha-2", A100.key, 1.39, "Running", SINCE),
    PodPlacement(
        "web", "infer-1", "uid-3", "beta", "i-beta-1", H100_PCIE.key, 2.49, "Pending", None
    ),
]

# What the providers last listed: the inference replica's port is exposed, mapped.
INSTANCES = [
    Instance(
        "alpha", "i-alpha-2", "uid-2", 0, InstanceState.RUNNING,
        endpoints=(PortEndpoint(8000, "TCP", "203.0.113.7", 40123),),
    ),
    Instance("alpha", "i-alpha-1", "uid-1", 0, InstanceState.RUNNING),
]  # fmt: skip


@dataclass
class Knobs:
    """What a test may change in a built world: readiness, and a failure of the pod list."""

    readiness: Readiness = field(default_factory=lambda: Readiness(ready=True, reasons=()))
    placements_error: Exception | None = None
    overdue: list[tuple[str, str]] = field(default_factory=list)
    overflow: OverflowView | None = None


@dataclass
class World:
    clock: FakeClock
    clouds: dict[str, FakeCloud]
    guarded: dict[str, GuardedProvider]
    ledger: BudgetLedger
    metrics: Metrics
    view: AgentView
    knobs: Knobs

    def app(self, *, auth: Any = None, open_metrics: bool = True) -> FastAPI:
        return build_app(
            view=self.view,
            metrics=self.metrics,
            auth=auth or StaticTokenAuth(SECRET_TOKEN),
            open_metrics=open_metrics,
        )


async def build_world(budget: BudgetCaps | None = None) -> World:
    """Three providers in the three breaker states, three pods, half an hour of spend."""
    clock = FakeClock()
    metrics = Metrics()
    clouds = {
        "alpha": FakeCloud("alpha", [H100X8, A100]),
        "beta": FakeCloud("beta", [H100_PCIE, CPU4]),
        "gamma": FakeCloud("gamma", [], offers_error=Transient("connection refused")),
    }
    guarded = {
        name: GuardedProvider(
            cloud,
            CircuitBreaker(threshold=THRESHOLD, cooldown_seconds=COOLDOWN, clock=clock),
            observe=metrics.observe_call,
        )
        for name, cloud in clouds.items()
    }
    # A long TTL: the dry run reads the offers refreshed here, as the views do.
    book = OfferBook(guarded, ttl_seconds=3600, clock=clock)
    await book.refresh()  # gamma's failure is its breaker's first (at T0)

    ledger = BudgetLedger(budget or BudgetCaps(), clock=clock)
    for pod in PODS:
        bill(
            ledger,
            provider=pod.provider,
            pod_uid=pod.uid,
            namespace=pod.namespace,
            price=pod.price_per_hour,
        )

    clock.advance(1770)
    for _ in range(THRESHOLD):
        guarded["beta"].breaker.record_failure(Transient("timed out"))
    for _ in range(THRESHOLD - 1):
        guarded["gamma"].breaker.record_failure(Transient("connection refused"))
    clock.advance(COOLDOWN)
    assert guarded["beta"].breaker.allow_probe()  # open → half-open

    knobs = Knobs()

    def placements() -> list[PodPlacement]:
        if knobs.placements_error is not None:
            raise knobs.placements_error
        return list(PODS)

    view = AgentView(
        providers=guarded,
        provider_types={"alpha": "runpod", "beta": "lambda", "gamma": "modal"},
        offers=book,
        ledger=ledger,
        placements=placements,
        readiness=lambda: knobs.readiness,
        overdue=lambda: knobs.overdue,
        overflow=lambda: knobs.overflow,
        instances=lambda: INSTANCES,
        preview=PlacementPreview(
            launcher=Launcher(
                guarded,
                ledger,
                settings=PlacementConfig(),
                health=lambda: health_of(guarded),
                clock=clock,
            ),
            offers=book,
            node_name="vk-test",
            host_ip="10.0.0.1",
        ).preview,
        clock=clock,
    )
    metrics.attach(view)
    return World(clock, clouds, guarded, ledger, metrics, view, knobs)


def client_for(app: FastAPI, *, raise_app_exceptions: bool = True) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url="http://rest.test")


@pytest.fixture
async def world() -> World:
    return await build_world()


@pytest.fixture
async def client(world: World) -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(world.app()) as http:
        yield http


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in response.text
    return cast(dict[str, Any], body["error"])


# --------------------------------------------------------------------------- health


async def test_healthz_is_open_and_says_ok(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.text == "ok"
    assert response.headers["content-type"].startswith("text/plain")


async def test_readyz_is_200_when_ready(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"ready": True, "reasons": []}


async def test_readyz_is_503_with_the_reasons_when_not_ready(
    world: World, client: httpx.AsyncClient
) -> None:
    world.knobs.readiness = Readiness(
        ready=False, reasons=("the node is not registered yet", "the pod watch is not live")
    )
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "reasons": ["the node is not registered yet", "the pod watch is not live"],
    }


# --------------------------------------------------------------------------- authentication


@pytest.mark.parametrize("path", V1_ROUTES)
async def test_v1_routes_without_a_token_are_401_with_a_bearer_challenge(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.get(path)
    error = assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"
    assert "bearer token is required" in error["message"]


@pytest.mark.parametrize(
    "header",
    [
        f"Basic {SECRET_TOKEN}",  # the right secret, the wrong scheme
        "Bearer",  # no token at all
        SECRET_TOKEN,  # no scheme
        "",
    ],
)
async def test_malformed_authorization_headers_are_401(
    client: httpx.AsyncClient, header: str
) -> None:
    response = await client.get("/v1/providers", headers={"Authorization": header})
    assert_error(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"


async def test_a_wrong_token_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/v1/providers", headers={"Authorization": f"Bearer {SECRET_TOKEN}-wrong"}
    )
    error = assert_error(response, 401, "unauthorized")
    assert error["message"] == "the token was refused"
    assert response.headers["www-authenticate"].startswith("Bearer")


async def test_the_scheme_is_case_insensitive(client: httpx.AsyncClient) -> None:
    response = await client.get(
        "/v1/providers", headers={"Authorization": f"bearer {SECRET_TOKEN}"}
    )
    assert response.status_code == 200


class RaisingAuth:
    async def authenticate(self, token: str) -> UserInfo | None:
        raise ConnectionError(f"API server unreachable while reviewing {token}")

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        return True


async def test_an_authenticator_that_raises_answers_503_not_500_and_not_200(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with client_for(world.app(auth=RaisingAuth())) as http:
        response = await http.get("/v1/providers", headers=AUTH)
    error = assert_error(response, 503, "unavailable")
    assert "try again" in error["message"]
    assert response.headers["retry-after"] == "5"
    # The authenticator's message quoted the token: it reaches neither the caller nor the log.
    assert SECRET_TOKEN not in response.text
    assert SECRET_TOKEN not in caplog.text
    assert "ConnectionError" in caplog.text


class SlowAuth:
    async def authenticate(self, token: str) -> UserInfo | None:
        await asyncio.sleep(3600)
        return UserInfo("never", ())

    async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
        return True


async def test_an_authenticator_that_hangs_answers_503(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("vk_provider.api.rest_auth.AUTH_TIMEOUT_SECONDS", 0.05)
    async with client_for(world.app(auth=SlowAuth())) as http:
        response = await http.get("/v1/pods", headers=AUTH)
    assert_error(response, 503, "unavailable")


async def test_static_token_auth() -> None:
    auth = StaticTokenAuth(SECRET_TOKEN)
    user = await auth.authenticate(SECRET_TOKEN)
    assert user is not None and user.username == "static-token"
    assert await auth.authorize(user, RequestAttributes(verb="list", resource="pods"))
    assert await auth.authenticate(SECRET_TOKEN[:-1]) is None
    assert await auth.authenticate("") is None
    assert await auth.authenticate("é" + SECRET_TOKEN) is None  # non-ASCII compares too
    assert SECRET_TOKEN not in repr(auth)
    with pytest.raises(ValueError, match="must not be empty"):
        StaticTokenAuth("")


VIEWER = "system:serviceaccount:ops:viewer"
NOBODY = "system:serviceaccount:ops:nobody"


@dataclass
class FakeKube:
    """Stands in for ``KubeClient.token_review`` and ``subject_access_review``: two valid
    service-account tokens, one of whose identity RBAC lets read the vk-provider.io group."""

    tokens: dict[str, str] = field(
        default_factory=lambda: {"viewer-token": VIEWER, "nobody-token": NOBODY}
    )
    reviews: list[str] = field(default_factory=list)
    access_reviews: list[dict[str, Any]] = field(default_factory=list)

    async def token_review(self, token: str) -> dict[str, Any]:
        self.reviews.append(token)
        if token not in self.tokens:
            return {"status": {"authenticated": False}}
        user = {"username": self.tokens[token], "groups": ["system:serviceaccounts"]}
        return {"status": {"authenticated": True, "user": user}}

    async def subject_access_review(self, spec: dict[str, Any]) -> dict[str, Any]:
        self.access_reviews.append(spec)
        attributes = spec.get("resourceAttributes") or {}
        allowed = spec["user"] == VIEWER and (
            attributes.get("group") == "vk-provider.io"
            or spec.get("nonResourceAttributes", {}).get("path") == "/metrics"
        )
        return {"status": {"allowed": allowed}}


def review_auth(kube: FakeKube, world: World) -> TokenReviewAuth:
    return TokenReviewAuth(
        TokenReviewAuthenticator(cast(KubeClient, kube), clock=world.clock),
        SubjectAccessReviewAuthorizer(cast(KubeClient, kube), clock=world.clock),
    )


V1_ROUTES = {
    "/v1/providers": ("providers", "list"),
    "/v1/providers/alpha": ("providers", "get"),
    "/v1/offers": ("offers", "list"),
    "/v1/gpus": ("offers", "list"),
    "/v1/pods": ("pods", "list"),
    "/v1/spend": ("spend", "get"),
    "/v1/overflow": ("overflow", "get"),
}


async def test_token_review_auth_through_the_cached_reviews(world: World) -> None:
    kube = FakeKube()
    async with client_for(world.app(auth=review_auth(kube, world))) as http:
        good = {"Authorization": "Bearer viewer-token"}
        assert (await http.get("/v1/providers", headers=good)).status_code == 200
        assert (await http.get("/v1/pods", headers=good)).status_code == 200
        bad = await http.get("/v1/pods", headers={"Authorization": "Bearer not-a-token"})
    assert_error(bad, 401, "unauthorized")
    # The second request with the same token was answered from the cache.
    assert kube.reviews == ["viewer-token", "not-a-token"]


async def test_every_v1_route_is_authorised_not_only_authenticated(world: World) -> None:
    """A valid token of an identity without RBAC rights gets 403 everywhere; the viewer 200."""
    kube = FakeKube()
    async with client_for(world.app(auth=review_auth(kube, world))) as http:
        for path in V1_ROUTES:
            refused = await http.get(path, headers={"Authorization": "Bearer nobody-token"})
            error = assert_error(refused, 403, "forbidden")
            assert NOBODY in error["message"]
            allowed = await http.get(path, headers={"Authorization": "Bearer viewer-token"})
            assert allowed.status_code == 200, path
    asked = {
        (r["resourceAttributes"]["resource"], r["resourceAttributes"]["verb"])
        for r in kube.access_reviews
    }
    assert asked == set(V1_ROUTES.values())
    assert {r["resourceAttributes"]["group"] for r in kube.access_reviews} == {"vk-provider.io"}


async def test_closed_metrics_are_authorised_as_a_non_resource_url(world: World) -> None:
    kube = FakeKube()
    app = world.app(auth=review_auth(kube, world), open_metrics=False)
    async with client_for(app) as http:
        refused = await http.get("/metrics", headers={"Authorization": "Bearer nobody-token"})
        allowed = await http.get("/metrics", headers={"Authorization": "Bearer viewer-token"})
    assert_error(refused, 403, "forbidden")
    assert allowed.status_code == 200
    assert kube.access_reviews[-1]["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}


async def test_a_reviewer_that_cannot_answer_gives_503() -> None:
    class Fixed:
        async def authenticate_token(self, token: str) -> UserInfo | None:
            return UserInfo("alice", ("dev",))

    class Down:
        async def authorize(self, user: UserInfo, attributes: RequestAttributes) -> bool:
            raise ConnectionError("API server down")

    auth = TokenReviewAuth(Fixed(), Down())
    assert await auth.authenticate("t") == UserInfo("alice", ("dev",))
    with pytest.raises(ConnectionError):
        await auth.authorize(UserInfo("alice", ()), RequestAttributes(verb="get", path="/x"))


# --------------------------------------------------------------------------- providers


async def test_providers_lists_each_provider_in_its_breaker_state(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/v1/providers", headers=AUTH)
    assert response.status_code == 200
    by_name = {p["name"]: p for p in response.json()}
    assert list(by_name) == ["alpha", "beta", "gamma"]

    alpha, beta, gamma = by_name["alpha"], by_name["beta"], by_name["gamma"]
    assert alpha == {
        "name": "alpha",
        "type": "runpod",
        "healthy": True,
        "breaker_state": "closed",
        "consecutive_failures": 0,
        "recent_failures": 0,
        "last_error": None,
        "last_answer_age_seconds": 1800.0,
        "offer_count": 2,
        "gpus_available": 8 * 1 + 1 * 4,
        "running_pods": 2,
        "spend_per_hour": pytest.approx(19.92 + 1.39),
        "terminations_overdue": 0,
    }
    assert beta["breaker_state"] == "half-open"
    assert beta["healthy"] is False
    assert beta["consecutive_failures"] == THRESHOLD
    assert beta["recent_failures"] == THRESHOLD
    assert beta["last_error"] == "Transient: timed out"
    assert beta["gpus_available"] == 2
    assert beta["running_pods"] == 1
    assert beta["spend_per_hour"] == pytest.approx(2.49)

    assert gamma["breaker_state"] == "open"
    assert gamma["healthy"] is False
    assert gamma["consecutive_failures"] == THRESHOLD
    # The first failure (the offers refresh at T0) is older than the breaker's window.
    assert gamma["recent_failures"] == THRESHOLD - 1
    assert gamma["last_error"] == "Transient: connection refused"
    assert gamma["last_answer_age_seconds"] is None
    assert gamma["offer_count"] == 0
    assert gamma["running_pods"] == 0
    assert gamma["spend_per_hour"] == 0


async def test_a_provider_closes_again_after_a_successful_probe(
    world: World, client: httpx.AsyncClient
) -> None:
    world.guarded["beta"].breaker.record_success()
    beta = (await client.get("/v1/providers/beta", headers=AUTH)).json()
    assert beta["breaker_state"] == "closed"
    assert beta["healthy"] is True
    assert beta["consecutive_failures"] == 0
    assert world.guarded["beta"].breaker.state is BreakerState.CLOSED


async def test_one_provider_with_its_offers_cheapest_first(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/providers/alpha", headers=AUTH)
    assert response.status_code == 200
    alpha = response.json()
    assert alpha["name"] == "alpha"
    assert alpha["breaker_state"] == "closed"
    assert alpha["offer_count"] == 2
    assert [o["sku"] for o in alpha["offers"]] == ["a100-80gb", "h100-sxm-8x"]
    assert alpha["offers"][1] == {
        "key": "alpha/h100-sxm-8x/us-east",
        "provider": "alpha",
        "sku": "h100-sxm-8x",
        "region": "us-east",
        "gpu_model": "H100-SXM",
        "gpu_count": 8,
        "gpu_memory_gib": 80.0,
        "vcpus": 128.0,
        "memory_gib": 1024.0,
        "price_per_hour": 19.92,
        "spot": False,
        "available": 1,
        "startup_seconds": 60.0,
    }


async def test_an_unknown_provider_is_a_404_json_error(client: httpx.AsyncClient) -> None:
    error = assert_error(await client.get("/v1/providers/acme", headers=AUTH), 404, "not_found")
    assert error["message"] == "no provider named 'acme'"


async def test_unknown_routes_and_methods_are_json_errors(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v2/nothing", headers=AUTH), 404, "not_found")
    response = await client.post("/v1/providers", headers=AUTH)
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET"


# --------------------------------------------------------------------------- offers


async def offer_keys(client: httpx.AsyncClient, **params: str) -> list[str]:
    response = await client.get("/v1/offers", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return [o["key"] for o in response.json()]


async def test_offers_are_all_listed_cheapest_first(client: httpx.AsyncClient) -> None:
    assert await offer_keys(client) == [CPU4.key, A100.key, H100_PCIE.key, H100X8.key]


async def test_offers_gpu_filter_matches_like_placement(client: httpx.AsyncClient) -> None:
    assert await offer_keys(client, gpu="H100") == [H100_PCIE.key, H100X8.key]
    assert await offer_keys(client, gpu="h100-sxm") == [H100X8.key]
    assert await offer_keys(client, gpu="H100-SXM,A100-80GB") == [A100.key, H100X8.key]
    assert await offer_keys(client, gpu="B200") == []


async def test_offers_region_filter(client: httpx.AsyncClient) -> None:
    assert await offer_keys(client, region="us-west") == [A100.key]
    assert await offer_keys(client, region="us-east") == [CPU4.key, H100_PCIE.key, H100X8.key]
    assert await offer_keys(client, region="eu-north") == []


async def test_offers_provider_filter(client: httpx.AsyncClient) -> None:
    assert await offer_keys(client, provider="beta") == [CPU4.key, H100_PCIE.key]
    assert await offer_keys(client, provider="gamma") == []


async def test_offers_capacity_type_filter(client: httpx.AsyncClient) -> None:
    assert await offer_keys(client, capacity_type="spot") == [A100.key]
    assert await offer_keys(client, capacity_type="on-demand") == [
        CPU4.key,
        H100_PCIE.key,
        H100X8.key,
    ]
    assert len(await offer_keys(client, capacity_type="any")) == 4


async def test_offers_filters_combine(client: httpx.AsyncClient) -> None:
    keys = await offer_keys(client, gpu="H100", region="us-east", provider="alpha")
    assert keys == [H100X8.key]


async def test_an_invalid_capacity_type_is_a_422_json_error(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/offers", params={"capacity_type": "bogus"}, headers=AUTH)
    error = assert_error(response, 422, "invalid_request")
    assert "capacity_type" in error["message"]
    assert "bogus" not in error["message"]


async def test_authentication_comes_before_validation(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/offers", params={"capacity_type": "bogus"})
    assert_error(response, 401, "unauthorized")


# --------------------------------------------------------------------------- pods and spend


async def test_pods_say_where_each_pod_runs_since_when_at_what_price(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/v1/pods", headers=AUTH)
    assert response.status_code == 200
    pods = response.json()
    assert [(p["namespace"], p["name"]) for p in pods] == [
        ("ml", "trainer-0"),
        ("web", "infer-0"),
        ("web", "infer-1"),
    ]
    assert pods[0] == {
        "namespace": "ml",
        "name": "trainer-0",
        "uid": "uid-1",
        "provider": "alpha",
        "instance_id": "i-alpha-1",
        "offer": "alpha/h100-sxm-8x/us-east",
        "price_per_hour": 19.92,
        "phase": "Running",
        "since": "2025-01-31T09:00:00Z",
        "endpoints": [],
    }
    assert pods[1]["endpoints"] == [
        {"container_port": 8000, "protocol": "TCP", "address": "203.0.113.7", "port": 40123}
    ]
    assert pods[2]["since"] is None
    assert pods[2]["phase"] == "Pending"


async def test_spend_per_provider_per_namespace_and_totals(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/spend", headers=AUTH)
    assert response.status_code == 200
    spend = response.json()
    half_hour = 0.5
    assert spend["total"] == {
        "per_hour": pytest.approx(19.92 + 1.39 + 2.49),
        "accumulated": pytest.approx((19.92 + 1.39 + 2.49) * half_hour),
    }
    assert spend["providers"] == [
        {
            "provider": "alpha",
            "per_hour": pytest.approx(21.31),
            "accumulated": pytest.approx(21.31 * half_hour),
        },
        {
            "provider": "beta",
            "per_hour": pytest.approx(2.49),
            "accumulated": pytest.approx(2.49 * half_hour),
        },
    ]
    assert spend["namespaces"] == [
        {
            "namespace": "ml",
            "per_hour": pytest.approx(19.92),
            "accumulated": pytest.approx(19.92 * half_hour),
        },
        {
            "namespace": "web",
            "per_hour": pytest.approx(3.88),
            "accumulated": pytest.approx(3.88 * half_hour),
        },
    ]
    assert [(e["provider"], e["namespace"]) for e in spend["entries"]] == [
        ("alpha", "ml"),
        ("alpha", "web"),
        ("beta", "web"),
    ]


async def test_spend_is_zero_when_nothing_runs(world: World, client: httpx.AsyncClient) -> None:
    for name in {pod.provider for pod in PODS}:
        listed(world.ledger, name, [])  # the providers list nothing: every instance is gone
    spend = (await client.get("/v1/spend", headers=AUTH)).json()
    assert spend["total"]["per_hour"] == 0
    # What ran before still counts as spent.
    assert spend["total"]["accumulated"] == pytest.approx((19.92 + 1.39 + 2.49) * 0.5)


# --------------------------------------------------------------------------- metrics


def sample(exposition: str, line_prefix: str) -> float:
    for line in exposition.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {line_prefix} in the exposition")


async def test_metrics_are_open_and_in_prometheus_text(client: httpx.AsyncClient) -> None:
    response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE
    text = response.text
    assert sample(text, 'vk_provider_pods{phase="Running",provider="alpha"}') == 2
    assert sample(text, 'vk_provider_pods{phase="Pending",provider="beta"}') == 1
    for provider, state in (("alpha", "closed"), ("beta", "half-open"), ("gamma", "open")):
        labels = f'provider="{provider}",state="{state}"'
        assert sample(text, f"vk_provider_circuit_breaker_state{{{labels}}}") == 1
    assert sample(text, 'vk_provider_circuit_breaker_state{provider="gamma",state="closed"}') == 0
    assert sample(text, 'vk_provider_up{provider="alpha"}') == 1
    assert sample(text, 'vk_provider_up{provider="gamma"}') == 0
    assert (
        sample(text, 'vk_provider_offer_cheapest_price_dollars_per_hour{gpu="A100-80GB"}') == 1.39
    )
    assert sample(text, 'vk_provider_offers{gpu="H100-SXM",provider="alpha"}') == 1
    assert sample(
        text, 'vk_provider_spend_dollars_per_hour{namespace="ml",provider="alpha"}'
    ) == pytest.approx(19.92)
    assert sample(
        text, 'vk_provider_spend_dollars_total{namespace="ml",provider="alpha"}'
    ) == pytest.approx(9.96)
    # Every provider call went through the guard, which observed it.
    count = 'vk_provider_request_duration_seconds_count{operation="offers",provider="alpha"}'
    assert sample(text, count) == 1
    errors = (
        'vk_provider_request_errors_total{error="Transient",operation="offers",provider="gamma"}'
    )
    assert sample(text, errors) == 1
    for name in (
        "vk_provider_placement_attempts_total",
        "vk_provider_launch_failures_total",
        "vk_provider_reconcile_duration_seconds",
        "vk_provider_instances_terminated_total",
        "vk_provider_pod_start_duration_seconds",
        "vk_provider_workqueue_depth",
        "vk_provider_workqueue_adds_total",
        "vk_provider_workqueue_queue_duration_seconds",
        "vk_provider_workqueue_work_duration_seconds",
        "vk_provider_workqueue_retries_total",
        "vk_provider_lease_renewal_failures_total",
    ):
        assert f"# TYPE {name} " in text


async def test_metrics_need_a_token_unless_open(world: World) -> None:
    async with client_for(world.app(open_metrics=False)) as http:
        assert_error(await http.get("/metrics"), 401, "unauthorized")
        response = await http.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert "vk_provider_pods" in response.text


# --------------------------------------------------------------------------- errors and secrets


async def test_an_internal_error_is_a_500_json_error_without_details(world: World) -> None:
    world.knobs.placements_error = RuntimeError(f"boom with {PLANTED_CREDENTIAL}")
    async with client_for(world.app(), raise_app_exceptions=False) as http:
        response = await http.get("/v1/pods", headers=AUTH)
    error = assert_error(response, 500, "internal_error")
    assert "log" in error["message"]
    assert "boom" not in response.text
    assert PLANTED_CREDENTIAL not in response.text


async def test_no_response_contains_a_token_or_a_credential(
    world: World, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = {"Authorization": f"Bearer {SECRET_TOKEN}-wrong"}
    responses = [await client.get(path, headers=AUTH) for path in V1_ROUTES]
    responses += [await client.get(path, headers=wrong) for path in V1_ROUTES]
    responses += [
        await client.get(path)
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", *V1_ROUTES)
    ]
    responses += [
        await client.get("/v1/providers/gamma", headers=AUTH),
        await client.get("/v1/providers/nope", headers=AUTH),
        await client.get("/v1/offers?capacity_type=x", headers=AUTH),
        await client.get(f"/v1/offers?gpu={SECRET_TOKEN[:6]}", headers=AUTH),
    ]
    assert len(responses) == 3 * len(V1_ROUTES) + 8
    for response in responses:
        exposed = response.text + "".join(f"{k}: {v}" for k, v in response.headers.items())
        assert SECRET_TOKEN not in exposed, response.request.url
        assert PLANTED_CREDENTIAL not in exposed, response.request.url
    assert SECRET_TOKEN not in caplog.text
    assert PLANTED_CREDENTIAL not in caplog.text


async def test_the_openapi_document_describes_auth_and_error_bodies(
    client: httpx.AsyncClient,
) -> None:
    document = (await client.get("/openapi.json")).json()
    assert document["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path in ("/v1/providers", "/v1/providers/{name}", "/v1/offers", "/v1/pods", "/v1/spend"):
        operation = document["paths"][path]["get"]
        assert operation["security"] == [{"HTTPBearer": []}]
        error_ref = operation["responses"]["401"]["content"]["application/json"]["schema"]
        assert error_ref == {"$ref": "#/components/schemas/ErrorBody"}
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "security" not in document["paths"][path]["get"]
    offers = document["paths"]["/v1/offers"]["get"]
    invalid = offers["responses"]["422"]["content"]["application/json"]["schema"]
    assert invalid == {"$ref": "#/components/schemas/ErrorBody"}
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert document["components"]["schemas"]["CapacityType"]["enum"] == ["on-demand", "spot", "any"]
    example = document["components"]["schemas"]["ProviderSummary"]["examples"][0]
    assert example["breaker_state"] == "closed"


# --------------------------------------------------------------------------- the server


async def test_rest_server_serves_on_a_free_port_and_stops(world: World) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = RestServer(app=world.app(), host="127.0.0.1", port=0)
    await server.start()
    try:
        assert server.port > 0
        # uvicorn did not take over the agent's signal handlers.
        assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            assert (await http.get("/healthz")).text == "ok"
            response = await http.get("/v1/providers", headers=AUTH)
            assert [p["name"] for p in response.json()] == ["alpha", "beta", "gamma"]
            assert "server" not in response.headers
        with pytest.raises(RuntimeError, match="already started"):
            await server.start()
    finally:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server.stop()
        assert loop.time() - started < 3
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as http:
            await http.get(f"http://127.0.0.1:{server.port}/healthz")
    await server.stop()  # idempotent
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


async def test_rest_server_start_fails_when_the_port_is_taken(world: World) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = RestServer(app=world.app(), host="127.0.0.1", port=port)
        with pytest.raises(OSError):
            await server.start()
    await server.stop()  # nothing to stop


async def test_rest_server_stop_is_bounded_with_a_request_in_flight(world: World) -> None:
    gate = asyncio.Event()

    class BlockingAuth:
        async def authenticate(self, token: str) -> str | None:
            gate.set()
            await asyncio.sleep(3600)
            return None

    server = RestServer(
        app=world.app(auth=BlockingAuth()), host="127.0.0.1", port=0, shutdown_timeout=0.5
    )
    await server.start()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
        request = asyncio.create_task(http.get("/v1/pods", headers=AUTH))
        await asyncio.wait_for(gate.wait(), 5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await server.stop()
        assert loop.time() - started < 3
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)


async def test_overdue_terminations_are_counted_per_provider(
    world: World, client: httpx.AsyncClient
) -> None:
    world.knobs.overdue = [("alpha", "i-1"), ("alpha", "i-2"), ("beta", "i-3")]
    providers = {p["name"]: p for p in (await client.get("/v1/providers", headers=AUTH)).json()}
    assert {n: p["terminations_overdue"] for n, p in providers.items()} == {
        "alpha": 2,
        "beta": 1,
        "gamma": 0,
    }
    text = (await client.get("/metrics")).text
    assert 'vk_provider_terminations_overdue{provider="alpha"} 2.0' in text
    assert 'vk_provider_terminations_overdue{provider="gamma"} 0.0' in text


# --------------------------------------------------------------------------- overflow

OPEN_FLIP = OverflowView(
    state=OverflowState.OPEN,
    since=datetime(2026, 12, 1, 10, 2, 11, tzinfo=UTC),
    signal_ok=True,
    signal_error="",
    reading=Reading(allocatable=32, requested=32, unscheduled=5),
    last_evaluation=datetime(2026, 12, 1, 10, 5, 1, tzinfo=UTC),
    needed_free_gpus=1,
    full_for_seconds=None,
    free_for_seconds=None,
    taint={
        "key": "virtual-kubelet.io/provider",
        "value": "vk-provider",
        "effect": "PreferNoSchedule",
    },
    transitions=1,
    held_open_for="the hand-over of PodGroup ml/train",
    handovers=(
        HandoverView(
            gang="PodGroup ml/train",
            gpus=32,
            members=4,
            step="evict",
            reason="moving 2 pod(s) off the claimed nodes",
            nodes=("gpu-1", "gpu-2"),
            displaced=("ml/infer-a", "ml/infer-b"),
            for_seconds=12.34,
        ),
    ),
)


async def test_overflow_says_open_since_when_and_the_numbers(
    world: World, client: httpx.AsyncClient
) -> None:
    world.knobs.overflow = OPEN_FLIP
    response = await client.get("/v1/overflow", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {
        "enabled": True,
        "state": "open",
        "since": "2026-12-01T10:02:11Z",
        "signal_ok": True,
        "signal_error": "",
        "reading": {"allocatable": 32.0, "requested": 32.0, "free": 0.0, "unscheduled": 5.0},
        "last_evaluation": "2026-12-01T10:05:01Z",
        "needed_free_gpus": 1,
        "full_for_seconds": None,
        "free_for_seconds": None,
        "taint": {
            "key": "virtual-kubelet.io/provider",
            "value": "vk-provider",
            "effect": "PreferNoSchedule",
        },
        "transitions": 1,
        "held_open_for": "the hand-over of PodGroup ml/train",
        "handovers": [
            {
                "gang": "PodGroup ml/train",
                "gpus": 32,
                "members": 4,
                "step": "evict",
                "reason": "moving 2 pod(s) off the claimed nodes",
                "nodes": ["gpu-1", "gpu-2"],
                "displaced": ["ml/infer-a", "ml/infer-b"],
                "for_seconds": 12.3,
            }
        ],
    }
    exposition = (await client.get("/metrics")).text
    assert sample(exposition, "vk_provider_overflow_open") == 1
    assert sample(exposition, "vk_provider_overflow_signal_up") == 1
    assert sample(exposition, 'vk_provider_overflow_own_gpus{kind="unscheduled"}') == 5


async def test_overflow_before_the_first_evaluation_and_when_disabled(world: World) -> None:
    async with client_for(world.app()) as http:
        waiting = (await http.get("/v1/overflow", headers=AUTH)).json()
    assert (waiting["enabled"], waiting["state"], waiting["reading"]) == (True, None, None)
    disabled = AgentView(
        providers={},
        provider_types={},
        offers=OfferBook({}, ttl_seconds=30),
        ledger=BudgetLedger(BudgetCaps()),
        placements=list,
        readiness=lambda: Readiness(ready=True, reasons=()),
    )
    metrics = Metrics()
    metrics.attach(disabled)
    app = build_app(view=disabled, metrics=metrics, auth=StaticTokenAuth(SECRET_TOKEN))
    async with client_for(app) as http:
        body = (await http.get("/v1/overflow", headers=AUTH)).json()
        exposition = (await http.get("/metrics")).text
    assert body["enabled"] is False and body["state"] is None
    assert "vk_provider_overflow_open" not in exposition
