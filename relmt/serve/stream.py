"""The decoding thread's running search under continuous batching (relmt/decode/continuous.py).

Jobs with one decoding setting are admitted between two steps: their sentences are encoded, cut to
decode.max_source_len as relmt-translate cuts them (with the same warning), and joined to the search.
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
        self.jobs: dict[int, object] = {}  # id -> Job of the jobs in the running search
        self.tokens = 0  # their source tokens (EOS included), for the scheduler's budget

    @property
    def idle(self) -> bool:
        return self.run is None

    def admit(self, jobs: list) -> None:
        """Join the jobs' sentences to the search (all jobs share one decoding setting)."""
        cfg, model = jobs[0].decode, self.translator.model
        sentences = [(job, i, s) for job in jobs for i, s in enumerate(job.sentences)]
        ids = [x for job in jobs for x in job.ids]
        lens = capped_lengths(ids, cfg.max_source_len, "request", 1)
        rows, keys = [], []
        for job in jobs:
            job.results, job.left = [[] for _ in job.sentences], len(job.sentences)
        for (job, i, s), x, n in zip(sentences, ids, lens):
            if n and s.strip():
                rows.append(list(x[:n]) + [EOS_ID])
                keys.append((id(job), i))
            else:
                job.left -= 1  # an empty line: no hypotheses
        for job in jobs:
            if job.left:
                self.jobs[id(job)] = job
            else:
                job.future.set_result(job.results)
        if not rows:
            return
        src = np.full((len(rows), max(map(len, rows))), PAD_ID, dtype=np.int64)
        for r, x in enumerate(rows):
            src[r, : len(x)] = x
        with self.autocast():
            new = continuous.start(model, torch.from_numpy(src).to(self.translator.device), keys, cfg, BOS_ID)
        self.run, self.key, self.cfg = continuous.join(self.run, new, PAD_ID), jobs[0].key, cfg
        self.tokens = int(self.run.src_mask.sum())

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
            job.results[i] = translations
            job.left -= 1
            if not job.left:
                del self.jobs[id(job)]
                job.future.set_result(job.results)
        self.tokens = 0 if self.run is None else int(self.run.src_mask.sum())

    def fail(self) -> list:
        """Drop the running search; the jobs in it, for the caller to fail."""
        jobs = list(self.jobs.values())
        self.run, self.jobs, self.tokens = None, {}, 0
        return jobs

    def autocast(self):
        dtype = self.translator.autocast_dtype
        return torch.autocast(self.translator.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)
