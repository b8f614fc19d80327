"""Validation during training, and the scoring of the test splits at its end: the loss of a
prepared split and the quality of its translations (metrics from relmt.evaluate.metrics).

Evaluation splits are never filtered (README), so they are batched here without the training
sampler's fit filter: every pair counts, and one longer than `max_tokens` gets a batch of its own.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from relmt.config import DecodeConfig
from relmt.data.batching import collate, token_batches
from relmt.data.dataset import Corpus, SplitIds
from relmt.decode.search import decode_sources
from relmt.evaluate.metrics import chrf_score, lowercased_bleu, sacrebleu_score, tokenized_bleu
from relmt.model.transformer import Transformer
from relmt.train.loss import label_smoothed_nll


def eval_batches(data: SplitIds, max_tokens: int) -> list[np.ndarray]:
    """Every example of a split, sorted by length and packed within `max_tokens` (padded cost as in
    training). Unlike the training sampler nothing is dropped: `token_batches` puts an example
    whose cost alone exceeds `max_tokens` into a batch of its own."""
    src_lens, tgt_lens = data.src_lens, data.tgt_lens
    order = np.lexsort((tgt_lens, src_lens))  # by source length, then target length
    return token_batches((src_lens, tgt_lens + 1), max_tokens, order=order)


@torch.no_grad()
def split_loss(model: Transformer, corpus: Corpus, split: str, max_tokens: int, label_smoothing: float,
               device: torch.device, autocast_dtype: torch.dtype | None = None) -> dict:
    """Teacher-forced loss per target token (smoothed and plain NLL) and perplexity exp(NLL), over
    every pair of the split."""
    was_training = model.training
    model.eval()
    data = corpus.ids(split)
    sums, tokens = torch.zeros(2, dtype=torch.float64, device=device), 0  # (loss, nll), read once at the end
    for index in eval_batches(data, max_tokens):
        batch = collate(data, index).to(device)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            logits = model(batch.src, batch.tgt_in)
        batch_loss, batch_nll = label_smoothed_nll(logits, batch.tgt_out, label_smoothing)
        sums += torch.stack((batch_loss.detach(), batch_nll.detach())).double()
        tokens += batch.n_tgt_tokens
    model.train(was_training)
    loss, nll = sums.tolist()
    tokens = max(tokens, 1)
    return {"loss": loss / tokens, "nll": nll / tokens, "ppl": math.exp(min(nll / tokens, 50.0))}


def target_lang(corpus: Corpus) -> str:
    """The target language for Moses tokenization: data.tgt of the prepared corpus. One Moses does not
    know (the toy corpus's "tgt") is tokenized by the English rules, as Moses' tokenizer.perl falls
    back to them (`moses_lang`), and labelled as such, not as English (`moses_label`)."""
    return str(corpus.meta.get("config", {}).get("tgt", ""))


def split_sources(data: SplitIds) -> list[np.ndarray]:
    """Each source sentence of a split as token ids without its EOS, the input `decode_sources`
    takes from relmt-translate's tokenizer as well (views into the cache, not copies)."""
    return [data.src[start:end - 1] for start, end in zip(data.src_offsets[:-1], data.src_offsets[1:])]


def source_name(corpus: Corpus, split: str) -> str:
    """How a warning names the split's source side: {split}.{src}, a text corpus's file name."""
    return f"{split}.{corpus.meta.get('config', {}).get('src', 'src')}"


def translate_split(model: Transformer, corpus: Corpus, split: str, cfg: DecodeConfig, device: torch.device,
                    autocast_dtype: torch.dtype | None = None, out_file: Path | None = None,
                    tokenized: bool = True) -> tuple[dict, list[str]]:
    """Decode a split, detokenize, and score it against the raw references. Returns the scores and
    the translations, which also go to `out_file` (one per line) if given.

    Scores, flat so that every number can be logged: sacreBLEU ("bleu", "signature"), chrF ("chrf",
    "chrf_signature") and, with `tokenized`, the paper-comparable tokenized BLEU ("tokenized_bleu",
    "tokenized_signature", "tokenized_label"; tensor2tensor's get_ende_bleu.sh convention) and the lowercased tokenized
    BLEU of the Multi30k literature ("lowercased_bleu", "lowercased_label"). Decoding dominates the
    cost; the Moses tokenization of the tokenized BLEU adds a few percent, so it is on by default,
    also for validation: Tables 2 and 3 of the paper report validation (newstest2013) BLEU.
    """
    # The decoding of relmt-translate: same sources and settings, same translations (issue 13).
    best = decode_sources(model, split_sources(corpus.ids(split)), cfg, device, autocast_dtype,
                          name=source_name(corpus, split))
    hyps = corpus.tokenizer.decode([h[0].tokens if h else [] for h in best])
    if out_file is not None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    refs = corpus.texts(split, "tgt")
    bleu = sacrebleu_score(hyps, refs)
    scores = {"bleu": bleu["score"], "signature": bleu["signature"], "sentences": len(hyps)}
    chrf = chrf_score(hyps, refs)
    scores.update(chrf=chrf["score"], chrf_signature=chrf["signature"])
    if tokenized:
        tok = tokenized_bleu(hyps, refs, target_lang(corpus))
        scores.update(tokenized_bleu=tok["score"], tokenized_signature=tok["signature"],
                      tokenized_label=tok["label"])
        lc = lowercased_bleu(hyps, refs, target_lang(corpus))
        scores.update(lowercased_bleu=lc["score"], lowercased_label=lc["label"])
    return scores, hyps
