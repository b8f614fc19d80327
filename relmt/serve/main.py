"""The relmt-serve process: arguments, the listening socket, uvicorn, and a graceful SIGTERM.

SIGTERM (or Ctrl-C) stops accepting connections, answers every request already accepted (the
decoder finishes what is queued), and exits 0 within shutdown_deadline_s; a request sent meanwhile on a
connection kept alive from before is answered 503 + Retry-After + `Connection: close`
(relmt/serve/protocol.py, GracefulServer.shutdown). Past the deadline the
requests still unanswered are failed, logged and counted, and the exit status is 1: nothing is
dropped silently. A model that cannot be loaded exits 2 with the reason, as relmt-translate does.
"""

from __future__ import annotations

import logging
import socket
import sys

from relmt.errors import UserError

USAGE = ("relmt-serve checkpoint=PATH|[A.pt,B.pt,...] [engine=torch|onnx|aoti|ctranslate2] [device=auto]\n"
         "            [quantization=int8] [precision=auto|fp32|bf16|fp16] [threads=0] [host=127.0.0.1] [port=8000]\n"
         "            [max_body_bytes=65536] [max_lines=64] [max_line_chars=1000] [max_beam=8]\n"
         "            [max_connections=1024] [request_timeout_s=10] [cors_origins=[https://app.example.org,...]]\n"
         "            [queue_size=256] [max_batch_tokens=2000] [max_wait_ms=30] [continuous=true]\n"
         "            [max_len_a=] [max_len_b=] [min_len=] [beam=] [nbest=] [lenpen=] [length_norm=]\n"
         "            [eos_candidates=] [sampling=] [topk=] [topp=] [temperature=] [seed=]\n"
         "            [shutdown_deadline_s=30] [log_level=warning]\n"
         "Serve translations over HTTP: POST /v1/translate {\"text\": [...], \"options\": {\"beam\": 4}},\n"
         "GET /health, /ready, /metrics (Prometheus) and a form at /. A host other than loopback needs the\n"
         "environment variable RELMT_SERVE_API_KEY (clients send 'Authorization: Bearer <key>').\n"
         "max_connections caps the translations in progress (503 past it); a request head or body that takes\n"
         "longer than request_timeout_s closes its connection (a body: after a 408). cors_origins lets pages of\n"
         "those origins call the server from a browser. beam=, nbest=, ... (relmt-translate's decoding keys) are\n"
         "the server's decoding defaults, over the checkpoint's decode config: what a request without options gets.\n"
         "Put TLS and a reverse proxy in front (docs/serving.md).")


def listening_socket(host: str, port: int) -> socket.socket:
    """Bound before the model loads, so that port=0 can name the port it got (and /health answers)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UserError(f"host={host} port={port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    return sock


def serve(argv: list[str]) -> int:
    from functools import partial
    from pathlib import Path

    import uvicorn

    from relmt import checkpoint
    from relmt.cli.common import parse_args, setup_logging
    from relmt.serve.app import create_app
    from relmt.serve.args import EXAMPLE, ServeArgs, check_args, decoding_overrides, length_overrides, server_decode
    from relmt.serve.batcher import Batcher
    from relmt.serve.metrics import Metrics
    from relmt.serve.pipeline import State
    from relmt.serve.protocol import GracefulServer, HeadDeadline
    from relmt.serve.security import api_key

    args = parse_args(ServeArgs, argv, EXAMPLE)
    check_args(args)
    length_overrides(args)  # the output length and decoding settings, checked before anything loads
    decoding_overrides(args)
    key = api_key(args.host)  # before anything loads: a server that would be open to others never starts
    paths = [str(p) for p in args.checkpoint] if isinstance(args.checkpoint, list) else [str(args.checkpoint)]
    for path in paths:
        if not Path(path).is_dir() and not checkpoint.resolve(path).is_file():
            raise UserError(f"checkpoint={path}: no such checkpoint")
    setup_logging(logging.WARNING)

    def load():
        import torch

        from relmt.decode.translator import Translator
        from relmt.runtime import choose_threads, tune_cpu

        cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
        choose_threads(args.threads, torch.device("cuda" if cuda else "cpu"), "decoding")  # 0: the free cores
        tune_cpu()
        translator = Translator.from_checkpoints(paths, device=args.device, precision=args.precision or None,
                                                 engine=args.engine, quantization=args.quantization or "float32")
        translator.decode = server_decode(translator.decode, args)  # what a request without options gets
        return translator

    metrics = Metrics()
    failed: list[str] = []
    server: GracefulServer | None = None

    def load_failed(message: str) -> None:
        failed.append(message)
        if server is not None:
            server.should_exit = True

    batcher = Batcher(load, args.queue_size, args.max_batch_tokens, args.max_wait_ms, metrics.observe_batch,
                      metrics.queue.set, load_failed, continuous=args.continuous,
                      on_apart=lambda reason: metrics.apart.labels(reason).inc(),
                      max_output_tokens=args.max_request_output_tokens, on_cancelled=metrics.left_search)
    state = State(args, batcher, metrics, api_key=key)
    # no limit_concurrency: uvicorn's counts every open connection, unfinished and idle ones included, and
    # answers 503 to /health past it; max_connections counts translations (relmt/serve/pipeline.py)
    protocol = partial(HeadDeadline, deadline_s=args.request_timeout_s,
                       on_timeout=metrics.errors.labels("request_timeout").inc, draining=lambda: state.draining)
    config = uvicorn.Config(create_app(state), http=protocol, log_level=args.log_level, lifespan="on",
                            timeout_graceful_shutdown=args.shutdown_deadline_s, server_header=False)
    server = GracefulServer(config, state)
    sock = listening_socket(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"relmt-serve: listening on http://{host if ':' not in host else f'[{host}]'}:{port} "
          "(GET /ready answers 200 once the model is loaded)", file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if failed:
        raise UserError(failed[0])
    if left := sum(state.unanswered):
        print(f"relmt-serve: error: {left} request(s) were still unanswered at the shutdown deadline "
              f"(shutdown_deadline_s={args.shutdown_deadline_s}): their connections were closed or they were "
              "answered 500", file=sys.stderr)
        return 1
    return 0


def check_extra() -> None:
    """The serve extra's packages, or a UserError saying how to install them (not a bare ImportError)."""
    import importlib

    for module in ("fastapi", "uvicorn", "prometheus_client"):
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise UserError(f"relmt-serve needs the serve extra (fastapi, uvicorn, prometheus-client; {e}): "
                            "pip install 'relmt[serve]', or pip install -e '.[serve]' in a checkout") from None


def main() -> None:
    """Console script `relmt-serve`."""
    from relmt.cli.common import EXIT_USER_ERROR, format_error

    argv = sys.argv[1:]
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        sys.exit(0)
    try:
        check_extra()
        status = serve(argv)
    except (UserError, ValueError) as e:
        print(f"relmt-serve: error: {format_error(e)}", file=sys.stderr)
        status = EXIT_USER_ERROR
    sys.exit(status)
