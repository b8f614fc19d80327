"""One decoding thread that owns the Translator and batches sentences across requests.

With continuous=True (relmt-serve's default) and a model the running search can take
(relmt.decode.continuous.supports), the thread runs one beam search that queued jobs join between two
steps (`run_stream`, relmt/serve/stream.py), sentence by sentence and in turn (issue 74 §1: one request of 64
long lines held the server for a minute, first come first served):
- the jobs with the oldest job's settings join once a quarter as many sentences as the search holds are queued
  or the oldest has waited max_wait_ms;
- they are taken round-robin, one sentence of each job per turn, so that no request waits for another's last
  sentence to start;
- max_batch_tokens source tokens (the running ones counted) are shared: each request with sentences running or
  waiting may hold an equal share of them, and one past its share gets no more until it is under it again;
- a request with nothing running may always start one sentence, within twice max_batch_tokens: a 3-word
  request beside a search full of 499-word lines starts at the next step, not when they end.
A job with other settings waits for the search to end. A job whose client leaves has its sentences taken out of
the running search before the next step (`on_cancelled`), and its queued ones dropped. A job the running search
cannot take (sampling, or a target prefix or constraints, which change the search's steps; issue 60) is decoded
batch by batch, with the jobs queued with its settings, while no search runs, and counted by `on_apart(reason)`.
A lone request of one sentence, with nothing running and nothing else queued, is decoded as a batch too where the
engine runs a sentence's whole search in one compiled call (engine=aoti's loop.pt2, issue 76 §1: `alone`): one call
instead of a step per token; a request that comes meanwhile waits for that sentence's search, not for a step.
Otherwise it decodes batch after batch, as follows.

A request's sentences enter a bounded queue as one Job (all of them or none: a request that does
not fit gets QueueFull, answered 503 with Retry-After). The thread takes the oldest job and decodes
up to max_batch_tokens source tokens of the jobs with its decoding settings (and its kind of prefix or
constraints) as one call of Translator.hypotheses, which orders and pads them into the model's own batches
(decode.max_source_tokens).

Either way the answers are Translations (relmt.decode.translator): token scores and word alignments, where a
job asks for them, come from one teacher-forced pass over its finished hypotheses (relmt.serve.stream.annotate),
so jobs that ask for them share batches and the running search with those that do not.

How long a batch waits for more is adaptive. The clients likely to send again are those the last
batch answered plus those already queued behind it: the decoder waits until that many jobs are
queued, up to max_wait_ms from the later of the oldest job's arrival and the moment the decoder
became free. A lone client therefore never waits. Waiting from the arrival alone let closed-loop
clients (each sends again when answered) settle into two alternating halves, each taken the moment
the other ended; now the answered clients are waited for, as long as they come back within max_wait.

Jobs with other settings keep their place for a later batch. Sampling requests are never joined
with others: a sample is seeded by its line number in the batch (relmt/decode/sampling.py), so
joining would make a request's samples depend on its neighbours.

A batch (continuous: a step) that raises fails its own jobs, each with the message, and nothing else.
A job whose client left before its batch was taken is dropped unbatched (its sentences cost nothing
more); one already in a running batch is decoded with it.

Every torch operation of the server runs in this thread, the model's loading included: one in another thread
would give the process a second OpenMP team, and GNU OpenMP, with more threads than cores, then stops spin-waiting
between parallel regions (docs/results/performance/omp_teams.md).

Test hooks (off unless the environment sets RELMT_SERVE_TEST_HOOKS=1, for tests/test_serve.py): a
batch holding a sentence with RELMT_TEST_FAULT raises, and one with RELMT_TEST_SLOW sleeps two seconds
before decoding, so that tests can fail a batch or keep the decoder busy through a real process.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import astuple, dataclass, field

from relmt.config import DecodeConfig
from relmt.decode import continuous
from relmt.serve.requests import ApiError, Asks
from relmt.serve.stream import Stream, annotate

log = logging.getLogger(__name__)
HOOKS_ENV = "RELMT_SERVE_TEST_HOOKS"
FAULT_WORD, SLOW_WORD = "RELMT_TEST_FAULT", "RELMT_TEST_SLOW"
_ids = itertools.count()


class QueueFull(Exception):
    pass


class NotReady(Exception):
    pass


class BatchFailed(Exception):
    pass


@dataclass
class Job:
    sentences: list[str]
    decode: DecodeConfig
    tokens: int = 0  # source pieces + EOS of all its sentences, counted on submit
    arrived: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)  # list[list[Translation]], one list per sentence
    asks: Asks = field(default_factory=Asks)  # its prefixes, constraints and annotations
    ids: list = field(default_factory=list)  # each sentence's source ids, encoded on submit
    cancelled: bool = False
    key: tuple = ()
    results: list = field(default_factory=list)  # continuous batching: each sentence's answer as it finishes
    left: int = 0  # continuous batching: its sentences not yet finished
    admitted: int = 0  # continuous batching: its sentences that have joined the running search, in order

    def __post_init__(self) -> None:  # the settings a batch shares; a sampling job shares with no other
        self.key = ("sampling", next(_ids)) if self.decode.sampling else astuple(self.decode) + \
            ((self.asks.apart, self.asks.ordered) if self.asks.apart else ())
        self.results, self.left = [[] for _ in self.sentences], len(self.sentences)

    def cost(self, i: int) -> int:
        """Sentence i's source tokens (its pieces, cut to max_source_len, and EOS): its share of the search."""
        cap = self.decode.max_source_len
        return min(len(self.ids[i]), cap or len(self.ids[i])) + 1 if self.ids else 1

    @property
    def apart(self) -> str | None:
        """Why the running search cannot take it: "sampling", "constraints", "prefix"; None if it can."""
        return "sampling" if self.decode.sampling else self.asks.apart


class Batcher:
    """`load` builds the Translator (in the decoding thread, so that the server answers /health while a
    model loads or an engine compiles); `on_batch(sentences, seconds)`, `on_queue(sentences)` and
    `on_apart(reason)` (a job decoded apart from the running search, Job.apart) feed the metrics;
    `on_load_error(message)` is told when the model cannot be loaded."""

    def __init__(self, load: Callable, queue_size: int, max_batch_tokens: int, max_wait_ms: float,
                 on_batch: Callable[[int, float], None], on_queue: Callable[[int], None],
                 on_load_error: Callable[[str], None], hooks: bool | None = None, continuous: bool = False,
                 on_apart: Callable[[str], None] = lambda reason: None, max_output_tokens: int = 0,
                 on_cancelled: Callable[[int, int], None] = lambda jobs, sentences: None) -> None:
        self.load, self.queue_size, self.max_batch_tokens = load, queue_size, max_batch_tokens
        self.max_output_tokens = max_output_tokens  # a request's output limit in all; 0: none
        self.on_cancelled = on_cancelled  # told (jobs, sentences) taken out of the running search: their clients left
        self.continuous = continuous
        self.max_wait = max_wait_ms / 1000
        self.on_batch, self.on_queue, self.on_load_error = on_batch, on_queue, on_load_error
        self.on_apart = on_apart
        self.hooks = os.environ.get(HOOKS_ENV) == "1" if hooks is None else hooks
        self.queue: deque[Job] = deque()
        self.pending = 0  # sentences in the queue
        self.cond = threading.Condition()
        self.translator = None
        self.default_decode: DecodeConfig | None = None
        self.load_error = ""
        self.stopping = False
        self.last = 0  # jobs in the last batch: the clients it answered are likely to send again
        self.thread = threading.Thread(target=self.run, name="relmt-serve-decoder", daemon=True)

    @property
    def ready(self) -> bool:
        return self.translator is not None and not self.stopping

    def start(self) -> None:
        self.thread.start()

    def submit(self, sentences: list[str], decode: DecodeConfig, asks: Asks | None = None) -> Job:
        """Queue a request's sentences, all or none (QueueFull); NotReady before the model is loaded."""
        if not self.ready:
            raise NotReady(self.load_error or ("shutting down" if self.stopping else "the model is loading"))
        ids = self.translator.tokenizer.encode(sentences)
        job = Job(sentences, decode, sum(len(x) + 1 for x in ids), asks=asks or Asks(), ids=ids)
        if self.max_output_tokens and (cost := output_limit(job)) > self.max_output_tokens:
            raise ApiError(413, f"the request may decode up to {cost} output tokens (each line's limit, "
                           f"floor({decode.max_len_a:g} x its source tokens + {decode.max_len_b}), summed), more "
                           f"than max_request_output_tokens={self.max_output_tokens}: send fewer or shorter lines "
                           "in each request", "text")
        with self.cond:
            if self.pending + len(sentences) > self.queue_size:
                raise QueueFull(f"{self.pending} sentences are queued (queue_size={self.queue_size})")
            self.queue.append(job)
            self.pending += len(sentences)
            self.on_queue(self.pending)
            self.cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client left: drop the job if no batch has taken it yet."""
        job.cancelled = True

    def stop(self, timeout: float) -> int:
        """Decode what is queued, then end the thread; the number of jobs failed unanswered."""
        with self.cond:
            self.stopping = True
            self.cond.notify()
        if self.thread.ident is not None:  # started
            self.thread.join(timeout)
        with self.cond:
            left = list(self.queue)
            self.queue.clear()
        unanswered = [job for job in left if not job.future.cancelled()]  # not those whose client had left
        for job in unanswered:
            fail(job, BatchFailed("the server stopped before this request was decoded"))
        return len(unanswered)

    def run(self) -> None:
        try:
            self.translator = self.load()
            self.default_decode = self.translator.decode
        except Exception as e:  # a UserError names the checkpoint or engine; anything else is said as it is
            self.load_error = f"the model could not be loaded: {e}"
            log.error("%s", self.load_error)
            self.on_load_error(self.load_error)
            return
        if self.streams():
            self.run_stream(Stream(self.translator, self.on_batch))
            return
        while (batch := self.next_batch()) is not None:
            self.decode(batch)

    def streams(self) -> bool:
        """Whether requests join a running search (continuous batching): relmt's own search of one Transformer or of
        an onnx or aoti engine's graphs (relmt.decode.continuous.supports). A
        ctranslate2 server keeps its torch model beside the converted one (for alignments and token scores), but
        decodes with CTranslate2's search, batch after batch."""
        return (self.continuous and getattr(self.translator, "ct2", None) is None
                and continuous.supports(self.translator.model, self.default_decode))

    def run_stream(self, stream: Stream) -> None:
        """Continuous batching: jobs join the running search between two steps (relmt/serve/stream.py);
        those the search cannot take (Job.apart: sampling, a prefix, constraints) are decoded as a batch of their
        own while nothing runs."""
        while (taken := self.admissions(stream)) is not None:
            if taken and isinstance(taken[0], Job):  # jobs the search cannot take (Job.apart), or a lone sentence
                for job in taken:
                    if job.apart:
                        self.on_apart(job.apart)
                self.decode(taken)
                continue
            if taken:
                try:
                    self.test_hooks([job.sentences[i] for job, i in taken])
                    stream.admit(taken)
                except Exception as e:
                    jobs = list({id(job): job for job, _ in taken}.values())
                    log.exception("admitting %d request(s) to the running search failed", len(jobs))
                    for job in jobs:
                        stream.jobs.pop(id(job), None)
                        with self.cond:
                            self.forget(job)
                        fail(job, BatchFailed(f"decoding failed: {type(e).__name__}: {e}"))
            jobs_gone, sentences_gone = stream.drop_cancelled()  # their clients left: out before the next step
            if jobs_gone:
                self.on_cancelled(jobs_gone, sentences_gone)
            if stream.idle:
                continue
            try:
                stream.step()
            except Exception as e:
                failed = stream.fail()
                log.exception("a decoding step of %d request(s) failed", len(failed))
                for job in failed:
                    fail(job, BatchFailed(f"decoding failed in a step of {len(failed)} request(s): "
                                          f"{type(e).__name__}: {e}"))

    def admissions(self, stream: Stream) -> list | None:
        """What joins the running search now, as (job, sentence index) pairs taken in turn (the module's
        docstring); or jobs the search cannot take (Job.apart), to decode as a batch while it is idle; [] to step
        on without new ones (the oldest has other settings and waits for the search to end, or fewer than a quarter
        of its sentences are queued and the oldest has waited less than max_wait, or no request has room); None
        once stopping with nothing left."""
        with self.cond:
            while True:
                while stream.idle and not self.queue and not self.stopping:
                    self.cond.wait()
                self.drop_cancelled()
                if not self.queue:
                    if not stream.idle:
                        return []
                    if self.stopping:
                        return None
                    continue
                first = self.queue[0]
                if stream.idle and self.alone(first):
                    return self.take(first, budget=0)
                if first.apart:
                    if not stream.idle:
                        return []
                    jobs = self.take(first)
                    if jobs:
                        return jobs
                    continue
                if not stream.idle:
                    if first.key != stream.key:
                        return []
                    # joining costs an encoder pass and a copy of the caches: gather a quarter of the search's
                    # sentences first, unless the oldest has waited max_wait
                    waiting = sum(len(j.sentences) - j.admitted for j in self.queue if j.key == first.key)
                    if 4 * waiting < len(stream.run.keys) and time.monotonic() - first.arrived < self.max_wait:
                        return []
                taken = self.in_turn([j for j in self.queue if j.key == first.key], stream)
                if taken or not stream.idle:
                    return taken

    def alone(self, job: Job) -> bool:
        """Whether `job` is a lone sentence (the queue's only job, of one sentence) whose whole beam search the engine
        runs in one compiled call (GraphModel.loops: engine=aoti's loop.pt2, one sentence, a short step limit)."""
        loops = getattr(getattr(self.translator, "model", None), "loops", None)
        return len(self.queue) == 1 and len(job.sentences) == 1 and not job.apart and job.decode.beam > 1 and \
            loops is not None and loops(job.decode.beam, output_limit(job))

    def in_turn(self, jobs: list[Job], stream: Stream) -> list[tuple[Job, int]]:
        """Sentences of `jobs` (oldest first) to join the search: one of each job per turn while it is under its
        share of max_batch_tokens (an equal share for every request running or waiting), a job with nothing
        running always one, within twice max_batch_tokens in all (the module's docstring)."""
        budget = self.max_batch_tokens
        active = {id(j) for j in jobs} | set(stream.jobs)
        share = budget / max(len(active), 1)
        total = stream.tokens
        held = {id(j): stream.held(j) for j in jobs}
        taken: list[tuple[Job, int]] = []
        more = True
        while more:
            more = False
            for job in jobs:
                if job.admitted == len(job.sentences):
                    continue
                cost = job.cost(job.admitted)
                mine = held[id(job)]
                if mine == 0:  # its first sentence in the search: whatever its share
                    fits = total + cost <= 2 * budget or (stream.idle and not taken)
                else:
                    fits = mine + cost <= share and total + cost <= budget
                if not fits:
                    continue
                if job.admitted == 0 and not job.future.set_running_or_notify_cancel():  # its client left
                    self.forget(job)  # nothing of it joins
                    job.admitted, job.cancelled = len(job.sentences), True
                    continue
                taken.append((job, job.admitted))
                job.admitted += 1
                held[id(job)] = mine + cost
                total += cost
                more = True
        for job in jobs:
            if job.admitted == len(job.sentences):
                self.forget(job)
        self.pending -= len(taken)
        self.on_queue(self.pending)
        return taken

    def forget(self, job: Job) -> None:
        """Take a job out of the queue (all its sentences are in the search, or it failed)."""
        if job in self.queue:
            self.queue.remove(job)
            self.pending -= len(job.sentences) - job.admitted

    def next_batch(self) -> list[Job] | None:
        """The next batch: the oldest job and the jobs with its settings, up to max_batch_tokens, once as
        many jobs as the last batch held plus those queued now are queued, or max_wait has passed since the
        later of the oldest job's arrival and this call; None once stopping with nothing queued."""
        free = time.monotonic()  # the decoder became free
        with self.cond:
            expect = self.last + sum(not j.cancelled for j in self.queue)
            while True:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                self.drop_cancelled()
                if not self.queue:
                    if self.stopping:
                        return None
                    continue
                first = self.queue[0]
                deadline = max(first.arrived, free) + self.max_wait
                while not self.stopping and not first.decode.sampling:  # a sampling job is batched alone
                    like = [j for j in self.queue if j.key == first.key and not j.cancelled]
                    if len(like) >= expect or sum(j.tokens for j in like) >= self.max_batch_tokens:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.cond.wait(left)
                batch = self.take(first)
                if batch:
                    self.last = len(batch)
                    return batch

    def drop_cancelled(self) -> None:
        for job in [j for j in self.queue if j.cancelled]:
            self.queue.remove(job)
            self.pending -= len(job.sentences) - job.admitted  # those in the search leave it before its next step
            fail(job, BatchFailed("the client left"))
        self.on_queue(self.pending)

    def take(self, first: Job, budget: int | None = None) -> list[Job]:
        """The queued jobs with first's settings, oldest first, within `budget` source tokens (default
        max_batch_tokens; the first job is taken whatever its size)."""
        self.drop_cancelled()
        batch, tokens = [], 0
        budget = self.max_batch_tokens if budget is None else budget
        for job in list(self.queue):
            if job.key != first.key or (batch and tokens + job.tokens > budget):
                continue
            self.queue.remove(job)
            self.pending -= len(job.sentences)
            if not job.future.set_running_or_notify_cancel():  # its client left: decode nothing for it
                continue
            batch.append(job)  # from here its client's leaving cancels nothing: it is decoded with the batch
            tokens += job.tokens
        self.on_queue(self.pending)
        return batch

    def decode(self, batch: list[Job]) -> None:
        """One call of Translator.hypotheses for the batch's jobs (which share their settings, Job.key), each
        sentence with its prefix and constraints; the answers annotated as each job asks."""
        sentences = [s for job in batch for s in job.sentences]
        prefixes = [p for job in batch for p in job.asks.prefixes or [""] * len(job.sentences)]
        constraints = [c for job in batch for c in job.asks.constraints or [[]] * len(job.sentences)]
        owners = [(job, i) for job in batch for i in range(len(job.sentences))]
        start = time.perf_counter()
        try:
            self.test_hooks(sentences)
            self.translator.decode = batch[0].decode  # this thread alone uses the translator
            hyps = self.translator.hypotheses(sentences, prefixes=prefixes if any(prefixes) else None,
                                              constraints=constraints if any(constraints) else None,
                                              ordered=batch[0].asks.ordered,
                                              stop=lambda: all(job.cancelled for job in batch))  # every client left
            results = annotate(self.translator, batch[0].decode, [(j, i, hs) for (j, i), hs in zip(owners, hyps)])
        except Exception as e:
            log.exception("a batch of %d requests (%d sentences) failed", len(batch), len(sentences))
            for job in batch:
                fail(job, BatchFailed(f"decoding failed in a batch of {len(batch)} request(s): "
                                      f"{type(e).__name__}: {e}"))
            return
        finally:
            self.on_batch(len(sentences), time.perf_counter() - start)
        first = 0
        for job in batch:
            job.future.set_result(results[first:first + len(job.sentences)])
            first += len(job.sentences)

    def test_hooks(self, sentences: list[str]) -> None:
        if not self.hooks:
            return
        if any(SLOW_WORD in s for s in sentences):
            time.sleep(2.0)
        if any(FAULT_WORD in s for s in sentences):
            raise RuntimeError(f"test hook: {FAULT_WORD} in the batch ({HOOKS_ENV}=1)")


def output_limit(job: Job) -> int:
    """The output tokens a job may decode at most: each line's step limit, floor(a |x| + b) with |x| its source
    tokens and EOS (relmt.decode.beam.max_lengths), summed over its non-empty lines."""
    cfg = job.decode
    return sum(math.floor(cfg.max_len_a * job.cost(i) + cfg.max_len_b)
               for i, s in enumerate(job.sentences) if s.strip())


def fail(job: Job, error: Exception) -> None:
    with contextlib.suppress(InvalidStateError):  # cancelled meanwhile by its leaving client
        job.future.set_exception(error)
