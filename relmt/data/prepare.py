"""`relmt-prepare`: build (or load) the vocabulary and encoded cache, and print a summary."""

from __future__ import annotations

import time

from tabulate import tabulate

from relmt.config import DataConfig
from relmt.data.dataset import Corpus, prepare


def summary(corpus: Corpus, seconds: float) -> str:
    """A markdown table of the splits (pairs, kept, dropped and why, average lengths) and the cache."""
    rows = []
    for name in corpus.splits:
        ids = corpus.ids(name)
        st = corpus.meta["splits"][name]
        dropped = ", ".join(f"{n} ({why})" for why, n in st["dropped"].items()) or "0"
        # the mean length from the offsets' ends: np.diff of them would be a copy as long as the split
        avg = [f"{int(o[-1] - o[0]) / len(ids):.1f}" if len(ids) else "0.0" for o in (ids.src_offsets, ids.tgt_offsets)]
        rows.append([name, st["pairs"], st["kept"], dropped, *avg])
    table = tabulate(rows, headers=["split", "pairs", "kept", "dropped", "avg source tokens (with EOS)",
                                    "avg target tokens"], tablefmt="github", disable_numparse=True)
    meta = corpus.meta
    vocab = meta.get("vocab")  # caches built before issue 74 do not count the pieces in use
    in_train = (f"; {vocab['in_train']:,} of its {vocab['pieces']:,} text pieces (the special ids aside) occur "
                "in the training data" if vocab else "")
    return (f"{table}\n\nvocabulary: {corpus.tokenizer.vocab_size} pieces ({corpus.tokenizer.path}){in_train}\n"
            f"cache: {corpus.dir}\n"
            f"built in {meta['seconds_total']:.1f}s (sentencepiece {meta['seconds_spm']:.1f}s); "
            f"this call took {seconds:.1f}s")


def run(cfg: DataConfig) -> Corpus:
    t0 = time.perf_counter()
    corpus = prepare(cfg)
    print(summary(corpus, time.perf_counter() - t0))
    return corpus
