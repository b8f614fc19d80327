"""relmt-serve (relmt/serve/) as a real process on 127.0.0.1, driven over HTTP with httpx.

Every server here listens on loopback only, on a port it picks itself (port=0), and every request
loop is bounded in count and time. The module's main server is shared by most tests; the API key
and the SIGTERM tests start their own. RELMT_SERVE_TEST_HOOKS=1 turns on the test hooks of
relmt/serve/batcher.py: a sentence with RELMT_TEST_FAULT fails its batch, one with RELMT_TEST_SLOW
keeps the decoder busy for two seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from relmt.errors import UserError  # noqa: E402
from tests.tiny_checkpoints import toy_tokenizer, write_checkpoint  # noqa: E402

KEY = "test-key-0123456789abcdef"
START_S = 90  # a bound on a server's start (python, torch and the model), loaded machines included
LIMITS = ["max_lines=8", "max_line_chars=200", "max_body_bytes=4096", "max_beam=6"]


def ckpt_for(directory: Path) -> Path:
    return write_checkpoint(directory, "tiny.pt", toy_tokenizer(directory), seed=1)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return ckpt_for(tmp_path_factory.mktemp("serve"))


def server_env(key: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RELMT_SERVE_API_KEY"}
    env.update(OMP_NUM_THREADS="1", RELMT_SERVE_TEST_HOOKS="1")
    if key:
        env["RELMT_SERVE_API_KEY"] = key
    return env


class Server:
    """`python -m relmt.serve` on 127.0.0.1 port=0: its process, its URL (read from the line it prints)."""

    def __init__(self, ckpt: Path, log: Path, *args: str, key: str | None = None,
                 program: tuple[str, ...] = ("-m", "relmt.serve")) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, *program, f"checkpoint={ckpt}", "host=127.0.0.1",
                                          "port=0", *args], stdout=out, stderr=subprocess.STDOUT,
                                         env=server_env(key), cwd=Path(__file__).parent.parent)
        self.url = self.wait_for_url()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.client = httpx.Client(base_url=self.url, timeout=30, headers=headers)
        self.wait_ready()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for_url(self) -> str:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if m := re.search(r"listening on (http://127\.0\.0\.1:\d+)", self.text()):
                return m.group(1)
            assert self.proc.poll() is None, f"relmt-serve exited {self.proc.returncode}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"relmt-serve printed no URL in {START_S} s:\n{self.text()}")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                return
            assert self.proc.poll() is None, f"relmt-serve exited {self.proc.returncode}:\n{self.text()}"
            time.sleep(0.05)
        raise AssertionError(f"relmt-serve not ready in {START_S} s:\n{self.text()}")

    def metric(self, name: str) -> float:
        body = self.client.get("/metrics").text
        m = re.search(rf"^{re.escape(name)} (\S+)$", body, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_metric(self, name: str, value: float, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.metric(name) == value:
                return
            time.sleep(0.02)
        raise AssertionError(f"{name} stayed {self.metric(name)}, not {value}, for {timeout} s")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    s = Server(ckpt, tmp_path_factory.mktemp("serve_log") / "server.log", *LIMITS)
    yield s
    s.stop()


def post(server: Server, body, **kw) -> httpx.Response:
    return server.client.post("/v1/translate", json=body, **kw)


def still_serving(server: Server) -> None:
    r = post(server, {"text": "the dog saw the cat"})
    assert r.status_code == 200, r.text
    assert server.client.get("/health").status_code == 200


def in_threads(calls: list) -> list:
    """Run each call in its own thread; their results (or exceptions) in order."""
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as e:  # noqa: BLE001 - reported to the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_serving_does_not_import_the_trainer():
    code = ("import relmt.serve.main, relmt.serve.app, sys; "
            "bad = sorted(m for m in sys.modules if m.startswith(('relmt.train', 'datasets'))); assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stderr


# --- the API -----------------------------------------------------------------------------------------

def test_translations_match_the_python_api_in_input_order(server, ckpt):
    from relmt.decode.translator import Translator

    sentences = ["the dog saw the cat", "", "alice said that bob arrived", "bob ran"]
    r = post(server, {"text": sentences})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = Translator.from_checkpoint(ckpt).translate_nbest(sentences)
    assert body["translations"] == [h[0][0] if h else "" for h in expected]
    assert body["scores"][1] is None  # an empty sentence translates to "" with no score
    assert body["scores"][0] == pytest.approx(expected[0][0][1], abs=1e-4)
    assert "nbest" not in body
    one = post(server, {"text": "the dog saw the cat"}).json()
    assert one["translations"] == body["translations"][:1]


def test_options_nbest_lists(server):
    r = post(server, {"text": ["the dog saw the cat", "bob ran"], "options": {"beam": 3, "nbest": 3, "lenpen": 1}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [len(n) for n in body["nbest"]] == [3, 3]
    for best, scores in zip(body["translations"], body["nbest"]):
        assert scores[0]["translation"] == best
        assert [s["score"] for s in scores] == sorted((s["score"] for s in scores), reverse=True)
    sampled = post(server, {"text": "bob ran", "options": {"sampling": True, "beam": 2, "topk": 5, "seed": 3}})
    assert sampled.status_code == 200, sampled.text
    assert sampled.json() == post(server, {"text": "bob ran", "options": {"sampling": True, "beam": 2, "topk": 5,
                                                                          "seed": 3}}).json()


def test_health_ready_metrics_and_page(server):
    assert server.client.get("/health").json() == {"status": "alive"}
    assert server.client.get("/ready").json() == {"ready": True}
    post(server, {"text": ["a small red bird sang", "bob ran"]})
    m = server.client.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain")
    for name in ("relmt_serve_requests_total", "relmt_serve_errors_total", "relmt_serve_request_seconds_bucket",
                 "relmt_serve_batch_sentences_bucket", "relmt_serve_queue_sentences",
                 "relmt_serve_requests_in_progress"):
        assert name in m.text
    assert server.metric('relmt_serve_requests_total{status="200"}') >= 1
    page = server.client.get("/")
    assert page.status_code == 200 and "/v1/translate" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # no external assets


def test_requests_queued_behind_a_running_search_join_it(server):
    """Continuous batching (the default): four one-sentence requests that queue while the decoder is busy join
    the running search together at its next step, beside the sentence already in it: a step of five."""
    count = server.metric("relmt_serve_batch_sentences_count")
    small = server.metric('relmt_serve_batch_sentences_bucket{le="4.0"}')
    busy = threading.Thread(target=post, args=(server, {"text": "RELMT_TEST_SLOW the dog"}))
    busy.start()
    time.sleep(0.3)  # the slow request is being admitted
    answers = in_threads([lambda i=i: post(server, {"text": f"bob ran {i}"}) for i in range(4)])
    busy.join(30)
    assert [a.status_code for a in answers] == [200] * 4
    steps = server.metric("relmt_serve_batch_sentences_count") - count
    assert steps > 0 and server.metric('relmt_serve_batch_sentences_bucket{le="4.0"}') - small < steps


def test_continuous_answers_are_the_offline_translations(server, ckpt):
    """The same sentences, one request each, concurrently: each answer is relmt-translate's for it."""
    from relmt.decode.translator import Translator

    sentences = ["the dog saw the cat", "bob ran", "the cat", "a dog ran to the cat and the dog", ""]
    answers = in_threads([lambda s=s: post(server, {"text": [s], "options": {"nbest": 2}}) for s in sentences])
    want = Translator.from_checkpoint(ckpt).translate_nbest(sentences, nbest=2)
    for s, a, w in zip(sentences, answers, want):
        assert a.status_code == 200, a.text
        got = a.json()["nbest"][0]
        assert [h["translation"] for h in got] == [t for t, _ in w], s
        assert [h["score"] for h in got] == pytest.approx([sc for _, sc in w], abs=1e-4)


def test_the_output_length_set_at_start_is_relmt_translates(ckpt, tmp_path):
    """max_len_a, max_len_b and min_len at start replace the checkpoint's, in both batching modes."""
    from relmt.decode.translator import Translator

    sentences = ["the dog saw the cat", "bob ran"]
    want = Translator.from_checkpoint(ckpt).translate(sentences, max_len_a=0.0, max_len_b=3, min_len=3)
    assert want != Translator.from_checkpoint(ckpt).translate(sentences)  # the settings change the output
    for mode in ("true", "false"):
        s = Server(ckpt, tmp_path / f"length_{mode}.log", "max_len_a=0", "max_len_b=3", "min_len=3",
                   f"continuous={mode}")
        try:
            r = post(s, {"text": sentences})
            assert r.status_code == 200 and r.json()["translations"] == want, (mode, r.text)
        finally:
            s.stop()


def test_decoding_defaults_set_at_start_are_what_a_request_without_options_gets(ckpt, tmp_path):
    """beam=2 nbest=2 at start (issue 74 §4: "beam=4" was refused, "did you mean max_beam?"): a request without
    options gets 2-best lists of a beam of 2, relmt-translate's for those settings; its options replace them one by
    one."""
    from relmt.decode.translator import Translator

    sentences = ["the dog saw the cat", "bob ran"]
    want = Translator.from_checkpoint(ckpt).translate_nbest(sentences, beam=2, nbest=2)
    s = Server(ckpt, tmp_path / "defaults.log", "beam=2", "nbest=2", "lenpen=0.6")
    try:
        r = post(s, {"text": sentences})
        assert r.status_code == 200, r.text
        got = r.json()["nbest"]
        assert [[h["translation"] for h in hs] for hs in got] == [[t for t, _ in w] for w in want]
        assert [h["score"] for hs in got for h in hs] == pytest.approx([sc for w in want for _, sc in w], abs=1e-4)
        one = post(s, {"text": sentences, "options": {"nbest": 1}})
        assert one.status_code == 200 and "nbest" not in one.json(), one.text
        wider = post(s, {"text": sentences[0], "options": {"beam": 3}})  # nbest stays the server's 2
        assert wider.status_code == 200 and len(wider.json()["nbest"][0]) == 2, wider.text
        narrow = post(s, {"text": sentences[0], "options": {"beam": 1}})  # the server's nbest 2 over beam 1
        assert narrow.status_code == 422 and "nbest" in narrow.json()["error"], narrow.text
    finally:
        s.stop()


def test_batch_by_batch_requests_queued_behind_a_busy_decoder_share_a_batch(ckpt, tmp_path):
    """continuous=false: four one-sentence requests that queue behind a busy decoder are decoded as one batch."""
    s = Server(ckpt, tmp_path / "batch.log", "continuous=false")
    try:
        count = s.metric("relmt_serve_batch_sentences_count")
        total = s.metric("relmt_serve_batch_sentences_sum")
        busy = threading.Thread(target=post, args=(s, {"text": "RELMT_TEST_SLOW the dog"}))
        busy.start()
        time.sleep(0.3)  # the slow batch is taken
        answers = in_threads([lambda i=i: post(s, {"text": f"bob ran {i}"}) for i in range(4)])
        busy.join(30)
        assert [a.status_code for a in answers] == [200] * 4
        assert s.metric("relmt_serve_batch_sentences_count") == count + 2
        assert s.metric("relmt_serve_batch_sentences_sum") == total + 5
    finally:
        s.stop()


class FakeTranslator:
    """Stands in for Translator in the scheduler's unit tests: one token per word, records batches."""

    def __init__(self) -> None:
        from relmt.config import DecodeConfig

        self.decode = DecodeConfig()
        self.batches: list[list[str]] = []
        self.tokenizer = self

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return [[1] * len(s.split()) for s in sentences]

    def hypotheses(self, sentences: list[str], **forced) -> list:
        self.batches.append(sentences)
        return [[s.upper()] for s in sentences]

    def annotated(self, pairs: list, *asked, **named) -> list:
        return [(h, -1.0) for _, h in pairs]


def scheduler(**kw):
    from relmt.serve.batcher import Batcher

    b = Batcher(FakeTranslator, **{**dict(queue_size=8, max_batch_tokens=10, max_wait_ms=0.0), **kw},
                on_batch=lambda n, s: None, on_queue=lambda n: None, on_load_error=print, hooks=False)
    b.translator = b.load()
    b.default_decode = b.translator.decode
    return b


def test_the_scheduler_batches_by_settings_and_token_budget():
    from dataclasses import replace

    from relmt.serve.batcher import QueueFull

    b = scheduler()
    greedy = replace(b.default_decode, beam=1)
    sampled = replace(b.default_decode, sampling=True)
    a = b.submit(["one two three", "four five"], b.default_decode)  # 3 + 1 and 2 + 1 tokens (EOS)
    g = b.submit(["six"], greedy)
    c = b.submit(["seven eight"], b.default_decode)  # 3 tokens: 7 + 3 fits in 10
    d = b.submit(["nine ten eleven"], b.default_decode)  # 4 more would not
    with pytest.raises(QueueFull):
        b.submit(["w", "x", "y", "z"], b.default_decode)  # 5 queued + 4 > queue_size=8: all or none
    s1 = b.submit(["s"], sampled)
    s2 = b.submit(["t"], sampled)
    batches = [[j.sentences for j in b.next_batch()] for _ in range(5)]
    assert batches == [[["one two three", "four five"], ["seven eight"]], [["six"]], [["nine ten eleven"]],
                       [["s"]], [["t"]]]  # settings kept apart, the budget respected, samples never joined
    for batch in ([a, c], [g], [d], [s1], [s2]):
        b.decode(batch)
    assert a.future.result() == [[("ONE TWO THREE", -1.0)], [("FOUR FIVE", -1.0)]]
    assert c.future.result() == [[("SEVEN EIGHT", -1.0)]]


def test_the_scheduler_waits_for_the_clients_it_expects_and_a_lone_client_never_waits():
    """Closed-loop clients (each sends again when answered) would otherwise settle into two alternating
    halves: the jobs queued behind a running batch are past max_wait when it ends, and would be taken
    before the clients just answered can send again."""
    b = scheduler(max_batch_tokens=100, max_wait_ms=5000.0)
    b.submit(["lone"], b.default_decode)
    start = time.monotonic()
    assert [j.sentences for j in b.next_batch()] == [["lone"]]
    assert time.monotonic() - start < 2.5  # nothing answered before it, nothing queued behind it: no wait
    again = threading.Timer(0.1, b.submit, (["again"], b.default_decode))  # answered, it sends again
    again.start()
    start = time.monotonic()
    assert len(b.next_batch()) == 1 and time.monotonic() - start < 2.5
    again.join()
    b.max_wait = 0.5
    b.submit(["d"], b.default_decode)
    b.submit(["e"], b.default_decode)  # a second client joins
    assert len(b.next_batch()) == 2  # expected three (one answered, two queued): waited max_wait for one more
    for word in ("f", "g"):  # two more clients queued behind the batch of d and e, past max_wait when it ends
        b.submit([word], b.default_decode)
    time.sleep(0.6)
    late = threading.Timer(0.2, lambda: [b.submit([w], b.default_decode) for w in ("h", "i")])  # d, e again
    late.start()
    start = time.monotonic()
    batch = b.next_batch()  # expects four: the two it answered and the two queued
    late.join()
    assert [j.sentences[0] for j in batch] == ["f", "g", "h", "i"] and time.monotonic() - start < 2.5
    b.submit(["j"], b.default_decode)
    start = time.monotonic()
    assert len(b.next_batch()) == 1 and 0.4 < time.monotonic() - start < 2.5  # never past max_wait


class FakeSearch:
    """What the scheduler reads of a running search (relmt/serve/stream.py's Stream)."""

    def __init__(self, key, tokens: int = 0, sentences: int = 0, held: list | None = None) -> None:
        from types import SimpleNamespace

        self.idle, self.key, self.tokens = False, key, tokens
        self.run = SimpleNamespace(keys=tuple(range(sentences)))
        self.holding = {id(job): n for job, n in held or []}  # job id -> its source tokens in the search
        self.jobs = {id(job): job for job, _ in held or []}

    def held(self, job) -> int:
        return self.holding.get(id(job), 0)


def sentences(taken) -> list[str]:
    return [job.sentences[i] for job, i in taken]


def test_a_lone_sentence_is_decoded_in_one_call_where_the_engine_runs_a_whole_search_so():
    """An engine that runs a sentence's whole search in one compiled call (GraphModel.loops, engine=aoti's loop.pt2
    on one thread; issue 76 §1): with nothing running and nothing else queued, a request of one sentence whose step
    limit fits the loop is decoded as a batch of its own (one call, not a step per token); two requests, or one of
    two sentences, or beam 1 (greedy), or a longer limit, or an engine without the loop, join the running search."""
    from dataclasses import replace

    from relmt.export.graphs import LOOP_SLOTS, GraphModel
    from relmt.serve.batcher import Job

    class Engine:
        loops = GraphModel.loops

        def __init__(self, loop_rows: int) -> None:
            self.loop_rows = loop_rows

    b = scheduler(max_batch_tokens=100, queue_size=16)
    idle = FakeSearch(())
    idle.idle = True
    short = replace(b.default_decode, max_len_a=0.0, max_len_b=LOOP_SLOTS)
    for loop_rows, text, decode, alone in ((4, ["a"], short, True), (0, ["a"], short, False),
                                           (4, ["a", "b"], short, False), (4, ["a"], replace(short, beam=1), False),
                                           (4, ["a"], replace(short, beam=8), False),
                                           (4, ["a"], replace(short, max_len_b=LOOP_SLOTS + 1), False)):
        b.translator.model = Engine(loop_rows)
        job = b.submit(text, decode)
        taken = b.admissions(idle)
        assert (taken == [job]) is alone and all(isinstance(t, Job) for t in taken) is alone, (loop_rows, text, decode)
        if not alone:
            assert taken == [(job, i) for i in range(len(text))][:len(taken)] and taken
            b.queue.clear()
            b.pending = 0
    b.translator.model = Engine(4)
    first, second = b.submit(["a"], short), b.submit(["b"], short)
    assert b.admissions(idle) == [(first, 0), (second, 0)]  # two requests: the running search, in turn


def test_the_running_search_admits_a_quarter_of_its_size_or_the_job_that_waited_max_wait():
    """Continuous batching: joining costs an encoder pass and a copy of the caches, so queued jobs join a search
    of 8 sentences once 2 are waiting, or once the oldest has waited max_wait; a job with other settings at the
    head waits for the search to end."""
    from dataclasses import astuple, replace

    b = scheduler(max_batch_tokens=100, max_wait_ms=300.0, queue_size=16)
    running = FakeSearch(astuple(b.default_decode), tokens=16, sentences=8)
    first = b.submit(["a"], b.default_decode)
    assert b.admissions(running) == []  # 1 waiting, 4 * 1 < 8, not yet waited 300 ms
    second = b.submit(["b"], b.default_decode)
    assert b.admissions(running) == [(first, 0), (second, 0)]  # 4 * 2 >= 8
    late = b.submit(["c"], b.default_decode)
    time.sleep(0.35)
    assert b.admissions(running) == [(late, 0)]  # alone, but it waited max_wait
    other = b.submit(["d"], replace(b.default_decode, beam=2))
    b.submit(["e"], b.default_decode)
    b.submit(["f"], b.default_decode)
    assert b.admissions(running) == []  # the oldest has other settings: it waits for the search to end
    running.idle = True
    assert b.admissions(running) == [(other, 0)]


def test_the_running_search_takes_requests_in_turn_within_their_share():
    """Issue 74 §1: one request of many long lines cannot hold the search. Sentences are taken one per request per
    turn; each request may hold an equal share of max_batch_tokens; a request with nothing running starts one
    sentence at once, even past the budget (within twice it)."""
    from dataclasses import astuple

    b = scheduler(max_batch_tokens=40, max_wait_ms=0.0, queue_size=64)
    key = astuple(b.default_decode)
    long = " ".join(["w"] * 9)  # 10 tokens with EOS
    big = b.submit([long] * 8, b.default_decode)
    small = b.submit(["x y", "z"], b.default_decode)
    idle = FakeSearch(key)
    idle.idle = True
    taken = b.admissions(idle)  # in turn: big, small, big, small; then big is at its share, 20 of 40 tokens
    assert [(j is big, i) for j, i in taken] == [(True, 0), (False, 0), (True, 1), (False, 1)]
    assert big in b.queue and small not in b.queue and b.pending == 6
    running = FakeSearch(key, tokens=25, sentences=4, held=[(big, 20), (small, 5)])
    assert b.admissions(running) == []  # big's third sentence would pass its share
    assert b.admissions(running) == []
    newcomer = b.submit(["hello there"], b.default_decode)  # nothing running: it starts at once, past the budget
    running.holding.pop(id(small)), running.jobs.pop(id(small))
    assert b.admissions(running) == [(newcomer, 0)]
    running = FakeSearch(key, tokens=79, sentences=8, held=[(big, 79)])
    late = b.submit(["late"], b.default_decode)
    assert b.admissions(running) == []  # 79 + 2 would pass twice the budget: it waits for room
    running.tokens, running.holding[id(big)] = 30, 30
    assert b.admissions(running) == [(late, 0)]  # big is over its share (40 / 2): the newcomer alone joins


def test_a_request_past_the_output_limit_is_refused_with_413():
    from dataclasses import replace

    from relmt.serve.requests import ApiError

    b = scheduler(queue_size=64, max_output_tokens=200)
    cfg = replace(b.default_decode, max_len_a=1.0, max_len_b=50)
    b.submit(["a b c", "d"], cfg)  # (4 + 50) + (2 + 50) = 106
    with pytest.raises(ApiError) as e:
        b.submit(["a b c", "d"] * 2, cfg)  # 212 > 200
    assert e.value.status == 413 and "max_request_output_tokens=200" in e.value.message
    assert b.submit(["a b c", "", "d"], cfg)  # an empty line decodes nothing: 106


def test_the_scheduler_drops_a_job_whose_client_left_and_fails_only_its_batch():
    b = scheduler()
    gone = b.submit(["left early"], b.default_decode)
    kept = b.submit(["stays"], b.default_decode)
    assert gone.future.cancel()  # what the route does when its client disconnects
    batch = b.next_batch()
    assert batch == [kept] and b.pending == 0

    def broken(sentences, **forced):
        raise RuntimeError("boom")

    b.translator.hypotheses = broken
    b.decode(batch)
    with pytest.raises(Exception, match="decoding failed in a batch of 1 request.*RuntimeError: boom"):
        kept.future.result()
    later = b.submit(["later"], b.default_decode)
    assert b.stop(timeout=0) == 1  # never started: what is queued at the deadline is failed, and counted
    with pytest.raises(Exception, match="stopped before this request was decoded"):
        later.future.result()


# --- bad input: a clear 4xx, and the server goes on serving -----------------------------------------

BAD = [  # (id, raw body, status, the field the answer names or a phrase of its message)
    ("malformed json", b'{"text": ', 422, "not valid JSON"),
    ("json not an object", b"[1, 2]", 422, "body"),
    ("text wrong type", b'{"text": 3}', 422, "text"),
    ("text item wrong type", b'{"text": ["a", 3]}', 422, "text[1]"),
    ("text missing", b'{"options": {}}', 422, "text"),
    ("unknown field", b'{"text": "a", "txt": "b"}', 422, "txt"),
    ("a model field", b'{"text": "a", "model": "/etc/passwd"}', 422, "model"),
    ("unknown option", b'{"text": "a", "options": {"bem": 2}}', 422, "options.bem"),
    ("option wrong type", b'{"text": "a", "options": {"beam": "4"}}', 422, "options.beam"),
    ("option bool as int", b'{"text": "a", "options": {"beam": true}}', 422, "options.beam"),
    ("beam zero", b'{"text": "a", "options": {"beam": 0}}', 422, "options.beam"),
    ("beam over max_beam", b'{"text": "a", "options": {"beam": 7}}', 422, "options.beam"),
    ("nbest over beam", b'{"text": "a", "options": {"beam": 2, "nbest": 3}}', 422, "options.nbest"),
    ("topk without sampling", b'{"text": "a", "options": {"topk": 5}}', 422, "options.topk"),
    ("topp out of range", b'{"text": "a", "options": {"sampling": true, "topp": 2}}', 422, "options.topp"),
    ("length_norm unknown", b'{"text": "a", "options": {"length_norm": "x"}}', 422, "options.length_norm"),
    ("empty list", b'{"text": []}', 422, "text"),
    ("nul escaped", b'{"text": "a\\u0000b"}', 422, "text"),
    ("nul raw", b'{"text": "a\x00b"}', 422, "not valid JSON"),
    ("json nested deeply", b'{"text": ' + b"[" * 2000 + b"]" * 2000 + b"}", 422, "not valid JSON"),
    ("lone surrogate", b'{"text": ["ok", "\\ud800"]}', 422, "text[1]"),
    ("line break", b'{"text": ["a\\nb"]}', 422, "text[0]"),
    ("invalid utf-8", b'{"text": "caf\xe9"}', 400, "UTF-8"),
    ("too many lines", json.dumps({"text": ["a"] * 9}).encode(), 413, "text"),
    ("line too long", json.dumps({"text": ["a" * 201]}).encode(), 413, "text[0]"),
    ("body too large", json.dumps({"text": "a" * 5000}).encode(), 413, "max_body_bytes"),
]


@pytest.mark.parametrize("raw,status,where", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(server, raw, status, where):
    r = server.client.post("/v1/translate", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    body = r.json()
    assert body["field"] == where or where in body["error"], body
    still_serving(server)


def test_an_integer_too_long_for_python_is_bad_json_not_a_crash():
    from relmt.config import DecodeConfig
    from relmt.serve.args import ServeArgs
    from relmt.serve.requests import ApiError, parse_body

    with pytest.raises(ApiError, match="not valid JSON .*digits") as e:
        parse_body(b'{"text": "a", "options": {"seed": ' + b"9" * 5000 + b"}}", ServeArgs(), DecodeConfig())
    assert e.value.status == 422


def test_a_streamed_body_over_the_limit_is_cut_off(server):
    def chunks():  # no Content-Length: chunked transfer encoding, counted as it arrives
        yield b'{"text": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    r = server.client.post("/v1/translate", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    still_serving(server)


def test_malformed_http_is_refused_by_the_server_and_it_keeps_serving(server):
    host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
    for raw in (b"GARBAGE\r\n\r\n", b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.settimeout(5)
            sock.sendall(raw)
            answer = sock.recv(100)
        assert answer.startswith(b"HTTP/1.1 4") or answer == b"", answer  # a 4xx, or the connection closed
    still_serving(server)


def test_a_client_that_leaves_costs_only_its_own_work(server):
    """A request queued behind a busy decoder, whose client disconnects, is dropped undecoded."""
    busy = threading.Thread(target=post, args=(server, {"text": "RELMT_TEST_SLOW the dog"}))
    busy.start()
    time.sleep(0.3)  # the slow batch is taken (max_wait_ms=30)
    cancelled = server.metric("relmt_serve_cancelled_total")
    host, port = urllib.parse.urlsplit(server.url).netloc.split(":")
    body = json.dumps({"text": ["bob ran", "alice said that bob arrived"]}).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.2)  # queued behind the slow batch
    server.wait_metric("relmt_serve_cancelled_total", cancelled + 1)
    busy.join(30)
    still_serving(server)


def test_a_long_request_shares_the_search_and_leaves_it_when_its_client_does(ckpt, tmp_path):
    """Issue 74 §1 through a real server: a request of 16 lines of 200 words (each held to its output limit,
    floor(4 |x|) = 804 steps, by min_len) is running when a 2-word request arrives; the short one joins the search
    at once and is answered while the long one runs. Then the long one's client hangs up: its sentences leave the
    search (counted in relmt_serve_cancelled_sentences) and its queued ones are dropped, and the server serves on."""
    args = ["max_len_a=4", "max_len_b=0", "min_len=5000", "max_request_output_tokens=0", "max_lines=64",
            "max_line_chars=2000", "max_body_bytes=200000"]
    s = Server(ckpt, tmp_path / "server.log", *args)
    try:
        host, port = urllib.parse.urlsplit(s.url).netloc.split(":")
        body = json.dumps({"text": [" ".join(["the"] * 200)] * 16}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            deadline = time.monotonic() + 30
            while s.metric("relmt_serve_batch_sentences_count") < 20 and time.monotonic() < deadline:
                time.sleep(0.01)  # the long request's sentences are stepping
            r = post(s, {"text": "the dog"})
            assert r.status_code == 200 and r.json()["translations"][0]
            sock.settimeout(0.01)
            with pytest.raises(TimeoutError):  # the long request is still decoding: no answer yet
                sock.recv(1)
        s.wait_metric("relmt_serve_cancelled_total", 1)
        assert 0 < s.metric("relmt_serve_cancelled_sentences_total") <= 16
        assert s.metric("relmt_serve_requests_in_progress") == 0
        still_serving(s)
    finally:
        s.stop()


def test_a_failing_batch_fails_only_its_own_requests(server):
    # different options: never in one batch with the failing request
    faulty, other = in_threads([lambda: post(server, {"text": "RELMT_TEST_FAULT the dog"}),
                                lambda: post(server, {"text": "bob ran", "options": {"beam": 1}})])
    assert faulty.status_code == 500
    assert "decoding failed" in faulty.json()["error"] and "RELMT_TEST_FAULT" in faulty.json()["error"]
    assert other.status_code == 200, other.text
    assert server.metric('relmt_serve_errors_total{kind="decoding"}') >= 1
    still_serving(server)


# --- security -----------------------------------------------------------------------------------------

def test_a_set_api_key_is_required_as_a_bearer_token(ckpt, tmp_path):
    s = Server(ckpt, tmp_path / "key.log", key=KEY)
    try:
        anon = httpx.Client(base_url=s.url, timeout=30)
        for headers in ({}, {"Authorization": "Bearer wrong-key-0123456789"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}):
            r = anon.post("/v1/translate", json={"text": "bob ran"}, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", headers
        assert anon.get("/metrics").status_code == 401
        assert anon.get("/health").status_code == 200 and anon.get("/ready").status_code == 200
        assert anon.get("/").status_code == 200  # the page holds no secret; it asks for the key
        anon.close()
        assert s.client.post("/v1/translate", json={"text": "bob ran"}).status_code == 200
        assert s.metric('relmt_serve_errors_total{kind="unauthorized"}') == 5
    finally:
        s.stop()


def run_serve(ckpt: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relmt.serve", f"checkpoint={ckpt}", *args], capture_output=True,
                          text=True, env=server_env(key), timeout=60)


def test_other_hosts_need_an_api_key_and_it_is_checked_before_binding(ckpt):
    from relmt.serve.security import api_key, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("example.org")
    done = run_serve(ckpt, "host=0.0.0.0", "port=0")  # refused before any socket is made
    assert done.returncode == 2, done.stderr
    assert "host=0.0.0.0 is not a loopback address: set RELMT_SERVE_API_KEY" in done.stderr
    assert "listening" not in done.stderr
    with pytest.raises(UserError, match="RELMT_SERVE_API_KEY holds 5 characters: use at least 16"):
        api_key("127.0.0.1", {"RELMT_SERVE_API_KEY": "short"})
    assert api_key("0.0.0.0", {"RELMT_SERVE_API_KEY": KEY}) == KEY  # with a key another host is allowed
    assert api_key("127.0.0.1", {}) is None


@pytest.mark.parametrize("args,message", [
    (["queue_size=4", "max_lines=8"], "queue_size=4: must be >= max_lines=8"),
    (["bogus=1"], "bogus: no such argument"),
    (["max_lines=0"], "max_lines=0: must be >= 1"),
    (["port=70000"], "port=70000: must be in"),
    (["threads=-1"], "threads=-1: must be >= 0"),
    (["max_len_b=-1"], "decode.max_len_b: must be >= 0, got -1"),
    (["min_len=-2"], "decode.min_len: must be >= 0, got -2"),
    (["request_timeout_s=0"], "request_timeout_s=0: must be > 0"),
    (["cors_origins=http://127.0.0.1:8080/"], "cors_origins: 'http://127.0.0.1:8080/' is not an origin"),
    (["cors_origins=[127.0.0.1:8080]"], "cors_origins: '127.0.0.1:8080' is not an origin"),
    (["cors_origins=*"], "cors_origins=*: not a value YAML can read"),  # a YAML alias: a traceback before
    # the decoding defaults (issue 74 §4): "beam: no such argument (did you mean max_beam?)" before
    (["beam=9"], "beam=9: more than max_beam=8, the beam a request may ask for at most"),
    (["beam=4", "max_beam=2"], "beam=4: more than max_beam=2"),
    (["nbest=9"], "nbest=9: more than max_beam=8"),
    (["beam=2", "nbest=3"], "nbest=3: must be in [1, beam=2], got 3"),
    (["lenpen=-1"], "lenpen=-1.0: must be in [0,"),
    (["length_norm=cubic"], "length_norm=cubic: must be one of gnmt, power"),
    (["sampling=false", "topk=5"], "topk=5: applies only when sampling"),
])
def test_bad_arguments_are_said_before_anything_loads(ckpt, args, message, monkeypatch):
    from relmt.serve.main import serve

    monkeypatch.delenv("RELMT_SERVE_API_KEY", raising=False)
    with pytest.raises(UserError, match=re.escape(message)):
        serve([f"checkpoint={ckpt}", *args])


def test_the_decoding_defaults_are_checked_over_the_checkpoint_s_decode_config():
    """What needs the checkpoint's own settings is checked as it loads: nbest over the checkpoint's beam, and a
    checkpoint beam over max_beam, which would have every request without a beam of its own refused."""
    from relmt.config import DecodeConfig
    from relmt.serve.args import DECODING_KEYS, ServeArgs, server_decode
    from relmt.serve.requests import Options

    assert set(DECODING_KEYS) == set(Options.model_fields)  # every option a request may set has a default here
    checkpoint = DecodeConfig(beam=4, nbest=1, lenpen=0.6)
    assert server_decode(checkpoint, ServeArgs()) == checkpoint
    got = server_decode(checkpoint, ServeArgs(beam=2, nbest=2, lenpen=1.0, length_norm="power", max_len_b=5))
    assert (got.beam, got.nbest, got.lenpen, got.length_norm.value, got.max_len_b) == (2, 2, 1.0, "power", 5)
    with pytest.raises(UserError, match=re.escape("nbest=3: must be in [1, beam=2], got 3 (the settings given at "
                                                  "start, over the checkpoint's decode config)")):
        server_decode(DecodeConfig(beam=2), ServeArgs(nbest=3))
    with pytest.raises(UserError, match=re.escape("the checkpoint's decode.beam=10 is more than max_beam=8")):
        server_decode(DecodeConfig(beam=10), ServeArgs())
    assert server_decode(DecodeConfig(beam=10), ServeArgs(beam=8)).beam == 8


def test_a_missing_checkpoint_is_said_before_binding(tmp_path, monkeypatch):
    from relmt.serve.main import serve

    monkeypatch.delenv("RELMT_SERVE_API_KEY", raising=False)
    with pytest.raises(UserError, match="checkpoint=.*none.pt: no such checkpoint"):
        serve([f"checkpoint={tmp_path / 'none.pt'}", "port=0"])


def test_a_model_that_cannot_be_loaded_ends_the_server_with_the_reason(tmp_path):
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not a checkpoint")
    done = run_serve(broken, "port=0")
    assert done.returncode == 2, done.stderr
    assert "listening on http://127.0.0.1:" in done.stderr  # /health answered while it loaded
    assert "relmt-serve: error: the model could not be loaded" in done.stderr and str(broken) in done.stderr


# --- faults: a full queue, SIGTERM under load -------------------------------------------------------------

def test_a_full_queue_answers_503_and_sigterm_answers_every_accepted_request(ckpt, tmp_path):
    s = Server(ckpt, tmp_path / "term.log", "queue_size=4", "max_lines=4", "shutdown_deadline_s=30")
    try:
        slow = threading.Thread(target=lambda: results.__setitem__(0, post(s, {"text": "RELMT_TEST_SLOW a"})))
        results: list = [None] * 5
        slow.start()
        time.sleep(0.3)  # the slow batch is taken: the decoder is busy for two seconds
        queued = [threading.Thread(target=lambda i=i: results.__setitem__(i, post(s, {"text": f"bob ran {i}"})))
                  for i in range(1, 5)]
        for t in queued:
            t.start()
        s.wait_metric("relmt_serve_queue_sentences", 4)  # the queue holds queue_size sentences
        full = post(s, {"text": "one too many"})
        assert full.status_code == 503 and full.headers["retry-after"] == "1", full.text
        assert "queue is full" in full.json()["error"]
        assert s.metric("relmt_serve_requests_in_progress") == 5
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no new connection is accepted while the five finish
            httpx.post(s.url + "/v1/translate", json={"text": "late"}, timeout=5)
        for t in [slow, *queued]:
            t.join(60)
        assert [r.status_code for r in results] == [200] * 5, [getattr(r, "text", r) for r in results]
        assert s.proc.wait(30) == 0, s.text()
    finally:
        s.stop()


def test_requests_on_kept_alive_connections_during_the_drain_get_503_not_a_reset(ckpt, tmp_path):
    """After SIGTERM, uvicorn closed every idle keep-alive connection at once: a request a client sent on one met a
    closed connection (issue 74 §4: resets instead of 503s). Now they stay open while the accepted requests are
    answered, and a request on one gets 503 + Retry-After + `Connection: close`; the client's next request then
    needs a new connection, which is refused (the listening socket is closed): a clean ConnectError, not a reset.
    Two slow requests keep the drain going for about four seconds."""
    s = Server(ckpt, tmp_path / "drain.log", "shutdown_deadline_s=30")
    clients = [httpx.Client(base_url=s.url, timeout=30) for _ in range(4)]
    try:
        for c in clients:  # each now holds an idle kept-alive connection
            assert c.post("/v1/translate", json={"text": "bob ran"}).status_code == 200
        slow = in_threads_started([lambda i=i: post(s, {"text": f"RELMT_TEST_SLOW a {i}"}) for i in range(2)])
        s.wait_metric("relmt_serve_requests_in_progress", 2)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        for c in clients:
            r = c.post("/v1/translate", json={"text": "late"})
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
            assert r.headers["connection"] == "close" and "shutting down" in r.json()["error"]
        assert any(t.is_alive() for t, _ in slow)  # the drain was still going: a slow one not yet answered
        with pytest.raises(httpx.ConnectError):  # its connection closed as said; no new one is accepted
            clients[0].post("/v1/translate", json={"text": "later"})
        for t, _ in slow:
            t.join(60)
        assert [r[0].status_code for _, r in slow] == [200, 200], [r[0] for _, r in slow]
        assert s.proc.wait(30) == 0, s.text()
    finally:
        for c in clients:
            c.close()
        s.stop()


def in_threads_started(calls: list) -> list:
    """Each call started in its own thread: (thread, [its result or exception, once it has ended])."""
    started = []
    for call in calls:
        box: list = [None]

        def run(call=call, box=box):
            try:
                box[0] = call()
            except Exception as e:  # noqa: BLE001 - reported to the test
                box[0] = e
        thread = threading.Thread(target=run)
        thread.start()
        started.append((thread, box))
    return started


def test_requests_cut_off_at_the_shutdown_deadline_are_counted_not_dropped_silently(ckpt, tmp_path):
    s = Server(ckpt, tmp_path / "deadline.log", "shutdown_deadline_s=0.5")
    try:
        answer: list = [None]
        slow = threading.Thread(target=lambda: answer.__setitem__(0, post(s, {"text": "RELMT_TEST_SLOW a"})))
        slow.start()
        s.wait_metric("relmt_serve_requests_in_progress", 1)
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(30) == 1, s.text()
        slow.join(30)
        # answered 500 (or its connection closed), not left hanging
        assert isinstance(answer[0], httpx.HTTPError) or answer[0].status_code == 500, answer[0]
        assert "1 request(s) were still unanswered at the shutdown deadline" in s.text()
    finally:
        s.stop()


# --- the page in a real browser -------------------------------------------------------------------------

def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_the_page_translates_in_a_headless_browser(server, tmp_path):
    sentence = "the dog saw the cat"
    expected = post(server, {"text": sentence}).json()["translations"][0]
    url = f"{server.url}/?text={urllib.parse.quote(sentence)}"  # the page submits ?text= on load
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=20000", "--dump-dom",
                           url], capture_output=True, text=True, timeout=120)
    out = re.search(r'<pre id="out"[^>]*>(.*?)</pre>', done.stdout, re.S)
    assert out is not None, done.stdout[-2000:] + done.stderr[-2000:]
    assert 'data-done="1"' in out.group(0) and out.group(1) == expected, out.group(0)


class PageHost:
    """A second HTTP server on 127.0.0.1, on a port of its own: another origin than relmt-serve's. It serves
    the pages a test puts in `pages` (path -> HTML)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        pages = self.pages = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                body = pages.get(self.path.partition("?")[0], "").encode()
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


def fetch_page(api: str, sentence: str, key: str | None = None) -> str:
    """A page whose script POSTs `sentence` to api/v1/translate with fetch() (JSON, and the key as a bearer
    token: a CORS preflight either way) and writes the translation, or the error, into <pre id="out">."""
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return f"""<!doctype html><html><body><pre id="out">waiting</pre><script>
const out = document.getElementById("out");
fetch({json.dumps(api + "/v1/translate")}, {{method: "POST", headers: {json.dumps(headers)},
                                             body: JSON.stringify({{text: {json.dumps(sentence)}}})}})
  .then(r => r.json().then(b => {{ out.textContent = r.ok ? "translation: " + b.translations[0]
                                                         : "error: " + r.status + " " + b.error; }}))
  .catch(e => {{ out.textContent = "error: " + e; }})
  .finally(() => {{ out.dataset.done = "1"; }});
</script></body></html>"""


def browser_out(url: str, profile: Path) -> str:
    """What the page at `url` wrote into <pre id="out"> once done, in headless chromium."""
    done = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           f"--user-data-dir={profile}", "--virtual-time-budget=20000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=120)
    out = re.search(r'<pre id="out"([^>]*)>(.*?)</pre>', done.stdout, re.S)
    assert out is not None and 'data-done="1"' in out.group(1), done.stdout[-2000:] + done.stderr[-2000:]
    return out.group(2)


@pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_cors_is_off_by_default_so_a_page_of_another_origin_cannot_call(server, tmp_path):
    """Without cors_origins the server sends no CORS headers: the browser refuses a page of another origin the
    answer (tests/test_serve_robust.py has the page translating once its origin is allowed)."""
    host = PageHost()
    try:
        host.pages["/call.html"] = fetch_page(server.url, "the dog saw the cat")
        out = browser_out(f"{host.origin}/call.html", tmp_path / "profile")
    finally:
        host.close()
    assert out.startswith("error: TypeError"), out  # fetch() failed: no Access-Control-Allow-Origin
    preflight = server.client.options("/v1/translate", headers={
        "Origin": host.origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert "access-control-allow-origin" not in preflight.headers, preflight.headers


def test_the_load_benchmark_runs_small(ckpt, tmp_path):
    """scripts/bench/bench_serve.py end to end with tiny counts (its own process: it tunes the CPU settings of
    the process it runs in): the real server, loopback, bounded loops."""
    src = tmp_path / "test.src"
    src.write_text("the dog saw the cat\nbob ran\n\na small red bird sang\n", encoding="utf-8")
    root = Path(__file__).parent.parent
    script = root / "scripts" / "bench" / "bench_serve.py"
    done = subprocess.run([sys.executable, str(script), "--checkpoint", str(ckpt),
                           "--src", str(src), "--clients", "1", "4", "--requests", "6", "--max-seconds", "30",
                           "--single-n", "3", "--threads", "1", "--log", str(tmp_path / "serve.log"),
                           "--json", str(tmp_path / "serve.json"), "--md", str(tmp_path / "serve.md")],
                          capture_output=True, text=True, env=server_env(), cwd=root, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    payload = json.loads((tmp_path / "serve.json").read_text())
    assert [(row["batching"], row["clients"], row["ok"], row["errors"]) for row in payload["levels"]] == [
        (mode, clients, 6, {}) for mode in ("continuous", "batch") for clients in (1, 4)]
    assert payload["exit_statuses"] == {"continuous": 0, "batch": 0} and payload["offline"]["single_n"] == 3
    assert "1 client p50 ÷ offline one-at-a-time" in (tmp_path / "serve.md").read_text()
    assert all(row["mean_batch"] >= 1 and row["client_cpu_share"] > 0 for row in payload["levels"])


def test_without_the_serve_extra_it_says_what_to_install():
    """Without fastapi/uvicorn it used to stop with a bare ImportError traceback (issue 57)."""
    code = ("import sys; sys.modules['uvicorn'] = None; sys.argv = ['relmt-serve', 'checkpoint=x.pt']; "
            "from relmt.serve.main import main; main()")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "relmt-serve needs the serve extra" in done.stderr and "pip install 'relmt[serve]'" in done.stderr
