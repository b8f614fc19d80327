"""A UTF-8 byte-order mark opening a file (issue 57) is removed with a log line by every reader: the
corpus files, relmt-translate's input and relmt-score's files. It used to be kept: U+FEFF became a
vocabulary piece, and the first word of line 1 was split off it."""

from __future__ import annotations

import json
import logging

import pytest

from relmt.cli.common import guarded
from relmt.cli.score import _score
from relmt.cli.translate import _translate
from relmt.data.sources import decode_lines, load_pairs
from tests.test_data import DE, EN, text_cfg, write_text
from tests.tiny_checkpoints import SENTENCES, toy_tokenizer, write_checkpoint

BOM = "\ufeff".encode()


def test_decode_lines_removes_it_at_the_start_only(caplog):
    with caplog.at_level(logging.WARNING):
        assert decode_lines(BOM + b"ein hund\nzwei\n", "x.de") == ["ein hund", "zwei"]
    assert "x.de: removed the UTF-8 byte-order mark" in caplog.text
    # a later chunk of a streamed input starts mid-file: U+FEFF there is a character (a zero-width space)
    assert decode_lines(BOM + b"b\n", "<stdin>", first_line=5) == ["\ufeffb"]


def test_corpus_files(tmp_path, caplog):
    corpus = tmp_path / "corpus"
    for split, (en, de) in {"train": (EN * 3, DE * 3), "valid": (EN[:3], DE[:3]), "test": (EN[3:6], DE[3:6])}.items():
        write_text(corpus, split, en, de)
    (corpus / "train.en").write_bytes(BOM + (corpus / "train.en").read_bytes())
    with caplog.at_level(logging.WARNING):
        pairs = load_pairs(text_cfg(tmp_path))
    assert pairs["train"]["src"][0] == EN[0]
    assert f"{corpus / 'train.en'}: removed the UTF-8 byte-order mark" in caplog.text


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bom")
    return write_checkpoint(tmp, "a.pt", toy_tokenizer(tmp), seed=2)


def test_translate_input(ckpt, tmp_path):
    text = "".join(s + "\n" for s in SENTENCES).encode()
    (tmp_path / "plain.en").write_bytes(text)
    (tmp_path / "bom.en").write_bytes(BOM + text)
    outputs = {}
    for name in ("plain", "bom"):
        argv = [f"checkpoint={ckpt}", f"input={tmp_path / name}.en", f"output={tmp_path / name}.de", "beam=2"]
        assert guarded("relmt-translate", _translate, argv) == 0
        outputs[name] = (tmp_path / f"{name}.de").read_text(encoding="utf-8")
    assert outputs["bom"] == outputs["plain"]


def test_score_files(tmp_path, capsys):
    (tmp_path / "h.de").write_bytes("das Haus am See ist alt\nein Hund läuft über die Wiese\n".encode())
    (tmp_path / "h_bom.de").write_bytes(BOM + (tmp_path / "h.de").read_bytes())
    (tmp_path / "r.de").write_bytes(BOM + "das Haus am See ist alt\nein Hund läuft über die Wiese\n".encode())
    for hyp in ("h", "h_bom"):
        argv = [f"hyp={tmp_path / hyp}.de", f"ref={tmp_path / 'r.de'}", f"out={tmp_path / hyp}.json"]
        assert guarded("relmt-score", _score, argv) == 0
        assert json.loads((tmp_path / f"{hyp}.json").read_text())["sacrebleu"]["score"] == pytest.approx(100.0)
