"""Decoding whole splits: length-sorted batches on the source side, results in input order."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from relmt.config import DecodeConfig
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import beam_search
from relmt.decode.greedy import greedy_decode
from relmt.model.transformer import Transformer


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
    hyps = beam_search(model, src, cfg.beam, BOS_ID, EOS_ID, cfg.lenpen, cfg.max_len_a, cfg.max_len_b,
                       early_stop=cfg.early_stop, min_len=cfg.min_len)
    return [h[0].tokens for h in hyps]


@torch.no_grad()
def decode_split(model: Transformer, data: SplitIds, cfg: DecodeConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None) -> list[list[int]]:
    """Decode every source sentence of a split; output i belongs to example i."""
    was_training = model.training
    model.eval()
    out: list[list[int]] = [[] for _ in range(len(data))]
    lens = data.src_lens
    for index in source_batches(lens, cfg.max_tokens):
        src = np.full((len(index), lens[index].max()), PAD_ID, dtype=np.int64)
        for row, i in enumerate(index):
            src[row, : lens[i]] = data.src[data.src_offsets[i]:data.src_offsets[i + 1]]
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            hyps = search(model, torch.from_numpy(src).to(device), cfg)
        for i, hyp in zip(index, hyps):
            out[i] = hyp
    model.train(was_training)
    return out
