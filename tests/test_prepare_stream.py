"""relmt-prepare streams plain text (issue 74 §5): the files are read in step a block at a time into Arrow, and
every split is encoded a batch at a time into the .npy files and the sentences' Arrow file. The cache it builds
is the one the former build (the whole corpus in Python lists, datasets.map, save_to_disk) made: the same
vocabulary, ids, sentences and counts, byte for byte where they are files; this module keeps that build as the
reference."""

from __future__ import annotations

import logging
import random
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from relmt.config import CorpusConfig, DataConfig, Source, SpmModel
from relmt.data import dataset as ds_mod
from relmt.data import sources
from relmt.data.dataset import EMPTY, KEEP, REASONS, _encode, prepare
from relmt.data.sources import aligned_lines, arrow_file, iter_lines, load_pairs, read_lines, record_batches
from relmt.data.tokenizer import lang_tag, train_tokenizer
from relmt.errors import UserError

WORDS = "the a cat dog bird sun tree river house small big old new runs sleeps sings flows grows".split()
WÖRTER = "die der ein katze hund vogel sonne baum fluss haus klein groß alt neu rennt schläft singt".split()


def write_corpus(folder: Path, n_train: int = 12_345, seed: int = 0) -> None:
    """A corpus with what the readers and filters must get right: empty lines (one side, both), pairs too long
    and of too high a length ratio, CRLF line ends, a byte-order mark, control characters, U+2028 inside a line,
    and a last line without its newline; the training split longer than one batch (10,000 pairs)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def sentence(words: list[str], n: int) -> str:
        return " ".join(rng.choice(words) for _ in range(n))

    for split, n in (("train", n_train), ("valid", 40), ("test", 30)):
        en, de = [], []
        for i in range(n):
            k = rng.randint(1, 8)
            s, t = sentence(WORDS, k), sentence(WÖRTER, k + rng.randint(-1, 1) or 1)
            kind = i % 97
            if kind == 3:
                s = ""
            elif kind == 5:
                t = "   "
            elif kind == 7:
                s = t = ""
            elif kind == 11:
                s = sentence(WORDS, 30)  # longer than max_tokens_per_side
            elif kind == 13:
                t = sentence(WÖRTER, 8 * k)  # the length ratio
            elif kind == 17:
                s += "\u2028" + sentence(WORDS, 2)  # a line separator inside a line: not a line end
            elif kind == 19:
                t += "\x07"  # a control character, kept with a warning
            en.append(s + ("\r" if kind == 23 else ""))
            de.append(t)
        (folder / f"{split}.en").write_bytes(("\ufeff" if split == "train" else "").encode()
                                             + "\n".join(en).encode() + b"\n")
        (folder / f"{split}.de").write_bytes("\n".join(de).encode())  # no final newline


def cfg_for(tmp_path: Path, **kw) -> DataConfig:
    args = dict(name="stream", source=Source.text, dir=str(tmp_path / "corpus"), src="en", tgt="de",
                splits={"train": "train", "valid": "valid", "test": "test"}, vocab_size=120,
                spm_model_type=SpmModel.bpe, spm_input_sentence_size=6000, max_tokens_per_side=24,
                max_length_ratio=2.5, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**args, **kw})


# --- the former build, kept as the reference ------------------------------------------------------------------

def former_write_ids(table: pa.Table, keep: np.ndarray | None, folder: Path, split: str) -> None:
    for side in ("src", "tgt"):
        column = table.column(f"{side}_ids")
        lens = pc.list_value_length(column).to_numpy()
        if keep is not None:
            lens = lens[keep]
        offsets = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        np.save(folder / f"{split}.{side}_offsets.npy", offsets)
        values = np.lib.format.open_memmap(folder / f"{split}.{side}.npy", mode="w+", dtype=np.int32,
                                           shape=(int(offsets[-1]),))
        pos = row = 0
        for chunk in column.chunks:
            rows = slice(row, row + len(chunk))
            row += len(chunk)
            if keep is not None:
                chunk = chunk.filter(pa.array(keep[rows]))
            flat = chunk.flatten().to_numpy()
            values[pos:pos + len(flat)] = flat
            pos += len(flat)
        values.flush()
        del values


def former_build(cfg: DataConfig, raw: datasets.DatasetDict, out: Path) -> dict:
    """relmt/data/dataset.py's _build before issue 74 §5, on `raw` (loaded in memory as it did)."""
    def sentences():
        for batch in raw["train"].iter(batch_size=10_000):
            yield from (s for s in batch["src"] if s.strip())
            yield from (t for t in batch["tgt"] if t.strip())

    out.mkdir(parents=True)
    spm_path = out / "spm.model"
    train_tokenizer(sentences(), spm_path, cfg.vocab_size, cfg.spm_model_type.value, cfg.spm_character_coverage,
                    cfg.spm_input_sentence_size, num_threads=max(cfg.num_proc, 2),
                    normalization=cfg.spm_normalization.value, lowercase=cfg.lowercase,
                    user_symbols=sorted({lang_tag(tgt) for _, tgt in cfg.pairs()}) if cfg.lang_tags else ())
    features = datasets.Features({
        "src": datasets.Value("string"), "tgt": datasets.Value("string"),
        "src_ids": datasets.List(datasets.Value("int32")), "tgt_ids": datasets.List(datasets.Value("int32")),
        "drop": datasets.Value("int8"),
    })
    (out / "ids").mkdir()
    stats, texts = {}, {}
    for name, ds in raw.items():
        by_corpus = "corpus" in ds.column_names
        ds = ds.map(_encode, batched=True, batch_size=2000,
                    features=datasets.Features({**features, "corpus": datasets.Value("int16")}) if by_corpus
                    else features,
                    fn_kwargs=dict(model_path=str(spm_path), max_tokens=cfg.max_tokens_per_side,
                                   max_ratio=cfg.max_length_ratio, max_src_words=cfg.train_max_src_words))
        drop = ds.data.column("drop").to_numpy()
        keep = None
        if name == "train":
            dropped = {REASONS[r]: int((drop == r).sum()) for r in REASONS if (drop == r).any()}
            empty = 0
            if dropped:
                keep = drop == KEEP
        else:
            dropped, empty = {}, int((drop == EMPTY).sum())
        former_write_ids(ds.data, keep, out / "ids", name)
        stats[name] = {"pairs": len(drop), "kept": int(len(drop) if keep is None else keep.sum()),
                       "dropped": dropped, "empty_kept": empty}
        if by_corpus:
            corpus = ds.data.column("corpus").to_numpy().astype(np.int16)
            np.save(out / "ids" / f"{name}.corpus.npy", corpus if keep is None else corpus[keep])
            stats[name]["by_corpus"] = {c.name: {"pairs": int((corpus == i).sum()),
                                                 "kept": int((corpus[keep] == i).sum() if keep is not None
                                                             else (corpus == i).sum())}
                                        for i, c in enumerate(cfg.corpora)}
            ds = ds.remove_columns(["corpus"])
        ds = ds.remove_columns(["src_ids", "tgt_ids", "drop"])
        texts[name] = ds if keep is None else ds.select(np.flatnonzero(keep))
    datasets.DatasetDict(texts).save_to_disk(str(out / "encoded"))
    return stats


def former_text_pairs(cfg: DataConfig) -> datasets.DatasetDict:
    folder = Path(cfg.dir)
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"src": read_lines(folder / f"{split}.{cfg.src}"),
                                          "tgt": read_lines(folder / f"{split}.{cfg.tgt}")})
        for name, split in cfg.splits.items()})


def assert_same_cache(built: Path, reference: Path, stats: dict, meta: dict) -> None:
    assert (built / "spm.model").read_bytes() == (reference / "spm.model").read_bytes()
    names = sorted(p.name for p in (reference / "ids").iterdir())
    assert sorted(p.name for p in (built / "ids").iterdir()) == names
    for name in names:  # the same .npy bytes: header, dtype, values
        assert (built / "ids" / name).read_bytes() == (reference / "ids" / name).read_bytes(), name
    ours, theirs = datasets.load_from_disk(str(built / "encoded")), datasets.load_from_disk(str(reference / "encoded"))
    assert list(ours) == list(theirs)
    for split in theirs:
        assert ours[split].features == theirs[split].features
        assert ours[split].data.table.equals(theirs[split].data.table), split
    assert meta["splits"] == stats


def test_the_streamed_build_equals_the_former_one(tmp_path, monkeypatch, caplog):
    write_corpus(tmp_path / "corpus")
    cfg = cfg_for(tmp_path)
    raw = former_text_pairs(cfg)
    stats = former_build(cfg, raw, tmp_path / "former")
    dropped = stats["train"]["dropped"]  # every filter is exercised
    assert list(dropped) == ["an empty side", "longer than max_tokens_per_side", "length ratio"]
    assert stats["test"]["empty_kept"] == 3 and stats["train"]["pairs"] > 10_000
    monkeypatch.setattr(sources, "BLOCK_BYTES", 4096)  # many blocks, lines cut by their ends
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        corpus = prepare(cfg)
    assert_same_cache(corpus.dir, tmp_path / "former", stats, corpus.meta)
    assert sorted(p.name for p in corpus.dir.iterdir()) == ["encoded", "ids", "meta.json", "spm.model"]
    # the messages the former reader gave, once per file
    assert caplog.text.count("train.en: removed the UTF-8 byte-order mark") == 1
    n = sum(line.count("\x07") for line in read_lines(Path(cfg.dir) / "train.de"))
    assert f"train.de: {n} control character(s), the first on line 20 (U+0007)" in caplog.text
    assert f"train: dropped {dropped['length ratio']} of 12345 pairs (length ratio)" in caplog.text


def test_worker_processes_build_the_same_cache(tmp_path):
    write_corpus(tmp_path / "corpus", n_train=10_500, seed=1)
    one = prepare(cfg_for(tmp_path, cache_dir=str(tmp_path / "one")))
    two = prepare(cfg_for(tmp_path, cache_dir=str(tmp_path / "two"), num_proc=2))
    assert two.dir.name == one.dir.name  # num_proc is not in the cache key
    assert_same_cache(two.dir, one.dir, one.meta["splits"], two.meta)


def test_corpora_stream_their_training_splits_into_one_with_its_labels(tmp_path):
    write_corpus(tmp_path / "a", n_train=900, seed=2)
    write_corpus(tmp_path / "b", n_train=700, seed=3)
    cfg = DataConfig(name="mixed", source=Source.corpora, src="en", tgt="de", vocab_size=120, lang_tags=True,
                     max_tokens_per_side=24, max_length_ratio=2.5, cache_dir=str(tmp_path / "cache"),
                     corpora=[CorpusConfig(name="a", source=Source.text, dir=str(tmp_path / "a"),
                                           splits={"train": "train", "valid": "valid"}),
                              CorpusConfig(name="b", source=Source.text, dir=str(tmp_path / "b"), weight=2,
                                           splits={"train": "train", "test": "test"})])
    stats = former_build(cfg, load_pairs(cfg), tmp_path / "former")  # in memory: the former concatenation
    corpus = prepare(cfg)
    assert_same_cache(corpus.dir, tmp_path / "former", stats, corpus.meta)
    assert set(stats["train"]["by_corpus"]) == {"a", "b"} and list(corpus.splits) == ["train", "valid", "b_test"]


def test_text_splits_are_arrow_files_read_without_their_memory_map(tmp_path):
    write_corpus(tmp_path / "corpus", n_train=25_000, seed=4)
    cfg = cfg_for(tmp_path)
    raw = load_pairs(cfg, tmp_path / "work")
    reference = former_text_pairs(cfg)
    for name, ds in raw.items():
        path = arrow_file(ds)
        assert path is not None and Path(path).parent == tmp_path / "work"
        assert ds.data.table.equals(reference[name].data.table)
        batches = list(record_batches(ds))
        assert [len(b) for b in batches] == [len(b["src"]) for b in reference[name].iter(batch_size=10_000)]
        assert pa.concat_tables(batches).equals(reference[name].data.table)
    # a dataset that is not the whole file (a selection, other columns) is read through datasets
    train = raw["train"]
    assert arrow_file(train.select(range(5))) is None and arrow_file(train.select_columns(["src"])) is None
    assert list(record_batches(train.select(range(3))))[0].column("src").to_pylist() == reference["train"]["src"][:3]
    # files written 1,000 rows at a time (datasets.map's) are regrouped into 10,000-row batches
    mapped = raw["train"].map(lambda b: b, batched=True)
    assert arrow_file(mapped) is not None
    assert [len(b) for b in record_batches(mapped)] == [10_000, 10_000, 5_000]


@pytest.mark.parametrize("block", [1, 3, 7, 64, 1 << 20])
def test_iter_lines_gives_read_lines_lines_in_any_block_size(tmp_path, block, caplog):
    f = tmp_path / "x.de"
    f.write_bytes("\ufeffeins\r\n\nzwei\u2028drei\x01\n\n\x02vier ünf\n\nlast".encode())
    with caplog.at_level(logging.WARNING):
        whole = read_lines(f)
    expected = caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        streamed = [line for lines in iter_lines(f, block) for line in lines]
    assert streamed == whole == ["eins", "", "zwei\u2028drei\x01", "", "\x02vier ünf", "", "last"]
    assert caplog.text == expected  # the byte-order mark, and 2 control characters from line 3: once each
    assert "2 control character(s), the first on line 3 (U+0001)" in caplog.text


@pytest.mark.parametrize("block", [2, 5, 1 << 20])
def test_streamed_errors_name_the_file_line_and_column(tmp_path, block):
    f = tmp_path / "bad.en"
    f.write_bytes(b"fine\nalso fine\nbroken \xff here\n")
    with pytest.raises(UserError, match=r"bad\.en:3: invalid UTF-8 \(byte 8 of the line"):
        list(iter_lines(f, block))
    f.write_bytes(b"fine\n\nab\x00c\n")
    with pytest.raises(UserError, match=r"bad\.en:3: NUL character \(character 3 of the line\)"):
        list(iter_lines(f, block))


def test_aligned_lines_name_both_files_when_one_ends_first(tmp_path):
    (tmp_path / "a.en").write_text("".join(f"{i}\n" for i in range(7)))
    (tmp_path / "a.de").write_text("".join(f"{i}\n" for i in range(5)))
    with pytest.raises(UserError, match=r"a\.en has 7 lines but .*a\.de has 5: the two sides of a split must be "
                                        "line-aligned"):
        list(aligned_lines(tmp_path / "a.en", tmp_path / "a.de", rows=2))
    (tmp_path / "a.de").write_text("".join(f"{i}\n" for i in range(9)))
    with pytest.raises(UserError, match=r"a\.en has 7 lines but .*a\.de has 9"):
        list(aligned_lines(tmp_path / "a.en", tmp_path / "a.de", rows=100))


@pytest.mark.parametrize("pieces", [[], [[]], [[1, 2, 3]], [[1], [], list(range(1000))]])
def test_npy_writer_writes_what_np_save_does(tmp_path, pieces):
    for dtype in (np.int16, np.int32, np.int64):
        writer = ds_mod._NpyWriter(tmp_path / "w.npy", dtype)
        for piece in pieces:
            writer.write(np.asarray(piece, dtype=np.int64))
        writer.close()
        np.save(tmp_path / "s.npy", np.asarray([x for p in pieces for x in p], dtype=dtype))
        assert (tmp_path / "w.npy").read_bytes() == (tmp_path / "s.npy").read_bytes()


def test_the_memory_benchmark_runs_end_to_end(tmp_path):
    """scripts/bench/prepare_memory.py on a tiny shared-data folder (its figures are not checked here)."""
    import json
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    shared = tmp_path / "shared"
    rng = random.Random(5)
    (shared / "tiny").mkdir(parents=True)
    for lang, words in (("en", WORDS), ("de", WÖRTER)):
        (shared / "tiny" / f"train.{lang}").write_text(
            "".join(" ".join(rng.choice(words) for _ in range(1 + i % 6)) + "\n" for i in range(70)))
    out, md = tmp_path / "m.json", tmp_path / "m.md"
    subprocess.run([sys.executable, str(root / "scripts/bench/prepare_memory.py"), "--shared-data", str(shared),
                    "--corpus", "tiny", "--pairs", "2000", "4000", "--eval-pairs", "5", "--vocab-size", "40",
                    "--work", str(tmp_path), "--out", str(out), "--md", str(md)],
                   check=True, capture_output=True, text=True, cwd=root)
    payload = json.loads(out.read_text())
    assert [r["pairs"] for r in payload["rows"]] == [2000, 4000]
    for row in payload["rows"]:
        assert row["peak_rss_mib"] > 0 and row["tree_rss_mib"] > 0 and row["wall_s"] > 0 and row["processes"] >= 1
        assert row["kept"] == row["pairs"] and row["train_mib"] > 0
    assert payload["verdict"]["pairs_ratio"] == 2 and "memory_goal_met" in payload["verdict"]
    assert payload["command"].startswith("python ") and payload["hardware"]["cpu_count"]
    text = md.read_text()
    assert "| training pairs" in text and "the goal, at most 1.2x, is" in text and "- command: `python" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json", "m.md", "shared"]  # its corpora are gone
