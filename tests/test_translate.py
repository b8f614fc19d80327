"""relmt-translate and the Translator API, on a checkpoint trained for a few steps."""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from relmt import checkpoint
from relmt.cli.common import guarded
from relmt.cli.train import renamed_overrides
from relmt.cli.translate import _translate
from relmt.config import DecodeConfig, Precision, compose
from relmt.data.dataset import SplitIds
from relmt.data.tokenizer import EOS_ID
from relmt.decode.search import decode_sources, nbest_search, output_weight
from relmt.decode.translator import Translator
from relmt.errors import UserError
from relmt.runtime import autocast_dtype
from relmt.train.loop import train
from relmt.train.validate import split_sources

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


def test_decoding_batches_cap_sentences_and_source_tokens():
    """decode_sources cuts its batches with relmt.data.batching.token_batches, counting source tokens only."""
    from relmt.data.batching import token_batches

    lens = np.array([3, 9, 1, 4, 4, 7, 2])
    batches = token_batches((lens,), 20, max_sentences=2)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lens)))
    assert all(1 <= len(b) <= 2 and len(b) * lens[b].max() <= 20 for b in batches)
    assert [lens[i] for b in batches for i in b] == sorted(lens.tolist(), reverse=True)
    assert [len(b) for b in token_batches((lens,), 20)] == [2, 5]  # no sentence cap: 2 x 9, then 5 x 4


def test_a_sentence_cap_changes_the_batches_not_the_translations(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    assert translator.translate(SENTENCES, beam=4, max_len_b=8, max_sentences=2) == \
        translator.translate(SENTENCES, beam=4, max_len_b=8)


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
    assert translator.translate(SENTENCES[:1], beam=1, max_len_a=1.0, max_len_b=8) == \
        translator.tokenizer.decode(greedy)


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
    assert "nbest=3: must be in [1, beam=2]" in capsys.readouterr().err
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "bogus=1"]) == 2


def test_a_run_directory_stands_for_its_test_checkpoint(ckpt, tmp_path, capsys, caplog):
    """checkpoint= a run directory or its checkpoints/ folder: the run's train.test_checkpoint, named on
    stderr; config.yaml is no checkpoint; a comma list without brackets points to the ensemble syntax."""
    run, src = ckpt.parent.parent, tmp_path / "src.txt"
    src.write_text("the dog\n")
    rule = yaml.safe_load((run / "config.yaml").read_text())["train"]["test_checkpoint"]
    for given in (run, run / "checkpoints"):
        caplog.clear()
        assert guarded("relmt-translate", _translate, [f"checkpoint={given}", f"input={src}"]) == 0
        assert f"{given} is a directory: using {run / 'checkpoints' / f'{rule}.pt'}" in caplog.text
        # the documented form (checkpoint=runs/mine) is said at INFO, not as a warning (issue 57)
        assert [r.levelname for r in caplog.records if "is a directory" in r.getMessage()] == ["INFO"]
    assert guarded("relmt-translate", _translate, [f"checkpoint={run / 'config.yaml'}", f"input={src}"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml: not a relmt checkpoint (not a file torch.save writes)" in err and "weights_only" not in err
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt},{ckpt}", f"input={src}"]) == 2
    assert f"for an ensemble, list the checkpoints in brackets: checkpoint=[{ckpt},{ckpt}]" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert guarded("relmt-translate", _translate, [f"checkpoint={empty}", f"input={src}"]) == 2
    assert "a directory without best.pt or last.pt; pass a checkpoint file" in capsys.readouterr().err


def test_translate_takes_a_single_string(ckpt):
    translator = Translator.from_checkpoint(ckpt)
    one = translator.translate(SENTENCES[0], beam=2, max_len_b=6)
    assert isinstance(one, str) and one == translator.translate(SENTENCES[:1], beam=2, max_len_b=6)[0]
    with pytest.raises(UserError, match="expected a list of sentences \\(str\\), got list of int"):
        translator.translate_nbest([1, 2])


# --- overrides go through DecodeConfig's checks (issue 11) ------------------------------------------------

@pytest.mark.parametrize("override,message", [
    ("beam=0", "beam=0: must be >= 1"),
    ("lenpen=-1", "lenpen=-1.0: must be in [0, 10]"),
    ("max_len_a=-2", "max_len_a=-2.0: must be >= 0"),
    ("max_source_tokens=0", "max_source_tokens=0: must be >= 1"),
    ("max_source_len=-1", "max_source_len=-1: must be >= 0"),
    ("eos_candidates=best", "eos_candidates=best: must be one of t2t, fairseq"),
    ("precision=fp8", "precision=fp8: must be one of auto, fp32, bf16, fp16"),
    ("buffer_lines=0", "buffer_lines=0: must be >= 1"),
])
def test_cli_rejects_bad_overrides_by_key(ckpt, capsys, override, message):
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "nbest" not in err


def test_cli_device_cuda_without_cuda(ckpt, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "device=cuda"]) == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "Traceback" not in err


# --- precision from the checkpoint (issue 7) ------------------------------------------------------------

def with_precision(ckpt: Path, directory: Path, precision: str) -> Path:
    """A copy of the checkpoint that says it was trained at `precision`."""
    ck = checkpoint.load(ckpt)
    ck.pop("checksum", None)
    ck["config"]["train"]["precision"] = precision
    checkpoint.save(ck, directory, [f"{precision}.pt"])
    return directory / f"{precision}.pt"


FP16_OFF_CUDA = "fp16 needs a CUDA device"
AUTOCAST_RULE = {  # (device type, precision) -> autocast dtype (None: fp32), for training and decoding alike
    ("cuda", Precision.auto): torch.bfloat16, ("cpu", Precision.auto): None, ("mps", Precision.auto): None,
    ("cuda", Precision.fp32): None, ("cpu", Precision.fp32): None, ("mps", Precision.fp32): None,  # never bf16
    ("cuda", Precision.bf16): torch.bfloat16, ("cpu", Precision.bf16): torch.bfloat16,
    ("mps", Precision.bf16): torch.bfloat16,
    ("cuda", Precision.fp16): torch.float16, ("cpu", Precision.fp16): FP16_OFF_CUDA,  # CPU fp16 is emulated
    ("mps", Precision.fp16): FP16_OFF_CUDA,
}


@pytest.mark.parametrize("device, precision", list(AUTOCAST_RULE))
def test_autocast_dtype_has_one_rule_for_each_device_and_precision(device, precision):
    want = AUTOCAST_RULE[device, precision]
    if want == FP16_OFF_CUDA:
        with pytest.raises(UserError, match=f"^train.precision={FP16_OFF_CUDA} \\(the device is {device}\\)"):
            autocast_dtype(precision, torch.device(device), "train.precision")
    else:
        assert autocast_dtype(precision, torch.device(device)) == want
    assert len(AUTOCAST_RULE) == 3 * len(Precision)  # every pair is pinned


def test_precision_comes_from_the_checkpoint(ckpt, tmp_path):
    assert Translator.from_checkpoint(ckpt).autocast_dtype is None  # auto, on a CPU: fp32
    bf16 = Translator.from_checkpoint(with_precision(ckpt, tmp_path, "bf16"))
    assert bf16.autocast_dtype == torch.bfloat16
    assert len(bf16.translate(SENTENCES[:2], beam=2, max_len_b=8)) == 2  # bf16 autocast decodes on a CPU too
    assert Translator.from_checkpoint(with_precision(ckpt, tmp_path, "bf16"), precision="fp32").autocast_dtype is None
    assert Translator.from_checkpoint(ckpt, precision="bf16").autocast_dtype == torch.bfloat16
    # fp16 autocast on a CPU is emulated: an fp16 checkpoint decodes there in fp32; asking for it is an error
    assert Translator.from_checkpoint(with_precision(ckpt, tmp_path, "fp16")).autocast_dtype is None
    with pytest.raises(Exception, match="precision=fp16 needs a CUDA device"):
        Translator.from_checkpoint(ckpt, precision="fp16")


def test_cli_precision_override(ckpt, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\n", encoding="utf-8")
    bf16 = with_precision(ckpt, tmp_path, "bf16")
    assert guarded("relmt-translate", _translate, [f"checkpoint={bf16}", f"input={src}", "precision=fp32"]) == 0
    fp32 = capsys.readouterr().out
    assert fp32 == Translator.from_checkpoint(bf16, precision="fp32").translate([SENTENCES[0]])[0] + "\n"


# --- streaming input (issue 12) -------------------------------------------------------------------------

class StdoutRecorder:
    """Stands in for sys.stdout: notes how far stdin had been read at each write."""

    def __init__(self, stdin: io.BytesIO) -> None:
        self.stdin, self.writes = stdin, []

    def write(self, text: str) -> int:
        self.writes.append((self.stdin.tell(), text))
        return len(text)

    def flush(self) -> None:
        pass


def fake_stdin(monkeypatch, data: bytes) -> io.BytesIO:
    raw = io.BytesIO(data)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(raw))
    return raw


def test_cli_writes_each_chunk_before_reading_the_next(ckpt, monkeypatch):
    lines = [s.encode() + b"\n" for s in SENTENCES]
    raw = fake_stdin(monkeypatch, b"".join(lines))
    out = StdoutRecorder(raw)
    monkeypatch.setattr(sys, "stdout", out)
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "buffer_lines=2", "max_len_b=8"]) == 0
    assert [pos for pos, _ in out.writes] == [len(b"".join(lines[:2])), len(b"".join(lines[:4])), len(b"".join(lines))]
    assert [text.count("\n") for _, text in out.writes] == [2, 2, 1]


def test_cli_output_follows_a_pipe(ckpt):
    """Through a real pipe: the first chunk's translations arrive while stdin is still open."""
    proc = subprocess.Popen([RELMT_TRANSLATE, f"checkpoint={ckpt}", "buffer_lines=2", "max_len_b=8"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    guard = threading.Timer(300, proc.kill)  # a hang becomes a failure (empty reads below), not a stuck run
    guard.start()
    try:
        proc.stdin.write(f"{SENTENCES[0]}\n{SENTENCES[1]}\n".encode())
        proc.stdin.flush()
        first = [proc.stdout.readline(), proc.stdout.readline()]
        assert all(line.endswith(b"\n") for line in first), proc.stderr.read().decode()
        proc.stdin.write(f"{SENTENCES[2]}\n".encode())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait() == 0 and rest.count(b"\n") == 1
    finally:
        guard.cancel()
        proc.kill()
    expected = Translator.from_checkpoint(ckpt).translate(SENTENCES[:3], max_len_b=8)
    assert [x.decode().rstrip("\n") for x in [*first, rest]] == expected


def test_cli_keeps_input_order_across_chunks(ckpt, tmp_path, capsys):
    lines = ["", SENTENCES[0], SENTENCES[3], "", "  ", SENTENCES[1], SENTENCES[4], "", SENTENCES[2]]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expected = Translator.from_checkpoint(ckpt).translate(lines, beam=2, max_len_b=8)
    for buffer in (2, 3, 100):
        out = tmp_path / f"out{buffer}.txt"
        assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", f"output={out}",
                                                       "beam=2", "max_len_b=8", f"buffer_lines={buffer}"]) == 0
        assert out.read_text(encoding="utf-8").split("\n") == [*expected, ""], buffer
    # nbest: the index counts input lines from 0 across chunks; empty lines give no rows
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", "beam=2", "nbest=2",
                                                   "max_len_b=8", "buffer_lines=2"]) == 0
    rows = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
    assert rows == [str(i) for i, line in enumerate(lines) if line.strip() for _ in range(2)]


def test_cli_bad_utf8_names_the_input_line_and_keeps_earlier_chunks(ckpt, tmp_path, monkeypatch, capsys):
    fake_stdin(monkeypatch, f"{SENTENCES[0]}\n{SENTENCES[1]}\n\n{SENTENCES[2]}\nbroken \xff\n".encode("latin-1"))
    out = tmp_path / "out.txt"
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"output={out}", "buffer_lines=2",
                                                   "max_len_b=8"]) == 2
    assert "<stdin>:5: invalid UTF-8" in capsys.readouterr().err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4  # the first two chunks were written
    fake_stdin(monkeypatch, f"{SENTENCES[0]}\n\nbad \0 line\n".encode())
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "buffer_lines=2", "max_len_b=8"]) == 2
    assert "<stdin>:3: NUL character" in capsys.readouterr().err


# --- max_source_len (issue 12) ----------------------------------------------------------------------------

def test_long_source_is_truncated_with_a_warning_naming_its_line(ckpt, tmp_path, capsys, caplog):
    translator = Translator.from_checkpoint(ckpt)
    long = " ".join(SENTENCES)
    ids = translator.tokenizer.encode([long])[0]
    assert len(ids) > 6
    cfg = DecodeConfig(beam=2, max_len_b=8, max_source_len=6)
    cut = nbest_search(translator.model, torch.tensor([ids[:6] + [EOS_ID]]), cfg,
                       output_weight(translator.model, torch.device("cpu")))[0][0].tokens
    src = tmp_path / "in.txt"
    src.write_text(f"{SENTENCES[0]}\n\n{long}\n{SENTENCES[4]}\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", f"input={src}", "beam=2",
                                                       "max_len_b=8", "max_source_len=6", "buffer_lines=2"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == translator.tokenizer.decode([cut])[0]
    assert f"{src}:3: the source has {len(ids)} tokens, more than max_source_len=6" in caplog.text
    assert f"{src}:1:" not in caplog.text and f"{src}:4:" not in caplog.text  # short lines pass whole


def test_api_truncates_long_sources(ckpt, caplog):
    translator = Translator.from_checkpoint(ckpt)
    long = " ".join(SENTENCES)
    n = len(translator.tokenizer.encode([long])[0])
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        capped = translator.hypotheses([SENTENCES[4], long], beam=2, max_len_b=8, max_source_len=n - 1)
    assert f"input:2: the source has {n} tokens, more than max_source_len={n - 1}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        whole = translator.hypotheses([SENTENCES[4], long], beam=2, max_len_b=8, max_source_len=n)
    assert caplog.text == "" and len(capped) == len(whole) == 2


def test_validation_applies_max_source_len(ckpt, caplog):
    """Validation caps long sources as relmt-translate does; the warning names the split's source
    side and the example's line."""
    model = Translator.from_checkpoint(ckpt).model
    src = [[5, 6, 7, 8, 9, 10, 11, EOS_ID], [12, 13, EOS_ID]]
    data = SplitIds(np.array([t for s in src for t in s], dtype=np.int32), np.array([0, 8, 11]),
                    np.zeros(0, dtype=np.int32), np.array([0, 0, 0]))
    cfg = DecodeConfig(beam=2, max_len_b=6, max_source_len=4)
    with caplog.at_level(logging.WARNING, logger="relmt.decode.search"):
        out = decode_sources(model, split_sources(data), cfg, torch.device("cpu"), name="valid.en")
    assert "valid.en:1: the source has 7 tokens, more than max_source_len=4" in caplog.text
    assert "valid.en:2" not in caplog.text
    weight = output_weight(model, torch.device("cpu"))
    expected = [nbest_search(model, torch.tensor([s]), cfg, weight)[0] for s in ([5, 6, 7, 8, EOS_ID], src[1])]
    assert [[h.tokens for h in hs] for hs in out] == [[h.tokens for h in hs] for hs in expected]
    assert [h.score for hs in out for h in hs] == pytest.approx([h.score for hs in expected for h in hs], rel=1e-5)


def test_renamed_max_tokens_names_max_source_tokens(ckpt, capsys):
    """issue 13: decode's max_tokens counted source tokens only, training's padded source + target."""
    assert guarded("relmt-translate", _translate, [f"checkpoint={ckpt}", "max_tokens=100"]) == 2
    err = capsys.readouterr().err
    assert "max_tokens: renamed max_source_tokens" in err and "max_source_tokens=100" in err
    assert "Traceback" not in err
    assert "decode.max_source_tokens" in " ".join(renamed_overrides(["decode.max_tokens=100"]))  # relmt-train


def test_checkpoint_with_the_old_decode_key_still_loads(ckpt, tmp_path):
    """A checkpoint saved while decode.max_source_tokens was decode.max_tokens keeps its value."""
    ck = checkpoint.load(ckpt)
    ck.pop("checksum", None)
    decode = ck["config"]["decode"]
    del decode["max_source_tokens"]
    decode["max_tokens"] = 123
    checkpoint.save(ck, tmp_path, ["old.pt"])
    assert Translator.from_checkpoint(tmp_path / "old.pt").decode.max_source_tokens == 123
