"""Raw sentence pairs from any supported corpus, as a `datasets.DatasetDict` of `src`/`tgt` strings.

Four sources yield the same shape (`DataConfig.source`):
- toy: the synthetic language pair of relmt.data.toy, generated from a seed;
- text: a folder of `{split}.{lang}` files, line i of one aligned with line i of the other, read in step a
  block at a time and written to Arrow as they are read (load_pairs' workdir): memory does not grow with them;
- hf: `datasets.load_dataset` on a Hub id (WMT14, Multi30k, ...), or a local copy of the same
  shape: a `save_to_disk` folder or a folder of parquet/json files. Rows are either
  `{"translation": {lang: text}}` (WMT) or one column per language (Multi30k);
- corpora: several of the above (`data.corpora`): their training splits in one, with a `corpus`
  column saying whose each pair is (relmt/data/mix.py draws from them by weight); the evaluation
  splits as `{corpus}_{split}`, but for the valid split of `data.valid_corpus`, which is `valid`.
  With `data.lang_tags` every source starts with its pair's target-language tag, `<2xx>`.
Bad input (a missing file, unequal line counts, invalid UTF-8, a NUL character, a missing value, an
unknown split or language) raises `UserError` naming the file and line, or the split and row, or the
key. Other control characters are kept, with a warning that says how many and where the first is.
"""

from __future__ import annotations

import copy
import itertools
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.compute as pc
from datasets.table import InMemoryTable, MemoryMappedTable

from relmt.config import DataConfig, Source, source_checkout
from relmt.data.tokenizer import lang_tag
from relmt.errors import UserError

log = logging.getLogger(__name__)
# Unicode control characters (category Cc) other than tab, LF and CR (line ends). They are kept,
# since real corpora hold a few, but reported: with spm_normalization=identity they reach the model.
CONTROL = "\x01-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
_CONTROL_RE = re.compile(f"[{CONTROL}]")


def load_pairs(cfg: DataConfig, workdir: Path | None = None) -> datasets.DatasetDict:
    """{canonical split: Dataset with columns src, tgt}; toy splits are train/valid/test/test_long.

    Text files are read in step, a block at a time, into Arrow files in `workdir` (relmt-prepare's build
    folder), so that memory does not grow with the corpus; without a workdir, into tables in memory.
    source=corpora's training split is written there too, with its `corpus` column. Hugging Face data stay
    in datasets' cache, toy data in memory."""
    if cfg.source == Source.corpora:
        return _corpora(cfg, workdir)
    if cfg.source == Source.toy:
        return _toy(cfg)
    if cfg.source == Source.text:
        return _text(cfg, workdir)
    return _hf(cfg)


def _toy(cfg: DataConfig) -> datasets.DatasetDict:
    from relmt.data import toy

    t = cfg.toy
    splits = toy.generate(seed=t.seed, n_train=t.n_train, n_valid=t.n_valid, n_test=t.n_test,
                          n_test_long=t.n_test_long, max_words=t.max_words)
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict({"src": [s for s, _ in pairs], "tgt": [t for _, t in pairs]})
        for name, pairs in splits.items()
    })


BOM = "\ufeff"


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file, without line endings."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    return decode_lines(path.read_bytes(), str(path))


def decode_lines(data: bytes, name: str, first_line: int = 1) -> list[str]:
    """UTF-8 bytes -> lines without line endings; invalid UTF-8 names `name` and the line, counting
    the first line of `data` as `first_line` (a chunk of a longer input). A byte-order mark that opens
    the file (first_line 1) is removed with a warning. Splits on '\\n' only: splitlines() would also
    split on U+2028 and friends and misalign a parallel corpus."""
    control = _ControlTally()
    lines = _decode(data, name, first_line, control)
    control.warn(name)
    return lines


class _ControlTally:
    """The control characters met in an input read in chunks: how many, and the line and character of the first."""

    def __init__(self) -> None:
        self.n, self.first = 0, None

    def add(self, text: str, first_line: int) -> None:
        first = _CONTROL_RE.search(text)
        if first is None:
            return
        self.n += len(_CONTROL_RE.findall(text, first.start()))
        if self.first is None:
            self.first = (text.count("\n", 0, first.start()) + first_line, first.group())

    def warn(self, name: str) -> None:
        if self.n:
            log.warning("%s: %d control character(s), the first on line %d (U+%04X); they are kept as they are",
                        name, self.n, self.first[0], ord(self.first[1]))


def _decode(data: bytes, name: str, first_line: int, control: _ControlTally) -> list[str]:
    """decode_lines, the control characters counted into `control` instead of warned about."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + first_line
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise UserError(f"{name}:{line}: invalid UTF-8 (byte {column} of the line: {e.reason})") from None
    if first_line == 1 and text.startswith(BOM):  # Python's utf-8-sig: U+FEFF would become a vocabulary piece
        text = text[1:]  # and split the first word of line 1
        log.warning("%s: removed the UTF-8 byte-order mark (U+FEFF) at the start of the file", name)
    nul = text.find("\0")
    if nul >= 0:  # a binary or UTF-16 file; sentencepiece would silently turn it into <unk>
        line = text.count("\n", 0, nul) + first_line
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise UserError(f"{name}:{line}: NUL character (character {column} of the line); is this a binary "
                        "or UTF-16 file? Text must be UTF-8 without NUL")
    control.add(text, first_line)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start a new one
    return [line[:-1] if line.endswith("\r") else line for line in lines]


BLOCK_BYTES = 1 << 22  # iter_lines reads a file this many bytes at a time (and whole lines beyond)


def iter_lines(path: Path, block: int | None = None) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file, as read_lines gives them, in runs of whole lines read `block` bytes at a
    time: the file is never in memory at once. The same checks and messages as read_lines (invalid UTF-8 and
    NUL name the file and line; the byte-order mark opening it is removed with a warning); the control
    characters are counted over the whole file and warned about once, when it has been read to its end."""
    name, line, control, pending, block = str(path), 1, _ControlTally(), [], block or BLOCK_BYTES
    with path.open("rb") as f:
        while data := f.read(block):
            cut = data.rfind(b"\n") + 1  # a chunk ends at a line end: b"\n" is never inside a UTF-8 character
            if not cut:  # a line longer than the block
                pending.append(data)
                continue
            lines = _decode(b"".join([*pending, data[:cut]]), name, line, control)
            pending = [data[cut:]] if cut < len(data) else []
            line += len(lines)
            yield lines
        if pending:  # the last line, without a final newline
            yield _decode(b"".join(pending), name, line, control)
    control.warn(name)


def corpus_config(cfg: DataConfig, i: int) -> DataConfig:
    """Corpus i of data.corpora as a one-corpus data config, for loading it and naming its files in errors
    (a copy: a corpus without a valid split is not a complete data config of its own)."""
    c = cfg.corpora[i]
    sub = copy.copy(cfg)
    sub.__dict__.update(name=c.name, source=c.source, src=c.src or cfg.src, tgt=c.tgt or cfg.tgt,
                        splits=dict(c.splits), dir=c.dir, hf_path=c.hf_path, hf_name=c.hf_name,
                        hf_revision=c.hf_revision, toy=c.toy, corpora=[], valid_corpus="", lang_tags=False)
    return sub


def valid_corpus(cfg: DataConfig) -> str:
    """The corpus whose valid split validates: data.valid_corpus, or the first with a valid split."""
    return cfg.valid_corpus or next(c.name for c in cfg.corpora if c.source == Source.toy or "valid" in c.splits)


def _corpora(cfg: DataConfig, workdir: Path | None = None) -> datasets.DatasetDict:
    out, trains, primary = {}, [], valid_corpus(cfg)
    for i, c in enumerate(cfg.corpora):
        sub = corpus_config(cfg, i)
        try:
            raw = load_pairs(sub, workdir)
        except UserError as e:  # its messages name the one-corpus keys (data.dir=...): say whose they are
            raise UserError(f"data.corpora[{i}] ({c.name}): {e}") from None
        for name in [n for n, d in raw.items() if c.source == Source.toy and n not in ("train", "valid")
                     and len(d) == 0]:
            log.info("the toy split '%s' of %s is empty (data.corpora[%d].toy.n_%s=0): left out", name, c.name, i,
                     name)
            del raw[name]
        if cfg.lang_tags:  # an empty source stays empty: the empty-pair filter still sees it
            tag = lang_tag(sub.tgt)
            raw = datasets.DatasetDict({n: d.map(lambda b, tag=tag: {"src": [f"{tag} {s}" if s.strip() else s
                                                                             for s in b["src"]]},
                                                 batched=True, desc=f"tag {c.name} {n}")
                                        for n, d in raw.items()})
        trains.append(raw["train"])
        for name, ds in raw.items():
            if name != "train":
                out["valid" if name == "valid" and c.name == primary else f"{c.name}_{name}"] = ds
    log.info("corpora: %s", ", ".join(f"{c.name} ({len(t)} training pairs, weight {c.weight:g})"
                                      for c, t in zip(cfg.corpora, trains)))
    return datasets.DatasetDict({"train": _labelled(trains, workdir, cfg.name), **out})


LABELLED_SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string()), ("corpus", pa.int64())])


def _labelled(trains: list[datasets.Dataset], workdir: Path | None, stem: str) -> datasets.Dataset:
    """The corpora's training splits one after the other, with a `corpus` column: the index of each pair's
    corpus. With a workdir, one Arrow file written batch by batch (so that relmt-prepare reads it as a file,
    not a memory map: record_batches)."""
    if workdir is None:
        return datasets.concatenate_datasets([t.add_column("corpus", [i] * len(t)) for i, t in enumerate(trains)])
    workdir.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{stem}-train-", suffix=".arrow", dir=workdir)
    os.close(fd)
    with pa.ipc.new_stream(path, LABELLED_SCHEMA) as writer:
        for i, train in enumerate(trains):
            for table in record_batches(train):
                columns = [table.column("src").cast(pa.string()), table.column("tgt").cast(pa.string()),
                           pa.repeat(pa.scalar(i, pa.int64()), len(table))]
                writer.write_table(pa.Table.from_arrays(columns, schema=LABELLED_SCHEMA))
    return datasets.Dataset.from_file(path)


def origin(cfg: DataConfig, name: str) -> str:
    """Where the canonical split `name` comes from, for error messages: its files, or its source split."""
    if cfg.source == Source.corpora:
        if name == "train":
            return f"the training splits of data.corpora ({', '.join(c.name for c in cfg.corpora)})"
        primary = valid_corpus(cfg)
        for i, c in enumerate(cfg.corpora):
            if name == "valid" and c.name == primary:
                return f"{origin(corpus_config(cfg, i), 'valid')} of data.corpora[{i}] ({c.name})"
            if name.startswith(f"{c.name}_") and name[len(c.name) + 1:] in (c.splits or ("test", "test_long")):
                return f"{origin(corpus_config(cfg, i), name[len(c.name) + 1:])} of data.corpora[{i}] ({c.name})"
        return f"the split '{name}' of data.corpora"
    if cfg.source == Source.toy:
        return f"the toy split '{name}' (data.toy)"
    split = cfg.splits[name]
    if cfg.source == Source.text:
        folder = Path(cfg.dir)
        return (f"{folder / f'{split}.{cfg.src}'} and {folder / f'{split}.{cfg.tgt}'} "
                f"(data.splits.{name}={split})")
    return f"split '{split}' of {cfg.hf_path} (data.splits.{name}={split})"


def multi30k_advice(folder: str) -> str:
    """How to fetch Multi30k into `folder`: the checkout's script, or (the wheel lacks it) what it does."""
    if source_checkout() is not None:
        return f" (Multi30k: `data/get_multi30k.sh {folder}` downloads it there)"
    return (" (Multi30k: download the raw files of github.com/multi30k/dataset, data/task1/raw/{train,val,"
            "test_2016_flickr,test_2017_flickr,test_2017_mscoco}.{en,de}.gz, gunzip them into it and rename val "
            "to valid and test_2016_flickr to test)")


def _text(cfg: DataConfig, workdir: Path | None = None) -> datasets.DatasetDict:
    folder = Path(cfg.dir)
    if not folder.is_dir():
        hint = multi30k_advice(cfg.dir) if "multi30k" in str(cfg.dir) else ""
        raise UserError(f"data.dir={cfg.dir}: no such directory{hint}; point data.dir= at the folder of the "
                        f"{{split}}.{{{cfg.src},{cfg.tgt}}} files")
    out = {}
    for name, split in cfg.splits.items():
        paths = [folder / f"{split}.{lang}" for lang in (cfg.src, cfg.tgt)]
        for key, lang, path in (("data.src", cfg.src, paths[0]), ("data.tgt", cfg.tgt, paths[1])):
            if not path.is_file():
                present = sorted(p.name for p in folder.iterdir() if p.is_file())
                raise UserError(f"{path}: no such file (split '{split}' from data.splits.{name}, "
                                f"language '{lang}' from {key}); {folder} holds {present}")
        out[name] = pairs_dataset(aligned_lines(*paths), workdir, f"{cfg.name}-{name}")
    return datasets.DatasetDict(out)


# Rows of a record batch written by pairs_dataset and read by record_batches. It also orders sentencepiece's input
# (each batch's sources, then its targets) as ds.iter(batch_size=10_000) did before issue 74: the sample, and so the
# vocabulary, depend on that order (tests/test_prepare_stream.py).
BATCH_ROWS = 10_000
PAIR_SCHEMA = pa.schema([("src", pa.string()), ("tgt", pa.string())])


def aligned_lines(src: Path, tgt: Path, rows: int = BATCH_ROWS) -> Iterator[tuple[list[str], list[str]]]:
    """The lines of two line-aligned files, read in step, `rows` pairs at a time (iter_lines: neither file is
    ever in memory). A side that ends first is an error naming both files and their line counts."""
    sides = [itertools.chain.from_iterable(iter_lines(path)) for path in (src, tgt)]
    done = 0
    while True:
        s, t = (list(itertools.islice(side, rows)) for side in sides)
        if len(s) != len(t):  # the rest of the longer file is read (and checked) to count its lines
            n_src, n_tgt = (done + len(x) + sum(1 for _ in side) for x, side in zip((s, t), sides))
            raise UserError(f"{src} has {n_src} lines but {tgt} has {n_tgt}: "
                            "the two sides of a split must be line-aligned")
        if not s:
            return
        done += len(s)
        yield s, t


def pairs_dataset(batches: Iterable[tuple[list[str], list[str]]], workdir: Path | None,
                  stem: str) -> datasets.Dataset:
    """A Dataset of src/tgt strings from (sources, targets) batches. With a `workdir`, an Arrow file in it,
    written batch by batch (the corpus is never in memory; record_batches reads it back the same way); without
    one, a table in memory."""
    def batch(src: list[str], tgt: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([pa.array(src, pa.string()), pa.array(tgt, pa.string())],
                                          schema=PAIR_SCHEMA)

    if workdir is None:
        return datasets.Dataset(InMemoryTable(pa.Table.from_batches([batch(s, t) for s, t in batches], PAIR_SCHEMA)))
    workdir.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=f"{stem}-", suffix=".arrow", dir=workdir)
    os.close(fd)
    with pa.ipc.new_stream(path, PAIR_SCHEMA) as writer:
        for s, t in batches:
            writer.write_batch(batch(s, t))
    return datasets.Dataset.from_file(path)


def arrow_file(ds: datasets.Dataset) -> str | None:
    """The Arrow file whose rows and columns are exactly `ds`'s (Dataset.from_file, as pairs_dataset and
    datasets.map make them), or None."""
    table = ds.data
    if (ds._indices is None and isinstance(table, MemoryMappedTable)
            and all(op == "replace_schema_metadata" for op, *_ in table.replays)):
        return table.path
    return None


def record_batches(ds: datasets.Dataset, rows: int = BATCH_ROWS) -> Iterator[pa.Table]:
    """`ds`'s rows as tables of `rows` rows (the last one shorter), as `ds.with_format("arrow").iter(rows)`
    gives them. A dataset that is one Arrow file is read from the file instead of its memory map: each page of
    a mapped file that has been read counts in the process's resident memory until the file is unmapped, so
    one pass over the map of a 10M-pair corpus would add gigabytes to relmt-prepare's peak. Others (Hugging
    Face data, toy data in memory) go through the map."""
    path = arrow_file(ds)
    if path is None:
        yield from ds.with_format("arrow").iter(batch_size=rows)
        return
    with pa.OSFile(path) as f:
        reader = pa.ipc.open_stream(f)
        if reader.schema.names != ds.column_names:  # not the file it seemed: read the dataset instead
            yield from ds.with_format("arrow").iter(batch_size=rows)
            return
        held: list[pa.RecordBatch] = []  # the file's batches may have another size (datasets.map writes 1000)
        n = 0
        for batch in reader:
            held.append(batch)
            n += batch.num_rows
            while n >= rows:
                table = pa.Table.from_batches(held, reader.schema)
                yield table.slice(0, rows)
                held, n = table.slice(rows).to_batches(), n - rows
        if n:
            yield pa.Table.from_batches(held, reader.schema)


def _load_hf(cfg: DataConfig) -> datasets.DatasetDict:
    path = Path(cfg.hf_path)
    try:
        if (path / "dataset_dict.json").is_file():  # a DatasetDict.save_to_disk folder
            return datasets.load_from_disk(str(path))
        loaded = datasets.load_dataset(cfg.hf_path, cfg.hf_name, revision=cfg.hf_revision,
                                       cache_dir=str(Path(cfg.cache_dir) / "hf"))
    except (ConnectionError, FileNotFoundError, ValueError) as e:
        where = f"{cfg.hf_path}" + (f" (config {cfg.hf_name})" if cfg.hf_name else "")
        raise UserError(
            f"data.hf_path: could not load {where}: {type(e).__name__}: {e}. Without access to the "
            "Hugging Face Hub, point data.hf_path at a local copy: a save_to_disk folder or a folder "
            "of parquet/json files with the same columns.") from None
    if isinstance(loaded, datasets.Dataset):
        return datasets.DatasetDict({"train": loaded})
    return loaded


def _hf(cfg: DataConfig) -> datasets.DatasetDict:
    loaded = _load_hf(cfg)
    out = {}
    for name, split in cfg.splits.items():
        if split not in loaded:
            raise UserError(f"data.splits.{name}={split}: {cfg.hf_path} has splits {sorted(loaded)}")
        ds = loaded[split]
        if "translation" in ds.column_names:  # WMT rows: {"translation": {"de": ..., "en": ...}}
            ds = ds.flatten()
            columns = {f"translation.{cfg.src}": "src", f"translation.{cfg.tgt}": "tgt"}
            languages = sorted(c.split(".", 1)[1] for c in ds.column_names if c.startswith("translation."))
        else:  # one column per language (Multi30k: en, de)
            columns = {cfg.src: "src", cfg.tgt: "tgt"}
            languages = sorted(ds.column_names)
        for key, lang in (("data.src", cfg.src), ("data.tgt", cfg.tgt)):
            if lang not in languages:
                raise UserError(f"{key}={lang}: split '{split}' of {cfg.hf_path} has languages {languages}")
        ds = ds.select_columns(list(columns)).rename_columns(columns)
        _check_hf_text(ds, cfg, split)
        out[name] = ds
    return datasets.DatasetDict(out)


def _check_hf_text(ds: datasets.Dataset, cfg: DataConfig, split: str) -> None:
    """Missing values and NUL characters are errors, naming the split and row, as in text files.
    Arrow compute scans the columns in place: WMT14 en-fr's 40M rows would take minutes in Python."""
    if len(ds.data) != len(ds):  # an indices mapping: rows of ds.data are not rows of ds
        ds = ds.flatten_indices()
    for side, key, lang in (("src", "data.src", cfg.src), ("tgt", "data.tgt", cfg.tgt)):
        column: pa.ChunkedArray = ds.data.column(side)
        where = f"{cfg.hf_path}, split '{split}'"
        row = pc.index(pc.is_null(column), True).as_py()
        if row >= 0:
            raise UserError(f"{where}, row {row} (counting from 0): no text for {key}={lang}")
        # one scan for NUL and the other control characters alike (about 0.3 s per million rows);
        # the rare split with a hit is scanned again to tell them apart
        if not pc.any(pc.match_substring_regex(column, f"[\0{CONTROL}]")).as_py():
            continue
        row = pc.index(pc.match_substring(column, "\0"), True).as_py()
        if row >= 0:
            raise UserError(f"{where}, row {row} (counting from 0), {key}={lang}: NUL character; "
                            "text must not contain NUL")
        control = pc.match_substring_regex(column, f"[{CONTROL}]")
        n = pc.sum(control).as_py()
        if n:
            log.warning("%s, %s=%s: %d row(s) hold control characters, the first is row %d; they are kept "
                        "as they are", where, key, lang, n, pc.index(control, True).as_py())
