"""The joint sentencepiece vocabulary, and the special ids, which live here and nowhere else.

One model is trained on both sides of the training split (Shaw et al. §4.1: 32,768 shared
word-pieces for WMT). Source sequences end in EOS; target sequences are framed at batching time as
BOS + y (decoder input) and y + EOS (decoder output).
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from relmt.errors import UserError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# sentencepiece's call on a list costs tens of microseconds before its first sentence (its thread pool and
# argument handling), its call on one sentence a few: lists up to this long go one sentence at a time (a
# server's request, a sentence translated alone), longer ones in one call over spm's threads
ONE_BY_ONE = 64


def lang_tag(lang: str) -> str:
    """The target-language tag that starts a multilingual model's sources (Johnson et al. 2017; data.lang_tags)."""
    return f"<2{lang}>"


def train_tokenizer(sentences: Iterable[str], path: Path, vocab_size: int, model_type: str,
                    character_coverage: float = 1.0, input_sentence_size: int = 2_000_000,
                    seed: int = 1, num_threads: int = 2, normalization: str = "identity",
                    lowercase: bool = False, user_symbols: Iterable[str] = ()) -> None:
    """Train a sentencepiece model on `sentences` and write it to `path` atomically.

    `vocab_size` is an upper bound (hard_vocab_limit=False): a small corpus such as the toy one has
    fewer word types than a typical setting. Above `input_sentence_size` sentences, spm samples.
    `normalization` is spm's normalization_rule_name (config.SpmNormalization). spm's own default,
    nmt_nfkc, rewrites '…' as '...' and 'ﬁ' as 'fi' for good, so the decoded output could never match
    such characters in a raw reference; identity keeps them. `lowercase` replaces the rule by
    `lowercase_rules`, which spm stores in the model and applies to every input. `user_symbols` (the
    multilingual target-language tags) are each always one piece.
    """
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "lowercase.tsv"
        rules.write_text(lowercase_rules() if lowercase else "", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, character_coverage=character_coverage,
            input_sentence_size=input_sentence_size, shuffle_input_sentence=True, hard_vocab_limit=False,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, num_threads=num_threads,
            normalization_rule_name=normalization,
            # Leading, trailing and repeated spaces are still squeezed, under every rule: BLEU splits on
            # whitespace, so they never change a score, and keeping them would spend pieces on space runs.
            remove_extra_whitespaces=True,
            minloglevel=2, **({"normalization_rule_tsv": str(rules)} if lowercase else {}),
            **({"user_defined_symbols": list(user_symbols)} if user_symbols else {}),
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(model.getvalue())
    os.replace(tmp, path)


def lowercase_rules() -> str:
    """A sentencepiece normalization table (hex code points, tab, hex code points) that maps each
    character to `str.lower` of it: 'Ä' -> 'ä', 'İ' -> 'i̇'; 'ß' stays (case folding, nfkc_cf, would
    write 'ss', which a lowercased reference does not have)."""
    rows = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:  # surrogates are no characters
            continue
        if (low := chr(cp).lower()) != chr(cp):
            rows.append(f"{cp:X}\t{' '.join(f'{ord(c):X}' for c in low)}\n")
    return "".join(rows)


class Tokenizer:
    """A trained sentencepiece model: text <-> ids, batched."""

    def __init__(self, path: str | Path, model: bytes | None = None) -> None:
        """Load the model file at `path`, or, given `model`, those bytes (path is then a label)."""
        self.path = Path(path)
        if model is None and not self.path.is_file():
            raise UserError(f"{self.path}: sentencepiece model not found")
        self.sp = (spm.SentencePieceProcessor(model_proto=model) if model is not None
                   else spm.SentencePieceProcessor(model_file=str(self.path)))
        self._bytes = model
        ids = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise UserError(f"{self.path}: special ids (pad, unk, bos, eos) are {ids}, relmt expects "
                            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, texts: list[str]) -> list[list[int]]:
        if len(texts) <= ONE_BY_ONE:
            return [self.sp.encode(text, out_type=int) for text in texts]
        return self.sp.encode(texts, out_type=int)

    def decode(self, ids: list[list[int]]) -> list[str]:
        if len(ids) <= ONE_BY_ONE:
            return [self.sp.decode(x) for x in ids]
        return self.sp.decode(ids)

    def model_bytes(self) -> bytes:
        return self._bytes if self._bytes is not None else self.path.read_bytes()

    def sha256(self) -> str:
        return hashlib.sha256(self.model_bytes()).hexdigest()
