"""uvicorn, configured for clients that may be slow, stuck or hostile.

uvicorn's defaults leave a connection that never finishes its headers open forever, accept any
number of connections, and on shutdown stop listening at once and then wait for every running
request with no deadline. Here:

* a request's headers must arrive within ``header_timeout`` seconds of the connection opening
  (or of the previous response on a kept-alive connection); the connection is closed otherwise
  (the body has its own deadline, checked by the app: ``ServerConfig.body_timeout``);
* an idle kept-alive connection is closed after ``keep_alive_timeout`` seconds;
* beyond ``max_connections`` open connections, requests get uvicorn's 503;
* on SIGTERM or SIGINT the server keeps listening while it drains: new requests get a 503
  ``shutting_down`` (and ``/health`` a 503, so load balancers move on), the queued and running
  ones get ``shutdown_timeout`` seconds to finish, and whatever is left then ends with a 503.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

import h11
import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.h11_impl import H11Protocol

logger = logging.getLogger("quickdraft.server")

# uvicorn's own handler tasks get this much longer than the drain, to send their last bytes.
_CLOSE_GRACE_SECONDS = 5.0


@dataclass(frozen=True)
class HTTPLimits:
    """Connection-level limits (see the module's docstring); times in seconds."""

    header_timeout: float = 10.0
    keep_alive_timeout: float = 5.0
    max_connections: int = 256
    shutdown_timeout: float = 30.0


def _protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for each request's headers."""

    class HeaderDeadlineProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request's head is in
                self._disarm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_head_timer()  # the next request's head, on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_timer()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._disarm_head_timer()
            self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _disarm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                logger.debug("closing a connection whose request headers took over %g s (--header-timeout)",
                             header_timeout)
                self.transport.close()

    return HeaderDeadlineProtocol


class _DrainingServer(uvicorn.Server):
    """A uvicorn server that drains the quickdraft app before uvicorn's own shutdown."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, shutdown_timeout: float) -> None:
        super().__init__(config)
        self.quickdraft = app.state.server
        self.shutdown_timeout = shutdown_timeout

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.quickdraft.drain(self.shutdown_timeout, forced=lambda: self.force_exit)
        await super().shutdown(sockets)


def make_server(app: FastAPI, limits: HTTPLimits, host: str = "127.0.0.1", port: int = 8000,
                log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for an app from ``create_app``, with ``limits``; ``run()`` serves it."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level,
        http=_protocol(limits.header_timeout),
        timeout_keep_alive=limits.keep_alive_timeout,
        # uvicorn counts the connection asking too: N + 1 lets exactly N connections be served.
        limit_concurrency=limits.max_connections + 1,
        timeout_graceful_shutdown=_CLOSE_GRACE_SECONDS,
    )
    return _DrainingServer(config, app, limits.shutdown_timeout)
