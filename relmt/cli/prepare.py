"""`relmt-prepare`: the sentencepiece vocabulary and the encoded data cache of a data config."""

from __future__ import annotations

import sys

from relmt.cli.common import guarded, setup_logging


def _prepare(argv: list[str]) -> None:
    from relmt.config import compose
    from relmt.data.prepare import run

    cfg = compose(argv)
    setup_logging()
    if not sys.stderr.isatty():
        import datasets

        datasets.disable_progress_bars()
    run(cfg.data)


def main() -> None:
    """Console script `relmt-prepare`."""
    sys.exit(guarded("relmt-prepare", _prepare))
