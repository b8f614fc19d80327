#!/usr/bin/env python
"""One table of the committed relmt-serve pages (bench_serve.py's JSON), for the Serving page of the docs site:
each page's server modes at 1, 32 and 128 clients beside its offline references, and the issue's goal ratios.
Nothing is measured here; every figure is read from the JSON that bench_serve.py wrote beside its page.

    python scripts/bench/serve_summary.py      # rewrites the table in docs/serving.md

The table is written into docs/serving.md itself, between the marker comments of scripts/docs/page_block.py, so
that the page reads whole on GitHub too; its links are relative to docs/. tests/test_bench_serve_goals.py
regenerates it in memory and fails when the committed page differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts/docs"))

from page_block import replaced  # noqa: E402

PERF = ROOT / "docs/results/performance"
PAGE = ROOT / "docs/serving.md"
SCRIPT = "scripts/bench/serve_summary.py"  # as the page's markers name it
PAGES = ("serve_cpu", "serve_cpu_1thread", "serve_cpu_aoti", "serve_vs_onmt", "serve_aoti_amd_epyc")


def level(payload: dict, batching: str, clients: int) -> dict | None:
    return next((r for r in payload["levels"] if r["batching"] == batching and r["clients"] == clients), None)


def cell(row: dict | None, what: str) -> str:
    if row is None:
        return "—"
    return f"{row['p50_s'] * 1e3:.1f} ms" if what == "p50" else (
        f"{row['p99_s'] * 1e3:.0f} ms" if what == "p99" else f"{row['sent_per_s']:.1f}")


def rows(name: str, payload: dict, links: str) -> list[str]:
    ref, out = payload["offline"], []
    for batching in dict.fromkeys(r["batching"] for r in payload["levels"]):
        one, mid, top = (level(payload, batching, c) for c in (1, 32, 128))
        errors = sum(sum(r["errors"].values()) for r in payload["levels"] if r["batching"] == batching)
        peer = batching == "onmt_server"
        echo = batching.startswith("echo")  # the server's own floor (bench_serve --echo): it decodes nothing
        engine = batching if peer else f"{payload['engine']}, {batching}"
        offline = "—" if peer or echo else f"{ref['batch32_sent_per_s']:.1f}; {ref['single_p50_s'] * 1e3:.1f} ms"
        ratio = "—" if peer or echo or mid is None else f"{mid['sent_per_s'] / ref['batch32_sent_per_s']:.2f}"
        out.append(f"| [{name}]({links}{name}.md) | {engine} | {payload['threads']} | {cell(one, 'p50')} | "
                   f"{cell(mid, 'rate')} | {cell(mid, 'p99')} | {cell(top, 'rate')} | {errors} | {offline} | {ratio} |")
    return out


def summary(perf: Path, links: str = "results/performance/") -> str:
    found = {name: json.loads(path.read_text()) for name in PAGES if (path := perf / f"{name}.json").is_file()}
    lines = ["Written by `python scripts/bench/serve_summary.py` from the JSON beside each page; each page names its "
             "command, host and date. Compare the figures within a row and with that page's own offline "
             "references: the pages come from different runs, and the host's speed drifts between runs.", "",
             "| page | engine, batching | threads | 1 client p50 | 32 clients, sentences/s | 32 clients p99 | "
             "128 clients, sentences/s | errors (all levels) | offline: sentences/s at 32 per batch; one at a time "
             "p50 | 32 clients ÷ offline at 32 per batch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, payload in found.items():
        lines += rows(name, payload, links)
    hosts = sorted({f"{p['host'].get('cpu', '?')}, {p['host'].get('date', '?')}" for p in found.values()})
    lines += ["", f"Hosts and dates: {'; '.join(hosts)}.", ""]
    return "\n".join(lines)


def page(text: str | None = None, perf: Path = PERF) -> str:
    """docs/serving.md (or `text`) with the table between its markers written anew."""
    return replaced(PAGE.read_text() if text is None else text, SCRIPT, summary(perf))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--perf", type=Path, default=PERF, help="the folder of the serve_*.json pages")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page that holds the table between its markers")
    opts = parser.parse_args(argv)
    opts.page.write_text(page(opts.page.read_text(), opts.perf))
    print(f"wrote the table into {opts.page}")


if __name__ == "__main__":
    main()
