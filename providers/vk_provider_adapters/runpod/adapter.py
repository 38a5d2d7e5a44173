"""The RunPod adapter: pods on RunPod's GPU cloud behind ``domain.contract.Provider``.

Three RunPod APIs, each for what it does best (shapes from ``tests/fixtures/provider-apis``):

- **Offers and running state: GraphQL** (``config.graphql_url``): ``gpuTypes`` gives every GPU
  type, its prices and its stock in one request (``vk_provider_adapters.runpod.offers``); ``myself {
  pods { id runtime } }`` says which pods' containers are up, which no v1 field does.
- **Pods: REST v1** (``config.rest_url``): ``POST /pods``, ``GET /pods``, ``GET /pods/{id}``,
  ``DELETE /pods/{id}`` (bodies and states: ``vk_provider_adapters.runpod.pods``).
- **Logs: REST v2** (``config.logs_url``): ``GET /pods/{id}/logs?source=container`` streams
  Server-Sent Events; the adapter follows the stream, so ``follow_logs`` is supported
  (``vk_provider_adapters.runpod.logs``).

Every request goes through ``vk_provider_adapters.http.JsonApi``; its failures are classified by
``vk_provider_adapters.runpod.failures``. ``create`` first looks for a pod of the request's name and
returns it; the lookup and the ``POST`` are retried together, never the ``POST`` alone, so a
retried create never makes a second pod. Retries live at the transport (``RetryPolicy``):
``Transient`` and ``RateLimited`` whose ``Retry-After`` is short are retried with exponential
backoff, then the classified error is raised.

Invariants:
- The API key is resolved once at construction, sent only in the ``Authorization`` header, and
  removed from every message this adapter produces; secret environment values (``EnvVar.secret``)
  go into the pod's ``env`` (RunPod v1 has no secret store) and are likewise never logged nor
  put into an exception.
- Only ``domain.errors`` escape the public methods.
- Payload builders and parsers are pure (the modules beside this one); the HTTP layer is
  ``vk_provider_adapters.http``.

Known limits: RunPod's terminate has no grace period (``grace_seconds`` is not honoured);
``workingDir`` cannot be set (ignored with a warning); UDP ports cannot be exposed (skipped);
TCP ports are exposed as ``<port>/tcp`` on the public IP (``expose: http``: through RunPod's
HTTPS proxy) and reported as ``Instance.endpoints`` (``pods.reached_at``); a ``command``
without ``args`` still gets the image's CMD appended (``dockerStartCmd: []`` means "the
image's"); v1 takes no spot bid, so RunPod applies its own; a log read without ``follow`` ends
when the backfill has been quiet for ``log_idle_seconds``, because the endpoint only streams.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime

import httpx

from vk_provider.sdk import (
    Capabilities,
    CapacityUnavailable,
    Instance,
    InstanceState,
    InvalidSpec,
    LogOptions,
    NotFound,
    Offer,
    ProviderError,
    Redactor,
    WorkloadSpec,
)
from vk_provider_adapters.http import Classify, ErrorAnswer, JsonApi
from vk_provider_adapters.payload import MalformedResponse
from vk_provider_adapters.runpod.config import RunPodProviderConfig
from vk_provider_adapters.runpod.failures import Operation, classify_answer, graphql_failure
from vk_provider_adapters.runpod.logs import SseDecoder, log_params
from vk_provider_adapters.runpod.offers import (
    OfferScope,
    Sku,
    graphql_data,
    offers_query,
    parse_offers,
    refused_gpu_types,
)
from vk_provider_adapters.runpod.pods import (
    NAME_PREFIX,
    RUNTIMES_QUERY,
    build_create_body,
    needs_runtime,
    parse_instance,
    parse_runtimes,
    with_runtime,
)
from vk_provider_adapters.transport import RetryPolicy

log = logging.getLogger(__name__)


class RunPodProvider:
    """``domain.contract.Provider`` on RunPod (see the module docstring)."""

    def __init__(
        self,
        config: RunPodProviderConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        log_idle_seconds: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        """``transport`` is the test seam; ``log_idle_seconds`` ends a non-following log
        read once the backfill has gone quiet (the endpoint only ever streams)."""
        self._config = config
        self._scope = OfferScope.from_config(config)
        api_key = config.api_key.resolve()
        self._log_idle = log_idle_seconds
        self._clock = clock
        self._rest = config.rest_url.rstrip("/")
        self._logs = config.logs_url.rstrip("/")
        self._api = JsonApi(
            provider=config.name,
            label="RunPod",
            classify=self._classify(Operation.READ),
            redactor=Redactor((api_key,)),
            retry=retry or RetryPolicy(),
            timeout=config.timeout_seconds,
            auth_headers={"Authorization": f"Bearer {api_key}"},
            transport=transport,
            logger=log,
        )
        # Pods we asked to terminate: they report TERMINATING/TERMINATED rather than LOST.
        self._deleting: set[str] = set()
        # GPU types already warned about (create would refuse them): one warning each.
        self._refused_gpu_types: set[str] = set()

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logs=True, follow_logs=True, log_timestamps=True)

    async def offers(self) -> list[Offer]:
        query = offers_query(self._scope)
        what = "offers (gpuTypes)"

        async def attempt() -> object:
            return await self._graphql(query, what=what)

        data = await self._api.retrying(attempt)
        with self._api.readable(what):
            offers = parse_offers(data, self._scope)
        refused = [
            t for t in refused_gpu_types(data, self._scope) if t not in self._refused_gpu_types
        ]
        if refused:
            self._refused_gpu_types.update(refused)
            log.warning(
                "provider %s: not offering GPU types RunPod's create does not accept: %s",
                self.name,
                ", ".join(refused),
            )
        return offers

    async def create(self, spec: WorkloadSpec, offer: Offer) -> Instance:
        sku = Sku.parse(offer.sku)
        if sku is None or offer.provider != self.name:
            raise CapacityUnavailable(
                f"offer {offer.key} is not a RunPod offer", provider=self.name
            )
        try:
            body = build_create_body(
                spec,
                sku,
                region=offer.region,
                container_disk_gb=self._config.container_disk_gb,
                offer_key=offer.key,
                expose=self._config.expose,
            )
        except InvalidSpec as exc:
            raise InvalidSpec(str(exc), provider=self.name, field=exc.field) from None
        self._warn_unsupported(spec)
        redact = self._api.redactor.with_secrets(spec.secret_values)

        # The lookup and the POST are retried together: a POST whose answer was lost is found
        # by the next attempt's lookup instead of being sent twice.
        async def attempt() -> Instance:
            return await self._create_once(spec, body, redact)

        return await self._api.retrying(attempt)

    async def get(self, instance_id: str) -> Instance:
        what = f"get pod {instance_id!r}"
        url = self._pod_url(instance_id)
        try:
            pod = await self._api.retrying(
                lambda: self._json_once(url, what, self._classify(Operation.POD))
            )
        except NotFound:
            self._deleting.discard(instance_id)
            raise
        if needs_runtime(pod):
            runtimes = await self._api.retrying(lambda: self._runtimes([pod]))
            pod = with_runtime(pod, runtimes)
        with self._api.readable(what):
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
        if instance is None:
            raise NotFound(f"RunPod pod {instance_id!r} is not one of ours", provider=self.name)
        return instance

    async def delete(self, instance_id: str, *, grace_seconds: float) -> None:
        """Terminate now: RunPod's terminate has no grace period."""
        if not instance_id:
            return
        self._deleting.add(instance_id)
        try:
            await self._api.request(
                "DELETE",
                self._pod_url(instance_id),
                what=f"delete pod {instance_id!r}",
                classify=self._classify(Operation.POD),
            )
        except NotFound:
            self._deleting.discard(instance_id)  # already gone: done
            return
        log.info("provider %s: terminating RunPod pod %s", self.name, instance_id)

    async def list_ours(self) -> list[Instance]:
        what = "list pods"
        pods = await self._api.retrying(lambda: self._json_once(f"{self._rest}/pods", what))
        with self._api.readable(what):
            listed = self._listed(pods)
        runtimes = await self._api.retrying(lambda: self._runtimes(listed))
        with self._api.readable(what):
            found = self._ours([with_runtime(pod, runtimes) for pod in listed])
        # Forget deletions RunPod no longer lists: they are done (this bounds the set).
        self._deleting &= {i.instance_id for i in found}
        return [i for i in found if i.state is not InstanceState.TERMINATED]

    async def logs(self, instance_id: str, options: LogOptions) -> AsyncIterator[bytes]:
        what = f"logs of pod {instance_id!r}"
        url = f"{self._logs}/pods/{urllib.parse.quote(instance_id, safe='')}/logs"

        async def attempt() -> httpx.Response:
            return await self._api.send(
                "GET",
                url,
                what=what,
                params=log_params(options, now=self._clock()),
                headers={"Accept": "text/event-stream"},
                classify=self._classify(Operation.POD),
                stream=True,
                follow=options.follow,
            )

        response = await self._api.retrying(attempt)
        try:
            async for chunk in self._log_chunks(response, options, what):
                yield chunk
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._api.aclose()

    # --- internals ------------------------------------------------------------------------

    def _classify(self, operation: Operation) -> Classify:
        def classify(answer: ErrorAnswer) -> ProviderError:
            return classify_answer(
                answer, provider=self.name, operation=operation, now=self._clock()
            )

        return classify

    async def _json_once(self, url: str, what: str, classify: Classify | None = None) -> object:
        """One GET and its JSON (the caller retries both: a truncated answer is retried)."""
        response = await self._api.send("GET", url, what=what, classify=classify)
        return self._api.decode(response, what)

    def _warn_unsupported(self, spec: WorkloadSpec) -> None:
        if spec.main.working_dir:
            log.warning("pod %s: RunPod cannot set workingDir; the image's applies", spec.pod_uid)
        for port in spec.main.ports:
            if port.protocol.upper() != "TCP":
                log.warning(
                    "pod %s: RunPod cannot expose %s port %d; not exposed",
                    spec.pod_uid,
                    port.protocol,
                    port.container_port,
                )

    async def _create_once(
        self, spec: WorkloadSpec, body: Mapping[str, object], redact: Redactor
    ) -> Instance:
        existing = await self._find(spec.request_id, redact)
        if existing is not None:
            return existing
        what = f"create pod for {spec.request_id}"
        response = await self._api.send(
            "POST",
            f"{self._rest}/pods",
            what=what,
            json_body=body,
            classify=self._classify(Operation.CREATE),
            redact=redact,
        )
        pod = self._api.decode(response, what)
        with self._api.readable(what):
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
            if instance is None:
                raise MalformedResponse(f"{what}: the created pod does not carry our name")
        log.info(
            "provider %s: created RunPod pod %s for %s (%s)",
            self.name,
            instance.instance_id,
            spec.request_id,
            body.get("gpuTypeIds"),
        )
        return instance

    async def _find(self, request_id: str, redact: Redactor) -> Instance | None:
        """Our pod for ``request_id``, live ones first; one attempt (the caller retries)."""
        name = f"{NAME_PREFIX}{request_id}"
        what = f"look up pod {name}"
        response = await self._api.send(
            "GET", f"{self._rest}/pods", what=what, params={"name": name}, redact=redact
        )
        pods = self._api.decode(response, what)
        with self._api.readable(what):
            listed = self._listed(pods)
        runtimes = await self._runtimes(listed, redact)
        with self._api.readable(what):
            listed = [with_runtime(pod, runtimes) for pod in listed]
            mine = [i for i in self._ours(listed) if f"{i.pod_uid}.{i.attempt}" == request_id]
        mine.sort(key=lambda i: i.state in (InstanceState.TERMINATED, InstanceState.LOST))
        return mine[0] if mine else None

    @staticmethod
    def _listed(pods: object) -> list[object]:
        if not isinstance(pods, list):
            raise MalformedResponse("the pod list is not a JSON array")
        return pods

    async def _runtimes(
        self, pods: list[object], redact: Redactor | None = None
    ) -> dict[str, object]:
        """GraphQL's ``runtime`` of every pod, when one of ``pods`` needs it to tell STARTING
        from RUNNING (one request; the caller retries)."""
        if not any(needs_runtime(pod) for pod in pods):
            return {}
        what = "pod runtimes (myself.pods)"
        data = await self._graphql(RUNTIMES_QUERY, what=what, redact=redact)
        with self._api.readable(what):
            return parse_runtimes(data)

    def _ours(self, pods: list[object]) -> list[Instance]:
        found = []
        for pod in pods:
            if not isinstance(pod, dict):
                continue  # not readable, so not provably ours
            instance = parse_instance(pod, provider=self.name, deleting=self._deleting.__contains__)
            if instance is not None:
                found.append(instance)
        return found

    def _pod_url(self, instance_id: str) -> str:
        if not instance_id:
            raise NotFound("no RunPod pod has an empty id", provider=self.name)
        return f"{self._rest}/pods/{urllib.parse.quote(instance_id, safe='')}"

    async def _graphql(self, query: str, *, what: str, redact: Redactor | None = None) -> object:
        redact = redact or self._api.redactor
        response = await self._api.send(
            "POST", self._config.graphql_url, what=what, json_body={"query": query}, redact=redact
        )
        body = self._api.decode(response, what)
        with self._api.readable(what):
            data, errors = graphql_data(body)
        if errors:
            raise graphql_failure(errors, provider=self.name, what=what, redact=redact)
        return data

    async def _log_chunks(
        self, response: httpx.Response, options: LogOptions, what: str
    ) -> AsyncIterator[bytes]:
        decoder = SseDecoder()
        left = options.limit_bytes
        lines = self._api.lines(response, what)
        while True:
            line = await self._next_line(lines, follow=options.follow)
            event = decoder.flush() if line is None else decoder.feed(line)
            if event is not None:
                chunk = event.render(timestamps=options.timestamps)
                if left is not None:
                    chunk, left = chunk[:left], left - min(left, len(chunk))
                if chunk:
                    yield chunk
                if left is not None and left <= 0:
                    return
            if line is None:
                return

    async def _next_line(self, lines: AsyncIterator[str], *, follow: bool) -> str | None:
        """The next line; None at the end of the stream, or — when not following — once the
        backfill has been quiet for ``log_idle_seconds``."""
        try:
            if follow:
                return await anext(lines)
            async with asyncio.timeout(self._log_idle):
                return await anext(lines)
        except (StopAsyncIteration, TimeoutError):
            return None
