"""Subword regularisation (data.spm_alpha, relmt/data/regularise.py; issue 61): each epoch's training pieces are
sampled anew from the cached ids, the same for the same (seed, epoch), so a resumed run equals an uninterrupted
one; the cache and evaluation never sample, and a resume refuses a change of the sampling."""

from __future__ import annotations

import time

import pytest
import torch

from relmt import checkpoint
from relmt.config import DataConfig, SpmModel
from relmt.data import regularise
from relmt.data.dataset import SplitIds, prepare
from relmt.data.regularise import Resampler, flat, resample
from relmt.data.tokenizer import Tokenizer
from relmt.data.toy import generate
from relmt.errors import UserError
from relmt.train import loop as loop_module
from tests.test_train import tiny_config, train_records
from tests.tiny_checkpoints import toy_tokenizer


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> tuple[Tokenizer, SplitIds]:
    tok = Tokenizer(toy_tokenizer(tmp_path_factory.mktemp("spm")))
    pairs = generate(seed=3, n_train=40, n_valid=0, n_test=0, n_test_long=0)["train"]
    src, src_offsets = flat(tok.encode([s for s, _ in pairs]), eos=True)
    tgt, tgt_offsets = flat(tok.encode([t for _, t in pairs]), eos=False)
    return tok, SplitIds(src, src_offsets, tgt, tgt_offsets)


def rows(ids: SplitIds, side: str) -> list[list[int]]:
    data, offsets = getattr(ids, side), getattr(ids, f"{side}_offsets")
    return [data[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def test_an_epoch_samples_other_pieces_of_the_same_text_and_the_same_ones_again(split):
    tok, ids = split
    one, again, two = (resample(ids, tok, 0.3, -1, seed=1, epoch=e) for e in (0, 0, 1))
    for side in ("src", "tgt"):
        assert rows(one, side) == rows(again, side)  # (seed, epoch) decides the pieces
        assert rows(one, side) != rows(two, side) and rows(one, side) != rows(ids, side)
        eos = side == "src"
        assert tok.decode([r[:len(r) - eos] for r in rows(one, side)]) == \
            tok.decode([r[:len(r) - eos] for r in rows(ids, side)])  # the same sentences
    assert all(r[-1] == 3 for r in rows(one, "src"))  # sources still end in EOS
    assert rows(resample(ids, tok, 0.3, -1, seed=2, epoch=0), "src") != rows(one, "src")


def test_the_resampler_prepares_the_next_epoch_as_resample_would(split):
    tok, ids = split
    r = Resampler(ids, tok, 0.3, -1, seed=1)
    assert rows(r.epoch(0), "tgt") == rows(resample(ids, tok, 0.3, -1, 1, 0), "tgt")
    assert rows(r.epoch(1), "tgt") == rows(resample(ids, tok, 0.3, -1, 1, 1), "tgt")  # made in the background
    assert rows(r.epoch(5), "tgt") == rows(resample(ids, tok, 0.3, -1, 1, 5), "tgt")  # a resume jumps


def test_stored_epochs_are_read_back_not_sampled_again(split, tmp_path, monkeypatch):
    """sentencepiece samples other pieces for the same seed in another process, so a resume (a new process)
    must read an epoch's pieces from the run, never sample them again."""
    tok, ids = split
    r = Resampler(ids, tok, 0.3, -1, seed=1, store=tmp_path / "pieces")
    first = r.epoch(0)
    r.worker.join()  # the next epoch is stored in the background
    assert sorted(p.name for p in (tmp_path / "pieces").iterdir()) == ["epoch_0.npz", "epoch_1.npz"]
    second = r.epoch(1)
    r.worker.join()
    assert sorted(p.name for p in (tmp_path / "pieces").iterdir()) == ["epoch_0.npz", "epoch_1.npz", "epoch_2.npz"]
    r.forget_before(1)  # a checkpoint of epoch 1 is saved: a resume never needs epoch 0 again
    assert sorted(p.name for p in (tmp_path / "pieces").iterdir()) == ["epoch_1.npz", "epoch_2.npz"]

    def other_process(data, tok, alpha, nbest, seed, epoch):
        assert epoch > 2, f"epoch {epoch} sampled again"
        return data
    monkeypatch.setattr("relmt.data.regularise.resample", other_process)
    again = Resampler(ids, tok, 0.3, -1, seed=1, store=tmp_path / "pieces")
    assert rows(again.epoch(1), "tgt") == rows(second, "tgt") != rows(first, "tgt")
    again.worker.join()
    rank1 = Resampler(ids, tok, 0.3, -1, seed=1, store=tmp_path / "pieces", sample=False)
    assert rows(rank1.epoch(2), "src") == rows(again.epoch(2), "src")  # another rank reads what rank 0 stored
    with pytest.raises(RuntimeError, match="rank 0 did not store epoch 7"):
        rank1.epoch(7)


def test_pieces_stored_by_another_run_are_sampled_anew_and_a_missing_epoch_is_said(split, tmp_path, caplog):
    tok, ids = split
    Resampler(ids, tok, 0.3, -1, seed=1, store=tmp_path / "pieces").epoch(0)  # another run's, seed 1
    other = Resampler(ids, tok, 0.3, -1, seed=2, store=tmp_path / "pieces", resumed=True)
    assert other.stored(0) is None  # made from other settings: never read
    with caplog.at_level("WARNING"):
        assert rows(other.epoch(0), "src") == rows(resample(ids, tok, 0.3, -1, 2, 0), "src")
    assert "the pieces of epoch 0, where this run resumes, are not stored" in caplog.text
    other.worker.join()
    assert rows(other.stored(0), "src") == rows(resample(ids, tok, 0.3, -1, 2, 0), "src")  # stored for seed 2 now


def resumed_in_a_new_process(tmp_path, monkeypatch, common: tuple[str, ...]) -> tuple[dict, dict]:
    """Resume run "split" to 8 updates as a new process would, whose sentencepiece samples other pieces than
    the first process's; the training records of "full" and "split"."""
    with monkeypatch.context() as m:
        real = regularise.resample
        m.setattr(regularise, "resample", lambda data, tok, alpha, nbest, seed, epoch:
                  real(data, tok, alpha, nbest, seed + 100, epoch))
        loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=8", "train.resume=true", *common))
    return train_records(tmp_path / "full"), train_records(tmp_path / "split")


def test_settle_waits_for_the_next_epoch_and_says_where_it_was_not_stored(split, tmp_path, monkeypatch, caplog):
    """A run ends with `settle`: the next epoch's pieces stored; an error of their encoding (a full disk) is logged
    with what it means for a resume, not raised, and not raised later either."""
    tok, ids = split
    r = Resampler(ids, tok, 0.3, -1, seed=1, store=tmp_path / "pieces")
    r.epoch(0)
    r.settle()
    assert r.worker is None and (tmp_path / "pieces" / "epoch_1.npz").exists()
    real_save = regularise.save

    def full_disk(ids, path, made_from):
        if path.name == "epoch_2.npz":
            raise OSError(28, "No space left on device")
        real_save(ids, path, made_from)

    monkeypatch.setattr(regularise, "save", full_disk)
    r.epoch(1)
    with caplog.at_level("WARNING"):
        r.settle()
    assert "the next epoch's pieces were not stored ([Errno 28] No space left on device)" in caplog.text
    assert r.failed is None and not (tmp_path / "pieces" / "epoch_2.npz").exists()


def test_a_resumed_run_with_sampled_pieces_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    """12 training pairs: several epochs in 8 updates, each with its own sampled pieces. The first part's next
    epoch is encoded slowly in the background, as on a busy machine: the run stores it before it returns
    (Resampler.settle), so that the resume reads it (before settle, this test failed now and then under load)."""
    common = ("data.toy.n_train=12", "data.spm_alpha=0.2", "data.spm_model_type=bpe", "data.vocab_size=300",
              "train.save_every=4", "train.eval_every=4", "train.valid_bleu=false")
    loop_module.train(tiny_config(tmp_path, "full", "train.max_steps=8", *common))
    began: list[str] = []  # the epochs encoded in the background, and those stored
    stored: list[str] = []
    with monkeypatch.context() as m:
        real_next, real_save = Resampler._prepare_next, regularise.save

        def slow_next(self, epoch):
            began.append(f"epoch_{epoch}.npz")
            time.sleep(3.0)
            real_next(self, epoch)

        m.setattr(Resampler, "_prepare_next", slow_next)
        m.setattr(regularise, "save", lambda ids, path, made_from: (real_save(ids, path, made_from),
                                                                     stored.append(path.name)))
        loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=4", *common))
        assert began and set(began) <= set(stored)  # stored before the run returned
    a, b = resumed_in_a_new_process(tmp_path, monkeypatch, common)
    assert max(r["epoch"] for r in a.values()) >= 2
    assert [a[s]["loss"] for s in range(1, 9)] == [b[s]["loss"] for s in range(1, 9)]
    wa, wb = (checkpoint.load(tmp_path / run / "checkpoints/last.pt")["model"] for run in ("full", "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    plain = tiny_config(tmp_path, "plain", "train.max_steps=2", *common[:1], *common[2:])
    loop_module.train(plain)
    assert train_records(tmp_path / "plain")[1]["loss"] != a[1]["loss"]  # the sampled pieces were trained on
    with pytest.raises(UserError, match=r"cannot resume with data.spm_alpha=0.1 \(saved: 0.2\)"):
        loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=9", "train.resume=true", *common[:1],
                                      "data.spm_alpha=0.1", *common[2:]))


def test_evaluation_and_translation_never_sample(tmp_path):
    """After a run with sampled pieces: the cached evaluation ids are the deterministic encoding, the run's last
    validation loss is what the final weights give on those ids again, and translating twice gives one output."""
    from relmt.decode.translator import Translator
    from relmt.train.validate import split_loss

    cfg = tiny_config(tmp_path, "run", "data.toy.n_train=40", "data.spm_alpha=0.3", "data.spm_model_type=bpe",
                      "data.vocab_size=300", "train.max_steps=4", "train.valid_bleu=false")
    metrics = loop_module.train(cfg)
    corpus = prepare(cfg.data)
    tok = corpus.tokenizer
    for split in ("valid", "test"):
        ids = corpus.ids(split)
        assert rows(ids, "tgt") == tok.encode(corpus.texts(split, "tgt"))
        assert rows(ids, "src") == [x + [3] for x in tok.encode(corpus.texts(split, "src"))]
    translator = Translator.from_checkpoint(tmp_path / "run/checkpoints/last.pt", device="cpu")
    again = split_loss(translator.model, corpus, "valid", cfg.train.max_padded_tokens, cfg.train.label_smoothing,
                       torch.device("cpu"))
    assert again["loss"] == pytest.approx(metrics["final_valid"]["loss"], rel=1e-6)
    sources = corpus.texts("test", "src")[:8]
    assert translator.translate(sources, beam=2, max_len_b=8) == translator.translate(sources, beam=2, max_len_b=8)


def test_bad_sampling_settings_name_the_key():
    with pytest.raises(ValueError, match="data.spm_alpha: must be 0 .off. or a probability in .0, 1. for bpe"):
        DataConfig(spm_alpha=1.5)
    DataConfig(spm_alpha=1.5, spm_model_type=SpmModel.unigram)  # unigram's alpha is a smoothing, not a probability
    with pytest.raises(ValueError, match="data.spm_alpha: samples segmentations of bpe and unigram models"):
        DataConfig(spm_alpha=0.1, spm_model_type=SpmModel.word)
    with pytest.raises(ValueError, match="data.spm_nbest: must be -1"):
        DataConfig(spm_nbest=0)


def test_saving_best_alone_keeps_the_pieces_a_resume_from_last_needs(tmp_path, monkeypatch):
    """Issue 69 defects 4 and 5: with eval_every (3) not a multiple of save_every (4), best.pt saved at update 6
    deleted the pieces of last.pt's epoch (update 4), so a resume after a hard kill sampled that epoch anew. And a
    saved position past a re-sampled epoch's batches resumes at the next epoch instead of crashing."""
    common = ("data.toy.n_train=12", "data.spm_alpha=0.2", "data.spm_model_type=bpe", "data.vocab_size=300",
              "train.save_every=4", "train.eval_every=3", "train.valid_bleu=false", "train.best_metric=loss")
    loop_module.train(tiny_config(tmp_path, "full", "train.max_steps=8", *common))
    real_step = loop_module.train_step
    calls = []

    def killed(*args, **kwargs):  # a hard kill during update 7: nothing is saved after update 6's best.pt
        calls.append(1)
        if len(calls) == 7:
            raise SystemExit("killed")
        return real_step(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(loop_module, "train_step", killed)
        with pytest.raises(SystemExit):
            loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=8", *common))
    a, b = resumed_in_a_new_process(tmp_path, monkeypatch, common)
    assert [a[s]["loss"] for s in range(1, 9)] == [b[s]["loss"] for s in range(1, 9)]

    last = tmp_path / "split/checkpoints/last.pt"
    ck = checkpoint.load(last)
    ck["position"]["batch"] = ck["state"]["batch"] = 999  # further than any epoch of 12 pairs holds
    ck["checksum"] = checkpoint.payload_checksum(ck)
    torch.save(ck, last)
    metrics = loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=9", "train.resume=true", *common))
    assert metrics["status"] == "completed" and metrics["steps"] == 9
