"""Prepared data: the sentencepiece model and every split encoded to token ids, cached on disk.

`prepare(cfg)` returns a `Corpus`. The first call trains the vocabulary on the training split,
encodes every split with `datasets.map(batched=True, num_proc=...)` into Arrow, filters the
training pairs, and saves all of it under `cache_dir/<name>-<hash>`, the hash covering the source,
languages, splits, vocabulary and filter settings (and the files' sizes and times for local data).
Later calls with the same settings load that folder (memory-mapped) in well under a second.

Training pairs are dropped when a side is empty, longer than `max_tokens_per_side`, or the length
ratio exceeds `max_length_ratio`; the log and the cache's meta.json say how many for each reason.
Evaluation splits are never filtered: their references must stay line-aligned.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import datasets
import numpy as np

from relmt.config import DataConfig, Source
from relmt.data.sources import load_pairs
from relmt.data.tokenizer import EOS_ID, Tokenizer, train_tokenizer

log = logging.getLogger(__name__)
CACHE_VERSION = 1
KEEP, EMPTY, TOO_LONG, RATIO = 0, 1, 2, 3
REASONS = {EMPTY: "an empty side", TOO_LONG: "longer than max_tokens_per_side", RATIO: "length ratio"}


@dataclass(frozen=True)
class SplitIds:
    """One split's token ids as flat arrays: example i's source is src[src_offsets[i]:src_offsets[i+1]]."""

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
    """The prepared corpus: tokenizer, encoded splits (columns src, tgt, src_ids, tgt_ids), meta."""

    dir: Path
    tokenizer: Tokenizer
    splits: dict[str, datasets.Dataset]
    meta: dict

    def ids(self, split: str) -> SplitIds:
        table = self.splits[split].data
        arrays = []
        for column in ("src_ids", "tgt_ids"):
            col = table.column(column).combine_chunks()
            arrays += [col.values.to_numpy(), col.offsets.to_numpy().astype(np.int64)]
        return SplitIds(*arrays)

    def texts(self, split: str, side: str) -> list[str]:
        """The raw sentences of one side ('src' or 'tgt'): references for BLEU."""
        return self.splits[split].data.column(side).to_pylist()


def _local_files(path: str | None) -> list[tuple[str, int, int]]:
    if not path or not Path(path).exists():
        return []
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [(str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def cache_key(cfg: DataConfig) -> str:
    """A hash of everything that decides the prepared data (not num_proc, cache_dir or the
    evaluation-only length_buckets)."""
    ignored = ("num_proc", "cache_dir", "name", "length_buckets")
    settings = {k: v for k, v in asdict(cfg).items() if k not in ignored}
    if cfg.source != Source.toy:
        settings.pop("toy")
    else:
        from relmt.data import toy

        settings["toy_code"] = hashlib.sha256(Path(toy.__file__).read_bytes()).hexdigest()
    settings["files"] = _local_files(cfg.dir) + _local_files(cfg.hf_path)
    settings["version"] = CACHE_VERSION
    blob = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@lru_cache(maxsize=4)
def _tokenizer(path: str) -> Tokenizer:
    return Tokenizer(path)


def _encode(batch: dict, model_path: str, max_tokens: int, max_ratio: float) -> dict:
    """datasets.map function: ids for both sides, and why (if at all) the filters would drop a pair."""
    tok = _tokenizer(model_path)
    src, tgt = tok.encode(batch["src"]), tok.encode(batch["tgt"])
    drop = []
    for s_text, t_text, s, t in zip(batch["src"], batch["tgt"], src, tgt):
        if not s_text.strip() or not t_text.strip():
            reason = EMPTY
        elif len(s) + 1 > max_tokens or len(t) + 1 > max_tokens:  # +1: EOS / BOS
            reason = TOO_LONG
        elif max_ratio and max(len(s), len(t)) > max_ratio * max(min(len(s), len(t)), 1):
            reason = RATIO
        else:
            reason = KEEP
        drop.append(reason)
    return {"src_ids": [s + [EOS_ID] for s in src], "tgt_ids": tgt, "drop": drop}


def _training_sentences(ds: datasets.Dataset):
    for batch in ds.iter(batch_size=10_000):
        yield from (s for s in batch["src"] if s.strip())
        yield from (t for t in batch["tgt"] if t.strip())


def _build(cfg: DataConfig, out: Path) -> dict:
    t0 = time.perf_counter()
    raw = load_pairs(cfg)
    log.info("loaded %s: %s", cfg.name, {name: len(ds) for name, ds in raw.items()})
    t_load = time.perf_counter()
    spm_path = out / "spm.model"
    train_tokenizer(_training_sentences(raw["train"]), spm_path, cfg.vocab_size, cfg.spm_model_type.value,
                    cfg.spm_character_coverage, cfg.spm_input_sentence_size, num_threads=max(cfg.num_proc, 2))
    t_spm = time.perf_counter()
    features = datasets.Features({
        "src": datasets.Value("string"), "tgt": datasets.Value("string"),
        "src_ids": datasets.List(datasets.Value("int32")), "tgt_ids": datasets.List(datasets.Value("int32")),
        "drop": datasets.Value("int8"),
    })
    stats, encoded = {}, {}
    for name, ds in raw.items():
        ds = ds.map(_encode, batched=True, batch_size=2000, features=features, desc=f"encode {name}",
                    num_proc=cfg.num_proc if len(ds) >= 10_000 else None,
                    fn_kwargs=dict(model_path=str(spm_path), max_tokens=cfg.max_tokens_per_side,
                                   max_ratio=cfg.max_length_ratio))
        drop = ds.data.column("drop").to_numpy()
        if name == "train":
            dropped = {REASONS[r]: int((drop == r).sum()) for r in REASONS if (drop == r).any()}
            empty = 0
            if dropped:
                ds = ds.select(np.flatnonzero(drop == KEEP))
        else:  # evaluation splits keep every pair
            dropped, empty = {}, int((drop == EMPTY).sum())
        stats[name] = {"pairs": len(drop), "kept": len(ds), "dropped": dropped, "empty_kept": empty}
        ds = ds.remove_columns("drop")
        encoded[name] = ds
    t_encode = time.perf_counter()
    datasets.DatasetDict(encoded).save_to_disk(str(out / "encoded"))
    t_end = time.perf_counter()
    return {"seconds_total": t_end - t0, "seconds_load": t_load - t0, "seconds_spm": t_spm - t_load,
            "seconds_encode": t_encode - t_spm, "seconds_save": t_end - t_encode,
            "pairs_total": sum(st["pairs"] for st in stats.values()), "splits": stats}


def prepare(cfg: DataConfig) -> Corpus:
    """Build the vocabulary and encoded splits for `cfg`, or load them from the cache."""
    t0 = time.perf_counter()
    root = Path(cfg.cache_dir)
    final = root / f"{cfg.name}-{cache_key(cfg)}"
    if not (final / "meta.json").is_file():
        tmp = root / f".tmp-{final.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            meta = _build(cfg, tmp)
            meta.update(config=json.loads(json.dumps(asdict(cfg), default=str)), cache_version=CACHE_VERSION,
                        datasets_version=datasets.__version__)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            if not (final / "meta.json").is_file():  # another process may have finished first
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        built = True
    else:
        built = False
    meta = json.loads((final / "meta.json").read_text())
    splits = dict(datasets.load_from_disk(str(final / "encoded")))
    corpus = Corpus(final, _tokenizer(str(final / "spm.model")), splits, meta)
    for name, st in meta["splits"].items():
        for reason, n in st["dropped"].items():
            log.warning("%s: dropped %d of %d pairs (%s)", name, n, st["pairs"], reason)
        if st["empty_kept"]:
            log.warning("%s: %d pairs with an empty side kept (evaluation splits are never filtered)",
                        name, st["empty_kept"])
    log.info("%s data %s in %.1fs: %s", "built" if built else "loaded cached", final,
             time.perf_counter() - t0, {n: len(d) for n, d in splits.items()})
    return corpus
