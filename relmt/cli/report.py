"""`relmt-report`: the console entry. The command itself (its arguments, and the markdown, plots and
JSON it writes) lives in relmt/report/cli.py, beside the report it builds: `relmt.report` reads run
directories and knows nothing of the other commands, and its tests and scripts call it as a function."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """Console script `relmt-report`: exit 0, or 2 with one line on stderr for bad input."""
    from relmt.report.cli import main as report

    return report(argv)
