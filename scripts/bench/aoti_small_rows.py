#!/usr/bin/env python
"""engine=aoti's two search graphs by batch size: where search_small.pt2 pays, and where SMALL_ROWS puts the switch.

relmt/export/aoti.py compiles the search graph twice: search.pt2 with the GEMMs of oneDNN's prepacked products, and
search_small.pt2 with inductor's C++ GEMM template autotuned at a few rows; a step of at most SMALL_ROWS hypotheses
(sentences x beams) runs the small one. This script decodes the first sentences of --src with the checkpoint's aoti
export (made on first use) at each --batches size, beam 4, every hypothesis forced to --length tokens (bench_peers'
regime), three ways in turn: search.pt2 alone, search_small.pt2 alone, and the switch at SMALL_ROWS (relmt's
default), interleaved over --repeats; it writes the medians in sentences per second. Run nothing else meanwhile.

    python scripts/bench/aoti_small_rows.py --checkpoint /tmp/relmt-peers/r1/relmt-rel/checkpoints/last.pt \
        --src /tmp/relmt-peers/corpus/test.src \
        --out docs/results/engines/aoti_small_rows.json --md docs/results/engines/aoti_small_rows.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from relmt.bench import command_line, hardware, write_json
from relmt.decode.translator import Translator
from relmt.export import aoti
from relmt.report.aggregate import md_table
from relmt.runtime import tune_cpu

# SMALL_ROWS for each way: no step small enough for search_small.pt2, every step, and relmt's switch
WAYS = {"search.pt2 alone": 0, "search_small.pt2 alone": 1 << 30, f"switch at {aoti.SMALL_ROWS} rows": aoti.SMALL_ROWS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 32])
    ap.add_argument("--sentences", type=int, default=128,
                    help="sentences decoded per measurement (at least 16 batches, at most --src's)")
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tune_cpu()
    translator = Translator.from_checkpoint(args.checkpoint, device="cpu", engine="aoti")
    lines = args.src.read_text(encoding="utf-8").splitlines()
    settings = dict(beam=4, lenpen=0.6, min_len=args.length, max_len_a=0.0, max_len_b=args.length,
                    max_source_tokens=10 ** 9)
    translator.translate(lines[:8], max_sentences=4, **settings)  # warm-up
    speed: dict[str, dict[int, list[float]]] = {way: {b: [] for b in args.batches} for way in WAYS}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.repeats):
        for batch in args.batches:
            n = min(len(lines), max(args.sentences, 16 * batch))
            for way, rows in WAYS.items():
                aoti.SMALL_ROWS = rows  # read at every step by relmt.export.aoti.by_rows
                t0 = time.perf_counter()
                hyps = translator.translate(lines[:n], max_sentences=batch, **settings)
                speed[way][batch].append(n / (time.perf_counter() - t0))
                outputs.setdefault(f"{way}/{batch}", hyps)
    shortest = min(map(len, outputs.values()))  # batch sizes decode different numbers of sentences
    same = len({tuple(h[:shortest]) for h in outputs.values()}) == 1
    medians = {way: {b: statistics.median(v) for b, v in by.items()} for way, by in speed.items()}
    payload = {"command": command_line(), "hardware": hardware(), "settings": {
        k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "small_rows": WAYS,
        "sentences_per_s": speed, "medians": medians, "identical_translations": same}
    rows = [[way, *(f"{medians[way][b]:.1f}" for b in args.batches)] for way in WAYS]
    large, _, switch = WAYS
    rows.append([f"{switch} ÷ {large}", *(f"{medians[switch][b] / medians[large][b]:.2f}" for b in args.batches)])
    hw = payload["hardware"]
    about = __doc__.split("\n\n")[1]
    text = (f"# engine=aoti: search.pt2 and search_small.pt2 by batch size\n\n{about}\n\n"
            f"- command: `{payload['command']}`\n"
            f"- hardware: {hw['cpu']}, {hw['cpu_count']} cores, torch {hw['torch']}, {args.threads} threads\n"
            f"- date: {hw['date']} (git {hw['git']})\n\n"
            f"Sentences per second (beam 4, {args.length} tokens each; median of {args.repeats}), by sentences "
            "per batch (rows a step: 4 x that):\n\n"
            + md_table(["search graph", *(str(b) for b in args.batches)], rows)
            + f"\n\nThe three ways gave identical translations: {'yes' if same else '**no**'}.\n")
    print(text)
    if args.out:
        write_json(args.out, payload)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
