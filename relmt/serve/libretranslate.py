"""LibreTranslate's API (as of LibreTranslate 1.9) beside relmt's own: POST /translate and /detect, GET /languages and
/frontend/settings, so that LibreTranslate's clients can use a relmt model. POST /translate is a Door of
relmt/serve/pipeline.py, as /v1/translate is: the same limits, key, scheduling and metrics.

A request's fields come as JSON or as a form (application/x-www-form-urlencoded, after the query string's), as
LibreTranslate reads them. The model's languages are its data config's (source, target) pairs; source=auto is the
model's source language. `alternatives` asks for that many n-best entries besides the best (beam at least
alternatives + 1). A text is translated line by line, and format=html by the lines of its text nodes
(relmt/serve/markup.py). Every error is {"error": message}, with LibreTranslate's status and text where it has one:
- q, source or target missing: 400 "Invalid request: missing q parameter"; a language the model does not have:
  400 "xx is not supported"; a pair it does not translate: 400 "... is not available as a target language from ...";
- more texts, or lines in all, than max_lines (LibreTranslate's batch_limit), a text over max_line_chars (its
  char_limit): 400 "Invalid request: request (N) exceeds text limit (M)"; alternatives over max_beam - 1: 400;
- relmt's other refusals keep relmt's text, 413 and 422 turned into 400;
- the server's key (RELMT_SERVE_API_KEY) as the body's api_key or as `Authorization: Bearer <key>`: none given,
  400 "Please contact the server operator to get an API key"; a wrong one, 403 "Invalid API key";
- busy, loading or shutting down: 503 with Retry-After; a decoding that failed: 500 "Cannot translate text: ...".
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from relmt.config import DecodeConfig
from relmt.errors import UserError
from relmt.serve.markup import Part, html_parts, joined, lines
from relmt.serve.pipeline import Door, State, error_headers, error_kind, read_body
from relmt.serve.requests import ApiError, Asks, check_line, request_decode
from relmt.serve.security import authorized

FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default frontend_timeout
NAMES = {"ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
         "es": "Spanish", "fi": "Finnish", "fr": "French", "he": "Hebrew", "hi": "Hindi", "hu": "Hungarian",
         "id": "Indonesian", "it": "Italian", "ja": "Japanese", "ko": "Korean", "nl": "Dutch", "pl": "Polish",
         "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sv": "Swedish", "tr": "Turkish",
         "uk": "Ukrainian", "vi": "Vietnamese", "zh": "Chinese"}  # other codes are named by themselves


def error(status: int, message: str, field: str | None = None, retry: bool = False) -> JSONResponse:
    """LibreTranslate's error answer: {"error": message}; relmt's 413 and 422 are its 400."""
    status = 400 if status in (413, 422) else status
    message = f"Cannot translate text: {message}" if status == 500 else message
    return JSONResponse({"error": message}, status_code=status, headers=error_headers(status, retry))


def mime(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()


def is_json(request: Request) -> bool:
    """Whether the body is JSON, as Flask's request.is_json says."""
    kind = mime(request)
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def fields(raw: bytes, request: Request) -> dict:
    """The request's fields: the JSON object when Content-Type says JSON, else the query string's and the form's
    (the first value of each name)."""
    if is_json(request):
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            data = None
        if not isinstance(data, dict):
            raise ApiError(400, "Invalid JSON format")
        return data
    if mime(request) == "multipart/form-data":
        raise ApiError(400, "Invalid request: send JSON or a form (application/x-www-form-urlencoded); "
                       "multipart/form-data is not read")
    try:
        pairs = parse_qsl(request.url.query, keep_blank_values=True, errors="strict") + \
            parse_qsl(raw.decode("utf-8"), keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"Invalid request: the form is not valid UTF-8 ({e.reason})") from None
    values: dict = {}
    for name, value in pairs:
        values.setdefault(name, value)
    return values


def check_key(values: dict, request: Request, key: str | None) -> None:
    """The server's key, given as the body's api_key (LibreTranslate's) or as relmt's bearer header."""
    if key is None:
        return
    header, given = request.headers.get("authorization"), values.get("api_key")
    if authorized(header, key) or (given and hmac.compare_digest(str(given).encode(), key.encode())):
        return
    if header or given:
        raise ApiError(403, "Invalid API key", "api_key")
    raise ApiError(400, "Please contact the server operator to get an API key", "api_key")


def name(code: str) -> str:
    return NAMES.get(code, code)


def unique(seq: list, *extra) -> list:
    """seq in order without repeats, nor what is in `extra`."""
    out: list = []
    for x in seq:
        if x not in out and x not in extra:
            out.append(x)
    return out


@dataclass
class Asked:
    """A /translate request's fields, checked as far as they can be before the model is loaded."""

    texts: list[str]
    batch: bool  # q was a list
    source: str
    target: str
    format: str
    alternatives: int


@dataclass
class LtRequest:
    sentences: list[str]  # what the batcher decodes: the texts' lines
    decode: DecodeConfig
    items: list[list[Part]]  # each text's kept parts and sentence indices (relmt/serve/markup.py)
    batch: bool
    html: bool
    alternatives: int
    detected: dict | None  # source=auto: {"confidence", "language"}
    asks: Asks = field(default_factory=Asks)


def read_translate(raw: bytes, request: Request, state: State) -> Asked:
    values = fields(raw, request)
    check_key(values, request, state.api_key)
    q, source, target = values.get("q"), values.get("source"), values.get("target")
    for key, value in (("q", q), ("source", source), ("target", target)):
        if not value:
            raise ApiError(400, f"Invalid request: missing {key} parameter")
    batch = isinstance(q, list)
    texts = q if batch else [q]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError(400, "Invalid request: q must be a string or a list of strings")
    if not is_json(request):  # LibreTranslate: a form's line ends are LF
        texts = ["\n".join(t.splitlines()) for t in texts]
    try:
        alternatives = max(0, int(values.get("alternatives", 0)))
    except (TypeError, ValueError):
        raise ApiError(400, "Invalid request: alternatives parameter is not a number") from None
    if alternatives > state.args.max_beam - 1:  # nbest = alternatives + 1 <= beam <= max_beam
        raise ApiError(400, f"Invalid request: alternatives parameter must be <= {state.args.max_beam - 1}")
    limit = state.args.max_lines
    if batch and len(texts) > limit:
        raise ApiError(400, f"Invalid request: request ({len(texts)}) exceeds text limit ({limit})")
    for t in texts:
        if len(t) > state.args.max_line_chars:
            raise ApiError(400, f"Invalid request: request ({len(t)}) exceeds text limit ({state.args.max_line_chars})")
    return Asked(texts, batch, str(source), str(target), str(values.get("format") or "text"), alternatives)


def source_of(pairs: list[tuple[str, str]], source: str, target: str) -> tuple[str, dict | None]:
    """The source language `source` means, and LibreTranslate's detectedLanguage for source=auto: the model's
    source (with confidence 100), or of several the first that translates into `target` (confidence 0: nothing
    was detected)."""
    if source != "auto":
        return source, None
    sources = unique([s for s, _ in pairs])
    chosen = next((s for s, t in pairs if t == target), sources[0])
    return chosen, {"confidence": 100.0 if len(sources) == 1 else 0.0, "language": chosen}


def parse_translate(asked: Asked, state: State) -> LtRequest:
    translator = state.batcher.translator
    pairs = translator.pairs
    known = {code for pair in pairs for code in pair}
    source, detected = source_of(pairs, asked.source, asked.target)
    for code in (source, asked.target):
        if code not in known:
            raise ApiError(400, f"{code} is not supported")
    if (source, asked.target) not in pairs:
        raise ApiError(400, f"{name(asked.target)} ({asked.target}) is not available as a target language from "
                       f"{name(source)} ({source})")
    if asked.format not in ("text", "html"):
        raise ApiError(400, f"{asked.format} format is not supported")
    html = asked.format == "html"
    sentences: list[str] = []
    items = [html_parts(t, sentences) if html else lines(t, sentences) for t in asked.texts]
    limit = state.args.max_lines
    if len(sentences) > limit:  # each line is one of max_lines
        raise ApiError(400, f"Invalid request: request ({len(sentences)}) exceeds text limit ({limit})")
    for s in sentences:  # NUL, lone surrogates: as /v1/translate refuses them
        check_line(s, "q", state.args)
    try:
        sentences = translator.tagged(sentences, asked.target if translator.tgt_langs else None)
    except UserError as e:
        raise ApiError(400, str(e)) from None
    default = state.batcher.default_decode
    n = asked.alternatives
    decode = request_decode({"nbest": n + 1, "beam": max(default.beam, n + 1)} if n else {}, state.args, default)
    return LtRequest(sentences, decode, items, asked.batch, html, n, detected)


def answer(req: LtRequest, results: list, ids: list) -> dict:
    """LibreTranslate's answer: translatedText, then detectedLanguage (source=auto) and alternatives (asked for),
    each a list for a list of texts. Alternative k of a text has each line's k-th best (its last where it has
    fewer); repeats, the best and "" are left out, as LibreTranslate does; none for HTML, as there."""
    def nth(k: int) -> list[str]:
        return [hyps[min(k, len(hyps) - 1)].text if hyps else "" for hyps in results]

    best = [joined(parts, nth(0), req.html) for parts in req.items]
    alternatives = [[] if req.html else unique([joined(parts, nth(k)) for k in range(1, req.alternatives + 1)],
                                                text, "")
                    for parts, text in zip(req.items, best)]
    body: dict = {"translatedText": best if req.batch else best[0]}
    if req.detected is not None:
        body["detectedLanguage"] = [req.detected] * len(best) if req.batch else req.detected
    if req.alternatives:
        body["alternatives"] = alternatives if req.batch else alternatives[0]
    return body


DOOR = Door(read_translate, parse_translate, answer, error)


def languages(pairs: list[tuple[str, str]]) -> list[dict]:
    """Each language of the model's pairs (sources first) with the targets it translates into."""
    codes = unique([s for s, _ in pairs] + [t for _, t in pairs])
    return [{"code": c, "name": name(c), "targets": unique([t for s, t in pairs if s == c])} for c in codes]


def settings(state: State, pairs: list[tuple[str, str]]) -> dict:
    """LibreTranslate's /frontend/settings from relmt-serve's: no suggestions, no files; its first pair."""
    source, target = pairs[0]
    return {"charLimit": state.args.max_line_chars, "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": state.api_key is not None, "keyRequired": state.api_key is not None, "suggestions": False,
            "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": name(source)},
                         "target": {"code": target, "name": name(target)}}}


def loaded_pairs(state: State) -> list[tuple[str, str]]:
    """The model's language pairs, or an ApiError(503) while it loads or the server shuts down."""
    batcher = state.batcher
    if not batcher.ready or state.draining:
        raise ApiError(503, f"not ready: {batcher.load_error or 'the model is loading'}; retry later")
    return batcher.translator.pairs


async def detect(request: Request, state: State) -> Response:
    """POST /detect: the model's source language(s), whatever q holds (relmt detects nothing): confidence 100
    for a model of one source language, 0 for each of several."""
    try:
        values = fields(await read_body(request, state.args.max_body_bytes, state.args.request_timeout_s), request)
        check_key(values, request, state.api_key)
        if not values.get("q"):
            raise ApiError(400, "Invalid request: missing q parameter")
        sources = unique([s for s, _ in loaded_pairs(state)])
    except ApiError as e:
        state.metrics.errors.labels("not_ready" if e.status == 503 else error_kind(e)).inc()
        return error(e.status, e.message, retry=e.status == 503)
    except ClientDisconnect:
        state.metrics.errors.labels("client_left").inc()
        return Response(status_code=499)
    confidence = 100.0 if len(sources) == 1 else 0.0
    return JSONResponse([{"confidence": confidence, "language": s} for s in sources])


def describe(state: State, what) -> Response:
    """GET /languages and /frontend/settings: `what(pairs)`, or 503 while the model loads."""
    try:
        return JSONResponse(what(loaded_pairs(state)))
    except ApiError as e:
        return error(e.status, e.message, retry=True)
