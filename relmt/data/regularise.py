"""Subword regularisation (data.spm_alpha; Kudo 2018, and BPE-dropout, Provilkov et al. 2020): each epoch the
training sentences are cut into pieces anew by sampling from sentencepiece's segmentations, so the model meets
many segmentations of each word. Evaluation, validation and translation never sample.

The cache keeps the deterministic ids (relmt/data/dataset.py); an epoch's sampled ids are made from them on the
fly: each sentence is decoded from its cached pieces and encoded again with sampling (a unigram model samples a
segmentation with smoothing `alpha` among its `nbest` best, -1 all; a BPE model drops each merge with
probability `alpha`). The next epoch is encoded in the background while this one trains (`Resampler`), off the
training step's critical path.

sentencepiece draws from one generator per thread, seeded when the thread first samples, so each epoch is
encoded in a thread of its own, seeded by (seed, epoch): within one process the same epoch gives the same
pieces. Across processes it does not (sentencepiece 0.2.3 gives other pieces for the same seed in every new
process), so a resume cannot sample an epoch again: each epoch's pieces are stored in the run directory
(`pieces/epoch_N.npz`) when they are made, and a resumed run, or another rank, reads them from there. A run ends
only once the next epoch's pieces, made in the background, are stored (`settle`), so that a resume continues into
that epoch on the pieces the run would have trained on. An epoch's
file goes once a checkpoint of a later epoch is saved (`forget_before`); each file names the sampling and the data
it was made for, and one of another run (other settings, other data) is sampled anew, never read.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

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


def fingerprint(data: SplitIds, alpha: float, nbest: int, seed: int) -> str:
    """What an epoch's stored pieces were sampled from: the deterministic ids and the sampling settings."""
    h = hashlib.sha256(f"{alpha}:{nbest}:{seed}:".encode())
    for a in (data.src_offsets, data.tgt_offsets, data.src[:4096], data.tgt[:4096]):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def save(ids: SplitIds, path: Path, made_from: str) -> None:
    """Writes an epoch's pieces atomically: a run killed while writing leaves the old file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        np.savez(f, src=ids.src, src_offsets=ids.src_offsets, tgt=ids.tgt, tgt_offsets=ids.tgt_offsets,
                 made_from=np.array(made_from))
    os.replace(tmp, path)


def load(path: Path, made_from: str) -> SplitIds | None:
    """The pieces stored at `path`, or None where they were made from other data or settings (another run's)."""
    with np.load(path) as z:
        if "made_from" not in z or str(z["made_from"]) != made_from:
            return None
        return SplitIds(z["src"], z["src_offsets"], z["tgt"], z["tgt_offsets"])


class Resampler:
    """The training split of each epoch, sampled (resample), with the next epoch prepared in the background.

    With `store` (the run's `pieces/` folder) each epoch is written there as it is made and read back when it is
    asked for again (a resume); with `sample=False` (ranks other than 0) it only reads what rank 0 stored.
    `resumed`: the first epoch asked for continues an interrupted run, which sampled it already; if its pieces are
    not stored, the log says that they are sampled anew."""

    def __init__(self, data: SplitIds, tokenizer: Tokenizer, alpha: float, nbest: int, seed: int,
                 store: Path | None = None, sample: bool = True, resumed: bool = False) -> None:
        self.data, self.tokenizer, self.alpha, self.nbest, self.seed = data, tokenizer, alpha, nbest, seed
        self.store, self.sample, self.resumed = store, sample, resumed
        self.made_from = fingerprint(data, alpha, nbest, seed)
        self.ready: dict[int, SplitIds] = {}
        self.worker: threading.Thread | None = None
        self.failed: BaseException | None = None  # the background encoding's error, raised when its epoch is due

    def path(self, epoch: int) -> Path | None:
        return None if self.store is None else self.store / f"epoch_{epoch}.npz"

    def stored(self, epoch: int) -> SplitIds | None:
        """Epoch `epoch`'s pieces as this run stored them, or None."""
        path = self.path(epoch)
        return load(path, self.made_from) if path is not None and path.exists() else None

    def _prepare(self, epoch: int) -> None:
        if (ids := self.stored(epoch)) is not None:
            self.ready[epoch] = ids
            return
        ids = resample(self.data, self.tokenizer, self.alpha, self.nbest, self.seed, epoch)
        if (path := self.path(epoch)) is not None:
            save(ids, path, self.made_from)
        self.ready[epoch] = ids

    def _prepare_next(self, epoch: int) -> None:
        try:
            self._prepare(epoch)
        except BaseException as e:  # noqa: BLE001 (a full disk, say): raised in the training thread
            self.failed = e

    def forget_before(self, epoch: int) -> None:
        """Removes the stored epochs before `epoch`, once a checkpoint of epoch `epoch` is saved: a resume from it
        never goes back to them."""
        for old in self.store.glob("epoch_*.npz") if self.store is not None and self.sample else ():
            if int(old.stem.split("_")[1]) < epoch:
                old.unlink(missing_ok=True)

    def settle(self) -> None:
        """Waits for the next epoch's encoding in the background, and so for its pieces to be stored: a run calls it
        as it ends (finished or stopped by a signal), so that a resume, which continues into that epoch, reads the
        pieces the run would have trained on instead of sampling other ones. The run's work is done by then, so an
        error of that encoding (a full disk, say) is logged, with what it means for a resume, not raised."""
        if self.worker is not None:
            self.worker.join()
            self.worker = None
        if self.failed is not None:
            log.warning("subword regularisation: the next epoch's pieces were not stored (%s): a resume samples "
                        "them anew, so it differs from an uninterrupted run from that epoch on", self.failed)
            self.failed = None

    def epoch(self, epoch: int) -> SplitIds:
        """Epoch `epoch`'s sampled split; starts encoding the next one in the background."""
        if self.worker is not None:
            self.worker.join()
            self.worker = None
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        if not self.sample:  # another rank: rank 0 stored this epoch before the barrier that precedes this call
            if (ids := self.stored(epoch)) is None:
                raise RuntimeError(f"subword regularisation: rank 0 did not store epoch {epoch} at {self.path(epoch)}")
            return ids
        stored = epoch not in self.ready and self.stored(epoch) is not None
        if self.resumed and not stored and epoch not in self.ready:
            log.warning("subword regularisation: the pieces of epoch %d, where this run resumes, are not stored in "
                        "%s: sampled anew, so the rest of the epoch differs from the interrupted run's", epoch,
                        self.store)
        self.resumed = False
        if epoch not in self.ready:
            self._prepare(epoch)
        data = self.ready.pop(epoch)
        self.ready = {}
        self.worker = threading.Thread(target=self._prepare_next, args=(epoch + 1,), daemon=True)
        self.worker.start()
        n_det, n_new = len(self.data.src) + len(self.data.tgt), len(data.src) + len(data.tgt)
        log.info("epoch %d: subword regularisation (alpha %g, nbest %d) cut the training split into %d pieces "
                 "(%+.1f%% against the deterministic %d)%s", epoch, self.alpha, self.nbest, n_new,
                 100 * (n_new / max(n_det, 1) - 1), n_det, f"; read from {self.path(epoch)}" if stored else "")
        return data
