"""Extreme decoding options (issue 57): JSON's 1e999 is Python's inf, and a temperature of 1e-300
overflows logits / temperature. Non-finite and overflowing values are refused with the key named
(422 in relmt-serve, exit 2 in relmt-translate); a tiny temperature is safe arithmetic that tends
to the greedy path, as it should."""

from __future__ import annotations

import json

import pytest
import torch

from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.config import DecodeConfig
from relmt.data.tokenizer import BOS_ID, EOS_ID
from relmt.decode.beam import max_lengths
from relmt.decode.greedy import greedy_decode
from relmt.decode.sampling import sampling_logits
from relmt.decode.search import decode_sources
from relmt.decode.translator import Translator
from relmt.serve.args import ServeArgs
from relmt.serve.requests import ApiError, parse_body
from tests.tiny_checkpoints import DECODE, SENTENCES, toy_tokenizer, write_checkpoint

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("cpu_for_auto")  # CPU float32 pins: see conftest.py
INF = float("inf")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    return write_checkpoint(tmp, "a.pt", toy_tokenizer(tmp), seed=3)


@pytest.mark.parametrize("values,message", [
    (dict(lenpen=INF), r"decode.lenpen: must be in \[0, 10\]"),
    (dict(lenpen=json.loads("1e999")), r"decode.lenpen: must be in \[0, 10\]"),
    (dict(lenpen=float("nan")), r"decode.lenpen: must be in \[0, 10\]"),
    (dict(lenpen=1000.0), r"decode.lenpen: must be in \[0, 10\]"),
    (dict(max_len_a=INF), "decode.max_len_a: must be >= 0 and finite"),
    (dict(sampling=True, temperature=INF), "decode.temperature: must be > 0 and finite"),
])
def test_non_finite_and_overflowing_values_name_the_key(values, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**values)


def test_the_largest_lenpen_stays_finite_on_long_outputs():
    from relmt.decode.beam import length_penalty

    for norm in ("gnmt", "power"):
        lp = length_penalty(torch.tensor([1.0, 1000.0]), DecodeConfig(lenpen=10.0).lenpen, norm)
        assert torch.isfinite(lp.float()).all()


def test_a_huge_max_len_a_does_not_wrap_to_one_step():
    # floor(1e300 * |x|) cast to int64 wrapped to a negative number, clamped to a single step
    assert max_lengths(torch.ones(2, 5, dtype=torch.bool), 1e300, 0).min() > 1000


@pytest.mark.parametrize("options,field", [
    ('{"lenpen": 1e999}', "options.lenpen"),
    ('{"lenpen": -1e999}', "options.lenpen"),
    ('{"sampling": true, "temperature": 1e999}', "options.temperature"),
])
def test_server_refuses_them_with_422_and_the_field(options, field):
    raw = f'{{"text": "a dog", "options": {options}}}'.encode()
    with pytest.raises(ApiError) as e:
        parse_body(raw, ServeArgs(), DECODE)
    assert e.value.status == 422 and e.value.field == field


@pytest.mark.parametrize("override,message", [
    ("lenpen=1e999", "lenpen=inf: must be in [0, 10]"),
    ("lenpen=.inf", "lenpen=inf: must be in [0, 10]"),
])
def test_cli_refuses_them_with_exit_2(ckpt, capsys, override, message):
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tiny_temperatures_give_finite_scores():
    logits = torch.tensor([[3.0, 1.0, -2.0, float("-inf")]])
    x = sampling_logits(logits, 1e-300, 0, 1.0)
    assert not x.isnan().any() and torch.softmax(x, dim=-1).tolist() == [[1.0, 0.0, 0.0, 0.0]]


def test_a_tiny_temperature_samples_the_greedy_path(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    sources = translator.tokenizer.encode(SENTENCES)
    cfg = DecodeConfig(beam=2, nbest=2, max_len_a=0.0, max_len_b=8, sampling=True, temperature=1e-300, seed=5)
    for x, hyps in zip(sources, decode_sources(translator.model, sources, cfg, CPU)):
        (expected,) = greedy_decode(translator.model, torch.tensor([[*x, EOS_ID]]), BOS_ID, EOS_ID, 0.0, 8)
        assert all(h.tokens == expected and torch.isfinite(torch.tensor(h.score)) for h in hyps)


def test_server_takes_a_tiny_temperature():
    req = parse_body(b'{"text": "a dog", "options": {"sampling": true, "temperature": 1e-300}}', ServeArgs(),
                     DECODE)
    assert req.decode.temperature == 1e-300
