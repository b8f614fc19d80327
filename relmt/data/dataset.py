"""Prepared data: the sentencepiece model and every split encoded to token ids, cached on disk.

`prepare(cfg)` returns a `Corpus`. The first call trains the vocabulary on the training split,
encodes every split with `datasets.map(batched=True, num_proc=...)`, filters the training pairs,
and saves all of it under `cache_dir/<name>-<hash>`: the sentences as Arrow, the token ids as flat
.npy arrays. The hash covers the source, languages, splits, vocabulary and filter settings, and for
local data the files' sizes and contents (not their paths or times: a copied corpus reuses the cache).
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

import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock, Timeout

from relmt.config import DataConfig, Source
from relmt.data.sources import load_pairs, origin
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
    for batch in ds.iter(batch_size=10_000):
        yield from (s for s in batch["src"] if s.strip())
        yield from (t for t in batch["tgt"] if t.strip())


def _write_ids(table: pa.Table, keep: np.ndarray | None, folder: Path, split: str) -> None:
    """Write the src_ids/tgt_ids list columns of `table` (rows where `keep`, if given) as the flat
    arrays of SplitIds, one .npy each. Streams chunk by chunk: WMT's are gigabytes."""
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
            flat = chunk.flatten().to_numpy()  # flatten(), not .values: a chunk may be a slice
            values[pos:pos + len(flat)] = flat
            pos += len(flat)
        assert pos == len(values), (split, side, pos, len(values))
        values.flush()
        del values


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


def _build(cfg: DataConfig, out: Path) -> dict:
    t0 = time.perf_counter()
    raw = load_pairs(cfg)
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
    features = datasets.Features({
        "src": datasets.Value("string"), "tgt": datasets.Value("string"),
        "src_ids": datasets.List(datasets.Value("int32")), "tgt_ids": datasets.List(datasets.Value("int32")),
        "drop": datasets.Value("int8"),
    })
    (out / "ids").mkdir()
    stats, texts = {}, {}
    for name, ds in raw.items():
        by_corpus = "corpus" in ds.column_names  # source=corpora's training split: whose each pair is
        ds = ds.map(_encode, batched=True, batch_size=2000, desc=f"encode {name}",
                    features=datasets.Features({**features, "corpus": datasets.Value("int16")}) if by_corpus
                    else features,
                    num_proc=cfg.num_proc if len(ds) >= 10_000 else None,
                    fn_kwargs=dict(model_path=str(spm_path), max_tokens=cfg.max_tokens_per_side,
                                   max_ratio=cfg.max_length_ratio, max_src_words=cfg.train_max_src_words))
        assert len(ds.data) == len(ds)  # map writes a new table: its rows are the dataset's rows
        drop = ds.data.column("drop").to_numpy()
        keep = None
        if name == "train":
            dropped = {REASONS[r]: int((drop == r).sum()) for r in REASONS if (drop == r).any()}
            empty = 0
            if dropped:
                keep = drop == KEEP
            if len(drop) and not (drop == KEEP).any():
                raise UserError(
                    f"{origin(cfg, 'train')}: every one of the {len(drop)} training pairs would be dropped "
                    f"({', '.join(f'{n} for {why}' for why, n in dropped.items())}); see "
                    f"data.max_tokens_per_side={cfg.max_tokens_per_side} and "
                    f"data.max_length_ratio={cfg.max_length_ratio}")
        else:  # evaluation splits keep every pair
            dropped, empty = {}, int((drop == EMPTY).sum())
        _write_ids(ds.data, keep, out / "ids", name)
        stats[name] = {"pairs": len(drop), "kept": int(len(drop) if keep is None else keep.sum()), "dropped": dropped,
                       "empty_kept": empty}
        if by_corpus:
            corpus = ds.data.column("corpus").to_numpy().astype(np.int16)
            np.save(out / "ids" / f"{name}.corpus.npy", corpus if keep is None else corpus[keep])
            names = [c.name for c in cfg.corpora]
            stats[name]["by_corpus"] = {n: {"pairs": int((corpus == i).sum()),
                                            "kept": int((corpus[keep] == i).sum() if keep is not None
                                                        else (corpus == i).sum())} for i, n in enumerate(names)}
            ds = ds.remove_columns(["corpus"])
        ds = ds.remove_columns(["src_ids", "tgt_ids", "drop"])  # the ids live in ids/*.npy
        texts[name] = ds if keep is None else ds.select(np.flatnonzero(keep))
    t_encode = time.perf_counter()
    datasets.DatasetDict(texts).save_to_disk(str(out / "encoded"))
    t_end = time.perf_counter()
    return {"seconds_total": t_end - t0, "seconds_load": t_load - t0, "seconds_spm": t_spm - t_load,
            "seconds_encode": t_encode - t_spm, "seconds_save": t_end - t_encode,
            "pairs_total": sum(st["pairs"] for st in stats.values()), "splits": stats}


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
