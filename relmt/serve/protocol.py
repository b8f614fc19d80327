"""uvicorn's pieces: its HTTP protocol (httptools) with a deadline on each request head, and its server
with a graceful SIGTERM (GracefulServer) that answers the requests on kept-alive connections while it drains.

uvicorn closes a keep-alive connection that stays idle between two requests, but nothing bounds the time a
request head may take: a client that connects and sends nothing, or sends `POST /v1/translate HTTP/1.1\\r\\n`
and waits, would hold its connection for ever, and the API key is only checked once the head is complete.
Here a connection is closed when a request head is not complete within `deadline_s` of the connection opening
or of the request's first byte; bytes trickling in do not extend it. The body's deadline is the route's
(relmt/serve/pipeline.py read_body answers 408).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("uvicorn.error")


class HeadDeadline(HttpToolsProtocol):
    """Built by uvicorn for each connection, through functools.partial(HeadDeadline, deadline_s=...,
    on_timeout=...) as uvicorn.Config's http=; on_timeout is called for each request cut off (not for a
    connection closed before it sent a byte)."""

    def __init__(self, *args, deadline_s: float, on_timeout: Callable[[], None],
                 draining: Callable[[], bool] = lambda: False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deadline_s, self.on_timeout, self.draining = deadline_s, on_timeout, draining
        self.head_timer: asyncio.TimerHandle | None = None
        self.in_head = False  # a request's first byte has come, and its head is not complete

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.start_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.in_head = True
        if self.head_timer is None:  # else the connection's own deadline runs on
            self.start_timer()

    def on_headers_complete(self) -> None:
        self.stop_timer()
        self.in_head = False
        super().on_headers_complete()
        if self.draining() and self.cycle is not None:  # its answer says `Connection: close`, and closes it
            self.cycle.keep_alive = False

    @property
    def answering(self) -> bool:
        """A request's head is complete and its answer is not."""
        return self.cycle is not None and not self.cycle.response_complete

    @property
    def busy(self) -> bool:
        """A request is in progress on the connection (its head begun, or its answer not yet complete); else it is
        idle between two requests (keep-alive), or has sent nothing yet."""
        return self.in_head or self.answering

    def start_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.deadline_s, self.head_timed_out)

    def stop_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def head_timed_out(self) -> None:
        self.head_timer = None
        if not self.transport.is_closing():
            if self.in_head:
                self.on_timeout()
            self.transport.close()


class GracefulServer(uvicorn.Server):
    """uvicorn.Server, with three changes: SIGTERM first marks the server draining (/ready and new
    translations answer 503 while accepted ones finish); the drain keeps the kept-alive connections open
    (`shutdown`); and a graceful stop exits 0 instead of re-raising the signal when done (uvicorn's default,
    which would end the process with -15)."""

    def __init__(self, config: uvicorn.Config, state) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame) -> None:
        self.state.draining = True
        super().handle_exit(sig, frame)
        if hasattr(self, "_captured_signals"):
            self._captured_signals.clear()

    async def shutdown(self, sockets=None) -> None:
        """uvicorn's shutdown closes every idle keep-alive connection at once, and a request a client sends on
        one at that moment meets a closed connection (issue 74 §4: connection resets instead of 503s). Here the
        listening sockets close (no new connection is accepted), and each connection stays open until the drain
        ends: one busy with a request closes after its answer (`Connection: close`), and a request arriving on an
        idle one is answered 503 + Retry-After + `Connection: close` (relmt/serve/pipeline.py: the server is draining),
        and that connection closes. Once no request is in progress (every accepted one answered) the connections
        still idle close. Past timeout_graceful_shutdown (shutdown_deadline_s) the requests still running are
        cancelled, as uvicorn does."""
        log.info("Shutting down")
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            # an answer in progress: its connection closes after it (uvicorn's own connection shutdown). A
            # connection of another protocol than HeadDeadline (none here) is shut down as uvicorn does
            if not isinstance(connection, HeadDeadline) or connection.answering:
                connection.shutdown()
        try:
            await asyncio.wait_for(self.drain(), timeout=self.config.timeout_graceful_shutdown)
        except asyncio.TimeoutError:
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks))
            for connection in list(self.server_state.connections):
                connection.shutdown()
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    async def drain(self) -> None:
        state = self.server_state
        while not self.force_exit and (state.tasks or any(isinstance(c, HeadDeadline) and c.busy
                                                          for c in state.connections)):
            await asyncio.sleep(0.05)
        for connection in list(state.connections):  # idle: closed now, with nothing in flight on it
            connection.shutdown()
        while state.connections and not self.force_exit:
            await asyncio.sleep(0.05)
        for server in self.servers:
            await server.wait_closed()
