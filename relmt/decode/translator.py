"""Translation from a checkpoint: the Python API and the engine of `relmt-translate`.

    translator = Translator.from_checkpoint("runs/.../checkpoints/best.pt")
    translator.translate(["the dog saw the cat"], beam=4)

The checkpoint alone is enough: it holds the config and the sentencepiece model (its path, hash
and bytes; the bytes serve when the file has moved or changed). Inputs are batched by source
tokens in length order and the outputs returned in input order; an empty input gives an empty
output, so line i of the output always belongs to line i of the input.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from relmt.config import DecodeConfig, from_dict
from relmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from relmt.decode.beam import Hypothesis, beam_search
from relmt.decode.search import source_batches
from relmt.model.transformer import Transformer, build_model
from relmt.runtime import tune_cpu
from relmt.train import checkpoint
from relmt.train.distributed import resolve_device

log = logging.getLogger(__name__)


def checkpoint_tokenizer(spm: dict) -> Tokenizer:
    """The sentencepiece model a checkpoint was trained with: its file if unchanged, else its bytes."""
    path = Path(spm["path"])
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == spm["sha256"]:
        return Tokenizer(path)
    return Tokenizer(path, model=spm["model"])


class Translator:
    """A trained model, its vocabulary and decoding settings."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.model, self.tokenizer, self.decode, self.device = model.eval(), tokenizer, decode, device
        self.autocast_dtype = autocast_dtype

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> Translator:
        ck = checkpoint.load(path)
        cfg = from_dict(ck["config"])
        tokenizer = checkpoint_tokenizer(ck["spm"])
        model = build_model(cfg.model, tokenizer.vocab_size, PAD_ID)
        checkpoint.load_model_state(model, ck["model"], path)
        dev = resolve_device(device)
        tune_cpu()
        return cls(model.to(dev), tokenizer, cfg.decode, dev,
                   torch.bfloat16 if dev.type == "cuda" else None)

    def translate(self, sentences: list[str], **decode: object) -> list[str]:
        """The best translation of each sentence. Keyword arguments override DecodeConfig fields
        (beam, lenpen, max_len_a, max_len_b, max_tokens, early_stop, min_len)."""
        return [hyps[0][0] if hyps else "" for hyps in self.translate_nbest(sentences, **decode)]

    def translate_nbest(self, sentences: list[str], progress: bool = False,
                        **decode: object) -> list[list[tuple[str, float]]]:
        """The `nbest` (text, score) translations of each sentence, best first; [] for an empty line."""
        results = self.hypotheses(sentences, progress, **decode)
        return [[(text, h.score) for text, h in zip(self.tokenizer.decode([h.tokens for h in hs]), hs)]
                for hs in results]

    def hypotheses(self, sentences: list[str], progress: bool = False, **decode: object) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses (output ids and score) of each sentence; [] for an empty line."""
        cfg = replace(self.decode, **decode)
        ids = [x + [EOS_ID] if s.strip() else [] for s, x in zip(sentences, self.tokenizer.encode(sentences))]
        todo = np.array([i for i, x in enumerate(ids) if x], dtype=np.int64)
        results: list[list[Hypothesis]] = [[] for _ in sentences]
        lengths = np.array([len(ids[i]) for i in todo], dtype=np.int64)
        batches = source_batches(lengths, cfg.max_tokens) if len(todo) else []
        for batch in tqdm(batches, desc="translate", unit="batch", disable=not progress):
            index = todo[batch]
            src = torch.full((len(index), int(lengths[batch].max())), PAD_ID, dtype=torch.long)
            for row, i in enumerate(index):
                src[row, : len(ids[i])] = torch.tensor(ids[i])
            with torch.no_grad(), torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                                 enabled=self.autocast_dtype is not None):
                hyps = beam_search(self.model, src.to(self.device), cfg.beam, BOS_ID, EOS_ID, cfg.lenpen,
                                   cfg.max_len_a, cfg.max_len_b, nbest=cfg.nbest,
                                   early_stop=cfg.early_stop or cfg.beam == 1, min_len=cfg.min_len)
            for i, h in zip(index, hyps):
                results[i] = h
        return results
