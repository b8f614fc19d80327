"""Corpus BLEU with sacreBLEU on detokenized text, reported with its signature (Post 2018)."""

from __future__ import annotations

from sacrebleu.metrics import BLEU


def corpus_bleu(hypotheses: list[str], references: list[str]) -> dict:
    """sacreBLEU (13a tokenization, cased) of detokenized hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    bleu = BLEU()
    score = bleu.corpus_score(hypotheses, [references])
    return {"bleu": score.score, "signature": str(bleu.get_signature())}
