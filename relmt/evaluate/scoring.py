"""Validation loss and translation quality of a prepared split, as used during and after training."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from relmt.config import DecodeConfig
from relmt.data.batching import BatchSampler, iterate
from relmt.data.dataset import Corpus
from relmt.decode.search import decode_split
from relmt.evaluate.bleu import corpus_bleu
from relmt.model.transformer import Transformer
from relmt.train.loss import label_smoothed_nll


@torch.no_grad()
def split_loss(model: Transformer, corpus: Corpus, split: str, max_tokens: int, label_smoothing: float,
               device: torch.device, autocast_dtype: torch.dtype | None = None) -> dict:
    """Teacher-forced loss per target token (smoothed and plain NLL) and perplexity exp(NLL)."""
    was_training = model.training
    model.eval()
    data = corpus.ids(split)
    loss = nll = tokens = 0.0
    for batch in iterate(data, BatchSampler(data, max_tokens, shuffle=False), epoch=0):
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            logits = model(batch.src, batch.tgt_in)
        batch_loss, batch_nll = label_smoothed_nll(logits, batch.tgt_out, label_smoothing)
        loss, nll, tokens = loss + batch_loss.item(), nll + batch_nll.item(), tokens + batch.n_tgt_tokens
    model.train(was_training)
    tokens = max(tokens, 1)
    return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 50.0))}


def translate_split(model: Transformer, corpus: Corpus, split: str, cfg: DecodeConfig, device: torch.device,
                    autocast_dtype: torch.dtype | None = None, out_file: Path | None = None
                    ) -> tuple[dict, list[str]]:
    """Decode a split, detokenize, and score it with sacreBLEU against the raw references.
    Returns the scores and the translations, which also go to `out_file` (one per line) if given."""
    ids = decode_split(model, corpus.ids(split), cfg, device, autocast_dtype)
    hyps = corpus.tokenizer.decode(ids)
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return {**corpus_bleu(hyps, corpus.texts(split, "tgt")), "sentences": len(hyps)}, hyps
