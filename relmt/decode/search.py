"""Decoding whole splits: length-sorted batches on the source side, results in input order."""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor

from relmt.config import DecodeConfig, EosCandidates
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import Hypothesis, beam_search
from relmt.decode.greedy import greedy_decode
from relmt.model.transformer import Transformer

log = logging.getLogger(__name__)


def source_batches(src_lens: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Indices sorted by source length (longest first), cut so that B x max length <= max_tokens
    (a longer single sentence still gets a batch of its own)."""
    order = np.argsort(-src_lens, kind="stable")
    batches, start = [], 0
    while start < len(order):
        width = max(int(src_lens[order[start]]), 1)
        size = max(1, max_tokens // width)
        batches.append(order[start:start + size])
        start += size
    return batches


def search(model: Transformer, src: Tensor, cfg: DecodeConfig) -> list[list[int]]:
    """Best output ids (no BOS/EOS) for each row of src (B, S), by greedy or beam search."""
    if cfg.beam == 1:
        return greedy_decode(model, src, BOS_ID, EOS_ID, cfg.max_len_a, cfg.max_len_b, min_len=cfg.min_len)
    return [h[0].tokens for h in nbest_search(model, src, cfg)]


def nbest_search(model: Transformer, src: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """The cfg.nbest best hypotheses (ids and score) of each row of src (B, S), best first.

    Beam 1 is greedy decoding, as `search` does it: a beam of one that only lets an EOS ranked first
    finish (fairseq's rule) and stops at its first finished hypothesis. Under t2t's rule an EOS
    ranked second would also finish, and the result would no longer be the argmax path."""
    greedy = cfg.beam == 1
    return beam_search(model, src, cfg.beam, BOS_ID, EOS_ID, cfg.lenpen, cfg.max_len_a, cfg.max_len_b,
                       nbest=cfg.nbest, early_stop=cfg.early_stop or greedy, min_len=cfg.min_len,
                       eos_candidates=EosCandidates.fairseq if greedy else cfg.eos_candidates)


@torch.no_grad()
def decode_split(model: Transformer, data: SplitIds, cfg: DecodeConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None) -> list[list[int]]:
    """Decode every source sentence of a split; output i belongs to example i. A source longer than
    cfg.max_source_len tokens is cut to its first max_source_len, with a warning (as in translation)."""
    was_training = model.training
    model.eval()
    out: list[list[int]] = [[] for _ in range(len(data))]
    lens = data.src_lens  # each source ends in EOS, which the cap does not count
    if cfg.max_source_len and (lens > cfg.max_source_len + 1).any():
        long = np.flatnonzero(lens > cfg.max_source_len + 1)
        log.warning("%d source sentence(s) have more than decode.max_source_len=%d tokens (the first: example %d, "
                    "%d tokens); decoding only their first %d", len(long), cfg.max_source_len, long[0],
                    lens[long[0]] - 1, cfg.max_source_len)
        lens = np.minimum(lens, cfg.max_source_len + 1)
    for index in source_batches(lens, cfg.max_tokens):
        src = np.full((len(index), lens[index].max()), PAD_ID, dtype=np.int64)
        for row, i in enumerate(index):
            start = data.src_offsets[i]
            src[row, : lens[i] - 1] = data.src[start:start + lens[i] - 1]
            src[row, lens[i] - 1] = EOS_ID
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            hyps = search(model, torch.from_numpy(src).to(device), cfg)
        for i, hyp in zip(index, hyps):
            out[i] = hyp
    model.train(was_training)
    return out
