"""Word alignments from cross-attention (issue 60): each target piece links to the source piece its
attention weighs most (the source's EOS left out), and pieces link as the words they belong to, as
fairseq's --print-alignment and OpenNMT-py's report_align read them. The weights come from one
decoder layer, its heads averaged (relmt.decode.reference.score_references, `attention_layer`);
which layer aligns best was measured on the toy corpus, whose generator knows the gold alignments
(docs/results/decoding/alignments.md). Links are Pharaoh "i-j": source word i, target word j,
0-based over whitespace-separated words of the source as given and of the target as returned, sorted."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

WORD_START = "\u2581"  # sentencepiece's mark of a piece that begins a word


def word_of_pieces(pieces: list[str]) -> list[int]:
    """The 0-based word each piece belongs to: a piece that begins with WORD_START starts the next word."""
    words, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        words.append(word)
    return words


def words_of_text(ids: list[int], decode: Callable[[list[int]], str]) -> list[int | None]:
    """The 0-based word of the decoded text `decode(ids)` each output piece writes into, None for a piece that
    writes only whitespace (a lone WORD_START): the words a Pharaoh file's reader counts in the returned text,
    where sentencepiece writes <unk> as " ⁇ ", a word of its own, which counting WORD_START would miss."""
    words: list[int | None] = []
    before = ""
    for i in range(len(ids)):
        text = decode(ids[: i + 1]).rstrip()
        words.append(len(text.split()) - 1 if text != before else None)
        before = text
    return words


def word_links(attention: np.ndarray, src_pieces: list[str], tgt_pieces: list[str],
               tgt_words: list[int | None] | None = None) -> list[tuple[int, int]]:
    """Source-target word links from attention (>= |y|, >= |x|): rows the target pieces (EOS's row after them is
    ignored), columns the source pieces (the EOS column after them is ignored). tgt_words: each target piece's word
    in the returned text (`words_of_text`; default: counted by WORD_START); a piece of no word links nothing."""
    if not src_pieces or not tgt_pieces:
        return []
    best = attention[: len(tgt_pieces), : len(src_pieces)].argmax(axis=1)
    src_words = word_of_pieces(src_pieces)
    tgt_words = word_of_pieces(tgt_pieces) if tgt_words is None else tgt_words
    return sorted({(src_words[int(i)], tgt_words[j]) for j, i in enumerate(best) if tgt_words[j] is not None})


def pharaoh(links: list[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in links)
