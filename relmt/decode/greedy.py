"""Greedy decoding: the simplest correct decoder, kept as the oracle the beam search is tested
against (tests/test_beam.py, tests/test_decode_paths.py). Nothing decodes through it: a beam of 1
in `relmt.decode.search` is the beam search, which must give these tokens.

A hypothesis ends at EOS or after `max_len = floor(a * src_len + b)` decoding steps, whichever
comes first (tensor2tensor decodes up to input length + 50: a = 1, b = 50).
"""

from __future__ import annotations

import torch
from torch import Tensor

from relmt.decode.beam import max_lengths
from relmt.model.transformer import Transformer


def strip(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    """Tokens of one output row up to (not including) EOS, without padding."""
    out = []
    for tok in row:
        if tok == eos_id or tok == pad_id:
            break
        out.append(tok)
    return out


@torch.no_grad()
def greedy_decode(model: Transformer, src: Tensor, bos_id: int, eos_id: int, max_len_a: float = 1.0,
                  max_len_b: int = 50, use_cache: bool = True, min_len: int = 0) -> list[list[int]]:
    """Argmax decoding of a batch. src: (B, S) right-padded ids. Returns each sentence's output
    ids without BOS/EOS. PAD and BOS are never produced, nor EOS before `min_len` tokens.
    `use_cache=False` re-runs the full decoder every step (the slow path cached decoding must equal)."""
    memory, src_mask = model.encode(src)
    limit = max_lengths(src_mask, max_len_a, max_len_b)  # (B,)
    batch = src.shape[0]
    tokens = src.new_full((batch, 1), bos_id)  # (B, 1 + t)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    cache = None
    for t in range(int(limit.max())):
        active = ~finished & (t < limit)
        if not active.any():
            break
        if use_cache:
            logits, cache = model.decode_step(tokens[:, -1], memory, src_mask, cache, step=t)
        else:
            logits = model.decode(tokens, memory, src_mask)[:, -1]
        logits[:, [model.pad_id, bos_id]] = float("-inf")
        if t < min_len:
            logits[:, eos_id] = float("-inf")
        nxt = torch.where(active, logits.argmax(dim=-1), model.pad_id)  # (B,)
        tokens = torch.cat((tokens, nxt[:, None]), dim=1)
        finished |= active & (nxt == eos_id)
    return [strip(row, eos_id, model.pad_id) for row in tokens[:, 1:].tolist()]
