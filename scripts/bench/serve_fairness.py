#!/usr/bin/env python
"""relmt-serve shared fairly (issue 74 §1): the real server process over loopback, with one request of 64 lines of
499 one-letter words (the review's, each line decoding up to its output limit) beside ordinary requests. Run it
alone on the machine.

    python scripts/bench/serve_fairness.py --checkpoint runs/toy/checkpoints/best.pt \\
        --out docs/results/performance/serve_fairness.json --md docs/results/performance/serve_fairness.md

Measured, in one run of one server (threads=THREADS, max_request_output_tokens=0 so that the long request is
admitted at all; under the default 8192 it is refused with 413, which the run also checks):
1. a 3-word request alone: p50 latency over --repeats;
2. the same request sent --delay seconds after the long one started: its latency (goal: within 1 s);
3. the long request's client leaving after --leave-after seconds: the sentences taken out of the running search
   (relmt_serve_cancelled_sentences_total), whether /metrics counts the request cancelled, and the latency of a
   3-word request sent right after (goal: the search is free within one step: as alone);
4. 32 ordinary clients (one line each, the toy test set) for --seconds alone, then beside one long request:
   their sentences/s, and the ratio (goal: >= 0.8).
Every loop is bounded in count and time; requests go to 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts/bench"))

from bench_serve import drive  # noqa: E402

from relmt.bench import command_line, hardware, markdown_table, write_json  # noqa: E402

SHORT = "the dog ran"


class Server:
    """relmt-serve on 127.0.0.1 with `threads` (0: its default, the free cores, with OMP_NUM_THREADS unset), ready
    to answer; scripts/bench/threads_busy.py starts it too."""

    def __init__(self, checkpoint: Path, threads: int, log: Path, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RELMT_SERVE_API_KEY")}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "relmt.serve", f"checkpoint={checkpoint}",
                                          "host=127.0.0.1", "port=0", f"threads={threads}", *args],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline, self.url = time.monotonic() + 300, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"relmt-serve exited {self.proc.returncode}:\n{log.read_text()}")
            if self.url is None and (m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", log.read_text())):
                self.url = m.group(1)
            if self.url and httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                break
            time.sleep(0.1)
        self.http = httpx.Client(base_url=self.url, timeout=600)

    def translate(self, text) -> tuple[int, float]:
        t = time.perf_counter()
        r = self.http.post("/v1/translate", json={"text": text})
        return r.status_code, time.perf_counter() - t

    def metric(self, name: str) -> float:
        m = re.search(rf"^{re.escape(name)} (\S+)$", self.http.get("/metrics").text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> None:
        self.http.close()
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def long_request(lines: int, words: int, word: str) -> list[str]:
    """`lines` lines of `words` times `word` (the toy's "a", one piece: each line decodes up to its output limit,
    2 x 500 + 10 = 1,010 tokens under the toy's decode config, as in the review)."""
    return [" ".join([word] * words) for _ in range(lines)]


def in_background(server: Server, text) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        out["status"], out["seconds"] = server.translate(text)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def leaving_client(server: Server, text, after: float) -> None:
    """Send the request on a raw connection and hang up after `after` seconds, as a client timing out does."""
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"text": text}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(after)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "runs/toy/checkpoints/best.pt")
    ap.add_argument("--sentences", type=Path, help="the ordinary clients' lines (default: the toy test set)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lines", type=int, default=64)
    ap.add_argument("--words", type=int, default=499)
    ap.add_argument("--word", default="a", help="the long lines' word (one sentencepiece piece of the model)")
    ap.add_argument("--delay", type=float, default=3.0, help="seconds between the long request and the short one")
    ap.add_argument("--leave-after", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seconds", type=float, default=20.0, help="each 32-client level's length")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.sentences:
        ordinary = args.sentences.read_text(encoding="utf-8").splitlines()
    else:
        from relmt.data.toy import generate

        ordinary = [src for src, _ in generate(seed=1, n_train=0, n_valid=0, n_test=200, n_test_long=0)["test"]]
    long = long_request(args.lines, args.words, args.word)
    log = Path(os.environ.get("TMPDIR", "/tmp")) / "serve_fairness.log"
    results: dict = {}

    default = Server(args.checkpoint, args.threads, log)  # the defaults: the long request is refused
    try:
        results["default_long_status"] = default.translate(long)[0]
    finally:
        default.stop()

    s = Server(args.checkpoint, args.threads, log, "max_request_output_tokens=0", "max_body_bytes=200000")
    try:
        s.translate(SHORT)  # warm-up
        alone = [s.translate(SHORT)[1] for _ in range(args.repeats)]
        results["short_alone_p50_s"] = statistics.median(alone)
        # 2. beside the long request
        thread, out = in_background(s, long)
        time.sleep(args.delay)
        status, beside = s.translate(SHORT)
        results |= {"short_beside_long_s": beside, "short_beside_long_status": status,
                    "short_beside_long_over_alone": beside / results["short_alone_p50_s"]}
        thread.join(900)
        results |= {"long_status": out.get("status"), "long_seconds": out.get("seconds")}
        # 3. the long request's client leaves
        before_req, before_sent = s.metric("relmt_serve_cancelled_total"), \
            s.metric("relmt_serve_cancelled_sentences_total")
        leaving_client(s, long, args.leave_after)
        left = time.perf_counter()
        status, after = s.translate(SHORT)
        deadline = time.monotonic() + 30
        while s.metric("relmt_serve_cancelled_total") == before_req and time.monotonic() < deadline:
            time.sleep(0.05)
        results |= {"short_after_leaving_s": after, "short_after_leaving_over_alone": after /
                    results["short_alone_p50_s"], "seconds_from_leaving_to_short_answer": time.perf_counter() - left,
                    "cancelled_requests": s.metric("relmt_serve_cancelled_total") - before_req,
                    "cancelled_sentences": s.metric("relmt_serve_cancelled_sentences_total") - before_sent}
        # 4. 32 clients alone, then beside one long request
        n = 10 ** 6
        level = asyncio.run(drive(s.url, ordinary, args.clients, n, args.seconds))
        thread, out = in_background(s, long)
        time.sleep(0.5)
        beside = asyncio.run(drive(s.url, ordinary, args.clients, n, args.seconds))
        thread.join(900)
        results |= {"clients_alone": level, "clients_beside_long": beside,
                    "clients_beside_over_alone": beside["sent_per_s"] / level["sent_per_s"]}
    finally:
        s.stop()

    hw = hardware()
    big = f"{args.lines} x {args.words}"
    goals = [
        {"what": f"a 3-word request beside the {big} request: latency", "goal": "<= 1 s",
         "measured": f"{results['short_beside_long_s']:.3f} s (alone {results['short_alone_p50_s']:.3f} s)",
         "met": "yes" if results["short_beside_long_s"] <= 1 else "no"},
        {"what": "its client leaves: sentences out of the search, counted cancelled",
         "goal": "within one step; counted",
         "measured": f"{results['cancelled_sentences']:.0f} sentences, {results['cancelled_requests']:.0f} "
                     f"request counted; a 3-word request right after: {results['short_after_leaving_s']:.3f} s "
                     f"({results['short_after_leaving_over_alone']:.2f} x alone)",
         "met": "yes" if results["cancelled_requests"] >= 1 and results["cancelled_sentences"] > 0 else "no"},
        {"what": f"{args.clients} clients beside one such request ÷ alone, sentences/s", "goal": ">= 0.8",
         "measured": f"{results['clients_beside_over_alone']:.2f} ({results['clients_beside_long']['sent_per_s']:.1f}"
                     f" / {results['clients_alone']['sent_per_s']:.1f})",
         "met": "yes" if results["clients_beside_over_alone"] >= 0.8 else "no"},
        {"what": f"the {big} request under the default max_request_output_tokens", "goal": "413",
         "measured": str(results["default_long_status"]),
         "met": "yes" if results["default_long_status"] == 413 else "no"}]
    payload = {"command": command_line(), "hardware": hw, "threads": args.threads, "checkpoint": str(args.checkpoint),
               "goals": goals, "results": results}
    table = markdown_table(goals, [("what", "what"), ("goal", "goal"), ("measured", "measured"), ("met", "met")])
    print(table)
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(f"# relmt-serve shared fairly (issue 74 §1)\n\n- command: `{payload['command']}`\n"
                           f"- hardware: {hw.get('cpu')}, {hw.get('cpu_count')} cores, torch {hw.get('torch')}, "
                           f"git {hw.get('git')}\n- date: {hw.get('date')}\n- server: threads={args.threads}, "
                           f"checkpoint {args.checkpoint}\n\n{table}\n\nThe long request alone took "
                           f"{results['long_seconds']:.1f} s (status {results['long_status']}); each 32-client "
                           f"level ran {args.seconds:g} s; p95 alone "
                           f"{1e3 * results['clients_alone']['p95_s']:.0f} ms, beside "
                           f"{1e3 * results['clients_beside_long']['p95_s']:.0f} ms.\n")


if __name__ == "__main__":

    main()
