"""What every command shares: its usage text, the guard that turns a user's error into one message
and an exit status (`guarded`), and the key=value argument parsing (`parse_args`)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from relmt.errors import UserError

USAGE = {
    "relmt-prepare": "relmt-prepare [data=<name>] [data.key=value ...]\n"
                     "Build the sentencepiece vocabulary and the encoded data cache, and print a summary.",
    "relmt-translate": "relmt-translate checkpoint=PATH|[A.pt,B.pt,...] [input=FILE] [output=FILE] [reference=FILE]\n"
                       "                [beam=4] [lenpen=0.6] [length_norm=gnmt|power] [nbest=1]\n"
                       "                [max_source_tokens=N] [max_sentences=0] [max_len_a=A] [max_len_b=B]\n"
                       "                [eos_candidates=t2t|fairseq] [max_source_len=1024] [buffer_lines=2000]\n"
                       "                [sampling=true] [topk=0] [topp=1.0] [temperature=1.0] [seed=1]\n"
                       "                [constraints=ordered|unordered] [prefix=FILE] [alignments=true]\n"
                       "                [token_scores=true] [alignment_layer=-2] [tgt_lang=LANG]\n"
                       "                [precision=auto|fp32|bf16|fp16] [device=auto|cpu|cuda] [compile=true]\n"
                       "                [engine=torch|onnx|aoti|ctranslate2] [quantization=int8] [progress=false]\n"
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
                       "artefact made on first use in <checkpoint>.engines/; quantization=int8 (engine=aoti) runs\n"
                       "int8 linear maps. constraints=: each input line is the source, then TAB-separated target\n"
                       "phrases every output must contain (beam search; a beam wider than the phrases, e.g. beam=4).\n"
                       "prefix=FILE: the target each output begins with, a line per input line. alignments=true and\n"
                       "token_scores=true append a TAB and the Pharaoh word links / each piece's log-probability.\n"
                       "tgt_lang: a multilingual model's target language. compile=true: torch.compile the decoder\n"
                       "step (large inputs). progress=false: no progress bar. docs/translating.md says more.",
    "relmt-score": "relmt-score hyp=FILE ref=FILE [src=FILE] [lang=de] [buckets=[10,20,30,40,60]] [out=FILE.json]\n"
                   "sacreBLEU and chrF with signatures, paper-comparable tokenized BLEU (Moses + compound\n"
                   "splitting), and with src, BLEU by source length. Prints a summary; with out=FILE.json it also\n"
                   "writes every figure there as JSON (nothing is written without out=).",
    "relmt-average": "relmt-average output=AVG.pt (dir=RUN/checkpoints [last=N] | checkpoints=[a.pt,b.pt,...])\n"
                     "Average the weights of the last N step checkpoints in dir (all of them if N=0), or\n"
                     "of the listed checkpoints, into one checkpoint.",
    "relmt-export": "relmt-export checkpoint=PATH output=DIR [format=ctranslate2|onnx|aoti|argos]\n"
                    "             [quantization=int8|...] [max_positions=2048] [force=false]\n"
                    "             [source_lang=en target_lang=de package_version=1.0]\n"
                    "Write a CTranslate2 model directory (model.bin, config.json, shared_vocabulary.json) with the\n"
                    "checkpoint's sentencepiece model beside it (sentencepiece.model). quantization: any of\n"
                    "CTranslate2's weight types (default: float32; format=onnx and aoti write float32 only).\n"
                    "max_positions: the longest source or target the absolute encodings cover (abs, both and\n"
                    "none). Needs ctranslate2 (the export extra); a\n"
                    "model with per-head relative tables (model.relative_share_heads=false) cannot be exported.\n"
                    "format=onnx writes encoder.onnx and step.onnx (every model: relmt's searches run on them with\n"
                    "onnxruntime, as relmt-translate engine=onnx does) with sentencepiece.model (needs relmt[onnx]);\n"
                    "format=aoti compiles them with AOTInductor into encoder.pt2, step.pt2 and search.pt2\n"
                    "(engine=aoti). format=argos writes an Argos Translate package (output=NAME.argosmodel: the\n"
                    "CTranslate2 model, sentencepiece.model, a spaCy sentence splitter, metadata.json) that\n"
                    "argostranslate and LibreTranslate install (needs relmt[argos]; languages default to data.src\n"
                    "and data.tgt).",
    "relmt-report": "relmt-report RUN_DIR... out=DIR name=NAME [kind=tables|runs|length|tuning] [title=TEXT]\n"
                    "             [command=TEXT] [refs=DIR | refs=[DATA=DIR,...]] [bootstrap_samples=1000]\n"
                    "             [train_max_words=N | train_max_words=[DATA=N,...]] [overwrite=false]\n"
                    "Read completed run directories (or folders of them) and write out/NAME.md and NAME.json: a\n"
                    "row per run (kind=runs; a sweep job named after its swept overrides), the paper's tables,\n"
                    "claims and plots (kind=tables; the default for runs on its data sets or with a paired test),\n"
                    "BLEU by source length (kind=length; the default for name=length) or the validation split\n"
                    "by setting (kind=tuning). refs: the folder of the reference files {split}.{tgt}, for the\n"
                    "paired bootstrap tests (DATA=DIR: data set DATA's runs only; repeatable). An existing report\n"
                    "of the same name is replaced only with overwrite=true. --out DIR and --name NAME, the\n"
                    "options of before, still work. docs/reproducing.md says more.",
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
    if any("is not a subclass of CorpusConfig" in m for m in messages):  # data.corpora.N.key=... past the list
        messages.append("data.corpora.N.key=value changes a corpus the data config already lists; to add one, write "
                        "the list in a data YAML of your own (docs/data.md, \"Your own corpora in a data YAML\")")
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
    import yaml

    for arg in argv:  # each value is read as YAML, where a bare * or & starts an alias or anchor
        try:
            OmegaConf.from_dotlist([arg])
        except yaml.YAMLError as e:
            raise UserError(f"{arg}: not a value YAML can read ({getattr(e, 'problem', None) or e}); quote it, "
                            f"e.g. {arg.partition('=')[0]}=\"'{arg.partition('=')[2]}'\"") from None
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))
    except MissingMandatoryValue as e:  # the check above should leave none; said the same way all the same
        raise required([str(e.full_key)], example) from None
