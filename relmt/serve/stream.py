"""The decoding thread's running search under continuous batching (relmt/decode/continuous.py).

Jobs with one decoding setting are admitted between two steps: their sentences are encoded, cut to
decode.max_source_len as relmt-translate cuts them (with the same warning), and joined to the search.
Each step hands every sentence that finished, detokenised, to its job; a job is answered when its
last sentence finishes, its sentences in input order (an empty line: no hypotheses, as offline).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode import continuous
from relmt.decode.search import capped_lengths, output_weight


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
        ids = self.translator.tokenizer.encode([s for _, _, s in sentences])
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
        texts = self.translator.tokenizer.decode([h.tokens for _, hyps in finished for h in hyps])
        at = 0
        for (job_id, i), hyps in finished:
            job = self.jobs[job_id]
            job.results[i] = [(text, h.score) for text, h in zip(texts[at:at + len(hyps)], hyps)]
            at += len(hyps)
            job.left -= 1
            if not job.left:
                del self.jobs[job_id]
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
