"""Word alignments from cross-attention (issue 60): each target piece links to the source piece its
attention weighs most (the source's EOS left out), and pieces link as the words they belong to, as
fairseq's --print-alignment and OpenNMT-py's report_align read them. The weights come from one
decoder layer, its heads averaged (relmt.decode.reference.score_references, `attention_layer`);
which layer aligns best was measured on the toy corpus, whose generator knows the gold alignments
(docs/results/decoding/alignments.md). Links are Pharaoh "i-j": source word i, target word j,
0-based over whitespace-separated words, sorted."""

from __future__ import annotations

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


def word_links(attention: np.ndarray, src_pieces: list[str], tgt_pieces: list[str]) -> list[tuple[int, int]]:
    """Source-target word links from attention (>= |y|, >= |x|): rows the target pieces (EOS's row after them is
    ignored), columns the source pieces (the EOS column after them is ignored)."""
    if not src_pieces or not tgt_pieces:
        return []
    best = attention[: len(tgt_pieces), : len(src_pieces)].argmax(axis=1)
    src_words, tgt_words = word_of_pieces(src_pieces), word_of_pieces(tgt_pieces)
    return sorted({(src_words[int(i)], tgt_words[j]) for j, i in enumerate(best)})


def pharaoh(links: list[tuple[int, int]]) -> str:
    return " ".join(f"{i}-{j}" for i, j in links)
