"""The REST API (docs/reference.md#rest-api): providers, offers (flat and by GPU), pods, spend,
overflow, the placement dry run, health and metrics.

``build_app`` makes a FastAPI application that reads only from an ``AgentView`` (frozen
snapshots of the running agent) and a ``Metrics`` registry; ``rest_server.RestServer`` runs
it with uvicorn inside the agent's own event loop.

Invariants:
- Read-only: no route changes the agent. ``POST /v1/placements`` is a review, as a
  SubjectAccessReview is: it computes an answer (the same plan a launch makes) and launches,
  reserves and writes nothing. Every handler is ``async def`` so the view is read on the event
  loop thread, never from a worker thread while the controllers change it.
- The dry run never reads a Secret or ConfigMap and never returns a pod's environment: it
  places the pod without it (``controllers.preview``).
- Nothing secret leaves: response models are built field by field from the view's snapshots
  (which hold no configuration), error bodies carry a fixed code and a message we wrote —
  never an exception's text or a traceback — and tokens are neither logged nor echoed.
- Every ``/v1/*`` route needs ``Authorization: Bearer <token>`` and is authorised
  (``rest_auth``: a SubjectAccessReview on ``vk-provider.io`` resources in cluster);
  ``/metrics`` too unless ``open_metrics``; ``/healthz``, ``/readyz`` and ``/openapi.json``
  are open. Missing or refused credentials answer 401 with ``WWW-Authenticate: Bearer``, a
  token without the right 403; a reviewer that cannot tell (the API server is down) answers
  503, so a caller retries instead of giving up. A replica that is not the leader answers
  every authorised ``/v1`` call 503 "not the leader (<holder> leads)" and ``/readyz`` 503 with
  the same reason, so a Service routes to the leader only.
- Every error is JSON ``{"error": {"code": ..., "message": ...}}`` (401, 403, 404, 405, 422,
  500, 503), and the OpenAPI document says so for each route.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from vk_provider import __version__
from vk_provider.api.authn import RequestAttributes
from vk_provider.api.metrics import CONTENT_TYPE, Metrics
from vk_provider.api.operator_schemas import GpuCatalogOut, PlacementOut
from vk_provider.api.rest_auth import RestAuth, access, non_resource, resource
from vk_provider.api.schemas import (
    ErrorBody,
    ErrorDetail,
    OfferOut,
    OverflowOut,
    PodOut,
    ProviderDetail,
    ProviderSummary,
    ReadinessOut,
    SpendReport,
    spend_report,
)
from vk_provider.api.view import AgentView
from vk_provider.domain.catalog import catalog
from vk_provider.domain.models import Offer
from vk_provider.domain.placement import CapacityType, gpu_matches

_ERROR_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    422: "invalid_request",
    500: "internal_error",
    503: "unavailable",
}


# --------------------------------------------------------------------------- pure helpers


def filter_offers(
    offers: Sequence[Offer],
    *,
    gpu: str | None = None,
    region: str | None = None,
    provider: str | None = None,
    capacity_type: CapacityType = CapacityType.ANY,
) -> list[Offer]:
    """The offers that match every given filter; each filter takes a comma-separated list.

    ``gpu`` matches as placement does (``H100`` matches ``H100-SXM``); regions and providers
    match exactly; ``capacity_type`` keeps spot, on-demand or both.
    """
    gpus, regions, providers = _split(gpu), _split(region), _split(provider)
    return [
        o
        for o in offers
        if (not gpus or any(gpu_matches(g, o.gpu_model) for g in gpus))
        and (not regions or o.region in regions)
        and (not providers or o.provider in providers)
        and (capacity_type is CapacityType.ANY or o.spot == (capacity_type is CapacityType.SPOT))
    ]


def _split(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _error(status: int, message: str, *, headers: Mapping[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=_ERROR_CODES.get(status, "error"), message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _validation_message(exc: RequestValidationError) -> str:
    # Location and reason only: the rejected input is the caller's own and may be large.
    parts = []
    for item in exc.errors():
        location = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{location}: {item.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


# --------------------------------------------------------------------------- the application

_ERROR_RESPONSE: dict[str, Any] = {"model": ErrorBody}
_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {**_ERROR_RESPONSE, "description": "No bearer token, or the token was refused."},
    403: {
        **_ERROR_RESPONSE,
        "description": "The token's identity may not read this (RBAC, group vk-provider.io).",
    },
    503: {**_ERROR_RESPONSE, "description": "The token cannot be checked now; retry."},
    500: {**_ERROR_RESPONSE, "description": "Internal error (details only in the agent's log)."},
}
_INVALID_RESPONSE: dict[int | str, dict[str, Any]] = {
    422: {**_ERROR_RESPONSE, "description": "A parameter is invalid; the message names it."},
}
_TEXT_RESPONSE: dict[str, Any] = {"content": {"text/plain": {"schema": {"type": "string"}}}}


def build_app(
    *, view: AgentView, metrics: Metrics, auth: RestAuth, open_metrics: bool = True
) -> FastAPI:
    """The REST API application over ``view``; see the module docstring for its invariants."""
    app = FastAPI(
        title="vk-provider",
        version=__version__,
        description="Status of a vk-provider agent: its GPU providers, their offers, the pods "
        "it runs and what they cost. Every /v1 route needs `Authorization: Bearer <token>`.",
        # The interactive docs load scripts from a CDN; the agent serves only its own bytes.
        docs_url=None,
        redoc_url=None,
    )

    async def leader_only() -> None:
        # A follower's view is empty (it runs nothing): saying so beats answering from it.
        reason = view.not_leading()
        if reason is not None:
            raise HTTPException(503, f"{reason}: ask the leader (the Service routes to it)")

    def may(attributes: RequestAttributes) -> list[Any]:
        # Authorised first, so a follower answers 401/403 exactly as the leader would.
        return [Depends(access(auth, attributes)), Depends(leader_only)]

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        return _error(422, _validation_message(exc))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        # Starlette re-raises after this response is sent, so the server logs the traceback;
        # the caller only learns that it failed.
        return _error(500, "internal error; the agent's log has the details")

    @app.get(
        "/v1/providers",
        response_model=list[ProviderSummary],
        dependencies=may(resource("providers", "list")),
        responses=_AUTH_RESPONSES,
        tags=["providers"],
        summary="Every provider: health, circuit breaker, capacity, pods, $/hour",
    )
    async def list_providers() -> list[ProviderSummary]:
        return [ProviderSummary.of(status) for status in view.providers()]

    @app.get(
        "/v1/providers/{name}",
        response_model=ProviderDetail,
        dependencies=may(resource("providers", "get")),
        responses={
            **_AUTH_RESPONSES,
            **_INVALID_RESPONSE,
            404: {**_ERROR_RESPONSE, "description": "No provider has this name."},
        },
        tags=["providers"],
        summary="One provider, with its offers",
    )
    async def get_provider(name: str) -> ProviderDetail:
        status = view.provider(name)
        if status is None:
            raise HTTPException(404, f"no provider named {name!r}")
        return ProviderDetail.of(status)

    @app.get(
        "/v1/offers",
        response_model=list[OfferOut],
        dependencies=may(resource("offers", "list")),
        responses={**_AUTH_RESPONSES, **_INVALID_RESPONSE},
        tags=["offers"],
        summary="Known offers, cheapest first, optionally filtered",
    )
    async def list_offers(
        gpu: Annotated[
            str | None,
            Query(
                description="GPU models, comma-separated; H100 matches every H100 variant.",
                examples=["H100"],
            ),
        ] = None,
        region: Annotated[str | None, Query(description="Regions, comma-separated, exact.")] = None,
        provider: Annotated[
            str | None, Query(description="Provider names, comma-separated.")
        ] = None,
        capacity_type: Annotated[
            CapacityType, Query(description="on-demand, spot, or any (both).")
        ] = CapacityType.ANY,
    ) -> list[OfferOut]:
        offers = filter_offers(
            view.offers(),
            gpu=gpu,
            region=region,
            provider=provider,
            capacity_type=capacity_type,
        )
        return [OfferOut.of(o) for o in offers]

    @app.get(
        "/v1/gpus",
        response_model=GpuCatalogOut,
        dependencies=may(resource("offers", "list")),
        responses={**_AUTH_RESPONSES, **_INVALID_RESPONSE},
        tags=["offers"],
        summary="Offers grouped by GPU model, per-GPU prices, on-demand and spot side by side",
        description="What `vk-provider offers` prints. One row per instance type and region "
        "(the spot and the on-demand offer of one provider/sku/region share a row); rows "
        "cheapest per GPU first, GPU models by their cheapest row, CPU-only offers last. "
        "Authorised as `list offers`: the same offers as `GET /v1/offers`, arranged.",
    )
    async def list_gpus(
        gpu: Annotated[
            str | None,
            Query(
                description="GPU models, comma-separated; H100 matches every H100 variant.",
                examples=["H100"],
            ),
        ] = None,
        region: Annotated[str | None, Query(description="Regions, comma-separated, exact.")] = None,
        provider: Annotated[
            str | None, Query(description="Provider names, comma-separated.")
        ] = None,
        capacity_type: Annotated[
            CapacityType,
            Query(description="on-demand, spot (rows with a spot price, sorted by it), or any."),
        ] = CapacityType.ANY,
        limit: Annotated[
            int,
            Query(ge=0, le=10_000, description="Rows per GPU model at most; 0 shows all."),
        ] = 0,
    ) -> GpuCatalogOut:
        offers = filter_offers(
            view.offers(),
            gpu=gpu,
            region=region,
            provider=provider,
            capacity_type=capacity_type,
        )
        found = catalog(offers, limit=limit or None, spot_first=capacity_type is CapacityType.SPOT)
        return GpuCatalogOut.of(found)

    @app.post(
        "/v1/placements",
        response_model=PlacementOut,
        dependencies=may(resource("placements", "create")),
        responses={
            **_AUTH_RESPONSES,
            400: {**_ERROR_RESPONSE, "description": "The body is not JSON."},
            422: {
                **_ERROR_RESPONSE,
                "description": "The body is not a Pod object; the message says why.",
            },
        },
        tags=["placements"],
        summary="Dry run: where a pod would be placed now, and why (nothing is launched)",
        description="Runs the agent's own placement for a pod, as for its first launch: the "
        "live offers, budget caps, breaker states and offer blocks. Answers the ranked "
        "candidates, the offer a launch would try first, and for every other offer the filter "
        "that refused it and why. Nothing is launched, reserved or written; the pod's "
        "environment is not read (placement does not depend on it), so no Secret is needed "
        "and none is returned. Authorised as `create placements` (a review, as "
        "SubjectAccessReview is).",
    )
    async def create_placement(
        pod: Annotated[
            dict[str, Any],
            Body(
                description="A Pod (core/v1) as JSON: `kubectl get pod -o json`, or a "
                "manifest; namespace, name and uid may be missing.",
                examples=[
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": "llama",
                            "annotations": {"vk-provider.io/gpu": "H100"},
                        },
                        "spec": {
                            "containers": [
                                {
                                    "name": "server",
                                    "image": "vllm/vllm-openai:latest",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                }
                            ]
                        },
                    }
                ],
            ),
        ],
    ) -> PlacementOut:
        kind = pod.get("kind", "Pod")
        if kind != "Pod":
            raise HTTPException(
                422, f"kind must be Pod, not {str(kind)[:40]!r} (send a workload's pod template)"
            )
        if not view.can_place:
            raise HTTPException(503, "this agent offers no placement dry run")
        return PlacementOut.of(await view.place(pod))

    @app.get(
        "/v1/pods",
        response_model=list[PodOut],
        dependencies=may(resource("pods", "list")),
        responses=_AUTH_RESPONSES,
        tags=["pods"],
        summary="Where each pod runs, since when, at what price",
    )
    async def list_pods() -> list[PodOut]:
        reached = view.endpoints()
        return [
            PodOut.of(pod, reached.get((pod.provider, pod.instance_id), ())) for pod in view.pods()
        ]

    @app.get(
        "/v1/spend",
        response_model=SpendReport,
        dependencies=may(resource("spend", "get")),
        responses=_AUTH_RESPONSES,
        tags=["spend"],
        summary="Current $/hour and accumulated $ per provider and per namespace",
    )
    async def get_spend() -> SpendReport:
        return spend_report(view)

    @app.get(
        "/v1/overflow",
        response_model=OverflowOut,
        dependencies=may(resource("overflow", "get")),
        responses=_AUTH_RESPONSES,
        tags=["overflow"],
        summary="The overflow flip: open or closed, since when, the numbers behind it",
    )
    async def get_overflow() -> OverflowOut:
        return OverflowOut.of(view.overflow(), enabled=view.overflow_enabled)

    @app.get(
        "/healthz",
        response_class=PlainTextResponse,
        responses={200: _TEXT_RESPONSE},
        tags=["health"],
        summary="Liveness: 200 while the process serves",
    )
    async def healthz() -> str:
        return "ok"

    @app.get(
        "/readyz",
        response_model=ReadinessOut,
        responses={503: {"model": ReadinessOut, "description": "Not ready; reasons given."}},
        tags=["health"],
        summary="Readiness: 200 when the agent serves its node, else 503 with the reasons",
    )
    async def readyz() -> Response:
        readiness = view.readiness()
        body = ReadinessOut(ready=readiness.ready, reasons=list(readiness.reasons))
        return JSONResponse(body.model_dump(), status_code=200 if readiness.ready else 503)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        dependencies=[] if open_metrics else may(non_resource("/metrics")),
        responses={200: _TEXT_RESPONSE, **({} if open_metrics else _AUTH_RESPONSES)},
        tags=["health"],
        summary="Prometheus metrics (text exposition format 0.0.4)",
    )
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    return app
