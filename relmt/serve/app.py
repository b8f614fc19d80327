"""The routes: POST /v1/translate, GET /health, /ready, /metrics and the form at /.

Errors are JSON {"error": message, "field": the field at fault or null}; see relmt/serve/requests.py
for each bad input and its status. 503 (max_connections translations in progress, queue full, loading,
shutting down) carries Retry-After; a body that does not arrive within request_timeout_s gets 408.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect

from relmt.serve.args import ServeArgs, cors_origins
from relmt.serve.batcher import Batcher, BatchFailed, NotReady, QueueFull
from relmt.serve.metrics import Metrics
from relmt.serve.page import page
from relmt.serve.requests import ApiError, Asks, parse_body
from relmt.serve.security import OPEN_PATHS, authorized

RETRY_AFTER_S = "1"
ROUTES = "POST /v1/translate, GET /health, /ready, /metrics and /"


@dataclass
class State:
    args: ServeArgs
    batcher: Batcher
    metrics: Metrics
    api_key: str | None = None
    draining: bool = False  # set on SIGTERM by relmt/serve/main.py
    translating: int = 0  # translation requests in progress, at most args.max_connections
    unanswered: list[int] = field(default_factory=list)


class ClientLeft(Exception):
    def __init__(self, dropped: bool) -> None:
        super().__init__()
        self.dropped = dropped  # its sentences left the queue undecoded


def error(status: int, message: str, field: str | None = None, retry: bool = False) -> JSONResponse:
    headers = {"Retry-After": RETRY_AFTER_S} if retry else {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 408:  # the rest of the body may still come: the connection is not reused
        headers["Connection"] = "close"
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


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


def answer(results: list, nbest: int, asks: Asks, warnings: list[dict] | None = None) -> dict:
    """Best translation and its score per sentence (score null for an empty sentence), with n-best
    lists when nbest > 1; all in input order. Where asked (issue 60), the best one's word alignment
    (`alignments`) and token scores (`token_scores`), and with constraints the count it misses (`unmet`),
    one per sentence (null for an empty one); each n-best entry has its own `alignment`, `token_scores`, `unmet`.
    Where the decoding warned of something (TranslateRequest.warnings: a source cut to max_source_len, a beam too
    narrow for a sentence's constraints), `warnings`: [{"sentence": i, "message": "text[i]: ..."}, ...]."""
    fields = [(plural, key) for plural, key, asked in (("alignments", "alignment", asks.alignments),
                                                       ("token_scores", "token_scores", asks.token_scores),
                                                       ("unmet", "unmet", asks.constraints is not None)) if asked]
    body = {"translations": [hyps[0].text if hyps else "" for hyps in results],
            "scores": [hyps[0].score if hyps else None for hyps in results]}
    for plural, key in fields:
        body[plural] = [getattr(hyps[0], key) if hyps else None for hyps in results]
    if nbest > 1:
        body["nbest"] = [[{"translation": t.text, "score": t.score, **{key: getattr(t, key) for _, key in fields}}
                          for t in hyps] for hyps in results]
    if warnings:
        body["warnings"] = warnings
    return body


class Guard:
    """ASGI middleware: the bearer check (when a key is set) and nosniff on every answer. Plain ASGI,
    not BaseHTTPMiddleware, so that a route sees its client's disconnect as it happens."""

    def __init__(self, app, state: State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.state.api_key and scope["path"] not in OPEN_PATHS and \
                not authorized(headers.get(b"authorization", b"").decode("latin-1"), self.state.api_key):
            self.state.metrics.errors.labels("unauthorized").inc()
            response = error(401, "this server needs 'Authorization: Bearer <key>' (the key in RELMT_SERVE_API_KEY)")
            return await response(scope, receive, send)

        async def send_nosniff(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-content-type-options", b"nosniff")]
            await send(message)

        await self.app(scope, receive, send_nosniff)


def create_app(state: State) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.batcher.start()
        yield
        left = await asyncio.to_thread(state.batcher.stop, state.args.shutdown_deadline_s)
        state.unanswered.append(left)

    app = FastAPI(title="relmt-serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    metrics = state.metrics

    app.add_middleware(Guard, state=state)
    if origins := cors_origins(state.args):
        # outside the Guard (the last added runs first): a preflight carries no Authorization header, and a
        # 401 carries the CORS headers that let the page read it. No credentials (cookies): the key is a header
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["Retry-After"],
                           allow_credentials=False, max_age=600)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> Response:
        """A route that does not exist (404) or a method it does not take (405), as every other error."""
        where = f"{request.method} {request.url.path}"
        message = {404: f"no such route: {where} (the routes: {ROUTES})",
                   405: f"{where}: method not allowed (allowed: {(e.headers or {}).get('Allow')})"}
        return JSONResponse({"error": message.get(e.status_code, f"{where}: {e.detail}"), "field": None},
                            status_code=e.status_code, headers=e.headers)

    @app.post("/v1/translate")
    async def translate(request: Request) -> Response:
        start = time.perf_counter()
        if state.translating >= state.args.max_connections:
            metrics.errors.labels("max_connections").inc()
            response = error(503, f"max_connections={state.args.max_connections} translation requests are in "
                             "progress; retry later", retry=True)
        else:
            state.translating += 1
            try:
                response = await translate_response(request, state)
            finally:
                state.translating -= 1
        metrics.requests.labels(str(response.status_code)).inc()
        metrics.latency.observe(time.perf_counter() - start)
        return response

    @app.get("/health")
    async def health() -> dict:
        return {"status": "alive"}

    @app.get("/ready")
    async def ready() -> Response:
        if state.batcher.ready and not state.draining:
            return JSONResponse({"ready": True})
        reason = state.batcher.load_error or ("shutting down" if state.draining or state.batcher.stopping
                                              else "the model is loading")
        return JSONResponse({"ready": False, "reason": reason}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.text(), media_type=metrics.content_type)

    @app.get("/")
    async def form() -> HTMLResponse:
        html, csp = page()
        return HTMLResponse(html, headers={"Content-Security-Policy": csp})

    return app


async def translate_response(request: Request, state: State) -> Response:
    metrics, batcher = state.metrics, state.batcher
    try:
        if state.draining:
            raise NotReady("shutting down")
        raw = await read_body(request, state.args.max_body_bytes, state.args.request_timeout_s)
        if not batcher.ready:
            raise NotReady(batcher.load_error or "the model is loading")
        req = parse_body(raw, state.args, batcher.default_decode, batcher.translator.tokenizer,
                         batcher.translator.tagged)
        job = batcher.submit(req.sentences, req.decode, req.asks)
    except ApiError as e:
        metrics.errors.labels("request_timeout" if e.status == 408 else "bad_request").inc()
        return error(e.status, e.message, e.field)
    except ClientDisconnect:  # gone in the middle of its body: nothing was queued
        metrics.errors.labels("client_left").inc()
        return Response(status_code=499)  # nobody reads it
    except (NotReady, QueueFull) as e:
        metrics.errors.labels("queue_full" if isinstance(e, QueueFull) else "not_ready").inc()
        return error(503, f"{'the queue is full' if isinstance(e, QueueFull) else 'not ready'}: {e}; retry later",
                     retry=True)
    metrics.in_progress.inc()
    try:
        results = await wait_for(request, job)
    except BatchFailed as e:
        metrics.errors.labels("decoding").inc()
        return error(500, str(e))
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
    return JSONResponse(answer(results, req.decode.nbest, req.asks, req.warnings(job.ids)))
