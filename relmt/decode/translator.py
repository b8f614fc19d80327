"""Translation from a checkpoint: the Python API and the engine of `relmt-translate`.

    translator = Translator.from_checkpoint("runs/.../checkpoints/best.pt")
    translator.translate(["the dog saw the cat"], beam=4)
    ensemble = Translator.from_checkpoints(["a/best.pt", "b/best.pt"])  # mean of their probabilities
    translator.translate(["the dog saw the cat"], sampling=True, beam=1, topk=10, seed=3)
    translator.score(["the dog saw the cat"], ["der hund sah die katze"])  # log P(reference | source)
    translator.translations(["the dog saw the cat"], prefixes=["der"], constraints=[["katze"]],
                            alignments=True, token_scores=True)  # what translators ask of a decoder

The checkpoint alone is enough: it holds the config and the sentencepiece model (its path, hash
and bytes; the bytes serve when the file has moved or changed). Decoding settings are the
checkpoint's decode config unless overridden, and precision is the one it was trained with
(train.precision) unless overridden. Decoding goes through `relmt.decode.search.decode_sources`,
as validation during training does, so both give the same output for the same settings: inputs
batched by source tokens in length order, outputs in input order. An empty input gives an empty
output, so line i of the output always belongs to line i of the input. A source longer than
decode.max_source_len tokens is cut to that many, with a warning naming its line.

An ensemble (relmt/decode/ensemble.py) takes its decode config and precision from its first
checkpoint; its checkpoints must hold one sentencepiece model (the same bytes, so the same
vocabulary), and one that does not is named in the error.

A Translator changes nothing process-wide: it can be embedded in a service as it is. The CPU
settings relmt-translate runs with (glibc's malloc keeping freed memory, denormals flushed to zero;
relmt/runtime.py) are the embedding program's choice, opted into once per process:

    from relmt.runtime import tune_cpu
    tune_cpu()  # optional: faster CPU decoding, for the whole process
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from relmt import checkpoint
from relmt.config import DecodeConfig, Precision, from_dict
from relmt.data.tokenizer import PAD_ID, Tokenizer, lang_tag
from relmt.decode.alignment import pharaoh, word_links, words_of_text
from relmt.decode.beam import Hypothesis
from relmt.decode.compiled import compile_decoding
from relmt.decode.constraints import MAX_PHRASES, MAX_PIECES, narrow_beam
from relmt.decode.ensemble import Ensemble
from relmt.decode.reference import ReferenceScore, score_references
from relmt.decode.search import decode_sources
from relmt.errors import UserError
from relmt.export.engines import Ct2Model, Engine, engine_of, graph_model
from relmt.model.transformer import Transformer, build_model
from relmt.runtime import autocast_dtype, resolve_device

log = logging.getLogger(__name__)


def tag_pieces(ids: Sequence[int], tag_ids: set[int]) -> int:
    """How many of a source's first pieces are its language tag: the tag, and a lone "▁" before it where the
    sentencepiece model cuts one off (bpe and unigram do); 0 for an untagged source."""
    return next((i + 1 for i, t in enumerate(ids[:2]) if t in tag_ids), 0)


def sentence_name(i: int, name: str = "input", first_line: int = 1) -> str:
    """How a refusal names sentence i of a call that reads the sentences as lines first_line... of `name`: as that
    input line ("src.txt line 2003": relmt-translate decodes its input in chunks of buffer_lines, and the i of a
    chunk is not the line's number); "sentence i + 1" where name and first_line are the defaults (the API's callers,
    relmt-serve's requests), whose sentences are no lines of a file."""
    return f"sentence {i + 1}" if (name, first_line) == ("input", 1) else f"{name} line {first_line + i}"


def checkpoint_tokenizer(spm: dict) -> Tokenizer:
    """The sentencepiece model a checkpoint was trained with: its file if unchanged, else its bytes."""
    path = Path(spm["path"])
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == spm["sha256"]:
        return Tokenizer(path)
    return Tokenizer(path, model=spm["model"])


def check_same_vocabulary(path: str | Path, ck: dict, first: str | Path, first_spm: bytes, vocab_size: int) -> None:
    """Refuse a checkpoint for an ensemble whose sentencepiece model differs from the first one's:
    its token ids would mean other pieces, and mixing their probabilities would be meaningless."""
    spm = ck["spm"]["model"]
    if spm == first_spm:
        return
    pieces = Tokenizer(Path(ck["spm"]["path"]), model=spm).vocab_size
    sizes = f"{pieces} pieces, {first} {vocab_size}" if pieces != vocab_size else f"both {pieces} pieces"
    raise UserError(f"{path}: its vocabulary differs from {first}'s (sentencepiece model sha256 "
                    f"{hashlib.sha256(spm).hexdigest()[:12]} vs {hashlib.sha256(first_spm).hexdigest()[:12]}; "
                    f"{sizes}); the models of an ensemble must share one vocabulary")


@dataclass(frozen=True)
class Translation:
    """One hypothesis as a translator's tools take it (issue 60)."""

    text: str
    score: float  # log P(y) / lp(|y|), the search's score
    pieces: list[str]  # the output's sentencepiece pieces
    token_scores: list[float] | None = None  # log p of each piece, then EOS's (none if cut at the step limit)
    alignment: str | None = None  # Pharaoh "i-j" links, source word i to target word j (relmt.decode.alignment)
    unmet: int = 0  # constraints it misses: only where the step limit left no room for them


class Translator:
    """A trained model (or an ensemble of them), its vocabulary and decoding settings."""

    def __init__(self, model: Transformer | Ensemble, tokenizer: Tokenizer, decode: DecodeConfig, device: torch.device,
                 autocast_dtype: torch.dtype | None = None, scorer: Transformer | Ensemble | None = None,
                 ct2=None, tgt_langs: Sequence[str] = (), pairs: Sequence[tuple[str, str]] = ()) -> None:
        """`model` runs the searches: relmt's modules, or another engine's stand-in for them
        (relmt.export.graphs.GraphModel: onnx or aoti); `scorer`, relmt's modules, scores references (default: model);
        `ct2` (relmt.export.engines.Ct2Model), when given, decodes instead of relmt's searches. `tgt_langs`: a
        multilingual model's target languages (data.lang_tags), one of which each source is tagged for. `pairs`: the
        (source, target) language codes it was trained on (its data config's DataConfig.pairs())."""
        self.model, self.tokenizer, self.decode, self.device = model.eval(), tokenizer, decode, device
        self.autocast_dtype = autocast_dtype
        self.scorer, self.ct2 = scorer if scorer is not None else self.model, ct2
        self.tgt_langs, self.pairs = list(tgt_langs), list(pairs)
        self.tag_ids = {tokenizer.sp.piece_to_id(p) for lang in self.tgt_langs
                        for p in (lang_tag(lang), "\u2581" + lang_tag(lang))} - {tokenizer.sp.unk_id()}

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto", precision: Precision | str | None = None,
                        compile: bool = False, engine: str = "torch", quantization: str = "float32") -> Translator:
        """Model, vocabulary and decode config from a checkpoint. `precision` (auto | fp32 | bf16 |
        fp16) overrides the checkpoint's train.precision: a model trained in fp32 is decoded in fp32,
        not forced into bf16 on a GPU. `compile` compiles the decoder step (relmt/decode/compiled.py):
        faster on large inputs, after tens of seconds of compiling. Process-wide CPU settings are
        left alone: call relmt.runtime.tune_cpu() first to opt in to relmt-translate's. `engine` (torch,
        onnx, aoti or ctranslate2; relmt/export/engines.py) runs the network: the last three on the CPU in
        float32, from an artefact made on first use next to the checkpoint; engine=aoti with `quantization`
        int8 runs int8 linear maps (relmt/export/quantize.py)."""
        return cls.from_checkpoints([path], device, precision, compile, engine, quantization)

    @classmethod
    def from_checkpoints(cls, paths: Sequence[str | Path], device: str = "auto",
                         precision: Precision | str | None = None, compile: bool = False,
                         engine: str = "torch", quantization: str = "float32") -> Translator:
        """An ensemble of the checkpoints' models (one checkpoint: that model alone), which must
        share their sentencepiece model; vocabulary, decode config and precision come from the first
        (`precision` and `compile` as in from_checkpoint)."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        if not paths:
            raise UserError("no checkpoint given")
        try:
            wanted = Precision(precision) if precision is not None else None
        except ValueError:
            raise UserError(f"precision={precision}: must be one of {', '.join(p.value for p in Precision)}") from None
        dev = resolve_device(device)
        kind = engine_of(engine)
        quantization = quantization or "float32"
        if quantization not in ("float32", "int8") or (quantization == "int8" and kind != Engine.aoti):
            raise UserError(f"quantization={quantization}: engine=aoti runs float32 or int8 weights, the other "
                            "engines float32 (a CTranslate2 int8 model: relmt-export format=ctranslate2 "
                            "quantization=int8)")
        if kind != Engine.torch:
            problem = ("decodes one checkpoint (its own search; an ensemble runs on engine=torch, onnx or aoti)"
                       if len(paths) > 1 and kind == Engine.ctranslate2 else
                       f"runs on the CPU (device={device} resolves to {dev})" if dev.type != "cpu" else
                       "is compiled already (compile=true is for engine=torch)" if compile else "")
            if problem:
                raise UserError(f"engine={kind.value} {problem}")
        models: list[Transformer] = []
        checksums: list[tuple[Path, str]] = []  # each checkpoint and its checksum, for the engines' artefacts
        for path in paths:
            path = checkpoint.resolve(path)
            ck = checkpoint.load(path)
            checksum = ck.get("checksum") or checkpoint.payload_checksum(ck)
            if not models:
                cfg = from_dict(ck["config"])
                tokenizer, first, first_spm = checkpoint_tokenizer(ck["spm"]), path, ck["spm"]["model"]
                step = ck.get("step")
            else:
                check_same_vocabulary(path, ck, first, first_spm, tokenizer.vocab_size)
            model = build_model(from_dict(ck["config"]).model, tokenizer.vocab_size, PAD_ID)
            checkpoint.load_model_state(model, ck["model"], path)
            models.append(model)
            checksums.append((path, checksum))
            del ck  # the optimizer state of one checkpoint at a time
        model = models[0] if len(models) == 1 else Ensemble(models)
        pairs = cfg.data.pairs()
        langs = sorted({tgt for _, tgt in pairs}) if cfg.data.lang_tags else []
        chosen = wanted if wanted is not None else cfg.train.precision
        if wanted is None and chosen == Precision.fp16 and dev.type != "cuda":
            # fp16 needs CUDA (relmt.runtime.autocast_dtype); fp32 holds every fp16 value, so nothing is lost
            log.info("%s was trained in fp16; decoding in fp32 on %s", paths[0], dev.type)
            chosen = Precision.fp32
        dtype = autocast_dtype(chosen, dev)  # an fp16 asked for off CUDA fails here, before the model moves
        model = model.to(dev).eval()
        if compile:
            compile_decoding(model)
        if kind in (Engine.onnx, Engine.aoti):
            graphs = [graph_model(kind, m, p, c, quantization=quantization) for m, (p, c) in zip(models, checksums)]
            return cls(graphs[0] if len(graphs) == 1 else Ensemble(graphs), tokenizer, cfg.decode, dev, None,
                       scorer=model, tgt_langs=langs, pairs=pairs)
        if kind == Engine.ctranslate2:
            from relmt.export.ctranslate2 import RelmtConverter, check_exportable, export_info

            check_exportable(cfg.model)  # per-head tables and alibi are refused before anything is written
            # converted from the weights read above, whose checksum names the artefact (issue 42 §3)
            converter = RelmtConverter(model, Tokenizer(tokenizer.path, model=first_spm),
                                       info=export_info(path, step, cfg))
            return cls(model, tokenizer, cfg.decode, dev, None, ct2=Ct2Model(path, checksum, converter),
                       tgt_langs=langs, pairs=pairs)
        return cls(model, tokenizer, cfg.decode, dev, dtype, tgt_langs=langs, pairs=pairs)

    def tagged(self, sentences: Sequence[str], tgt_lang: str | None, name: str = "input",
               first_line: int = 1) -> list[str]:
        """The sentences as the model reads them: a multilingual model's (data.lang_tags; Johnson et al. 2017) each
        begin with the tag of the target language `tgt_lang`, which it must be given unless every sentence begins
        with a tag already ("<2fr> ..."); another model takes no tgt_lang. A refusal names sentence i as
        `sentence_name` does."""
        if not self.tgt_langs:
            if tgt_lang is not None:
                raise UserError(f"tgt_lang={tgt_lang}: this model translates into one language and takes no "
                                "tgt_lang (it was trained without data.lang_tags)")
            return list(sentences)
        tags = tuple(f"{lang_tag(lang)} " for lang in self.tgt_langs)
        if tgt_lang is None and all(s.startswith(tags) for s in sentences if s.strip()):
            return list(sentences)  # tagged by the caller, as the training data was
        if tgt_lang is not None and (i := next((i for i, s in enumerate(sentences) if s.startswith(tags)), None)) \
                is not None:
            raise UserError(f"{sentence_name(i, name, first_line)} begins with a language tag already, and "
                            f"tgt_lang={tgt_lang} adds one: give tagged sentences without tgt_lang, or plain ones "
                            "with it")
        if tgt_lang not in self.tgt_langs:
            given = "no tgt_lang given" if tgt_lang is None else f"tgt_lang={tgt_lang}: not one of its languages"
            raise UserError(f"{given}: this multilingual model translates into {', '.join(self.tgt_langs)}; "
                            f"give tgt_lang={self.tgt_langs[0]}, say")
        return [f"{lang_tag(tgt_lang)} {s}" if s.strip() else s for s in sentences]

    def translate(self, sentences: list[str] | str, **decode: object) -> list[str] | str:
        """The best translation of each sentence; of a single string, its translation as a string.
        Keyword arguments override DecodeConfig fields (beam, lenpen, max_len_a, max_len_b,
        max_source_tokens, max_sentences, nbest, early_stop, min_len, eos_candidates, max_source_len,
        sampling, topk, topp, temperature, seed)."""
        if isinstance(sentences, str):
            return self.translate([sentences], **decode)[0]
        return [hyps[0][0] if hyps else "" for hyps in self.translate_nbest(sentences, **decode)]

    def translate_nbest(self, sentences: list[str], progress: bool = False, name: str = "input",
                        first_line: int = 1, **decode: object) -> list[list[tuple[str, float]]]:
        """The `nbest` (text, score) translations of each sentence, best first; [] for an empty line."""
        results = self.hypotheses(sentences, progress, name, first_line, **decode)
        return [[(text, h.score) for text, h in zip(self.tokenizer.decode([h.tokens for h in hs]), hs)]
                for hs in results]

    def hypotheses(self, sentences: list[str], progress: bool = False, name: str = "input", first_line: int = 1,
                   prefixes: Sequence[str] | None = None, constraints: Sequence[Sequence[str]] | None = None,
                   ordered: bool = False, tgt_lang: str | None = None, stop: Callable[[], bool] | None = None,
                   **decode: object) -> list[list[Hypothesis]]:
        """The `nbest` hypotheses (output ids and score) of each sentence; [] for an empty line.
        Sentence i is line first_line + i of `name` in the warning about a truncated source, and in the refusal
        of a prefix or of constraints (`sentence_name`: "sentence i + 1" where name and first_line are left as they
        are, as the API's callers and relmt-serve leave them).
        prefixes[i]: target text sentence i's output begins with; constraints[i]: target words or phrases it
        must contain, in that order if `ordered` (relmt/decode/constraints.py); `tgt_lang`: the target language
        of a multilingual model (`tagged`); `stop()`, asked before each search step, ends the decoding when True
        (the sentences left get no hypotheses: relmt-serve stops a batch whose clients all left)."""
        cfg = replace(self.decode, **decode)
        ids = self._encode(self.tagged(self._texts(sentences, "sentences"), tgt_lang, name, first_line), "sentences")
        prefix_ids = self._encode(prefixes, "prefixes", len(sentences)) if prefixes is not None else None
        constraint_ids = None
        if self.ct2 is not None and constraints is not None and any(len(c) for c in constraints):
            raise UserError("engine=ctranslate2 has no lexically constrained search: constraints work on "
                            "engine=torch, onnx and aoti")
        if constraints is not None:  # each phrase encoded alone, as the words it will be inside a sentence
            if len(constraints) != len(sentences) or any(isinstance(c, str) for c in constraints):
                raise UserError(f"constraints: give one list of target phrases per sentence ({len(sentences)}), "
                                "e.g. [[\"Katze\"], []]")
            constraint_ids = [self._encode(list(c), f"constraint phrases of {sentence_name(i, name, first_line)}")
                              for i, c in enumerate(constraints)]
            unk = self.tokenizer.sp.unk_id()
            for i, (phrases, ids_) in enumerate(zip(constraints, constraint_ids)):
                for phrase, x in zip(phrases, ids_):
                    if unk in x:
                        raise UserError(f"constraint {phrase!r} of {sentence_name(i, name, first_line)}: the model's "
                                        "vocabulary has no piece for part of it (sentencepiece gives <unk>), so no "
                                        "output can hold it")
                count, pieces = sum(1 for x in ids_ if x), sum(map(len, ids_))
                if count > MAX_PHRASES or pieces > MAX_PIECES:
                    raise UserError(f"constraints of {sentence_name(i, name, first_line)}: {count} phrases of "
                                    f"{pieces} pieces, more than {MAX_PHRASES} phrases or {MAX_PIECES} pieces a "
                                    "sentence (each raises the search's cost)")
        if constraint_ids is not None and not cfg.sampling:
            most = max((sum(1 for x in ids_ if x) for ids_ in constraint_ids), default=0)
            if warning := narrow_beam(cfg.beam, most):  # dynamic beam allocation shares the beam among the banks
                log.warning("%s", warning)
        if prefix_ids is not None and not cfg.sampling:  # forced as encoded: an <unk> in it would be forced too
            unk = self.tokenizer.sp.unk_id()
            for i, (prefix, x) in enumerate(zip(prefixes, prefix_ids)):
                if unk in x:
                    raise UserError(f"prefix {prefix!r} of {sentence_name(i, name, first_line)}: the model's "
                                    "vocabulary has no piece for part of it (sentencepiece gives <unk>), so the "
                                    "output would begin with \u2047 instead")
        if self.ct2 is not None:
            return self.ct2.hypotheses(ids, self.tokenizer, cfg, prefix_ids)
        return decode_sources(self.model, ids, cfg, self.device, self.autocast_dtype, name=name,
                              first_line=first_line, progress=progress, prefixes=prefix_ids,
                              constraints=constraint_ids, ordered=ordered, stop=stop)

    @staticmethod
    def _texts(texts: Sequence[str] | str, what: str) -> Sequence[str]:
        """`texts`, which must be a list of str."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise UserError(f"expected a list of {what} (str), got {type(texts).__name__}"
                            + (f" of {type(next(t for t in texts if not isinstance(t, str))).__name__}"
                               if not isinstance(texts, str) else " (translate() takes a single string)"))
        return texts

    def _encode(self, texts: Sequence[str] | str, what: str, expected: int | None = None) -> list[list[int]]:
        """Each text's ids, [] for a blank one; a list of str is required (and `expected` of them)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise UserError(f"expected a list of {what} (str), got {type(texts).__name__}"
                            + (f" of {type(next(t for t in texts if not isinstance(t, str))).__name__}"
                               if not isinstance(texts, str) else " (translate() takes a single string)"))
        if expected is not None and len(texts) != expected:
            raise UserError(f"{what}: {len(texts)} given for {expected} sentences; give one per sentence")
        return [x if t.strip() else [] for t, x in zip(texts, self.tokenizer.encode(list(texts)))]

    def translations(self, sentences: list[str], prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None, ordered: bool = False,
                     alignments: bool = False, token_scores: bool = False, progress: bool = False,
                     name: str = "input", first_line: int = 1, tgt_lang: str | None = None,
                     **decode: object) -> list[list[Translation]]:
        """The `nbest` translations of each sentence, best first ([] for an empty line), with what a translator's
        tools ask of a decoder (issue 60): a target prefix each output begins with, target phrases it must
        contain (`ordered`: in the given order), each output piece's log-probability (`token_scores`) and
        source-target word alignments (`alignments`). Scores and alignments come from one teacher-forced pass of
        relmt's own modules over the outputs, whatever engine searched (relmt/decode/reference.py). `tgt_lang`: a
        multilingual model's target language (`tagged`)."""
        results = self.hypotheses(sentences, progress, name, first_line, prefixes, constraints, ordered, tgt_lang,
                                  **decode)
        src_ids = (self._encode(self.tagged(sentences, tgt_lang, name, first_line), "sentences")
                   if token_scores or alignments else [[] for _ in sentences])
        flat = self.annotated([(src_ids[i], h) for i, hs in enumerate(results) for h in hs], token_scores,
                              alignments, replace(self.decode, **decode), name, first_line)
        done = iter(flat)
        return [[next(done) for _ in hs] for hs in results]

    def annotated(self, pairs: Sequence[tuple[Sequence[int], Hypothesis]], token_scores: bool = False,
                  alignments: bool = False, cfg: DecodeConfig | None = None, name: str = "input", first_line: int = 1,
                  ) -> list[Translation]:
        """Each (source ids, hypothesis) pair as a Translation, with each output piece's log-probability
        (`token_scores`) and source-target word alignments (`alignments`) where asked: one teacher-forced pass of
        relmt's own modules over the outputs (relmt/decode/reference.py), so it annotates whatever search made them
        (this Translator's, another engine's, relmt-serve's running search). `cfg` (default: the Translator's)
        gives the source cut, the batch size and the alignment layer."""
        cfg = cfg if cfg is not None else self.decode
        notes = [None] * len(pairs)
        if pairs and (token_scores or alignments):
            try:
                notes = score_references(self.scorer, [x for x, _ in pairs], [h.tokens for _, h in pairs],
                                         cfg.max_source_len, cfg.max_source_tokens, self.device, self.autocast_dtype,
                                         name=name, first_line=first_line, token_scores=token_scores,
                                         attention_layer=cfg.alignment_layer if alignments else None)
            except ValueError as exc:  # an alignment layer the model does not have
                raise UserError(f"decode.alignment_layer={cfg.alignment_layer}: {exc}") from None
        sp = self.tokenizer.sp
        texts = self.tokenizer.decode([h.tokens for _, h in pairs]) if pairs else []
        out: list[Translation] = []
        for (x, h), text, note in zip(pairs, texts, notes):
            pieces = [sp.id_to_piece(t) for t in h.tokens]
            steps = list(note.token_logprobs[: len(h.tokens) + h.eos]) if token_scores else None
            links = None
            if alignments:  # a multilingual model's tag is no source word: its pieces' columns are left out
                skip = tag_pieces(x, self.tag_ids)
                links = pharaoh(word_links(note.attention[:, skip:],
                                           [sp.id_to_piece(t) for t in x[skip: cfg.max_source_len or None]], pieces,
                                           words_of_text(h.tokens, sp.decode)))
            out.append(Translation(text, h.score, pieces, steps, links, h.unmet))
        return out

    def score(self, sources: list[str], references: list[str], name: str = "input", first_line: int = 1,
              tgt_lang: str | None = None) -> list[ReferenceScore]:
        """log P(reference | source) of each pair (relmt/decode/reference.py: natural log, summed over
        the reference's tokens and EOS; `per_token` divides by their count), in input order; `tgt_lang` as
        `tagged`'s."""
        if len(sources) != len(references):
            raise UserError(f"{len(sources)} sources but {len(references)} references")
        sources = self.tagged(sources, tgt_lang, name, first_line)
        src = [x if s.strip() else [] for s, x in zip(sources, self.tokenizer.encode(sources))]
        ref = [y if r.strip() else [] for r, y in zip(references, self.tokenizer.encode(references))]
        return score_references(self.scorer, src, ref, self.decode.max_source_len, self.decode.max_source_tokens,
                                self.device, self.autocast_dtype, name=name, first_line=first_line)
