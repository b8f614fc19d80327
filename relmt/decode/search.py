"""The one decoding front-end: validation BLEU (relmt.train.validate) and relmt-translate
(relmt.decode.translator) both call `decode_sources`, so the same sources and `DecodeConfig` give
the same hypotheses, with the same scores, in either.

It caps long sources, cuts length-sorted batches by source tokens, pads them, runs the search under
the caller's autocast and returns each source's hypotheses in input order. The search is
`beam_search` (a beam of 1 is greedy decoding, token for token: relmt/decode/greedy.py is the
oracle that tests/test_beam.py holds it to), or with decode.sampling, `relmt.decode.sampling.sample`.
The model is a `Transformer` or an `Ensemble` of them (relmt/decode/ensemble.py): one path for both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from relmt.config import DecodeConfig, EosCandidates
from relmt.data.batching import token_batches
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.beam import Hypothesis, beam_search
from relmt.decode.ensemble import Ensemble
from relmt.decode.sampling import sample
from relmt.errors import UserError
from relmt.model.transformer import Transformer

log = logging.getLogger(__name__)


def output_weight(model: Transformer | Ensemble, device: torch.device) -> Tensor | tuple | None:
    """The tied output weight (V, d_model) zero-padded to a multiple of 16 rows, for decoding on a
    CPU; None where it is not needed (another device, or V already a multiple of 16). For an
    ensemble, a tuple of one such weight (or None) per model.

    An odd row count (a vocabulary of 3,859, say) makes the CPU GEMM of the output projection much
    slower (misaligned rows; docs/results/performance/perf_log.md). Decoding pads once per call, while the
    weights are fixed, and `Transformer.decode_step` cuts the padded rows' scores off again."""
    if isinstance(model, Ensemble):
        return tuple(output_weight(m, device) for m in model.models)
    if not isinstance(model, Transformer):  # another engine (relmt.export.onnx) holds its own weights
        return None
    w = model.tgt_embed.weight
    extra = -w.shape[0] % 16
    if device.type != "cpu" or not extra:
        return None
    return F.pad(w.detach(), (0, 0, 0, extra))


def nbest_search(model: Transformer | Ensemble, src: Tensor, cfg: DecodeConfig,
                 out_weight: Tensor | tuple | None = None, lines: Tensor | None = None,
                 prefixes: Sequence[Sequence[int]] | None = None,
                 constraints: Sequence[Sequence[Sequence[int]]] | None = None, ordered: bool = False,
                 stop: Callable[[], bool] | None = None) -> list[list[Hypothesis]]:
    """The cfg.nbest best hypotheses (ids and score) of each row of src (B, S), best first.

    Beam 1 is greedy decoding: a beam of one that only lets an EOS ranked first finish (fairseq's
    rule) and stops at its first finished hypothesis. Under t2t's rule an EOS ranked second would
    also finish, and the result would no longer be the argmax path (relmt/decode/beam.py).
    With cfg.sampling, the nbest best of cfg.beam samples per row; lines (B,) are the rows' input
    line numbers that seed their draws (default 1..B). prefixes, constraints, ordered: what each row's output must
    begin with and contain (relmt/decode/constraints.py; beam search only)."""
    if cfg.sampling:
        if lines is None:
            lines = torch.arange(1, src.shape[0] + 1)
        return sample(model, src, lines, cfg.beam, BOS_ID, EOS_ID, cfg.seed, cfg.temperature, cfg.topk, cfg.topp,
                      cfg.lenpen, cfg.max_len_a, cfg.max_len_b, cfg.min_len, cfg.nbest, out_weight, cfg.length_norm)
    greedy = cfg.beam == 1
    return beam_search(model, src, cfg.beam, BOS_ID, EOS_ID, cfg.lenpen, cfg.max_len_a, cfg.max_len_b,
                       nbest=cfg.nbest, early_stop=cfg.early_stop or greedy, min_len=cfg.min_len,
                       eos_candidates=EosCandidates.fairseq if greedy else cfg.eos_candidates,
                       out_weight=out_weight, length_norm=cfg.length_norm, prefixes=prefixes,
                       constraints=constraints, ordered=ordered, stop=stop)


def cut_source(tokens: int, cap: int) -> str | None:
    """The warning for a source of `tokens` tokens under max_source_len=`cap` (0 = no cap), None if it fits:
    `capped_lengths` logs it, naming the line; relmt-serve returns it in the answer, naming the sentence."""
    if not cap or tokens <= cap:
        return None
    return f"the source has {tokens} tokens, more than max_source_len={cap}; decoding only its first {cap}"


def capped_lengths(sources: Sequence[np.ndarray | list[int]], cap: int, name: str, first_line: int) -> np.ndarray:
    """The token count of each source, cut to `cap` (0 = no cap) with a warning naming each source
    cut as line `first_line + i` of `name`."""
    lens = np.array([len(x) for x in sources], dtype=np.int64)
    if cap:
        for i in np.flatnonzero(lens > cap):
            log.warning("%s:%d: %s", name, first_line + i, cut_source(int(lens[i]), cap))
        lens = np.minimum(lens, cap)
    return lens


@torch.no_grad()
def decode_sources(model: Transformer | Ensemble, sources: Sequence[np.ndarray | list[int]], cfg: DecodeConfig,
                   device: torch.device, autocast_dtype: torch.dtype | None = None, name: str = "input",
                   first_line: int = 1, progress: bool = False, prefixes: Sequence[Sequence[int]] | None = None,
                   constraints: Sequence[Sequence[Sequence[int]]] | None = None, ordered: bool = False,
                   stop: Callable[[], bool] | None = None) -> list[list[Hypothesis]]:
    """The cfg.nbest hypotheses of each source, in input order; [] for an empty source (and for the sources left
    when `stop()` says True, asked before each batch and each beam-search step).

    sources: token ids without EOS (appended here). A source longer than cfg.max_source_len tokens
    is cut to its first max_source_len, with a warning naming it as line `first_line + i` of
    `name`. Batches hold at most cfg.max_source_tokens source tokens (EOS and padding included) and
    at most cfg.max_sentences sentences (0 = no cap), and run under autocast to `autocast_dtype`
    (None: the model's own precision). With cfg.sampling, line first_line + i seeds the samples of
    source i, whatever batch it lands in. prefixes[i] and constraints[i]: ids source i's output must begin with and
    contain (in order if `ordered`; relmt/decode/constraints.py), beam search only."""
    if cfg.sampling and (any(prefixes or ()) or any(constraints or ())):
        raise UserError("a target prefix and constraints need beam search: decode.sampling=true cannot force them")
    lens = capped_lengths(sources, cfg.max_source_len, name, first_line)
    todo = np.flatnonzero(lens)  # an empty source gives no hypotheses (an empty line, an empty output)
    results: list[list[Hypothesis]] = [[] for _ in sources]
    if not len(todo):
        return results
    was_training = model.training
    model.eval()
    weight = output_weight(model, device)
    try:
        # longest first, B x (longest source + EOS) <= max_source_tokens; a longer source alone
        batches = token_batches((lens[todo] + 1,), cfg.max_source_tokens, cfg.max_sentences)
        for batch in tqdm(batches, desc="translate", unit="batch", disable=not progress):
            if stop is not None and stop():
                break
            index = todo[batch]
            src = np.full((len(index), lens[index].max() + 1), PAD_ID, dtype=np.int64)  # (B, S): ids, EOS, PAD
            for row, i in enumerate(index):
                src[row, : lens[i]] = sources[i][: lens[i]]
                src[row, lens[i]] = EOS_ID
            with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                                enabled=autocast_dtype is not None):
                hyps = nbest_search(model, torch.from_numpy(src).to(device), cfg, weight,
                                    torch.from_numpy(index + first_line),
                                    [prefixes[i] for i in index] if prefixes is not None else None,
                                    [constraints[i] for i in index] if constraints is not None else None, ordered,
                                    stop)
            for i, h in zip(index, hyps):
                results[i] = h
    finally:
        model.train(was_training)
    return results
