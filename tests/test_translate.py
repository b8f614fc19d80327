"""relmt-translate and the Translator API, on a checkpoint trained for a few steps."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relmt.cli import _translate, guarded
from relmt.config import compose
from relmt.decode.translator import Translator
from relmt.train.loop import train

RELMT_TRANSLATE = str(Path(sys.executable).parent / "relmt-translate")
SENTENCES = ["the dog saw the cat", "a small red bird sang", "alice said that bob arrived",
             "the old teachers near the river greeted my cats", "bob ran"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("translate")
    cfg = compose(["model=tiny", "train=debug", "train.max_steps=10", "train.valid_bleu=false",
                   f"data.cache_dir={tmp / 'cache'}", "data.toy.n_train=400", "data.toy.n_valid=10",
                   "data.toy.n_test=10", "data.toy.n_test_long=10"])
    cfg.out_dir = str(tmp / "run")
    train(cfg)
    return tmp / "run" / "checkpoints" / "last.pt"


def test_api_translates_in_input_order(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    batch = translator.translate(SENTENCES, beam=4, max_len_b=8)
    assert len(batch) == len(SENTENCES)
    assert batch == [translator.translate([s], beam=4, max_len_b=8)[0] for s in SENTENCES]


def test_empty_lines_keep_alignment(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    out = translator.translate(["", SENTENCES[0], "   ", SENTENCES[1]], beam=2, max_len_b=8)
    assert out[0] == "" and out[2] == ""
    assert out[1] == translator.translate([SENTENCES[0]], beam=2, max_len_b=8)[0]


def test_beam_one_is_greedy_through_the_api(ckpt):
    import torch

    from relmt.data.tokenizer import BOS_ID, EOS_ID
    from relmt.decode.greedy import greedy_decode

    translator = Translator.from_checkpoint(ckpt)
    ids = [x + [EOS_ID] for x in translator.tokenizer.encode(SENTENCES[:1])]
    greedy = greedy_decode(translator.model, torch.tensor(ids), BOS_ID, EOS_ID, 1.0, 8)
    assert translator.translate(SENTENCES[:1], beam=1, max_len_b=8) == translator.tokenizer.decode(greedy)


def test_nbest_scores_are_sorted(ckpt):
    hyps = Translator.from_checkpoint(ckpt).translate_nbest(SENTENCES[:2], beam=4, nbest=3, max_len_b=8)
    for h in hyps:
        assert len(h) == 3 and [s for _, s in h] == sorted((s for _, s in h), reverse=True)


def test_checkpoint_alone_is_enough(ckpt, tmp_path):
    """The sentencepiece model travels inside the checkpoint: moving the data cache away is fine."""
    expected = Translator.from_checkpoint(ckpt).translate(SENTENCES[:2], beam=2, max_len_b=8)
    cache = ckpt.parents[2] / "cache"
    moved = tmp_path / "moved"
    shutil.move(str(cache), moved)
    try:
        assert Translator.from_checkpoint(ckpt).translate(SENTENCES[:2], beam=2, max_len_b=8) == expected
    finally:
        shutil.move(str(moved), cache)


def test_cli_files_and_nbest(ckpt, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"output={out}",
                                                   "beam=2", "max_len_b=8"]) == 0
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", "beam=3", "nbest=2",
                                                   "max_len_b=8"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows] == ["0", "0", "2", "2"] and all(len(r) == 3 for r in rows)


def test_cli_reads_stdin_and_reports_bad_utf8(ckpt):
    done = subprocess.run([RELMT_TRANSLATE, f"checkpoint={ckpt}", "beam=2", "max_len_b=8"],
                          input=f"{SENTENCES[0]}\n{SENTENCES[1]}\n".encode(), capture_output=True, check=True)
    assert len(done.stdout.decode().splitlines()) == 2
    bad = subprocess.run([RELMT_TRANSLATE, f"checkpoint={ckpt}"], input=b"fine\nbroken \xff line\n",
                         capture_output=True)
    assert bad.returncode == 2
    assert b"<stdin>:2: invalid UTF-8" in bad.stderr and b"Traceback" not in bad.stderr


def test_cli_errors(ckpt, tmp_path, capsys):
    assert guarded("relmt-translate", _translate, [f"checkpoint={tmp_path}/none.pt"]) == 2
    assert "none.pt: no such checkpoint" in capsys.readouterr().err
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "beam=2", "nbest=3"]) == 2
    assert "nbest=3 is more than the beam (2)" in capsys.readouterr().err
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "bogus=1"]) == 2
