"""The encoded data cache: memory-mapped token ids, content-keyed entries, and concurrent builds."""

from __future__ import annotations

import logging
import mmap
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from relmt.config import DataConfig
from relmt.data import dataset
from relmt.data.dataset import cache_key, prepare
from relmt.data.tokenizer import EOS_ID
from relmt.errors import UserError
from tests.test_data import DE, EN, text_cfg, write_text


def make_corpus(root: Path) -> Path:
    d = root / "corpus"
    # two pairs with an empty side are dropped from train, so its ids must follow the filtered rows
    write_text(d, "train", EN * 3 + ["", "lonely"], DE * 3 + ["leer", ""])
    write_text(d, "valid", EN[:3], DE[:3])
    write_text(d, "test", EN[3:6] + [""], DE[3:6] + [""])
    return d


def published(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith("."))


def temporary(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.startswith(".tmp-"))


def reaches_mmap(a: np.ndarray) -> bool:
    """True when `a` is a view whose base chain ends in an mmap (the file's pages, no copy)."""
    while a is not None:
        if isinstance(a, mmap.mmap):
            return True
        a = getattr(a, "base", None)
    return False


# --- memory-mapped token ids --------------------------------------------------------------------

def test_ids_are_memory_mapped_and_equal_the_encoding(tmp_path):
    make_corpus(tmp_path)
    corpus = prepare(text_cfg(tmp_path))
    tok = corpus.tokenizer
    for split, n in (("train", 24), ("valid", 3), ("test", 4)):
        ids = corpus.ids(split)
        assert len(ids) == n
        for name in ("src", "src_offsets", "tgt", "tgt_offsets"):
            a = getattr(ids, name)
            assert reaches_mmap(a) and not a.flags.writeable, (split, name)
        assert ids.src.dtype == np.int32 and ids.tgt.dtype == np.int32
        assert ids.src_offsets.dtype == np.int64 and ids.tgt_offsets.dtype == np.int64
        # the same ids as encoding the kept sentences now: sources end in EOS, targets have no framing
        src, tgt = corpus.texts(split, "src"), corpus.texts(split, "tgt")
        assert len(src) == n
        want_src = [s + [EOS_ID] for s in tok.encode(src)]
        want_tgt = tok.encode(tgt)
        assert [ids.src[a:b].tolist() for a, b in zip(ids.src_offsets[:-1], ids.src_offsets[1:])] == want_src
        assert [ids.tgt[a:b].tolist() for a, b in zip(ids.tgt_offsets[:-1], ids.tgt_offsets[1:])] == want_tgt
    assert "" not in corpus.texts("train", "src") and "" in corpus.texts("test", "src")


# --- the cache key: content, not paths or times ----------------------------------------------------

def test_copied_corpus_keeps_the_key_and_one_changed_byte_does_not(tmp_path):
    corpus = make_corpus(tmp_path)
    key = cache_key(text_cfg(tmp_path))
    # a copy elsewhere has new paths, inodes and modification times, and the same content
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(corpus, copy, copy_function=shutil.copy)
    assert os.stat(copy / "train.en").st_mtime_ns != os.stat(corpus / "train.en").st_mtime_ns
    assert cache_key(text_cfg(tmp_path, dir=str(copy))) == key
    os.utime(corpus / "valid.de", ns=(1, 1))  # touched, not changed
    assert cache_key(text_cfg(tmp_path)) == key
    # one byte changed, same size, modification time put back: the inode's ctime still moves on
    path = corpus / "valid.de"
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[0] = ord("D")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    assert cache_key(text_cfg(tmp_path)) != key
    # a file the config does not read does not count
    (copy / "notes.txt").write_text("unrelated")
    assert cache_key(text_cfg(tmp_path, dir=str(copy))) == key


def test_file_hashes_are_remembered_until_a_file_changes(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path)
    key = cache_key(text_cfg(tmp_path))

    def no_hashing(*args, **kwargs):
        raise AssertionError("hashed a file whose hash is remembered")

    monkeypatch.setattr(dataset, "_sha256", no_hashing)
    assert cache_key(text_cfg(tmp_path)) == key  # every file from the memo
    write_text(corpus, "test", EN[3:7], DE[3:7])
    with pytest.raises(AssertionError, match="hashed a file"):
        cache_key(text_cfg(tmp_path))


# --- concurrent builds ----------------------------------------------------------------------------

def _prepare_in_child(cfg: DataConfig, barrier, builds: str, results) -> None:
    """One sweep job: count the builds it runs, wait for the other job, then prepare."""
    from relmt.data import dataset

    build = dataset._build

    def counted(cfg: DataConfig, out: Path) -> dict:
        (Path(builds) / str(os.getpid())).touch()
        return build(cfg, out)

    dataset._build = counted
    barrier.wait()  # both jobs find no cache and ask for it together
    corpus = dataset.prepare(cfg)
    results.put((str(corpus.dir), len(corpus.ids("train")), corpus.texts("valid", "tgt")))


def test_two_processes_build_one_cache(tmp_path):
    make_corpus(tmp_path)
    cfg = text_cfg(tmp_path)
    builds = tmp_path / "builds"
    builds.mkdir()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    jobs = [ctx.Process(target=_prepare_in_child, args=(cfg, barrier, str(builds), results)) for _ in range(2)]
    for job in jobs:
        job.start()
    got = [results.get(timeout=300) for _ in jobs]  # a bound against a hang, not a timing
    for job in jobs:
        job.join()
        assert job.exitcode == 0
    cache = tmp_path / "cache"
    assert [dir for dir, _, _ in got] == [str(cache / published(cache)[0])] * 2
    assert all(n == 24 and valid == DE[:3] for _, n, valid in got)
    assert len(published(cache)) == 1 and temporary(cache) == []
    assert len(list(builds.iterdir())) == 1  # the second job waited for the first and loaded its cache


def test_leftovers_of_a_killed_build_are_removed(tmp_path, caplog):
    make_corpus(tmp_path)
    cfg = text_cfg(tmp_path)
    cache = tmp_path / "cache"
    dead = cache / f".tmp-{cfg.name}-{cache_key(cfg)}-4242"
    (dead / "encoded").mkdir(parents=True)
    with caplog.at_level(logging.WARNING):
        corpus = prepare(cfg)
    assert "removed 1 temporary folder(s) left by an interrupted build" in caplog.text
    assert temporary(cache) == [] and published(cache) == [corpus.dir.name]
    # built in a private mkdtemp folder, published with the cache folder's permissions
    assert corpus.dir.stat().st_mode & 0o7777 == cache.stat().st_mode & 0o7777


def test_an_unpublished_folder_is_never_removed(tmp_path):
    """A folder with the entry's name but no meta.json is not ours to delete: say so and stop."""
    make_corpus(tmp_path)
    cfg = text_cfg(tmp_path)
    final = tmp_path / "cache" / f"{cfg.name}-{cache_key(cfg)}"
    (final / "encoded").mkdir(parents=True)
    (final / "keep.txt").write_text("someone's")
    with pytest.raises(UserError, match=r"a cache folder without meta\.json.*remove it and run again"):
        prepare(cfg)
    assert (final / "keep.txt").read_text() == "someone's"


def test_the_cache_is_named_relative_to_the_working_directory_when_under_it(tmp_path, monkeypatch, caplog):
    """A training log kept beside results (docs/results/**/train.log) then names no machine's folders."""
    make_corpus(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dataset, "_ANNOUNCED", set())
    with caplog.at_level(logging.INFO, logger="relmt.data.dataset"):
        prepare(text_cfg(tmp_path))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("data cache:"))
    assert line == "data cache: cache (data.cache_dir=... to put it elsewhere)"
