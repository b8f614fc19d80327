"""The decoding thread's running search under continuous batching (relmt/decode/continuous.py).

Sentences of jobs with one decoding setting are admitted between two steps, in the turns the scheduler gives
(relmt/serve/batcher.py): cut to decode.max_source_len as relmt-translate cuts them (with the same warning), and
joined to the search. The sentences of a job whose client left are taken out of it before the next step.
Each step hands every sentence that finished, detokenised, to its job; a job is answered when its
last sentence finishes, its sentences in input order (an empty line: no hypotheses, as offline).
Token scores and word alignments, where a job asks for them, are added as its sentences finish, by one
teacher-forced pass over the finished hypotheses (`annotate`, which batch-by-batch decoding uses too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from relmt.config import DecodeConfig
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode import continuous
from relmt.decode.beam import Hypothesis
from relmt.decode.search import capped_lengths, output_weight


def annotate(translator, cfg: DecodeConfig, done: Sequence[tuple[object, int, list[Hypothesis]]]) -> list[list]:
    """The hypotheses of each finished (job, sentence index, hypotheses) as Translations, with the token scores and
    word alignments its job asks for (Job.asks): Translator.annotated, once for each kind of ask among them."""
    out: list[list] = [[] for _ in done]
    groups: dict[tuple[bool, bool], list[int]] = {}
    for n, (job, _, _) in enumerate(done):
        groups.setdefault((job.asks.token_scores, job.asks.alignments), []).append(n)
    for (token_scores, alignments), ns in groups.items():
        pairs = [(done[n][0].ids[done[n][1]], h) for n in ns for h in done[n][2]]
        made = iter(translator.annotated(pairs, token_scores, alignments, cfg, name="request"))
        for n in ns:
            out[n] = [next(made) for _ in done[n][2]]
    return out


class Stream:
    """`on_step(sentences, seconds)` is told each step's sentence count and time."""

    def __init__(self, translator, on_step: Callable[[int, float], None]) -> None:
        self.translator, self.on_step = translator, on_step
        self.weight = output_weight(translator.model, translator.device)
        self.run: continuous.Running | None = None
        self.key: tuple = ()  # the decoding settings of the running jobs (Job.key), and the settings themselves
        self.cfg = None
        self.jobs: dict[int, object] = {}  # id -> Job of the jobs with sentences in the running search
        self.cost: dict[tuple[int, int], int] = {}  # (job id, sentence) in the search -> its source tokens and EOS
        self.tokens = 0  # their sum, for the scheduler's budget

    @property
    def idle(self) -> bool:
        return self.run is None

    def admit(self, taken: list) -> None:
        """Join sentences, (job, sentence index) pairs of jobs that share one decoding setting, to the search."""
        cfg, model = taken[0][0].decode, self.translator.model
        ids = [job.ids[i] for job, i in taken]
        lens = capped_lengths(ids, cfg.max_source_len, "request", 1)
        rows, keys = [], []
        for (job, i), x, n in zip(taken, ids, lens):
            if n and job.sentences[i].strip():
                rows.append(list(x[:n]) + [EOS_ID])
                keys.append((id(job), i))
                self.cost[(id(job), i)] = int(n) + 1
                self.jobs[id(job)] = job
            else:
                job.left -= 1  # an empty line: no hypotheses
                if not job.left:
                    self.finish(job)
        if not rows:
            return
        src = np.full((len(rows), max(map(len, rows))), PAD_ID, dtype=np.int64)
        for r, x in enumerate(rows):
            src[r, : len(x)] = x
        with self.autocast():
            new = continuous.start(model, torch.from_numpy(src).to(self.translator.device), keys, cfg, BOS_ID)
        self.run, self.key, self.cfg = continuous.join(self.run, new, PAD_ID), taken[0][0].key, cfg
        self.tokens = sum(self.cost.values())

    def held(self, job) -> int:
        """The source tokens of the job's sentences in the search (its share of max_batch_tokens)."""
        return sum(c for (job_id, _), c in self.cost.items() if job_id == id(job)) if id(job) in self.jobs else 0

    def finish(self, job) -> None:
        self.jobs.pop(id(job), None)
        job.future.set_result(job.results)

    def drop_cancelled(self) -> tuple[int, int]:
        """Take the sentences of jobs whose client left out of the search: how many jobs, and sentences."""
        gone = {job_id for job_id, job in self.jobs.items() if job.cancelled}
        if not gone or self.run is None:
            return 0, 0
        keys = [key for key in self.run.keys if key[0] in gone]
        self.run = continuous.drop(self.run, [key[0] not in gone for key in self.run.keys], PAD_ID)
        for job_id in gone:
            del self.jobs[job_id]
        for key in keys:
            del self.cost[key]
        self.tokens = sum(self.cost.values())
        return len(gone), len(keys)

    def step(self) -> None:
        """One step of every sentence; the finished ones go to their jobs."""
        start, n = time.perf_counter(), len(self.run.keys)
        with self.autocast():
            self.run, finished = continuous.advance(self.translator.model, self.run, self.cfg, BOS_ID, EOS_ID,
                                                    self.weight)
        self.on_step(n, time.perf_counter() - start)
        if not finished:
            return
        done = [(self.jobs[job_id], i, hyps) for (job_id, i), hyps in finished]
        for (job, i, _), translations in zip(done, annotate(self.translator, self.cfg, done)):
            del self.cost[(id(job), i)]
            job.results[i] = translations
            job.left -= 1
            if not job.left:
                self.finish(job)
        self.tokens = sum(self.cost.values())

    def fail(self) -> list:
        """Drop the running search; the jobs in it, for the caller to fail."""
        jobs = list(self.jobs.values())
        self.run, self.jobs, self.tokens, self.cost = None, {}, 0, {}
        return jobs

    def autocast(self):
        dtype = self.translator.autocast_dtype
        return torch.autocast(self.translator.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
