"""`relmt-score`: BLEU and chrF of a hypothesis file against its reference, with signatures."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from relmt.cli.common import EXAMPLES, guarded, parse_args
from relmt.errors import UserError


@dataclass
class ScoreArgs:
    hyp: str = "???"
    ref: str = "???"
    src: str = ""
    lang: str = ""  # Moses language for the tokenized BLEU; default: the ref file's suffix (English rules if Moses
    # does not know it; the label then says so)
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
    target = args.lang or Path(args.ref).suffix.lstrip(".")  # the labels name it (test.tgt: "tgt, English rules")
    srcs = read_lines(Path(args.src)) if args.src else None
    result = score(read_lines(Path(args.hyp)), read_lines(Path(args.ref)), srcs, target, tuple(args.buckets),
                   names=(args.hyp, args.ref, args.src))
    result.update(hyp=args.hyp, ref=args.ref, src=args.src or None, lang=moses_lang(target))
    print(report(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"written: {args.out}")


def main() -> None:
    """Console script `relmt-score`."""
    sys.exit(guarded("relmt-score", _score))
