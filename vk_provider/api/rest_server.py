"""Serving the REST API (``rest.build_app``): uvicorn inside the agent's own event loop.

``RestServer`` binds the socket itself, runs uvicorn as a task of the current loop and stops
it on request, so the REST API is one more root of the agent's supervisor
(``runtime.supervisor``), started and stopped like every other.

Invariants: a taken port fails ``start`` as an ``OSError`` (uvicorn never calls
``sys.exit``); uvicorn installs no signal handlers (SIGTERM/SIGINT are the agent's), runs no
lifespan and writes no access log (request headers carry tokens); ``stop`` is idempotent and
bounded: open requests get a short grace, then the server task is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

log = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The agent owns SIGINT/SIGTERM (runtime.py); uvicorn would replace its handlers and
        # re-raise the signal after shutting down. Stopping is RestServer.stop()'s job.
        yield


class RestServer:
    """Runs the REST API with uvicorn on ``host:port`` in the current event loop until
    :meth:`stop`.

    The listening socket is bound in :meth:`start` (so a taken port fails there, as an
    ``OSError``, instead of uvicorn calling ``sys.exit``). Uvicorn runs with ``lifespan="off"``:
    the app has no start-up or shutdown work of its own — every loop of the agent is started
    and stopped by the agent's supervisor, not by the web server.
    """

    def __init__(
        self,
        *,
        app: FastAPI,
        host: str,
        port: int,
        shutdown_timeout: float = 2.0,
        startup_timeout: float = 5.0,
    ) -> None:
        self.app = app
        self.host = host.strip("[]")  # "[::]" as written in "listen" is "::" to bind
        self.port = port
        self._shutdown_timeout = shutdown_timeout
        self._startup_timeout = startup_timeout
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and serve; with port 0 the chosen port is in ``self.port`` afterwards."""
        if self._server is not None:
            raise RuntimeError("REST API server already started")
        sock = await self._bind()
        config = uvicorn.Config(
            self.app,
            log_config=None,  # the agent configures logging once, for every part
            log_level="warning",  # our own lines say "serving" and "stopped"; uvicorn's only errors
            access_log=False,  # request lines are not needed, and headers must never leak
            lifespan="off",
            ws="none",
            server_header=False,
            timeout_graceful_shutdown=int(max(1, self._shutdown_timeout)),
        )
        server = _EmbeddedServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="rest-api")
        try:
            async with asyncio.timeout(self._startup_timeout):
                # uvicorn has no "started" event, only this flag; it turns within a tick.
                while not server.started:
                    if task.done():
                        task.result()  # raises what stopped it
                        raise RuntimeError("REST API server stopped while starting")
                    await asyncio.sleep(0.01)
        except BaseException:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            sock.close()
            raise
        self._server, self._task = server, task
        self.port = int(sock.getsockname()[1])
        log.info("REST API: serving on %s:%d", self.host, self.port)

    async def _bind(self) -> socket.socket:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    async def serve(self) -> None:
        """A supervisor root: serve until cancelled (then stop), or until uvicorn dies."""
        task = self._task
        if task is None:
            raise RuntimeError("REST API server not started")
        try:
            await asyncio.shield(task)
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop accepting, let open requests finish for a short grace, then cancel."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is None or task is None:
            return
        server.should_exit = True
        try:
            async with asyncio.timeout(self._shutdown_timeout + 1):
                await task
        except TimeoutError:
            log.warning("REST API: shutdown did not finish in time")
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        except Exception:
            log.exception("REST API: the server failed while stopping")
        log.info("REST API: stopped")
