"""Sampled translations (for back-translation: Edunov et al. 2018 sample from the reverse model).

Each sentence draws K samples at once (K = decode.beam, as fairseq's --sampling draws --beam of
them), on the explicit decoder cache: K rows per sentence, batched as the beam search batches its
beams. Step t of a sample draws y_t from

    q(y_t) ∝ softmax(logits / temperature), cut to the `topk` most likely tokens (0 = no cut), then
             to the smallest set of most likely tokens holding `topp` of the remaining probability
             (Holtzman et al. 2020; 1 = no cut),

the order Hugging Face's samplers apply them in. PAD and BOS are never drawn, nor EOS before
`min_len` tokens. A sample ends at EOS or at the step limit floor(a * |x| + b), as a beam
hypothesis does. Its score is the model's own log P(y | x) / lp(|y|), the beam search's score (the
temperature and cuts shape the draws, not the score), and each sentence returns its `nbest`
samples best first.

Reproducible without global RNG state: the uniform number behind draw t of sample k of input line
l is a hash of (seed, l, k, t) (`uniforms`), turned into a token by inverting q's cumulative
distribution. A line's samples therefore do not depend on the batch it was decoded in, on the
other lines, or on how input is chunked (up to the float rounding that batching brings to the logits
themselves); the same seed gives the same samples, another seed others, and a repeated line other
samples at each occurrence.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from relmt.decode.beam import Hypothesis, length_penalty, max_lengths
from relmt.decode.ensemble import Ensemble
from relmt.dropout import MASK32, hash32
from relmt.model.transformer import Transformer


def sample_keys(seed: int, lines: Tensor, samples: int) -> Tensor:
    """(B * K,) int64 keys of the K samples of each input line (B,), grouped by line."""
    base = int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:4], "little")  # any int seed
    line_keys = hash32((lines.long() & MASK32) ^ base)  # (B,)
    k = torch.arange(samples, device=lines.device)
    return hash32(line_keys[:, None] ^ k[None, :]).reshape(-1)


def uniforms(keys: Tensor, step: int) -> Tensor:
    """(N,) float64 numbers in [0, 1), one per key, for decoding step `step`."""
    return hash32(keys ^ hash32(torch.tensor(step + 0x9E3779B9, device=keys.device))).double() / 2.0 ** 32


def sampling_logits(logits: Tensor, temperature: float, topk: int, topp: float) -> Tensor:
    """The scores (N, V) of q, float64: logits / temperature, less the row's maximum (softmax is the same),
    with the tokens cut by topk and topp at -inf.
    Tokens already at -inf (PAD, BOS) stay there and are never drawn."""
    # shifted by the row's maximum, in float64: logits / 1e-300 overflows to inf and inf - inf gives NaN (and
    # 1e-300 is 0 in float32), while (logits - max) / temperature is <= 0, 0 at the most likely token, and
    # tends to greedy's one-hot as the temperature does to 0 (issue 57)
    x = (logits - logits.max(dim=-1, keepdim=True).values).double() / temperature
    if 0 < topk < x.shape[-1]:
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, x.topk(topk, dim=-1).indices, True)
        x = x.masked_fill(~keep, float("-inf"))
    if topp < 1.0:
        probs, order = torch.softmax(x.double(), dim=-1).sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs  # the probability of the more likely tokens
        keep = torch.zeros_like(x, dtype=torch.bool).scatter_(-1, order, before < topp)  # the first always
        x = x.masked_fill(~keep, float("-inf"))
    return x


def draw(scores: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF draw of one token per row from softmax(scores) (N, V), with u (N,) in [0, 1):
    the first token whose cumulative probability exceeds u. A token of probability 0 never is."""
    cdf = torch.softmax(scores.double(), dim=-1).cumsum(dim=-1)  # (N, V)
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0]
    return token.clamp(max=scores.shape[-1] - 1)


@torch.no_grad()
def sample(model: Transformer | Ensemble, src: Tensor, lines: Tensor, samples: int, bos_id: int, eos_id: int,
           seed: int, temperature: float = 1.0, topk: int = 0, topp: float = 1.0, lenpen: float = 0.6,
           max_len_a: float = 1.0, max_len_b: int = 50, min_len: int = 0, nbest: int = 1,
           out_weight: Tensor | tuple | None = None, length_norm: str = "gnmt") -> list[list[Hypothesis]]:
    """The `nbest` best of `samples` samples of each source row of src (B, S), best first. lines:
    (B,) the input line of each row, which with `seed` fixes its draws."""
    pad_id, k = model.pad_id, samples
    memory, src_mask = model.encode(src)
    limit = max_lengths(src_mask, max_len_a, max_len_b).repeat_interleave(k)  # (B*K,) steps allowed
    keys = sample_keys(seed, lines.to(src.device), k)  # (B*K,)
    n = src.shape[0]
    tokens = src.new_full((n * k, 1), bos_id)  # (rows, 1 + t): BOS + the outputs so far
    logp = torch.zeros(n * k, dtype=torch.float64, device=src.device)  # log P(y | x) so far
    length = torch.zeros(n * k, dtype=torch.long, device=src.device)  # tokens drawn, EOS included
    finished = torch.zeros(n * k, dtype=torch.bool, device=src.device)
    sentence = torch.arange(n, device=src.device)  # original index of each remaining sentence
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    cache = None
    for t in range(int(limit.max())):
        logits, cache = model.decode_step(tokens[:, -1], memory, src_mask, cache, step=t, out_weight=out_weight)
        logits = logits.float()
        lprobs = torch.log_softmax(logits, dim=-1)  # (rows, V): the score, as the beam search's
        logits[:, [pad_id, bos_id]] = float("-inf")
        if t < min_len:
            logits[:, eos_id] = float("-inf")
        token = draw(sampling_logits(logits, temperature, topk, topp), uniforms(keys, t))  # (rows,)
        active = ~finished
        token = torch.where(active, token, pad_id)
        lprob = lprobs.gather(1, token[:, None])[:, 0].double()
        logp += torch.where(active, lprob, 0.0)
        length += active.long()
        tokens = torch.cat((tokens, token[:, None]), dim=1)
        finished |= active & ((token == eos_id) | (t + 1 >= limit))

        done = finished.view(-1, k).all(dim=1)  # (m,) sentences whose K samples have all ended
        if done.any():
            scores = (logp / length_penalty(length.double(), lenpen, length_norm)).view(-1, k)
            seqs = tokens[:, 1:].view(-1, k, t + 1)
            for i in done.nonzero()[:, 0].tolist():
                order = scores[i].argsort(descending=True, stable=True)[:nbest].tolist()
                results[int(sentence[i])] = [
                    Hypothesis([x for x in seqs[i, j].tolist() if x not in (eos_id, pad_id)], float(scores[i, j]),
                               eos=eos_id in seqs[i, j].tolist()) for j in order]
            rows = (~done).repeat_interleave(k)
            sentence, memory, src_mask = sentence[~done], memory[~done], src_mask[~done]
            tokens, logp, length, finished = tokens[rows], logp[rows], length[rows], finished[rows]
            limit, keys = limit[rows], keys[rows]
            cache = cache.select(rows.nonzero()[:, 0], (~done).nonzero()[:, 0])
            if not len(sentence):
                break
    return results
