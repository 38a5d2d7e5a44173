"""The kubelet HTTPS API of the virtual node: the server, its authentication, and logs.

The API server reaches a node's kubelet on port 10250 for ``kubectl logs``, ``exec``,
``attach``, ``port-forward`` and the node proxy; metrics-server scrapes it for ``kubectl top``.
This module serves that API with aiohttp, authenticating and authorising callers exactly as a
kubelet started with ``--anonymous-auth=false --authorization-mode=Webhook`` does:

1. Authentication: a client certificate verified against ``client_ca_file`` (CN → user name,
   O → groups) or else an ``Authorization: Bearer`` token handed to an :class:`Authenticator`
   (a cached TokenReview in the agent). Every authenticated user also gets the group
   ``system:authenticated``. Nothing else is accepted: no identity → 401.
2. Authorisation: every request, ``/healthz`` and unknown paths included, is checked by an
   :class:`Authorizer` (a SubjectAccessReview in the agent) on ``nodes/<subresource>`` of this
   node, with the verb and subresource derived from method and path as kubelet's ``auth.go``
   does (:func:`request_attributes`). Deny → 403.
3. Logs come from a :class:`LogSource` and are streamed chunk by chunk, so ``kubectl logs -f``
   sees each line as soon as the provider yields it; ``previous`` and the container name are
   passed on (``--previous`` is the source's to answer).

The other routes live beside this module, each with the protocol of its source:
``kubelet_pods`` (``/pods``, ``/runningpods/``), ``kubelet_stats`` (``/stats/summary``,
``/metrics/resource``) and ``streaming`` (``/exec``, ``/attach``, ``/portForward``). A route
whose source is not given is not served (404), as kubelet without that handler.

Invariants:
- This module never imports the Kubernetes client; identity, authorisation and logs are
  injected through the three protocols below.
- Bearer tokens and ``Authorization`` headers are never logged; the access log is off.
- A log or exec/port-forward stream never outlives its request: when the client goes away
  (aiohttp cancels the handler) or the server stops (``on_shutdown`` cancels open streams),
  the log iterator, command or port is closed, so nothing at the provider is left open.
- ``KubeletApiServer.stop()`` is bounded: open streams are cancelled first and the remaining
  requests get ``shutdown_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import math
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from vk_provider.api.authn import (
    AUTHENTICATED_GROUP,
    Authenticator,
    Authorizer,
    UserInfo,
    bearer_token,
    request_attributes,
    user_from_certificate,
)
from vk_provider.api.kubelet_pods import NodePods, add_pod_routes
from vk_provider.api.kubelet_stats import StatsSource, add_stats_routes
from vk_provider.api.streaming import ContainerStreams, add_streaming_routes
from vk_provider.domain.models import LogOptions

logger = logging.getLogger(__name__)


_INT64_MAX = 2**63 - 1
_INTEGER = re.compile(r"[+-]?[0-9]+")


# --------------------------------------------------------------------------- interfaces


class LogsError(Exception):
    """Logs cannot be served; the message is shown to the ``kubectl logs`` user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LogsNotFound(LogsError):
    """The pod or container is not known on this node (HTTP 404)."""


class LogsUnavailable(LogsError):
    """The container exists but has no logs to give yet, e.g. it is still starting (HTTP 400)."""


class LogSource(Protocol):
    async def open_logs(
        self, namespace: str, pod: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        """Open the logs of one container and return an iterator over their bytes.

        This is a coroutine that *returns* the iterator (it is not itself an async generator),
        so that :class:`LogsNotFound` and :class:`LogsUnavailable` are raised before the
        response status is sent. With ``options.follow`` the iterator ends when the container
        ends; it is closed (``aclose``) early when the client goes away.
        """
        ...


# --------------------------------------------------------------------------- pure helpers


class InvalidLogQuery(ValueError):
    """A ``/containerLogs`` query parameter is malformed; the message names it."""


def parse_log_options(query: Mapping[str, str], *, now: dt.datetime) -> LogOptions:
    """Translate the query of ``/containerLogs`` into :class:`LogOptions`.

    Booleans follow Kubernetes' query conversion (absent, ``0`` or ``false`` is false, any
    other value true); integers must be decimal and in range, as ``ValidatePodLogOptions``
    demands. ``sinceTime`` (RFC 3339) becomes ``since_seconds`` relative to ``now``.
    """
    tail_lines = _query_int(query, "tailLines", minimum=0)
    since_seconds = _query_int(query, "sinceSeconds", minimum=1)
    limit_bytes = _query_int(query, "limitBytes", minimum=1)
    since_time = query.get("sinceTime")
    if since_time is not None:
        if since_seconds is not None:
            raise InvalidLogQuery("at most one of sinceTime or sinceSeconds may be specified")
        since_seconds = _seconds_since(since_time, now=now)
    return LogOptions(
        tail_lines=tail_lines,
        follow=_query_bool(query, "follow"),
        timestamps=_query_bool(query, "timestamps"),
        since_seconds=since_seconds,
        limit_bytes=limit_bytes,
        previous=_query_bool(query, "previous"),
    )


def _query_bool(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name)
    if value is None:
        return False
    return not (value == "0" or value.lower() == "false")


def _query_int(query: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    value = query.get(name)
    if value is None:
        return None
    if not _INTEGER.fullmatch(value) or not -_INT64_MAX - 1 <= int(value) <= _INT64_MAX:
        raise InvalidLogQuery(f"{name}: invalid integer {value!r}")
    number = int(value)
    if number < minimum:
        raise InvalidLogQuery(f"{name}: must be greater than or equal to {minimum}")
    return number


def _seconds_since(value: str, *, now: dt.datetime) -> int:
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidLogQuery(f"sinceTime: invalid RFC 3339 time {value!r}") from None
    if moment.tzinfo is None:
        raise InvalidLogQuery(f"sinceTime: {value!r} has no time zone")
    # A moment in the future asks for (almost) nothing; sinceSeconds cannot be below 1.
    return max(1, math.ceil((now - moment).total_seconds()))


# --------------------------------------------------------------------------- application


@dataclass(slots=True)
class _ApiState:
    node_name: str
    authenticator: Authenticator
    authorizer: Authorizer
    logs: LogSource
    # Handler tasks of open log streams, cancelled when the server shuts down.
    streams: set[asyncio.Task[object]] = field(default_factory=set)


_STATE = web.AppKey("kubelet_api_state", _ApiState)

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class KubeletSources:
    """Where the routes beside ``/containerLogs`` get their answers; None: not served."""

    pods: NodePods | None = None
    stats: StatsSource | None = None
    streams: ContainerStreams | None = None


def build_app(
    *,
    node_name: str,
    authenticator: Authenticator,
    authorizer: Authorizer,
    logs: LogSource,
    sources: KubeletSources = KubeletSources(),
) -> web.Application:
    """The aiohttp application of the kubelet API, without a listener (tests use it too)."""
    app = web.Application(middlewares=[_authenticate_and_authorize])
    state = _ApiState(
        node_name=node_name, authenticator=authenticator, authorizer=authorizer, logs=logs
    )
    app[_STATE] = state
    app.router.add_get("/healthz", _healthz)
    # No HEAD: a HEAD of a follow stream would open provider logs and never finish.
    app.router.add_get(
        "/containerLogs/{namespace}/{pod}/{container}", _container_logs, allow_head=False
    )
    if sources.pods is not None:
        add_pod_routes(app, sources.pods)
    if sources.stats is not None:
        add_stats_routes(app, sources.stats)
    if sources.streams is not None:
        add_streaming_routes(app, sources.streams, open_tasks=state.streams)
    app.on_shutdown.append(_cancel_streams)
    return app


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message, content_type="text/plain")


@web.middleware
async def _authenticate_and_authorize(
    request: web.Request, handler: _Handler
) -> web.StreamResponse:
    state = request.app[_STATE]
    user = await _authenticate(request, state.authenticator)
    if user is None:
        logger.debug("kubelet API: unauthenticated %s %s", request.method, request.path)
        return _text(401, "Unauthorized")
    attributes = request_attributes(request.method, request.path, state.node_name)
    described = (
        f"user={user.username}, verb={attributes.verb}, resource={attributes.resource}, "
        f"subresource(s)=[{attributes.subresource}]"
    )
    try:
        allowed = await state.authorizer.authorize(user, attributes)
    except Exception:
        logger.exception("kubelet API: authorisation failed (%s)", described)
        return _text(500, f"Authorization error ({described})")
    if not allowed:
        logger.debug("kubelet API: forbidden %s %s (%s)", request.method, request.path, described)
        return _text(403, f"Forbidden ({described})")
    return await handler(request)


async def _authenticate(request: web.Request, authenticator: Authenticator) -> UserInfo | None:
    user = _certificate_user(request)
    if user is None:
        token = bearer_token(request.headers.get("Authorization"))
        if token is None:
            return None
        try:
            user = await authenticator.authenticate_token(token)
        except Exception as exc:
            # The exception text is ours (the agent's), but be safe: no traceback, no token.
            logger.warning("kubelet API: token review failed: %s", type(exc).__name__)
            return None
        if user is None:
            return None
    if AUTHENTICATED_GROUP not in user.groups:
        user = UserInfo(user.username, (*user.groups, AUTHENTICATED_GROUP), user.uid)
    return user


def _certificate_user(request: web.Request) -> UserInfo | None:
    transport = request.transport
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if not isinstance(ssl_object, ssl.SSLObject):
        return None
    # The dict form is empty unless OpenSSL verified the chain against client_ca_file; only
    # then is the certificate an identity. (With CERT_NONE no certificate is even requested.)
    if not ssl_object.getpeercert():
        return None
    der = ssl_object.getpeercert(binary_form=True)
    return user_from_certificate(der) if der else None


async def _healthz(request: web.Request) -> web.StreamResponse:
    return _text(200, "ok")


async def _cancel_streams(app: web.Application) -> None:
    streams = app[_STATE].streams
    for task in list(streams):
        task.cancel()


async def _container_logs(request: web.Request) -> web.StreamResponse:
    state = request.app[_STATE]
    namespace = request.match_info["namespace"]
    pod = request.match_info["pod"]
    container = request.match_info["container"]
    try:
        options = parse_log_options(request.query, now=dt.datetime.now(dt.UTC))
    except InvalidLogQuery as exc:
        return _text(400, str(exc))
    task = asyncio.current_task()
    if task is not None:
        state.streams.add(task)
    try:
        try:
            chunks = await state.logs.open_logs(namespace, pod, container, options)
        except LogsNotFound as exc:
            return _text(404, exc.message)
        except LogsUnavailable as exc:
            return _text(400, exc.message)
        try:
            return await _stream(request, chunks, limit_bytes=options.limit_bytes)
        finally:
            await _close(chunks)
    finally:
        if task is not None:
            state.streams.discard(task)


async def _stream(
    request: web.Request, chunks: AsyncIterator[bytes], *, limit_bytes: int | None
) -> web.StreamResponse:
    response = web.StreamResponse(status=200)
    response.content_type = "text/plain"
    await response.prepare(request)
    # limitBytes is enforced here too, as kubelet's LimitWriter does, whatever the provider did.
    remaining = limit_bytes
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            if remaining is not None:
                chunk = chunk[:remaining]
                remaining -= len(chunk)
            # Each write goes to the transport at once (no compression, no buffering), so a
            # follower sees every chunk as soon as the provider yields it.
            await response.write(chunk)
            if remaining == 0:
                break
    except ConnectionResetError:
        # The client went away between two chunks; nothing to tell anybody.
        logger.debug("kubelet API: log client disconnected from %s", request.path)
        return response
    except LogsError as exc:
        # The status is sent already; end the stream with the reason, as kubelet does.
        with contextlib.suppress(ConnectionResetError):
            await response.write(f"\n{exc.message}\n".encode())
    except Exception:
        logger.exception("kubelet API: log stream %s failed", request.path)
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def _close(chunks: AsyncIterator[bytes]) -> None:
    # Async generators, and iterators modelled on them, release their resources in aclose().
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            logger.debug("kubelet API: closing a log iterator failed", exc_info=True)


# --------------------------------------------------------------------------- runner


class KubeletApiServer:
    """Runs the kubelet API on ``host:port`` with TLS until :meth:`stop`."""

    def __init__(
        self,
        *,
        node_name: str,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext,
        authenticator: Authenticator,
        authorizer: Authorizer,
        logs: LogSource,
        sources: KubeletSources = KubeletSources(),
        shutdown_timeout: float = 2.0,
    ) -> None:
        self.node_name = node_name
        self.host = host.strip("[]")  # "[::]" as written in "listen" is "::" to bind
        self.port = port
        # Public: a renewed serving certificate is loaded into it (new connections get it).
        self.ssl_context = ssl_context
        self._authenticator = authenticator
        self._authorizer = authorizer
        self._logs = logs
        self._sources = sources
        self._shutdown_timeout = shutdown_timeout
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Bind and serve; with port 0 the chosen port is in ``self.port`` afterwards."""
        if self._runner is not None:
            raise RuntimeError("kubelet API server already started")
        app = build_app(
            node_name=self.node_name,
            authenticator=self._authenticator,
            authorizer=self._authorizer,
            logs=self._logs,
            sources=self._sources,
        )
        runner = web.AppRunner(
            app,
            access_log=None,  # an access log would be one more place for headers to leak
            # Cancel the handler when the client disconnects, so an idle follow stream
            # releases the provider's log connection instead of waiting for the next line.
            handler_cancellation=True,
            shutdown_timeout=self._shutdown_timeout,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        logger.info("kubelet API: serving on %s:%d", self.host, self.port)

    async def serve(self) -> None:
        """A supervisor root: serve until cancelled, then stop."""
        if self._runner is None:
            raise RuntimeError("kubelet API server not started")
        try:
            await asyncio.Event().wait()  # aiohttp serves from the loop; this only holds on
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop accepting, cancel open log streams, give other requests a short grace."""
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # cleanup() closes the listener, runs on_shutdown (which cancels streams) and waits at
        # most about twice shutdown_timeout per connection; the outer bound is a safety net.
        try:
            async with asyncio.timeout(2 * self._shutdown_timeout + 1):
                await runner.cleanup()
        except TimeoutError:
            logger.warning("kubelet API: shutdown did not finish in time")
        logger.info("kubelet API: stopped")
