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


def too_few(last: int, directory: str, paths: list) -> str:
    """Why last=N cannot be met: the step files there, and the run settings that left that many (from the newest
    one's config: a run saves one every train.save_every updates and at its last, and keeps train.keep_last)."""
    from relmt import checkpoint

    names = ", ".join(p.name for p in paths)
    message = f"last={last}: {directory} holds {len(paths)} step checkpoints ({names}), not {last}"
    try:
        train = checkpoint.load(paths[-1], mmap=True).get("config", {}).get("train", {})
    except Exception:  # noqa: BLE001 -- the count alone still says what is wrong
        train = {}
    if {"save_every", "max_steps", "keep_last"} <= train.keys():
        message += (f": its run saved one every train.save_every={train['save_every']} updates over "
                    f"train.max_steps={train['max_steps']} and kept the newest train.keep_last={train['keep_last']}")
    return (message + f"; give last={len(paths)} (or last=0: all of them), or train with a smaller "
            "train.save_every or more updates to have more")


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
            raise UserError(too_few(args.last, args.dir, paths))
    else:
        paths = [Path(p) for p in args.checkpoints]
    averaged = checkpoint.average(paths)
    out = Path(args.output)
    checkpoint.save(averaged, out.parent, [out.name])
    print(f"averaged {len(paths)} checkpoints ({paths[0].name} .. {paths[-1].name}) into {out}")


def main() -> None:
    """Console script `relmt-average`."""
    sys.exit(guarded("relmt-average", _average))
