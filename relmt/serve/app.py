"""The routes: POST /v1/translate, GET /health, /ready, /metrics and the form at /; LibreTranslate's POST
/translate, /detect, GET /languages and /frontend/settings (relmt/serve/libretranslate.py).

Errors are JSON {"error": message, "field": the field at fault or null}; see relmt/serve/requests.py
for each bad input and its status. 503 (max_connections translations in progress, queue full, loading,
shutting down) carries Retry-After; a body that does not arrive within request_timeout_s gets 408.
LibreTranslate's routes answer errors as LibreTranslate does, {"error": message}.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from relmt.serve import libretranslate
from relmt.serve.args import cors_origins
from relmt.serve.page import page
from relmt.serve.pipeline import Door, State, error_headers, translation
from relmt.serve.requests import Asks, parse_body
from relmt.serve.security import BODY_KEY_PATHS, OPEN_PATHS, authorized

ROUTES = ("POST /v1/translate, GET /health, /ready, /metrics and /; LibreTranslate's POST /translate, /detect, "
          "GET /languages and /frontend/settings")


def error(status: int, message: str, field: str | None = None, retry: bool = False) -> JSONResponse:
    headers = error_headers(status, retry)
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


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


def parse(raw: bytes, state: State):
    """A /v1/translate body as a TranslateRequest, checked against the loaded model's vocabulary and languages."""
    translator = state.batcher.translator
    return parse_body(raw, state.args, state.batcher.default_decode, translator.tokenizer, translator.tagged)


# relmt's own door: the body is all read and parsed once the model is loaded
V1 = Door(read=lambda raw, request, state: raw, parse=parse,
          answer=lambda req, results, ids: answer(results, req.decode.nbest, req.asks, req.warnings(ids)), error=error)


class Guard:
    """ASGI middleware: the bearer check (when a key is set; LibreTranslate's routes that take a key in the body
    check it themselves) and nosniff on every answer. Plain ASGI, not BaseHTTPMiddleware, so that a route sees its
    client's disconnect as it happens."""

    def __init__(self, app, state: State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.state.api_key and scope["path"] not in OPEN_PATHS | BODY_KEY_PATHS and \
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
        return await translation(request, state, V1)

    @app.post("/translate")
    async def lt_translate(request: Request) -> Response:
        return await translation(request, state, libretranslate.DOOR)

    @app.post("/detect")
    async def lt_detect(request: Request) -> Response:
        return await libretranslate.detect(request, state)

    @app.get("/languages")
    async def lt_languages() -> Response:
        return libretranslate.describe(state, libretranslate.languages)

    @app.get("/frontend/settings")
    async def lt_settings() -> Response:
        return libretranslate.describe(state, lambda pairs: libretranslate.settings(state, pairs))

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
