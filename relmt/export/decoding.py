"""The checkpoint's decoding settings for an exported CTranslate2 model, as keyword arguments of
`ctranslate2.Translator.translate_batch`. Without them CTranslate2 decodes with its own defaults
(beam 2, length_penalty 1, at most 256 tokens), not the model's.

    opts = translate_options("ct2_model", longest_source=max(map(len, batch)))
    translator.translate_batch(batch, **opts)

The export writes the checkpoint's decode config into relmt_export.json; this module reads it and
needs no ctranslate2 itself. What maps:

- beam -> beam_size (1: greedy in both), nbest -> num_hypotheses, lenpen -> length_penalty (which
  scores greedy and sampled outputs too, in both), min_len -> min_decoding_length (EOS is not
  allowed before that many tokens, in both);
- max_source_len -> max_input_length: relmt cuts a source to max_source_len pieces and appends EOS,
  while CTranslate2 counts the EOS it appends, hence one more (0 = no cap in both);
- relmt's step limit floor(max_len_a * |x| + max_len_b), |x| the source's pieces and its EOS, is
  per sentence, CTranslate2's max_decoding_length one number per call: the longest source's limit,
  which is each sentence's own when sentences are translated one per call;
- sampling: beam_size 1 and num_hypotheses nbest, with topk -> sampling_topk (0 = all in both),
  topp -> sampling_topp and temperature -> sampling_temperature.

What cannot be matched: CTranslate2 divides a score by |y|^alpha, as relmt does with
decode.length_norm=power (with the default gnmt, relmt divides by ((5 + |y|) / 6)^alpha: the same
when lenpen is 0, and the same order among equally long hypotheses); only an EOS among the first K
candidates finishes a hypothesis (relmt's eos_candidates=fairseq; t2t is relmt's default); a
sentence stops once K hypotheses have finished (relmt's early_stop=true); and with sampling relmt
keeps the nbest of `beam` draws seeded per line, where CTranslate2 returns nbest draws from its own
generator. Greedy decoding (beam 1) matches
relmt's token for token (tests/test_export.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from relmt.config import DecodeConfig, from_dict
from relmt.errors import UserError

INFO_FILE = "relmt_export.json"


def exported_decode_config(model_dir: str | Path) -> DecodeConfig:
    """The decode config of the checkpoint a model directory was exported from."""
    path = Path(model_dir) / INFO_FILE
    if not path.is_file():
        raise UserError(f"{path}: not there; is {model_dir} a directory written by relmt-export?")
    decode = json.loads(path.read_text()).get("decode")
    if not isinstance(decode, dict):
        raise UserError(f"{path}: records no decode settings (export it again with relmt-export)")
    return from_dict({"decode": decode}).decode


def translate_options(model_dir: str | Path, longest_source: int) -> dict:
    """translate_batch keyword arguments that decode as the exported checkpoint's decode config
    does (see above), for a call whose longest source has `longest_source` sentencepiece pieces
    (EOS not counted)."""
    return decode_options(exported_decode_config(model_dir), longest_source)


def decode_options(cfg: DecodeConfig, longest_source: int) -> dict:
    """translate_batch keyword arguments for relmt's decode config `cfg` (see above)."""
    cap = cfg.max_source_len
    source = (min(longest_source, cap) if cap else longest_source) + 1  # |x|: the pieces and EOS
    options = {"max_input_length": cap + 1 if cap else 0, "min_decoding_length": cfg.min_len,
               "max_decoding_length": max(1, math.floor(cfg.max_len_a * source + cfg.max_len_b)),
               "num_hypotheses": cfg.nbest, "length_penalty": cfg.lenpen}
    if cfg.sampling:
        return {**options, "beam_size": 1, "sampling_topk": cfg.topk, "sampling_topp": cfg.topp,
                "sampling_temperature": cfg.temperature}
    return {**options, "beam_size": cfg.beam}
