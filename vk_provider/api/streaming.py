"""The kubelet API's ``/exec``, ``/attach`` and ``/portForward``: HTTP upgraded to SPDY/3.1.

What the API server 1.37 sends a kubelet (``pkg/registry/core/pod/rest/subresources.go``):
unless the node declares the ``ExtendWebSocketsToKubelet`` feature in
``status.declaredFeatures`` (ours does not), a WebSocket client's exec or attach is
translated at the API server into SPDY (``StreamTranslatorHandler``: client-go's SPDY
executor, protocols v5..v1 offered) and a WebSocket port-forward is unwrapped into the SPDY
it tunnels (``TunnelingHandler``); a SPDY client, and a port-forward WebSocket that tunnels
nothing (``api/portforward_ws.py``, served as kubelet serves it), are proxied as they are.
Otherwise the kubelet gets ``POST`` (or ``GET``) with ``Connection: Upgrade``,
``Upgrade: SPDY/3.1`` and ``X-Stream-Protocol-Version`` headers, answers ``101`` with the
version it chose, and the connection is SPDY from then on (``api/spdy.py``,
``api/spdy_session.py``); ``api/remotecommand.py`` and ``api/portforward.py`` speak the
channels.

Paths, as kubelet's ``server.go``: ``/exec/{ns}/{pod}/{container}``,
``/exec/{ns}/{pod}/{uid}/{container}`` (``command`` repeated in the query), the same for
``/attach``, and ``/portForward/{ns}/{pod}[/{uid}]``.

Refusals come before the upgrade, as plain HTTP with a ``metav1.Status`` body whose message
client-go shows ("unable to upgrade connection: <message>"): 400 for a bad request, 404 for
a pod or container that is not here, 501 naming the reason when the pod's provider cannot do
it (kubelet answers an unsupported runtime with the runtime's error, not a bare 404).

Invariants: a refusal never upgrades; an upgraded connection always ends with GOAWAY and is
closed; the handler task is registered in ``open_tasks`` so that a server shutdown cancels it
(which closes the command or ports it opened).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, cast

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from vk_provider.api import portforward, portforward_ws, remotecommand
from vk_provider.api.spdy_session import SpdySession
from vk_provider.api.tasks import cancel_all

log = logging.getLogger(__name__)

UPGRADE_SPDY = "SPDY/3.1"
PROTOCOL_HEADER = "X-Stream-Protocol-Version"


class StreamingRefused(Exception):
    """The request cannot be served; ``status`` and ``message`` go back to the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class ContainerRef:
    namespace: str
    pod: str
    uid: str  # "" when the path has none
    container: str = ""


class ContainerStreams(Protocol):
    """What the agent offers behind ``/exec``, ``/attach`` and ``/portForward``.

    Each method checks now (before the upgrade) that the pod and container are here and that
    their provider can do it, raising :class:`StreamingRefused` otherwise, and returns what
    is started once the client's streams are there.
    """

    async def exec_starter(
        self, ref: ContainerRef, command: list[str], *, tty: bool
    ) -> remotecommand.Starter: ...

    async def attach_starter(
        self, ref: ContainerRef, *, stdin: bool, tty: bool
    ) -> remotecommand.Starter: ...

    async def port_opener(self, ref: ContainerRef) -> portforward.PortOpener: ...


_SOURCE = web.AppKey("kubelet_container_streams", ContainerStreams)
_TASKS = web.AppKey("kubelet_streaming_tasks", set[asyncio.Task[object]])


def add_streaming_routes(
    app: web.Application, source: ContainerStreams, *, open_tasks: set[asyncio.Task[object]]
) -> None:
    app[_SOURCE] = source
    app[_TASKS] = open_tasks
    for prefix, handler in (("/exec", _exec), ("/attach", _attach)):
        for path in (
            f"{prefix}/{{namespace}}/{{pod}}/{{container}}",
            f"{prefix}/{{namespace}}/{{pod}}/{{uid}}/{{container}}",
        ):
            app.router.add_route("GET", path, handler)
            app.router.add_route("POST", path, handler)
    for path in ("/portForward/{namespace}/{pod}", "/portForward/{namespace}/{pod}/{uid}"):
        app.router.add_route("GET", path, _port_forward)
        app.router.add_route("POST", path, _port_forward)


def status_response(status: int, message: str) -> web.Response:
    """A refusal as the API server writes one, so client-go can show its message."""
    reasons = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 501: "NotImplemented"}
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reasons.get(status, "InternalError"),
        "code": status,
    }
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def _ref(request: web.Request) -> ContainerRef:
    info = request.match_info
    return ContainerRef(
        namespace=info["namespace"],
        pod=info["pod"],
        uid=info.get("uid", ""),
        container=info.get("container", ""),
    )


async def _exec(request: web.Request) -> web.StreamResponse:
    try:
        options = remotecommand.stream_options(request.query)
    except ValueError as exc:
        return status_response(400, str(exc))
    command = request.query.getall("command", [])
    if not command:
        return status_response(400, "you must specify at least one command for the container")
    source = request.app[_SOURCE]

    async def prepare() -> remotecommand.Starter:
        return await source.exec_starter(_ref(request), list(command), tty=options.tty)

    return await _remote_command(request, options, prepare)


async def _attach(request: web.Request) -> web.StreamResponse:
    try:
        options = remotecommand.stream_options(request.query)
    except ValueError as exc:
        return status_response(400, str(exc))
    source = request.app[_SOURCE]

    async def prepare() -> remotecommand.Starter:
        return await source.attach_starter(_ref(request), stdin=options.stdin, tty=options.tty)

    return await _remote_command(request, options, prepare)


async def _remote_command(
    request: web.Request,
    options: remotecommand.StreamOptions,
    prepare: Callable[[], Awaitable[remotecommand.Starter]],
) -> web.StreamResponse:
    refusal = _upgrade_refusal(request)
    if refusal is not None:
        return refusal
    protocol = remotecommand.negotiate(
        request.headers.getall(PROTOCOL_HEADER, []), remotecommand.SERVER_PROTOCOLS
    )
    if protocol is None:
        return _no_protocol(request, remotecommand.SERVER_PROTOCOLS)
    try:
        starter = await prepare()
    except StreamingRefused as exc:
        return status_response(exc.status, exc.message)

    async def serve(session: SpdySession) -> None:
        try:
            channels = await remotecommand.wait_for_streams(session, options, protocol)
        except remotecommand.StreamSetupError as exc:
            log.info("kubelet API: %s %s: %s", request.method, request.path, exc)
            return
        await remotecommand.serve_command(channels, starter)

    return await _upgraded(request, protocol, serve)


async def _port_forward(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _websocket_port_forward(request)
    refusal = _upgrade_refusal(request)
    if refusal is not None:
        return refusal
    protocol = remotecommand.negotiate(
        request.headers.getall(PROTOCOL_HEADER, []), (portforward.PROTOCOL,)
    )
    if protocol is None:
        return _no_protocol(request, (portforward.PROTOCOL,))
    ref = _ref(request)
    try:
        opener = await request.app[_SOURCE].port_opener(ref)
    except StreamingRefused as exc:
        return status_response(exc.status, exc.message)
    target = f"pod {ref.pod}, uid {ref.uid}"

    async def serve(session: SpdySession) -> None:
        await portforward.serve_port_forward(session, opener, target=target)

    return await _upgraded(request, protocol, serve)


async def _websocket_port_forward(request: web.Request) -> web.StreamResponse:
    """The plain WebSocket protocol (``api/portforward_ws.py``), which the API server passes on
    as it is."""
    try:
        ports = portforward_ws.requested_ports(list(request.query.items()))
    except ValueError as exc:
        return status_response(400, str(exc))
    ref = _ref(request)
    try:
        opener = await request.app[_SOURCE].port_opener(ref)
    except StreamingRefused as exc:
        return status_response(exc.status, exc.message)
    task = asyncio.current_task()
    tasks = request.app[_TASKS]
    if task is not None:
        tasks.add(task)
    try:
        return await portforward_ws.serve_websocket_port_forward(
            request, ports, opener, target=f"pod {ref.pod}, uid {ref.uid}"
        )
    finally:
        if task is not None:
            tasks.discard(task)


def _upgrade_refusal(request: web.Request) -> web.Response | None:
    upgrade = request.headers.get("Upgrade", "").lower()
    connection = request.headers.get("Connection", "").lower()
    if upgrade == "websocket":
        # The API server translates exec and attach WebSockets into SPDY for us (we do not
        # declare ExtendWebSocketsToKubelet); only a client talking to this API directly gets
        # here (a port-forward WebSocket is served before this).
        return status_response(
            400,
            "this kubelet API speaks SPDY/3.1 only; connect through "
            "the API server, which translates WebSocket clients",
        )
    if "upgrade" not in connection or UPGRADE_SPDY.lower() not in upgrade:
        return status_response(400, "unable to upgrade: missing upgrade headers in request")
    return None


def _no_protocol(request: web.Request, server: tuple[str, ...]) -> web.Response:
    offered = request.headers.getall(PROTOCOL_HEADER, [])
    if not offered:
        return status_response(
            400, f"unable to upgrade: header {PROTOCOL_HEADER} does not exist in request"
        )
    response = status_response(
        403,
        f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
        f"server accepts {list(server)}",
    )
    for protocol in server:
        response.headers.add("X-Accepted-Stream-Protocol-Versions", protocol)
    return response


class _Feeder:
    """aiohttp's payload-parser interface, feeding the raw connection to the SPDY session."""

    def __init__(self, session: SpdySession) -> None:
        self._session = session

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._session.feed(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self._session.feed_eof()


class _TransportSink:
    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writer: AbstractStreamWriter | None = None

    def write(self, data: bytes) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("the connection is closed")
        self._transport.write(data)

    async def drain(self) -> None:
        if self.writer is not None:
            await self.writer.drain()


async def _upgraded(
    request: web.Request, protocol: str, serve: Callable[[SpdySession], Coroutine[Any, Any, None]]
) -> web.StreamResponse:
    transport = request.transport
    if transport is None:
        return status_response(500, "the connection is already closed")
    sink = _TransportSink(transport)
    session = SpdySession(
        sink, pause_reading=transport.pause_reading, resume_reading=transport.resume_reading
    )
    # The parser goes in before the 101 is sent: the client's first frame follows the 101.
    cast(Any, request.protocol).set_parser(_Feeder(session))
    response = web.StreamResponse(
        status=101,
        headers={"Connection": "Upgrade", "Upgrade": UPGRADE_SPDY, PROTOCOL_HEADER: protocol},
    )
    response.force_close()
    task = asyncio.current_task()
    tasks = request.app[_TASKS]
    if task is not None:
        tasks.add(task)
    try:
        sink.writer = await response.prepare(request)
        serving = asyncio.create_task(serve(session), name=f"kubelet-stream {request.path}")
        closed = asyncio.create_task(session.closed.wait())
        try:
            # The exchange ends when the handler is done or the client goes away first.
            await asyncio.wait({serving, closed}, return_when=asyncio.FIRST_COMPLETED)
            if serving.done() and not serving.cancelled() and serving.exception() is not None:
                log.error("kubelet API: %s failed", request.path, exc_info=serving.exception())
        finally:
            await cancel_all((serving, closed))
    finally:
        session.close()
        if task is not None:
            tasks.discard(task)
    return response
