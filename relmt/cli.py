"""Command-line entry points. With relmt/config.py, the only code that knows about Hydra.

Each command composes configs/ with the user's overrides, converts the result once into the typed
`Config` dataclasses, and hands those to plain functions. Errors in the user's input (a bad key or
value, a missing file) are printed as one message naming the key, file or line; no traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from relmt.errors import UserError

USAGE = {
    "relmt-prepare": "relmt-prepare [data=<name>] [data.key=value ...]\n"
                     "Build the sentencepiece vocabulary and the encoded data cache, and print a summary.",
    "relmt-translate": "relmt-translate checkpoint=PATH|[A.pt,B.pt,...] [input=FILE] [output=FILE] [reference=FILE]\n"
                       "                [beam=4] [lenpen=0.6] [length_norm=gnmt|power] [nbest=1]\n"
                       "                [max_source_tokens=N] [max_len_a=A] [max_len_b=B] [eos_candidates=t2t|fairseq]"
                       "\n"
                       "                [max_source_len=1024] [buffer_lines=2000]"
                       " [sampling=true] [topk=0] [topp=1.0] [temperature=1.0] [seed=1]\n"
                       "                [precision=auto|fp32|bf16|fp16] [device=auto|cpu|cuda]\n"
                       "                [engine=torch|onnx|aoti|ctranslate2]\n"
                       "Translate stdin (or input) line by line to stdout (or output), buffer_lines lines at a time:\n"
                       "each chunk is written, in input order, before the next is read. Unset decoding options come\n"
                       "from the checkpoint's decode config, and precision from its train.precision. A source over\n"
                       "max_source_len tokens is truncated with a warning naming its line (0 = no cap). A batch\n"
                       "holds at most max_source_tokens source tokens (padding included). With nbest > 1 each\n"
                       "line is `index<TAB>score<TAB>text`, index counting input lines from 0.\n"
                       "A list of checkpoints decodes them as an ensemble (the mean of their probabilities).\n"
                       "sampling=true draws `beam` samples per line (topk, topp, temperature; seeded by seed\n"
                       "and the line number) and returns the nbest best. With reference=FILE nothing is decoded:\n"
                       "each line is `logprob<TAB>tokens<TAB>logprob/tokens`, the natural-log probability of the\n"
                       "reference line given the input line, over its tokens and EOS (forced decoding).\n"
                       "engine runs the network: torch (relmt's modules), onnx (onnxruntime) or aoti (AOTInductor,\n"
                       "needs a C++ compiler), both with relmt's search: every model and decoding option, or\n"
                       "ctranslate2 (its own search; no per-head tables), all three on the CPU in float32, from an\n"
                       "artefact made on first use in <checkpoint>.engines/.",
    "relmt-score": "relmt-score hyp=FILE ref=FILE [src=FILE] [lang=de] [buckets=[10,20,30,40,60]] [out=FILE.json]\n"
                   "sacreBLEU and chrF with signatures, paper-comparable tokenized BLEU (Moses + compound\n"
                   "splitting), and with src, BLEU by source length. Prints a summary; with out=FILE.json it also\n"
                   "writes every figure there as JSON (nothing is written without out=).",
    "relmt-average": "relmt-average output=AVG.pt (dir=RUN/checkpoints [last=N] | checkpoints=[a.pt,b.pt,...])\n"
                     "Average the weights of the last N step checkpoints in dir (all of them if N=0), or\n"
                     "of the listed checkpoints, into one checkpoint.",
    "relmt-export": "relmt-export checkpoint=PATH output=DIR [format=ctranslate2|onnx|aoti] [quantization=int8|...]\n"
                    "             [max_positions=2048] [force=false]\n"
                    "Write a CTranslate2 model directory (model.bin, config.json, shared_vocabulary.json) with the\n"
                    "checkpoint's sentencepiece model beside it (sentencepiece.model). quantization: any of\n"
                    "CTranslate2's weight types (default: float32; format=onnx and aoti write float32 only).\n"
                    "max_positions: the longest source or target the absolute encodings cover (abs, both and\n"
                    "none). Needs ctranslate2 (the export extra); a\n"
                    "model with per-head relative tables (model.relative_share_heads=false) cannot be exported.\n"
                    "format=onnx writes encoder.onnx and step.onnx (every model: relmt's searches run on them with\n"
                    "onnxruntime, as relmt-translate engine=onnx does) with sentencepiece.model (needs relmt[onnx]);\n"
                    "format=aoti compiles them with AOTInductor into encoder.pt2 and step.pt2 (engine=aoti).",
}
# One whole command per command, for the message that a missing required argument gets
EXAMPLES = {
    "relmt-translate": "relmt-translate checkpoint=runs/x/checkpoints/best.pt input=test.en output=test.de",
    "relmt-score": "relmt-score hyp=test.hyp.de ref=test.de",
    "relmt-average": "relmt-average output=averaged.pt dir=runs/x/checkpoints last=5",
    "relmt-export": "relmt-export checkpoint=runs/x/checkpoints/best.pt output=exported/x",
}


def format_error(e: BaseException) -> str:
    """One line per distinct message along the exception's cause chain."""
    messages: list[str] = []
    while e is not None:
        text = str(e).strip()
        if text and text not in messages:
            messages.append(text)
        # `raise ... from None` sets __suppress_context__: the context is then not part of the story
        e = e.__cause__ if e.__cause__ is not None else (None if e.__suppress_context__ else e.__context__)
    return "\n  ".join(messages)


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)


# Exit statuses, documented in the README. A scheduler should requeue EXIT_INTERRUPTED: the run
# stopped on SIGTERM/SIGINT and continues with train.resume=true.
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 3


def guarded(name: str, fn: Callable[[list[str]], None], argv: list[str] | None = None) -> int:
    """Run a command; user errors become a message and EXIT_USER_ERROR, Ctrl-C EXIT_INTERRUPTED."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE[name])
        return 0
    try:
        fn(argv)
    except (UserError, ValueError, HydraException, OmegaConfBaseException) as e:
        print(f"{name}: error: {format_error(e)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _prepare(argv: list[str]) -> None:
    from relmt.config import compose
    from relmt.data.prepare import run

    cfg = compose(argv)
    setup_logging()
    if not sys.stderr.isatty():
        import datasets

        datasets.disable_progress_bars()
    run(cfg.data)


def prepare() -> None:
    """Console script `relmt-prepare`."""
    sys.exit(guarded("relmt-prepare", _prepare))


def closest(word: str, choices: list[str]) -> str:
    """' (did you mean X?)' for the choice nearest `word`, or '' when none is near."""
    import difflib

    near = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    near = near or sorted((c for c in choices if word.startswith(c) or c.startswith(word)), key=len)[-1:]
    return f" (did you mean {near[0]}?)" if near else ""


def required(keys: list[str], example: str) -> UserError:
    """'checkpoint= is required, e.g. relmt-translate checkpoint=...', where OmegaConf would name the
    schema class and the full_key."""
    return UserError(f"{' and '.join(k + '=' for k in keys)} {'is' if len(keys) == 1 else 'are'} required"
                     + (f", e.g. {example}" if example else ""))


def parse_args(schema: type, argv: list[str], example: str = ""):
    """key=value arguments validated against a dataclass schema: a bare word, an unknown key (with the
    nearest known one), a missing required one (a field left at "???"; with `example`, a whole
    command) and a bad type fail, naming the argument. Required keys are checked first."""
    from dataclasses import fields

    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    keys = [f.name for f in fields(schema)]
    needed = [f.name for f in fields(schema) if f.default == "???"]
    words = " ".join(f"{k}=..." for k in needed) or f"{keys[0]}=..."
    for arg in argv:
        key, eq, _ = arg.partition("=")
        if not eq:
            raise UserError(f"'{arg}': arguments are key=value, e.g. {example or words} (keys: {', '.join(keys)})")
        if key.split(".")[0] not in keys:
            raise UserError(f"{key}: no such argument{closest(key, keys)}; the arguments are {', '.join(keys)}")
    given = {key for key, _, value in (a.partition("=") for a in argv) if value != "???"}
    if missing := [k for k in needed if k not in given]:
        raise required(missing, example)
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))
    except MissingMandatoryValue as e:  # the check above should leave none; said the same way all the same
        raise required([str(e.full_key)], example) from None


@dataclass
class AverageArgs:
    output: str = "???"
    dir: str = ""
    last: int = 0
    checkpoints: list[str] = field(default_factory=list)


def _average(argv: list[str]) -> None:
    from pathlib import Path

    from relmt import checkpoint

    args = parse_args(AverageArgs, argv, EXAMPLES["relmt-average"])
    if bool(args.dir) == bool(args.checkpoints):
        raise UserError("give either dir=RUN/checkpoints (with last=N) or checkpoints=[a.pt,b.pt,...]")
    if args.dir:
        paths = checkpoint.step_files(Path(args.dir))
        paths = paths[-args.last:] if args.last else paths
        if not paths:
            raise UserError(f"dir={args.dir}: no step_N.pt checkpoints there")
        if args.last and len(paths) < args.last:
            raise UserError(f"last={args.last}: {args.dir} holds only {len(paths)} step checkpoints")
    else:
        paths = [Path(p) for p in args.checkpoints]
    averaged = checkpoint.average(paths)
    out = Path(args.output)
    checkpoint.save(averaged, out.parent, [out.name])
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} .. {paths[-1].name}) into {out}")


def average() -> None:
    """Console script `relmt-average`."""
    sys.exit(guarded("relmt-average", _average))


@dataclass
class TranslateArgs:
    checkpoint: Any = "???"  # a path, or a list of them ([a.pt,b.pt]) for an ensemble
    input: str = ""  # default: stdin
    output: str = ""  # default: stdout
    reference: str = ""  # score this file's lines as translations of the input's (forced decoding)
    # decoding: unset (None) keeps the checkpoint's decode config
    beam: int | None = None
    lenpen: float | None = None
    length_norm: str = ""  # gnmt | power
    nbest: int = 1
    max_source_tokens: int | None = None  # source tokens per batch, padding included
    max_len_a: float | None = None
    max_len_b: int | None = None
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
    compile: bool = False  # torch.compile the decoder step (relmt/decode/compiled.py): for large inputs
    engine: str = "torch"  # torch | onnx | aoti | ctranslate2 (relmt/export/engines.py)
    progress: bool = True


TRANSLATE_DECODE_KEYS = ("beam", "lenpen", "length_norm", "nbest", "max_source_tokens", "max_len_a", "max_len_b",
                         "eos_candidates",
                         "max_source_len", "sampling", "topk", "topp", "temperature", "seed")
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


def misaligned(name: str, lines: int, reference: str, references: int) -> UserError:
    return UserError(f"{name} has {lines} lines but reference={reference} has {references}: scoring needs one "
                     "reference line per input line")


def read_references(reference: str, source: str) -> list[str]:
    """The lines of the reference file, checked against the line count of the source file (stdin is
    checked while it is read)."""
    from pathlib import Path

    from relmt.data.sources import read_lines

    refs = read_lines(Path(reference))
    if source not in ("", "-"):
        with open(source, "rb") as f:  # lines as read_input splits them
            lines = sum(1 for _ in f)
        if lines != len(refs):
            raise misaligned(source, lines, reference, len(refs))
    return refs


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
    from relmt.runtime import tune_cpu

    for arg in argv:
        key = arg.partition("=")[0]
        if key in TRANSLATE_RENAMED_KEYS:
            raise UserError(f"{key}: renamed {TRANSLATE_RENAMED_KEYS[key]} (source tokens per decoding batch); "
                            f"give {TRANSLATE_RENAMED_KEYS[key]}={arg.partition('=')[2] or 'N'}")
    args = parse_args(TranslateArgs, argv, EXAMPLES["relmt-translate"])
    setup_logging(logging.WARNING)
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
    tune_cpu()  # the command owns its process; the Translator API leaves this to its caller
    translator = Translator.from_checkpoints(paths, device=args.device, precision=args.precision or None,
                                             compile=args.compile, engine=args.engine)
    overrides = {k: getattr(args, k) for k in TRANSLATE_DECODE_KEYS if getattr(args, k) not in (None, "")}
    translator.decode = decode_with_overrides(translator.decode, overrides)

    from tqdm import tqdm

    def output(first: int, lines: list[str]) -> str:
        if refs is not None:  # forced decoding: one score line per input line
            scores = translator.score(lines, refs[first - 1:first - 1 + len(lines)], name=name, first_line=first)
            return "".join(f"{s.logprob:.6f}\t{s.tokens}\t{s.per_token:.6f}\n" for s in scores)
        results = translator.translate_nbest(lines, name=name, first_line=first)
        if translator.decode.nbest == 1:
            return "".join((hyps[0][0] if hyps else "") + "\n" for hyps in results)
        return "".join(f"{first - 1 + i}\t{score:.4f}\t{hyp}\n"
                       for i, hyps in enumerate(results) for hyp, score in hyps)

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
            if out is None and args.output:  # empty input: an empty output file
                out = open(args.output, "w", encoding="utf-8")
        finally:
            if out is not None and out is not sys.stdout:
                out.close()


def translate() -> None:
    """Console script `relmt-translate`."""
    sys.exit(guarded("relmt-translate", _translate))


@dataclass
class ScoreArgs:
    hyp: str = "???"
    ref: str = "???"
    src: str = ""
    lang: str = ""  # Moses language for the tokenized BLEU; default: the ref file's suffix if Moses knows it, else en
    buckets: list[int] = field(default_factory=lambda: [10, 20, 30, 40, 60])
    out: str = ""  # JSON output; none without it (the hypothesis may sit in a read-only or shared folder)


def _score(argv: list[str]) -> None:
    import json
    from pathlib import Path

    from relmt.data.sources import read_lines
    from relmt.evaluate.metrics import moses_lang, report, score

    args = parse_args(ScoreArgs, argv, EXAMPLES["relmt-score"])
    if args.lang and moses_lang(args.lang) != args.lang:
        raise UserError(f"lang={args.lang}: Moses has no tokenization rules for it; give a code such as de, "
                        "en or fr, or leave lang out to use the ref file's suffix (else en)")
    lang = args.lang or moses_lang(Path(args.ref).suffix.lstrip("."))
    srcs = read_lines(Path(args.src)) if args.src else None
    result = score(read_lines(Path(args.hyp)), read_lines(Path(args.ref)), srcs, lang, tuple(args.buckets),
                   names=(args.hyp, args.ref, args.src))
    result.update(hyp=args.hyp, ref=args.ref, src=args.src or None, lang=lang)
    print(report(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"written: {args.out}")


def score() -> None:
    """Console script `relmt-score`."""
    sys.exit(guarded("relmt-score", _score))


@dataclass
class ExportArgs:
    checkpoint: str = "???"
    output: str = "???"
    format: str = "ctranslate2"
    quantization: str = ""  # a CTranslate2 weight type (onnx and aoti write float32 only); default: float32
    max_positions: int = 2048  # rows of the absolute-encoding table: the longest source or target
    force: bool = False  # replace an existing output directory


def _export(argv: list[str]) -> None:
    args = parse_args(ExportArgs, argv, EXAMPLES["relmt-export"])
    if args.format not in ("ctranslate2", "onnx", "aoti"):
        raise UserError(f"format={args.format}: the export formats are ctranslate2, onnx and aoti")
    from relmt.export.engines import Engine, check_quantization

    check_quantization(Engine(args.format), args.quantization)
    if args.format in ("onnx", "aoti"):
        from relmt.export.engines import export_checkpoint

        if args.format == "onnx":
            try:
                import onnxruntime  # noqa: F401
                import onnxscript  # noqa: F401
            except ImportError as e:
                raise UserError(f"format=onnx needs onnx, onnxscript and onnxruntime ({e}): "
                                "pip install 'relmt[onnx]'") from None
        out = export_checkpoint(args.checkpoint, args.output, Engine(args.format), force=args.force)
        made = "ONNX: encoder.onnx and step.onnx" if args.format == "onnx" else "AOTInductor: encoder.pt2 and step.pt2"
        print(f"exported {args.checkpoint} to {out} ({made}, for relmt's searches)")
        return
    try:
        from relmt.export.ctranslate2 import export as export_ctranslate2
    except ImportError as e:
        raise UserError(f"format=ctranslate2 needs the ctranslate2 package ({e}): "
                        "pip install 'relmt[export]'") from None
    out = export_ctranslate2(args.checkpoint, args.output, quantization=args.quantization or None,
                 max_positions=args.max_positions, force=args.force)
    print(f"exported {args.checkpoint} to {out} (CTranslate2, {args.quantization or 'float32'})")


def export() -> None:
    """Console script `relmt-export`."""
    sys.exit(guarded("relmt-export", _export))


def run_dir_label(path: str) -> str:
    """The run directory as recorded in config.yaml and metrics.json: relative to the working directory
    when it lies below it (Hydra hands an absolute path), so that committed run artifacts name no
    machine's paths. Hydra does not change the working directory (hydra.job.chdir=false)."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


# What Hydra writes into a run directory before the task starts (rank 0; the job's log is train.log)
HYDRA_RUN_FILES = {".hydra", "train.log"}


# What the existing run directories named on the command line held before Hydra wrote into them: each
# .hydra/*.yaml's bytes and train.log's size, so that a refused command changes nothing there.
_BEFORE: dict = {}


def remember_run_dirs(argv: list[str]) -> None:
    """Note what hydra.run.dir (or each job directory of hydra.sweep.dir) holds, if it exists."""
    from pathlib import Path

    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in ("hydra.run.dir", "hydra.sweep.dir") or not Path(value.strip("'\"")).is_dir():
            continue
        root = Path(value.strip("'\""))
        for run in [root, *(p for p in root.iterdir() if p.is_dir() and key == "hydra.sweep.dir")]:
            _BEFORE[run.resolve()] = {"log": (run / "train.log").stat().st_size if (run / "train.log").is_file()
                                      else None, "hydra": {f.name: f.read_bytes() for f in (run / ".hydra").glob("*")
                                                           if f.is_file()}}


def restore_run_dir(path: str) -> None:
    """Put back what Hydra wrote into an existing run directory for a command that was then refused:
    train.log cut to its old length (or removed), .hydra/ as it was."""
    from pathlib import Path

    run = Path(path)
    before = _BEFORE.get(run.resolve())
    if before is None:
        return
    log = run / "train.log"
    if before["log"] is None:
        log.unlink(missing_ok=True)
    elif log.is_file():
        os.truncate(log, before["log"])
    hydra = run / ".hydra"
    for f in hydra.glob("*") if hydra.is_dir() else []:
        if f.name not in before["hydra"]:
            f.unlink()
    for name, data in before["hydra"].items():
        (hydra / name).write_bytes(data)
    if hydra.is_dir() and not any(hydra.iterdir()):
        hydra.rmdir()


def remove_unstarted_run_dir(path: str) -> None:
    """Remove a run directory that holds nothing but what Hydra wrote before the command was
    refused, and the empty folders above it up to the working directory, so that a refused command
    leaves no new run directory behind. A directory holding
    anything else (a run's checkpoints or logs, a user's files) is left as it is."""
    import shutil
    from pathlib import Path

    run = Path(path)
    if (run / ".hydra").is_dir() and {p.name for p in run.iterdir()} <= HYDRA_RUN_FILES:
        shutil.rmtree(run, ignore_errors=True)
        # and the folders Hydra made for it (runs/<date>/), when nothing else is in them
        for parent in run.parents if not run.is_absolute() else []:
            if parent == Path(".") or any(parent.iterdir()):
                break
            parent.rmdir()


def shell_word(word: str) -> str:
    """`word` as one POSIX shell word: bare when it needs no quoting, else in double quotes when
    nothing in it is special there, else shlex's single quotes."""
    import shlex

    if shlex.quote(word) == word:
        return word
    return f'"{word}"' if not set(word) & set('"$`\\!') else shlex.quote(word)


def hydra_value(value: str) -> str:
    """A string as a Hydra override value: quoted when it holds characters Hydra's grammar reads
    (= , [ ] { } ( ) quotes spaces), as a sweep job's directory name does (model.positions=abs,...)."""
    import re

    if re.fullmatch(r"[\w./:@+-]+", value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def resume_command(task_overrides: list[str], run_dir: str) -> str:
    """The command that continues a run: its own overrides, train.resume=true and its directory, each
    quoted so that it works pasted into a POSIX shell."""
    args = [o for o in task_overrides if not o.startswith(("train.resume=", "hydra.run.dir="))]
    return " ".join(["relmt-train", *map(shell_word, args), "train.resume=true",
                     shell_word(f"hydra.run.dir={hydra_value(run_dir)}")])


# Overrides that the resume commands set themselves (or that Hydra adds for -m)
RESUME_SETS = ("train.resume=", "hydra.run.dir=", "hydra.sweep.dir=", "hydra.mode=")


def sweep_resume_command(overrides: list[str], sweep_dir: str) -> str:
    """The command that requeues a whole -m sweep (README, Exit status): its overrides as given,
    train.resume=true and its directory. Its completed jobs are skipped, the others resume or start."""
    args = [o for o in overrides if not o.startswith(RESUME_SETS)]
    return " ".join(["relmt-train", "-m", *map(shell_word, args), "train.resume=true",
                     shell_word(f"hydra.sweep.dir={hydra_value(sweep_dir)}")])


def sweep_overrides(hydra) -> list[str]:
    """The overrides a sweep was launched with, the task's (model.positions=abs,rel) and then Hydra's
    own (hydra/launcher=parallel), from the multirun.yaml that Hydra writes into the sweep directory:
    a job's HydraConfig holds only its own point of the sweep, which is the fallback."""
    from pathlib import Path

    import yaml

    try:
        saved = yaml.safe_load((Path(str(hydra.sweep.dir)) / "multirun.yaml").read_text())["hydra"]["overrides"]
        given = [*saved["task"], *saved["hydra"]]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        given = [*hydra.overrides.task, *hydra.overrides.hydra]
    return [str(o) for o in given if not str(o).startswith(RESUME_SETS)]


def resume_hint(hydra, out_dir: str) -> str:
    """What an interrupted job prints: for a job of a -m sweep, the sweep requeued; else the run
    resumed. `hydra` is the job's HydraConfig, None when _train_job is called as a function."""
    from hydra.types import RunMode

    if hydra is not None and hydra.mode == RunMode.MULTIRUN:
        return sweep_resume_command(sweep_overrides(hydra), run_dir_label(str(hydra.sweep.dir)))
    return resume_command(list(hydra.overrides.task) if hydra is not None else [], out_dir)


def log_to_file(level: int, message: str) -> None:
    """`message` into the run's train.log only: the terminal gets it once, from the caller's print."""
    logger = logging.getLogger("relmt")
    record = logger.makeRecord(logger.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def _train_job(dcfg) -> float | None:
    """The Hydra task: typed config in, metrics out. Returns the best validation figure, so that
    Hydra sweepers can optimise it. Exits EXIT_USER_ERROR on bad input and EXIT_INTERRUPTED when a
    signal stopped the run (which also ends a sweep: the user asked to stop). The loop writes
    config.yaml once it accepts the run, so a refused command leaves the run directory as it was."""
    import datasets
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from relmt.config import to_config
    from relmt.train.loop import train as train_loop

    datasets.disable_progress_bars()
    hydra = HydraConfig.get() if HydraConfig.initialized() else None  # None: called as a function (tests)
    out_dir = dcfg.out_dir or run_dir_label(hydra.runtime.output_dir)
    try:
        cfg = to_config(dcfg)
        cfg.out_dir = out_dir
        if cfg.train.resume and hydra is not None and hydra.mode == RunMode.RUN and not any(
                o.startswith("hydra.run.dir=") for o in hydra.overrides.hydra):
            raise UserError(f"train.resume=true needs the run's directory, and none was given (Hydra made a new "
                            f"one, {out_dir}): add hydra.run.dir=<the run's directory>, e.g. "
                            "hydra.run.dir=runs/2026-11-22/10-00-00")
        metrics = train_loop(cfg)
    except (UserError, ValueError) as e:
        log_to_file(logging.ERROR, format_error(e))
        print(f"relmt-train: error: {format_error(e)}", file=sys.stderr)
        if int(os.environ.get("RANK", "0")) == 0:
            logging.shutdown()  # train.log closed before it is cut back
            restore_run_dir(out_dir)
            remove_unstarted_run_dir(out_dir)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt as e:  # a second SIGINT/SIGTERM, or Ctrl-C before the loop started
        message = f"relmt-train: interrupted: {str(e) or 'Ctrl-C'}; the checkpoints saved so far are kept"
        log_to_file(logging.WARNING, message)
        print(message, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if metrics["status"] == "interrupted":
        message = f"relmt-train: interrupted; resume with: {resume_hint(hydra, out_dir)}"
        log_to_file(logging.WARNING, message)
        print(message, file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
    if metrics["status"] == "completed" and int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {metrics['run_dir']}")
        for split, result in metrics.get("test", {}).items():
            print(f"{split}: BLEU {result['bleu']:.2f} ({result['sentences']} sentences; {result['signature']})")
    return metrics["best"]["value"]


def sweep_values(value: str) -> list[str]:
    """The values of a Hydra override: `a,b` sweeps both; a list ([1,2]), a quoted string or a sweep
    function (range(...)) is taken as one value."""
    if value[:1] in "[{'\"" or "(" in value:
        return [value]
    return value.split(",")


def check_overrides(argv: list[str]) -> list[str]:
    """What is wrong with the command line's key=value overrides, as messages naming the nearest valid
    key, config or value: a key that is not in relmt.config's schema, a config group option with no
    configs/<group>/<name>.yaml, or a value that is not one of a field's enum values. Hydra reports
    these with status 1, and for a key typo advises `+key=`, which adds a key relmt would not read."""
    import dataclasses
    import enum
    import types
    import typing

    from relmt.config import Config, config_dir

    groups = {d.name: sorted(f.stem for f in d.glob("*.yaml")) for d in config_dir().iterdir()
              if d.is_dir() and d.name != "hydra"}
    problems = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if not eq or key.startswith(("-", "+", "~", "hydra")) or "@" in key:  # -m, additions, deletions,
            continue  # Hydra's own keys and package overrides (group@pkg=option) are Hydra's to check
        if key in groups:
            for name in sweep_values(value):
                if name not in groups[key] and "(" not in name:
                    problems.append(f"{key}={name}: no such config{closest(name, groups[key])}; the {key} "
                                    f"configs (configs/{key}/) are {', '.join(groups[key])}")
            continue
        kind, path, parts = Config, [], key.split(".")
        for i, part in enumerate(parts):
            if typing.get_origin(kind) is dict:  # data.splits.<any name>
                kind = typing.get_args(kind)[1]
                path.append(part)
                continue
            fields = typing.get_type_hints(kind) if dataclasses.is_dataclass(kind) else {}
            if part not in fields:
                near = closest(part, list(fields)).removeprefix(" (did you mean ").removesuffix("?)")
                hint = f" (did you mean {'.'.join([*path, near, *parts[i + 1:]])}?)" if near else ""
                where = " in " + ".".join(path) if path else ""
                problems.append(f"{key}: no such key{where}{hint}")
                break
            kind = fields[part]
            path.append(part)
        else:
            if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
                kind = next(a for a in typing.get_args(kind) if a is not type(None))
            if isinstance(kind, type) and issubclass(kind, enum.Enum):
                allowed = [e.value for e in kind]
                for name in sweep_values(value):
                    if name not in allowed and name != "null" and "(" not in name:
                        problems.append(f"{key}={name}: not a valid value{closest(name, allowed)}; the values are "
                                        f"{', '.join(allowed)}")
    return problems


def renamed_overrides(argv: list[str]) -> list[str]:
    """For each key=value of `argv` whose key was renamed (relmt.config.RENAMED_KEYS), what to use
    instead: Hydra alone would only say that the old key is not in the schema."""
    from relmt.config import RENAMED_KEYS

    keys = [a.split("=", 1)[0].lstrip("+~") for a in argv if "=" in a]
    return [f"{key} was renamed: use {RENAMED_KEYS[key]}" for key in keys if key in RENAMED_KEYS]


def train() -> None:
    """Console script `relmt-train` (Hydra: `relmt-train model=base data=... train.max_steps=...`,
    sweeps with `-m`)."""
    import hydra

    from relmt.config import config_dir, register_configs

    problems = renamed_overrides(sys.argv[1:]) or check_overrides(sys.argv[1:])
    if problems:
        print(f"relmt-train: error: {'; '.join(problems)}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    register_configs()
    remember_run_dirs(sys.argv[1:])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: one run directory for all ranks
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
            sys.argv.append(f"hydra.run.dir=runs/ddp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
        if int(os.environ.get("RANK", "0")) > 0:
            sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(_train_job)
    app()
