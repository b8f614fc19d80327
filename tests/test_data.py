"""Data sources, bad input, vocabulary and the encoded cache (no network, no ../shared)."""

from __future__ import annotations

import logging
import re

import datasets
import pytest

from relmt.config import DataConfig, Source, SpmModel, SpmNormalization, ToyConfig
from relmt.data.dataset import cache_key, prepare
from relmt.data.sources import decode_lines, load_pairs, read_lines
from relmt.data.tokenizer import EOS_ID, Tokenizer, lowercase_rules
from relmt.errors import UserError

EN = ["the cat sits", "a dog runs fast", "the bird sings", "two cats sleep", "one dog barks",
      "the sun is warm", "a tree grows", "the river flows"]
DE = ["die katze sitzt", "ein hund rennt schnell", "der vogel singt", "zwei katzen schlafen",
      "ein hund bellt", "die sonne ist warm", "ein baum wächst", "der fluss fließt"]
SPLITS = {"train": "train", "valid": "valid", "test": "test"}


def write_text(folder, split, en, de):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{split}.en").write_text("".join(s + "\n" for s in en), encoding="utf-8")
    (folder / f"{split}.de").write_text("".join(s + "\n" for s in de), encoding="utf-8")


def text_cfg(tmp_path, **kw) -> DataConfig:
    args = dict(name="fixture", source=Source.text, dir=str(tmp_path / "corpus"), src="en", tgt="de",
                splits=dict(SPLITS), vocab_size=60, spm_model_type=SpmModel.word,
                cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**args, **kw})


@pytest.fixture
def corpus_dir(tmp_path):
    d = tmp_path / "corpus"
    write_text(d, "train", EN * 3, DE * 3)
    write_text(d, "valid", EN[:3], DE[:3])
    write_text(d, "test", EN[3:6], DE[3:6])
    return d


def test_text_source_reads_aligned_splits(tmp_path, corpus_dir):
    pairs = load_pairs(text_cfg(tmp_path))
    assert set(pairs) == {"train", "valid", "test"}
    assert pairs["valid"]["src"] == EN[:3] and pairs["valid"]["tgt"] == DE[:3]
    reverse = load_pairs(text_cfg(tmp_path, src="de", tgt="en"))
    assert reverse["test"]["src"] == DE[3:6]


def test_read_lines_splits_on_newline_only(tmp_path):
    f = tmp_path / "x.en"
    f.write_bytes("a\u2028b\r\nc\n".encode())  # U+2028 is inside a line, CRLF ends one
    assert read_lines(f) == ["a\u2028b", "c"]


def test_missing_file_names_it(tmp_path, corpus_dir):
    (corpus_dir / "test.de").unlink()
    with pytest.raises(UserError, match=r"test\.de: no such file.*data\.tgt"):
        load_pairs(text_cfg(tmp_path))


def test_unknown_language_and_split_name_the_key(tmp_path, corpus_dir):
    with pytest.raises(UserError, match=r"train\.fr: no such file.*language 'fr' from data\.src"):
        load_pairs(text_cfg(tmp_path, src="fr"))
    with pytest.raises(UserError, match=r"split 'dev' from data\.splits\.valid"):
        load_pairs(text_cfg(tmp_path, splits={**SPLITS, "valid": "dev"}))


def test_unequal_line_counts(tmp_path, corpus_dir):
    write_text(corpus_dir, "valid", EN[:3], DE[:2])
    with pytest.raises(UserError, match=r"valid\.en has 3 lines but .*valid\.de has 2"):
        load_pairs(text_cfg(tmp_path))


def test_invalid_utf8_names_file_and_line(tmp_path, corpus_dir):
    (corpus_dir / "test.de").write_bytes(b"gut\nauch gut\nkaputt \xff\xfe hier\n")
    with pytest.raises(UserError, match=r"test\.de:3: invalid UTF-8"):
        load_pairs(text_cfg(tmp_path))


def test_empty_lines_are_dropped_from_train_with_a_logged_count(tmp_path, corpus_dir, caplog):
    write_text(corpus_dir, "train", EN * 3 + ["", "lonely"], DE * 3 + ["leer", ""])
    write_text(corpus_dir, "test", EN[3:6] + [""], DE[3:6] + [""])
    with caplog.at_level(logging.WARNING):
        corpus = prepare(text_cfg(tmp_path))
    assert len(corpus.splits["train"]) == 24
    assert corpus.meta["splits"]["train"]["dropped"] == {"an empty side": 2}
    assert "train: dropped 2 of 26 pairs (an empty side)" in caplog.text
    # evaluation splits keep every line so that references stay aligned, and say so
    assert len(corpus.splits["test"]) == 4
    assert "test: 1 pairs with an empty side kept" in caplog.text


def test_length_and_ratio_filters_count_what_they_drop(tmp_path, corpus_dir):
    long = " ".join(["the"] * 12)
    write_text(corpus_dir, "train", EN * 3 + [long, "the cat"], DE * 3 + ["ein hund", long])
    corpus = prepare(text_cfg(tmp_path, max_tokens_per_side=10, max_length_ratio=2.0))
    assert corpus.meta["splits"]["train"]["dropped"] == {"longer than max_tokens_per_side": 2}
    corpus = prepare(text_cfg(tmp_path, max_tokens_per_side=64, max_length_ratio=2.0))
    assert corpus.meta["splits"]["train"]["dropped"] == {"length ratio": 2}


def test_train_max_src_words_keeps_short_training_pairs_only(tmp_path, corpus_dir):
    """The length-generalisation split: training sources of more than N words are dropped and
    counted; the evaluation splits keep their long sentences."""
    long_en, long_de = "the dog and the cat see the sun", "der hund und die katze sehen die sonne"
    write_text(corpus_dir, "train", EN * 3 + [long_en], DE * 3 + [long_de])
    write_text(corpus_dir, "test", [long_en, EN[0]], [long_de, DE[0]])
    n = max(len(s.split()) for s in EN)
    assert len(long_en.split()) > n
    corpus = prepare(text_cfg(tmp_path, train_max_src_words=n))
    assert corpus.meta["splits"]["train"]["dropped"] == {"source longer than train_max_src_words": 1}
    assert long_en not in corpus.texts("train", "src") and len(corpus.ids("train")) == 3 * len(EN)
    assert corpus.texts("test", "src") == [long_en, EN[0]]
    assert cache_key(text_cfg(tmp_path, train_max_src_words=n)) != cache_key(text_cfg(tmp_path))


def test_prepare_encodes_caches_and_reuses(tmp_path, corpus_dir, caplog):
    cfg = text_cfg(tmp_path)
    corpus = prepare(cfg)
    ids = corpus.ids("valid")
    assert len(ids) == 3
    first_src = ids.src[ids.src_offsets[0]:ids.src_offsets[1]].tolist()
    assert first_src[-1] == EOS_ID
    assert corpus.tokenizer.decode([first_src[:-1]]) == [EN[0]]
    tgt = ids.tgt[ids.tgt_offsets[2]:ids.tgt_offsets[3]].tolist()
    assert corpus.tokenizer.decode([tgt]) == [DE[2]]
    assert corpus.texts("valid", "tgt") == DE[:3]
    with caplog.at_level(logging.INFO):
        again = prepare(cfg)
    assert again.dir == corpus.dir and "loaded cached data" in caplog.text
    # other settings or edited files give another cache entry
    assert cache_key(text_cfg(tmp_path, vocab_size=50)) != cache_key(cfg)
    # settings that do not change the encoded data share the entry
    assert cache_key(text_cfg(tmp_path, length_buckets=[5, 50], num_proc=2)) == cache_key(cfg)
    write_text(corpus_dir, "test", EN[3:7], DE[3:7])
    assert prepare(text_cfg(tmp_path)).dir != corpus.dir



def test_a_vocabulary_much_larger_than_the_pieces_in_use_is_warned_about(tmp_path, caplog, capsys):
    """Issue 74 §4.6: data=text's data.vocab_size=8000 (bpe) on a 400-line corpus built thousands of pieces of
    which a few hundred occur in the encoded training data; the rest are embedding rows never trained. The build
    says how many occur and suggests a data.vocab_size (a multiple of 8 at or above that count)."""
    import random

    from relmt.data.prepare import run

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10))) for _ in range(600)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) for _ in range(400)]
    for split, n in (("train", 400), ("valid", 20), ("test", 20)):
        write_text(tmp_path / "corpus", split, lines[:n], lines[:n][::-1])
    cfg = text_cfg(tmp_path, vocab_size=8000, spm_model_type=SpmModel.bpe)  # data=text's defaults
    with caplog.at_level(logging.WARNING):
        corpus = run(cfg)
    pieces = corpus.tokenizer.vocab_size
    used = {i for split in ("train",) for ids in (corpus.ids(split).src, corpus.ids(split).tgt) for i in ids.tolist()}
    in_train = len(used - {0, 1, 2, 3})  # the special ids are not pieces of the text
    assert in_train < (pieces - 4) / 2, (pieces, in_train)
    said = re.search(r"data\.vocab_size=8000: only ([\d,]+) of the vocabulary's ([\d,]+) pieces occur in the "
                     r"training data.*try data\.vocab_size=(\d+)", caplog.text)
    assert said, caplog.text
    assert int(said.group(1).replace(",", "")) == in_train and int(said.group(2).replace(",", "")) == pieces - 4
    suggested = int(said.group(3))
    assert suggested % 8 == 0 and in_train + 4 <= suggested < in_train + 4 + 8
    assert f"; {in_train:,} of its {pieces - 4:,} text pieces" in capsys.readouterr().out  # relmt-prepare's summary
    # a vocabulary the training data uses (the word model of the small fixture corpus) is not warned about
    caplog.clear()
    write_text(tmp_path / "small", "train", EN * 3, DE * 3)
    write_text(tmp_path / "small", "valid", EN[:3], DE[:3])
    write_text(tmp_path / "small", "test", EN[3:6], DE[3:6])
    with caplog.at_level(logging.WARNING):
        prepare(text_cfg(tmp_path, dir=str(tmp_path / "small")))
    assert "occur in the training data" not in caplog.text


def test_nul_character_names_file_and_line(tmp_path, corpus_dir):
    """A NUL used to pass silently and become <unk>; translate's input goes through decode_lines too."""
    (corpus_dir / "valid.de").write_bytes(b"die katze sitzt\nein h\x00und\nder vogel singt\n")
    with pytest.raises(UserError, match=r"valid\.de:2: NUL character \(character 6 of the line\)"):
        load_pairs(text_cfg(tmp_path))
    with pytest.raises(UserError, match=r"<stdin>:1: NUL character"):
        decode_lines(b"a\x00\n", "<stdin>")


def test_other_control_characters_are_kept_with_a_warning(tmp_path, caplog):
    f = tmp_path / "x.en"
    f.write_bytes("a\tb\r\nfine\nesc \x1b here \x7f\nnel \u0085\n".encode())
    with caplog.at_level(logging.WARNING):
        assert read_lines(f) == ["a\tb", "fine", "esc \x1b here \x7f", "nel \u0085"]
    assert "x.en: 3 control character(s), the first on line 3 (U+001B); they are kept" in caplog.text
    caplog.clear()
    f.write_bytes(b"tab\tonly\r\n")
    with caplog.at_level(logging.WARNING):
        read_lines(f)
    assert "control" not in caplog.text  # tab and CRLF line ends are ordinary


@pytest.mark.parametrize("train_lines", [[], ["", "  ", "\t"]], ids=["empty", "blank"])
def test_empty_or_blank_train_split_names_the_files(tmp_path, corpus_dir, train_lines):
    """sentencepiece used to fail on no input with a RuntimeError traceback."""
    write_text(corpus_dir, "train", train_lines, train_lines)
    message = r"corpus/train\.en and .*corpus/train\.de \(data\.splits\.train=train\): the training split is empty"
    with pytest.raises(UserError, match=message):
        prepare(text_cfg(tmp_path))
    # the failed build leaves nothing in the cache, not even its temporary folder
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()] == []


def test_empty_train_split_from_the_cli_is_one_message(tmp_path, corpus_dir, capsys):
    from relmt.cli.common import guarded
    from relmt.cli.prepare import _prepare

    write_text(corpus_dir, "train", [" "] * 3, [""] * 3)
    argv = ["data=text", f"data.dir={corpus_dir}", f"data.cache_dir={tmp_path / 'cache'}", "data.vocab_size=60"]
    assert guarded("relmt-prepare", _prepare, argv) == 2
    err = capsys.readouterr().err
    assert "train.en and" in err and "the training split is empty or all its lines are blank" in err
    assert "Traceback" not in err and "RuntimeError" not in err


def test_empty_toy_and_hf_train_splits_name_the_split(tmp_path):
    with pytest.raises(UserError, match=r"the toy split 'train' \(data\.toy\): the training split is empty"):
        prepare(DataConfig(toy=ToyConfig(n_train=0, n_valid=5, n_test=5, n_test_long=5), cache_dir=str(tmp_path)))
    path = tmp_path / "blank"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"en": ["", " "], "de": ["  ", ""]}),
        "validation": datasets.Dataset.from_dict({"en": EN[:3], "de": DE[:3]}),
    }).save_to_disk(str(path))
    cfg = hf_cfg(tmp_path, path, hf_name=None, splits={"train": "train", "valid": "validation"})
    with pytest.raises(UserError, match=r"split 'train' of .*blank \(data\.splits\.train=train\): the training"):
        prepare(cfg)


def test_training_split_dropped_entirely_is_an_error(tmp_path, corpus_dir):
    """Every pair has an empty target: spm trains on the sources, then no training pair is left."""
    write_text(corpus_dir, "train", EN * 3, [""] * 24)
    with pytest.raises(UserError, match=r"train\.de .*every one of the 24 training pairs would be dropped "
                                        r"\(24 for an empty side\)"):
        prepare(text_cfg(tmp_path))


# --- sentencepiece normalisation -------------------------------------------------------------------

SPECIAL = ["wait for it …", "add ½ a cup", "a ﬁne ﬁsh", "page\u00a012", "the cat … sits"]
ROUND_TRIP = "the dog … eats ½ of a ﬁne ﬁsh on page\u00a012"  # each character mid-sentence


def special_corpus(tmp_path) -> None:
    d = tmp_path / "corpus"
    write_text(d, "train", (EN + SPECIAL) * 3, (DE + SPECIAL) * 3)
    write_text(d, "valid", EN[:3], DE[:3])
    write_text(d, "test", [ROUND_TRIP], [ROUND_TRIP])


def test_default_normalization_round_trips_the_text(tmp_path):
    """spm's default nmt_nfkc wrote '…' as '...', '½' as '1⁄2', 'ﬁ' as 'fi', U+00A0 as a space."""
    special_corpus(tmp_path)
    cfg = text_cfg(tmp_path, spm_model_type=SpmModel.bpe, vocab_size=120)
    assert cfg.spm_normalization == SpmNormalization.identity
    corpus = prepare(cfg)
    tok = corpus.tokenizer
    assert tok.decode(tok.encode([ROUND_TRIP])) == [ROUND_TRIP]
    ids = corpus.ids("test")  # the cached encoding too
    assert tok.decode([ids.tgt.tolist()]) == [ROUND_TRIP]
    assert corpus.meta["config"]["spm_normalization"] == "identity"


def test_normalization_is_configurable_and_in_the_cache_key(tmp_path):
    special_corpus(tmp_path)
    default = text_cfg(tmp_path, spm_model_type=SpmModel.bpe, vocab_size=120)
    nfkc = text_cfg(tmp_path, spm_model_type=SpmModel.bpe, vocab_size=120,
                    spm_normalization=SpmNormalization.nmt_nfkc)
    assert cache_key(nfkc) != cache_key(default)
    tok = prepare(nfkc).tokenizer
    assert tok.decode(tok.encode([ROUND_TRIP])) == ["the dog ... eats 1⁄2 of a fine fish on page 12"]

def test_lowercase_is_stored_in_the_model_and_keeps_eszett(tmp_path):
    """data.lowercase (Wu et al. 2021's data are lowercased): the rule travels inside the sentencepiece
    model, so a tokenizer loaded from it alone lowercases its input; 'ß' stays, unlike nfkc_cf's 'ss'."""
    d = tmp_path / "corpus"
    upper = ["Der Mann auf der Straße", "Zwei ÄRZTE gehen", "Ein Hund läuft"]
    write_text(d, "train", (EN + upper) * 3, (DE + upper) * 3)
    write_text(d, "valid", EN[:3], DE[:3])
    write_text(d, "test", EN[:3], DE[:3])
    cfg = text_cfg(tmp_path, spm_model_type=SpmModel.bpe, vocab_size=120, lowercase=True)
    assert cache_key(cfg) != cache_key(text_cfg(tmp_path, spm_model_type=SpmModel.bpe, vocab_size=120))
    corpus = prepare(cfg)
    loaded = Tokenizer("spm.model", model=corpus.tokenizer.model_bytes())
    assert loaded.decode(loaded.encode(["Der Mann auf der STRASSE und der Straße"])) == [
        "der mann auf der strasse und der straße"]
    assert all(p == p.lower() for p in (loaded.sp.id_to_piece(i) for i in range(loaded.vocab_size)))


def test_lowercase_needs_the_identity_rule(tmp_path):
    with pytest.raises(ValueError, match=r"data\.lowercase: needs data\.spm_normalization=identity \(got nfkc\)"):
        text_cfg(tmp_path, lowercase=True, spm_normalization=SpmNormalization.nfkc)


def test_lowercase_rules_map_each_character_to_str_lower():
    rows = dict(line.split("\t") for line in lowercase_rules().splitlines())
    assert rows["41"] == "61" and rows["C4"] == "E4" and rows["130"] == "69 307"  # A, Ä, İ -> i + dot
    assert "DF" not in rows and "61" not in rows  # ß and a stay
    assert all(chr(int(k, 16)).lower() == "".join(chr(int(c, 16)) for c in v.split()) for k, v in rows.items())


# --- Hugging Face sources, offline: local data of the same shape as the Hub datasets ---------

WMT_README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
---
"""


def wmt_rows(en, de):
    return [{"translation": {"de": d, "en": e}} for e, d in zip(en, de)]


@pytest.fixture
def wmt_local(tmp_path):
    """A local copy of the wmt/wmt14 repo layout: parquet files per config, README with configs."""
    root = tmp_path / "wmt14"
    (root / "de-en").mkdir(parents=True)
    (root / "README.md").write_text(WMT_README)
    for split, (en, de) in {"train": (EN * 3, DE * 3), "validation": (EN[:3], DE[:3]),
                            "test": (EN[3:6], DE[3:6])}.items():
        shard = root / "de-en" / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_list(wmt_rows(en, de)).to_parquet(str(shard))
    return root


def hf_cfg(tmp_path, path, **kw) -> DataConfig:
    args = dict(name="wmt", source=Source.hf, hf_path=str(path), hf_name="de-en", src="en", tgt="de",
                splits={"train": "train", "valid": "validation", "test": "test"}, vocab_size=60,
                spm_model_type=SpmModel.word, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**args, **kw})


def test_wmt_translation_rows_through_load_dataset(tmp_path, wmt_local):
    pairs = load_pairs(hf_cfg(tmp_path, wmt_local))
    assert pairs["valid"]["src"] == EN[:3] and pairs["valid"]["tgt"] == DE[:3]
    de_en = load_pairs(hf_cfg(tmp_path, wmt_local, src="de", tgt="en"))
    assert de_en["test"]["src"] == DE[3:6] and de_en["test"]["tgt"] == EN[3:6]
    corpus = prepare(hf_cfg(tmp_path, wmt_local))
    assert len(corpus.splits["train"]) == 24


def test_save_to_disk_and_column_per_language(tmp_path):
    """Multi30k's shape (columns en, de) from a DatasetDict.save_to_disk folder."""
    path = tmp_path / "multi30k"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"en": EN * 3, "de": DE * 3}),
        "validation": datasets.Dataset.from_dict({"en": EN[:3], "de": DE[:3]}),
    }).save_to_disk(str(path))
    splits = {"train": "train", "valid": "validation"}
    pairs = load_pairs(hf_cfg(tmp_path, path, hf_name=None, splits=splits))
    assert pairs["valid"]["tgt"] == DE[:3]
    with pytest.raises(UserError, match=r"data\.tgt=fr: .* has languages \['de', 'en'\]"):
        load_pairs(hf_cfg(tmp_path, path, hf_name=None, tgt="fr", splits=splits))


def test_hf_unknown_split_and_language(tmp_path, wmt_local):
    with pytest.raises(UserError, match=r"data\.splits\.valid=dev: .* has splits"):
        load_pairs(hf_cfg(tmp_path, wmt_local, splits={"train": "train", "valid": "dev"}))
    with pytest.raises(UserError, match=r"data\.src=cs: .* has languages \['de', 'en'\]"):
        load_pairs(hf_cfg(tmp_path, wmt_local, src="cs"))



def test_hf_nul_and_missing_text_name_split_and_row(tmp_path):
    path = tmp_path / "multi30k"
    splits = {"train": "train", "valid": "validation"}

    def save(train_de):
        datasets.DatasetDict({
            "train": datasets.Dataset.from_dict({"en": EN[:3], "de": train_de}),
            "validation": datasets.Dataset.from_dict({"en": EN[:3], "de": DE[:3]}),
        }).save_to_disk(str(path))

    save([DE[0], "ein h\x00und", DE[2]])
    with pytest.raises(UserError, match=r"multi30k, split 'train', row 1 \(counting from 0\), data\.tgt=de: NUL"):
        load_pairs(hf_cfg(tmp_path, path, hf_name=None, splits=splits))
    save([DE[0], DE[1], None])
    with pytest.raises(UserError, match=r"split 'train', row 2 \(counting from 0\): no text for data\.tgt=de"):
        load_pairs(hf_cfg(tmp_path, path, hf_name=None, splits=splits))

def test_hub_unreachable_gives_a_clear_error(tmp_path):
    with pytest.raises(UserError, match=r"could not load wmt/wmt14 \(config de-en\).*local copy"):
        load_pairs(hf_cfg(tmp_path, "wmt/wmt14"))


def test_config_requires_train_and_valid_splits():
    with pytest.raises(ValueError, match=r"data\.splits: must map 'valid'"):
        DataConfig(source=Source.text, dir="x", splits={"train": "train"})
    with pytest.raises(ValueError, match=r"data\.dir"):
        DataConfig(source=Source.text, splits=dict(SPLITS))


# --- relmt-prepare -------------------------------------------------------------------------------

def test_prepare_cli_summary_on_toy(tmp_path, capsys):
    from relmt.cli.common import guarded
    from relmt.cli.prepare import _prepare

    argv = [f"data.cache_dir={tmp_path}", "data.toy.n_train=300", "data.toy.n_valid=20",
            "data.toy.n_test=20", "data.toy.n_test_long=20"]
    assert guarded("relmt-prepare", _prepare, argv) == 0
    out = capsys.readouterr().out
    for split in ("train", "valid", "test", "test_long"):  # a table row each (cells padded to the column)
        assert re.search(rf"^\| {split} +\| (300|20) +\|", out, re.M), out
    assert "vocabulary:" in out and "built in" in out


@pytest.mark.parametrize("argv,message", [
    (["data=text", "data.dir=/no/such/dir"], "data.dir=/no/such/dir: no such directory; point data.dir= at the "
                                             "folder of the {split}.{en,de} files"),
    (["experiment=multi30k_cpu", "data.dir=/no/multi30k"], "data.dir=/no/multi30k: no such directory (Multi30k: "
                                                           "`data/get_multi30k.sh /no/multi30k` downloads it there)"),
    (["data.vocab_size=2"], "data.vocab_size: must be >= 8"),
    (["data.source=web"], "Invalid value 'web'"),
    (["data.nonsense=1"], "Could not override 'data.nonsense'"),
    (["data=text"], "data.dir"),  # mandatory value left at ???
])
def test_prepare_cli_bad_input_is_one_clear_message(argv, message, capsys):
    from relmt.cli.common import guarded
    from relmt.cli.prepare import _prepare

    assert guarded("relmt-prepare", _prepare, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("relmt-prepare: error:") and message in err
    assert "Traceback" not in err
