"""One translation request through the server, whichever API it came by: its body read within max_body_bytes and
request_timeout_s, parsed, queued on the batcher, answered, and counted in /metrics.

relmt's POST /v1/translate (relmt/serve/app.py) and LibreTranslate's POST /translate (relmt/serve/libretranslate.py)
are two Doors to this one path: the same limits, scheduling (the batcher's fair shares) and metrics; each reads
its own body and shapes its own answers and errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from relmt.serve.args import ServeArgs
from relmt.serve.batcher import Batcher, BatchFailed, NotReady, QueueFull
from relmt.serve.metrics import Metrics
from relmt.serve.requests import ApiError

RETRY_AFTER_S = "1"


@dataclass
class State:
    args: ServeArgs
    batcher: Batcher
    metrics: Metrics
    api_key: str | None = None
    draining: bool = False  # set on SIGTERM by relmt/serve/main.py
    translating: int = 0  # translation requests in progress, at most args.max_connections
    unanswered: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Door:
    """How one API reads a translation request, answers it and refuses it. Each callable may raise ApiError."""

    read: Callable[[bytes, Request, State], Any]  # the body as the API's fields, before the model is needed
    parse: Callable[[Any, State], Any]  # the fields as a request: .sentences, .decode, .asks (the model loaded)
    answer: Callable[[Any, list, list], dict]  # (request, each sentence's hypotheses, their source ids) -> body
    error: Callable[..., Response]  # (status, message, field=None, retry=False) -> the API's error answer


class ClientLeft(Exception):
    def __init__(self, dropped: bool) -> None:
        super().__init__()
        self.dropped = dropped  # its sentences left the queue undecoded


def error_headers(status: int, retry: bool) -> dict[str, str]:
    """An error answer's headers: Retry-After (busy, loading, shutting down); after a 408, Connection: close."""
    headers = {"Retry-After": RETRY_AFTER_S} if retry else {}
    if status == 408:  # the rest of the body may still come: the connection is not reused
        headers["Connection"] = "close"
    return headers


def error_kind(e: ApiError) -> str:
    """A refusal's kind in relmt_serve_errors_total: a key refused (field api_key: LibreTranslate's), a body
    too slow, or a bad request."""
    return "unauthorized" if e.field == "api_key" else "request_timeout" if e.status == 408 else "bad_request"


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, refused with 413 past `limit` bytes (at once from Content-Length, else while it streams)
    and with 408 when it has not all come within `timeout` seconds. ClientDisconnect when the client leaves."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise ApiError(413 if length.isdigit() else 400,
                       f"the body is {length} bytes, more than max_body_bytes={limit}" if length.isdigit()
                       else f"Content-Length: {length!r} is not a number")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the body is over max_body_bytes={limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the body did not arrive within request_timeout_s={timeout:g} s") from None


async def until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for(request: Request, job) -> list:
    """The job's results, or ClientLeft when the client disconnects first (the job is then dropped if
    no batch has taken it)."""
    result = asyncio.wrap_future(job.future)
    left = asyncio.ensure_future(until_disconnect(request))
    try:
        await asyncio.wait({result, left}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # uvicorn's shutdown deadline passed: decode nothing more for it
        job.future.cancel()
        raise
    finally:
        left.cancel()
    if result.done():
        return result.result()
    job.cancelled = True
    dropped = job.future.cancel()  # False once a batch has taken it: it is decoded with that batch
    result.add_done_callback(lambda f: f.cancelled() or f.exception())  # its failure is nobody's to report
    raise ClientLeft(dropped)


async def translation(request: Request, state: State, door: Door) -> Response:
    """A translation request's answer, within max_connections (503 + Retry-After past it); counted by status and
    timed."""
    start, metrics = time.perf_counter(), state.metrics
    if state.translating >= state.args.max_connections:
        metrics.errors.labels("max_connections").inc()
        response = door.error(503, f"max_connections={state.args.max_connections} translation requests are in "
                              "progress; retry later", retry=True)
    else:
        state.translating += 1
        try:
            response = await respond(request, state, door)
        finally:
            state.translating -= 1
    metrics.requests.labels(str(response.status_code)).inc()
    metrics.latency.observe(time.perf_counter() - start)
    return response


async def respond(request: Request, state: State, door: Door) -> Response:
    metrics, batcher = state.metrics, state.batcher
    try:
        if state.draining:
            raise NotReady("shutting down")
        given = door.read(await read_body(request, state.args.max_body_bytes, state.args.request_timeout_s),
                          request, state)
        if not batcher.ready:
            raise NotReady(batcher.load_error or "the model is loading")
        req = door.parse(given, state)
        if not req.sentences:  # nothing to translate (LibreTranslate's HTML of tags alone): nothing is queued
            return JSONResponse(door.answer(req, [], []))
        job = batcher.submit(req.sentences, req.decode, req.asks)
    except ApiError as e:
        metrics.errors.labels(error_kind(e)).inc()
        return door.error(e.status, e.message, e.field)
    except ClientDisconnect:  # gone in the middle of its body: nothing was queued
        metrics.errors.labels("client_left").inc()
        return Response(status_code=499)  # nobody reads it
    except (NotReady, QueueFull) as e:
        metrics.errors.labels("queue_full" if isinstance(e, QueueFull) else "not_ready").inc()
        return door.error(503, f"{'the queue is full' if isinstance(e, QueueFull) else 'not ready'}: {e}; retry "
                          "later", retry=True)
    metrics.in_progress.inc()
    try:
        results = await wait_for(request, job)
    except BatchFailed as e:
        metrics.errors.labels("decoding").inc()
        return door.error(500, str(e))
    except asyncio.CancelledError:  # cut off at the shutdown deadline: counted, and the exit status says so
        metrics.errors.labels("shutdown_deadline").inc()
        state.unanswered.append(1)
        raise
    except ClientLeft as e:
        metrics.errors.labels("client_left").inc()
        if e.dropped:
            metrics.cancelled.inc()
        return Response(status_code=499)  # nobody reads it: the client has gone
    finally:
        metrics.in_progress.dec()
    return JSONResponse(door.answer(req, results, job.ids))
