#!/usr/bin/env python
"""Shaw et al. (2018) Tables 1-3 from relmt training runs: a thin wrapper around `relmt-report`
(relmt/cli/report.py), kept for scripts/reproduce/reproduce_toy.sh and old command lines.

    python scripts/reproduce/paper_tables.py runs/reproduce_toy out=docs/results/reproduction name=toy \
        "title=Toy corpus"

It takes relmt-report's arguments (key=value; the --out, --name ... options of before still work) and adds
kind=tables unless a kind is given.
"""

from __future__ import annotations

import sys

from relmt.cli.report import main

if __name__ == "__main__":  # the paper's tables, whatever the runs (relmt-report's default picks them by the runs)
    sys.exit(main(sys.argv[1:] + ([] if any(a.startswith(("--kind", "kind=")) for a in sys.argv) else ["kind=tables"])))
