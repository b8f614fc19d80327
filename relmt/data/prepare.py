"""`relmt-prepare`: build (or load) the vocabulary and encoded cache, and print a summary."""

from __future__ import annotations

import time

from relmt.bench import markdown_table
from relmt.config import DataConfig
from relmt.data.dataset import Corpus, prepare


def summary(corpus: Corpus, seconds: float) -> str:
    rows = []
    for name in corpus.splits:
        ids = corpus.ids(name)
        st = corpus.meta["splits"][name]
        dropped = ", ".join(f"{n} ({why})" for why, n in st["dropped"].items()) or "0"
        rows.append({"split": name, "pairs": st["pairs"], "kept": st["kept"], "dropped": dropped,
                     "src": float(ids.src_lens.mean()) if len(ids) else 0.0,
                     "tgt": float(ids.tgt_lens.mean()) if len(ids) else 0.0})
    table = markdown_table(rows, [("split", "split"), ("pairs", "pairs"), ("kept", "kept"),
                                  ("dropped", "dropped"), ("src", "avg source tokens (with EOS)"),
                                  ("tgt", "avg target tokens")])
    meta = corpus.meta
    return (f"{table}\n\nvocabulary: {corpus.tokenizer.vocab_size} pieces ({corpus.tokenizer.path})\n"
            f"cache: {corpus.dir}\n"
            f"built in {meta['seconds_total']:.1f}s (sentencepiece {meta['seconds_spm']:.1f}s); "
            f"this call took {seconds:.1f}s")


def run(cfg: DataConfig) -> Corpus:
    t0 = time.perf_counter()
    corpus = prepare(cfg)
    print(summary(corpus, time.perf_counter() - t0))
    return corpus
