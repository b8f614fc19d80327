"""`relmt-average`: the mean of a run's last step checkpoints' weights, or of listed checkpoints."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from relmt.cli.common import EXAMPLES, guarded, parse_args
from relmt.errors import UserError


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


def main() -> None:
    """Console script `relmt-average`."""
    sys.exit(guarded("relmt-average", _average))
