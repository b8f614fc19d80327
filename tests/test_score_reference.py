"""Scoring given references (relmt/decode/reference.py, relmt-translate reference=FILE): the
forced-decoding log-probability equals minus the teacher-forced loss with label smoothing 0, equals
the beam search's log P of the same output, and the files must align line for line."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relmt.cli.common import guarded
from relmt.cli.translate import _translate
from relmt.config import DecodeConfig
from relmt.data.batching import token_batches
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from relmt.decode.reference import score_references
from relmt.decode.search import decode_sources
from relmt.decode.translator import Translator
from relmt.errors import UserError
from relmt.train.loss import label_smoothed_nll
from tests.tiny_checkpoints import SENTENCES, toy_tokenizer, write_checkpoint

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("cpu_for_auto")  # CPU float32 pins: see conftest.py
RELMT_TRANSLATE = str(Path(sys.executable).parent / "relmt-translate")
REFERENCES = ["der hund sah die katze", "ein kleiner roter vogel sang", "alice sagte dass bob ankam",
              "die alten lehrer nahe dem fluss grüßten meine katzen", "bob lief"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("score_reference")
    return write_checkpoint(tmp, "a.pt", toy_tokenizer(tmp), seed=1)


def teacher_forced_nll(model, source: list[int], reference: list[int]) -> float:
    """The training loss of one pair with label smoothing 0, summed over its tokens (relmt/train/loss.py)."""
    src = torch.tensor([[*source, EOS_ID]])
    tgt_in, tgt_out = torch.tensor([[BOS_ID, *reference]]), torch.tensor([[*reference, EOS_ID]])
    with torch.no_grad():
        loss, nll = label_smoothed_nll(model(src, tgt_in), tgt_out, 0.0)
    assert loss.item() == pytest.approx(nll.item())
    return nll.item()


def test_scores_are_minus_the_teacher_forced_loss(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    sources, refs = translator.tokenizer.encode(SENTENCES), translator.tokenizer.encode(REFERENCES)
    refs[1] = []  # an empty reference: EOS alone
    scores = score_references(translator.model, sources, refs, 0, 10_000, CPU)
    for x, y, s in zip(sources, refs, scores):
        assert s.tokens == len(y) + 1
        assert s.logprob == pytest.approx(-teacher_forced_nll(translator.model, x, y), rel=1e-5)
        assert s.per_token == pytest.approx(s.logprob / (len(y) + 1))
    # batched otherwise (one pair per batch, and pairs sorted by length): the same scores, in input order
    alone = score_references(translator.model, sources, refs, 0, 1, CPU)
    assert [s.logprob for s in alone] == pytest.approx([s.logprob for s in scores], rel=1e-5)
    # a wrong reference scores lower than the model's own output would not be a test; another pair's is:
    swapped = score_references(translator.model, sources, refs[::-1], 0, 10_000, CPU)
    assert [s.logprob for s in swapped] != pytest.approx([s.logprob for s in scores], rel=1e-3)


def test_batches_hold_at_most_max_tokens():
    src, tgt = torch.tensor([3, 9, 4, 1, 7]).numpy(), torch.tensor([2, 8, 6, 2, 1]).numpy()
    batches = token_batches((src, tgt), 30)  # as score_references cuts them
    assert sorted(i for b in batches for i in b) == [0, 1, 2, 3, 4]
    assert all(len(b) * (src[b].max() + tgt[b].max()) <= 30 or len(b) == 1 for b in batches)
    assert [len(b) for b in token_batches((src, tgt), 1)] == [1] * 5


def test_the_score_of_a_beam_hypothesis_is_its_log_probability(ckpt):
    """With alpha 0 a finished hypothesis scores log P(y | x): forced decoding of y gives it back."""
    translator = Translator.from_checkpoint(ckpt)
    sources = translator.tokenizer.encode(SENTENCES)
    cfg = DecodeConfig(beam=4, nbest=4, lenpen=0.0, max_len_a=0.0, max_len_b=30)
    hyps = decode_sources(translator.model, sources, cfg, CPU)
    checked = 0
    for x, hs in zip(sources, hyps):
        ended = [h for h in hs if len(h.tokens) < 30]  # finished by EOS, not cut at the limit
        forced = score_references(translator.model, [x] * len(ended), [h.tokens for h in ended], 0, 10_000, CPU)
        assert [f.logprob for f in forced] == pytest.approx([h.score for h in ended], abs=1e-4)
        checked += len(ended)
    assert checked >= 5


def test_api_scores_text_and_checks_lengths(ckpt, caplog):
    translator = Translator.from_checkpoint(ckpt)
    scores = translator.score(SENTENCES, REFERENCES)
    ids = translator.tokenizer.encode(REFERENCES)
    assert [s.tokens for s in scores] == [len(y) + 1 for y in ids]
    assert all(s.logprob < 0 for s in scores)
    with pytest.raises(UserError, match="5 sources but 4 references"):
        translator.score(SENTENCES, REFERENCES[:4])
    # a long source is cut to max_source_len, with decoding's warning naming its line
    long = " ".join(SENTENCES)
    translator.decode = DecodeConfig(max_source_len=6)
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        cut = translator.score([SENTENCES[4], long], REFERENCES[:2], name="src.txt")
    assert "src.txt:2: the source has" in caplog.text and "more than max_source_len=6" in caplog.text
    first6 = translator.tokenizer.encode([long])[0][:6]
    expected = score_references(translator.model, [first6], [ids[1]], 0, 10_000, CPU)[0]
    assert cut[1].logprob == pytest.approx(expected.logprob, rel=1e-5)


# --- relmt-translate reference=FILE ----------------------------------------------------------------------

def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_cli_writes_one_score_line_per_input_line(ckpt, tmp_path):
    lines, refs = [*SENTENCES[:2], "", SENTENCES[2]], [*REFERENCES[:2], "", REFERENCES[2]]
    src, ref, out = write(tmp_path / "in.en", lines), write(tmp_path / "ref.de", refs), tmp_path / "scores.txt"
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"reference={ref}",
                                                   f"output={out}", "buffer_lines=3", "beam=2", "nbest=2"]) == 0
    rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
    translator = Translator.from_checkpoint(ckpt)  # the CLI's chunks of buffer_lines=3, so the same float32 sums
    expected = translator.score(lines[:3], refs[:3]) + translator.score(lines[3:], refs[3:])
    assert len(rows) == len(lines) and all(len(r) == 3 for r in rows)
    assert [float(r[0]) for r in rows] == pytest.approx([s.logprob for s in expected], abs=2e-6)
    assert [int(r[1]) for r in rows] == [s.tokens for s in expected] and rows[2][1] == "1"
    assert [float(r[2]) for r in rows] == pytest.approx([s.per_token for s in expected], abs=2e-6)
    # from stdin, too
    done = subprocess.run([RELMT_TRANSLATE, f"checkpoint={ckpt}", f"reference={ref}"], capture_output=True,
                          input="".join(line + "\n" for line in lines).encode(), check=True)
    piped = [line.split("\t") for line in done.stdout.decode().splitlines()]
    assert [int(r[1]) for r in piped] == [int(r[1]) for r in rows]  # other batches: equal up to float32 rounding
    assert [float(r[0]) for r in piped] == pytest.approx([float(r[0]) for r in rows], abs=1e-5)


def test_misaligned_files_are_an_error_naming_both(ckpt, tmp_path, capsys, monkeypatch):
    import io

    src, ref = write(tmp_path / "in.en", SENTENCES[:3]), write(tmp_path / "ref.de", REFERENCES[:2])
    # a file input is counted before the model loads: an unreadable checkpoint is not reached (a missing one
    # is said first, issue 42)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    assert guarded("relmt-translate", _translate, [f"checkpoint={tmp_path}/garbage.pt", f"input={src}",
                                                   f"reference={ref}"]) == 2
    err = capsys.readouterr().err
    assert f"{src} has 3 lines but reference={ref} has 2" in err and "Traceback" not in err
    longer = write(tmp_path / "ref4.de", REFERENCES[:4])
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"reference={longer}"]) == 2
    assert f"{src} has 3 lines but reference={longer} has 4" in capsys.readouterr().err
    # stdin is checked as it is read, in either direction
    for reference in (ref, longer):  # the reference runs out first, or the input does
        stdin = "".join(s + "\n" for s in SENTENCES[:3]).encode()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"reference={reference}",
                                                       "buffer_lines=1"]) == 2
        err = capsys.readouterr().err
        assert f"<stdin> has 3 lines but reference={reference} has {len(read_lines(reference))}" in err
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}",
                                                   f"reference={tmp_path}/none.de"]) == 2
    assert "none.de: no such file" in capsys.readouterr().err


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_ensemble_scores_are_the_mean_probability(ckpt, tmp_path):
    """An ensemble scores a reference by the mean of its models' probabilities, step by step; two
    copies of one model give that model's scores exactly."""
    other = write_checkpoint(tmp_path, "b.pt", toy_tokenizer(tmp_path), seed=2)
    a, b, both = (Translator.from_checkpoint(ckpt), Translator.from_checkpoint(other),
                  Translator.from_checkpoints([ckpt, other]))
    assert Translator.from_checkpoints([ckpt, ckpt]).score(SENTENCES, REFERENCES) == a.score(SENTENCES, REFERENCES)
    x, y = a.tokenizer.encode(SENTENCES[:1])[0], a.tokenizer.encode(REFERENCES[:1])[0]
    src, tgt_in = torch.tensor([[*x, EOS_ID]]), torch.tensor([[BOS_ID, *y]])
    with torch.no_grad():
        probs = [torch.softmax(t.model(src, tgt_in)[0].double(), dim=-1) for t in (a, b)]
    gold = torch.tensor([*y, EOS_ID])
    mean = ((probs[0] + probs[1]) / 2).gather(1, gold[:, None]).log().sum().item()
    assert both.score(SENTENCES[:1], REFERENCES[:1])[0].logprob == pytest.approx(mean, rel=1e-5)
    assert mean != pytest.approx(a.score(SENTENCES[:1], REFERENCES[:1])[0].logprob, rel=1e-3)
    assert PAD_ID not in y
