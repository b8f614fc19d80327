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

from relmt.errors import UserError

USAGE = {
    "relmt-prepare": "relmt-prepare [data=<name>] [data.key=value ...]\n"
                     "Build the sentencepiece vocabulary and the encoded data cache, and print a summary.",
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
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(guarded("relmt-prepare", _prepare))
