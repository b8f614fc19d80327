"""relmt.export.decoding.translate_options: the checkpoint's decode config, as relmt-export records it in
relmt_export.json, as CTranslate2 translate_batch options. Needs no ctranslate2 (tests/test_export.py
runs the options through CTranslate2 itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relmt.config import DecodeConfig, to_dict
from relmt.errors import UserError
from relmt.export.decoding import INFO_FILE, translate_options


def exported(directory: Path, decode: dict | None) -> Path:
    """A model directory as far as the options are concerned: its relmt_export.json."""
    directory.mkdir(exist_ok=True)
    info = {"checkpoint": "best.pt", "step": 1} | ({"decode": decode} if decode is not None else {})
    (directory / INFO_FILE).write_text(json.dumps(info))
    return directory


def test_beam_search_options(tmp_path):
    beam4 = DecodeConfig(beam=4, nbest=2, lenpen=0.6, max_len_a=1.0, max_len_b=50, min_len=1, max_source_len=100)
    options = translate_options(exported(tmp_path, to_dict(beam4)), longest_source=20)
    assert options == {"beam_size": 4, "num_hypotheses": 2, "length_penalty": 0.6, "min_decoding_length": 1,
                       "max_decoding_length": 71,  # floor(1.0 * (20 + EOS) + 50), relmt's step limit
                       "max_input_length": 101}  # 100 pieces and CTranslate2's EOS
    # a source over max_source_len is cut first, so its limit is the cut source's
    assert translate_options(tmp_path, longest_source=500)["max_decoding_length"] == 151
    assert translate_options(tmp_path, longest_source=0)["max_decoding_length"] == 51


def test_greedy_and_no_source_cap(tmp_path):
    greedy = DecodeConfig(beam=1, max_len_a=1.2, max_len_b=10, max_source_len=0)
    options = translate_options(exported(tmp_path, to_dict(greedy)), longest_source=2000)
    assert options["beam_size"] == 1 and options["max_input_length"] == 0  # 0: no cap in both
    assert options["max_decoding_length"] == 2411  # floor(1.2 * 2001 + 10): float64, as relmt computes it
    assert options["min_decoding_length"] == 0  # CTranslate2's default is 1; relmt's is 0


def test_sampling_options(tmp_path):
    sampling = DecodeConfig(sampling=True, beam=1, topk=10, topp=0.9, temperature=0.7, seed=3)
    options = translate_options(exported(tmp_path, to_dict(sampling)), longest_source=5)
    assert options["beam_size"] == 1 and options["num_hypotheses"] == 1 and options["length_penalty"] == 0.6
    assert (options["sampling_topk"], options["sampling_topp"], options["sampling_temperature"]) == (10, 0.9, 0.7)
    assert translate_options(exported(tmp_path, to_dict(DecodeConfig(sampling=True))), 5)["sampling_topk"] == 0


def test_old_and_missing_records(tmp_path):
    old = to_dict(DecodeConfig(max_source_tokens=123))
    old["max_tokens"] = old.pop("max_source_tokens")  # decode.max_tokens before issue 13
    assert translate_options(exported(tmp_path / "old", old), 5)["beam_size"] == 4
    with pytest.raises(UserError, match="records no decode settings"):
        translate_options(exported(tmp_path / "none", None), 5)
    with pytest.raises(UserError, match="written by relmt-export"):
        translate_options(tmp_path / "elsewhere", 5)
