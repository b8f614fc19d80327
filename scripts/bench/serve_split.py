#!/usr/bin/env python
"""Where relmt-serve's decoding thread spends its time under continuous batching (issue 70 §1), without HTTP.

relmt-serve's own Batcher and Stream (relmt/serve/batcher.py, stream.py) and its Prometheus metrics run in this
process on a Translator loaded as relmt-serve loads it, fed by --clients closed-loop clients (threads: each submits
one sentence, waits for its answer, and submits the next, as bench_serve.py's HTTP clients do). Every part of the
decoding thread's work is timed by wrapping the function that does it:

- encoder: the engine's encoder graph, or a torch model's encode (one call per admission);
- graphs: the engine's other compiled calls (search graph, step graph), or a torch model's decode_step;
- search Python: relmt.decode.continuous.advance less the graphs it calls (beam_step in Python where there is no
  search graph, the finished sentences' hypotheses, the cut of front slots);
- join: Stream.admit less its encoder call (the new sentences' ids, continuous.start and join);
- answer: the finished sentences' Translations (annotate: detokenising) and the futures;
- admission: Batcher.admissions less its waits (the lock, the queue, the scheduling rule);
- metrics: the Prometheus callbacks (on_step, on_queue);
- idle: the decoding thread waiting for a job (Condition.wait);
- other: the rest of the thread's wall time (the loop itself, and the clients' threads holding the GIL).

Beside it: the Translator offline at 32 per batch and one at a time over the same sentences, so that the split
says what the server adds; bench_serve.py measures the same levels over HTTP, and with --echo its floor.

    python scripts/bench/serve_split.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \\
        --engine aoti --src /tmp/relmt-peers/corpus/test.src --fixed-length 20 \\
        --json docs/results/serving/split_amd_epyc.json --md docs/results/serving/split_amd_epyc.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("encoder", "graphs", "search Python", "join", "answer", "admission", "metrics", "idle", "other")


class Clock:
    """Seconds spent per part in the decoding thread, nested calls subtracted from their caller's part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.stack: list[list] = []  # [part, start, seconds of nested parts]
        self.thread: int | None = None

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            if threading.get_ident() != self.thread:  # a client's thread (submit): not the decoder's time
                return fn(*args, **kwargs)
            self.stack.append([part, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                name, start, nested = self.stack.pop()
                spent = time.perf_counter() - start
                self.seconds[name] += spent - nested
                self.calls[name] += 1
                if self.stack:
                    self.stack[-1][2] += spent
        return timed


def load(opts: argparse.Namespace):
    import torch

    from relmt.decode.translator import Translator
    from relmt.runtime import tune_cpu

    torch.set_num_threads(opts.threads)
    tune_cpu()
    translator = Translator.from_checkpoints([opts.checkpoint], engine=opts.engine, quantization=opts.quantization)
    if opts.fixed_length:
        n = opts.fixed_length
        translator.decode = replace(translator.decode, min_len=n, max_len_a=0.0, max_len_b=n)
    if opts.beam:
        translator.decode = replace(translator.decode, beam=opts.beam)
    return translator


def offline(translator, sentences: list[str], single_n: int) -> dict:
    translator.translate(sentences[:4])  # warm-up
    start = time.perf_counter()
    translator.translate(sentences, max_sentences=32)
    batched = len(sentences) / (time.perf_counter() - start)
    single = []
    for s in sentences[:single_n]:
        t = time.perf_counter()
        translator.translate([s])
        single.append(time.perf_counter() - t)
    return {"batch32_sent_per_s": batched, "single_p50_s": statistics.median(single)}


def level(opts: argparse.Namespace, sentences: list[str], clients: int, requests: int) -> dict:
    """`clients` closed-loop clients through relmt-serve's Batcher and Stream, `requests` requests in all, beside the
    offline reference. As in relmt-serve, every torch operation runs in the Batcher's decoding thread, the model's
    loading and the offline reference included: torch in a second thread would make a second OpenMP team, and with
    more OpenMP threads than cores GNU OpenMP stops spin-waiting (docs/results/performance/omp_teams.md)."""
    from relmt.decode import continuous
    from relmt.serve import batcher as batching
    from relmt.serve import stream as streaming
    from relmt.serve.metrics import Metrics

    clock = Clock()
    metrics = Metrics()
    stepped = [0]

    def observe(sentences: int, seconds: float) -> None:
        stepped[0] += sentences
        metrics.observe_batch(sentences, seconds)

    on_step = clock.wrap("metrics", observe)
    on_queue = clock.wrap("metrics", metrics.queue.set)
    ref: dict = {}

    def load_and_reference():
        translator = load(opts)
        ref.update(offline(translator, sentences, opts.single_n))
        return translator

    b = batching.Batcher(load_and_reference, queue_size=4 * clients + 64, max_batch_tokens=2000, max_wait_ms=30,
                         on_batch=on_step, on_queue=on_queue, on_load_error=print, continuous=True)
    b.start()
    while not b.ready:
        if b.load_error:
            raise SystemExit(b.load_error)
        time.sleep(0.01)
    translator = b.translator
    model = translator.model
    saved = {}
    for name in ("run_search", "run_step", "run_encoder", "encode", "decode_step"):
        fn = getattr(model, name, None)
        if callable(fn) and (name.startswith("run_") or not hasattr(model, "run_step")):
            saved[name] = fn
            setattr(model, name, clock.wrap("encoder" if name in ("run_encoder", "encode") else "graphs", fn))
    patches = [(continuous, "advance", "search Python"), (streaming.Stream, "admit", "join"),
               (streaming, "annotate", "answer"), (batching.Batcher, "admissions", "admission")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, part in patches:
        setattr(owner, name, clock.wrap(part, getattr(owner, name)))
    wait = b.cond.wait
    b.cond.wait = clock.wrap("idle", wait)
    latencies: list[float] = []
    sent = [0]
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if sent[0] >= requests:
                    return
                i = sent[0]
                sent[0] += 1
            t = time.perf_counter()
            job = b.submit([sentences[i % len(sentences)]], translator.decode)
            job.future.result(timeout=120)
            latencies.append(time.perf_counter() - t)

    try:
        clock.thread = b.thread.ident
        threads = [threading.Thread(target=client) for _ in range(clients)]
        start = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - start
        b.stop(30)
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
        for name, fn in saved.items():
            setattr(model, name, fn)
    steps = clock.calls["search Python"]
    parts = {p: clock.seconds.get(p, 0.0) for p in PARTS if p != "other"}
    parts["other"] = max(wall - sum(parts.values()), 0.0)
    return {"clients": clients, "offline": ref, "requests": len(latencies), "sent_per_s": len(latencies) / wall,
            "p50_s": statistics.median(latencies), "wall_s": wall, "steps": steps,
            "sentences_per_step": stepped[0] / max(steps, 1),
            "ms_per_step": {p: 1e3 * s / max(steps, 1) for p, s in parts.items()},
            "share": {p: s / wall for p, s in parts.items()}}


def markdown(payload: dict) -> str:
    lines = [f"# relmt-serve's decoding thread, split ({payload['engine']}, {payload['threads']} threads)", "",
             "relmt-serve's Batcher, Stream and metrics in one process, fed by closed-loop client threads (no HTTP); "
             "every part of the decoding thread timed (scripts/bench/serve_split.py's docstring says what each is).",
             "", f"- command: `{payload['command']}`",
             f"- hardware: {payload['hardware'].get('cpu', '?')}, {payload['hardware'].get('cpu_count')} cores, "
             f"torch {payload['hardware']['torch']}",
             f"- date: {payload['date']}",
             f"- beam: {payload.get('beam') or 'the checkpoint' + chr(39) + 's decode.beam'}", "",
             "Offline: the Translator in the same decoding thread, just before each level (32 per batch, and one at a "
             "time).", "",
             "| clients | offline 32 per batch, sentences/s | offline one at a time, p50 ms | sentences/s | "
             "÷ offline 32 per batch | p50 ms | ÷ offline one at a time | steps | sentences per step | "
             + " | ".join(f"{p} ms/step" for p in PARTS) + " |",
             "|---" * (9 + len(PARTS)) + "|"]
    for row in payload["levels"]:
        ref = row["offline"]
        lines.append(f"| {row['clients']} | {ref['batch32_sent_per_s']:.1f} | {ref['single_p50_s'] * 1e3:.1f} | "
                     f"{row['sent_per_s']:.1f} | "
                     f"{row['sent_per_s'] / ref['batch32_sent_per_s']:.2f} | {row['p50_s'] * 1e3:.1f} | "
                     f"{row['p50_s'] / ref['single_p50_s']:.2f} | {row['steps']} | {row['sentences_per_step']:.1f} | "
                     + " | ".join(f"{row['ms_per_step'][p]:.3f}" for p in PARTS) + " |")
    lines += ["", "Shares of the wall time:", "", "| clients | " + " | ".join(PARTS) + " |",
              "|---" * (1 + len(PARTS)) + "|"]
    for row in payload["levels"]:
        lines.append(f"| {row['clients']} | " + " | ".join(f"{row['share'][p]:.1%}" for p in PARTS) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--engine", default="aoti")
    ap.add_argument("--quantization", default="float32")
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--single-n", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed-length", type=int, default=0)
    ap.add_argument("--beam", type=int, default=0, help="every request's beam (0: the checkpoint's decode.beam)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    opts = ap.parse_args()
    from relmt.bench import command_line, hardware

    sentences = [s for s in opts.src.read_text(encoding="utf-8").splitlines() if s.strip()][: opts.requests]
    levels = []
    for clients in opts.clients:
        levels.append(level(opts, sentences, clients, opts.requests))
        print(json.dumps(levels[-1]), flush=True)
    payload = {"command": command_line(), "hardware": hardware(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "engine": opts.engine,
               "threads": opts.threads, "beam": opts.beam, "levels": levels}
    text = markdown(payload)
    print(text)
    if opts.json:
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(payload, indent=2) + "\n")
    if opts.md:
        opts.md.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
