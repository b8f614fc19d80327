"""Prepared data: the sentencepiece model and every split encoded to token ids, cached on disk.

`prepare(cfg)` returns a `Corpus`. The first call trains the vocabulary on the training split,
encodes every split (in data.num_proc processes), filters the training pairs, and saves all of it
under `cache_dir/<name>-<hash>`: the sentences as Arrow, the token ids as flat .npy arrays. Each
step streams, a batch of 10,000 pairs at a time: text files are read in step into Arrow
(relmt/data/sources.py), sentencepiece samples `spm_input_sentence_size` sentences from them, and
each encoded batch is appended to the .npy files and the sentences' Arrow file as it comes, all
read from files rather than memory maps, so that memory does not grow with the corpus (issue 74).
The hash covers the source, languages, splits, vocabulary and filter settings, and for local data
the files' sizes and contents (not their paths or times: a copied corpus reuses the cache).
Later calls with the same settings load that folder in well under a second. The token ids are
memory-mapped, so the ranks of a DDP job share one copy in the page cache instead of each holding
the whole training split in RAM.

Sweep jobs may share a cache_dir. A build happens under a file lock (one per cache entry), in a
fresh temporary folder, and is published by one rename once complete: a published entry is never
rewritten or removed, and a job that finds it being built waits for it.

Training pairs are dropped when a side is empty, longer than `max_tokens_per_side`, or the length
ratio exceeds `max_length_ratio`; the log and the cache's meta.json say how many for each reason.
Evaluation splits are never filtered: their references must stay line-aligned.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from filelock import FileLock, Timeout

from relmt.config import DataConfig, Source
from relmt.data.sources import load_pairs, origin, record_batches
from relmt.data.tokenizer import EOS_ID, Tokenizer, lang_tag, train_tokenizer
from relmt.errors import UserError

log = logging.getLogger(__name__)
# 2: token ids as .npy files beside text-only Arrow; local files keyed by content, not mtime
CACHE_VERSION = 2
KEEP, EMPTY, TOO_LONG, RATIO, SRC_WORDS = 0, 1, 2, 3, 4
REASONS = {EMPTY: "an empty side", TOO_LONG: "longer than max_tokens_per_side", RATIO: "length ratio",
           SRC_WORDS: "source longer than train_max_src_words"}
ID_ARRAYS = ("src", "src_offsets", "tgt", "tgt_offsets")  # the fields of SplitIds, one .npy each


@dataclass(frozen=True)
class SplitIds:
    """One split's token ids as flat arrays: example i's source is src[src_offsets[i]:src_offsets[i+1]].
    From a Corpus the arrays are read-only memory maps of the cache's .npy files."""

    src: np.ndarray  # (total source tokens,) int32, each sentence ending in EOS
    src_offsets: np.ndarray  # (n + 1,) int64
    tgt: np.ndarray  # (total target tokens,) int32, without BOS/EOS
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lens(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lens(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)


@dataclass
class Corpus:
    """The prepared corpus: tokenizer, the sentences of each split (columns src, tgt), token ids, meta."""

    dir: Path
    tokenizer: Tokenizer
    splits: dict[str, datasets.Dataset]
    meta: dict

    def ids(self, split: str) -> SplitIds:
        """The split's token ids, memory-mapped: pages are read on use and shared between processes."""
        if split not in self.splits:
            raise KeyError(f"{split}: not a split of {self.dir} (splits: {sorted(self.splits)})")
        # Plain ndarray views of the np.memmap (still no copy): slicing an np.memmap costs about 3x
        # more, and collate slices once per example.
        return SplitIds(*(np.load(self.dir / "ids" / f"{split}.{a}.npy", mmap_mode="r").view(np.ndarray)
                          for a in ID_ARRAYS))

    def corpus_labels(self, split: str = "train") -> np.ndarray | None:
        """source=corpora: the index in data.corpora of each pair of `split`; None for one corpus."""
        path = self.dir / "ids" / f"{split}.corpus.npy"
        return np.load(path) if path.is_file() else None

    def texts(self, split: str, side: str) -> list[str]:
        """The raw sentences of one side ('src' or 'tgt'): references for BLEU."""
        return self.splits[split].data.column(side).to_pylist()


# --- the cache key ---------------------------------------------------------------------------------

HASHES_FILE = ".file-hashes.json"  # in cache_dir: content hashes of local corpus files, see _file_hashes


def _sha256(path: Path) -> str:
    h, buf = hashlib.sha256(), bytearray(1 << 20)
    view = memoryview(buf)
    with path.open("rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _file_hashes(paths: list[Path], cache_dir: Path) -> list[str]:
    """sha256 of each file's content, remembered in cache_dir by (path, size, mtime, ctime, inode).

    Every prepare() call (every run, every rank) computes the cache key, and sha256 of a 100 MB file
    in the page cache took 0.06-0.1 s on one core (1-1.6 GB/s; slower from disk or NFS): a 10 GB
    local WMT14 en-fr would cost seconds to minutes per call. So a file is hashed again only when
    its metadata changes; a copy (new inode and times) is hashed once and keys the same.
    """
    memo_path = cache_dir / HASHES_FILE
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):  # absent, or garbled by a crash: it is only a memo
        memo = {}
    out, changed = [], False
    for path in paths:
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        key = str(path.resolve())
        entry = memo.get(key)
        if not isinstance(entry, dict) or entry.get("stamp") != stamp:
            entry = {"stamp": stamp, "sha256": _sha256(path)}
            memo[key], changed = entry, True
        out.append(entry["sha256"])
    if changed:  # write-then-rename: concurrent jobs may lose each other's entries, never see half a file
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f"{HASHES_FILE}.", dir=cache_dir)
            with os.fdopen(fd, "w") as f:
                json.dump(memo, f, indent=0, sort_keys=True)
            os.replace(tmp, memo_path)
        except OSError as e:  # a read-only shared cache still serves its published entries
            log.info("could not remember file hashes in %s: %s", memo_path, e)
    return out


def _local_files(cfg: DataConfig) -> list[tuple[str, int, str]] | None:
    """(name, size, sha256) of the local files the corpus is read from, or None for toy and Hub data."""
    if cfg.source == Source.text:
        root = Path(cfg.dir)
        # only the files load_pairs reads: adding an unrelated file to the folder keeps the cache
        files = [root / f"{split}.{lang}" for split in cfg.splits.values() for lang in (cfg.src, cfg.tgt)]
        files = sorted({p for p in files if p.is_file()})
    elif cfg.source == Source.hf and Path(cfg.hf_path).exists():
        root = Path(cfg.hf_path)
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    else:
        return None
    hashes = _file_hashes(files, Path(cfg.cache_dir))
    return [(str(p.relative_to(root)) if p != root else p.name, p.stat().st_size, h)
            for p, h in zip(files, hashes)]


def cache_key(cfg: DataConfig) -> str:
    """A hash of everything that decides the prepared data (not num_proc, cache_dir, the evaluation-only
    length_buckets, or subword regularisation, sampled from the cached ids). Local data counts by content: where
    it lies does not matter."""
    ignored = ("num_proc", "cache_dir", "name", "length_buckets", "spm_alpha", "spm_nbest")  # sampled on the fly
    settings = {k: v for k, v in asdict(cfg).items() if k not in ignored}
    for key, default in (("corpora", []), ("valid_corpus", ""), ("lang_tags", False)):  # added by issue 61: a
        if settings[key] == default:  # config without them keeps its cache key (and its runs their resume)
            del settings[key]
    if cfg.source == Source.corpora:  # each corpus by its content; the weights only decide the draws
        from relmt.data.sources import corpus_config

        settings["corpora"] = [_corpus_key(corpus_config(cfg, i), c) for i, c in enumerate(settings["corpora"])]
    if cfg.source != Source.toy:
        settings.pop("toy")
    if cfg.source == Source.toy or any(c.source == Source.toy for c in cfg.corpora):
        from relmt.data import toy

        settings["toy_code"] = hashlib.sha256(Path(toy.__file__).read_bytes()).hexdigest()
    files = _local_files(cfg)
    if files is not None:
        settings.pop("dir" if cfg.source == Source.text else "hf_path")
        settings["files"] = files
    settings["version"] = CACHE_VERSION
    blob = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _corpus_key(sub: DataConfig, corpus: dict) -> dict:
    """One corpus's part of the cache key: its settings without its weight, its local files by content."""
    out = {k: v for k, v in corpus.items() if k != "weight"}
    if sub.source != Source.toy:
        out.pop("toy")
    if (files := _local_files(sub)) is not None:
        out.pop("dir" if sub.source == Source.text else "hf_path")
        out["files"] = files
    return out


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Tokenizer:
    return Tokenizer(path)


def _encode(batch: dict, model_path: str, max_tokens: int, max_ratio: float, max_src_words: int = 0) -> dict:
    """datasets.map function: ids for both sides, and why (if at all) the filters would drop a pair."""
    tok = _tokenizer(model_path)
    src, tgt = tok.encode(batch["src"]), tok.encode(batch["tgt"])
    drop = []
    for s_text, t_text, s, t in zip(batch["src"], batch["tgt"], src, tgt):
        if not s_text.strip() or not t_text.strip():
            reason = EMPTY
        elif max_src_words and len(s_text.split()) > max_src_words:
            reason = SRC_WORDS
        elif len(s) + 1 > max_tokens or len(t) + 1 > max_tokens:  # +1: EOS / BOS
            reason = TOO_LONG
        elif max_ratio and max(len(s), len(t)) > max_ratio * max(min(len(s), len(t)), 1):
            reason = RATIO
        else:
            reason = KEEP
        drop.append(reason)
    return {"src_ids": [s + [EOS_ID] for s in src], "tgt_ids": tgt, "drop": drop}


def _training_sentences(ds: datasets.Dataset) -> Iterator[str]:
    for batch in record_batches(ds):  # read from the file, not its memory map (record_batches says why)
        yield from (s for s in batch.column("src").to_pylist() if s.strip())
        yield from (t for t in batch.column("tgt").to_pylist() if t.strip())


def _encode_arrays(src: list[str], tgt: list[str], **kwargs) -> tuple[np.ndarray, ...]:
    """_encode on one batch, as flat arrays: source ids (with EOS) and their lengths, target ids and their
    lengths, and each pair's drop reason. A worker's answer: arrays pickle in one piece, lists item by item."""
    out = _encode({"src": src, "tgt": tgt}, **kwargs)
    arrays = []
    for ids in (out["src_ids"], out["tgt_ids"]):
        lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        arrays += [np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lens.sum())), lens]
    return (*arrays, np.asarray(out["drop"], dtype=np.int8))


class _NpyWriter:
    """A 1-D .npy file written piece by piece: a split's ids are never in memory at once. The same bytes as
    np.save of the whole array: the header is written again with the length at the end, and keeps its size
    (numpy pads a header for a length of any number of digits, so that it can be rewritten in place)."""

    def __init__(self, path: Path, dtype: type) -> None:
        self.dtype, self.n = np.dtype(dtype), 0
        self.file = path.open("wb")
        self._header()
        self.start = self.file.tell()

    def _header(self) -> None:
        np.lib.format.write_array_header_1_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                         "fortran_order": False, "shape": (self.n,)})

    def write(self, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        self.file.write(values.data)
        self.n += len(values)

    def close(self) -> None:
        self.file.seek(0)
        self._header()
        assert self.file.tell() == self.start, "the .npy header changed size"
        self.file.close()


class _IdsWriter:
    """One side of a split's SplitIds (`{split}.{side}.npy` and `{split}.{side}_offsets.npy`), appended to."""

    def __init__(self, folder: Path, split: str, side: str) -> None:
        self.values = _NpyWriter(folder / f"{split}.{side}.npy", np.int32)
        self.offsets = _NpyWriter(folder / f"{split}.{side}_offsets.npy", np.int64)
        self.offsets.write(np.zeros(1, dtype=np.int64))
        self.total = 0

    def write(self, ids: np.ndarray, lens: np.ndarray) -> None:
        ends = self.total + np.cumsum(lens, dtype=np.int64)
        self.offsets.write(ends)
        self.values.write(ids)
        self.total = int(ends[-1]) if len(ends) else self.total

    def close(self) -> None:
        assert self.values.n == self.total, (self.values.n, self.total)
        self.values.close()
        self.offsets.close()


TEXT_FEATURES = datasets.Features({"src": datasets.Value("string"), "tgt": datasets.Value("string")})


def _text_files(folder: Path, names: list[str]) -> dict[str, Path]:
    """`encoded/` as DatasetDict.save_to_disk writes it (state.json, dataset_info.json, one data file per split),
    the data files holding no rows yet: _encode_split writes each split's sentences into its file as it encodes
    them. (save_to_disk of the encoded splits would read every sentence once more, through a memory map.)"""
    empty = datasets.DatasetDict({n: datasets.Dataset.from_dict({"src": [], "tgt": []}, features=TEXT_FEATURES)
                                  for n in names})
    empty.save_to_disk(str(folder), num_shards=dict.fromkeys(names, 1))
    files = {}
    for n in names:
        (data,) = json.loads((folder / n / "state.json").read_text())["_data_files"]
        files[n] = folder / n / data["filename"]
    return files


def _encoded(ds: datasets.Dataset, kwargs: dict, pool, num_proc: int) -> Iterator[tuple[pa.Table, tuple]]:
    """(batch, _encode_arrays of it) for each batch of `ds`, in order; in `pool`'s worker processes if given,
    at most 2 * num_proc batches at a time (Pool.imap would read the whole split ahead into its queue)."""
    batches = record_batches(ds)
    if pool is None:
        for batch in batches:
            yield batch, _encode_arrays(batch.column("src").to_pylist(), batch.column("tgt").to_pylist(), **kwargs)
        return
    pending: deque = deque()
    for batch in batches:
        pending.append((batch, pool.apply_async(_encode_arrays, (batch.column("src").to_pylist(),
                                                                 batch.column("tgt").to_pylist()), kwargs)))
        if len(pending) >= 2 * num_proc:
            done, result = pending.popleft()
            yield done, result.get()
    while pending:
        done, result = pending.popleft()
        yield done, result.get()


def _encode_split(cfg: DataConfig, name: str, ds: datasets.Dataset, out: Path, text_file: Path, kwargs: dict,
                  pool, num_proc: int) -> dict:
    """Encode one split a batch at a time, appending its ids to ids/*.npy and its sentences to `text_file`
    (only the pairs kept: the training split's filters drop pairs, the evaluation splits keep all); return its
    stats for meta.json. Nothing grows with the split but the counts."""
    train, by_corpus = name == "train", "corpus" in ds.column_names  # corpus: source=corpora's whose-pair column
    sides = {side: _IdsWriter(out / "ids", name, side) for side in ("src", "tgt")}
    labels = _NpyWriter(out / "ids" / f"{name}.corpus.npy", np.int16) if by_corpus else None
    reasons = np.zeros(max(REASONS) + 1, dtype=np.int64)
    n_corpora = len(cfg.corpora)
    corpus_pairs, corpus_kept = np.zeros(n_corpora, dtype=np.int64), np.zeros(n_corpora, dtype=np.int64)
    with pa.OSFile(str(text_file)) as f:
        schema = pa.ipc.open_stream(f).schema  # save_to_disk's, with datasets' features in its metadata
    with pa.OSFile(str(text_file), "wb") as sink, pa.ipc.new_stream(sink, schema) as texts:
        for batch, (src, src_lens, tgt, tgt_lens, drop) in _encoded(ds, kwargs, pool, num_proc):
            reasons += np.bincount(drop, minlength=len(reasons))
            keep = drop == KEEP if train and (drop != KEEP).any() else None
            if keep is not None:
                src, src_lens = src[np.repeat(keep, src_lens)], src_lens[keep]
                tgt, tgt_lens = tgt[np.repeat(keep, tgt_lens)], tgt_lens[keep]
            sides["src"].write(src, src_lens)
            sides["tgt"].write(tgt, tgt_lens)
            table = pa.Table.from_arrays([batch.column(c).cast(pa.string()) for c in ("src", "tgt")], schema=schema)
            texts.write_table(table if keep is None else table.filter(pa.array(keep)))
            if by_corpus:
                corpus = batch.column("corpus").to_numpy().astype(np.int16)
                corpus_pairs += np.bincount(corpus, minlength=n_corpora)
                corpus = corpus if keep is None else corpus[keep]
                corpus_kept += np.bincount(corpus, minlength=n_corpora)
                labels.write(corpus)
    for writer in (*sides.values(), *([labels] if labels else [])):
        writer.close()
    pairs = int(reasons.sum())
    if train:
        dropped = {REASONS[r]: int(reasons[r]) for r in REASONS if reasons[r]}
        if pairs and not reasons[KEEP]:
            raise UserError(
                f"{origin(cfg, 'train')}: every one of the {pairs} training pairs would be dropped "
                f"({', '.join(f'{n} for {why}' for why, n in dropped.items())}); see "
                f"data.max_tokens_per_side={cfg.max_tokens_per_side} and "
                f"data.max_length_ratio={cfg.max_length_ratio}")
        kept, empty = int(reasons[KEEP]), 0
    else:  # evaluation splits keep every pair
        dropped, kept, empty = {}, pairs, int(reasons[EMPTY])
    stats = {"pairs": pairs, "kept": kept, "dropped": dropped, "empty_kept": empty}
    if by_corpus:
        stats["by_corpus"] = {c.name: {"pairs": int(corpus_pairs[i]), "kept": int(corpus_kept[i])}
                              for i, c in enumerate(cfg.corpora)}
    return stats


N_SPECIAL = 4  # PAD, UNK, BOS, EOS (relmt/data/tokenizer.py): ids below it are no pieces of the text


def pieces_in_use(folder: Path, split: str, vocab_size: int) -> int:
    """How many of the vocabulary's pieces (the special ids left out) occur in a split's encoded ids, both
    sides, read in chunks (WMT's are gigabytes), from the file rather than its memory map: the pages of a map
    that have been read count in the process's resident memory."""
    seen = np.zeros(vocab_size, dtype=bool)
    for side in ("src", "tgt"):
        path = folder / f"{split}.{side}.npy"
        ids = np.load(path, mmap_mode="r")  # its header only: where the values start, and how many
        offset, n, dtype = ids.offset, len(ids), ids.dtype
        del ids
        with path.open("rb") as f:
            f.seek(offset)
            for start in range(0, n, 1 << 22):
                seen[np.fromfile(f, dtype=dtype, count=min(1 << 22, n - start))] = True
    return int(seen[N_SPECIAL:].sum())


def vocab_advice(cfg: DataConfig, pieces: int, in_use: int) -> str | None:
    """A warning when under half of the vocabulary's pieces (`pieces`, specials left out) occur in the training
    data: the others are embedding and output rows that training never sees. It suggests a data.vocab_size, the
    pieces in use with the special ids, rounded up to a multiple of 8 (a smaller vocabulary makes sentencepiece
    merge fewer pieces, so most of a vocabulary of that size does occur)."""
    if in_use * 2 >= pieces:
        return None
    suggested = -(-(in_use + N_SPECIAL) // 8) * 8
    return (f"data.vocab_size={cfg.vocab_size}: only {in_use:,} of the vocabulary's {pieces:,} pieces occur in the "
            "training data (on few sentences, sentencepiece makes pieces its own encoding never uses), so the other "
            f"{pieces - in_use:,} are embedding rows training never updates; try data.vocab_size={suggested} (the "
            f"pieces in use and the {N_SPECIAL} special ids, rounded up to a multiple of 8)")


def _drop_or_refuse_empty_splits(cfg: DataConfig, raw: datasets.DatasetDict) -> None:
    """Refuse an empty evaluation split, naming its files: validation needs pairs, and an empty test
    split would end in datasets' KeyError (a map over no rows adds no columns). The toy's test
    splits are the exception: data.toy.n_test=0 (or n_test_long=0) is how one asks for none."""
    for name in [n for n, ds in raw.items() if n != "train" and len(ds) == 0]:
        if cfg.source == Source.toy and name != "valid":
            log.info("the toy split '%s' is empty (data.toy.n_%s=0): left out", name, name)
            del raw[name]
        elif cfg.source == Source.toy:
            raise UserError(f"{origin(cfg, name)}: the validation split is empty; set data.toy.n_valid >= 1")
        elif name == "valid":
            raise UserError(f"{origin(cfg, name)}: the validation split is empty, and validation (best.pt) "
                            "needs it: put sentence pairs in them (one sentence per line, aligned), or map "
                            "data.splits.valid to another split")
        else:
            raise UserError(f"{origin(cfg, name)}: the test split '{name}' is empty; put sentence pairs in it, "
                            f"or leave it out with ~data.splits.{name} on the command line")


RAW = "raw"  # the build folder's folder of the text splits as read (load_pairs' workdir); removed once encoded


def _worker_pool(num_proc: int):
    """data.num_proc processes for encoding, forked where the platform can (as datasets.map's were): the
    parent's imports are already there."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None).Pool(num_proc)


def _build(cfg: DataConfig, out: Path) -> dict:
    t0 = time.perf_counter()
    raw = load_pairs(cfg, out / RAW)
    log.info("loaded %s: %s", cfg.name, {name: len(ds) for name, ds in raw.items()})
    _drop_or_refuse_empty_splits(cfg, raw)
    t_load = time.perf_counter()
    # sentencepiece fails on no input with a RuntimeError from C++; say which files are empty instead
    sentences = _training_sentences(raw["train"])
    first = next(sentences, None)
    if first is None:
        raise UserError(f"{origin(cfg, 'train')}: the training split is empty or all its lines are blank "
                        f"({len(raw['train'])} pairs); the vocabulary and the model are trained on it")
    spm_path = out / "spm.model"
    train_tokenizer(itertools.chain([first], sentences), spm_path, cfg.vocab_size, cfg.spm_model_type.value,
                    cfg.spm_character_coverage, cfg.spm_input_sentence_size, num_threads=max(cfg.num_proc, 2),
                    normalization=cfg.spm_normalization.value, lowercase=cfg.lowercase,
                    user_symbols=sorted({lang_tag(tgt) for _, tgt in cfg.pairs()}) if cfg.lang_tags else ())
    t_spm = time.perf_counter()
    (out / "ids").mkdir()
    text_files = _text_files(out / "encoded", list(raw))
    kwargs = dict(model_path=str(spm_path), max_tokens=cfg.max_tokens_per_side, max_ratio=cfg.max_length_ratio,
                  max_src_words=cfg.train_max_src_words)
    stats = {}
    with contextlib.ExitStack() as stack:
        pool = None
        for name, ds in raw.items():
            if pool is None and cfg.num_proc > 1 and len(ds) >= 10_000:  # below, starting workers costs more
                pool = stack.enter_context(_worker_pool(cfg.num_proc))
            stats[name] = _encode_split(cfg, name, ds, out, text_files[name], kwargs,
                                        pool if len(ds) >= 10_000 else None, cfg.num_proc)
    t_encode = time.perf_counter()
    size = Tokenizer(spm_path).vocab_size
    vocab = {"pieces": size - N_SPECIAL, "in_train": pieces_in_use(out / "ids", "train", size)}
    if advice := vocab_advice(cfg, vocab["pieces"], vocab["in_train"]):
        log.warning(advice)
    del raw
    shutil.rmtree(out / RAW, ignore_errors=True)  # the text splits as read (Arrow): the cache keeps encoded/
    t_end = time.perf_counter()
    return {"seconds_total": t_end - t0, "seconds_load": t_load - t0, "seconds_spm": t_spm - t_load,
            "seconds_encode": t_encode - t_spm, "seconds_save": t_end - t_encode,
            "pairs_total": sum(st["pairs"] for st in stats.values()), "splits": stats, "vocab": vocab}


def _publish(cfg: DataConfig, final: Path) -> None:
    """Build the cache entry `final` unless another job has; called with the entry's lock held.

    The build goes to a fresh mkdtemp folder (a pid-named one can collide across hosts on shared
    storage) and becomes `final` in one rename, meta.json written last: whoever sees final/meta.json
    sees a complete entry, and nothing is ever removed from or written into a published one.
    """
    if (final / "meta.json").is_file():  # built by the job we waited for
        return
    if final.exists():
        raise UserError(f"{final}: a cache folder without meta.json, so not one relmt published (copied in "
                        "part, or edited?); remove it and run again")
    # Holding the lock, no other job is building this entry: temp folders of its name were left by
    # builds that were killed.
    stale = sorted(final.parent.glob(f".tmp-{final.name}-*"))
    for old in stale:
        shutil.rmtree(old, ignore_errors=True)
    if stale:
        log.warning("removed %d temporary folder(s) left by an interrupted build of %s", len(stale), final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    # mkdtemp makes the folder private (0700); the published entry gets the cache_dir's own mode, so
    # a cache shared by a group stays readable by it
    os.chmod(tmp, final.parent.stat().st_mode & 0o7777)
    try:
        meta = _build(cfg, tmp)
        meta.update(config=json.loads(json.dumps(asdict(cfg), default=str)), cache_version=CACHE_VERSION,
                    datasets_version=datasets.__version__)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed build; gone already after the rename


_ANNOUNCED: set[Path] = set()  # the cache folders whose place has been logged in this process


def prepare(cfg: DataConfig) -> Corpus:
    """Build the vocabulary and encoded splits for `cfg`, or load them from the cache."""
    t0 = time.perf_counter()
    root = Path(cfg.cache_dir)
    where = root.absolute()
    if where not in _ANNOUNCED:  # once: the default depends on where relmt is installed
        _ANNOUNCED.add(where)
        # relative to the working directory when under it, so that a log kept with results names no machine
        shown = where.relative_to(Path.cwd()) if where.is_relative_to(Path.cwd()) else where
        log.info("data cache: %s (data.cache_dir=... to put it elsewhere)", shown)
    final = root / f"{cfg.name}-{cache_key(cfg)}"
    built = False
    if not (final / "meta.json").is_file():  # published entries are complete: loading needs no lock
        root.mkdir(parents=True, exist_ok=True)
        # flock, which works across hosts on NFSv4 and most cluster file systems; filelock falls back
        # to an exclusive-create lock where flock is missing
        lock = FileLock(root / f".{final.name}.lock")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            log.info("waiting for another job building %s (lock %s)", final, lock.lock_file)
            lock.acquire()
        try:
            built = not (final / "meta.json").is_file()
            _publish(cfg, final)
        finally:
            lock.release()
    meta = json.loads((final / "meta.json").read_text())
    splits = dict(datasets.load_from_disk(str(final / "encoded")))
    corpus = Corpus(final, _tokenizer(str(final / "spm.model")), splits, meta)
    for name, st in meta["splits"].items():
        for reason, n in st["dropped"].items():
            log.warning("%s: dropped %d of %d pairs (%s)", name, n, st["pairs"], reason)
        for part, c in st.get("by_corpus", {}).items():
            if c["kept"] < c["pairs"]:
                log.warning("%s: dropped %d of corpus %s's %d pairs", name, c["pairs"] - c["kept"], part, c["pairs"])
        if st["empty_kept"]:
            log.warning("%s: %d pairs with an empty side kept (evaluation splits are never filtered)",
                        name, st["empty_kept"])
    log.info("%s data %s in %.1fs: %s", "built" if built else "loaded cached", final,
             time.perf_counter() - t0, {n: len(d) for n, d in splits.items()})
    return corpus
