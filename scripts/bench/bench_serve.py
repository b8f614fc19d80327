#!/usr/bin/env python
"""relmt-serve under load (issue 44 §6): the real server process, driven over loopback by 1, 8, 32 and
128 concurrent clients, one sentence per request, beside offline decoding of the same sentences with
the same model and settings as references. Run it alone on the machine.

    python scripts/bench/bench_serve.py --checkpoint runs/x/checkpoints/best.pt --engine aoti
    python scripts/bench/bench_serve.py --checkpoint best.pt --src test.src --clients 1 8 --requests 40   # smoke

- Sentences: --src, one a line (default: the peer corpus's test set, $SCRATCH/corpus/test.src as
  scripts/peers/bench_peers.sh makes it; generated with --generator when missing).
- The server: `python -m relmt.serve` on 127.0.0.1 (a port it picks), --threads intra-op threads,
  queue_size large enough for every client. Each level sends at most --requests requests and stops
  after --max-seconds; a client sends its next request when its last is answered.
- References, in this process before the server starts and again after it stops, on the same threads (the
  ratios take the faster of the two, `faster`): the Translator decoding
  the sentences 32 per batch (decode.max_sentences=32, relmt-translate's batching), and one at a time: the
  sentences that a level sends, in its order (--single-n of them, default --requests), so that the 1-client
  level's p50 and the offline p50 are medians over the same sentences.
- --fixed-length N: every hypothesis exactly N tokens (relmt-serve min_len=N max_len_a=0 max_len_b=N, the
  references alike), as scripts/peers/bench_peers.sh forces them, so that two models decode the same work
  whatever they learned.
- --onmt-model: OpenNMT-py's onmt_server (Flask + waitress, in scripts/peers/install.sh's environment under
  $SCRATCH/onmt) serves that model after relmt-serve, under the same load and threads: beam 4, GNMT length
  penalty 0.6, the fixed length alike. scripts/bench/serve_models.py trains both models.
- Each --batching mode in turn (default both: continuous, the server's default, then batch by batch,
  relmt-serve continuous=false), in the same run.
- Reported per mode and level: sentences/s, p50/p95/p99 latency, errors; and the issue's ratios, of the
  first mode, with the floor that Little's law puts under the p99 ratio (`goals`). Writes
  --json and --md (default docs/results/performance/serve_cpu.json and .md).
Loops are bounded in count and time, and every request goes to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER_SEED = 1234


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q / 100
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def load_sentences(opts: argparse.Namespace) -> list[str]:
    src = opts.src
    if src is None:
        corpus = Path(os.environ.get("SCRATCH", "/tmp/relmt-peers")) / "corpus"
        if not (corpus / "test.src").is_file():
            subprocess.run([sys.executable, str(opts.generator), str(corpus), "--seed", str(PEER_SEED)], check=True)
        src = corpus / "test.src"
    lines = [line for line in Path(src).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{src}: no sentences")
    return lines


def relmt_body_of(opts: argparse.Namespace):
    """The JSON a relmt-serve client posts: the sentence, and --beam as the request's option (0: the server's)."""
    return (lambda sentence: {"text": sentence, "options": {"beam": opts.beam}}) if opts.beam else relmt_body


def fixed_length(opts: argparse.Namespace) -> dict:
    """The decode settings that force every hypothesis to --fixed-length tokens (none when 0)."""
    n = opts.fixed_length
    return dict(min_len=n, max_len_a=0.0, max_len_b=n) if n else {}


def sent(sentences: list[str], n: int) -> list[str]:
    """The first n sentences that a level sends, in order (`drive`: request i sends sentence i mod len)."""
    return [sentences[i % len(sentences)] for i in range(n)]


def faster(refs: list[dict]) -> dict:
    """Of offline references measured at different times, the faster of each measure: the host's speed drifts by
    a tenth or more within a run, and the ratios to the server should not gain from a slow moment."""
    return {**refs[0], "batch32_sent_per_s": max(r["batch32_sent_per_s"] for r in refs),
            "single_p50_s": min(r["single_p50_s"] for r in refs)}


def offline(opts: argparse.Namespace, sentences: list[str]) -> dict:
    """Sentences/s of the Translator at 32 sentences per batch, and seconds per sentence one at a time, over
    the sentences that the 1-client level sends."""
    import torch

    from relmt.decode.translator import Translator
    from relmt.runtime import tune_cpu

    tune_cpu()
    torch.set_num_threads(opts.threads)
    translator = Translator.from_checkpoint(opts.checkpoint, engine=opts.engine)
    fixed = fixed_length(opts) | ({"beam": opts.beam} if opts.beam else {})
    translator.translate(sentences[:4], **fixed)  # warm-up (an engine's first call)
    batch = sent(sentences, opts.requests)
    start = time.perf_counter()
    translator.translate(batch, max_sentences=32, **fixed)
    batched = len(batch) / (time.perf_counter() - start)
    single, deadline = [], time.monotonic() + opts.max_seconds
    for s in sent(sentences, opts.single_n or opts.requests):
        t = time.perf_counter()
        translator.translate([s], **fixed)
        single.append(time.perf_counter() - t)
        if time.monotonic() > deadline:
            break
    return {"batch32_sent_per_s": batched, "single_p50_s": statistics.median(single), "single_n": len(single),
            "batch32_n": len(batch)}


class ServerProcess:
    def __init__(self, opts: argparse.Namespace, log: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads), **dict(kv.split("=", 1) for kv in opts.server_env)}
        env.pop("RELMT_SERVE_API_KEY", None)
        self.log = log
        with open(log, "wb") as out:
            program = [str(ROOT / "scripts/bench/serve_echo.py")] if opts.mode == "echo" else ["-m", "relmt.serve"]
            self.proc = subprocess.Popen(
                [sys.executable, *program, f"checkpoint={opts.checkpoint}", f"engine={opts.engine}",
                 "host=127.0.0.1", "port=0", f"queue_size={max(256, 2 * max(opts.clients))}",
                 f"max_wait_ms={opts.max_wait_ms}", f"continuous={'true' if opts.mode == 'continuous' else 'false'}",
                 *(f"{k}={v}" for k, v in fixed_length(opts).items())],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        self.url = self.wait(r"listening on (http://127\.0\.0\.1:\d+)")

    def wait(self, pattern: str) -> str:
        import httpx

        deadline = time.monotonic() + 600  # an engine may compile on first use
        url = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"relmt-serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            if url is None and (m := re.search(pattern, self.log.read_text(errors="replace"))):
                url = m.group(1)
            if url is not None and httpx.get(url + "/ready", timeout=5).status_code == 200:
                return url
            time.sleep(0.1)
        raise SystemExit(f"relmt-serve not ready in 600 s:\n{self.log.read_text()}")

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


class OnmtServer(ServerProcess):
    """onmt_server in OpenNMT-py's own environment, through scripts/peers/ftz.py (the threads and flush-to-zero
    that bench_peers.sh gives every toolkit), serving --onmt-model on 127.0.0.1."""

    PATH, ID = "/translate", 100

    def __init__(self, opts: argparse.Namespace, log: Path) -> None:
        import socket

        model = opts.onmt_model.resolve()
        decode = {"gpu": -1, "beam_size": 4, "length_penalty": "wu", "alpha": 0.6, "batch_size": 64}
        if opts.fixed_length:  # max_length_ratio 0 lifts OpenNMT-py's cap of 1.25 x the source + 5
            decode.update(min_length=opts.fixed_length, max_length=opts.fixed_length, max_length_ratio=0)
        conf = log.with_suffix(".conf.json")
        conf.write_text(json.dumps({"models_root": str(model.parent), "models": [
            {"id": self.ID, "model": model.name, "timeout": -1, "on_timeout": "to_cpu", "load": True, "opt": decode}]}))
        with socket.socket() as sock:  # a free port (onmt_server cannot pick one and say it)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [opts.onmt_python, ROOT / "scripts/peers/ftz.py", "--threads", str(opts.threads),
                 "onmt.bin.server:main", "--ip", "127.0.0.1", "--port", str(port), "--url_root", "/translator",
                 "--model_config", conf],
                stdout=out, stderr=subprocess.STDOUT,  # OpenNMT-py 3.5 checkpoints hold an argparse.Namespace
                env={**os.environ, "OMP_NUM_THREADS": str(opts.threads), "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
        self.url = f"http://127.0.0.1:{port}/translator"
        self.wait_health()

    def wait_health(self) -> None:
        import httpx

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"onmt_server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"onmt_server not up in 300 s:\n{self.log.read_text()[-3000:]}")

    @classmethod
    def body(cls, sentence: str) -> list:
        return [{"src": sentence, "id": cls.ID}]

    @staticmethod
    def ok(status: int, answer) -> bool:  # onmt_server answers its errors with 200 and {"error": ...}
        return status == 200 and isinstance(answer, list)

    @staticmethod
    def words(answer) -> int:
        return len(answer[0][0]["tgt"].split())


def relmt_body(sentence: str) -> dict:
    return {"text": sentence}


def relmt_ok(status: int, answer) -> bool:
    return status == 200


def relmt_words(answer) -> int:
    return len(answer["translations"][0].split())


async def drive(url: str, sentences: list[str], clients: int, requests: int, seconds: float,
                path: str = "/v1/translate", body=relmt_body, ok=relmt_ok, words=relmt_words) -> dict:
    """`clients` concurrent clients, each one request (one sentence) at a time, until `requests` have
    been sent or `seconds` have passed; `body(sentence)` is the JSON posted to url + path, `ok(status, answer)`
    whether it was answered (answer: the decoded JSON), `words(answer)` the words of its translation.

    The clients are aiohttp's, on one event loop in this process: the load generator shares the machine's cores
    with the server, and httpx's asynchronous client spent more of them per request (its CPU time came off the
    server's; scripts/bench/README.md)."""
    import aiohttp

    latencies: list[float] = []
    lengths: list[int] = []
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.monotonic() + seconds

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal sent
        while sent < requests and time.monotonic() < deadline:
            sentence = sentences[sent % len(sentences)]
            sent += 1
            t = time.perf_counter()
            try:
                async with http.post(url + path, json=body(sentence)) as r:
                    answer = await r.json(content_type=None)
                    key = None if ok(r.status, answer) else str(r.status)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                key = type(e).__name__
            if key is None:
                latencies.append(time.perf_counter() - t)
                lengths.append(words(answer))
            else:
                errors[key] = errors.get(key, 0) + 1

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:
        start, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"clients": clients, "requests": sent, "ok": len(latencies), "errors": errors,
            "sent_per_s": len(latencies) / wall, "p50_s": percentile(latencies, 50),
            "p95_s": percentile(latencies, 95), "p99_s": percentile(latencies, 99), "seconds": wall,
            "mean_words": statistics.fmean(lengths) if lengths else 0.0,
            "client_cpu_share": cpu / wall}  # of one core, taken by the load generator from the server's


def batch_sizes(url: str) -> tuple[float, float]:
    """relmt-serve's /metrics: the sum and count of its batch-size histogram (continuous: sentences per step)."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return tuple(float(re.search(rf"^relmt_serve_batch_sentences_{k} (\S+)$", text, re.M).group(1))
                 for k in ("sum", "count"))


def goals(levels: dict[int, dict], ref: dict, onmt: dict[int, dict] | None = None,
          echo: dict[int, dict] | None = None) -> list[tuple[str, str, str]]:
    """(goal, target, measured) for the issue's goals that this run measures."""
    rows = []
    if onmt and 32 in onmt and 32 in levels:
        rows.append(("relmt-serve ÷ onmt_server, sentences/s at 32 clients", "≥ 3",
                     f"{levels[32]['sent_per_s'] / onmt[32]['sent_per_s']:.2f}"))
    if 32 in levels:
        rows.append(("32 clients sentences/s ÷ offline at 32 per batch", "≥ 0.8",
                     f"{levels[32]['sent_per_s'] / ref['batch32_sent_per_s']:.2f}"))
    if 1 in levels:
        rows.append(("1 client p50 ÷ offline one-at-a-time", "≤ 1.2",
                     f"{levels[1]['p50_s'] / ref['single_p50_s']:.2f}"))
    if 1 in levels and 32 in levels:
        rows.append(("32 clients p99 ÷ 1 client p50", "≤ 4", f"{levels[32]['p99_s'] / levels[1]['p50_s']:.2f}"))
        # Little's law: c closed-loop clients (each sends again when answered) at X sentences/s wait c / X on
        # average, and p99 >= the mean; so the ratio cannot fall below 32 / (X_32 * p50_1) at this throughput
        rows.append(("its floor at this throughput: 32 ÷ (sentences/s at 32 × 1 client p50)", "",
                     f"{32 / (levels[32]['sent_per_s'] * levels[1]['p50_s']):.2f}"))
    if 128 in levels:
        rows.append(("errors at 128 clients", "0", str(sum(levels[128]["errors"].values()))))
    if echo and 1 in echo:
        rows.append(("the server's own floor (echo translator), 1 client p50", "≤ 1 ms",
                     f"{echo[1]['p50_s'] * 1e3:.2f} ms"))
    return rows


def markdown(payload: dict) -> str:
    ref = payload["offline"]
    lines = [f"# relmt-serve under load ({payload['engine']}, {payload['threads']} threads)", "",
             f"{payload['sentences']} sentences from `{payload['src']}`; checkpoint `{payload['checkpoint']}`; "
             f"{', '.join(f'{k} {v}' for k, v in payload['host'].items())}.", "",
             f"Command: `{payload['command']}`", ""]
    lines += [f"Beam: {payload['beam']} in every request's options and in the references." if payload.get("beam")
              else "Beam: the checkpoint's decode.beam, which relmt-serve and the references take.", ""]
    if payload.get("fixed_length"):
        lines += [f"Every hypothesis forced to {payload['fixed_length']} tokens (bench_peers.sh's rule), in "
                  "relmt-serve, the references" + (" and onmt_server" if payload.get("onmt_model") else "") + ".", ""]
    if payload.get("onmt_model"):
        lines += [f"onmt_server (OpenNMT-py 3.5.1) serves `{payload['onmt_model']}` under the same load, threads and "
                  "decoding settings (beam 4, GNMT length penalty 0.6).", ""]
    lines += ["| batching | clients | requests | sentences/s | p50 ms | p95 ms | p99 ms | errors | words/output | "
              "sentences per step (continuous) or batch | load generator's CPU, share of one core |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in payload["levels"]:
        batch = f"{row['mean_batch']:.1f}" if "mean_batch" in row else "—"  # onmt_server has no such metric
        lines.append(f"| {row['batching']} | {row['clients']} | {row['requests']} | {row['sent_per_s']:.1f} | "
                     f"{row['p50_s'] * 1e3:.1f} | {row['p95_s'] * 1e3:.1f} | {row['p99_s'] * 1e3:.1f} | "
                     f"{sum(row['errors'].values())} | {row.get('mean_words', 0):.1f} | {batch} | "
                     f"{row['client_cpu_share']:.2f} |")
    batched = " and ".join(f"{r['batch32_sent_per_s']:.1f}" for r in payload["offline_runs"])
    single = " and ".join(f"{r['single_p50_s'] * 1e3:.1f}" for r in payload["offline_runs"])
    lines += ["", f"Offline (the Translator in-process), before and after the server: {batched} sentences/s at 32 "
              f"per batch; {single} ms p50 one at a time "
              f"({ref['single_n']} sentences). The ratios below take the faster of each pair.", "",
              f"Goals, batching {payload['batching'][0]}:", "", "| goal | target | measured |", "|---|---|---|"]
    lines += [f"| {g} | {t} | {m} |" for g, t, m in payload["goals"]]
    lines += ["", f"relmt-serve's exit status after SIGTERM: {payload['exit_status']}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--src", type=Path, default=None)
    parser.add_argument("--generator", type=Path, default=ROOT.parent / "shared/bench/make_peer_corpus.py")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--requests", type=int, default=500, help="requests per level, at most")
    parser.add_argument("--max-seconds", type=float, default=120, help="time per level (and per reference), at most")
    parser.add_argument("--single-n", type=int, default=0,
                        help="sentences decoded one at a time offline, those the levels send first (0: --requests)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-wait-ms", type=float, default=30.0, help="relmt-serve's max_wait_ms (its default)")
    parser.add_argument("--batching", nargs="+", choices=["continuous", "batch"], default=["continuous", "batch"])
    parser.add_argument("--fixed-length", type=int, default=0, help="force every hypothesis to N tokens (0: off)")
    parser.add_argument("--beam", type=int, default=0,
                        help="the beam every request asks for (its options), and the references' (0: the checkpoint's "
                             "decode.beam, which relmt-serve takes by default)")
    parser.add_argument("--onmt-model", type=Path, default=None, help="an OpenNMT-py checkpoint for onmt_server")
    parser.add_argument("--server-env", nargs="*", default=[], metavar="KEY=VALUE",
                        help="environment variables for relmt-serve's process alone (not the offline references)")
    parser.add_argument("--echo", action="store_true",
                        help="also the server's own floor: relmt-serve with a translator that answers at once "
                             "(scripts/bench/serve_echo.py), at each level, after the batching modes")
    parser.add_argument("--onmt-python", type=Path,
                        default=Path(os.environ.get("SCRATCH", "/tmp/relmt-peers")) / "onmt/bin/python")
    parser.add_argument("--log", type=Path, default=Path("/tmp/relmt-bench-serve.log"))
    parser.add_argument("--json", type=Path, default=ROOT / "docs/results/performance/serve_cpu.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs/results/performance/serve_cpu.md")
    opts = parser.parse_args(argv)
    if bad := [kv for kv in opts.server_env if "=" not in kv or kv.startswith("=")]:
        parser.error(f"--server-env {' '.join(bad)}: give KEY=VALUE")
    sentences = load_sentences(opts)
    refs = [offline(opts, sentences)]
    print(f"offline: {json.dumps(refs[0])}", flush=True)
    rows, first, statuses = [], {}, {}
    for mode in opts.batching:
        opts.mode = mode
        server = ServerProcess(opts, opts.log)
        try:
            for clients in opts.clients:
                before = batch_sizes(server.url)
                row = {"batching": mode, **asyncio.run(drive(server.url, sentences, clients, opts.requests,
                                                                opts.max_seconds, body=relmt_body_of(opts)))}
                after = batch_sizes(server.url)
                row["mean_batch"] = (after[0] - before[0]) / max(after[1] - before[1], 1)
                rows.append(row)
                if mode == opts.batching[0]:
                    first[clients] = row
                print(json.dumps(row), flush=True)
        finally:
            statuses[mode] = server.stop()
    echo: dict[int, dict] = {}
    if opts.echo:
        opts.mode = "echo"
        server = ServerProcess(opts, opts.log.with_name(opts.log.stem + "-echo.log"))
        try:
            for clients in opts.clients:
                echo[clients] = {"batching": "echo (floor)", **asyncio.run(drive(
                    server.url, sentences, clients, opts.requests, opts.max_seconds, body=relmt_body_of(opts)))}
                rows.append(echo[clients])
                print(json.dumps(echo[clients]), flush=True)
        finally:
            statuses["echo"] = server.stop()
    status = max(statuses.values(), key=abs)
    refs.append(offline(opts, sentences))  # again after the server, so that the host's drift shows
    print(f"offline, after: {json.dumps(refs[1])}", flush=True)
    ref = faster(refs)
    onmt: dict[int, dict] = {}
    if opts.onmt_model:
        peer = OnmtServer(opts, opts.log.with_name(opts.log.stem + "-onmt.log"))
        try:
            for clients in opts.clients:
                onmt[clients] = {"batching": "onmt_server", **asyncio.run(drive(
                    peer.url, sentences, clients, opts.requests, opts.max_seconds, OnmtServer.PATH, OnmtServer.body,
                    OnmtServer.ok, OnmtServer.words))}
                rows.append(onmt[clients])
                print(json.dumps(onmt[clients]), flush=True)
        finally:
            peer.stop()
    from relmt.host import host

    given = argv if argv is not None else sys.argv[1:]
    payload = {"command": " ".join(["python scripts/bench/bench_serve.py", *given]),
               "engine": opts.engine, "threads": opts.threads, "checkpoint": str(opts.checkpoint),
               "src": str(opts.src or "peer corpus test.src"), "sentences": len(sentences), "host": host(),
               "batching": opts.batching, "offline": ref, "offline_runs": refs, "levels": rows,
               "goals": goals(first, ref, onmt, echo),
               "fixed_length": opts.fixed_length, "beam": opts.beam, "onmt_model": str(opts.onmt_model or ""),
               "exit_status": status, "exit_statuses": statuses}
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    opts.md.write_text(markdown(payload))
    print(f"wrote {opts.json} and {opts.md}")
    return payload


if __name__ == "__main__":
    main()
