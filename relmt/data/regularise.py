"""Subword regularisation (data.spm_alpha; Kudo 2018, and BPE-dropout, Provilkov et al. 2020): each epoch the
training sentences are cut into pieces anew by sampling from sentencepiece's segmentations, so the model meets
many segmentations of each word. Evaluation, validation and translation never sample.

The cache keeps the deterministic ids (relmt/data/dataset.py); an epoch's sampled ids are made from them on the
fly: each sentence is decoded from its cached pieces and encoded again with sampling (a unigram model samples a
segmentation with smoothing `alpha` among its `nbest` best, -1 all; a BPE model drops each merge with
probability `alpha`). sentencepiece draws from one generator per thread, seeded when the thread first samples,
so each epoch is encoded in a thread of its own, seeded by (seed, epoch): the same epoch gives the same pieces
after a resume. The next epoch is encoded in the background while this one trains (`Resampler`), off the
training step's critical path.
"""

from __future__ import annotations

import hashlib
import logging
import threading

import numpy as np
import sentencepiece as spm

from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import EOS_ID, Tokenizer

log = logging.getLogger(__name__)


def epoch_seed(seed: int, epoch: int) -> int:
    """sentencepiece's generator seed for an epoch: a 32-bit hash of (seed, epoch), never 0."""
    return int.from_bytes(hashlib.sha256(f"relmt-spm:{seed}:{epoch}".encode()).digest()[:4], "little") or 1


def flat(rows: list[list[int]], eos: bool) -> tuple[np.ndarray, np.ndarray]:
    lens = np.array([len(r) + eos for r in rows], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lens)))
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    for row, start in zip(rows, offsets[:-1]):
        ids[start:start + len(row)] = row
        if eos:
            ids[start + len(row)] = EOS_ID
    return ids, offsets


def resample(data: SplitIds, tokenizer: Tokenizer, alpha: float, nbest: int, seed: int, epoch: int) -> SplitIds:
    """`data` (sources ending in EOS, targets without) with every sentence encoded anew by sampling, as epoch
    `epoch` of a run seeded `seed` sees it; encoded in a fresh thread (see the module's docstring)."""
    sp = tokenizer.sp
    out: list[SplitIds] = []

    def side(ids: np.ndarray, offsets: np.ndarray, eos: bool) -> tuple[np.ndarray, np.ndarray]:
        texts = [sp.decode(ids[a:b - eos].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]
        return flat([sp.encode(t, out_type=int, enable_sampling=True, alpha=alpha, nbest_size=nbest) for t in texts],
                    eos)

    def work() -> None:
        spm.set_random_generator_seed(epoch_seed(seed, epoch))  # this thread's generator is made at its first draw
        src, src_offsets = side(data.src, data.src_offsets, True)
        tgt, tgt_offsets = side(data.tgt, data.tgt_offsets, False)
        out.append(SplitIds(src, src_offsets, tgt, tgt_offsets))

    thread = threading.Thread(target=work, name=f"relmt-spm-epoch-{epoch}")
    thread.start()
    thread.join()
    return out[0]


class Resampler:
    """The training split of each epoch, sampled (resample), with the next epoch prepared in the background."""

    def __init__(self, data: SplitIds, tokenizer: Tokenizer, alpha: float, nbest: int, seed: int) -> None:
        self.data, self.tokenizer, self.alpha, self.nbest, self.seed = data, tokenizer, alpha, nbest, seed
        self.ready: dict[int, SplitIds] = {}
        self.worker: threading.Thread | None = None

    def _prepare(self, epoch: int) -> None:
        self.ready[epoch] = resample(self.data, self.tokenizer, self.alpha, self.nbest, self.seed, epoch)

    def epoch(self, epoch: int) -> SplitIds:
        """Epoch `epoch`'s sampled split; starts encoding the next one in the background."""
        if self.worker is not None:
            self.worker.join()
            self.worker = None
        if epoch not in self.ready:
            self._prepare(epoch)
        data = self.ready.pop(epoch)
        self.ready = {}
        self.worker = threading.Thread(target=self._prepare, args=(epoch + 1,), daemon=True)
        self.worker.start()
        n_det, n_new = len(self.data.src) + len(self.data.tgt), len(data.src) + len(data.tgt)
        log.info("epoch %d: subword regularisation (alpha %g, nbest %d) cut the training split into %d pieces "
                 "(%+.1f%% against the deterministic %d)", epoch, self.alpha, self.nbest, n_new,
                 100 * (n_new / max(n_det, 1) - 1), n_det)
        return data
