"""Token-budget batches with length bucketing, deterministic per (seed, epoch), shardable, resumable.

A batch's cost is its padded size, B x (max source length + max target length + 1), the +1
being the BOS/EOS framing of the target; no batch costs more than `max_tokens` (Shaw et al. §4.1:
about 4096 tokens per GPU). Examples are sorted by length (ties broken by a seeded shuffle) and
packed greedily, which keeps padding low; then the batch order is shuffled. All ranks of a DDP run
compute the same batch list and take disjoint, equally many batches of it. A position in training
is (epoch, batch index), so a run can resume mid-epoch at exactly the batch it stopped before.

`token_batches` is the one token-budget batcher: validation, relmt-translate (source tokens only)
and reference scoring (relmt/decode) cut their batches with it too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:  # only named in annotations: decoding never imports datasets (its startup costs seconds)
    from relmt.data.dataset import SplitIds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Batch:
    """Padded tensors of one batch: src (B, S) ending in EOS, tgt_in = BOS + y and tgt_out = y + EOS
    (B, T), and the examples' indices in their split (B,)."""

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    ids: Tensor

    @cached_property
    def n_src_tokens(self) -> int:
        return int((self.src != PAD_ID).sum())

    @cached_property
    def n_tgt_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device) -> Batch:
        """The batch on `device`, its token counts taken on the host first (read from a GPU, each would stall it)."""
        nb = device.type == "cuda"
        tensors = (self.src, self.tgt_in, self.tgt_out, self.ids)
        moved = Batch(*(t.to(device, non_blocking=nb) for t in tensors))
        moved.__dict__.update(n_src_tokens=self.n_src_tokens, n_tgt_tokens=self.n_tgt_tokens)
        return moved


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (0 or 1: n itself)."""
    return -(-n // multiple) * multiple if multiple > 1 else n


def collate(data: SplitIds, index: np.ndarray, multiple: int = 0) -> Batch:
    """The examples `index` of a split as one right-padded batch; with `multiple` > 1 the source and
    target lengths are padded further, up to multiples of it (train.pad_to_multiple)."""
    src_lens, tgt_lens = data.src_lens[index], data.tgt_lens[index]
    b = len(index)
    src = np.full((b, round_up(int(src_lens.max()), multiple)), PAD_ID, dtype=np.int64)
    tgt_in = np.full((b, round_up(int(tgt_lens.max()) + 1, multiple)), PAD_ID, dtype=np.int64)
    tgt_out = np.full_like(tgt_in, PAD_ID)
    for row, i in enumerate(index):
        s0, t0 = data.src_offsets[i], data.tgt_offsets[i]
        src[row, : src_lens[row]] = data.src[s0 : s0 + src_lens[row]]
        y = data.tgt[t0 : t0 + tgt_lens[row]]
        tgt_in[row, 0] = BOS_ID
        tgt_in[row, 1 : tgt_lens[row] + 1] = y
        tgt_out[row, : tgt_lens[row]] = y
        tgt_out[row, tgt_lens[row]] = EOS_ID
    return Batch(torch.from_numpy(src), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 torch.from_numpy(np.asarray(index, dtype=np.int64)))


def token_batches(widths: Sequence[np.ndarray], max_tokens: int, max_sentences: int = 0,
                  order: np.ndarray | None = None) -> list[np.ndarray]:
    """Cut items into consecutive batches within a token budget, padding included: the one batcher
    of training, validation, decoding and reference scoring.

    widths: one (N,) array per padded tensor of a batch, in tokens: a batch of B items costs
    B x (the sum over `widths` of the batch's widest item). Training counts (source, target + 1),
    the +1 being the BOS/EOS framing of the target; decoding counts (source + EOS,) alone.
    `order` is the order items are cut in (default: widest first by summed width, ties in index
    order). A batch is closed before the item that would take it past max_tokens, or past
    max_sentences items (0 = no cap). An item over max_tokens on its own gets a batch of its own.
    Every index of `order` is in exactly one batch, and the batches keep its order."""
    if order is None:
        order = np.argsort(-np.sum(widths, axis=0), kind="stable")
    rows = zip(*(np.asarray(w)[order].tolist() for w in widths))  # Python ints: a fast loop
    batches, start, widest = [], 0, (0,) * len(widths)
    cap = max_sentences or len(order)
    for pos, row in enumerate(rows):
        grown = tuple(map(max, widest, row))
        if pos > start and ((pos - start + 1) * sum(grown) > max_tokens or pos - start >= cap):
            batches.append(order[start:pos])
            start, grown = pos, row
        widest = grown
    if len(order) > start:
        batches.append(order[start:])
    return batches


class BatchSampler:
    """Which examples form each batch, for every epoch, on one rank of `world_size`."""

    def __init__(self, data: SplitIds, max_tokens: int, seed: int = 1, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, max_sentences: int = 0, batch_by: str = "source") -> None:
        self.src_lens, self.tgt_lens = data.src_lens, data.tgt_lens
        # batch_by=longest sorts by max(source, target + 1) first: a batch's cost is its widest source plus its
        # widest target, and pairs of equal source length but different target lengths padded each other
        self.sort_keys = ((self.tgt_lens, self.src_lens) if batch_by == "source" else
                          (self.src_lens, np.maximum(self.src_lens, self.tgt_lens + 1)))
        self.max_tokens, self.seed, self.shuffle = max_tokens, seed, shuffle
        self.rank, self.world_size, self.max_sentences = rank, world_size, max_sentences
        self.widths = (self.src_lens, self.tgt_lens + 1)  # the target framed by BOS / EOS
        cost = self.src_lens + self.tgt_lens + 1
        self.fits = np.flatnonzero(cost <= max_tokens)
        if len(self.fits) < len(cost):
            log.warning("%d of %d pairs exceed max_tokens=%d on their own and are left out of batching",
                        len(cost) - len(self.fits), len(cost), max_tokens)

    def epoch(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch`, in order; a pure function of (seed, epoch, rank)."""
        rng = np.random.default_rng([self.seed, epoch])
        idx = rng.permutation(self.fits) if self.shuffle else self.fits
        # sort by length; the shuffle above breaks ties differently each epoch (lexsort is stable)
        order = idx[np.lexsort(tuple(key[idx] for key in self.sort_keys))]
        batches = token_batches(self.widths, self.max_tokens, self.max_sentences, order)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        per_rank = len(batches) // self.world_size
        if self.world_size > 1 and epoch == 0 and self.rank == 0 and len(batches) % self.world_size:
            log.info("DDP: %d of %d batches per epoch are left out so that every rank gets %d "
                     "(different ones each epoch)", len(batches) % self.world_size, len(batches), per_rank)
        return batches[self.rank : per_rank * self.world_size : self.world_size]

    def padding_fraction(self, epoch: int = 0) -> float:
        """Share of the padded batch tensors (source + target) that is padding."""
        slots = real = 0
        for b in self.epoch(epoch):
            slots += len(b) * (self.src_lens[b].max() + self.tgt_lens[b].max() + 1)
            real += int(self.src_lens[b].sum() + self.tgt_lens[b].sum()) + len(b)
        return 1.0 - real / max(slots, 1)


def iterate(data: SplitIds, sampler: BatchSampler, epoch: int, start: int = 0) -> Iterator[Batch]:
    """The batches of `epoch` from batch index `start` on (resume mid-epoch at `start`)."""
    for index in sampler.epoch(epoch)[start:]:
        yield collate(data, index)
