"""relmt-serve's key=value arguments (parsed by relmt.cli.common.parse_args) and their documented defaults."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from relmt.errors import UserError

EXAMPLE = "relmt-serve checkpoint=runs/x/checkpoints/best.pt"


@dataclass
class ServeArgs:
    checkpoint: Any = "???"  # a path, or a list of them ([a.pt,b.pt]) for an ensemble; fixed at start
    engine: str = "torch"  # torch | onnx | aoti | ctranslate2, as relmt-translate engine=
    quantization: str = ""  # engine=aoti: int8, as relmt-translate quantization=; default float32
    device: str = "auto"
    precision: str = ""  # auto | fp32 | bf16 | fp16; default: the checkpoint's train.precision
    # torch's intra-op threads for decoding, as relmt-train's and relmt-translate's threads=; 0 = the cores free
    # at start (relmt.runtime.choose_threads; OMP_NUM_THREADS, where set, is kept)
    threads: int = 0
    host: str = "127.0.0.1"  # any other address needs RELMT_SERVE_API_KEY (relmt/serve/security.py)
    port: int = 8000  # 0: a free port, printed at start ("relmt-serve: listening on http://HOST:PORT")
    # limits on each request (413 past them)
    max_body_bytes: int = 65536  # the request body, in bytes
    max_lines: int = 64  # sentences in one request
    max_line_chars: int = 1000  # characters in one sentence
    max_beam: int = 8  # options.beam (and so nbest) in one request (422 past it)
    # constraint phrases in one request (413 past it); a sentence may hold at most 16 phrases of 64 pieces in all
    # (relmt.decode.constraints.MAX_PHRASES, MAX_PIECES): each phrase raises the search's cost
    max_request_phrases: int = 64
    # a request's output tokens at most, in all: each line's limit floor(max_len_a |x| + max_len_b), |x| its source
    # tokens, summed (413 past it). With the defaults a request costs at most this many decoder steps of one
    # sentence (docs/serving.md, "What one request may cost"); 0: no limit
    max_request_output_tokens: int = 8192
    # translation requests in progress at once (their body being read, queued or decoding); past it 503 +
    # Retry-After. The health routes and the page are not counted, and idle or unfinished connections neither:
    # they are closed by the timeouts below and by uvicorn's 5 s keep-alive
    max_connections: int = 1024
    # the time a request's head (from the connection opening, or from the request's first byte) and then its
    # body may take to arrive: past it the connection is closed (head) or answered 408 and closed (body)
    request_timeout_s: float = 10.0
    # origins whose pages may call the server from a browser (CORS), e.g. [https://app.example.org] or a
    # comma-separated string; "'*'" for any origin. Empty: none (browsers allow only the page at /)
    cors_origins: Any = ""
    # the scheduler (relmt/serve/batcher.py)
    queue_size: int = 256  # sentences waiting for the decoder; a request that does not fit gets 503 + Retry-After
    max_batch_tokens: int = 2000  # source tokens (sentencepiece pieces) gathered into one batch
    # how long the first queued sentence waits for others to join it: each group costs an encoder pass and,
    # under continuous batching, a copy of the caches, so a group of several sentences beats a small one at every
    # step; a lone client never waits (docs/serving.md)
    max_wait_ms: float = 30.0
    # join new sentences into the running beam search between two steps (relmt/decode/continuous.py); false, or
    # engine != torch, an ensemble, RoPE or sampling: batch after batch, waiting up to max_wait_ms to gather one
    continuous: bool = True
    # the output length, over the checkpoint's decode config (relmt-translate's decode keys of the same names):
    # at most floor(max_len_a * |x| + max_len_b) tokens, at least min_len; None: the checkpoint's
    max_len_a: float | None = None
    max_len_b: int | None = None
    min_len: int | None = None
    # the decoding defaults, over the checkpoint's decode config (relmt-translate's decode keys of the same names):
    # what a request without options gets, and what a request's options replace one by one (docs/serving.md,
    # "Decoding defaults"); None: the checkpoint's. beam is at most max_beam, nbest at most beam
    beam: int | None = None
    nbest: int | None = None
    lenpen: float | None = None
    length_norm: str | None = None  # gnmt | power
    eos_candidates: str | None = None  # t2t | fairseq
    sampling: bool | None = None
    topk: int | None = None
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    shutdown_deadline_s: float = 30.0  # on SIGTERM: time to answer the requests already accepted
    log_level: str = "warning"  # uvicorn's: critical | error | warning | info | debug


LENGTH_KEYS = ("max_len_a", "max_len_b", "min_len")
# the decoding options a request may set (relmt/serve/requests.py Options), each with a server-side default
DECODING_KEYS = ("beam", "nbest", "lenpen", "length_norm", "eos_candidates", "sampling", "topk", "topp", "temperature",
                 "seed")


def length_overrides(args: ServeArgs) -> dict:
    """The output length settings given at start, checked as relmt-translate checks decode.<key>."""
    from relmt.config import DecodeConfig

    over = {k: getattr(args, k) for k in LENGTH_KEYS if getattr(args, k) is not None}
    try:
        DecodeConfig(**over)
    except ValueError as e:  # a negative length, named as decode.<key>
        raise UserError(str(e)) from None
    return over


def decoding_overrides(args: ServeArgs) -> dict:
    """The decoding defaults given at start, checked before the checkpoint is read as far as they can be alone:
    each value as relmt-translate checks decode.<key>, beam and nbest within max_beam, nbest within the beam given,
    a sampling setting with sampling=false. What depends on the checkpoint's own settings (nbest=3 with its beam=2)
    is checked as it loads (`server_decode`)."""
    from relmt.cli.translate import decode_with_overrides
    from relmt.config import DecodeConfig

    over = {k: getattr(args, k) for k in DECODING_KEYS if getattr(args, k) is not None}
    for key in ("beam", "nbest"):
        if over.get(key, 0) > args.max_beam:
            raise UserError(f"{key}={over[key]}: more than max_beam={args.max_beam}, the beam a request may ask "
                            f"for at most: give {key}={args.max_beam} or less, or a larger max_beam")
    try:  # on a stand-in for the checkpoint's settings that leaves room for the others: max_beam wide, sampling
        decode_with_overrides(DecodeConfig(beam=args.max_beam, sampling=True), over)
    except UserError as e:
        raise UserError(str(e).replace("decode.", "")) from None
    return over


def server_decode(checkpoint, args: ServeArgs):
    """What a request without options is decoded with: the checkpoint's decode config (a DecodeConfig) with the
    output length and the decoding defaults given at start, checked together (a UserError), its beam within
    max_beam (else every request without a beam of its own would be refused)."""
    from relmt.cli.translate import decode_with_overrides

    over = length_overrides(args) | decoding_overrides(args)
    try:
        decode = decode_with_overrides(checkpoint, over)
    except UserError as e:
        raise UserError(f"{e} (the settings given at start, over the checkpoint's decode config)") from None
    if decode.beam > args.max_beam:
        raise UserError(f"the checkpoint's decode.beam={decode.beam} is more than max_beam={args.max_beam}, so "
                        f"every request without a beam of its own would be refused: give beam={args.max_beam} or "
                        "less (the server's default), or a larger max_beam")
    return decode


def check_args(args: ServeArgs) -> None:
    """Limits that would make the server refuse everything, or never refuse, are said at start."""
    if args.max_request_output_tokens < 0:
        raise UserError(f"max_request_output_tokens={args.max_request_output_tokens}: must be >= 0 (0: no limit)")
    for key in ("max_body_bytes", "max_lines", "max_line_chars", "max_beam", "max_request_phrases", "max_connections",
                "queue_size", "max_batch_tokens"):
        if getattr(args, key) < 1:
            raise UserError(f"{key}={getattr(args, key)}: must be >= 1")
    if args.queue_size < args.max_lines:
        raise UserError(f"queue_size={args.queue_size}: must be >= max_lines={args.max_lines}, or a request of "
                        "max_lines sentences could never be queued")
    if args.max_wait_ms < 0 or args.shutdown_deadline_s <= 0:
        raise UserError(f"max_wait_ms={args.max_wait_ms} must be >= 0 and shutdown_deadline_s="
                        f"{args.shutdown_deadline_s} > 0")
    if not args.request_timeout_s > 0:
        raise UserError(f"request_timeout_s={args.request_timeout_s:g}: must be > 0")
    cors_origins(args)
    if args.threads < 0:
        raise UserError(f"threads={args.threads}: must be >= 0 (0: the cores free at start)")
    if not 0 <= args.port <= 65535:
        raise UserError(f"port={args.port}: must be in [0, 65535] (0: any free port)")


def cors_origins(args: ServeArgs) -> list[str]:
    """cors_origins as a list of origins (scheme://host[:port], as browsers send them in Origin), or a
    UserError naming the one that is not."""
    given = args.cors_origins
    origins = [o.strip() for o in given.split(",") if o.strip()] if isinstance(given, str) else \
        [str(o).strip() for o in given or []]
    for origin in origins:
        if origin != "*" and not re.fullmatch(r"https?://[^/?#\s]+", origin):
            raise UserError(f"cors_origins: {origin!r} is not an origin: write scheme://host[:port], with no path "
                            "or trailing slash, e.g. https://app.example.org (or '*' for any origin)")
    return origins
