"""Scoring given references (forced decoding): the model's log-probability of each reference, as
fairseq-generate --score-reference and sockeye-score give it.

    log P(y | x) = sum_{t=1}^{|y|+1} log p(y_t | y_<t, x),   y_{|y|+1} = EOS,

natural logarithm, no length penalty, over the reference's sentencepiece tokens and the EOS that
ends it. This is minus the teacher-forced training loss with label smoothing 0 (relmt/train/loss.py),
summed over the sentence, and it is the log P(y) that beam search divides by lp(|y|) when it
scores a hypothesis y. `ReferenceScore.per_token` divides by |y| + 1, sockeye's normalisation
with its length penalty switched off.

Every pair is scored, empty lines too (an empty reference is EOS alone). Sources are cut to
decode.max_source_len tokens, with the warning decoding gives. Pairs are sorted by length and
batched so that batch size x (longest source + longest reference), EOS, BOS and padding included,
stays within decode.max_source_tokens (a longer pair gets a batch of its own). The model is a
`Transformer` or an `Ensemble` (whose distribution is the mean of its models').

The same pass annotates translations (issue 60): with `token_scores`, each token's log-probability
(and EOS's), whose sum is log P(y | x); with `attention_layer`, the cross-attention weights of that
decoder layer, its heads averaged (an ensemble's models averaged too), from which word alignments
are read (relmt.decode.alignment). Annotating a search's output this way serves every engine and
search alike, as OpenNMT-py's report_align does with its own forward pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from relmt.data.batching import token_batches
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.ensemble import Ensemble
from relmt.decode.search import capped_lengths
from relmt.model.transformer import Transformer


@dataclass(frozen=True)
class ReferenceScore:
    logprob: float  # log P(y | x), natural log, summed over the reference's tokens and EOS
    tokens: int  # |y| + 1: the reference's tokens and EOS
    token_logprobs: tuple[float, ...] | None = None  # each of the |y| + 1 terms of logprob, with token_scores
    attention: np.ndarray | None = None  # (|y| + 1, |x| + 1) cross-attention, with attention_layer

    @property
    def per_token(self) -> float:
        return self.logprob / self.tokens


def attention_hooks(model: Transformer | Ensemble, layer: int, stack: ExitStack) -> list[Tensor]:
    """Capture the cross-attention weights of decoder layer `layer` (negative: from the top) of each model, heads
    averaged, into the returned list (one (B, T, S) tensor per model and pass) while `stack` is open."""
    captured: list[Tensor] = []
    for m in (model.models if isinstance(model, Ensemble) else [model]):
        if not -len(m.decoder_layers) <= layer < len(m.decoder_layers):
            raise ValueError(f"alignment layer {layer}: the model has {len(m.decoder_layers)} decoder layers")
        attn = m.decoder_layers[layer].cross_attn

        def hook(module, args, kwargs, output, attn=attn):
            x, k = args[0], args[1]
            captured.append(attn.probabilities(x, k, kwargs.get("mask")).mean(1))
        stack.enter_context(attn.register_forward_hook(hook, with_kwargs=True))
    return captured


@torch.no_grad()
def score_references(model: Transformer | Ensemble, sources: Sequence[np.ndarray | list[int]],
                     references: Sequence[np.ndarray | list[int]], max_source_len: int, max_tokens: int,
                     device: torch.device, autocast_dtype: torch.dtype | None = None, name: str = "input",
                     first_line: int = 1, token_scores: bool = False, attention_layer: int | None = None,
                     ) -> list[ReferenceScore]:
    """log P(reference | source) of each pair, in input order. sources, references: token ids
    without EOS (appended here); the warning about a cut source names line `first_line + i` of `name`.
    token_scores: also each token's log-probability; attention_layer: also that decoder layer's
    cross-attention (see the module's docstring)."""
    if len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources but {len(references)} references")
    src_lens = capped_lengths(sources, max_source_len, name, first_line) + 1  # EOS
    tgt_lens = np.array([len(y) for y in references], dtype=np.int64) + 1  # BOS + y, or y + EOS
    results: list[ReferenceScore] = [ReferenceScore(0.0, 0)] * len(sources)
    was_training = model.training
    model.eval()
    try:
        # longest pair first, B x (longest source + longest reference) <= max_tokens
        for index in token_batches((src_lens, tgt_lens), max_tokens):
            src = np.full((len(index), src_lens[index].max()), PAD_ID, dtype=np.int64)  # (B, S)
            tgt = np.full((len(index), tgt_lens[index].max() + 1), PAD_ID, dtype=np.int64)  # (B, 1 + T)
            for row, i in enumerate(index):
                n, m = src_lens[i] - 1, tgt_lens[i] - 1
                src[row, :n], src[row, n] = sources[i][:n], EOS_ID
                tgt[row, 0], tgt[row, 1:m + 1], tgt[row, m + 1] = BOS_ID, references[i], EOS_ID
            src_t, tgt_t = torch.from_numpy(src).to(device), torch.from_numpy(tgt).to(device)
            # BOS + y and y + EOS, padded; a shorter row's input goes on to its EOS, whose output is
            # PAD: masked below, and under causal attention it changes no earlier position
            tgt_in, tgt_out = tgt_t[:, :-1], tgt_t[:, 1:]
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None), ExitStack() as stack:
                captured = attention_hooks(model, attention_layer, stack) if attention_layer is not None else []
                memory, src_mask = model.encode(src_t)
                logits = model.decode(tgt_in, memory, src_mask)  # (B, T, V)
            lprobs = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt_out[:, :, None])[:, :, 0]
            steps = lprobs.double().masked_fill(tgt_out == PAD_ID, 0.0)  # (B, T)
            weights = torch.stack(captured).mean(0).float().numpy(force=True) if captured else None  # (B, T, S)
            for row, (i, value) in enumerate(zip(index, steps.sum(dim=1).tolist())):
                n, m = int(src_lens[i]), int(tgt_lens[i])
                results[i] = ReferenceScore(value, m, tuple(steps[row, :m].tolist()) if token_scores else None,
                                            weights[row, :m, :n] if weights is not None else None)
    finally:
        model.train(was_training)
    return results
