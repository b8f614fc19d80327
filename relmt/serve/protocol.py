"""uvicorn's pieces: its HTTP protocol (httptools) with a deadline on each request head, and its server
with a graceful SIGTERM (GracefulServer).

uvicorn closes a keep-alive connection that stays idle between two requests, but nothing bounds the time a
request head may take: a client that connects and sends nothing, or sends `POST /v1/translate HTTP/1.1\\r\\n`
and waits, would hold its connection for ever, and the API key is only checked once the head is complete.
Here a connection is closed when a request head is not complete within `deadline_s` of the connection opening
or of the request's first byte; bytes trickling in do not extend it. The body's deadline is the route's
(relmt/serve/app.py read_body answers 408).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class HeadDeadline(HttpToolsProtocol):
    """Built by uvicorn for each connection, through functools.partial(HeadDeadline, deadline_s=...,
    on_timeout=...) as uvicorn.Config's http=; on_timeout is called for each request cut off (not for a
    connection closed before it sent a byte)."""

    def __init__(self, *args, deadline_s: float, on_timeout: Callable[[], None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deadline_s, self.on_timeout = deadline_s, on_timeout
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
    """uvicorn.Server, with two changes: SIGTERM first marks the server draining (/ready and new
    translations answer 503 while accepted ones finish), and a graceful stop exits 0 instead of
    re-raising the signal when done (uvicorn's default, which would end the process with -15)."""

    def __init__(self, config: uvicorn.Config, state) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig, frame) -> None:
        self.state.draining = True
        super().handle_exit(sig, frame)
        if hasattr(self, "_captured_signals"):
            self._captured_signals.clear()
