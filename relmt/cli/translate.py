"""`relmt-translate`: a file or stdin translated (or, with reference=, scored) chunk by chunk."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from relmt.cli.common import EXAMPLES, guarded, parse_args, setup_logging
from relmt.errors import UserError

log = logging.getLogger(__name__)


@dataclass
class TranslateArgs:
    checkpoint: Any = "???"  # a path, or a list of them ([a.pt,b.pt]) for an ensemble
    input: str = ""  # default: stdin
    output: str = ""  # default: stdout
    reference: str = ""  # score this file's lines as translations of the input's (forced decoding)
    # What a translator's tools ask of a decoder (issue 60; beam search, engine torch, onnx or aoti):
    constraints: str = ""  # ordered | unordered: each input line is the source, then TAB-separated target phrases
    prefix: str = ""  # a file of target prefixes, one per input line (blank: none), each output begins with
    alignments: bool = False  # append a TAB and the Pharaoh source-target word links ("0-0 1-2 ...")
    token_scores: bool = False  # append a TAB and each output piece's log-probability, then EOS's
    alignment_layer: int | None = None  # the decoder layer alignments read (decode.alignment_layer)
    tgt_lang: str | None = None  # a multilingual model's (data.lang_tags) target language, e.g. tgt_lang=fr
    # decoding: unset (None) keeps the checkpoint's decode config
    beam: int | None = None
    lenpen: float | None = None
    length_norm: str = ""  # gnmt | power
    nbest: int = 1
    max_source_tokens: int | None = None  # source tokens per batch, padding included
    max_sentences: int | None = None  # sentences per batch (fairseq's --batch-size); 0 = no cap
    max_len_a: float | None = None
    max_len_b: int | None = None
    min_len: int | None = None  # EOS suppressed before this many output tokens (fairseq's --min-len)
    eos_candidates: str = ""  # t2t | fairseq
    max_source_len: int | None = None
    sampling: bool | None = None
    topk: int | None = None
    topp: float | None = None
    temperature: float | None = None
    seed: int | None = None
    buffer_lines: int = 2000  # input lines read, translated and written at a time
    precision: str = ""  # auto | fp32 | bf16 | fp16; default: the checkpoint's train.precision
    device: str = "auto"
    threads: int = 0  # torch CPU threads, as relmt-train's and relmt-serve's threads=; 0 = the cores free at start
    compile: bool = False  # torch.compile the decoder step (relmt/decode/compiled.py): for large inputs
    engine: str = "torch"  # torch | onnx | aoti | ctranslate2 (relmt/export/engines.py)
    quantization: str = ""  # engine=aoti: int8 runs int8 linear maps (relmt/export/quantize.py); default float32
    progress: bool = True


TRANSLATE_DECODE_KEYS = ("beam", "lenpen", "length_norm", "nbest", "max_source_tokens", "max_sentences", "max_len_a",
                         "max_len_b", "min_len", "eos_candidates", "max_source_len", "sampling", "topk", "topp",
                         "temperature", "seed", "alignment_layer")
# Keys that relmt-translate once took, and what they are called now (issue 13: max_tokens counted
# padded source + target tokens in training and source tokens in decoding, under one name).
TRANSLATE_RENAMED_KEYS = {"max_tokens": "max_source_tokens"}


def read_input(path: str, buffer_lines: int = 2000) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, lines) for each run of `buffer_lines` lines of a file, or of stdin
    for '' or '-'. A chunk is read only when asked for, so a caller that writes each chunk's output
    before asking for the next keeps memory bounded and loses nothing done if stopped. Invalid UTF-8
    (or a NUL) is reported by file and line number, counted from the start of the input."""
    import contextlib
    from pathlib import Path

    from relmt.data.sources import decode_lines

    stdin = path in ("", "-")
    name = "<stdin>" if stdin else path
    if not stdin and not Path(path).is_file():
        raise UserError(f"input={path}: no such file")

    def decode(raw: list[bytes], first: int) -> list[str]:
        return decode_lines(b"".join(raw), name, first_line=first)

    def chunks() -> Iterator[tuple[int, list[str]]]:
        with contextlib.nullcontext(sys.stdin.buffer) if stdin else open(path, "rb") as stream:
            first, raw = 1, []
            for line in stream:  # binary lines end at b"\n" only, as decode_lines splits them
                raw.append(line)
                if len(raw) == buffer_lines:
                    yield first, decode(raw, first)
                    first, raw = first + len(raw), []
            if raw:
                yield first, decode(raw, first)

    return chunks()


def misaligned(name: str, lines: int, reference: str, references: int, key: str = "reference") -> UserError:
    return UserError(f"{name} has {lines} lines but {key}={reference} has {references}: {key} needs one line per "
                     "input line")


def read_references(reference: str, source: str, key: str = "reference") -> list[str]:
    """The lines of the reference (or prefix) file, checked against the line count of the source file (stdin is
    checked while it is read)."""
    from pathlib import Path

    from relmt.data.sources import read_lines

    refs = read_lines(Path(reference))
    if source not in ("", "-"):
        with open(source, "rb") as f:  # lines as read_input splits them
            lines = sum(1 for _ in f)
        if lines != len(refs):
            raise misaligned(source, lines, reference, len(refs), key)
    return refs


def split_constraints(lines: list[str], name: str, first: int) -> tuple[list[str], list[list[str]]]:
    """fairseq's --constraints input: each line the source, then TAB-separated target phrases (blank ones are
    refused, naming the line)."""
    sources, phrases = [], []
    for i, line in enumerate(lines):
        source, *wanted = line.split("\t")
        if any(not w.strip() for w in wanted):
            raise UserError(f"{name}:{first + i}: an empty constraint (two TABs in a row, or a TAB at the end); "
                            "give the source, then each target phrase after a TAB")
        sources.append(source)
        phrases.append(wanted)
    return sources, phrases


def columns(text: str, t) -> str:
    """A translation and, where asked, TAB, its word alignment and TAB, its token scores."""
    extra = ([t.alignment] if t.alignment is not None else []) + \
        ([" ".join(f"{x:.4f}" for x in t.token_scores)] if t.token_scores is not None else [])
    return "\t".join([text, *extra])


def decode_with_overrides(decode, overrides: dict):
    """`decode` (a DecodeConfig) with relmt-translate's decoding overrides applied (eos_candidates and
    length_norm as their strings), checked by DecodeConfig's own checks; a UserError names the key as
    `key=value: problem`. relmt-serve checks a request's options with it too."""
    from dataclasses import replace

    from relmt.config import EosCandidates, LengthNorm

    overrides = dict(overrides)
    for key, kind in (("eos_candidates", EosCandidates), ("length_norm", LengthNorm)):
        if key in overrides and not isinstance(overrides[key], kind):
            if overrides[key] not in {e.value for e in kind}:
                raise UserError(f"{key}={overrides[key]}: must be one of {', '.join(e.value for e in kind)}")
            overrides[key] = kind(overrides[key])
    problem = ""
    try:  # DecodeConfig's own checks, on the checkpoint's settings with the overrides applied
        decode = replace(decode, **overrides)
    except ValueError as e:
        problem = str(e)
    if problem:  # raised outside the except block, so that the message names the CLI key only once
        key, _, message = problem.partition(": ")
        key = key.removeprefix("decode.")
        if key not in overrides:
            raise UserError(f"{problem} (the checkpoint's decode config with the overrides {overrides})")
        raise UserError(f"{key}={getattr(overrides[key], 'value', overrides[key])}: {message.replace('decode.', '')}")
    return decode


def _translate(argv: list[str]) -> None:
    from pathlib import Path

    from relmt import checkpoint
    from relmt.config import EosCandidates, LengthNorm
    from relmt.decode.translator import Translator
    from relmt.runtime import choose_threads, tune_cpu

    for arg in argv:
        key = arg.partition("=")[0]
        if key in TRANSLATE_RENAMED_KEYS:
            raise UserError(f"{key}: renamed {TRANSLATE_RENAMED_KEYS[key]} (source tokens per decoding batch); "
                            f"give {TRANSLATE_RENAMED_KEYS[key]}={arg.partition('=')[2] or 'N'}")
    args = parse_args(TranslateArgs, argv, EXAMPLES["relmt-translate"])
    setup_logging(logging.WARNING)
    logging.getLogger("relmt.checkpoint").setLevel(logging.INFO)  # which file a run directory stands for
    if args.buffer_lines < 1:
        raise UserError(f"buffer_lines={args.buffer_lines}: must be >= 1")
    for key, kind in (("eos_candidates", EosCandidates), ("length_norm", LengthNorm)):
        value = getattr(args, key)
        if value and value not in {e.value for e in kind}:
            raise UserError(f"{key}={value}: must be one of {', '.join(e.value for e in kind)}")
    paths = [str(p) for p in args.checkpoint] if isinstance(args.checkpoint, list) else [str(args.checkpoint)]
    if not paths:
        raise UserError("checkpoint=[]: give a checkpoint, or a list of them for an ensemble")
    for path in paths:  # a missing checkpoint is said first: without it there is nothing to run (a run
        if not Path(path).is_dir() and not checkpoint.resolve(path).is_file():  # directory is resolved later)
            raise UserError(f"checkpoint={path}: no such checkpoint")
    chunks = read_input(args.input, args.buffer_lines)  # a missing input fails before the model loads
    name = args.input if args.input not in ("", "-") else "<stdin>"
    refs = read_references(args.reference, args.input) if args.reference else None  # so does a misaligned one
    prefixes = read_references(args.prefix, args.input, "prefix") if args.prefix else None
    if args.constraints not in ("", "ordered", "unordered"):
        given = str(args.constraints)
        if given.lower() in ("true", "false"):  # constraints=yes: YAML reads yes, on and true as a boolean
            given = f"{given.lower()} (YAML reads yes/no, on/off as a boolean)"
        raise UserError(f"constraints={given}: must be ordered or unordered (or unset): which reading of the "
                        "TAB-separated phrases after each source")
    if refs is not None and (prefixes is not None or args.constraints or args.alignments or args.token_scores):
        raise UserError("reference= scores given translations: prefix, constraints, alignments and token_scores "
                        "are for translating")
    if args.threads < 0:
        raise UserError(f"threads={args.threads}: must be >= 0 (0: the cores free at start)")
    import torch

    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    choose_threads(args.threads, torch.device("cuda" if cuda else "cpu"), "decoding")  # warns beside busy cores
    tune_cpu()  # the command owns its process; the Translator API leaves this to its caller
    translator = Translator.from_checkpoints(paths, device=args.device, precision=args.precision or None,
                                             compile=args.compile, engine=args.engine,
                                             quantization=args.quantization or "float32")
    overrides = {k: getattr(args, k) for k in TRANSLATE_DECODE_KEYS if getattr(args, k) not in (None, "")}
    translator.decode = decode_with_overrides(translator.decode, overrides)
    if args.tgt_lang is not None:  # one the model does not know fails before any input is read
        translator.tagged([""], args.tgt_lang)

    from tqdm import tqdm

    warned: list[int] = []  # the first line holding a TAB, said once

    def output(first: int, lines: list[str]) -> str:
        if refs is not None:  # forced decoding: one score line per input line
            scores = translator.score(lines, refs[first - 1:first - 1 + len(lines)], name=name, first_line=first,
                                      tgt_lang=args.tgt_lang)
            return "".join(f"{s.logprob:.6f}\t{s.tokens}\t{s.per_token:.6f}\n" for s in scores)
        constraints = None
        if args.constraints:
            lines, constraints = split_constraints(lines, name, first)
        elif not warned and (tabbed := next((first + i for i, line in enumerate(lines) if "\t" in line), None)):
            warned.append(tabbed)  # fairseq's constraints format read as text: the phrases would be translated too
            log.warning("%s line %d holds a TAB: without constraints=ordered|unordered the whole line is "
                        "translated, TAB-separated phrases included", name, tabbed)
        if prefixes is not None and first - 1 + len(lines) > len(prefixes):
            raise misaligned(name, first - 1 + len(lines), args.prefix, len(prefixes), "prefix")
        results = translator.translations(lines, prefixes[first - 1:first - 1 + len(lines)] if prefixes else None,
                                          constraints, args.constraints == "ordered", args.alignments,
                                          args.token_scores, name=name, first_line=first, tgt_lang=args.tgt_lang)
        if translator.decode.nbest == 1:
            return "".join((columns(hyps[0].text, hyps[0]) if hyps else "") + "\n" for hyps in results)
        return "".join(f"{first - 1 + i}\t{t.score:.4f}\t{columns(t.text, t)}\n"
                       for i, hyps in enumerate(results) for t in hyps)

    out = None
    read = 0  # input lines read so far
    with tqdm(desc="translate", unit="line", disable=not (args.progress and sys.stderr.isatty())) as bar:
        try:
            for first, lines in chunks:
                read += len(lines)
                if refs is not None and read > len(refs):  # stdin (a file was counted before): count the rest
                    raise misaligned(name, read + sum(len(rest) for _, rest in chunks), args.reference, len(refs))
                text = output(first, lines)
                if out is None:  # opened at the first output, so that bad input does not clobber it
                    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
                out.write(text)
                out.flush()  # a stopped job keeps every chunk written so far
                bar.update(len(lines))
            if refs is not None and read < len(refs):
                raise misaligned(name, read, args.reference, len(refs))
            if prefixes is not None and read < len(prefixes):
                raise misaligned(name, read, args.prefix, len(prefixes), "prefix")
            if out is None and args.output:  # empty input: an empty output file
                out = open(args.output, "w", encoding="utf-8")
        finally:
            if out is not None and out is not sys.stdout:
                out.close()


def main() -> None:
    """Console script `relmt-translate`."""
    sys.exit(guarded("relmt-translate", _translate))
