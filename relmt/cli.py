"""Command-line entry points. With relmt/config.py, the only code that knows about Hydra.

Each command composes configs/ with the user's overrides, converts the result once into the typed
`Config` dataclasses, and hands those to plain functions. Errors in the user's input (a bad key or
value, a missing file) are printed as one message naming the key, file or line; no traceback.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from relmt.errors import UserError

USAGE = {
    "relmt-prepare": "relmt-prepare [data=<name>] [data.key=value ...]\n"
                     "Build the sentencepiece vocabulary and the encoded data cache, and print a summary.",
    "relmt-translate": "relmt-translate checkpoint=PATH [input=FILE] [output=FILE] [beam=4] [lenpen=0.6] [nbest=1]\n"
                       "                [max_tokens=N] [max_len_a=A] [max_len_b=B] [device=auto|cpu|cuda]\n"
                       "Translate stdin (or input) line by line to stdout (or output). Unset decoding options come\n"
                       "from the checkpoint's decode config. With nbest > 1 each line is `index<TAB>score<TAB>text`.",
    "relmt-score": "relmt-score hyp=FILE ref=FILE [src=FILE] [lang=de] [buckets=[10,20,30,40,60]] [out=FILE.json]\n"
                   "sacreBLEU and chrF with signatures, paper-comparable tokenized BLEU (Moses + compound\n"
                   "splitting), and with src, BLEU by source length. Prints a summary; writes JSON to out.",
    "relmt-average": "relmt-average output=AVG.pt (dir=RUN/checkpoints [last=N] | checkpoints=[a.pt,b.pt,...])\n"
                     "Average the weights of the last N step checkpoints in dir (all of them if N=0), or\n"
                     "of the listed checkpoints, into one checkpoint.",
}


def format_error(e: BaseException) -> str:
    """One line per distinct message along the exception's cause chain."""
    messages: list[str] = []
    while e is not None:
        text = str(e).strip()
        if text and text not in messages:
            messages.append(text)
        e = e.__cause__ or e.__context__
    return "\n  ".join(messages)


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)


def guarded(name: str, fn: Callable[[list[str]], None], argv: list[str] | None = None) -> int:
    """Run a command; user errors become a message and exit status 2."""
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
        return 2
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


def parse_args(schema: type, argv: list[str]):
    """key=value arguments validated against a dataclass schema (unknown keys and bad types fail)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), OmegaConf.from_dotlist(argv)))


@dataclass
class AverageArgs:
    output: str = "???"
    dir: str = ""
    last: int = 0
    checkpoints: list[str] = field(default_factory=list)


def _average(argv: list[str]) -> None:
    from pathlib import Path

    from relmt.train import checkpoint

    args = parse_args(AverageArgs, argv)
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
    checkpoint: str = "???"
    input: str = ""  # default: stdin
    output: str = ""  # default: stdout
    beam: int | None = None
    lenpen: float | None = None
    nbest: int = 1
    max_tokens: int | None = None
    max_len_a: float | None = None
    max_len_b: int | None = None
    device: str = "auto"
    progress: bool = True


def read_input(path: str) -> list[str]:
    """Lines of a file, or of stdin for '' or '-', with invalid UTF-8 reported by line number."""
    from pathlib import Path

    from relmt.data.sources import decode_lines, read_lines

    if path in ("", "-"):
        return decode_lines(sys.stdin.buffer.read(), "<stdin>")
    return read_lines(Path(path))


def _translate(argv: list[str]) -> None:
    from relmt.decode.translator import Translator

    args = parse_args(TranslateArgs, argv)
    setup_logging(logging.WARNING)
    translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    overrides = {k: getattr(args, k) for k in ("beam", "lenpen", "max_tokens", "max_len_a", "max_len_b")
                 if getattr(args, k) is not None}
    if args.nbest > overrides.get("beam", translator.decode.beam):
        raise UserError(f"nbest={args.nbest} is more than the beam ({overrides.get('beam', translator.decode.beam)})")
    lines = read_input(args.input)
    results = translator.translate_nbest(lines, progress=args.progress and sys.stderr.isatty(),
                                         nbest=args.nbest, **overrides)
    if args.nbest == 1:
        text = "".join((hyps[0][0] if hyps else "") + "\n" for hyps in results)
    else:
        text = "".join(f"{i}\t{score:.4f}\t{hyp}\n" for i, hyps in enumerate(results) for hyp, score in hyps)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def translate() -> None:
    """Console script `relmt-translate`."""
    sys.exit(guarded("relmt-translate", _translate))


@dataclass
class ScoreArgs:
    hyp: str = "???"
    ref: str = "???"
    src: str = ""
    lang: str = ""  # Moses language for the tokenized BLEU; default: the ref file's suffix, else en
    buckets: list[int] = field(default_factory=lambda: [10, 20, 30, 40, 60])
    out: str = ""  # JSON output; default: <hyp>.score.json


def _score(argv: list[str]) -> None:
    import json
    from pathlib import Path

    from relmt.data.sources import read_lines
    from relmt.evaluate.score import report, score

    args = parse_args(ScoreArgs, argv)
    suffix = Path(args.ref).suffix.lstrip(".")
    lang = args.lang or (suffix if suffix.isalpha() and len(suffix) in (2, 3) else "en")
    srcs = read_lines(Path(args.src)) if args.src else None
    result = score(read_lines(Path(args.hyp)), read_lines(Path(args.ref)), srcs, lang, tuple(args.buckets),
                   names=(args.hyp, args.ref, args.src))
    result.update(hyp=args.hyp, ref=args.ref, src=args.src or None, lang=lang)
    out = Path(args.out or f"{args.hyp}.score.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"written: {out}")


def score() -> None:
    """Console script `relmt-score`."""
    sys.exit(guarded("relmt-score", _score))


def _train_job(dcfg) -> float | None:
    """The Hydra task: typed config in, metrics out. Returns the best validation figure, so that
    Hydra sweepers can optimise it."""
    import datasets
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from relmt.config import to_config
    from relmt.train.loop import train as train_loop

    datasets.disable_progress_bars()
    try:
        cfg = to_config(dcfg)
        if not cfg.out_dir:
            cfg.out_dir = HydraConfig.get().runtime.output_dir
        if int(os.environ.get("RANK", "0")) == 0:  # the resolved, validated config of this run
            OmegaConf.save(OmegaConf.structured(cfg), os.path.join(cfg.out_dir, "config.yaml"))
        metrics = train_loop(cfg)
    except (UserError, ValueError) as e:
        logging.getLogger("relmt").error("%s", format_error(e))
        print(f"relmt-train: error: {format_error(e)}", file=sys.stderr)
        sys.exit(2)
    if metrics["status"] == "completed" and int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {metrics['run_dir']}")
        for split, result in metrics.get("test", {}).items():
            print(f"{split}: BLEU {result['bleu']:.2f} ({result['sentences']} sentences; {result['signature']})")
    return metrics["best"]["value"]


def train() -> None:
    """Console script `relmt-train` (Hydra: `relmt-train model=base data=... train.max_steps=...`,
    sweeps with `-m`)."""
    import hydra

    from relmt.config import config_dir, register_configs

    register_configs()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: one run directory for all ranks
        if not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
            sys.argv.append(f"hydra.run.dir=runs/ddp-{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}")
        if int(os.environ.get("RANK", "0")) > 0:
            sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(_train_job)
    app()
