"""Several corpora with weights (data.source=corpora, relmt/data/mix.py; issue 61): each epoch draws the
corpora's pairs in the weights' proportion, an undersampled corpus shows every pair before a repeat, the
realised mix is logged, a kill and a resume give the same batches and losses, and the target-language tags
of a multilingual run are single pieces at the start of each source."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from relmt import checkpoint
from relmt.config import CorpusConfig, DataConfig, Source, ToyConfig
from relmt.data.dataset import SplitIds, prepare
from relmt.data.mix import Mix, shares, take
from relmt.decode.translator import Translator
from relmt.errors import UserError
from relmt.train import loop as loop_module
from tests.test_train import tiny_config, train_records


def test_shares_follow_the_weights_and_add_up():
    assert shares(10, [3, 1]).tolist() == [8, 2]  # 7.5 and 2.5: the tie goes to the first
    assert shares(7, [1, 1, 1]).tolist() == [3, 2, 2]
    assert shares(1000, [0, 2, 1]).tolist() == [0, 667, 333]
    n = shares(49_012, [3.0, 1.0])
    assert n.sum() == 49_012 and abs(n[0] / n.sum() - 0.75) < 1 / 49_012


def test_an_epoch_draws_each_corpus_its_share_and_an_undersampled_one_all_its_pairs_before_a_repeat():
    labels = np.array([0] * 60 + [1] * 40)
    mix = Mix(labels, [1, 3], ["a", "b"], seed=5)
    assert mix.per_epoch.tolist() == [25, 75]  # a: 25 of its 60 pairs per epoch; b: 75 draws of 40 pairs
    epochs = [mix.epoch(e) for e in range(5)]
    for index in epochs:
        assert np.bincount(labels[index], minlength=2).tolist() == [25, 75]
    a_draws = [e[labels[e] == 0] for e in epochs]  # 25 a epoch of a's 60 pairs
    assert len(set(np.concatenate(a_draws[:2]).tolist())) == 50  # epochs 0 and 1: 50 pairs, none twice
    assert set(np.concatenate(a_draws[:3]).tolist()) == set(range(60))  # by epoch 2, every one of them
    b_first = epochs[0][labels[epochs[0]] == 1]
    assert np.bincount(b_first - 60, minlength=40).min() >= 1  # 75 draws of 40: every pair, some twice
    assert np.array_equal(Mix(labels, [1, 3], ["a", "b"], seed=5).epoch(3), epochs[3])  # (seed, epoch) decide
    assert not np.array_equal(Mix(labels, [1, 3], ["a", "b"], seed=6).epoch(3), epochs[3])


def test_take_gathers_ragged_rows_with_repeats():
    rows_src, rows_tgt = [[1, 2, 3], [4], [5, 6]], [[7], [8, 9], []]

    def flat(rows):
        return np.array([t for r in rows for t in r], dtype=np.int32), np.cumsum([0] + [len(r) for r in rows])
    ids = SplitIds(*flat(rows_src), *flat(rows_tgt))
    out = take(ids, np.array([2, 0, 2]))
    assert [out.src[a:b].tolist() for a, b in zip(out.src_offsets[:-1], out.src_offsets[1:])] == \
        [rows_src[2], rows_src[0], rows_src[2]]
    assert [out.tgt[a:b].tolist() for a, b in zip(out.tgt_offsets[:-1], out.tgt_offsets[1:])] == \
        [rows_tgt[2], rows_tgt[0], rows_tgt[2]]


CORPORA = ("data.source=corpora", "data.lang_tags=true", "data.vocab_size=200",
           "data.corpora=[{name: m30k, source: toy, toy: {seed: 1, n_train: 300, n_valid: 20, n_test: 20, "
           "n_test_long: 0}, weight: 3}, {name: ep, source: toy, src: en, tgt: fr, toy: {seed: 2, n_train: 120, "
           "n_valid: 10, n_test: 10, n_test_long: 0}, weight: 1}]")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A tiny run on two toy corpora at 3:1, the second EN->FR, with target-language tags."""
    tmp = tmp_path_factory.mktemp("mixed")
    cfg = tiny_config(tmp, "run", *CORPORA, "train.max_steps=12", "train.log_every=4")
    return tmp, cfg, loop_module.train(cfg)


def test_two_corpora_train_in_their_weights_share_with_per_corpus_splits_and_tags(mixed):
    tmp, cfg, metrics = mixed
    mix = metrics["mix"]
    assert mix["m30k"]["pairs"] + mix["ep"]["pairs"] > 0
    assert abs(mix["m30k"]["pair_share"] - 0.75) < 0.01 and abs(mix["ep"]["pair_share"] - 0.25) < 0.01
    logged = train_records(tmp / "run", "mix")
    assert sorted(logged) == [4, 8, 12] and logged[12]["m30k"] == mix["m30k"]
    assert set(metrics["test"]) >= {"m30k_test", "ep_valid", "ep_test"}  # valid: m30k's, the first corpus's
    corpus = prepare(cfg.data)
    assert corpus.texts("train", "src")[0].startswith("<2tgt> ") and corpus.texts("ep_test", "src")[0].startswith(
        "<2fr> ")
    tok = corpus.tokenizer
    for tag in ("<2tgt>", "<2fr>"):
        assert tok.sp.encode(f"{tag} abc", out_type=str)[0] == f"\u2581{tag}"  # one piece (user-defined, as is tag)
        assert tok.sp.piece_to_id(tag) != tok.sp.unk_id()
    labels = corpus.corpus_labels()
    assert np.bincount(labels).tolist() == [300, 120]


def test_a_multilingual_model_is_told_its_target_language(mixed):
    tmp, cfg, _ = mixed
    translator = Translator.from_checkpoint(tmp / "run/checkpoints/last.pt", device="cpu")
    assert translator.tgt_langs == ["fr", "tgt"]
    assert translator.tagged(["ab cd", " "], "fr") == ["<2fr> ab cd", " "]  # a blank line stays blank
    with pytest.raises(UserError, match="no tgt_lang given: this multilingual model translates into fr, tgt"):
        translator.translate("ab cd")
    with pytest.raises(UserError, match="tgt_lang=de: not one of its languages"):
        translator.translate("ab cd", tgt_lang="de")
    with pytest.raises(UserError, match="sentence 2 begins with a language tag already, and tgt_lang=fr adds one"):
        translator.translate(["ab", "<2fr> cd"], tgt_lang="fr")
    source = prepare(cfg.data).texts("ep_test", "src")[0].removeprefix("<2fr> ")
    hyps = translator.hypotheses([source], tgt_lang="fr", beam=1, max_len_b=6)
    tagged = translator.hypotheses([f"<2fr> {source}"], beam=1, max_len_b=6)  # what tgt_lang does: the tag
    assert hyps[0][0].tokens == tagged[0][0].tokens
    [[t]] = translator.translations([source], tgt_lang="fr", alignments=True, beam=1, max_len_b=6)
    if t.alignment:  # the tag is no source word: the links index the sentence's own words
        assert max(int(link.split("-")[0]) for link in t.alignment.split()) < len(source.split())
    done = subprocess.run([str(Path(sys.executable).parent / "relmt-translate"),
                           f"checkpoint={tmp / 'run/checkpoints/last.pt'}", "beam=1", "max_len_b=6"],
                          input=source + "\n", text=True, capture_output=True)
    assert done.returncode == 2 and "no tgt_lang given" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([str(Path(sys.executable).parent / "relmt-translate"),
                           f"checkpoint={tmp / 'run/checkpoints/last.pt'}", "beam=1", "max_len_b=6", "tgt_lang=fr"],
                          input=source + "\n", text=True, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout == translator.translate(source, tgt_lang="fr", beam=1, max_len_b=6) + "\n"


def test_a_tag_cut_into_two_pieces_is_left_out_of_the_alignments_whole(tmp_path):
    """bpe and unigram models cut a lone "▁" off before a user-defined tag: both pieces are the tag's."""
    from relmt.data.tokenizer import Tokenizer, train_tokenizer
    from relmt.data.toy import generate
    from relmt.decode.translator import tag_pieces

    pairs = generate(seed=1, n_train=300, n_valid=0, n_test=0, n_test_long=0)["train"]
    train_tokenizer([f"<2fr> {s}" for s, _ in pairs] + [t for _, t in pairs], tmp_path / "spm.model", 200, "bpe",
                    user_symbols=["<2fr>", "<2de>"])
    tok = Tokenizer(tmp_path / "spm.model")
    tags = {tok.sp.piece_to_id(p) for p in ("<2fr>", "\u2581<2fr>", "<2de>", "\u2581<2de>")} - {tok.sp.unk_id()}
    sentence = pairs[0][0]
    ids = tok.encode([f"<2fr> {sentence}"])[0]
    n = tag_pieces(ids, tags)
    assert n >= 1 and tok.sp.decode(ids[n:]) == sentence and tok.sp.decode(ids[:n]).strip() == "<2fr>"
    assert tag_pieces(tok.encode([sentence])[0], tags) == 0


def test_the_server_tags_a_request_for_its_tgt_lang():
    from relmt.config import DecodeConfig
    from relmt.serve.args import ServeArgs
    from relmt.serve.requests import ApiError, parse_body

    def tagged(sentences, lang):
        if lang != "fr":
            raise UserError(f"tgt_lang={lang}: not one of its languages")
        return [f"<2fr> {s}" for s in sentences]
    req = parse_body(b'{"text": ["a b", "c"], "tgt_lang": "fr"}', ServeArgs(), DecodeConfig(), tagged=tagged)
    assert req.sentences == ["<2fr> a b", "<2fr> c"]
    with pytest.raises(ApiError, match="tgt_lang: tgt_lang=None: not one of its languages") as e:
        parse_body(b'{"text": "a b"}', ServeArgs(), DecodeConfig(), tagged=tagged)
    assert e.value.status == 422 and e.value.field == "tgt_lang"


def test_the_report_gives_a_row_per_corpus_and_pair(mixed):
    from relmt.report.build import build_report
    from relmt.report.markdown import by_corpus_markdown

    tmp, _, metrics = mixed
    page = by_corpus_markdown(build_report([str(tmp / "run")], "mixed", None))
    rows = [line for line in page.splitlines() if line.startswith("| run |")]
    assert rows[0] == "| run | corpus | pair | valid sacreBLEU | test sacreBLEU |"
    assert rows[1].startswith("| run | m30k | src→tgt | ")  # its valid is the run's validation
    assert rows[2] == (f"| run | ep | en→fr | {metrics['test']['ep_valid']['bleu']:.2f} | "
                       f"{metrics['test']['ep_test']['bleu']:.2f} |")


def test_a_killed_run_with_mixing_and_sampling_resumes_with_the_same_batches_and_losses(tmp_path):
    small = tuple(c.replace("n_train: 300", "n_train: 90").replace("n_train: 120", "n_train: 40") for c in CORPORA)
    common = (*small, "data.spm_alpha=0.2", "data.spm_model_type=bpe", "train.max_padded_tokens=2048",
              "train.save_every=4", "train.eval_every=4", "train.valid_bleu=false",
              "train.log_every=2")
    loop_module.train(tiny_config(tmp_path, "full", "train.max_steps=10", *common))
    loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=4", *common))
    loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=10", "train.resume=true", *common))
    a, b = train_records(tmp_path / "full"), train_records(tmp_path / "split")
    assert max(r["epoch"] for r in a.values()) >= 1
    assert [a[s]["loss"] for s in (2, 4, 6, 8, 10)] == [b[s]["loss"] for s in (2, 4, 6, 8, 10)]
    assert train_records(tmp_path / "full", "mix")[10] == train_records(tmp_path / "split", "mix")[10]
    wa, wb = (checkpoint.load(tmp_path / run / "checkpoints/last.pt")["model"] for run in ("full", "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    with pytest.raises(UserError, match=r"cannot resume with the corpus weights \{'m30k': 3.0, 'ep': 2.0\}"):
        loop_module.train(tiny_config(tmp_path, "split", "train.max_steps=12", "train.resume=true", *common,
                                      "data.corpora.1.weight=2"))


def test_the_weights_do_not_enter_the_cache_key(tmp_path):
    from relmt.data.dataset import cache_key

    def cfg(w):
        return DataConfig(source=Source.corpora, corpora=[CorpusConfig(name="a", source=Source.toy),
                                                          CorpusConfig(name="b", source=Source.toy, weight=w,
                                                                       toy=ToyConfig(seed=2))])
    assert cache_key(cfg(1.0)) == cache_key(cfg(3.0))


@pytest.mark.parametrize("change, key", [
    (dict(corpora=[]), "data.corpora: source=corpora needs at least one corpus"),
    (dict(corpora=[CorpusConfig(name="a b", source=Source.toy)]), r"data.corpora\[0\].name: must be a label"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.toy), CorpusConfig(name="a", source=Source.toy)]),
     r"data.corpora\[1\].name: 'a' names two corpora"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.toy, weight=-1)]), r"data.corpora\[0\].weight: must be >= 0"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.text, splits={"valid": "v"}, dir="d")]),
     r"data.corpora\[0\].splits: must map 'train'"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.text, splits={"train": "t"}, dir="d")]),
     "data.corpora: no corpus has a valid split"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.toy)], valid_corpus="b"), "data.valid_corpus: must name"),
    (dict(corpora=[CorpusConfig(name="a", source=Source.toy)], dir="x"), "data.dir: source=corpora reads each"),
    (dict(corpora=[CorpusConfig(name="ep", source=Source.toy), CorpusConfig(name="ep_bt", source=Source.toy)]),
     r"data.corpora\[1\].name: 'ep_bt' begins with another corpus's name and '_' \('ep'\)"),
])
def test_bad_corpora_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        DataConfig(source=Source.corpora, **change)


def test_corpora_and_tags_need_source_corpora():
    with pytest.raises(ValueError, match="data.corpora: needs data.source=corpora"):
        DataConfig(corpora=[CorpusConfig(name="a", source=Source.toy)])
    with pytest.raises(ValueError, match="data.lang_tags: .* it needs data.source=corpora"):
        DataConfig(lang_tags=True)


def test_a_missing_corpus_file_names_the_file_and_the_corpus(tmp_path):
    (tmp_path / "c").mkdir()
    for name in ("train.src", "train.tgt", "valid.src", "valid.tgt"):
        (tmp_path / "c" / name).write_text("a b\n")
    cfg = DataConfig(source=Source.corpora, cache_dir=str(tmp_path / "cache"), corpora=[
        CorpusConfig(name="ok", source=Source.text, dir=str(tmp_path / "c"),
                     splits={"train": "train", "valid": "valid"}),
        CorpusConfig(name="gone", source=Source.text, dir=str(tmp_path / "c"), splits={"train": "missing"})])
    with pytest.raises(UserError, match=r"data.corpora\[1\] \(gone\): .*c/missing.src: no such file \(split .missing."):
        prepare(cfg)


def test_a_config_without_the_corpora_keys_keeps_the_cache_key_it_had_before_them():
    """data.corpora, valid_corpus and lang_tags at their defaults leave the key as it was (pinned: the value at the
    commit before they were added), so existing caches are reused and saved runs resume (their checkpoints
    compare the key)."""
    from relmt.data.dataset import cache_key

    cfg = DataConfig(name="wmt", source=Source.hf, hf_path="wmt14", hf_name="de-en",
                     splits={"train": "train", "valid": "validation"})
    assert cache_key(cfg) == "aef872e92355b4f3"


def test_a_corpus_with_a_weight_and_no_pairs_left_names_its_key():
    with pytest.raises(UserError, match=r"data.corpora\[1\] \(b\): weight 2, but none of its training pairs"):
        Mix(np.array([0, 0, 0]), [1, 2], ["a", "b"], seed=1)
    assert Mix(np.array([0, 0, 0]), [1, 0], ["a", "b"], seed=1).per_epoch.tolist() == [3, 0]  # weight 0: left out
