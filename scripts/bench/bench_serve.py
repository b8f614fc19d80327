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
- References, in this process before the server starts, on the same threads: the Translator decoding
  the sentences 32 per batch (decode.max_sentences=32, relmt-translate's batching), and one at a time.
- Each --batching mode in turn (default both: continuous, the server's default, then batch by batch,
  relmt-serve continuous=false), in the same run.
- Reported per mode and level: sentences/s, p50/p95/p99 latency, errors; and the issue's ratios, of the
  first mode. Writes
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


def offline(opts: argparse.Namespace, sentences: list[str]) -> dict:
    """Sentences/s of the Translator at 32 sentences per batch, and seconds per sentence one at a time."""
    import torch

    from relmt.decode.translator import Translator
    from relmt.runtime import tune_cpu

    tune_cpu()
    torch.set_num_threads(opts.threads)
    translator = Translator.from_checkpoint(opts.checkpoint, engine=opts.engine)
    translator.translate(sentences[:4])  # warm-up (an engine's first call)
    batch = sentences[:opts.requests]
    start = time.perf_counter()
    translator.translate(batch, max_sentences=32)
    batched = len(batch) / (time.perf_counter() - start)
    single, deadline = [], time.monotonic() + opts.max_seconds
    for s in sentences[:opts.single_n]:
        t = time.perf_counter()
        translator.translate([s])
        single.append(time.perf_counter() - t)
        if time.monotonic() > deadline:
            break
    return {"batch32_sent_per_s": batched, "single_p50_s": statistics.median(single), "single_n": len(single),
            "batch32_n": len(batch)}


class ServerProcess:
    def __init__(self, opts: argparse.Namespace, log: Path) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads)}
        env.pop("RELMT_SERVE_API_KEY", None)
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "relmt.serve", f"checkpoint={opts.checkpoint}", f"engine={opts.engine}",
                 "host=127.0.0.1", "port=0", f"queue_size={max(256, 2 * max(opts.clients))}",
                 f"max_wait_ms={opts.max_wait_ms}", f"continuous={'true' if opts.mode == 'continuous' else 'false'}"],
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


async def drive(url: str, sentences: list[str], clients: int, requests: int, seconds: float) -> dict:
    """`clients` concurrent clients, each one request (one sentence) at a time, until `requests` have
    been sent or `seconds` have passed."""
    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    sent = 0
    deadline = time.monotonic() + seconds

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal sent
        while sent < requests and time.monotonic() < deadline:
            sentence = sentences[sent % len(sentences)]
            sent += 1
            t = time.perf_counter()
            try:
                r = await http.post("/v1/translate", json={"text": sentence})
                key = None if r.status_code == 200 else str(r.status_code)
            except httpx.HTTPError as e:
                key = type(e).__name__
            if key is None:
                latencies.append(time.perf_counter() - t)
            else:
                errors[key] = errors.get(key, 0) + 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - start
    return {"clients": clients, "requests": sent, "ok": len(latencies), "errors": errors,
            "sent_per_s": len(latencies) / wall, "p50_s": percentile(latencies, 50),
            "p95_s": percentile(latencies, 95), "p99_s": percentile(latencies, 99), "seconds": wall}


def goals(levels: dict[int, dict], ref: dict) -> list[tuple[str, str, str]]:
    """(goal, target, measured) for the issue's goals that this run measures."""
    rows = []
    if 32 in levels:
        rows.append(("32 clients sentences/s ÷ offline at 32 per batch", "≥ 0.8",
                     f"{levels[32]['sent_per_s'] / ref['batch32_sent_per_s']:.2f}"))
    if 1 in levels:
        rows.append(("1 client p50 ÷ offline one-at-a-time", "≤ 1.2",
                     f"{levels[1]['p50_s'] / ref['single_p50_s']:.2f}"))
    if 1 in levels and 32 in levels:
        rows.append(("32 clients p99 ÷ 1 client p50", "≤ 4", f"{levels[32]['p99_s'] / levels[1]['p50_s']:.2f}"))
    if 128 in levels:
        rows.append(("errors at 128 clients", "0", str(sum(levels[128]["errors"].values()))))
    return rows


def markdown(payload: dict) -> str:
    ref = payload["offline"]
    lines = [f"# relmt-serve under load ({payload['engine']}, {payload['threads']} threads)", "",
             f"{payload['sentences']} sentences from `{payload['src']}`; checkpoint `{payload['checkpoint']}`; "
             f"{', '.join(f'{k} {v}' for k, v in payload['host'].items())}.", "",
             f"Command: `{payload['command']}`", "",
             "| batching | clients | requests | sentences/s | p50 ms | p95 ms | p99 ms | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for row in payload["levels"]:
        lines.append(f"| {row['batching']} | {row['clients']} | {row['requests']} | {row['sent_per_s']:.1f} | "
                     f"{row['p50_s'] * 1e3:.1f} | {row['p95_s'] * 1e3:.1f} | {row['p99_s'] * 1e3:.1f} | "
                     f"{sum(row['errors'].values())} |")
    lines += ["", f"Offline (the Translator in-process): {ref['batch32_sent_per_s']:.1f} sentences/s at 32 per "
              f"batch; {ref['single_p50_s'] * 1e3:.1f} ms p50 one at a time ({ref['single_n']} sentences).", "",
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
    parser.add_argument("--single-n", type=int, default=100, help="sentences decoded one at a time offline")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--batching", nargs="+", choices=["continuous", "batch"], default=["continuous", "batch"])
    parser.add_argument("--log", type=Path, default=Path("/tmp/relmt-bench-serve.log"))
    parser.add_argument("--json", type=Path, default=ROOT / "docs/results/performance/serve_cpu.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs/results/performance/serve_cpu.md")
    opts = parser.parse_args(argv)
    sentences = load_sentences(opts)
    ref = offline(opts, sentences)
    print(f"offline: {json.dumps(ref)}", flush=True)
    rows, first, statuses = [], {}, {}
    for mode in opts.batching:
        opts.mode = mode
        server = ServerProcess(opts, opts.log)
        try:
            for clients in opts.clients:
                row = {"batching": mode, **asyncio.run(drive(server.url, sentences, clients, opts.requests,
                                                                opts.max_seconds))}
                rows.append(row)
                if mode == opts.batching[0]:
                    first[clients] = row
                print(json.dumps(row), flush=True)
        finally:
            statuses[mode] = server.stop()
    status = max(statuses.values(), key=abs)
    from relmt.host import host

    given = argv if argv is not None else sys.argv[1:]
    payload = {"command": " ".join(["python scripts/bench/bench_serve.py", *given]),
               "engine": opts.engine, "threads": opts.threads, "checkpoint": str(opts.checkpoint),
               "src": str(opts.src or "peer corpus test.src"), "sentences": len(sentences), "host": host(),
               "batching": opts.batching, "offline": ref, "levels": rows, "goals": goals(first, ref),
               "exit_status": status, "exit_statuses": statuses}
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    opts.md.write_text(markdown(payload))
    print(f"wrote {opts.json} and {opts.md}")
    return payload


if __name__ == "__main__":
    main()
